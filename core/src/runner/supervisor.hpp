// The relaunch's supervisor: a runner started alone on several ranks starts mpirun (or srun) as
// its child and stays, instead of becoming it, so that what reaches the launcher reaches the ranks
// as itself and the launcher's exit code is the ranks' (the run file's).
#pragma once

#include <string>
#include <vector>

namespace strata {

// How signals reach the ranks. direct_to_ranks (mpirun on this host): SIGTERM, SIGINT, SIGHUP,
// SIGUSR1, SIGUSR2 and SIGPIPE (this process's output closed, e.g. `| head`) go to the launcher's
// children's children, the ranks, which write the run file naming the signal and exit 128 + it;
// mpirun itself only propagates their exit code (signalled, it would end the job with its own
// exit 1, or crash on a closed pipe). Otherwise (srun, which forwards signals to its tasks)
// SIGUSR1 and SIGUSR2 go to the child as they are and the others as SIGTERM.
// job_dir (mpirun on this host; empty: none): a folder of the launcher's own, holding mpirun's
// session directory and Open MPI's shared-memory segments (launch.cpp) and the job-end note
// (comm/job_end_note.hpp). Once the note is there and the ranks are gone, mpirun, then only
// waiting out its kill sequence, is ended here and the note's code returned; the folder is
// removed at the end either way.
struct Supervision {
  bool direct_to_ranks = true;
  std::string job_dir;
};

// Runs `cmd` as a child in its own process group with its stdout and stderr copied to ours, and
// returns its exit code (128 + the signal that ended it). Error when it cannot be started.
int run_supervised(const std::vector<std::string>& cmd, Supervision how);

}  // namespace strata
