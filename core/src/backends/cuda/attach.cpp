// The CUDA backend's one entry point: registers the backend, the NCCL transport (where built), the
// CUDA versions and NVML's link matrix for the run file, and NVTX as the profiler of strata's
// ranges. The runner's libstrata_cuda.so exports it for the core to call when a run first needs
// the cuda device (backend.hpp: declare_backend_library); runner_emu, linked with the emulated
// backend, calls it at start.
#include "backends/cuda/attach.hpp"

#include "backends/cuda/backend.hpp"
#include "backends/cuda/cuda_provenance.hpp"
#include "backends/cuda/nvml_topology.hpp"
#include "backends/cuda/nvtx_ranges.hpp"
#if STRATA_HAVE_NCCL
#include "backends/cuda/nccl_transport.hpp"
#endif

extern "C" __attribute__((visibility("default"))) void strata_attach_backend() {
  strata::cuda::register_provenance();
  strata::cuda::register_topology();
  strata::cuda::register_backend();
  strata::cuda::attach_nvtx();
#if STRATA_HAVE_NCCL
  strata::nccl::register_transport();
#endif
}
