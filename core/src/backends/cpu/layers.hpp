// CPU layer passes of the GPT-2 workload: one function per layer pass, llm.c style.
// Every tensor is fp32, row-major. Shapes in comments: B batch, T sequence, C channels (hidden),
// NH heads, hs = C / NH, V vocab, N = B*T rows.
// Convention: parameter gradients and input gradients ACCUMULATE (+=); callers zero them.
// The CUDA backend implements the same signatures.
#pragma once
#include <cstdint>

#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata::cpu {

// out[B,T,C] = wte[tokens[b,t], :] + wpe[t, :]
void encoder_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                     int B, int T, int C);
// dwte[V,C] += scatter(dout), dwpe[T,C] += sum_b dout
void encoder_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                      int B, int T, int C);

// out[N,C] = (inp - mean) * rstd * weight + bias; saves mean[N], rstd[N]
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);

// out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC] (bias may be null). BLAS sgemm.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC);
// dinp[N,C] += dout @ weight; dweight[OC,C] += dout^T @ inp; dbias[OC] += sum_n dout (if non-null)
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC);

// Causal multi-head attention. qkv[B,T,3C] holds q | k | v, head h at columns h*hs.
// out[B,T,C]; att[B,NH,T,T] saves the softmax probabilities for backward.
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
// dqkv[B,T,3C] +=; datt[B,NH,T,T] is scratch (overwritten).
void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH);

// Ring attention's blocks (Kernels::attention_block_forward / _backward): queries q [B, Tq] (rows
// of q_stride floats, NH heads of hs from column 0) on keys and values kv [B, Tk, 2, KV, hs] at
// positions qpos[Tq] and kpos[Tk] (a key seen where kpos <= qpos), merged into o [B, Tq, NH hs]
// and lse [B, NH, Tq] (overwritten when first); the backward adds to dq (rows of dq_stride) and
// dkv [B, Tk, 2, KV, hs] from dout and out [B, Tq, NH hs] and lse.
void attention_block_forward(float* o, float* lse, const float* q, int q_stride, const float* kv,
                             int B, int Tq, int Tk, int NH, int KV, int hs, const int* qpos,
                             const int* kpos, bool first);
void attention_block_backward(float* dq, int dq_stride, float* dkv, const float* dout,
                              const float* out, const float* lse, const float* q, int q_stride,
                              const float* kv, int B, int Tq, int Tk, int NH, int KV, int hs,
                              const int* qpos, const int* kpos);

// Row-major C[M,N] = op(A)[M,K] @ op(B)[K,N] (+= C when accumulate), leading dimensions lda, ldb,
// ldc, BLAS sgemm in blocks of rows as the layers' GEMMs; trans_a: A is stored [K,M], trans_b: B
// is stored [N,K]. The fp32 GEMM under a bf16 GEMM that oneDNN cannot run on this CPU.
void gemm_f32(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
              const float* B, int ldb, float* C, int ldc, bool accumulate);

// tanh-approximation GELU, elementwise over n.
void gelu_forward(float* out, const float* inp, std::int64_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n);

// out = a + b, elementwise.
void residual_forward(float* out, const float* a, const float* b, std::int64_t n);

// --- The Llama block's layers (torchtitan's and Meta's definitions), for --arch llama.
// RMSNorm (eps 1e-5): out[N,C] = inp * rstd * weight with rstd[N] = 1 / sqrt(mean(inp^2) + eps).
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C);
// SwiGLU on the fused gate | up projection gu[N,2F] (each row: F gate columns, then F up):
// out[N,F] = silu(gate) * up, silu(x) = x * sigmoid(x); its backward dgu[N,2F] +=
// (dout * up * silu'(gate) | dout * silu(gate)).
void swiglu_forward(float* out, const float* gu, int N, int F);
void swiglu_backward(float* dgu, const float* gu, const float* dout, int N, int F);
// Rotary position embedding: in each head of hs columns the pairs (2i, 2i+1) turn by the angle
// pos * theta^(-2i/hs) (Meta's Llama, torchtitan). table[T, hs/2, 2] holds (cos, sin) of every
// position and pair, computed once in double and rounded (rope_table), so every backend turns by
// the same values. x[N, row_stride]: `heads` heads of hs columns from column 0 of each row, row n
// at position (row0 + n) % T; turned in place. The backward turns a gradient back (the inverse
// rotation), in place.
void rope_table(float* table, int T, int hs, double theta);
void rope_forward(float* x, const float* table, int N, int T, int row0, int heads, int hs,
                  int row_stride);
void rope_backward(float* dx, const float* table, int N, int T, int row0, int heads, int hs,
                   int row_stride);

// Grouped-query attention: in[N, (NH + 2 KV) hs] (q | k | v, KV K/V heads) -> out[N, 3 NH hs]
// with query head h reading K/V head h / (NH / KV) (Llama's repeat_kv). The backward (=): din's q
// is dout's, each K/V head the sum of its NH / KV query heads' gradients in head order.
void repeat_kv_forward(float* out, const float* in, int N, int NH, int KV, int hs);
void repeat_kv_backward(float* din, const float* dout, int N, int NH, int KV, int hs);

