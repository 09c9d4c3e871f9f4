// The device side of the CUDA emulator: what a kernel body sees when it is compiled as host C++.
//
// The CUDA threads of a block run as fibers on the launching host thread, in a fixed order, or
// (STRATA_CUDA_EMU_THREADS=1, and under ThreadSanitizer) each on a host thread of its own, where a
// missing __syncthreads is a real data race that ThreadSanitizer reports (src/blocks.cpp). Barriers
// and warp shuffles wait for the block's or the warp's live threads; shuffles exchange through
// per-warp slots, atomics are std::atomic_ref. Blocks of a launch run one after another and
// launches one at a time, so `__shared__` can be a function-local static (one instance per running
// block).
#pragma once
#include <math.h>

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda_runtime_api.h"

// Qualifiers: nothing to do on the host. __shared__ storage is one static per running block.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __constant__ static
#define __launch_bounds__(...)

// Built-in variables: set per host thread by the block runner.
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
constexpr int warpSize = 32;

namespace strata_emu {

// The running launch's dynamic shared memory (its smem bytes, refilled with 0xFF per block).
void* dynamic_shared_memory();
// Whether [p, p + bytes) lies inside the running block's dynamic shared memory.
bool in_dynamic_shared_memory(const void* p, std::size_t bytes);
// __syncthreads: a barrier of the block's threads that have not exited.
void sync_threads();
// __syncwarp: a barrier of the warp's lanes.
void sync_warp(unsigned mask);
// One exchange among the warp's lanes: publishes `bits`, returns the bits lane `src_lane`
// published. `mask` must name every lane of the warp that has not exited (the emulator has no
// partial-warp exchanges; it stops with a message otherwise).
std::uint64_t shuffle_bits(unsigned mask, std::uint64_t bits, int src_lane);
// This thread's lane in its warp (threads numbered x fastest, as CUDA does).
int lane_id();
// A warp-collective operation other than a shuffle (the WMMA calls of mma.h), named `what` in the
// messages: every lane of a full warp must make the same call, as on a GPU (the emulator stops
// with a message otherwise, as for shuffles). The lane publishes `mine`, waits for the whole warp
// and gets the 32 lanes' pointers, valid until it calls warp_collective_end(), which waits for the
// whole warp again, so that no lane returns and changes what it published while another lane is
// still reading it. An operation that reads nothing of the other lanes' (a fragment load, store or
// fill) calls warp_collective_begin(what, nullptr) alone: one barrier.
const void* const* warp_collective_begin(const char* what, const void* mine);
void warp_collective_end();
// Stops the run with "kernel <name>, thread <n>: <message>" (misuse a GPU leaves undefined).
[[noreturn]] void fatal_in_kernel(const char* format, ...) __attribute__((format(printf, 1, 2)));

template <class T>
T shuffle(unsigned mask, T value, int src_lane) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffle of at most 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = shuffle_bits(mask, bits, src_lane);
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

}  // namespace strata_emu

inline void __syncthreads() { strata_emu::sync_threads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { strata_emu::sync_warp(mask); }

// Warp shuffles with CUDA's source-lane rules for a `width` sub-section: a source outside the
// caller's section gives the caller's own value.
template <class T>
T __shfl_sync(unsigned mask, T value, int src_lane, int width = warpSize) {
  const int lane = strata_emu::lane_id();
  return strata_emu::shuffle(mask, value, (lane / width) * width + src_lane % width);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = warpSize) {
  const int lane = strata_emu::lane_id();
  const int src = lane ^ lane_mask;
  return strata_emu::shuffle(mask, value, src / width > lane / width ? lane : src);
}
template <class T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = warpSize) {
  const int lane = strata_emu::lane_id();
  const bool inside = lane % width + int(delta) < width;
  return strata_emu::shuffle(mask, value, inside ? lane + int(delta) : lane);
}
template <class T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = warpSize) {
  const int lane = strata_emu::lane_id();
  const bool inside = lane % width >= int(delta);
  return strata_emu::shuffle(mask, value, inside ? lane - int(delta) : lane);
}

// Atomics on global or shared memory: relaxed, as CUDA's (they order nothing else).
template <class T>
T atomicAdd(T* address, T value) {
  return std::atomic_ref<T>(*address).fetch_add(value, std::memory_order_relaxed);
}
template <class T>
T atomicExch(T* address, T value) {
  return std::atomic_ref<T>(*address).exchange(value, std::memory_order_relaxed);
}
template <class T>
T atomicCAS(T* address, T compare, T value) {
  std::atomic_ref<T>(*address).compare_exchange_strong(compare, value, std::memory_order_relaxed);
  return compare;  // the old value either way
}
template <class T>
T atomicMax(T* address, T value) {
  std::atomic_ref<T> a(*address);
  T old = a.load(std::memory_order_relaxed);
  while (old < value && !a.compare_exchange_weak(old, value, std::memory_order_relaxed)) {
  }
  return old;
}
template <class T>
T atomicMin(T* address, T value) {
  std::atomic_ref<T> a(*address);
  T old = a.load(std::memory_order_relaxed);
  while (value < old && !a.compare_exchange_weak(old, value, std::memory_order_relaxed)) {
  }
  return old;
}

// Device math the host's libm lacks.
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
// Round-to-nearest arithmetic that the compiler never contracts into an FMA (host C++ without
// -ffp-contract does not contract across these calls either).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
