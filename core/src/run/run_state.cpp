// The run's state and its failure file (run_state.hpp).
#include "run/run_state.hpp"

#include <cstdio>
#include <filesystem>

#include "results/run_claim.hpp"
#include "run/exit_codes.hpp"
#include "run/trace_timeline.hpp"
#include "util/format.hpp"

namespace strata {

std::string run_file_path(const RunConfig& config) {
  return (std::filesystem::path(config.out_dir) / (config.run_id + ".h5")).string();
}

int write_failure(RunState& state, const std::string& status, const std::string& error, int code,
                  bool replace) {
  std::lock_guard lock(state.mu);
  if (state.written) return state.write_failed ? exit_code::error : state.exit_code;
  if (state.path.empty()) return exit_code::error;
  if (!state.root_steps.empty()) fill_partial_steps(state.root_steps, state.record);
  state.record.status = status;
  state.record.error = one_line(error);
  state.written = true;  // one attempt: a second would only repeat the first one's error
  try {
    write_run_file(state.record, state.path, replace);
    std::fprintf(stderr, "runner: run file %s (status %s)\n", state.path.c_str(), status.c_str());
    std::error_code ignored;  // an earlier run's timeline, under the same id, would not match
    if (replace) std::filesystem::remove(trace_json_path(state.path), ignored);
    release_run_file_claim(state.path);
    return state.exit_code = code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "runner: could not write the failure file: %s\n",
                 one_line(e.what()).c_str());
    state.write_failed = true;
    return exit_code::error;
  }
}

}  // namespace strata
