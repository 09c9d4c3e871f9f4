// CudaKernels::matmul_bf16_forward (cuda/kernels.hpp): a linear layer's forward on bf16 operands
// as one cublasLtMatmul with the bias in its epilogue, then the GELU kernel where the layer has
// one. Host C++ (cuBLASLt's API only).
//
// Row-major out[N,OC] = inp[N,C] @ W[OC,C]^T is column-major D[OC,N] = op(A) B with A = W stored
// [C,OC] (ld C, transposed) and B = inp stored [C,N] (ld C): D's rows are the output channels, so
// the bias vector (one per row of D) is the layer's bias[OC]. D is fp32, or bf16 in a bf16 run
// (rounded once from the fp32 epilogue; the bias stays fp32).
//
// No GELU_AUX_BIAS epilogue: on an H100 (cuBLAS 13.1, 2026-11-27) GPT-2's FC layer ran at 192 us
// with it against 66 us for fc2's same FLOPs with a bias only; the GELU kernel on the bf16 output
// moves 4 bytes an element (about 30 us at that shape). It also makes the GELU see the bf16
// pre-activation the backward reads, as Megatron-Core's bias-GELU and llm.c's default do.
#include <cublasLt.h>

#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "backends/cuda/device.hpp"
#include "backends/cuda/kernels.hpp"

namespace strata::cuda {
// Named, not anonymous: CudaKernels::LtPlans (a member of a class with linkage) holds these.
namespace lt {

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

// What a plan depends on: the epilogue, the shape and the operands' alignments (the heuristic's
// minimums). The bias pointer is not: it is set on the plan's descriptor per call.
struct LtPlanKey {
  cublasLtEpilogue_t epilogue;
  int N, C, OC;
  bool bf16_d;  // D bf16, else fp32
  std::uint32_t align_weight, align_inp, align_d;
  auto operator<=>(const LtPlanKey&) const = default;
};

// The descriptors of D[OC,N] = epilogue(W^T-op inp) and the algorithm the heuristic chose.
struct LtPlan {
  explicit LtPlan(const LtPlanKey& k)
      : a(CUDA_R_16BF, k.C, k.OC, k.C),
        b(CUDA_R_16BF, k.C, k.N, k.C),
        cd(k.bf16_d ? CUDA_R_16BF : CUDA_R_32F, k.OC, k.N, k.OC) {
    desc.set(CUBLASLT_MATMUL_DESC_TRANSA, std::int32_t(CUBLAS_OP_T));
    desc.set(CUBLASLT_MATMUL_DESC_TRANSB, std::int32_t(CUBLAS_OP_N));
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, std::uint32_t(k.epilogue));
    if (k.epilogue == CUBLASLT_EPILOGUE_BIAS)
      desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, std::int32_t(CUDA_R_32F));
  }
  LtDesc desc;
  LtLayout a, b, cd;
  cublasLtMatmulAlgo_t algo{};
};

// The plan of `key`, or null where cuBLASLt has no algorithm for it.
std::unique_ptr<LtPlan> make_plan(const CudaContext& ctx, const LtPlanKey& key) {
  auto plan = std::make_unique<LtPlan>(key);
  LtPreference pref;
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, std::uint64_t(ctx.workspace_bytes));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_weight);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_inp);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d);
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(ctx.cublaslt, plan->desc.p, plan->a.p, plan->b.p, plan->cd.p,
                                     plan->cd.p, pref.p, 1, &heuristic, &found);
  // Not supported: also a configuration this cuBLASLt refuses as invalid (a bf16 D with an fp32
  // bias, say); the call then runs as its steps.
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE ||
      (st == CUBLAS_STATUS_SUCCESS && found == 0))
    return nullptr;
  STRATA_CUBLAS_CHECK(st);
  plan->algo = heuristic.algo;
  return plan;
}

}  // namespace lt

// Plans by key, made at a shape's first call: the heuristic and the descriptors cost host time
// at every call otherwise (each linear layer, each micro-batch), and a CUDA graph wants the same
// algorithm at every replay.
struct CudaKernels::LtPlans {
  std::map<lt::LtPlanKey, std::unique_ptr<lt::LtPlan>> plans;  // null: cuBLASLt has no algorithm
};
void CudaKernels::LtPlansDeleter::operator()(LtPlans* p) const { delete p; }

// D[OC,N] = epilogue(W^T-op inp); false, with nothing queued, where cuBLASLt has no algorithm
// for the configuration.
bool CudaKernels::lt_matmul(cublasLtEpilogue_t epilogue, ActView d, const void* inp,
                            const void* weight, const float* bias, int N, int C, int OC) {
  using namespace lt;
  if (!lt_plans_) lt_plans_.reset(new LtPlans);
  const LtPlanKey key{epilogue,
                      N,
                      C,
                      OC,
                      d.is_bf16(),
                      alignment_of(weight),
                      alignment_of(inp),
                      alignment_of(d.data)};
  auto it = lt_plans_->plans.find(key);
  if (it == lt_plans_->plans.end()) it = lt_plans_->plans.emplace(key, make_plan(ctx_, key)).first;
  LtPlan* plan = it->second.get();
  if (!plan) return false;
  if (bias) plan->desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias));
  const float alpha = 1.0f, beta = 0.0f;
  STRATA_CUBLAS_CHECK(cublasLtMatmul(ctx_.cublaslt, plan->desc.p, &alpha, weight, plan->a.p, inp,
                                     plan->b.p, &beta, d.data, plan->cd.p, d.data, plan->cd.p,
                                     &plan->algo, ctx_.workspace, ctx_.workspace_bytes,
                                     ctx_.stream));
  return true;
}

bool CudaKernels::fuses_bias(int N, int C, int OC, DType out) {
  using namespace lt;
  if (!lt_plans_) lt_plans_.reset(new LtPlans);
  const LtPlanKey key{CUBLASLT_EPILOGUE_BIAS, N, C, OC, out == DType::bf16, 256, 256, 256};
  auto it = lt_plans_->plans.find(key);
  if (it == lt_plans_->plans.end()) it = lt_plans_->plans.emplace(key, make_plan(ctx_, key)).first;
  return it->second != nullptr;
}

void CudaKernels::matmul_bf16_forward(ActView out, ActView gelu_out, const bf16* inp,
                                      const bf16* weight, const float* bias, int N, int C, int OC,
                                      void* scratchpad, std::size_t scratchpad_bytes, float* f32) {
  if (N < 0 || C < 0 || OC < 0)
    throw Error("matmul_bf16_forward: negative shape " + std::to_string(N) + "x" +
                std::to_string(C) + "x" + std::to_string(OC));
  if (gelu_out.data && gelu_out.dtype != out.dtype)
    throw Error("matmul_bf16_forward: the GELU's output and its input in different dtypes");
  if (N == 0 || OC == 0) return;
  const bool in_lt = C > 0 && lt_matmul(bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT,
                                        out, inp, weight, bias, N, C, OC);
  if (!in_lt)
    return matmul_bf16_forward_steps(out, gelu_out, inp, weight, bias, N, C, OC, scratchpad,
                                     scratchpad_bytes, f32);
  if (gelu_out.data) gelu_forward(gelu_out, out, std::int64_t(N) * OC);
}

}  // namespace strata::cuda
