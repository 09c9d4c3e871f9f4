// Memory admission (docs/running.md, "Memory admission"): before a run starts its ranks and
// allocates anything, the memory they are predicted to hold on this host (the strategies'
// predict(), exact for what strata allocates) against what the host lets them use. A run that
// would not fit is refused with one line (exit 4) instead of growing until the kernel's OOM killer
// or a failed allocation ends it, and perhaps a neighbour's job with it.
#pragma once

#include <functional>
#include <string>

#include "config.hpp"
#include "strata/plugin.hpp"

namespace strata {

// What this host lets the run's ranks use together, in bytes, and where the figure comes from.
struct HostMemory {
  double bytes = 0;    // 0: unknown (nothing to check against)
  std::string source;  // e.g. "MemAvailable", "the cgroup's memory.max less its use"
};

// Where the figures are read: the real files by default, a test's own files otherwise.
struct HostMemorySources {
  std::string meminfo = "/proc/meminfo";
  std::string self_cgroup = "/proc/self/cgroup";
  std::string cgroup_root = "/sys/fs/cgroup";
  std::function<const char*(const char*)> env = [](const char* name) { return std::getenv(name); };
};

// The smallest of: MemAvailable; for each cgroup this process is in, up to the root, its memory
// limit less what it already uses other than page cache (v2 memory.max - memory.current + the
// stat's file, v1 memory.limit_in_bytes - memory.usage_in_bytes + total_cache); Slurm's allocation
// on this node (SLURM_MEM_PER_NODE, or SLURM_MEM_PER_CPU x SLURM_CPUS_ON_NODE, in MiB).
HostMemory host_memory(const HostMemorySources& sources = {});

// The check itself, given the ranks this host starts (all of the world when the runner relaunches
// itself here, the launcher's local ranks under srun/mpirun) and the host's memory: "" when they
// fit, else one line naming the shortfall and what would fit. Host memory holds every tag of a CPU
// rank and the host tags (offload) of a GPU rank; --memory-limit, when given, replaces the host's
// figure per rank on the CPU and bounds each GPU rank's device memory.
std::string memory_admission(const RunConfig& config, const Strategy& strategy, int ranks_here,
                             const HostMemory& host);

}  // namespace strata
