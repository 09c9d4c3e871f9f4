// The runner's exit codes: one per kind of failure, so that a script (scale.sbatch, CI) can tell
// a refused configuration from a crash, a hang or an out-of-memory without opening the run file.
// The run file's status says the same (docs/running.md, "Exit codes").
#pragma once

#include <csignal>
#include <string>

namespace strata::exit_code {

inline constexpr int ok = 0;
inline constexpr int error = 1;         // no run file could be written, or MPI did not start
inline constexpr int bad_input = 2;     // options, files, plugins refused before any rank started
inline constexpr int failed = 3;        // a rank raised an error (status failed)
inline constexpr int does_not_fit = 4;  // the predicted memory does not fit (memory_admission.hpp)
inline constexpr int oom = 5;           // an allocation was refused (status oom)
inline constexpr int timeout = 6;       // the watchdog: a hung collective or a silent rank
inline constexpr int rank_lost = 7;     // a rank ended without a word (SIGKILL, OOM killer, crash)
// A run cancelled by a signal (scancel, Slurm's time limit, Ctrl-C) exits 128 + the signal.
inline constexpr int cancelled(int sig) { return 128 + sig; }

// The exit code of a run whose file says `status` (signal: the one that cancelled it).
inline int for_status(const std::string& status, int sig = SIGTERM) {
  if (status == "ok") return ok;
  if (status == "oom") return oom;
  if (status == "timeout") return timeout;
  if (status == "cancelled") return cancelled(sig);
  return failed;
}

}  // namespace strata::exit_code
