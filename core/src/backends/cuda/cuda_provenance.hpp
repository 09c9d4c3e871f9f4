// The CUDA build's versions for the run file's /provenance (see provenance.hpp in the core).
// Plain C++: the runner includes it in CUDA builds and registers the provider at start.
#pragma once
#include "provenance/providers.hpp"

namespace strata::cuda {

// cuda_version (runtime), cuda_driver_version ("none" without a driver), cublas_version,
// cudnn_version (in a build with cuDNN's attention; "none" where libcudnn.so.9 is not found),
// nccl_version (with the NCCL transport), gpu_count and gpu_names (when devices exist). Never
// selects a device or creates a handle: a machine without GPU or driver answers quickly.
Provenance cuda_provenance();

// register_provenance_provider(cuda_provenance): the runner calls it in CUDA builds.
void register_provenance();

}  // namespace strata::cuda
