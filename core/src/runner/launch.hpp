// How this process was started, and re-launching itself across ranks when started alone.
#pragma once
#include <cstdint>
#include <string>

#include "runner/run_config.hpp"

namespace strata {

struct LaunchEnv {
  bool under_launcher = false;  // started by mpirun / srun (ranks exist)
  int world = 1;                // from the launcher's variables, before MPI starts
  int rank = 0;
  int local_size = 0;  // ranks on this host, 0 when unknown
  bool in_slurm_allocation = false;
};

LaunchEnv detect_launch_env();

// CPUs this process may run on (its affinity mask: taskset, srun --cpu-bind, mpirun --bind-to),
// and a fingerprint of the mask, equal for the ranks of a node that share one mask.
int affinity_cpus();
std::uint64_t affinity_fingerprint();
int slurm_cpus_per_task();  // SLURM_CPUS_PER_TASK, 0 when not set
// Automatic BLAS threads: the mask's CPUs split among the ranks bound to that same mask (mpirun
// --bind-to none, srun without binding), at most SLURM_CPUS_PER_TASK (0: not set); at least 1.
int auto_blas_threads(int mask_cpus, int ranks_sharing_mask, int slurm_cpus_per_task);
// BLAS threads for each rank: the option, else OPENBLAS_NUM_THREADS, else auto_blas_threads of
// this process's mask and SLURM_CPUS_PER_TASK. `origin`, when given, says which and why.
int blas_threads_for(const RunConfig& config, int ranks_sharing_mask,
                     std::string* origin = nullptr);

// A launch on this host (no Slurm allocation) runs every rank here: refuse worlds beyond 16 ranks
// per core (ConfigError naming --nodes and --ranks-per-node) before mpirun is asked for them, and
// raise the open-file limit to what mpirun and the ranks need (refused where the hard limit is
// lower).
void check_local_world(const RunConfig& config, int world);

// Run the same command line on `world` ranks under `srun` (inside a Slurm allocation) or `mpirun`
// (on this host), supervised (supervisor.hpp): signals to this process reach the ranks. Returns
// the ranks' exit code; throws Error when the launcher cannot be started.
int relaunch(const RunConfig& config, int world, int argc, char** argv);

// STRATA_MPIRUN_ARGS's words, split as a POSIX shell splits them (no expansion): blanks separate,
// '...' keeps everything, "..." keeps everything but \" \\ \$ \` (escapes), a backslash outside
// quotes keeps the next character. ConfigError for an unbalanced quote or a trailing backslash.
std::vector<std::string> shell_words(const std::string& text, const std::string& what);

}  // namespace strata
