// CUDA layer passes of the GPT-2 workload: the same free functions, argument order and shapes as
// cpu/layers.hpp (the reference they are tested against), on device pointers, with a CudaContext
// (stream + cuBLAS handle + cuBLAS workspace) as the first argument. Every call is asynchronous on
// ctx.stream.
//
// Every tensor is fp32, row-major, but the fused attentions' input qkv and output, which a bf16
// run keeps in bf16 (ActViews, backends/kernels.hpp: written rounded once, read as they are; read
// only where the signature's other pointers are const). Shapes in comments:
// B batch, T sequence, C channels (hidden), NH heads, hs = C / NH, V vocab, N = B*T rows.
// Convention: parameter gradients and input gradients ACCUMULATE (+=); callers zero them.
//
// These passes are fp32 only: GEMMs run in plain fp32 (CUBLAS_DEFAULT_MATH, no TF32), so results
// match the CPU path to fp32 reduction-order error. The bf16 GEMMs (cublasGemmEx, and cuBLASLt
// with bias and GELU epilogues) are CudaKernels' (cuda/kernels.hpp, matmul_lt.cpp).
//
// Plain C++ header (no CUDA syntax), so host-only sources and tests can include it.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backends/kernels.hpp"

namespace strata::cuda {

// The stream every pass of one rank runs on, the cuBLAS handle bound to it, a cuBLASLt handle
// (its matmuls name the stream per call) and a cuBLAS workspace owned here, shared by both (a
// fixed user workspace keeps cuBLAS from allocating during a step and makes the GEMMs capturable
// in a CUDA graph later; the two libraries' calls are ordered on the one stream). Non-copyable;
// owns everything it creates.
struct CudaContext {
  // Uses device `device` (cudaSetDevice) and creates a non-blocking stream on it.
  explicit CudaContext(int device = 0, std::size_t workspace_bytes = std::size_t(32) << 20);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  // Blocks until all work queued on `stream` has finished; throws on an asynchronous fault.
  void synchronize() const;

  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublaslt = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;

