// The CUDA backend of a run (see cuda/backend.hpp).
#include "backends/cuda/backend.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "backends/cuda/device.hpp"
#include "backends/cuda/nvml_topology.hpp"
#include "comm/thread_role.hpp"

namespace strata::cuda {

StreamIdleClock::~StreamIdleClock() {
  for (const auto& [id, event] : marks_) cudaEventDestroy(event);  // errors ignored: no throw
  for (cudaEvent_t event : free_) cudaEventDestroy(event);
}

std::uint64_t StreamIdleClock::mark() {
  std::lock_guard lock(mu_);
  cudaEvent_t event = nullptr;
  if (free_.empty()) {
    STRATA_CUDA_CHECK(cudaEventCreate(&event));  // with timing
  } else {
    event = free_.back();
    free_.pop_back();
  }
  marks_.emplace(++next_, event);
  STRATA_CUDA_CHECK(cudaEventRecord(event, stream_));
  return next_;
}

double StreamIdleClock::seconds_between(std::uint64_t a, std::uint64_t b) {
  std::lock_guard lock(mu_);
  const auto first = marks_.find(a), second = marks_.find(b);
  if (first == marks_.end() || second == marks_.end())
    throw Error("StreamIdleClock: mark " + std::to_string(first == marks_.end() ? a : b) +
                " was not recorded or was released already");
  float ms = 0.0f;
  STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, first->second, second->second));
  return double(ms) * 1e-3;
}

void StreamIdleClock::release(std::uint64_t mark) {
  std::lock_guard lock(mu_);
  const auto it = marks_.find(mark);
  if (it == marks_.end())
    throw Error("StreamIdleClock: mark " + std::to_string(mark) + " released twice");
  free_.push_back(it->second);
  marks_.erase(it);
}

CudaBackend::CudaBackend(int device, AttentionKernel attention)
    : context_(device),
      kernels_(context_, attention),
      ops_(context_.stream),
      name_(cuda_device_name(device)),
      idle_clock_(context_.stream) {
  STRATA_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_, device));
  // Keep what a step frees in the pool for the next step: the default threshold (0) returns it
  // to the driver at every synchronisation, and each step would allocate from the driver again.
  std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
  STRATA_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
  std::uint64_t reset = 0;
  STRATA_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &reset));
  STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&compute_event_, cudaEventDisableTiming));
  STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&copy_after_, cudaEventDisableTiming));
  STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  set_idle_clock(&idle_clock_);
}

CudaBackend::~CudaBackend() {
  set_idle_clock(nullptr);
  // Errors ignored: this must not throw, and a sticky fault was already reported.
  cudaStreamSynchronize(context_.stream);
  if (copy_stream_) {
    cudaStreamSynchronize(copy_stream_);
    cudaStreamDestroy(copy_stream_);
  }
  if (copy_after_) cudaEventDestroy(copy_after_);
  if (compute_event_) cudaEventDestroy(compute_event_);
  for (const auto& [p, bytes] : host_size_) cudaFreeHost(p);  // cached or still held: all pinned
}

double CudaBackend::peak_flops(bool bf16) const { return peak_dense_flops(name_, bf16); }

void* CudaBackend::allocate(std::size_t bytes) {
  void* p = nullptr;
  if (bytes == 0) return nullptr;
  STRATA_CUDA_CHECK(cudaMallocAsync(&p, bytes, context_.stream));
  STRATA_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, context_.stream));  // Buffer's promise: zeroed
  return p;
}

void CudaBackend::release(void* p) noexcept {
  if (p) cudaFreeAsync(p, context_.stream);  // stream order: after every kernel that uses it
}

void* CudaBackend::allocate_host(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(host_mu_);
    if (auto it = host_free_.find(bytes); it != host_free_.end()) {
      p = it->second;
      host_free_.erase(it);
    }
  }
  if (!p) {
    STRATA_CUDA_CHECK(cudaMallocHost(&p, bytes));
    std::lock_guard<std::mutex> lock(host_mu_);
    host_size_[p] = bytes;
  }
  std::memset(p, 0, bytes);
  return p;
}

void CudaBackend::release_host(void* p) noexcept {
  if (!p) return;
  std::lock_guard<std::mutex> lock(host_mu_);
  if (auto it = host_size_.find(p); it != host_size_.end())
    host_free_.emplace(it->second, p);  // cached for the next block of its size
}

