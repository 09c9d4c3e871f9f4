// The compute of the model's passes (model_passes.cpp), one function per layer pass or
// elementwise step, on the memory of one device. The passes hold the order, the shapes and the
// tensor-parallel collectives; a backend supplies these kernels: the CPU backend
// (cpu/cpu_kernels.cpp, on cpu/layers.hpp and cpu/gemm_bf16.hpp) and, on a GPU, the CUDA one.
// Every pointer is the backend's memory; shapes as in cpu/layers.hpp (B batch, T sequence, C
// channels, N = B*T rows); gradients and input gradients ACCUMULATE (+=) unless noted.
#pragma once
#include <cstddef>
#include <cstdint>

#include "strata/export.hpp"
#include "strata/types.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

// Rows per chunk of Kernels::bias_grad's summation order.
constexpr std::size_t kBiasGradRows = 64;

// An activation tensor a kernel reads or writes: fp32, or bf16 where a bf16 run keeps it in bf16
// (the residual stream and the GEMMs' inputs and outputs), so that the GEMMs, the attention and
// the LayerNorms read them as they are, forward and backward.
struct ActView {
  void* data = nullptr;
  DType dtype = DType::f32;
  ActView() = default;
  ActView(float* p) : data(p) {}                     // NOLINT: an fp32 tensor is an fp32 view
  ActView(bf16* p) : data(p), dtype(DType::bf16) {}  // NOLINT
  float* f32() const { return static_cast<float*>(data); }
  bf16* half() const { return static_cast<bf16*>(data); }
  bool is_bf16() const { return dtype == DType::bf16; }
};

// The sequence positions of a context-parallel rank's T tokens (strata::cp_position): token t at
// first + t for t < chunk, else at second + t - chunk (contiguous tokens from p: {p, p + T, T}).
struct TokenPositions {
  int first, second, chunk;
  int operator()(int t) const { return t < chunk ? first + t : second + t - chunk; }
};

class Kernels {
 public:
  virtual ~Kernels() = default;

