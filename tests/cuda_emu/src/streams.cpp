// The CUDA emulator's streams and events.
//
// A created stream owns a host thread that runs its work in order, so work really is asynchronous
// to the host: a read of a result without the synchronisation CUDA requires is a data race
// ThreadSanitizer reports. The legacy default stream (0, cudaStreamLegacy, cudaStreamPerThread)
// runs work in the calling thread after every blocking stream (created without
// cudaStreamNonBlocking) has drained, as CUDA orders it. An event is recorded by queueing its
// completion; cudaStreamWaitEvent queues a wait for the record made before it.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "internal.hpp"

using Clock = std::chrono::steady_clock;

struct CUstream_st {
  explicit CUstream_st(unsigned f) : flags(f), worker([this] { work(); }) {}
  ~CUstream_st() {
    {
      std::lock_guard lock(mutex);
      stop = true;
    }
    changed.notify_all();
    worker.join();
  }

  void push(std::function<void()> op) {
    {
      std::lock_guard lock(mutex);
      queue.push_back(std::move(op));
      ++submitted;
    }
    changed.notify_all();
  }

  void synchronize() {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return completed == submitted; });
  }

  bool idle() {
    std::lock_guard lock(mutex);
    return completed == submitted;
  }

  const unsigned flags;
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::function<void()>> queue;
  std::uint64_t submitted = 0, completed = 0;
  bool stop = false;
  std::thread worker;  // last: started once the rest exists

 private:
  void work() {
    std::unique_lock lock(mutex);
    for (;;) {
      changed.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stopping, and everything ran
      std::function<void()> op = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      op();
      lock.lock();
      ++completed;
      changed.notify_all();
    }
  }
};

// Shared by the event handle and the stream work that completes or waits for it, so destroying
// the handle while that work is queued is safe (CUDA allows it).
struct EventState {
  std::mutex mutex;
  std::condition_variable changed;
  std::uint64_t recorded = 0, completed = 0;
  Clock::time_point time;
};

struct CUevent_st {
  unsigned flags;
  std::shared_ptr<EventState> state = std::make_shared<EventState>();
};

namespace strata_emu {
namespace {

std::mutex registry_mutex;
std::set<cudaStream_t> streams;

bool is_legacy(cudaStream_t s) {
  return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread;
}

bool known(cudaStream_t s) {
  std::lock_guard lock(registry_mutex);
  return streams.count(s) != 0;
}

std::vector<cudaStream_t> live_streams(bool blocking_only) {
  std::lock_guard lock(registry_mutex);
  std::vector<cudaStream_t> out;
  for (cudaStream_t s : streams)
    if (!blocking_only || (s->flags & cudaStreamNonBlocking) == 0) out.push_back(s);
  return out;
}

}  // namespace

cudaError_t enqueue(cudaStream_t stream, std::function<void()> op) {
  if (is_legacy(stream)) {
    if (capture_forbids("work on the legacy default stream")) return cudaErrorStreamCaptureImplicit;
    for (cudaStream_t s : live_streams(true)) s->synchronize();
    op();
    return cudaSuccess;
  }
  if (!known(stream)) return cudaErrorInvalidResourceHandle;
  if (capture_op(stream, op)) return cudaSuccess;
  stream->push(std::move(op));
  return cudaSuccess;
}

void synchronize_all_streams() {
  for (cudaStream_t s : live_streams(false)) s->synchronize();
}

}  // namespace strata_emu

using strata_emu::set_last_error;

extern "C" {

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  if (stream == nullptr || (flags & ~unsigned(cudaStreamNonBlocking)) != 0)
    return set_last_error(cudaErrorInvalidValue);
  *stream = new CUstream_st(flags);
  std::lock_guard lock(strata_emu::registry_mutex);
  strata_emu::streams.insert(*stream);
  return cudaSuccess;
}

