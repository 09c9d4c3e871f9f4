// The CUDA emulator's cuda_bf16.h (tests/cuda_emu): the __nv_bfloat16 type and its conversions, as
// much as strata's kernels use. Its 16 bits are the top half of a float's; float to bf16 rounds to
// nearest, ties to even (NaN stays a quiet NaN), as CUDA's __float2bfloat16_rn and strata::to_bf16.
#pragma once
#include <bit>
#include <cstdint>

struct __nv_bfloat16 {
  std::uint16_t __x;
};

inline float __bfloat162float(__nv_bfloat16 b) {
  return std::bit_cast<float>(std::uint32_t(b.__x) << 16);
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {std::uint16_t((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {std::uint16_t(u >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return {u}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
