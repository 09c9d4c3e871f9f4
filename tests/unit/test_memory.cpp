// The memory ledger's totals and what the process holds next to it (process_memory.hpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
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

// glibc's dynamic mmap threshold keeps a large block freed after an earlier large free in the
// heap, resident; with configure_allocator() a freed 16 MiB buffer leaves RSS at once, every time.
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

// A buffer's pages are made resident in one call where it is large enough (allocate_bytes): that
// maps fresh pages only, so a block reused from the heap must still be zero-filled.
TEST(MemoryLedger, ReusedMemoryIsZeroFilled) {
  strata::configure_allocator();  // as the runner: blocks of 1 MiB and more are mapped afresh
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

// The baseline is the resident memory less what the ledger already holds, and the process peak
// starts again from it: a transient before the mark is not in the peak.
TEST(ProcessMemory, BaselineExcludesTrackedBytesAndRestartsThePeak) {
  strata::configure_allocator();
  {
    std::vector<char> transient(64 * kMiB);
    std::memset(transient.data(), 1, transient.size());
  }
  MemoryLedger ledger;
  Buffer<float> params(ledger, MemTag::params, 2 * kMiB);  // 8 MiB, tracked
  const std::uint64_t rss = strata::read_process_memory().rss;
  const std::uint64_t baseline = strata::mark_runtime_baseline(ledger);
  // mark_runtime_baseline() warms the GEMM workspace (a few MiB of BLAS buffers) first.
  EXPECT_GE(baseline + 8 * kMiB, rss - 256 * 1024);
  EXPECT_LE(baseline + 8 * kMiB, rss + 16 * kMiB);
  const std::uint64_t peak = strata::peak_rss_bytes();
  EXPECT_LT(peak, baseline + 8 * kMiB + 8 * kMiB) << "the 64 MiB transient is still in the peak";
  EXPECT_GE(peak, strata::read_process_memory().rss);
}

}  // namespace
