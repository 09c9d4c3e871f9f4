// Launch geometry and block reductions shared by the CUDA sources' elementwise kernels (nvcc, or
// the CUDA emulator's host C++): one block size, a capped grid that any n fits through a
// grid-stride loop, and the tree reduction of one value per thread.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

namespace strata::cuda {

constexpr int kThreads = 256;          // threads per block of the elementwise kernels
constexpr unsigned kMaxBlocks = 1024;  // a grid-stride loop covers the rest

inline unsigned blocks_for(std::size_t n) {
  return unsigned(
      std::max<std::size_t>(1, std::min<std::size_t>(kMaxBlocks, (n + kThreads - 1) / kThreads)));
}

// The block's reduction (max, or sum) of each thread's v, by halving over kThreads slots; every
// thread gets the result. One fixed order, so a result does not depend on the run.
__device__ __forceinline__ float block_reduce(float v, bool is_max) {
  __shared__ float buf[kThreads];
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half) {
      const float o = buf[threadIdx.x + half];
      buf[threadIdx.x] = is_max ? fmaxf(buf[threadIdx.x], o) : buf[threadIdx.x] + o;
    }
    __syncthreads();
  }
  const float r = buf[0];
  __syncthreads();  // buf may be reused
  return r;
}

// Scratch for a few launches on `stream`, freed with cudaFreeAsync on it after them: a
// stream-ordered allocation of the backend's pool, counted in the device peak, not in the memory
// ledger (as cuBLAS's workspace). In a CUDA graph capture it becomes the graph's memory.
void* stream_scratch(std::size_t bytes, cudaStream_t stream);

// dst[c] += sums[k * stride + c] for k = 0 .. chunks - 1 in that order, c < C: the column sums of
// a reduction's blocks (kernels_steps.cu).
void add_chunk_sums(float* dst, const float* sums, std::size_t chunks, std::size_t stride, int C,
                    cudaStream_t stream);

}  // namespace strata::cuda

// A grid-stride loop over [0, n): any grid covers any n.
#define STRATA_GRID_STRIDE(i, n)                                                    \
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < (n); \
       i += std::size_t(gridDim.x) * blockDim.x)
