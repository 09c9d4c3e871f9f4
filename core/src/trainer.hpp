// The run itself on one rank: groups, data, model, the strategy's setup and steps, measurement,
// and (on rank 0) the run file.
#pragma once
#include <memory>
#include <mutex>
#include <string>

#include "config.hpp"
#include "plugin_loader.hpp"
#include "results/run_record.hpp"
#include "strata/comm.hpp"

namespace strata {

// What rank 0 knows of the run so far; a failure anywhere is written into it before the job ends.
struct RunState {
  std::mutex mu;
  RunRecord record;
  std::string path;  // final path of the run file
  bool written = false;
};

// Run the configured strategy (MPI already initialised). Throws on failure; `state` then holds
// what is known for the failure file.
class Watchdog;
void train(const RunConfig& config, const PluginRegistry& registry, RunState& state,
           Watchdog& watchdog);

// Start the run record: header, config, provenance (rank 0 fills it; every rank must call it
// because hostnames are gathered).
void begin_record(const RunConfig& config, RunState& state);

// Write the run file with a failure status (rank 0). Safe to call from any thread, once.
void write_failure(RunState& state, const std::string& status, const std::string& error);

// The watchdog: ends the job when a collective hangs, and on rank 0 receives other ranks' errors.
class Watchdog {
 public:
  Watchdog(double timeout_s, RunState& state);
  ~Watchdog();
  void attach(CommLedger* ledger);  // nullptr: detach

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