// --- The mixture-of-experts layer's pieces (--arch moe; not yet wired into the model).
// Top-k softmax routing (Mixtral's): probs[N,E] = softmax(logits) over all E experts (the
// load-balancing loss reads them); experts[N,k] the k largest logits, largest first (a tie: the
// lower index first); gates[N,k] the softmax of those k logits (probs renormalised over them).
void router_topk_forward(float* probs, std::int32_t* experts, float* gates, const float* logits,
                         int N, int E, int k);
// dlogits[N,E] (=): d(gates) through the k-way softmax, gate_j (dgate_j - sum_i gate_i dgate_i) at
// expert experts[n,j], plus d(probs) (null: none) through the full softmax, probs (dp - <probs,
// dp>).
void router_topk_backward(float* dlogits, const float* probs, const std::int32_t* experts,
                          const float* gates, const float* dgates, const float* dprobs, int N,
                          int E, int k);
// The sequence-wise load-balancing loss (DeepSeek-V3's; Switch Transformer's form, per sequence so
// that it does not depend on how sequences are split over micro-batches and ranks): for each of B
// sequences of `seq` tokens, loss[b] = coef * sum_e f[b,e] P[b,e] with f[b,e] = E / (k seq) x the
// sequence's routing choices of expert e (choices[B,E], counted over the whole sequence), P[b,e]
// the mean of probs[:, e] over it. This rank holds T of each sequence's tokens (seq / cp under
// context parallelism) and adds P over those: its loss[b] is its share, the cp ranks' sum the
// sequence's. The backward writes dprobs[B T,E] (=) = scale * coef * f[b,e] / seq (f does not
// depend on the probabilities).
void moe_aux_loss_forward(float* loss, const float* probs, const std::int32_t* choices, int B,
                          int T, int seq, int E, int k, float coef);
void moe_aux_loss_backward(float* dprobs, const std::int32_t* choices, int B, int T, int seq, int E,
                           int k, float coef_scale);
// Dispatch and combine over a plan (model/moe_dispatch.hpp): row_of[N,k] the row of token n's
// j-th choice in the experts' input (-1: dropped), token_of[rows] the token of each row.
//   gather            out[r, :] = x[token_of[r], :]
//   gather_backward   dx[n, :] += sum_j din[row_of[n,j], :] over kept choices, in choice order
//   combine           y[n, :] = sum_j gates[n,j] eout[row_of[n,j], :] over kept choices (=)
//   combine_backward  deout[row_of[n,j], :] = gates[n,j] dy[n, :] (=); dgates[n,j] = <dy[n, :],
//                     eout[row_of[n,j], :]>, 0 when dropped (=)
void moe_gather(float* out, const float* x, const std::int32_t* token_of, int rows, int C);
void moe_gather_backward(float* dx, const float* din, const std::int32_t* row_of, int N, int k,
                         int C);
void moe_combine(float* y, const float* eout, const std::int32_t* row_of, const float* gates, int N,
                 int k, int C);
void moe_combine_backward(float* deout, float* dgates, const float* dy, const float* eout,
                          const std::int32_t* row_of, const float* gates, int N, int k, int C);

// probs[N,V] = softmax(logits); losses[N] = -log probs[n, targets[n]]. logits may alias probs.
void softmax_crossentropy_forward(float* probs, float* losses, const float* logits,
                                  const std::int32_t* targets, int N, int V);
// dlogits[N,V] += (probs - onehot(targets)) * grad_scale
void crossentropy_softmax_backward(float* dlogits, const float* probs, const std::int32_t* targets,
                                   float grad_scale, int N, int V);

// One AdamW update over n elements; decay is the weight decay (0 for no decay). t is 1-based.
void adamw_update(float* params, const float* grads, float* m, float* v, std::int64_t n, float lr,
                  float beta1, float beta2, float eps, float decay, int t, float grad_scale);

// The best SGEMM rate (FLOP/s) this process reaches on its BLAS threads: the CPU peak for MFU.
double calibrate_sgemm_flops(double seconds_budget = 0.5);

// GEMMs of the largest block the layers issue, on the BLAS threads in use: afterwards BLAS's
// packing buffers are as resident as training will make them (see kGemmBlock in layers.cpp).
void warm_up_gemm();

// Compute threads per rank (BLAS and OpenMP, oneDNN included), and a setter used at start-up.
int blas_threads();
void set_blas_threads(int n);
// One thread pool (bf16 runs): their GEMMs run on oneDNN's OpenMP threads, and OpenBLAS's own
// pthreads, spinning between calls, would fight those for the cores (measured: 2-3x slower steps
// on 2 cores). On: OpenBLAS runs single-threaded and the fp32 GEMMs left (attention's, per head)
// run in parallel over heads on the OpenMP threads. Off (default): OpenBLAS uses all threads.
void set_one_thread_pool(bool on);
bool one_thread_pool();

}  // namespace strata::cpu
STRATA_EXPORT_END
