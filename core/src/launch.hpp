// How this process was started, and re-launching itself across ranks when started alone.
#pragma once
#include <string>

#include "config.hpp"

namespace strata {

struct LaunchEnv {
  bool under_launcher = false;  // started by mpirun / srun (ranks exist)
  int world = 1;                // from the launcher's variables, before MPI starts
  int rank = 0;
  int local_size = 0;  // ranks on this host, 0 when unknown
  bool in_slurm_allocation = false;
};

LaunchEnv detect_launch_env();

// BLAS threads for each rank: the option, else OPENBLAS_NUM_THREADS, else cores / ranks on host.
int blas_threads_for(const RunConfig& config, int ranks_on_host);

// A launch on this host (no Slurm allocation) runs every rank here: refuse worlds beyond 16 ranks
// per core (ConfigError naming --nodes and --ranks-per-node) before mpirun is asked for them.
void check_local_world(const RunConfig& config, int world);

// Replace this process with `srun` (inside a Slurm allocation) or `mpirun` (on this host) running
// the same command line on `world` ranks. Returns only on failure (throws Error).
[[noreturn]] void relaunch(const RunConfig& config, int world, int argc, char** argv);

}  // namespace strata