// CUDA returns at once and releases the stream when its work is done; waiting here is the same to
// the caller.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  {
    std::lock_guard lock(strata_emu::registry_mutex);
    if (strata_emu::streams.erase(stream) == 0)
      return set_last_error(cudaErrorInvalidResourceHandle);
  }
  stream->synchronize();
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (strata_emu::capturing(stream, "cudaStreamSynchronize") ||
      strata_emu::capture_forbids("cudaStreamSynchronize"))
    return set_last_error(cudaErrorStreamCaptureUnsupported);
  if (strata_emu::is_legacy(stream)) return strata_emu::enqueue(stream, [] {});
  if (!strata_emu::known(stream)) return set_last_error(cudaErrorInvalidResourceHandle);
  stream->synchronize();
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (strata_emu::capturing(stream, "cudaStreamQuery") ||
      strata_emu::capture_forbids("cudaStreamQuery"))
    return set_last_error(cudaErrorStreamCaptureUnsupported);
  if (strata_emu::is_legacy(stream)) {
    for (cudaStream_t s : strata_emu::live_streams(true))
      if (!s->idle()) return cudaErrorNotReady;
    return cudaSuccess;
  }
  if (!strata_emu::known(stream)) return set_last_error(cudaErrorInvalidResourceHandle);
  return stream->idle() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags) {
  if (event == nullptr || flags != 0) return set_last_error(cudaErrorInvalidValue);
  if (strata_emu::in_capture(stream)) {
    strata_emu::report("cudaStreamWaitEvent on a capturing stream: not emulated");
    return set_last_error(cudaErrorNotSupported);
  }
  std::shared_ptr<EventState> state = event->state;
  std::uint64_t target;
  {
    std::lock_guard lock(state->mutex);
    target = state->recorded;
  }
  if (target == 0) return cudaSuccess;  // never recorded: nothing to wait for, as in CUDA
  return set_last_error(strata_emu::enqueue(stream, [state, target] {
    std::unique_lock lock(state->mutex);
    state->changed.wait(lock, [&] { return state->completed >= target; });
  }));
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  if (fn == nullptr) return set_last_error(cudaErrorInvalidValue);
  return set_last_error(strata_emu::enqueue(stream, [fn, user_data] { fn(user_data); }));
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  if (event == nullptr) return set_last_error(cudaErrorInvalidValue);
  *event = new CUevent_st{flags};
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return set_last_error(cudaErrorInvalidResourceHandle);
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return set_last_error(cudaErrorInvalidResourceHandle);
  if (strata_emu::in_capture(stream)) {
    strata_emu::report("cudaEventRecord on a capturing stream: not emulated");
    return set_last_error(cudaErrorNotSupported);
  }
  std::shared_ptr<EventState> state = event->state;
  std::uint64_t number;
  {
    std::lock_guard lock(state->mutex);
    number = ++state->recorded;
  }
  return set_last_error(strata_emu::enqueue(stream, [state, number] {
    {
      std::lock_guard lock(state->mutex);
      state->completed = std::max(state->completed, number);
      state->time = Clock::now();
    }
    state->changed.notify_all();
  }));
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (event == nullptr) return set_last_error(cudaErrorInvalidResourceHandle);
  if (strata_emu::capture_forbids("cudaEventQuery"))
    return set_last_error(cudaErrorStreamCaptureUnsupported);
  std::lock_guard lock(event->state->mutex);
  return event->state->completed >= event->state->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return set_last_error(cudaErrorInvalidResourceHandle);
  if (strata_emu::capture_forbids("cudaEventSynchronize"))
    return set_last_error(cudaErrorStreamCaptureUnsupported);
  EventState& state = *event->state;
  std::unique_lock lock(state.mutex);
  const std::uint64_t target = state.recorded;
  state.changed.wait(lock, [&] { return state.completed >= target; });
  return cudaSuccess;
}

// Both events recorded, complete and with timing: the milliseconds between their completions.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return set_last_error(cudaErrorInvalidValue);
  if (start == nullptr || end == nullptr) return set_last_error(cudaErrorInvalidResourceHandle);
  if ((start->flags | end->flags) & cudaEventDisableTiming)
    return set_last_error(cudaErrorInvalidResourceHandle);
  Clock::time_point times[2];
  cudaEvent_t events[2] = {start, end};
  for (int i = 0; i < 2; ++i) {
    EventState& state = *events[i]->state;
    std::lock_guard lock(state.mutex);
    if (state.recorded == 0) return set_last_error(cudaErrorInvalidResourceHandle);
    if (state.completed < state.recorded) return cudaErrorNotReady;
    times[i] = state.time;
  }
  *ms = std::chrono::duration<float, std::milli>(times[1] - times[0]).count();
  return cudaSuccess;
}

}  // extern "C"
