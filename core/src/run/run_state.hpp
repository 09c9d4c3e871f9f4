// What a rank knows of its run (the record so far) and the failure file written from it: the
// trainer fills it, and the watchdog and a failing rank write it, from any thread.
#pragma once
#include <mutex>
#include <string>
#include <vector>

#include "results/run_record.hpp"
#include "run/rank_report.hpp"
#include "runner/run_config.hpp"

namespace strata {

// What this rank knows of the run so far: every rank holds the header (config, provenance) so that
// another rank can write the failure file when rank 0 is gone; rank 0 also holds every step so far.
struct RunState {
  std::mutex mu;
  RunRecord record;
  std::string path;                 // final path of the run file
  bool written = false;             // one attempt made (see write_failure)
  bool write_failed = false;        // ... and it failed: no run file stands (exit code 1)
  int exit_code = 0;                // ... and succeeded: the code its status implies
  std::vector<StepRow> root_steps;  // rank 0: its steps so far, for the failure file's /steps
};

// <out>/<run-id>.h5: where the run's file goes (its --trace timeline beside it).
std::string run_file_path(const RunConfig& config);

// Write the run file with a failure status, once per process, from any thread. Rank 0 replaces a
// file of the same name; a fallback writer (replace = false) never replaces one.
// Returns the exit code the process ends the job with (run/exit_codes.hpp): `code` when this call
// wrote the file, the first call's when one was written before (the main thread's error after the
// watchdog cancelled the run keeps the file's code), exit_code::error when no run file stands.
int write_failure(RunState& state, const std::string& status, const std::string& error, int code,
                  bool replace = true);

}  // namespace strata
