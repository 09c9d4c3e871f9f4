// The CUDA emulator's PTX instructions (tests/cuda_emu): the few warp-level sm_80 instructions
// that strata's tensor-core kernels issue as inline assembly on a GPU (core/src/backends/cuda/
// ptx.cuh), with the register layouts the PTX ISA documents for them:
//
//   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32   mma_m16n8k16_bf16
//   ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16      ldmatrix_x4
//   cp.async.cg.shared.global [dst], [src], 16, src_bytes  cp_async_16
//
// Lane l is in group g = l / 4 with index t = l % 4 inside it. Registers hold two 16-bit
// elements, the lower-numbered one (the smaller column, or row for .trans) in the low half.
//   A (16 x 16, row-major), 4 registers: a0 = (g, 2t..2t+1), a1 = (g + 8, 2t..),
//     a2 = (g, 2t + 8..), a3 = (g + 8, 2t + 8..).
//   B (16 x 8, k x n), 2 registers: b0 = (k 2t..2t+1, n g), b1 = (k 2t + 8.., n g).
//   C, D (16 x 8 fp32), 4 registers: c0, c1 = (g, 2t), (g, 2t + 1); c2, c3 = the same at row g + 8.
//   ldmatrix x4: lanes 8 i .. 8 i + 7 give the addresses of rows 0..7 of matrix i (16 bytes each,
//     16-byte aligned, in shared memory); register i of lane l gets row g, elements 2t..2t+1 of
//     matrix i, or with .trans elements (2t, g) and (2t + 1, g) (row, column).
//
// Each call is warp-collective as on a GPU (all 32 lanes, or the emulator stops with a message).
// The mma adds in fp32 in the order c, k = 0..15 (bf16 products are exact in fp32); tensor cores
// add in another order, so results agree to fp32 rounding of a 16-term sum, not bit for bit.
// cp.async copies at once; its commit and wait are the kernel's business (a no-op here), and the
// block barrier after the wait is what makes the copy visible on a GPU and here alike.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

#include "cuda_emu/kernel.hpp"

namespace strata_emu {

namespace ptx_detail {

inline float low_bf16(std::uint32_t r) { return __bfloat162float({std::uint16_t(r & 0xffffu)}); }
inline float high_bf16(std::uint32_t r) { return __bfloat162float({std::uint16_t(r >> 16)}); }

inline void check_shared_row(const char* what, const void* p, std::size_t bytes) {
  if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0 || !in_dynamic_shared_memory(p, bytes))
    fatal_in_kernel(
        "%s: address %p is not 16-byte aligned inside the launch's dynamic shared memory", what, p);
}

}  // namespace ptx_detail

// d = a b + c (d may be c). Lane (g, t) computes rows g and g + 8 by columns 2t and 2t + 1: it
// widens those two rows of A and two columns of B once (element k of a row or column is half k % 2
// of one of the owning lanes' registers), then sums in the documented order.
inline void mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4],
                              const std::uint32_t (&b)[2], const float (&c)[4]) {
  const void* const operands[2] = {a, b};
  const void* const* lanes = warp_collective_begin("mma.sync.m16n8k16", operands);
  auto reg = [&](int lane, int operand, int r) {
    return static_cast<const std::uint32_t*>(
        static_cast<const void* const*>(lanes[lane])[operand])[r];
  };
  const int g = lane_id() / 4, t = lane_id() % 4;
  float rows[2][16], cols[2][16];  // A[g + 8 h][k], B[k][2 t + n]
  for (int j = 0; j < 8; ++j)      // k = 2 j, 2 j + 1: lane group's member j % 4, register j / 4
    for (int h = 0; h < 2; ++h) {
      const std::uint32_t ra = reg(g * 4 + j % 4, 0, h + 2 * (j / 4));
      const std::uint32_t rb = reg((2 * t + h) * 4 + j % 4, 1, j / 4);
      rows[h][2 * j] = ptx_detail::low_bf16(ra), rows[h][2 * j + 1] = ptx_detail::high_bf16(ra);
      cols[h][2 * j] = ptx_detail::low_bf16(rb), cols[h][2 * j + 1] = ptx_detail::high_bf16(rb);
    }
  float result[4];
  for (int i = 0; i < 4; ++i) {
    float sum = c[i];
    for (int k = 0; k < 16; ++k) sum += rows[i / 2][k] * cols[i % 2][k];
    result[i] = sum;
  }
  warp_collective_end();  // every lane has read the others' a and b
  for (int i = 0; i < 4; ++i) d[i] = result[i];
}

// r[i] = this lane's part of 8 x 8 matrix i, whose rows lanes 8 i .. 8 i + 7 name (`row`: this
// lane's row address); transposed with `trans`.
inline void ldmatrix_x4(std::uint32_t (&r)[4], const void* row, bool trans) {
  const char* what = trans ? "ldmatrix.x4.trans" : "ldmatrix.x4";
  ptx_detail::check_shared_row(what, row, 16);
  const void* const* lanes = warp_collective_begin(what, row);
  const int g = lane_id() / 4, t = lane_id() % 4;
  std::uint32_t result[4];
  for (int i = 0; i < 4; ++i) {
    std::uint16_t lo, hi;
    if (!trans) {
      const auto* elements = static_cast<const std::uint16_t*>(lanes[8 * i + g]);
      lo = elements[2 * t], hi = elements[2 * t + 1];
    } else {
      lo = static_cast<const std::uint16_t*>(lanes[8 * i + 2 * t])[g];
      hi = static_cast<const std::uint16_t*>(lanes[8 * i + 2 * t + 1])[g];
    }
    result[i] = std::uint32_t(lo) | std::uint32_t(hi) << 16;
  }
  warp_collective_end();  // every lane has read the rows before any of them is overwritten
  for (int i = 0; i < 4; ++i) r[i] = result[i];
}

// 16 bytes to shared memory: the first src_bytes (0 or 16) from global src, the rest zero.
inline void cp_async_16(void* dst, const void* src, int src_bytes) {
  ptx_detail::check_shared_row("cp.async", dst, 16);
  if (src_bytes != 0 && src_bytes != 16)
    fatal_in_kernel("cp.async: src_bytes %d (strata copies 0 or 16)", src_bytes);
  if (src_bytes != 0 && reinterpret_cast<std::uintptr_t>(src) % 16 != 0)
    fatal_in_kernel("cp.async: source %p is not 16-byte aligned", src);
  std::memset(dst, 0, 16);
  if (src_bytes) std::memcpy(dst, src, 16);
}

}  // namespace strata_emu
