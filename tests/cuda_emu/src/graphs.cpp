// The CUDA emulator's stream capture and graphs (cudaStreamBeginCapture .. cudaGraphLaunch).
//
// A capturing stream runs nothing: every operation enqueued on it (kernels, copies, memsets,
// cuBLAS and cuBLASLt calls, host functions) is appended to the capture's graph instead, as the
// closure over the values it was called with that the stream would have run, and cudaGraphLaunch
// queues the graph's operations, in capture order, as one piece of the stream's work. Of CUDA's
// rules of capture the emulator enforces those a strata step could break:
// - in global mode on any thread, in thread-local mode on the capturing thread, the calls CUDA
//   calls potentially unsafe fail with cudaErrorStreamCaptureUnsupported and invalidate the
//   capture: cudaMalloc, cudaFree, cudaMallocHost, cudaFreeHost, the synchronous cudaMemcpy and
//   cudaMemset, every synchronisation (device, stream, event) and query; work on the legacy default
//   stream fails with cudaErrorStreamCaptureImplicit. Relaxed mode allows them.
// - synchronising or querying the capturing stream fails from any thread, in every mode.
// - cudaMallocAsync on the capturing stream allocates graph memory: the block lives as long as the
//   graph or an executable of it, so every replay finds it at the address the kernels captured;
//   a cudaFreeAsync of it inside the capture queues nothing.
// - one stream per capture: recording an event on a capturing stream, making one wait for an
//   event, or launching a graph into one, is not emulated (cudaErrorNotSupported, with a report).
// - cudaStreamEndCapture of an invalidated capture returns cudaErrorStreamCaptureInvalidated and
//   no graph; one from another thread than the capture's (not relaxed) fails with
//   cudaErrorStreamCaptureWrongThread.
#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "internal.hpp"

namespace strata_emu {
namespace {

using Ops = std::vector<std::function<void()>>;

// Graph memory: freed when the last graph or executable holding it goes.
struct GraphMemory {
  std::vector<void*> blocks;
  ~GraphMemory() {
    for (void* p : blocks) free_block(p);
  }
};

}  // namespace
}  // namespace strata_emu

struct CUgraph_st {
  strata_emu::Ops ops;
  std::shared_ptr<strata_emu::GraphMemory> memory = std::make_shared<strata_emu::GraphMemory>();
};

struct CUgraphExec_st {
  std::shared_ptr<const strata_emu::Ops> ops;
  std::shared_ptr<strata_emu::GraphMemory> memory;
};

namespace strata_emu {
namespace {

struct Capture {
  cudaStreamCaptureMode mode;
  std::thread::id thread;  // the thread that began it
  bool invalidated = false;
  std::unique_ptr<CUgraph_st> graph = std::make_unique<CUgraph_st>();
};

std::mutex capture_mutex;
std::map<cudaStream_t, Capture> captures;
std::atomic<int> active_captures{0};  // captures.size(), read without the lock

// Whether capture `c` forbids a potentially unsafe call from this thread.
bool forbids(const Capture& c) {
  return c.mode == cudaStreamCaptureModeGlobal ||
         (c.mode == cudaStreamCaptureModeThreadLocal && c.thread == std::this_thread::get_id());
}

// If `stream` is capturing: f(its capture) under the lock, and true; else false. The count read
// first keeps the lock off every enqueue while nothing captures.
template <class F>
bool with_capture(cudaStream_t stream, F&& f) {
  if (active_captures.load() == 0) return false;
  std::lock_guard lock(capture_mutex);
  const auto it = captures.find(stream);
  if (it == captures.end()) return false;
  f(it->second);
  return true;
}

}  // namespace

bool capture_op(cudaStream_t stream, std::function<void()>& op) {
  return with_capture(stream, [&](Capture& c) {
    if (!c.invalidated) c.graph->ops.push_back(std::move(op));
  });
}

bool capture_forbids(const char* call) {
  if (active_captures.load() == 0) return false;
  std::lock_guard lock(capture_mutex);
  bool forbidden = false;
  for (auto& [stream, c] : captures) {
    if (!forbids(c)) continue;
    report("%s while stream %p is capturing: not permitted; the capture is invalidated", call,
           static_cast<void*>(stream));
    c.invalidated = forbidden = true;
  }
  return forbidden;
}

bool in_capture(cudaStream_t stream) {
  return with_capture(stream, [](Capture&) {});
}

bool capturing(cudaStream_t stream, const char* call) {
  return with_capture(stream, [&](Capture& c) {
    report("%s of stream %p, which is capturing: not permitted; the capture is invalidated", call,
           static_cast<void*>(stream));
    c.invalidated = true;
  });
}

bool capture_allocates(cudaStream_t stream, void* p) {
  return with_capture(stream, [&](Capture& c) { c.graph->memory->blocks.push_back(p); });
}

bool capture_frees(cudaStream_t stream, void* p) {
  bool owned = false;
  with_capture(stream, [&](Capture& c) {
    const std::vector<void*>& blocks = c.graph->memory->blocks;
    owned = std::find(blocks.begin(), blocks.end(), p) != blocks.end();
  });
  return owned;
}

}  // namespace strata_emu

