// What bench_kernels' cuda backend (bench_kernels.cpp) and its GPU-only cases
// (bench_gpu_kernels.cpp) share: one context on device 0, one event clock on its stream and the
// fixed pattern of every benchmark buffer. Defined in bench_kernels.cpp.
#pragma once
#include <cstddef>

#if STRATA_BENCH_CUDA
#include "backends/cuda/layers.cuh"  // CudaContext
#endif

namespace strata::bench {

// p[i] in [-1, 1), a fixed pattern of i (never zeros: they run faster on some units).
void fill_pattern(float* p, std::size_t n);

#if STRATA_BENCH_CUDA
// Device 0's context, created on first use, i.e. only once a device is known to exist.
const cuda::CudaContext& cuda_ctx();
// Starts the clock of one timed pass: an event recorded on cuda_ctx()'s stream.
void cuda_clock_start();
// Seconds since cuda_clock_start(), the work queued in between included (waits for it).
double cuda_clock_stop();
#endif

}  // namespace strata::bench
