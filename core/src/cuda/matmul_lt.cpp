// CudaKernels::matmul_bf16_forward (cuda/kernels.hpp): a linear layer's forward on bf16 operands
// as one cublasLtMatmul, the bias and the GELU in its epilogue. Host C++ (cuBLASLt's API only).
//
// Row-major out[N,OC] = inp[N,C] @ W[OC,C]^T is column-major D[OC,N] = op(A) B with A = W stored
// [C,OC] (ld C, transposed) and B = inp stored [C,N] (ld C): D's rows are the output channels, so
// the bias vector (one per row of D) is the layer's bias[OC]. With GELU_AUX the epilogue writes
// GELU(x) to D (gelu_out) and x = acc + bias to the aux matrix (out, ld OC), which is what the
// backward's gelu_backward reads.
//
// cuBLASLt's GELU is the tanh approximation, as gelu_forward's, but its own code: on a GPU the
// values differ from the separate kernel's by a few fp32 ulp.
#include <cublasLt.h>

#include <cstdint>
#include <string>

#include "cuda/device.hpp"
#include "cuda/kernels.hpp"

namespace strata::cuda {
namespace {

// Owners of cuBLASLt's descriptors (host objects; destroying them after the matmul is queued is
// allowed).
struct LtLayout {
  cublasLtMatrixLayout_t p = nullptr;
  LtLayout(cudaDataType_t type, std::uint64_t rows, std::uint64_t cols, std::int64_t ld) {
    STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p, type, rows, cols, ld));
  }
  ~LtLayout() { cublasLtMatrixLayoutDestroy(p); }
  LtLayout(const LtLayout&) = delete;
  LtLayout& operator=(const LtLayout&) = delete;
};

struct LtDesc {
  cublasLtMatmulDesc_t p = nullptr;
  LtDesc() { STRATA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p, CUBLAS_COMPUTE_32F, CUDA_R_32F)); }
  ~LtDesc() { cublasLtMatmulDescDestroy(p); }
  LtDesc(const LtDesc&) = delete;
  LtDesc& operator=(const LtDesc&) = delete;
  template <class T>
  void set(cublasLtMatmulDescAttributes_t attr, const T& value) {
    STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p, attr, &value, sizeof value));
  }
};

struct LtPreference {
  cublasLtMatmulPreference_t p = nullptr;
  LtPreference() { STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&p)); }
  ~LtPreference() { cublasLtMatmulPreferenceDestroy(p); }
  LtPreference(const LtPreference&) = delete;
  LtPreference& operator=(const LtPreference&) = delete;
  template <class T>
  void set(cublasLtMatmulPreferenceAttributes_t attr, const T& value) {
    STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &value, sizeof value));
  }
};

// The largest power of two, up to the 256 bytes cuBLASLt assumes by default, dividing p's
// address: the activation plan's pieces are 64-byte aligned, so the heuristic must be told.
std::uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && address % a) a /= 2;
  return a;
}

// D[OC,N] (fp32) = epilogue(W^T-op inp); false, with nothing queued, where cuBLASLt has no
// algorithm for the configuration.
bool lt_matmul(const CudaContext& ctx, cublasLtEpilogue_t epilogue, float* d, float* aux,
               const void* inp, const void* weight, const float* bias, int N, int C, int OC) {
  LtDesc desc;
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, std::int32_t(CUBLAS_OP_T));
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, std::int32_t(CUBLAS_OP_N));
  desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, std::uint32_t(epilogue));
  if (bias) {
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias));
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, std::int32_t(CUDA_R_32F));
  }
  if (aux) {
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(aux));
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, std::int64_t(OC));
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, std::int32_t(CUDA_R_32F));
  }
  const LtLayout a(CUDA_R_16BF, C, OC, C), b(CUDA_R_16BF, C, N, C), cd(CUDA_R_32F, OC, N, OC);
  LtPreference pref;
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, std::uint64_t(ctx.workspace_bytes));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(weight));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(inp));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(d));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(d));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx.cublaslt, desc.p, a.p, b.p, cd.p,
                                                           cd.p, pref.p, 1, &heuristic, &found);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0))
    return false;
  STRATA_CUBLAS_CHECK(st);
  const float alpha = 1.0f, beta = 0.0f;
  STRATA_CUBLAS_CHECK(cublasLtMatmul(ctx.cublaslt, desc.p, &alpha, weight, a.p, inp, b.p, &beta, d,
                                     cd.p, d, cd.p, &heuristic.algo, ctx.workspace,
                                     ctx.workspace_bytes, ctx.stream));
  return true;
}

}  // namespace

void CudaKernels::matmul_bf16_forward(float* out, float* gelu_out, const bf16* inp,
                                      const bf16* weight, const float* bias, int N, int C, int OC,
                                      void* scratchpad, std::size_t scratchpad_bytes) {
  if (N < 0 || C < 0 || OC < 0)
    throw Error("matmul_bf16_forward: negative shape " + std::to_string(N) + "x" +
                std::to_string(C) + "x" + std::to_string(OC));
  if (N == 0 || OC == 0) return;
  // cuBLASLt wants the aux matrix's leading dimension (OC) a multiple of 8.
  const bool fused_gelu = gelu_out != nullptr && OC % 8 == 0;
  const cublasLtEpilogue_t epilogue =
      fused_gelu ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                 : (bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
  const bool done = C > 0 && lt_matmul(ctx_, epilogue, fused_gelu ? gelu_out : out,
                                       fused_gelu ? out : nullptr, inp, weight, bias, N, C, OC);
  if (!done) {
    gemm_bf16(false, true, N, OC, C, inp, weight, out, DType::f32, false, scratchpad,
              scratchpad_bytes);
    if (bias) add_bias(out, bias, std::size_t(N), OC);
  }
  if (gelu_out && !(done && fused_gelu)) gelu_forward(gelu_out, out, std::int64_t(N) * OC);
}

}  // namespace strata::cuda