void CudaBackend::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  // A comm-stream worker (CPU offload's copy stream) starts on device 0: make ours current.
  int current = -1;
  STRATA_CUDA_CHECK(cudaGetDevice(&current));
  if (current != context_.device) STRATA_CUDA_CHECK(cudaSetDevice(context_.device));
  // cudaMemcpyDefault: the direction from the pointers (unified addressing).
  if (t_on_comm_worker) {
    // In a comm stream's work (offload's d2h/h2d): on the copy stream, after everything the
    // compute stream was given so far (a superset of what the work waited for), so that the copy
    // overlaps later compute; finished on return, as the work's Event promises.
    STRATA_CUDA_CHECK(cudaEventRecord(copy_after_, context_.stream));
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, copy_after_, 0));
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, copy_stream_));
    STRATA_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
    return;
  }
  // On the compute thread: on the compute stream, waited for only with a host side (pageable
  // memory must be usable on return): a copy between device buffers is ordered like any kernel.
  STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, context_.stream));
  if (!on_device(dst) || !on_device(src)) context_.synchronize();
}

bool CudaBackend::on_device(const void* p) {
  cudaPointerAttributes where{};
  STRATA_CUDA_CHECK(cudaPointerGetAttributes(&where, p));
  return where.type == cudaMemoryTypeDevice;
}

void CudaBackend::record_compute_event() {
  STRATA_CUDA_CHECK(cudaEventRecord(compute_event_, context_.stream));
}

std::uint64_t CudaBackend::peak_device_bytes() {
  std::uint64_t high = 0;
  STRATA_CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &high));
  return high + context_.workspace_bytes + kernels_.library_bytes();
}

namespace {

class CudaGraph final : public StreamGraph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }  // must not throw; CUDA defers it
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  void launch() override { STRATA_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

}  // namespace

// Thread-local capture: only this thread's unsafe calls break it, so the comm threads' own
// allocations and synchronisations (the NCCL groups', offload's copies) may go on meanwhile.
std::unique_ptr<StreamGraph> CudaBackend::capture(const std::function<void()>& work) {
  cudaStream_t stream = context_.stream;
  STRATA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    work();
  } catch (...) {
    // Ends the capture (invalidated: its error is the one thrown), and clears the last error it
    // leaves, which the next launch check would otherwise report as its own.
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw;
  }
  STRATA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  STRATA_CUDA_CHECK(instantiated);
  return std::make_unique<CudaGraph>(exec, stream);
}

std::string cuda_unavailable(const BackendRequest& request) {
#if !STRATA_HAVE_CUDNN
  if (request.attention == AttentionKernel::cudnn)
    return "this build's CUDA backend has no cuDNN for --attention cudnn (cuDNN 9.10 or newer was "
           "not found when it was configured: set CUDNN_HOME); or run with --attention own";
#endif
  const int local_size = request.local_size;
  const int count = cuda_device_count();
  if (count == 0)
    return "no CUDA device on this machine (no GPU, no NVIDIA driver, or CUDA_VISIBLE_DEVICES "
           "hides them); run with --device cpu";
  if (local_size > count)
    return std::to_string(local_size) + " ranks on this node but " + std::to_string(count) +
           " GPU(s): one GPU per rank (fewer --ranks-per-node, or more GPUs per node)";
  return "";
}

int cuda_device_for(int local_rank, int local_size) {
  const int count = cuda_device_count();
  if (count >= local_size) return local_rank;
  if (count == 1) return 0;  // one visible per rank; the trainer checks that they differ
  throw ConfigError("--device cuda: " + std::to_string(local_size) + " ranks on this node see " +
                    std::to_string(count) +
                    " GPUs each: one GPU per rank (--gpus-per-task=1, or as many GPUs per node as "
                    "ranks)");
}

void register_backend() {
  BackendFactory f;
  f.unavailable = [](const BackendRequest& r) { return cuda_unavailable(r); };
  f.free_memory = [](const BackendRequest& r) {
    std::vector<std::string> uuids;  // the GPUs the node's ranks take (cuda_device_for)
    const int count = cuda_device_count();
    for (int d = 0; d < std::min(r.local_size, count); ++d) uuids.push_back(cuda_device_uuid(d));
    return least_free_memory(uuids);
  };
  f.open = [](const BackendRequest& r) -> std::unique_ptr<DeviceBackend> {
    return std::make_unique<CudaBackend>(cuda_device_for(r.local_rank, r.local_size), r.attention);
  };
  strata::register_backend(Device::cuda, f);
}

CudaBackend* opened_cuda_backend() {
  return static_cast<CudaBackend*>(opened_backend(Device::cuda));
}

}  // namespace strata::cuda