using strata_emu::report;
using strata_emu::set_last_error;

extern "C" {

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    report("cudaStreamBeginCapture: the legacy default stream cannot be captured");
    return set_last_error(cudaErrorStreamCaptureUnsupported);
  }
  if (mode < cudaStreamCaptureModeGlobal || mode > cudaStreamCaptureModeRelaxed)
    return set_last_error(cudaErrorInvalidValue);
  std::lock_guard lock(strata_emu::capture_mutex);
  if (strata_emu::captures.count(stream) != 0) {
    report("cudaStreamBeginCapture: stream %p is capturing already", static_cast<void*>(stream));
    return set_last_error(cudaErrorIllegalState);
  }
  strata_emu::captures.emplace(stream, strata_emu::Capture{mode, std::this_thread::get_id()});
  ++strata_emu::active_captures;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (graph == nullptr) return set_last_error(cudaErrorInvalidValue);
  *graph = nullptr;
  std::lock_guard lock(strata_emu::capture_mutex);
  const auto it = strata_emu::captures.find(stream);
  if (it == strata_emu::captures.end()) {
    report("cudaStreamEndCapture: stream %p is not capturing", static_cast<void*>(stream));
    return set_last_error(cudaErrorIllegalState);
  }
  strata_emu::Capture& c = it->second;
  if (c.mode != cudaStreamCaptureModeRelaxed && c.thread != std::this_thread::get_id())
    return set_last_error(cudaErrorStreamCaptureWrongThread);
  const bool invalidated = c.invalidated;
  if (!invalidated) *graph = c.graph.release();
  strata_emu::captures.erase(it);
  --strata_emu::active_captures;
  return invalidated ? set_last_error(cudaErrorStreamCaptureInvalidated) : cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return set_last_error(cudaErrorInvalidValue);
  std::lock_guard lock(strata_emu::capture_mutex);
  const auto it = strata_emu::captures.find(stream);
  *status = it == strata_emu::captures.end() ? cudaStreamCaptureStatusNone
            : it->second.invalidated         ? cudaStreamCaptureStatusInvalidated
                                             : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags) {
  if (exec == nullptr || graph == nullptr) return set_last_error(cudaErrorInvalidValue);
  if (flags != 0) {
    report("cudaGraphInstantiate: flags %llu: the emulator instantiates with 0 only", flags);
    return set_last_error(cudaErrorNotSupported);
  }
  *exec = new CUgraphExec_st{std::make_shared<const strata_emu::Ops>(graph->ops), graph->memory};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return set_last_error(cudaErrorInvalidResourceHandle);
  if (strata_emu::in_capture(stream)) {
    report("cudaGraphLaunch into a capturing stream: not emulated");
    return set_last_error(cudaErrorNotSupported);
  }
  return set_last_error(strata_emu::enqueue(stream, [ops = exec->ops, memory = exec->memory] {
    for (const std::function<void()>& op : *ops) op();
  }));
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  if (exec == nullptr) return set_last_error(cudaErrorInvalidResourceHandle);
  delete exec;  // a launch still queued holds the operations and the memory
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  if (graph == nullptr) return set_last_error(cudaErrorInvalidResourceHandle);
  delete graph;
  return cudaSuccess;
}

}  // extern "C"
