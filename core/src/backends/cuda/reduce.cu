// DeviceSum (cuda/reduce.hpp).
#include <vector>

#include "backends/cuda/bf16.cuh"
#include "backends/cuda/device.hpp"
#include "backends/cuda/grid.cuh"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/reduce.hpp"

namespace strata::cuda {
namespace {

// partial[block] = the fp32 sum of the block's elements (squared with `squares`).
__global__ void block_sums_kernel(const void* x, bool bf16, std::size_t n, bool squares,
                                  float* partial) {
  float s = 0.0f;
  STRATA_GRID_STRIDE(i, n) {
    const float v = load(x, bf16, i);
    s += squares ? v * v : v;
  }
  s = block_reduce(s, false);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

}  // namespace

DeviceSum::~DeviceSum() {
  if (partial_) cudaFree(partial_);
}

double DeviceSum::operator()(cudaStream_t stream, const void* x, bool bf16, std::size_t n,
                             bool squares) {
  if (n == 0) return 0.0;
  if (!partial_)
    STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&partial_), kMaxBlocks * sizeof(float)));
  const unsigned blocks = blocks_for(n);
  STRATA_LAUNCH(block_sums_kernel, blocks, kThreads, 0, stream)(x, bf16, n, squares, partial_);
  STRATA_CUDA_CHECK_LAUNCH();
  std::vector<float> sums(blocks);
  STRATA_CUDA_CHECK(cudaMemcpyAsync(sums.data(), partial_, blocks * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
  double s = 0.0;
  for (float v : sums) s += v;
  return s;
}

}  // namespace strata::cuda
