// The warp-level sm_80 instructions of the tensor-core attention, one function each: inline PTX
// under nvcc, the CUDA emulator's model of the same instruction otherwise (tests/cuda_emu/include/
// cuda_emu/ptx.hpp, which also states the register layouts these functions exchange).
//
//   mma_bf16_16816(d, a, b)      d += a b: A 16 x 16 bf16 (4 registers), B 16 x 8 (2),
//                                D 16 x 8 fp32 (4)
//   ldmatrix_x4(r, row)          four 8 x 8 bf16 matrices from shared memory (lane l: a row of
//   ldmatrix_x4_trans(r, row)    matrix l / 8), as A / B fragments, or transposed
//   cp_async_16(dst, src, full)  16 bytes global -> shared without registers; zeros if !full
//   cp_async_commit() / cp_async_wait_all()
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#if defined(STRATA_CUDA_EMULATOR)
#include "cuda_emu/ptx.hpp"
#endif

namespace strata::cuda {

#if !defined(STRATA_CUDA_EMULATOR) && defined(__CUDA_ARCH__)
__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
#endif

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const std::uint32_t (&a)[4],
                                               const std::uint32_t (&b)[2]) {
#if defined(STRATA_CUDA_EMULATOR)
  strata_emu::mma_m16n8k16_bf16(d, a, b, d);
#elif defined(__CUDA_ARCH__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Four 8 x 8 matrices, transposed with kTranspose (ldmatrix_x4_trans).
template <bool kTranspose>
__device__ __forceinline__ void ldmatrix_x4_of(std::uint32_t (&r)[4], const void* row) {
#if defined(STRATA_CUDA_EMULATOR)
  strata_emu::ldmatrix_x4(r, row, kTranspose);
#elif defined(__CUDA_ARCH__)
  if constexpr (kTranspose)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row))
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row))
                 : "memory");
#endif
}
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* row) {
  ldmatrix_x4_of<false>(r, row);
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row) {
  ldmatrix_x4_of<true>(r, row);
}

// 16 bytes from src (global, 16-byte aligned) to dst (shared), or 16 zeros where !full (src is
// then not read, but must still be a valid address: pass the tensor's base).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool full) {
#if defined(STRATA_CUDA_EMULATOR)
  strata_emu::cp_async_16(dst, src, full ? 16 : 0);
#elif defined(__CUDA_ARCH__)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(full ? 16 : 0)
               : "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if !defined(STRATA_CUDA_EMULATOR) && defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits for every cp.async this thread issued; a __syncthreads after it makes all threads' copies
// visible to the block.
__device__ __forceinline__ void cp_async_wait_all() {
#if !defined(STRATA_CUDA_EMULATOR) && defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

}  // namespace strata::cuda
