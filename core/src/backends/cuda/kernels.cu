// CudaKernels (cuda/kernels.hpp), part 1: the layer passes (cuda/layers.cuh), the bf16 GEMMs on
// cublasGemmEx, bf16 rounding and widening, zeroing and the device sum. The elementwise steps of
// the passes are in kernels_steps.cu.
#include <string>

#include "backends/cuda/bf16.cuh"
#include "backends/cuda/device.hpp"
#include "backends/cuda/grid.cuh"
#include "backends/cuda/kernels.hpp"
#include "backends/cuda/launch.cuh"
#if STRATA_HAVE_CUDNN
#include "backends/cuda/cudnn_attention.hpp"
#endif

namespace strata::cuda {
namespace {

__global__ void round_to_bf16_kernel(std::uint16_t* out, const float* in, std::size_t n) {
  STRATA_GRID_STRIDE(i, n) { out[i] = float_to_bf16(in[i]); }
}
__global__ void widen_bf16_kernel(float* out, const std::uint16_t* in, std::size_t n) {
  STRATA_GRID_STRIDE(i, n) { out[i] = bf16_to_float(in[i]); }
}
#if STRATA_HAVE_CUDNN
__global__ void add_widened_bf16_kernel(float* out, const std::uint16_t* in, std::size_t n) {
  STRATA_GRID_STRIDE(i, n) { out[i] += bf16_to_float(in[i]); }
}
#endif

}  // namespace

CudaKernels::CudaKernels(const CudaContext& ctx, AttentionKernel attention)
    : ctx_(ctx), attention_(attention) {
  if (attention == AttentionKernel::cudnn) make_cudnn_attention();
}
CudaKernels::~CudaKernels() = default;

// --- cuDNN's attention: where this build has it, else nothing to make or run.
#if STRATA_HAVE_CUDNN
void CudaKernels::make_cudnn_attention() { cudnn_.reset(new CudnnAttention(ctx_)); }
void CudaKernels::CudnnDeleter::operator()(CudnnAttention* p) const { delete p; }
std::size_t CudaKernels::library_bytes() const { return cudnn_ ? cudnn_->working_bytes() : 0; }

bool CudaKernels::cudnn_attention_forward(ActView out, float* att, ActView qkv, int B, int T, int C,
                                          int NH) {
  if (!cudnn_ || !cuda_cudnn_attention(C, NH)) return false;
  if (!out.is_bf16() || !qkv.is_bf16())
    throw Error("--attention cudnn: cuDNN's attention reads and writes bf16 activations",
                "run with --precision bf16");
  cudnn_->forward(out.half(), att, qkv.half(), {B, T, NH, C / NH});
  return true;
}

// dout rounded to bf16, cuDNN's bf16 gradient added into dqkv: the model's gradients are fp32.
bool CudaKernels::cudnn_attention_backward(float* dqkv, float* datt, const float* dout, ActView qkv,
                                           const float* att, ActView out, int B, int T, int C,
                                           int NH) {
  if (!cudnn_ || !cuda_cudnn_attention(C, NH)) return false;
  const std::size_t n = std::size_t(B) * T * C;
  bf16* staged = cudnn_->staging(4 * n);  // dout [B,T,C] | dqkv [B,T,3C]
  round_to_bf16(staged, dout, n);
  cudnn_->backward(staged + n, datt, staged, qkv.half(), out.half(), att, {B, T, NH, C / NH});
  STRATA_LAUNCH(add_widened_bf16_kernel, blocks_for(3 * n), kThreads, 0, ctx_.stream)
  (dqkv, reinterpret_cast<const std::uint16_t*>(staged + n), 3 * n);
  STRATA_CUDA_CHECK_LAUNCH();
  return true;
}
#else
void CudaKernels::make_cudnn_attention() {
  throw Error("--attention cudnn: this build's CUDA backend has no cuDNN",
              "configure with cuDNN 9.10 or newer found (CUDNN_HOME), or run with --attention own");
}
void CudaKernels::CudnnDeleter::operator()(CudnnAttention*) const {}  // never made
std::size_t CudaKernels::library_bytes() const { return 0; }
bool CudaKernels::cudnn_attention_forward(ActView, float*, ActView, int, int, int, int) {
  return false;
}
bool CudaKernels::cudnn_attention_backward(float*, float*, const float*, ActView, const float*,
                                           ActView, int, int, int, int) {
  return false;
}
#endif

// --- layer passes: cuda/layers.cuh on the context
void CudaKernels::encoder_forward(float* out, const std::int32_t* tokens, const float* wte,
                                  const float* wpe, int B, int T, int C) {
  cuda::encoder_forward(ctx_, out, tokens, wte, wpe, B, T, C);
}
void CudaKernels::encoder_backward(float* dwte, float* dwpe, const float* dout,
                                   const std::int32_t* tokens, int B, int T, int C) {
  cuda::encoder_backward(ctx_, dwte, dwpe, dout, tokens, B, T, C);
}
void CudaKernels::layernorm_forward(ActView out, float* mean, float* rstd, ActView inp,
                                    const float* weight, const float* bias, int N, int C) {
  cuda::layernorm_forward(ctx_, out, mean, rstd, inp, weight, bias, N, C);
}
void CudaKernels::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                     ActView inp, const float* weight, const float* mean,
                                     const float* rstd, int N, int C) {
  cuda::layernorm_backward(ctx_, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}
void CudaKernels::matmul_forward(float* out, const float* inp, const float* weight,
                                 const float* bias, int N, int C, int OC) {
  cuda::matmul_forward(ctx_, out, inp, weight, bias, N, C, OC);
}
void CudaKernels::matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, int N, int C, int OC) {
  cuda::matmul_backward(ctx_, dinp, dweight, dbias, dout, inp, weight, N, C, OC);
}
// The own tensor-core kernel (attention_tc.cu) where it was chosen and takes the shape; else the
// fp32 flash kernel (attention.cu) where it takes the shape; else the probabilities through cuBLAS
// (layers.cu). The two flash kernels keep the same state: att the log-sum-exp of each row
// [B,NH,T], datt the backward's row sums [B,NH,T] (attention_state_floats).
void CudaKernels::attention_forward(ActView out, float* att, ActView qkv, int B, int T, int C,
                                    int NH) {
  if ((out.is_bf16() || qkv.is_bf16()) && !attention_writes_bf16(Device::cuda, B, C, NH))
    throw Error(
        "CudaKernels::attention_forward: bf16 activations for a shape only the cuBLAS "
        "path takes (head size " +
        std::to_string(C / NH) + ")");
  if (cudnn_attention_forward(out, att, qkv, B, T, C, NH)) return;
  if (attention_ == AttentionKernel::own && tc_attention_supported(B, C, NH))
    cuda::tc_flash_attention_forward(ctx_, out, att, qkv, B, T, C, NH);
  else if (cuda_fused_attention(B, C, NH))
    cuda::flash_attention_forward(ctx_, out, att, qkv, B, T, C, NH);
  else
    cuda::attention_forward(ctx_, out.f32(), att, qkv.f32(), B, T, C, NH);
}
void CudaKernels::attention_backward(float* dqkv, float* datt, const float* dout, ActView qkv,
                                     const float* att, ActView out, int B, int T, int C, int NH) {
  if (cudnn_attention_backward(dqkv, datt, dout, qkv, att, out, B, T, C, NH)) return;
  if (attention_ == AttentionKernel::own && tc_attention_supported(B, C, NH))
    cuda::tc_flash_attention_backward(ctx_, dqkv, datt, dout, qkv, out, att, B, T, C, NH);
  else if (cuda_fused_attention(B, C, NH))
    cuda::flash_attention_backward(ctx_, dqkv, datt, dout, qkv, out, att, B, T, C, NH);
  else
    cuda::attention_backward(ctx_, dqkv, datt, dout, qkv.f32(), att, B, T, C, NH);
}
void CudaKernels::gelu_forward(ActView out, ActView inp, std::int64_t n) {
  if (out.dtype != inp.dtype) throw Error("gelu_forward: the output and input in different dtypes");
  cuda::gelu_forward(ctx_, out, inp, n);
}
void CudaKernels::gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) {
  cuda::gelu_backward(ctx_, dinp, inp, dout, n);
}
void CudaKernels::residual_forward(ActView out, const float* a, ActView b, std::int64_t n) {
  cuda::residual_forward(ctx_, out, a, b, n);
}
void CudaKernels::residual_layernorm_forward(ActView sum, ActView out, float* mean, float* rstd,
                                             const float* a, ActView b, const float* weight,
                                             const float* bias, int N, int C) {
  cuda::residual_layernorm_forward(ctx_, sum, out, mean, rstd, a, b, weight, bias, N, C);
}
void CudaKernels::rmsnorm_forward(ActView out, float* rstd, ActView inp, const float* weight, int N,
                                  int C) {
  cuda::rmsnorm_forward(ctx_, out, rstd, inp, weight, N, C);
}
void CudaKernels::rmsnorm_backward(float* dinp, float* dweight, const float* dout, ActView inp,
                                   const float* weight, const float* rstd, int N, int C) {
  cuda::rmsnorm_backward(ctx_, dinp, dweight, dout, inp, weight, rstd, N, C);
}
void CudaKernels::swiglu_forward(ActView out, ActView gu, int N, int F) {
  cuda::swiglu_forward(ctx_, out, gu, N, F);
}
void CudaKernels::swiglu_backward(float* dgu, ActView gu, const float* dout, int N, int F) {
  cuda::swiglu_backward(ctx_, dgu, gu, dout, N, F);
}
void CudaKernels::rope_forward(ActView x, const float* table, int N, int T, int row0, int heads,
                               int hs, int row_stride) {
  cuda::rope_forward(ctx_, x, table, N, T, row0, heads, hs, row_stride);
}
void CudaKernels::rope_backward(float* dx, const float* table, int N, int T, int row0, int heads,
                                int hs, int row_stride) {
  cuda::rope_backward(ctx_, dx, table, N, T, row0, heads, hs, row_stride);
}
void CudaKernels::repeat_kv_forward(ActView out, ActView in, int N, int NH, int KV, int hs) {
  cuda::repeat_kv_forward(ctx_, out, in, N, NH, KV, hs);
}
void CudaKernels::repeat_kv_backward(float* din, const float* dout, int N, int NH, int KV, int hs) {
  cuda::repeat_kv_backward(ctx_, din, dout, N, NH, KV, hs);
}
void CudaKernels::router_topk_forward(float* probs, std::int32_t* experts, float* gates,
                                      const float* logits, int N, int E, int k) {
  cuda::router_topk_forward(ctx_, probs, experts, gates, logits, N, E, k);
}
void CudaKernels::router_topk_backward(float* dlogits, const float* probs,
                                       const std::int32_t* experts, const float* gates,
                                       const float* dgates, const float* dprobs, int N, int E,
                                       int k) {
  cuda::router_topk_backward(ctx_, dlogits, probs, experts, gates, dgates, dprobs, N, E, k);
}
void CudaKernels::moe_aux_loss_forward(float* loss, float* scratch, const float* probs,
                                       const std::int32_t* choices, int B, int T, int seq, int E,
                                       int k, float coef) {
  cuda::moe_aux_loss_forward(ctx_, loss, scratch, probs, choices, B, T, seq, E, k, coef);
}
void CudaKernels::moe_aux_loss_backward(float* dprobs, float* scratch, const std::int32_t* choices,
                                        int B, int T, int seq, int E, int k, float coef_scale) {
  cuda::moe_aux_loss_backward(ctx_, dprobs, scratch, choices, B, T, seq, E, k, coef_scale);
}
// Ring attention's blocks on the kernels the whole sequence takes: the tensor-core ones where
// they were chosen and take the head size, else the fp32 flash ones. Under cudnn too the
// tensor-core ones: cuDNN's graph has no mask by the tokens' positions.
void CudaKernels::attention_block_forward(float* o, float* lse, ActView q, int q_stride, ActView kv,
                                          int B, int Tq, int Tk, int NH, int KV, int hs,
                                          TokenPositions qpos, TokenPositions kpos, bool first) {
  if (attention_ != AttentionKernel::reference && tc_attention_supported(B, NH * hs, NH))
    cuda::tc_attention_block_forward(ctx_, o, lse, q, q_stride, kv, B, Tq, Tk, NH, KV, hs, qpos,
                                     kpos, first);
  else
    cuda::attention_block_forward(ctx_, o, lse, q, q_stride, kv, B, Tq, Tk, NH, KV, hs, qpos, kpos,
                                  first);
}
void CudaKernels::attention_block_backward(float* dq, int dq_stride, float* dkv, const float* dout,
                                           ActView out, const float* lse, ActView q, int q_stride,
                                           ActView kv, int B, int Tq, int Tk, int NH, int KV,
                                           int hs, TokenPositions qpos, TokenPositions kpos) {
  if (attention_ != AttentionKernel::reference && tc_attention_supported(B, NH * hs, NH))
    cuda::tc_attention_block_backward(ctx_, dq, dq_stride, dkv, dout, out, lse, q, q_stride, kv, B,
                                      Tq, Tk, NH, KV, hs, qpos, kpos);
  else
    cuda::attention_block_backward(ctx_, dq, dq_stride, dkv, dout, out, lse, q, q_stride, kv, B, Tq,
                                   Tk, NH, KV, hs, qpos, kpos);
}
void CudaKernels::moe_gather(ActView out, ActView x, const std::int32_t* token_of, int rows,
                             int C) {
  cuda::moe_gather(ctx_, out, x, token_of, rows, C);
}
void CudaKernels::moe_gather_backward(float* dx, const float* din, const std::int32_t* row_of,
                                      int N, int k, int C) {
  cuda::moe_gather_backward(ctx_, dx, din, row_of, N, k, C);
}
void CudaKernels::moe_combine(float* y, const float* eout, const std::int32_t* row_of,
                              const float* gates, int N, int k, int C) {
  cuda::moe_combine(ctx_, y, eout, row_of, gates, N, k, C);
}
void CudaKernels::moe_combine_backward(float* deout, float* dgates, const float* dy,
                                       const float* eout, const std::int32_t* row_of,
                                       const float* gates, int N, int k, int C) {
  cuda::moe_combine_backward(ctx_, deout, dgates, dy, eout, row_of, gates, N, k, C);
}
void CudaKernels::softmax_crossentropy_forward(float* probs, float* losses, const float* logits,
                                               const std::int32_t* targets, int N, int V) {
  cuda::softmax_crossentropy_forward(ctx_, probs, losses, logits, targets, N, V);
}
void CudaKernels::crossentropy_softmax_backward(float* dlogits, const float* probs,
                                                const std::int32_t* targets, float grad_scale,
                                                int N, int V) {
  cuda::crossentropy_softmax_backward(ctx_, dlogits, probs, targets, grad_scale, N, V);
}