  // --- layer passes (cpu/layers.hpp has the reference semantics of each)
  virtual void encoder_forward(float* out, const std::int32_t* tokens, const float* wte,
                               const float* wpe, int B, int T, int C) = 0;
  virtual void encoder_backward(float* dwte, float* dwpe, const float* dout,
                                const std::int32_t* tokens, int B, int T, int C) = 0;
  // out in fp32 or bf16 (the fp32 values rounded once); inp, the residual stream, fp32 or bf16
  // (a bf16 run's: widened as read), here and in the backward.
  virtual void layernorm_forward(ActView out, float* mean, float* rstd, ActView inp,
                                 const float* weight, const float* bias, int N, int C) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  ActView inp, const float* weight, const float* mean,
                                  const float* rstd, int N, int C) = 0;
  virtual void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                              int N, int C, int OC) = 0;
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, int N, int C, int OC) = 0;
  // att [B,NH,T,T] is the backend's to keep for the backward: the CPU keeps the probabilities
  // there, the CUDA backend's fused attention only a log-sum-exp per row. `out` of the backward is
  // the forward's output; datt [B,NH,T,T] is scratch. qkv (read only) and out in bf16 where
  // attention_writes_bf16 says so (out: the fp32 values rounded once; qkv: widened as read).
  virtual void attention_forward(ActView out, float* att, ActView qkv, int B, int T, int C,
                                 int NH) = 0;
  virtual void attention_backward(float* dqkv, float* datt, const float* dout, ActView qkv,
                                  const float* att, ActView out, int B, int T, int C, int NH) = 0;
  // Ring attention's blocks (context parallelism; the merge is flash attention's online softmax).
  // The causal attention of queries q [B, Tq] (rows of q_stride elements, NH heads of hs from
  // column 0) on one block of keys and values kv [B, Tk, 2, KV, hs] (k | v) at their sequence
  // positions: a key is seen where its position <= the query's, query head h reads K/V head
  // h / (NH / KV), scores scaled by 1 / sqrt(hs). Merged into the running output o [B, Tq, NH hs]
  // (fp32, normalised) and log-sum-exp lse [B, NH, Tq]; `first` overwrites them instead (its block
  // must give every query a key). q and kv of one dtype, fp32 or bf16 (widened as read).
  virtual void attention_block_forward(float* o, float* lse, ActView q, int q_stride, ActView kv,
                                       int B, int Tq, int Tk, int NH, int KV, int hs,
                                       TokenPositions qpos, TokenPositions kpos, bool first) = 0;
  // Its backward for one block, given the merged output `out` [B, Tq, NH hs] (fp32 or bf16) and
  // lse: dq (rows of dq_stride, +=) and dkv [B, Tk, 2, KV, hs] (+=) from dout [B, Tq, NH hs].
  virtual void attention_block_backward(float* dq, int dq_stride, float* dkv, const float* dout,
                                        ActView out, const float* lse, ActView q, int q_stride,
                                        ActView kv, int B, int Tq, int Tk, int NH, int KV, int hs,
                                        TokenPositions qpos, TokenPositions kpos) = 0;
  // out = GELU(inp) (the tanh approximation), out and inp of one dtype, fp32 or bf16 (a bf16 inp
  // widened, the result rounded once).
  virtual void gelu_forward(ActView out, ActView inp, std::int64_t n) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) = 0;
  // The residual add: out = a + b, a a sub-block's fp32 output, b and out the residual stream in
  // fp32 or bf16 (out rounded once; it may be a or b).
  virtual void residual_forward(ActView out, const float* a, ActView b, std::int64_t n) = 0;
  // sum[N,C] = a + b (residual_forward), then layernorm_forward(out, mean, rstd, sum, ...) of the
  // sum as stored (rounded, for a bf16 sum: what the backward reads): the residual add and the
  // next LayerNorm. This is the two calls; a GPU overrides it with one pass of the same values.
  virtual void residual_layernorm_forward(ActView sum, ActView out, float* mean, float* rstd,
                                          const float* a, ActView b, const float* weight,
                                          const float* bias, int N, int C) {
    residual_forward(sum, a, b, std::int64_t(N) * C);
    layernorm_forward(out, mean, rstd, sum, weight, bias, N, C);
  }
  // The Llama block's layers (cpu/layers.hpp): RMSNorm, SwiGLU on the fused gate | up, the rotary
  // embedding (in place, from rope_table's [T, hs/2, 2]), and grouped-query attention's K/V
  // repeated to every query head. Activations (out, inp, gu, x) fp32 or bf16 (widened as read,
  // rounded once as written); gradients fp32.
  virtual void rmsnorm_forward(ActView out, float* rstd, ActView inp, const float* weight, int N,
                               int C) = 0;
  virtual void rmsnorm_backward(float* dinp, float* dweight, const float* dout, ActView inp,
                                const float* weight, const float* rstd, int N, int C) = 0;
  virtual void swiglu_forward(ActView out, ActView gu, int N, int F) = 0;
  virtual void swiglu_backward(float* dgu, ActView gu, const float* dout, int N, int F) = 0;
  virtual void rope_forward(ActView x, const float* table, int N, int T, int row0, int heads,
                            int hs, int row_stride) = 0;
  virtual void rope_backward(float* dx, const float* table, int N, int T, int row0, int heads,
                             int hs, int row_stride) = 0;
  // out[N, 3 NH hs] = q | k | v with each of in's KV heads of k and v [N, (NH + 2 KV) hs] repeated
  // NH / KV times (query head h reads K/V head h / (NH / KV), as Llama's repeat_kv); out and in of
  // one dtype. The backward (=): din's q is dout's, each K/V head the sum over its query heads in
  // head order.
  virtual void repeat_kv_forward(ActView out, ActView in, int N, int NH, int KV, int hs) = 0;
  virtual void repeat_kv_backward(float* din, const float* dout, int N, int NH, int KV, int hs) = 0;
  // The mixture of experts' pieces (cpu/layers.hpp; the plan's arrays from moe_dispatch): top-k
  // softmax routing and its backward (=), the sequence-wise load-balancing loss per sequence and
  // its d(probs) (=; scratch [B,E]), dispatch (out [rows,C] = x's rows token_of; out and x of one
  // dtype, copied) and its backward (+=), the gate-weighted combine (=) and its backward (=).
  virtual void router_topk_forward(float* probs, std::int32_t* experts, float* gates,
                                   const float* logits, int N, int E, int k) = 0;
  virtual void router_topk_backward(float* dlogits, const float* probs, const std::int32_t* experts,
                                    const float* gates, const float* dgates, const float* dprobs,
                                    int N, int E, int k) = 0;
  virtual void moe_aux_loss_forward(float* loss, float* scratch, const float* probs,
                                    const std::int32_t* choices, int B, int T, int seq, int E,
                                    int k, float coef) = 0;
  virtual void moe_aux_loss_backward(float* dprobs, float* scratch, const std::int32_t* choices,
                                     int B, int T, int seq, int E, int k, float coef_scale) = 0;
  virtual void moe_gather(ActView out, ActView x, const std::int32_t* token_of, int rows,
                          int C) = 0;
  virtual void moe_gather_backward(float* dx, const float* din, const std::int32_t* row_of, int N,
                                   int k, int C) = 0;
  virtual void moe_combine(float* y, const float* eout, const std::int32_t* row_of,
                           const float* gates, int N, int k, int C) = 0;
  virtual void moe_combine_backward(float* deout, float* dgates, const float* dy, const float* eout,
                                    const std::int32_t* row_of, const float* gates, int N, int k,
                                    int C) = 0;
  virtual void softmax_crossentropy_forward(float* probs, float* losses, const float* logits,
                                            const std::int32_t* targets, int N, int V) = 0;
  virtual void crossentropy_softmax_backward(float* dlogits, const float* probs,
                                             const std::int32_t* targets, float grad_scale, int N,
                                             int V) = 0;

  // --- bf16 matmuls: operands rounded to bf16, products accumulated in fp32
  virtual void round_to_bf16(bf16* out, const float* in, std::size_t n) = 0;
  virtual void widen_bf16(float* out, const bf16* in, std::size_t n) = 0;
  // C[M,N] (=, or += with accumulate) = op(A) @ op(B), row-major, C f32 or bf16;
  // scratchpad: at least gemm_bf16_scratchpad_bytes() of the same call, or null.
  virtual void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A,
                         const bf16* B, void* C, DType c_dtype, bool accumulate, void* scratchpad,
                         std::size_t scratchpad_bytes) = 0;
  virtual std::size_t gemm_bf16_scratchpad_bytes(bool trans_a, bool trans_b, int M, int N, int K,
                                                 DType c_dtype, bool accumulate) = 0;
  // A linear layer's forward on bf16 operands with its epilogue: out[N,OC] (=) = inp[N,C] @
  // weight[OC,C]^T + bias[OC] (bias fp32, may be null), the bias added to the fp32 accumulator and
  // the sum rounded once to out's dtype (fp32 or bf16); with gelu_out [N,OC] (out's dtype) also
  // gelu_out = gelu_forward(out) of out as stored, which the backward reads: a bf16 run's GELU
  // sees the bf16 pre-activation, as Megatron-Core's bias-GELU and llm.c's default (no GELU
  // epilogue) do. The scratchpad is gemm_bf16's for (false, true, N, OC, C, f32, false); `f32`
  // (N x OC floats, or null with fp32 outputs) holds the fp32 sums where a backend adds the bias
  // apart from the GEMM: the CPU backend runs gemm_bf16, add_bias, the rounding and gelu_forward;
  // the CUDA one the GEMM and bias as one cuBLASLt call (f32 unused there), then gelu_forward.
  virtual void matmul_bf16_forward(ActView out, ActView gelu_out, const bf16* inp,
                                   const bf16* weight, const float* bias, int N, int C, int OC,
                                   void* scratchpad, std::size_t scratchpad_bytes, float* f32) = 0;

  // --- elementwise steps of the passes
  virtual void zero(float* p, std::size_t n) = 0;  // p = 0
  // out[n, :] += bias for each of `rows` rows; dbias += column sums of dout, in one order on
  // every backend: each chunk of kBiasGradRows rows summed from 0 in row order, the chunk sums
  // added to dbias in chunk order (a GPU sums the chunks in parallel, bit for bit the CPU's).
  virtual void add_bias(float* out, const float* bias, std::size_t rows, int C) = 0;
  virtual void bias_grad(float* dbias, const float* dout, std::size_t rows, int C) = 0;
  // round_to_bf16(out, dout, rows * C) and bias_grad(dbias, dout, rows, C), the same values, in
  // one pass over dout on a GPU: a bf16 linear layer's backward reads its output gradient once for
  // the GEMMs' operand and the bias gradient.
  virtual void round_to_bf16_bias_grad(bf16* out, float* dbias, const float* dout, std::size_t rows,
                                       int C) = 0;
  // The GELU's backward feeding a bf16 linear layer's backward: d = GELU'(inp) * dout [rows, C]
  // (the values gelu_backward adds into zeros; inp fp32 or bf16, widened), then
  // round_to_bf16_bias_grad(out, dbias, d). The CPU runs those calls, d in `scratch` [rows, C]; a
  // GPU one pass over inp and dout that never writes d (scratch unused).
  virtual void gelu_backward_bf16_bias_grad(bf16* out, float* dbias, float* scratch, ActView inp,
                                            const float* dout, std::size_t rows, int C) = 0;
  // dst[i] = bf16(float(dst[i]) + src[i]): fp32 partial gradients into bf16 ones.
  virtual void add_into_bf16(bf16* dst, const float* src, std::size_t n) = 0;
  // Vocab-parallel embedding: rows[n, :] = wte[tokens[n] - v0, :] (f32 or bf16 table) when the
  // token is in [v0, v0 + Vl), else 0 (=, not +=); out[i, :] = x[i, :] + wpe[(row0 + i) % T, :],
  // out the residual stream in fp32 (it may be x) or bf16 (rounded once).
  virtual void embedding_rows(float* rows, const std::int32_t* tokens, std::size_t N,
                              BufferView wte, std::size_t v0, std::size_t Vl, int C) = 0;
  virtual void add_positions(ActView out, const float* x, BufferView wpe, std::size_t rows,
                             std::size_t row0, int T, int C) = 0;
  // Their backward: gwte[tokens[n] - v0, :] += d[n, :] for tokens in the shard;
  // gwpe[(row0 + i) % T, :] += d[i, :] (f32 or bf16 gradients, bf16 rounded per addition).
  virtual void embedding_rows_backward(BufferView gwte, const float* d, const std::int32_t* tokens,
                                       std::size_t N, std::size_t v0, std::size_t Vl, int C) = 0;
  virtual void positions_backward(BufferView gwpe, const float* d, std::size_t rows,
                                  std::size_t row0, int T, int C) = 0;
  // Vocab-parallel cross-entropy over logits [N, Vl] held in probs, in three steps around the
  // all-reduces of the passes: mx[n] = max of row n; then probs = exp(logits - mx), sum[n] = row
  // sums and target[n] = logit of the target - mx (0 when the target is outside the shard);
  // then probs /= sum and losses[n] = log(sum[n]) - target[n]. The logits may be bf16 (the bf16
  // head's, widened as read): xent_exp then writes no exps, and xent_normalise_grad_bf16 below
  // takes the place of xent_normalise.
  virtual void xent_row_max(float* mx, ActView logits, std::size_t N, std::size_t Vl) = 0;
  virtual void xent_exp(ActView probs, float* sum, float* target, const float* mx,
                        const std::int32_t* targets, std::size_t v0, std::size_t N,
                        std::size_t Vl) = 0;
  virtual void xent_normalise(float* probs, float* losses, const float* sum, const float* target,
                              std::size_t N, std::size_t Vl) = 0;
  // dlogits[n, :] = probs[n, :] * scale, minus scale at the target when it is in the shard (=).
  virtual void xent_backward_shard(float* dlogits, const float* probs, const std::int32_t* targets,
                                   std::size_t v0, float scale, std::size_t N, std::size_t Vl) = 0;
  // The bf16 head's cross-entropy (bf16 parameters): its logits are the GEMM's bf16 output, as
  // Megatron-Core's and llm.c's are, and the gradient kept from forward to backward is
  // bf16(softmax - onehot(target)) written over them, unscaled (the gradient scale is known only in
  // backward), not fp32 probabilities. The softmax and losses in fp32 as the fp32 steps compute
  // them from the widened logits: log(sum of exp) - (target logit - max), the softmax as
  // exp(logit - max) * (1 / sum).
  // Whole rows (tp 1): logits [N, V] -> their dlogits in place, and losses [N] (=).
  virtual void softmax_crossentropy_grad_bf16(bf16* logits, float* losses,
                                              const std::int32_t* targets, std::size_t N,
                                              std::size_t V) = 0;
  // Vocab-parallel: the last step after xent_row_max, xent_exp and their all-reduces, over the
  // bf16 logits [N, Vl] (in place): dlogits[n, :] = bf16(exp(logits[n, :] - mx[n]) * (1 /
  // sum[n])), minus 1 at the target when it is in the shard [v0, v0 + Vl), before the rounding;
  // losses as xent_normalise.
  virtual void xent_normalise_grad_bf16(bf16* logits, float* losses, const float* mx,
                                        const float* sum, const float* target,
                                        const std::int32_t* targets, std::size_t v0, std::size_t N,
                                        std::size_t Vl) = 0;
  // x[i] = bf16(float(x[i]) * scale): the kept bf16 d(logits) scaled in place in backward.
  virtual void scale_bf16(bf16* x, float scale, std::size_t n) = 0;
  // Sum of x[0, n) in double, read back to the host (the loss).
  virtual double sum(const float* x, std::size_t n) = 0;

 protected:
  // matmul_bf16_forward as its steps: gemm_bf16 into fp32 (out itself, or f32), add_bias, the
  // rounding of bf16 outputs, gelu_forward (the CPU's implementation, and the CUDA one's where
  // cuBLASLt has no bias algorithm).
  void matmul_bf16_forward_steps(ActView out, ActView gelu_out, const bf16* inp, const bf16* weight,
                                 const float* bias, int N, int C, int OC, void* scratchpad,
                                 std::size_t scratchpad_bytes, float* f32) {
    const std::size_t n = std::size_t(N) * std::size_t(OC);
    if (out.is_bf16() && !f32)
      throw Error("matmul_bf16_forward: bf16 outputs need the fp32 scratch (f32 is null)");
    float* pre = out.is_bf16() ? f32 : out.f32();
    gemm_bf16(false, true, N, OC, C, inp, weight, pre, DType::f32, false, scratchpad,
              scratchpad_bytes);
    if (bias) add_bias(pre, bias, std::size_t(N), OC);
    if (out.is_bf16()) round_to_bf16(out.half(), pre, n);
    if (gelu_out.data) gelu_forward(gelu_out, out, std::int64_t(n));
  }
};

