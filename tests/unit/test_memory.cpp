// The memory ledger's totals and what the process holds next to it (process_memory.hpp).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "run/process_memory.hpp"
#include "strata/memory.hpp"

namespace {

using strata::Buffer;
using strata::MemoryLedger;
using strata::MemTag;

constexpr std::uint64_t kMiB = 1 << 20;

TEST(MemoryLedger, TotalPeakIsTheLargestSumAtOneMoment) {
  MemoryLedger ledger;
  {
    Buffer<float> grads(ledger, MemTag::grads, 1000);
    Buffer<float> act(ledger, MemTag::activations, 3000);
  }                                                  // grads 4000 + activations 12000 bytes at once
  Buffer<float> grads(ledger, MemTag::grads, 2000);  // grads peak 8000, alone
  EXPECT_EQ(ledger.peak(MemTag::grads), 8000u);
  EXPECT_EQ(ledger.peak(MemTag::activations), 12000u);
  EXPECT_EQ(ledger.total(), 8000u);
  EXPECT_EQ(ledger.total_peak(), 16000u);  // below the sum of the tag peaks, 20000
}

// Offloaded state is host memory: its own tag, a buffer on the CPU whatever the ledger's device,
// left out of the device total; the other tags keep the ledger's device.
TEST(MemoryLedger, OffloadIsHostMemoryOutsideTheDeviceTotal) {
  MemoryLedger ledger(strata::Device::cuda);  // only the device's name: nothing is allocated on it
  EXPECT_TRUE(strata::is_host_tag(MemTag::offload));
  EXPECT_FALSE(strata::is_host_tag(MemTag::optimizer));
  EXPECT_STREQ(strata::tag_name(MemTag::offload), "offload");
  EXPECT_EQ(strata::kMemTagNames.back(), std::string("offload"));  // appended: files name tags
  {
    Buffer<float> m(ledger, MemTag::offload, 1000);
    EXPECT_EQ(m.device(), strata::Device::cpu);
    EXPECT_EQ(m.view().device, strata::Device::cpu);
    m[999] = 1.0f;  // host memory: writable here
    EXPECT_EQ(ledger.current(MemTag::offload), 4000u);
    EXPECT_EQ(ledger.total(), 0u);
  }
  EXPECT_EQ(ledger.peak(MemTag::offload), 4000u);
  EXPECT_EQ(ledger.current(MemTag::offload), 0u);
  EXPECT_EQ(ledger.total_peak(), 0u);
}

TEST(ProcessMemory, ReadsTheKernelsFigures) {
  const strata::ProcessMemory m = strata::read_process_memory();
  EXPECT_GT(m.rss, 0u);
  EXPECT_GE(m.peak_rss, m.rss);
  EXPECT_GT(m.rss_anon + m.rss_file, 0u);
  EXPECT_LE(m.rss_anon + m.rss_file + m.rss_shmem, m.rss + 64 * 1024);
}

// Minor page faults of this process so far.
long minor_faults() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

// What Open MPI's 16 MiB reduce_scatter allocates inside one call: two 16 MiB blocks, written,
// then freed.
constexpr std::size_t kScratch = 16 * kMiB;
void library_call(int fill) {
  char* scratch[2] = {static_cast<char*>(std::malloc(kScratch)),
                      static_cast<char*>(std::malloc(kScratch))};
  for (char* p : scratch) {
    std::memset(p, fill, kScratch);
    asm volatile("" : : "r"(p) : "memory");  // the block is used: not elided
  }
  for (char* p : scratch) std::free(p);
}

// A ledger's block of 1 MiB or more is a mapping of its own (allocate_bytes): freed, it leaves RSS
// at once, every time, though the runner's allocator keeps the C library's freed blocks.
TEST(ProcessMemory, FreedLargeBuffersLeaveResidentMemory) {
  strata::configure_allocator();
  MemoryLedger ledger;
  const std::size_t count = 4 * kMiB;  // floats: 16 MiB
  for (int round = 0; round < 3; ++round) {
    const std::uint64_t before = strata::read_process_memory().rss;
    {
      Buffer<float> b(ledger, MemTag::comm_buffers, count);  // zeroed, so resident
      EXPECT_GE(strata::read_process_memory().rss, before + 15 * kMiB) << "round " << round;
      std::vector<char> pin(4096, 1);  // a small block allocated after it, as a step does
    }
    EXPECT_LE(strata::read_process_memory().rss, before + kMiB) << "round " << round;
  }
}

// A library's large scratch is reused from the heap, not faulted in afresh on every call, with
// ledger blocks mapped and unmapped between the calls: Open MPI's 16 MiB reduce_scatter takes two
// 16 MiB blocks inside the call; from the second call on they cost fewer than 1/8 of their 8,192
// pages in faults (measured: 0; with glibc's default policy 8,160-8,192 a call, trimmed each
// time; with its thresholds fixed at 1 MiB, as the runner once set them, 8,194).
TEST(ProcessMemory, LibraryScratchIsReusedBesideLedgerBlocks) {
  strata::configure_allocator();
  MemoryLedger ledger;
  const long pages = long(2 * kScratch / std::size_t(::sysconf(_SC_PAGESIZE)));
  for (int call = 0; call < 4; ++call) {
    Buffer<float> bucket(ledger, MemTag::grads, 2 * kMiB);  // 8 MiB, mapped
    const long before = minor_faults();
    library_call(call);
    const long faults = minor_faults() - before;
    if (call >= 1) EXPECT_LT(faults, pages / 8) << "call " << call << ": " << faults << " faults";
  }
}

// The runner's allocator has one heap for every thread: a scratch freed on one thread is reused
// on the next, as a collective's alternate between the compute thread and a comm stream's, and the
// process holds one copy of it (measured: +32.1 MiB for two 16 MiB blocks; 64.1 with a heap per
// thread, glibc's default).
TEST(ProcessMemory, LibraryScratchIsHeldOnceAcrossThreads) {
  strata::configure_allocator();
  const std::uint64_t before = strata::read_process_memory().rss;
  for (int round = 0; round < 2; ++round) {
    library_call(1);
    std::thread(library_call, 1).join();
  }
  const std::uint64_t grown = strata::read_process_memory().rss - before;
  EXPECT_LT(grown, 2 * kScratch + 8 * kMiB) << grown / kMiB << " MiB";
}

// One element past the end of a mapped block faults at once (an inaccessible page follows it).
TEST(MemoryLedgerDeathTest, OverrunOfALargeBlockFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // BLAS's threads may be up already
  MemoryLedger ledger;
  Buffer<float> b(ledger, MemTag::workspace, kMiB);
  volatile float* end = b.data() + b.size();
  EXPECT_DEATH(*end = 1.0f, "");
}

// A buffer's pages are made resident in one call where it is large enough (allocate_bytes): that
// maps fresh pages only, so a block reused from the heap must still be zero-filled.
TEST(MemoryLedger, ReusedMemoryIsZeroFilled) {
  MemoryLedger ledger;
  for (const std::size_t count : {std::size_t(100), std::size_t(64 * 1024), std::size_t(kMiB)}) {
    for (int round = 0; round < 3; ++round) {
      Buffer<float> b(ledger, MemTag::workspace, count);
      std::size_t nonzero = 0;
      for (std::size_t i = 0; i < count; ++i) nonzero += b[i] != 0.0f;
      EXPECT_EQ(nonzero, 0u) << count << " floats, round " << round;
      std::memset(b.data(), 0x5A, b.bytes());  // dirty, then freed for the next round to reuse
    }
  }
}

// The baseline is the resident memory less what the ledger already holds, once the heap's free
// memory is given back, and the process peak starts again from it: neither a transient before the
// mark nor the heap's freed blocks are in them.
TEST(ProcessMemory, BaselineExcludesTrackedBytesAndRestartsThePeak) {
  strata::configure_allocator();
  {
    std::vector<char> transient(64 * kMiB);  // a mapping of its own (above 32 MiB): in the peak
    std::memset(transient.data(), 1, transient.size());
  }
  {
    std::vector<char> freed(30 * kMiB);  // from the heap, resident there once freed
    std::memset(freed.data(), 1, freed.size());
  }
  MemoryLedger ledger;
  Buffer<float> params(ledger, MemTag::params, 2 * kMiB);  // 8 MiB, tracked
  const std::uint64_t rss = strata::read_process_memory().rss;
  const std::uint64_t baseline = strata::mark_runtime_baseline(ledger);
  const std::uint64_t after = strata::read_process_memory().rss;
  EXPECT_GE(baseline + 8 * kMiB, after - 256 * 1024);
  EXPECT_LE(baseline + 8 * kMiB, after + 256 * 1024);
  // mark_runtime_baseline() warms the GEMM workspace up (a few MiB of BLAS buffers) and gives
  // the heap's 30 MiB back.
  EXPECT_LT(after + 16 * kMiB, rss) << "the heap's freed 30 MiB are still resident";
  const std::uint64_t peak = strata::peak_rss_bytes();
  EXPECT_LT(peak, baseline + 8 * kMiB + 8 * kMiB) << "the 64 MiB transient is still in the peak";
  EXPECT_GE(peak, strata::read_process_memory().rss);
}

}  // namespace
