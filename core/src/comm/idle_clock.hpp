// The compute device's clock for exposed-comm time (docs/architecture.md "Measures": the time a
// comm stream is busy while compute is idle). On the CPU the compute thread's blocked interval is
// the compute's idle interval. On a GPU the compute stream may still be running what was queued
// when the host starts to wait, so a device backend installs an IdleClock whose marks are events on
// its compute stream: between the mark at the start of a wait and the mark at its end the stream
// was idle for as long as the events measure, ending when the host stopped waiting (the stream,
// drained, reaches the second mark at once). Those intervals are known only once the stream has
// passed both marks, so they are recorded into the ledger when the trainer resolves them after a
// step's synchronisation.
#pragma once
#include <cstdint>

#include "strata/comm.hpp"
#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

class IdleClock {
 public:
  virtual ~IdleClock() = default;
  // A mark on the compute stream, now (in stream order).
  virtual std::uint64_t mark() = 0;
  // Seconds of the compute stream from mark a to mark b, both passed (after a synchronisation of
  // the stream).
  virtual double seconds_between(std::uint64_t a, std::uint64_t b) = 0;
  virtual void release(std::uint64_t mark) = 0;  // a mark measured for the last time
};

// The process's clock, or null (the host's intervals are the compute's). A device backend sets it
// when it opens and clears it when it closes (pending waits are dropped then).
void set_idle_clock(IdleClock* clock);
IdleClock* idle_clock();  // the clock set, or null

// The compute thread waits on comm: begin_wait() before, end_wait() after. Without a clock the
// interval goes into the ledger at once; with one, when resolve_idle_waits() runs.
struct WaitStart {
  double t0 = 0;
  std::uint64_t mark = 0;
};
WaitStart begin_wait();
void end_wait(CommLedger& ledger, const WaitStart& start);

// Records every pending device-timed wait into its ledger: [max(t0, t1 - idle), t1). Call after
// the compute stream has been synchronised and before the ledger is drained.
void resolve_idle_waits();
// Drops the pending waits of `ledger` (it is going away: ~CommLedger calls it).
void forget_idle_waits(const CommLedger* ledger);

}  // namespace strata
STRATA_EXPORT_END
