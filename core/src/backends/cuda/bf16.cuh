// Device-side bf16 (stored as its 16 bits) converted exactly as strata::to_float / to_bf16 do, and
// loads / stores of an fp32-or-bf16 buffer chosen at run time. Shared by the CUDA sources (nvcc, or
// the CUDA emulator's host C++), so every backend rounds a bf16 the same way, bit for bit.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

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

// An element as fp32: a float as it is, a bf16's 16 bits widened (kernels templated on the element
// type they read, a bf16 run's Q, K, V).
__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(std::uint16_t v) { return bf16_to_float(v); }

// f(std::type_identity<E>{}) with E the element a bf16 (a bf16's 16 bits) or fp32 (float) tensor
// is read as: a template argument, not a flag, so each kernel has one load path (a run-time
// choice made ptxas spill the tensor-core attention).
template <class F>
void with_element_type(bool bf16, F&& f) {
  if (bf16)
    f(std::type_identity<std::uint16_t>{});
  else
    f(std::type_identity<float>{});
}

}  // namespace strata::cuda
