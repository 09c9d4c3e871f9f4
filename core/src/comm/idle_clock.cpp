// The compute device's clock for exposed-comm time (see comm/idle_clock.hpp).
#include "comm/idle_clock.hpp"

#include <algorithm>
#include <mutex>
#include <vector>

namespace strata {
namespace {

struct PendingWait {
  CommLedger* ledger;
  double t0, t1;
  std::uint64_t mark0, mark1;
};

std::mutex mu;
IdleClock* the_clock = nullptr;
std::vector<PendingWait> pending;

}  // namespace

void set_idle_clock(IdleClock* clock) {
  std::lock_guard lock(mu);
  the_clock = clock;
  pending.clear();
}

IdleClock* idle_clock() {
  std::lock_guard lock(mu);
  return the_clock;
}

WaitStart begin_wait() {
  WaitStart start;
  std::lock_guard lock(mu);
  if (the_clock) start.mark = the_clock->mark();
  start.t0 = now();
  return start;
}

void end_wait(CommLedger& ledger, const WaitStart& start) {
  const double t1 = now();
  std::unique_lock lock(mu);
  if (the_clock == nullptr) {
    lock.unlock();
    ledger.record_wait(start.t0, t1);
    return;
  }
  pending.push_back(PendingWait{&ledger, start.t0, t1, start.mark, the_clock->mark()});
}

void resolve_idle_waits() {
  std::lock_guard lock(mu);
  for (const PendingWait& w : pending) {
    const double idle = the_clock->seconds_between(w.mark0, w.mark1);
    the_clock->release(w.mark0);
    the_clock->release(w.mark1);
    w.ledger->record_wait(std::clamp(w.t1 - idle, w.t0, w.t1), w.t1);
  }
  pending.clear();
}

void forget_idle_waits(const CommLedger* ledger) {
  std::lock_guard lock(mu);
  std::erase_if(pending, [&](const PendingWait& w) { return w.ledger == ledger; });
}

}  // namespace strata
