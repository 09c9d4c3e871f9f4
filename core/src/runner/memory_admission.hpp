// Memory admission (docs/running.md, "Memory admission"): before a run starts its ranks and
// allocates anything, the memory they are predicted to hold on this host (the strategies'
// predict(), exact for what strata allocates) against what the host lets them use. A run that
// would not fit is refused with one line (exit 4) instead of growing until the kernel's OOM killer
// or a failed allocation ends it, and perhaps a neighbour's job with it.
#pragma once

#include <functional>
#include <string>

#include "runner/run_config.hpp"
#include "strata/plugin.hpp"

namespace strata {

// What this host lets the run's ranks use together, in bytes, and where the figure comes from.
struct HostMemory {
  double bytes = 0;                  // 0: unknown (nothing to check against)
  std::string source;                // e.g. "MemAvailable", "the cgroup's memory.max less its use"
  double address_space = 0;          // each process's address-space limit (ulimit -v); 0: unlimited
  double runtime_address_space = 0;  // what each rank's runtime maps (runtime_address_space())
  double device_free = 0;  // a GPU run: the least free memory of the ranks' GPUs; 0: unknown
};

// Address space a rank's runtime maps beside what strata allocates: the libraries, MPI's and
// UCX's segments, thread stacks, malloc arenas and a 128 MiB OpenBLAS buffer per BLAS thread (its
// load-time threads included). Measured 2026-11-29 (VmPeak of a 1-rank tiny run, 9 MiB predicted):
// 785 MiB with 2 BLAS threads, 1063 MiB with 4, 1601 MiB with 8. Below it OpenBLAS, UCX or PMIx
// fail in ways no run file can follow (a spin in blas_memory_alloc, a hang, a crash).
double runtime_address_space(int blas_threads);

// RLIMIT_AS's soft limit in bytes; 0 when unlimited.
double current_address_space_limit();

// Where the figures are read: the real files by default, a test's own files otherwise.
struct HostMemorySources {
  std::string meminfo = "/proc/meminfo";
  std::string self_cgroup = "/proc/self/cgroup";
  std::string cgroup_root = "/sys/fs/cgroup";
  std::function<const char*(const char*)> env = [](const char* name) { return std::getenv(name); };
  std::function<double()> address_space_limit = current_address_space_limit;
};

// The smallest of: MemAvailable; for each cgroup this process is in, up to the root, its memory
// limit less what it already uses other than page cache (v2 memory.max - memory.current + the
// stat's file, v1 memory.limit_in_bytes - memory.usage_in_bytes + total_cache); Slurm's allocation
// on this node (SLURM_MEM_PER_NODE, or SLURM_MEM_PER_CPU x SLURM_CPUS_ON_NODE, in MiB). Beside
// it, each process's address-space limit: a rank's host memory and kRuntimeAddressSpace within.
HostMemory host_memory(const HostMemorySources& sources = {});

// The check itself, given the ranks this host starts (all of the world when the runner relaunches
// itself here, the launcher's local ranks under srun/mpirun) and the host's memory: "" when they
// fit, else one line naming the shortfall and what would fit. Host memory holds every tag of a CPU
// rank and the host tags (offload) of a GPU rank; --memory-limit, when given, replaces the host's
// figure per rank on the CPU and bounds each GPU rank's device memory, which is otherwise checked
// against its GPU's free memory (host.device_free).
std::string memory_admission(const RunConfig& config, const Strategy& strategy, int ranks_here,
                             const HostMemory& host);

}  // namespace strata
