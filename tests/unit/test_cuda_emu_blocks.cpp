// The CUDA emulator's block runner (tests/cuda_emu/src/blocks.cpp) across launches: every launch
// runs each of its CUDA threads once, whatever the block sizes of the launches before it. In the
// threaded mode (emu.threaded.blocks) a pool of host threads, grown to the largest block, serves
// every launch; the workers a smaller block does not use wake for it too and must leave it alone
// (Pool::work; the race this catches, and how often it caught it: CHANGELOG.md, 2026-12-07).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "backends/cuda/launch.cuh"

namespace {

__global__ void count_threads(unsigned* runs, int launch) {
  __syncthreads();  // every thread of the block is inside it at once
  atomicAdd(&runs[launch], 1u);
}

}  // namespace

TEST(CudaEmuBlocks, LaunchesOfAlternatingBlockSizesRunEachThreadOnce) {
  // 1,024 and 32 threads in turn: 992 idle workers wake for each small launch. 200 launches take
  // 4.6-5.3 s in the threaded mode on 2 cores (Release), 8 s under ASan.
  constexpr int kLaunches = 200;
  constexpr unsigned kBlocks = 2;
  unsigned* runs = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&runs), kLaunches * sizeof(unsigned)), cudaSuccess);
  ASSERT_EQ(cudaMemset(runs, 0, kLaunches * sizeof(unsigned)), cudaSuccess);
  std::vector<unsigned> expected(kLaunches);
  for (int launch = 0; launch < kLaunches; ++launch) {
    const unsigned threads = launch % 2 == 0 ? 1024 : 32;
    STRATA_LAUNCH(count_threads, dim3(kBlocks), dim3(threads), 0, nullptr)(runs, launch);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    expected[launch] = kBlocks * threads;
  }
  std::vector<unsigned> got(kLaunches);
  ASSERT_EQ(cudaMemcpy(got.data(), runs, kLaunches * sizeof(unsigned), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(got, expected);
  cudaFree(runs);
}