 private:
  void release() noexcept;
};

// out[B,T,C] = wte[tokens[b,t], :] + wpe[t, :]
void encoder_forward(const CudaContext& ctx, float* out, const std::int32_t* tokens,
                     const float* wte, const float* wpe, int B, int T, int C);
// dwte[V,C] += scatter(dout), dwpe[T,C] += sum_b dout
// (atomicAdd: the summation order of repeated tokens is not fixed run to run.)
void encoder_backward(const CudaContext& ctx, float* dwte, float* dwpe, const float* dout,
                      const std::int32_t* tokens, int B, int T, int C);

// out[N,C] = (inp - mean) * rstd * weight + bias, fp32 or bf16 (rounded once); saves mean[N],
// rstd[N]. inp, the residual stream, fp32 or bf16 (widened as read), here and in the backward.
void layernorm_forward(const CudaContext& ctx, ActView out, float* mean, float* rstd, ActView inp,
                       const float* weight, const float* bias, int N, int C);
// sum[N,C] = a + b (rounded once for a bf16 sum; sum may be a or b), then out, mean, rstd =
// layernorm_forward(sum as stored): a residual add and the next LayerNorm in one pass, the same
// values as the two calls.
void residual_layernorm_forward(const CudaContext& ctx, ActView sum, ActView out, float* mean,
                                float* rstd, const float* a, ActView b, const float* weight,
                                const float* bias, int N, int C);
void layernorm_backward(const CudaContext& ctx, float* dinp, float* dweight, float* dbias,
                        const float* dout, ActView inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C);

// out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC] (bias may be null). cuBLAS sgemm.
void matmul_forward(const CudaContext& ctx, float* out, const float* inp, const float* weight,
                    const float* bias, int N, int C, int OC);
// dinp[N,C] += dout @ weight; dweight[OC,C] += dout^T @ inp; dbias[OC] += sum_n dout (if non-null)
// Each of dinp, dweight, dbias may be null (not computed).
void matmul_backward(const CudaContext& ctx, float* dinp, float* dweight, float* dbias,
                     const float* dout, const float* inp, const float* weight, int N, int C,
                     int OC);

// Causal multi-head attention. qkv[B,T,3C] holds q | k | v, head h at columns h*hs.
// out[B,T,C] (fp32 only: a bf16 run keeps fp32 attention outputs for the shapes that come here,
// attention_writes_bf16); att[B,NH,T,T] saves the softmax probabilities for backward.
void attention_forward(const CudaContext& ctx, float* out, float* att, const float* qkv, int B,
                       int T, int C, int NH);
// dqkv[B,T,3C] +=; datt[B,NH,T,T] is scratch (overwritten).
void attention_backward(const CudaContext& ctx, float* dqkv, float* datt, const float* dout,
                        const float* qkv, const float* att, int B, int T, int C, int NH);

// The same attention fused, FlashAttention-2 style (cuda/attention.cu): online softmax over tiles
// of 32 keys, no T x T matrix in memory. Head size hs = C / NH <= 128; any B, T, NH (B * NH <=
// 65535). out[B,T,C]; lse[B,NH,T] = log sum_{j<=t} exp(q_t . k_j / sqrt(hs)), saved for backward.
void flash_attention_forward(const CudaContext& ctx, ActView out, float* lse, ActView qkv, int B,
                             int T, int C, int NH);
// dqkv[B,T,3C] +=, from dout[B,T,C], the forward's qkv[B,T,3C], out[B,T,C] and lse[B,NH,T] (the
// probabilities are recomputed). delta[B,NH,T] is scratch (overwritten with rowsum(dout * out) per
// head). Deterministic: no atomics.
void flash_attention_backward(const CudaContext& ctx, float* dqkv, float* delta, const float* dout,
                              ActView qkv, ActView out, const float* lse, int B, int T, int C,
                              int NH);

// Ring attention's blocks, as Kernels::attention_block_forward / _backward define them: the same
// flash kernels (cuda/attention.cu) on the rank's queries and one key-value block, masked by the
// tokens' positions, grouped-query heads, the block merged into o and lse by their log-sum-exps.
// Head size at most 128.
void attention_block_forward(const CudaContext& ctx, float* o, float* lse, ActView q, int q_stride,
                             ActView kv, int B, int Tq, int Tk, int NH, int KV, int hs,
                             TokenPositions qpos, TokenPositions kpos, bool first);
void attention_block_backward(const CudaContext& ctx, float* dq, int dq_stride, float* dkv,
                              const float* dout, ActView out, const float* lse, ActView q,
                              int q_stride, ActView kv, int B, int Tq, int Tk, int NH, int KV,
                              int hs, TokenPositions qpos, TokenPositions kpos);

// delta[B,NH,T] = rowsum(dout * out) per head: the first step of both flash backwards (their
// dS = P (dP - delta)), one warp per row (attention.cu).
void attention_delta(const CudaContext& ctx, float* delta, const float* dout, ActView out, int B,
                     int T, int C, int NH);

// The same attention on tensor cores (cuda/attention_tc.cu): mma.sync bf16 m16n8k16 with fp32
// accumulation, tiles of 64 queries x 64 keys. Q, K, V and dout are rounded to bf16 (to nearest
// even) as they are loaded, P and dS as the operands of the second GEMMs; softmax, lse, delta and
// every accumulator are fp32. Same shapes, state and += convention as flash_attention_*:
// out[B,T,C], lse[B,NH,T] (natural log); dqkv[B,T,3C] +=, delta[B,NH,T] scratch; deterministic.
// Whether the shape is one it runs: hs = C / NH a multiple of 16 and at most 128, B * NH <= 65535.
bool tc_attention_supported(int B, int C, int NH);
// Unsupported shapes throw strata::Error (naming the call), as flash_attention_forward does.
void tc_flash_attention_forward(const CudaContext& ctx, ActView out, float* lse, ActView qkv, int B,
                                int T, int C, int NH);
void tc_flash_attention_backward(const CudaContext& ctx, float* dqkv, float* delta,
                                 const float* dout, ActView qkv, ActView out, const float* lse,
                                 int B, int T, int C, int NH);
// Ring attention's blocks on the same tensor-core kernels, as attention_block_* above (a head
// size hs that tc_attention_supported(B, NH * hs, NH) takes).
void tc_attention_block_forward(const CudaContext& ctx, float* o, float* lse, ActView q,
                                int q_stride, ActView kv, int B, int Tq, int Tk, int NH, int KV,
                                int hs, TokenPositions qpos, TokenPositions kpos, bool first);
void tc_attention_block_backward(const CudaContext& ctx, float* dq, int dq_stride, float* dkv,
                                 const float* dout, ActView out, const float* lse, ActView q,
                                 int q_stride, ActView kv, int B, int Tq, int Tk, int NH, int KV,
                                 int hs, TokenPositions qpos, TokenPositions kpos);

// tanh-approximation GELU, elementwise over n; out and inp of one dtype, fp32 or bf16 (widened as
// read, rounded once as written; in place is allowed).
void gelu_forward(const CudaContext& ctx, ActView out, ActView inp, std::int64_t n);
// dinp[n] += gelu'(inp) * dout
void gelu_backward(const CudaContext& ctx, float* dinp, const float* inp, const float* dout,
                   std::int64_t n);

// out = a + b, elementwise; b and out fp32 or bf16 (out rounded once; it may be a or b).
void residual_forward(const CudaContext& ctx, ActView out, const float* a, ActView b,
                      std::int64_t n);

// The Llama block's layers, as cpu/layers.hpp defines them: RMSNorm (a warp per row; dweight
// summed per block in shared memory, then atomically), SwiGLU on the fused gate | up projection
// and the rotary position embedding from a table rope_table made on the host (the same cos and sin
// on every backend). Activations fp32 or bf16 (widened as read, rounded once as written).
void rmsnorm_forward(const CudaContext& ctx, ActView out, float* rstd, ActView inp,
                     const float* weight, int N, int C);
void rmsnorm_backward(const CudaContext& ctx, float* dinp, float* dweight, const float* dout,
                      ActView inp, const float* weight, const float* rstd, int N, int C);
void swiglu_forward(const CudaContext& ctx, ActView out, ActView gu, int N, int F);
void swiglu_backward(const CudaContext& ctx, float* dgu, ActView gu, const float* dout, int N,
                     int F);
void rope_forward(const CudaContext& ctx, ActView x, const float* table, int N, int T, int row0,
                  int heads, int hs, int row_stride);
void rope_backward(const CudaContext& ctx, float* dx, const float* table, int N, int T, int row0,
                   int heads, int hs, int row_stride);
// Grouped-query attention's K/V repeated to every query head (Kernels::repeat_kv_forward) and the
// backward's sums over each K/V head's query heads.
void repeat_kv_forward(const CudaContext& ctx, ActView out, ActView in, int N, int NH, int KV,
                       int hs);
void repeat_kv_backward(const CudaContext& ctx, float* din, const float* dout, int N, int NH,
                        int KV, int hs);

// The mixture-of-experts layer's pieces (moe.cu), as cpu/layers.hpp defines them; the
// load-balancing loss takes a scratch of B x E floats.
void router_topk_forward(const CudaContext& ctx, float* probs, std::int32_t* experts, float* gates,
                         const float* logits, int N, int E, int k);
void router_topk_backward(const CudaContext& ctx, float* dlogits, const float* probs,
                          const std::int32_t* experts, const float* gates, const float* dgates,
                          const float* dprobs, int N, int E, int k);
void moe_aux_loss_forward(const CudaContext& ctx, float* loss, float* scratch, const float* probs,
                          const std::int32_t* choices, int B, int T, int seq, int E, int k,
                          float coef);
void moe_aux_loss_backward(const CudaContext& ctx, float* dprobs, float* scratch,
                           const std::int32_t* choices, int B, int T, int seq, int E, int k,
                           float coef_scale);
// out and x of one dtype (fp32 or bf16), rows copied as they are.
void moe_gather(const CudaContext& ctx, ActView out, ActView x, const std::int32_t* token_of,
                int rows, int C);
void moe_gather_backward(const CudaContext& ctx, float* dx, const float* din,
                         const std::int32_t* row_of, int N, int k, int C);
void moe_combine(const CudaContext& ctx, float* y, const float* eout, const std::int32_t* row_of,
                 const float* gates, int N, int k, int C);
void moe_combine_backward(const CudaContext& ctx, float* deout, float* dgates, const float* dy,
                          const float* eout, const std::int32_t* row_of, const float* gates, int N,
                          int k, int C);

// probs[N,V] = softmax(logits); losses[N] = -log probs[n, targets[n]]. logits may alias probs.
void softmax_crossentropy_forward(const CudaContext& ctx, float* probs, float* losses,
                                  const float* logits, const std::int32_t* targets, int N, int V);
// dlogits[N,V] += (probs - onehot(targets)) * grad_scale
void crossentropy_softmax_backward(const CudaContext& ctx, float* dlogits, const float* probs,
                                   const std::int32_t* targets, float grad_scale, int N, int V);

// One AdamW update over n elements; decay is the weight decay (0 for no decay). t is 1-based.
void adamw_update(const CudaContext& ctx, float* params, const float* grads, float* m, float* v,
                  std::int64_t n, float lr, float beta1, float beta2, float eps, float decay, int t,
                  float grad_scale);

}  // namespace strata::cuda
