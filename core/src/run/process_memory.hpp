// What the process holds in memory as the kernel sees it (/proc/self/status), next to what the
// memory ledger tracks, so that a run file can say how much of the process the ledger explains:
//   untracked = process peak - runtime baseline - tracked peak (the ledger's total at its peak).
// docs/measures.md "Memory: tracked, runtime, untracked" gives the measurements behind these
// choices.
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

// Makes the process's resident memory follow its live allocations; call first in main, before any
// thread starts. glibc raises its mmap threshold each time a mapped block is freed (up to 32 MiB,
// the trim threshold to twice that), after which large blocks come from the heap, where freed
// memory stays resident and fragments: once the start-up SGEMM calibration freed its 4 MiB
// matrices and zero2 its 16 MiB gradient buffers, each step took two new 16 MiB blocks from the
// heap and kept the freed ones (+32 MiB of RSS per step, 273-435 MiB for 205 MiB tracked). Fixed
// thresholds end that: every block of kMmapThresholdBytes or more is mapped on its own and
// unmapped when freed. 1 MiB rather than glibc's initial 128 KiB keeps OpenBLAS's 512 KiB job
// array, allocated and freed by every threaded GEMM call, in the heap: at 128 KiB each call paid
// an mmap, munmap and page faults (~830 pairs per small-model step at 2 BLAS threads, 13-24 us
// each: 11-20 ms of a ~400 ms step). The trim threshold is twice it, as glibc's own rule keeps
// it.
inline constexpr int kMmapThresholdBytes = 1 << 20;
void configure_allocator();
// For a process that only predicts (--advise): no run's memory to account for, and the advisor
// plans every stage's step of each configuration it ranks (a 175B pipeline stage's plan is
// thousands of actions): mapping and unmapping each of them at kMmapThresholdBytes made page
// faults half of advising GPT-3 175B on 1,024 GPUs. Freed blocks stay in the heap for the next.
void configure_allocator_for_predictions();

// The runtime's share of the process, taken once the runtime is up (MPI initialised, groups
// created) and before the strategy allocates: it warms BLAS up (cpu::warm_up_gemm: one GEMM of
// the largest block the layers issue), then takes the resident bytes minus the bytes the ledger
// already tracks (the micro-batch's token buffers). It also restarts the kernel's peak (VmHWM), so
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