// The CPU backend's kernels (stateless).
Kernels& cpu_kernels();

// The attention kernels of a CUDA run (--attention, RunConfig::attention_kernel()): reference,
// the fp32 flash kernel on CUDA cores (cuda/attention.cu: what the CPU computes, to summation
// order); own, strata's bf16 tensor-core flash kernel (cuda/attention_tc.cu: bf16 products, fp32
// softmax and accumulation); cudnn, cuDNN's fused flash attention (cuda/cudnn_attention.hpp, in a
// build that found cuDNN). All keep the same state (a log-sum-exp per row, the backward's row
// deltas), so the memory plan does not depend on the choice; cuDNN works in memory of its own
// beside it (CudnnAttention::working_bytes). The CPU always computes its reference attention.
enum class AttentionKernel { reference, own, cudnn };
inline const char* attention_kernel_name(AttentionKernel kernel) {
  return kernel == AttentionKernel::own     ? "own"
         : kernel == AttentionKernel::cudnn ? "cudnn"
                                            : "reference";
}

// Whether the own tensor-core kernel takes a shape: a head size that is a multiple of 16 (the
// tensor-core tile) up to 128, and at most 65535 (batch, head) pairs.
inline bool cuda_tensor_core_attention(int B, int C, int NH) {
  return NH > 0 && C % NH == 0 && (C / NH) % 16 == 0 && C / NH <= 128 &&
         std::int64_t(B) * NH <= 65535;
}

