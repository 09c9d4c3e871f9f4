// bf16 GEMMs of the CPU backend (--precision bf16), on oneDNN's matmul primitive: Debian's
// OpenBLAS has no bf16 GEMM, oneDNN picks AMX / AVX512-BF16 kernels where the CPU has them. On a
// CPU without AVX-512 (oneDNN 2.6 has no bf16 matmul there) the operands are widened to fp32 for
// OpenBLAS's SGEMM: exact products, fp32 accumulation, as oneDNN's.
// Without oneDNN (STRATA_WITH_ONEDNN=OFF) the module still builds: have_bf16_gemm() is false and
// gemm_bf16 throws. The conversions (round_to_bf16, widen_bf16) never need oneDNN.
#pragma once
#include <cstddef>
#include <string>

#include "strata/export.hpp"
#include "strata/types.hpp"

STRATA_EXPORT_BEGIN
namespace strata::cpu {

// True when this build has oneDNN (STRATA_HAVE_ONEDNN): the CPU backend can run bf16 GEMMs.
bool have_bf16_gemm();
// The implementation oneDNN picks for a bf16 GEMM on this CPU, e.g. "brg:avx512_core_amx_bf16"
// ("widened:..." where oneDNN has no bf16 matmul for this CPU, empty without oneDNN). For the run
// file / --version and the bench report.
std::string bf16_gemm_impl();
// True where oneDNN has no bf16 matmul for this CPU and bf16 GEMMs run widened on OpenBLAS (whose
// threads a bf16 run then keeps: set_one_thread_pool).
bool bf16_gemm_widened();
// The oneDNN library loaded at run time, "3.x.y (commit <hash>)" ("not built" without oneDNN).
std::string onednn_version();
// The best bf16 GEMM rate (FLOP/s, 1024^3, fp32 accumulation) on this process's threads: the CPU
// peak for the MFU of a bf16 run, as calibrate_sgemm_flops() is for fp32. Throws without oneDNN.
double calibrate_bf16_gemm_flops(double seconds_budget = 0.5);
// C[M,N] = op(A) @ op(B)  (accumulate: C += ...), with op(A) [M,K] and op(B) [K,N]. A and B are
// bf16, row-major: trans_a means A is stored [K,M], trans_b means B is stored [N,K]. C is f32 or
// bf16 (c_dtype), row-major [M,N]; products accumulate in fp32 (with a bf16 C and accumulate, C is
// read as fp32, added, rounded once). Primitives are created once per (shape, transposes, c dtype,
// accumulate, OpenMP thread count) and cached; safe to call from several threads. oneDNN runs on
// blas_threads() OpenMP threads. M, N or K of 0 is BLAS's empty product (C unchanged, or zeroed
// when K = 0 without accumulate). Throws strata::Error naming the call without oneDNN or for a bad
// shape / dtype.
// scratchpad: the caller's (e.g. a buffer in the memory ledger, sized by
// gemm_bf16_scratchpad_bytes); when null or too small, the calling thread's own is used.
struct GemmScratchpad {
  void* data = nullptr;
  std::size_t bytes = 0;
};
void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, const bf16* B,
               void* C, DType c_dtype, bool accumulate, GemmScratchpad scratchpad = {});
// Scratchpad bytes that call of gemm_bf16 needs on this thread count. It creates and caches the
// call's primitive (oneDNN JIT-compiles it): asked before a run, the run then compiles nothing.
// 0 without oneDNN.
std::size_t gemm_bf16_scratchpad_bytes(bool trans_a, bool trans_b, int M, int N, int K,
                                       DType c_dtype, bool accumulate);
// Primitives in gemm_bf16's cache (tests check that a repeated shape creates none).
std::size_t gemm_bf16_cached_primitives();
// out[i] = round-to-nearest-even bf16 of in[i] (NaN stays NaN), bit for bit strata::to_bf16,
// denormals included, vectorised (AVX-512 / AVX2 clones).
void round_to_bf16(bf16* out, const float* in, std::size_t n);
// out[i] = float(in[i])
void widen_bf16(float* out, const bf16* in, std::size_t n);

}  // namespace strata::cpu
STRATA_EXPORT_END