// --- bf16
void CudaKernels::round_to_bf16(bf16* out, const float* in, std::size_t n) {
  if (n == 0) return;
  STRATA_LAUNCH(round_to_bf16_kernel, blocks_for(n), kThreads, 0, ctx_.stream)
  (reinterpret_cast<std::uint16_t*>(out), in, n);
  STRATA_CUDA_CHECK_LAUNCH();
}
void CudaKernels::widen_bf16(float* out, const bf16* in, std::size_t n) {
  if (n == 0) return;
  STRATA_LAUNCH(widen_bf16_kernel, blocks_for(n), kThreads, 0, ctx_.stream)
  (out, reinterpret_cast<const std::uint16_t*>(in), n);
  STRATA_CUDA_CHECK_LAUNCH();
}

// Row-major C[M,N] = op(A) op(B) is column-major C^T[N,M] = op(B)^T op(A)^T: cuBLAS's A is our B
// (stored [K,N], ld N; or [N,K], ld K when transposed) and its B is our A (ld K, or M).
void CudaKernels::gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A,
                            const bf16* B, void* C, DType c_dtype, bool accumulate,
                            void* /*scratchpad*/, std::size_t /*scratchpad_bytes*/) {
  if (c_dtype != DType::f32 && c_dtype != DType::bf16)
    throw Error(
        std::string("gemm_bf16: C of dtype ") + dtype_name(c_dtype) + " on the cuda backend",
        "fp32 or bf16 C");
  if (M < 0 || N < 0 || K < 0)
    throw Error("gemm_bf16: negative shape " + std::to_string(M) + "x" + std::to_string(N) + "x" +
                std::to_string(K));
  if (M == 0 || N == 0) return;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  STRATA_CUBLAS_CHECK(cublasGemmEx(ctx_.cublas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B,
                                   CUDA_R_16BF, trans_b ? K : N, A, CUDA_R_16BF, trans_a ? M : K,
                                   &beta, C, c_dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F, N,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
std::size_t CudaKernels::gemm_bf16_scratchpad_bytes(bool, bool, int, int, int, DType, bool) {
  return 0;
}

void CudaKernels::zero(float* p, std::size_t n) {
  if (n) STRATA_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), ctx_.stream));
}

double CudaKernels::sum(const float* x, std::size_t n) {
  return sum_(ctx_.stream, x, false, n, false);
}

}  // namespace strata::cuda
