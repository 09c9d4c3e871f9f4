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

// The runner's policy for the C library's allocator; call first in main, before any thread
// starts. The ledger's host blocks of 1 MiB or more do not come from it: each is a mapping of its
// own (allocate_bytes, backends/backend.cpp), so resident memory follows the ledger (a freed
// 16 MiB gradient buffer leaves RSS at once; from the heap it stayed, +32 MiB a zero2 step).
// What the libraries allocate (Open MPI's scratch inside a collective, BLAS's buffers, the
// advisor's plans) stays in the heap once freed, up to 32 MiB a block, and the heap is trimmed
// only past 1 GiB free: a collective's scratch is faulted in once, not on every call. One heap
// (arena) for every thread: a scratch freed by the compute thread is reused by the next
// collective on a comm stream's thread instead of being kept once per thread (2 ranks of ddp on
// the small model: 16.7 MiB of it per rank with a heap per thread, 8.6 with one).
//
// With glibc's thresholds fixed at 1 MiB (the runner's policy until 2026-12-07), every call of a
// collective of 1 MiB or more mapped its scratch afresh, a page fault per 4 KiB at 10-12 us each
// on this project's virtual machines; glibc's default, dynamic thresholds trimmed a 16 MiB
// reduce_scatter's two 16 MiB blocks (32 MiB at the top of the heap, its trim threshold then) on
// every call. Figures: CHANGELOG.md, 2026-12-07. For --advise, the same policy keeps each
// candidate configuration's plans in the heap (mapped and unmapped, page faults were half of
// advising GPT-3 175B on 1,024 GPUs).
void configure_allocator();

// The runtime's share of the process, taken once the runtime is up (MPI initialised, groups
// created) and before the strategy allocates: it warms BLAS up (cpu::warm_up_gemm: one GEMM of
// the largest block the layers issue), then takes the resident bytes minus the bytes the ledger
// already tracks (the micro-batch's token buffers), the heap's free memory given back first. It
// also restarts the kernel's peak (VmHWM), so that the process peak covers the run from here on
// and not start-up transients (the SGEMM calibration's 12 MiB of matrices); where the kernel
// refuses the reset, the peak stays the lifetime peak.
std::uint64_t mark_runtime_baseline(const MemoryLedger& ledger);

// The peak resident bytes (VmHWM) since start or since mark_runtime_baseline(), leaving out the
// transients of OutsideProcessPeak scopes.
std::uint64_t peak_rss_bytes();

// A scope of measurement work that is not the run's (--calibrate-comm's buffers and the
// transport's scratch for its 16 MiB messages): its transient stays out of peak_rss_bytes(). The
// peak so far is kept; when the scope ends, the heap's free memory goes back to the system
// (malloc_trim) and the kernel's high-water mark restarts.
class OutsideProcessPeak {
 public:
  OutsideProcessPeak();
  ~OutsideProcessPeak();
  OutsideProcessPeak(const OutsideProcessPeak&) = delete;
  OutsideProcessPeak& operator=(const OutsideProcessPeak&) = delete;
};

}  // namespace strata
