// Vectorisable float math for the CPU layer kernels.
//
// libm's expf/tanhf are scalar calls that stop a loop from vectorising (glibc only declares its
// SIMD variants under -ffast-math), and GELU alone evaluates tanh 2 x 4C values per token per
// layer. These branch-free inline versions vectorise under `#pragma omp simd`.
// Accuracy: exp_approx is within 2 ulp of expf on [-87.3, 88]; tanh_approx has an absolute error
// below 2e-7 (relative accuracy degrades only where |tanh| << 1e-7 / |x|, which no caller
// needs: GELU multiplies it by x and adds 1).
#pragma once
#include <bit>
#include <cstdint>

// Kernels marked STRATA_SIMD_CLONES are compiled for x86-64-v4 (AVX-512), x86-64-v3 (AVX2 + FMA)
// and the baseline, and the loader picks the best for the running CPU (GCC function
// multiversioning): the build itself targets baseline x86-64, i.e. 4-wide SSE2, which leaves
// elementwise kernels instruction-bound. Put the attribute on the function that holds the loop:
// a lambda body is a separate function and would not be cloned.
// Not under TSan: the clones' IFUNC resolver runs while the dynamic loader relocates
// libstrata_core, before the TSan runtime is initialised, and its instrumented code crashes there
// (every TSan binary segfaulted at start-up). The baseline build of the same loops is checked.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(__SANITIZE_THREAD__)
#define STRATA_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define STRATA_SIMD_CLONES
#endif

namespace strata::cpu::vm {

// e^x: Cephes-style range reduction x = n ln2 + r, |r| <= ln2/2, a degree-6 polynomial for e^r,
// and 2^n assembled in the exponent bits. |x| is clamped to 88 in the integer domain: a float
// compare-and-select here gets jump-threaded into branches that -ftrapping-math then refuses to
// if-convert, which would stop the loop vectorising. Below about -87.6, n = -127 makes 2^n's bits
// zero, so the result flushes to exactly 0; above 88 it saturates at e^88 (callers pass x <= 0, or
// use it as 1 / (1 + e^x)).
inline float exp_approx(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  std::uint32_t mag = bits & 0x7fffffffu;
  const std::uint32_t mag88 = 0x42b00000u;  // bits of 88.0f (inf and NaN clamp to +-88 too)
  mag = mag < mag88 ? mag : mag88;
  const float xc = std::bit_cast<float>((bits & 0x80000000u) | mag);
  // n = round(x / ln2) with the 1.5 * 2^23 trick: the sum's low mantissa bits hold n.
  const float shifter = 12582912.0f;
  const float kn = xc * 1.44269504088896341f + shifter;
  const std::int32_t n = std::bit_cast<std::int32_t>(kn) - 0x4B400000;
  const float nf = kn - shifter;
  // r = x - n ln2 with ln2 split in two for an exact first product.
  float r = xc - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  const float two_n = std::bit_cast<float>((n + 127) << 23);
  return er * two_n;
}

// tanh(x) = 1 - 2 / (1 + e^(2x)); saturates to +-1 without overflow (exp_approx clamps).
inline float tanh_approx(float x) { return 1.0f - 2.0f / (1.0f + exp_approx(2.0f * x)); }

// 1 / (1 + e^-x), which is (1 + tanh(x / 2)) / 2: one exp and one division.
inline float sigmoid_approx(float x) { return 1.0f / (1.0f + exp_approx(-x)); }

// sqrt(x) for x >= 0 (x = 0 gives 0). std::sqrt keeps a scalar errno path without
// -fno-math-errno, which stops vectorisation; this is x * rsqrt(x), the rsqrt from the classic
// bit-level estimate (within 3.5%) refined by three Newton steps: relative error below 3e-7.
inline float sqrt_nonneg(float x) {
  // Raising x to FLT_MIN (an unsigned compare is a float compare for x >= 0) keeps rsqrt finite.
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t min_bits = 0x00800000u;  // FLT_MIN
  const float xs = std::bit_cast<float>(bits > min_bits ? bits : min_bits);
  float y = std::bit_cast<float>(0x5f375a86u - (std::bit_cast<std::uint32_t>(xs) >> 1));
  const float half = 0.5f * xs;
  y = y * (1.5f - half * y * y);  // relative error 3.5e-2 -> 1.8e-3
  y = y * (1.5f - half * y * y);  // -> 4.8e-6
  y = y * (1.5f - half * y * y);  // -> 1.8e-7 (fp32 rounding)
  return x * y;
}

// A signed integer key with the same order as the float (for non-NaN values), so that max
// reductions become vectorisable integer max reductions. key_to_float inverts it.
inline std::int32_t float_to_key(float x) {
  const std::int32_t i = std::bit_cast<std::int32_t>(x);
  return i ^ ((i >> 31) & 0x7fffffff);
}
inline float key_to_float(std::int32_t k) {
  return std::bit_cast<float>(k ^ ((k >> 31) & 0x7fffffff));
}

}  // namespace strata::cpu::vm
