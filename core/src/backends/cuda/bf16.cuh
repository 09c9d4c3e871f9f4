// Device-side bf16 (stored as its 16 bits) converted exactly as strata::to_float / to_bf16 do, and
// loads / stores of an fp32-or-bf16 buffer chosen at run time. Shared by the CUDA sources (nvcc, or
// the CUDA emulator's host C++), so every backend rounds a bf16 the same way, bit for bit.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace strata::cuda {

__device__ __forceinline__ float bf16_to_float(std::uint16_t b) {
  return __uint_as_float(std::uint32_t(b) << 16);
}
// Round to nearest even; NaN stays a quiet NaN (strata::to_bf16).
__device__ __forceinline__ std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::uint16_t(u >> 16);
}
__device__ __forceinline__ float load(const void* p, bool bf16, std::size_t i) {
  return bf16 ? bf16_to_float(static_cast<const std::uint16_t*>(p)[i])
              : static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void store(void* p, bool bf16, std::size_t i, float v) {
  if (bf16)
    static_cast<std::uint16_t*>(p)[i] = float_to_bf16(v);
  else
    static_cast<float*>(p)[i] = v;
}

// An fp32-or-bf16 tensor read from element `at` on (a bf16 run's Q, K, V): src[i] is the value
// widened to fp32, src + d the same tensor d elements on.
struct ActRead {
  const void* p;
  bool bf16;
  std::int64_t at;
  __device__ __forceinline__ float operator[](std::int64_t i) const {
    return load(p, bf16, std::size_t(at + i));
  }
  __device__ __forceinline__ ActRead operator+(std::int64_t d) const { return {p, bf16, at + d}; }
};

}  // namespace strata::cuda