// Whether cuDNN's fused attention takes a shape here: a head size that is a multiple of 8 up to
// 128 (cuDNN's bf16 backward on Ampere and Hopper).
inline bool cuda_cudnn_attention(int C, int NH) {
  return NH > 0 && C % NH == 0 && (C / NH) % 8 == 0 && C / NH <= 128;
}

// Whether the CUDA backend's fused attention (cuda/attention.cu) takes a shape: a head size of at
// most 128 and at most 65535 (batch, head) pairs, the grid's y dimension.
inline bool cuda_fused_attention(int B, int C, int NH) {
  return NH > 0 && C % NH == 0 && C / NH <= 128 && std::int64_t(B) * NH <= 65535;
}

// Whether the attention of `device` reads bf16 Q, K, V and writes a bf16 output for a bf16 run
// (and reads both back in the backward): the CPU's and the CUDA fused ones do; the CUDA cuBLAS
// path, for the shapes the fused kernels do not take, takes fp32, so that its input and output
// are fp32 in every run.
inline bool attention_writes_bf16(Device device, int B, int C, int NH) {
  return device == Device::cpu || cuda_fused_attention(B, C, NH);
}

// Floats of the attention's state kept from forward to backward (att) and of its backward scratch
// (datt), for B sequences of T tokens, C channels in NH heads on `device`: the probabilities
// [B,NH,T,T], or with the fused attention a log-sum-exp per row [B,NH,T].
inline std::size_t attention_state_floats(Device device, int B, int T, int C, int NH) {
  const std::size_t rows = std::size_t(B) * NH * T;
  return device == Device::cuda && cuda_fused_attention(B, C, NH) ? rows : rows * T;
}

}  // namespace strata
STRATA_EXPORT_END
