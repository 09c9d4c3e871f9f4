// The run itself on one rank: groups, data, model, the strategy's setup and steps, measurement,
// and (on rank 0) the run file.
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "config.hpp"
#include "plugin_loader.hpp"
#include "rank_report.hpp"
#include "results/run_record.hpp"
#include "strata/comm.hpp"

namespace strata {

// What this rank knows of the run so far: every rank holds the header (config, provenance) so that
// another rank can write the failure file when rank 0 is gone; rank 0 also holds every step so far.
struct RunState {
  std::mutex mu;
  RunRecord record;
  std::string path;                 // final path of the run file
  bool written = false;             // one attempt made (see write_failure)
  bool write_failed = false;        // ... and it failed: no run file stands (exit code 1)
  std::vector<StepRow> root_steps;  // rank 0: its steps so far, for the failure file's /steps
};

// Run the configured strategy (MPI already initialised). Throws on failure; `state` then holds
// what is known for the failure file.
class Watchdog;
void train(const RunConfig& config, const PluginRegistry& registry, RunState& state,
           Watchdog& watchdog);

// Start the run record: header, config and provenance on every rank (no communication, so that a
// failure from here on has its run file).
void begin_record(const RunConfig& config, RunState& state);
// Collective: the hostnames and node topologies on rank 0.
void gather_record_hosts(RunState& state);

// <out>/<run-id>.h5: where the run's file goes (its --trace timeline beside it).
std::string run_file_path(const RunConfig& config);

// Write the run file with a failure status, once per process, from any thread. Rank 0 replaces a
// file of the same name; a fallback writer (replace = false) never replaces one.
// True when a run file stands afterwards (this call wrote it, or one was written before).
bool write_failure(RunState& state, const std::string& status, const std::string& error,
                   bool replace = true);

}  // namespace strata
