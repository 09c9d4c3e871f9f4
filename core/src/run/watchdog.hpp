// The watchdog thread of every rank: what ends a job that cannot go on, with a run file that says
// why. It watches every blocking call (training collectives through the comm ledger, the harness's
// own control-plane calls), exchanges heartbeats with rank 0 so that a rank which stops (SIGSTOP, a
// debugger, a dead node) is named rather than the ranks waiting for it, relays failures and
// SIGTERM/SIGINT to rank 0, and has rank 1 write the file when rank 0 is the one gone.
#pragma once
#include <memory>

#include "strata/comm.hpp"

namespace strata {

struct RunState;

// SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 (Slurm's time limit, scancel and --signal, the
// launcher ending the job, Ctrl-C, a closed terminal) only
// raise a flag that the watchdog acts on. Call once, after MPI is initialised.
void install_signal_handlers();

class Watchdog {
 public:
  // timeout_s: the longest a blocking call may take, and a rank may be silent.
  Watchdog(double timeout_s, RunState& state);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  void attach(CommLedger* ledger);  // the training ledger; nullptr: detach

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
