// What the process holds in memory as the kernel sees it (/proc/self/status), next to what the
// memory ledger tracks, so that a run file can say how much of the process the ledger explains:
//   untracked = process peak - runtime baseline - tracked peak (the ledger's total at its peak).
// README "Memory: tracked, runtime, untracked" gives the measurements behind these choices.
#pragma once
#include <cstdint>

#include "strata/memory.hpp"

namespace strata {

// Resident memory of this process, in bytes (0 where the kernel does not report a field).
struct ProcessMemory {
  std::uint64_t rss = 0;        // VmRSS: resident now
  std::uint64_t peak_rss = 0;   // VmHWM: high-water mark of rss (since start or the last reset)
  std::uint64_t rss_anon = 0;   // RssAnon: heap, mmap'd buffers, thread stacks
  std::uint64_t rss_file = 0;   // RssFile: mapped files (the libraries' code and data)
  std::uint64_t rss_shmem = 0;  // RssShmem: shared memory (MPI's shared-memory transports)
};
ProcessMemory read_process_memory();

// The runtime's share of the process, taken once the runtime is up (MPI initialised, groups
// created, BLAS warmed up by the SGEMM calibration) and before the strategy allocates: the
// resident bytes minus the bytes the ledger already tracks (the micro-batch's token buffers). It
// also restarts the kernel's peak (VmHWM), so
// that the process peak covers the run from here on and not start-up transients (the SGEMM
// calibration's 12 MiB of matrices); where the kernel refuses the reset, the peak stays the
// lifetime peak.
std::uint64_t mark_runtime_baseline(const MemoryLedger& ledger);

// The peak resident bytes (VmHWM) since start or since mark_runtime_baseline(), leaving out the
// transients of OutsideProcessPeak scopes.
std::uint64_t peak_rss_bytes();

// A scope of measurement work that is not the run's (--calibrate-comm's buffers and the
// transport's scratch for its 16 MiB messages): its transient stays out of peak_rss_bytes(). The
// peak so far is kept and the kernel's high-water mark restarts when the scope ends.
class OutsideProcessPeak {
 public:
  OutsideProcessPeak();
  ~OutsideProcessPeak();
  OutsideProcessPeak(const OutsideProcessPeak&) = delete;
  OutsideProcessPeak& operator=(const OutsideProcessPeak&) = delete;
};

}  // namespace strata
