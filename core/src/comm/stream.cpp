// CPU comm streams: one worker thread per stream running enqueued work in order.
#include "comm/idle_clock.hpp"
#include "comm/thread_role.hpp"
#include "strata/comm.hpp"

namespace strata {

void Event::wait() const {
  if (!state_) return;
  std::unique_lock lock(state_->mu);
  if (!state_->done) {
    const bool compute_waits = ledger_ && !t_on_comm_worker;
    const WaitStart start = compute_waits ? begin_wait() : WaitStart{};
    state_->cv.wait(lock, [&] { return state_->done; });
    if (compute_waits) end_wait(*ledger_, start);
  }
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Event::done() const {
  if (!state_) return true;
  std::lock_guard lock(state_->mu);
  return state_->done;
}

CommStream::CommStream(CommLedger& ledger, std::string name)
    : ledger_(ledger), name_(std::move(name)), worker_([this] { run(); }) {}

CommStream::~CommStream() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

Event CommStream::enqueue(std::function<void()> work) {
  Event ev;
  ev.state_ = std::make_shared<Event::State>();
  ev.ledger_ = &ledger_;
  {
    std::lock_guard lock(mu_);
    queue_.emplace_back(std::move(work), ev.state_);
  }
  cv_.notify_all();
  return ev;
}

Event CommStream::enqueue(std::function<void()> work, const Event& after) {
  if (!after.state_) return enqueue(std::move(work));
  // On the CPU the stream's worker thread waits; Event::wait() records no idle time there.
  return enqueue([after, work = std::move(work)] {
    after.wait();
    work();
  });
}

void CommStream::synchronize() {
  enqueue([] {}).wait();
}

void CommStream::run() {
  t_on_comm_worker = true;
  t_stream_name = &name_;
  std::size_t next = 0;
  for (;;) {
    std::function<void()> work;
    std::shared_ptr<Event::State> state;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || next < queue_.size(); });
      if (next >= queue_.size()) return;  // stopping and drained
      work = std::move(queue_[next].first);
      state = std::move(queue_[next].second);
      if (++next == queue_.size()) {  // drained: reuse the storage
        queue_.clear();
        next = 0;
      }
    }
    std::exception_ptr error;
    try {
      work();
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(state->mu);
      state->done = true;
      state->error = error;
    }
    state->cv.notify_all();
  }
}

}  // namespace strata
