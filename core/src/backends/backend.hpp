// The compute backend of a device other than the host: the memory, kernels, elementwise ops and
// compute stream of the one GPU this process uses. A build that has one (CUDA) registers its
// factory at start-up (the runner: cuda/backend.hpp); the run opens it once, for the rank's GPU,
// before anything is allocated on the device. The CPU needs none: its memory is the host's and
// its compute runs on the calling thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/kernels.hpp"
#include "strata/device.hpp"
#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

// Compute-stream work captured once (a CUDA graph) and replayed by launch(): the same kernels on
// the same memory, each replay in compute-stream order, for one launch call instead of one per
// kernel. Released (with any memory the capture allocated) when it goes.
class StreamGraph {
 public:
  virtual ~StreamGraph() = default;
  virtual void launch() = 0;
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual Device device() const = 0;
  virtual int ordinal() const = 0;                 // which GPU of the node (cudaSetDevice's)
  virtual std::string device_name() const = 0;     // e.g. "NVIDIA H100 80GB HBM3"
  virtual std::string device_uuid() const = 0;     // tells two ranks' GPUs apart across ordinals
  virtual double peak_flops(bool bf16) const = 0;  // dense data-sheet peak; 0 when unknown
  virtual Kernels& kernels() = 0;                  // the model passes' compute
  virtual DeviceOps& ops() = 0;                    // Context::ops()
  // Zero-filled device memory, in stream order on the compute stream (a caching, stream-ordered
  // pool: allocation and release cost no device synchronisation).
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  // Zero-filled page-locked host memory (the host side of CPU offload), and its release (kept
  // for the next allocation of that size; all of it is freed when the backend closes).
  virtual void* allocate_host(std::size_t bytes) = 0;
  virtual void release_host(void* p) noexcept = 0;
  // Copies `bytes` between any two of host and device memory in compute-stream order; returns
  // once the source may be reused and, for a destination on the host, once it holds the data.
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void synchronize() = 0;  // everything enqueued on the compute stream has finished
  // Records the compute event at the compute stream's current position: collectives issued
  // after it wait for it on the device (Context::compute_event()).
  virtual void record_compute_event() = 0;
  // Most bytes this process held on the device at once: the pool's high-water mark plus fixed
  // allocations (library workspaces), for /memory/device_peak_bytes.
  virtual std::uint64_t peak_device_bytes() = 0;
  // Captures what `work` enqueues on the compute stream, without running it, into a graph to
  // launch. `work` may only enqueue: a synchronisation, a blocking copy or a cudaMalloc inside it
  // fails the capture (an Error naming the call); stream-ordered allocations become the graph's.
  virtual std::unique_ptr<StreamGraph> capture(const std::function<void()>& work) = 0;
};

// Which local GPU a rank takes (local_rank of local_size ranks on its node), and the attention
// kernels its model runs.
struct BackendRequest {
  int local_rank = 0;
  int local_size = 1;
  AttentionKernel attention = AttentionKernel::reference;  // the model's (--attention)
};

struct BackendFactory {
  // "" when the device can be used here, else one line naming what is missing.
  std::string (*unavailable)(const BackendRequest& request) = nullptr;
  std::unique_ptr<DeviceBackend> (*open)(const BackendRequest& request) = nullptr;
  // Free memory in bytes of the GPU with the least among those the node's request.local_size
  // ranks take, read without creating a context (NVML); 0 when unknown.
  double (*free_memory)(const BackendRequest& request) = nullptr;
};

// Registration (before the options are parsed) and the process's one backend.
void register_backend(Device device, const BackendFactory& factory);
// A backend built as a library of its own, loaded by the first call that needs it: the runner's
// CUDA backend, since loading cuBLAS and cuBLASLt alone takes about 0.4 s, which every CPU run,
// `--help` and refused option would pay. The library's `extern "C" void strata_attach_backend()`
// registers the backend, the transports named here and its provenance, as a backend linked in
// does. backend_built() and transports_built() answer from the declaration without loading it;
// backend_unavailable(), open_backend() and the named transports' calls load it first.
void declare_backend_library(Device device, const std::string& library,
                             const std::vector<std::string>& transports);
// The transports declared by backend libraries not loaded (yet, or because they failed to).
std::vector<std::string> declared_transports();
// Loads the library that declared `transport` (once): "" when it is loaded or none declared it,
// else why it could not be loaded.
std::string load_backend_library_of(const std::string& transport);
bool backend_built(Device device);
// "" when `device` can run here: the CPU always; else the factory's reason, or that the build has
// no such backend.
std::string backend_unavailable(Device device, const BackendRequest& request);
DeviceBackend& open_backend(Device device, const BackendRequest& request);
// The factory's free_memory (0 for the CPU, or when unknown); loads the backend's library.
double device_free_memory(Device device, const BackendRequest& request);
// The opened backend of `device`, or null (never opened; the CPU has none).
DeviceBackend* opened_backend(Device device);
void close_backends() noexcept;  // before MPI is finalised and the process exits

// The model passes' kernels on `device`'s memory: the CPU's, or the opened backend's.
Kernels& device_kernels(Device device);
// Copies between memory of `device` (or the host) in its compute-stream order; see copy() above.
void copy_bytes(Device device, void* dst, const void* src, std::size_t bytes);

}  // namespace strata
STRATA_EXPORT_END
