// The CPU backend's kernels (kernels.hpp): the layer passes of cpu/layers.hpp, the bf16 GEMMs of
// cpu/gemm_bf16.hpp, and the elementwise steps of the model's passes, on host memory.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/gemm_bf16.hpp"
#include "backends/cpu/layers.hpp"
#include "backends/cpu/vecmath.hpp"
#include "backends/kernels.hpp"

namespace strata {
namespace {

// Row `row` of a [rows, C] table as fp32: the table's own memory, or (bf16) widened into scratch.
const float* row_f32(BufferView table, std::size_t row, int C, float* scratch) {
  if (table.dtype == DType::f32) return static_cast<const float*>(table.data) + row * C;
  cpu::widen_bf16(scratch, static_cast<const bf16*>(table.data) + row * C, std::size_t(C));
  return scratch;
}

// Row `row` of a [rows, C] gradient table += src[0, C) (bf16: each element rounded once).
void add_row(BufferView table, std::size_t row, const float* src, int C) {
  if (table.dtype == DType::f32) {
    float* dst = static_cast<float*>(table.data) + row * C;
    for (int c = 0; c < C; ++c) dst[c] += src[c];
    return;
  }
  bf16* dst = static_cast<bf16*>(table.data) + row * C;
  for (int c = 0; c < C; ++c) dst[c] = to_bf16(to_float(dst[c]) + src[c]);
}

// Elements [at, at + n) of x in fp32: x itself, or widened into `wide` (n floats) when bf16.
const float* span_f32(ActView x, std::size_t at, std::size_t n, std::vector<float>& wide) {
  if (!x.is_bf16()) return x.f32() + at;
  cpu::widen_bf16(wide.data(), x.half() + at, n);
  return wide.data();
}

// Each of n tokens' sequence position.
std::vector<int> positions(TokenPositions at, int n) {
  std::vector<int> p(static_cast<std::size_t>(n));
  for (int t = 0; t < n; ++t) p[std::size_t(t)] = at(t);
  return p;
}

// Rows per block of the row-wise kernels on bf16 tensors: a block is widened, computed in fp32
// and rounded, so the values are the fp32 kernel's on the widened input, rounded once.
constexpr int kBlockRows = 64;
// Elements per block of the elementwise ones.
constexpr std::size_t kBlockElems = std::size_t(1) << 16;

// f(o, i, n0, n) on fp32 rows [n0, n0 + n) of out [N, out_width] and inp [N, inp_width]: the
// tensors themselves when both are fp32, else a block of rows at a time with bf16 ones widened
// before and rounded after. out may be inp (in place).
template <class F>
void by_row_blocks(ActView out, std::size_t out_width, ActView inp, std::size_t inp_width, int N,
                   F&& f) {
  if (!out.is_bf16() && !inp.is_bf16()) return f(out.f32(), inp.f32(), 0, N);
  const bool in_place = out.data == inp.data;
  const std::size_t rows = std::size_t(std::min(N, kBlockRows));
  std::vector<float> o_rows(out.is_bf16() && !in_place ? rows * out_width : 0),
      wide(inp.is_bf16() ? rows * inp_width : 0);
  for (int n0 = 0; n0 < N; n0 += kBlockRows) {
    const int n = std::min(kBlockRows, N - n0);
    const float* i = span_f32(inp, n0 * inp_width, n * inp_width, wide);
    float* o = in_place        ? const_cast<float*>(i)
               : out.is_bf16() ? o_rows.data()
                               : out.f32() + n0 * out_width;
    f(o, i, n0, n);
    if (out.is_bf16()) cpu::round_to_bf16(out.half() + n0 * out_width, o, n * out_width);
  }
}

class CpuKernels final : public Kernels {
 public:
  void encoder_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C) override {
    cpu::encoder_forward(out, tokens, wte, wpe, B, T, C);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                        int B, int T, int C) override {
    cpu::encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  // A bf16 input or output: a block of rows widened, computed in fp32, then rounded (the values
  // an fp32 LayerNorm and round_to_bf16 give, bit for bit).
  void layernorm_forward(ActView out, float* mean, float* rstd, ActView inp, const float* weight,
                         const float* bias, int N, int C) override {
    if (!out.is_bf16() && !inp.is_bf16())
      return cpu::layernorm_forward(out.f32(), mean, rstd, inp.f32(), weight, bias, N, C);
    const std::size_t block = std::size_t(std::min(N, kBlockRows)) * std::size_t(C);
    std::vector<float> rows(out.is_bf16() ? block : 0), wide(inp.is_bf16() ? block : 0);
    for (int n0 = 0; n0 < N; n0 += kBlockRows) {
      const int n = std::min(kBlockRows, N - n0);
      const std::size_t at = std::size_t(n0) * std::size_t(C), len = std::size_t(n) * C;
      float* o = out.is_bf16() ? rows.data() : out.f32() + at;
      cpu::layernorm_forward(o, mean + n0, rstd + n0, span_f32(inp, at, len, wide), weight, bias, n,
                             C);
      if (out.is_bf16()) cpu::round_to_bf16(out.half() + at, o, len);
    }
  }
  // Row by row, so a block at a time sums dweight and dbias in the same order.
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, ActView inp,
                          const float* weight, const float* mean, const float* rstd, int N,
                          int C) override {
    if (!inp.is_bf16())
      return cpu::layernorm_backward(dinp, dweight, dbias, dout, inp.f32(), weight, mean, rstd, N,
                                     C);
    std::vector<float> wide(std::size_t(std::min(N, kBlockRows)) * std::size_t(C));
    for (int n0 = 0; n0 < N; n0 += kBlockRows) {
      const int n = std::min(kBlockRows, N - n0);
      const std::size_t at = std::size_t(n0) * std::size_t(C), len = std::size_t(n) * C;
      cpu::layernorm_backward(dinp + at, dweight, dbias, dout + at, span_f32(inp, at, len, wide),
                              weight, mean + n0, rstd + n0, n, C);
    }
  }
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int C, int OC) override {
    cpu::matmul_forward(out, inp, weight, bias, N, C, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int C, int OC) override {
    cpu::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
  // bf16 Q, K, V or output: a sequence at a time, its qkv widened into fp32 and its output
  // computed in fp32, then rounded (round_to_bf16's values).
  void attention_forward(ActView out, float* att, ActView qkv, int B, int T, int C,
                         int NH) override {
    if (!out.is_bf16() && !qkv.is_bf16())
      return cpu::attention_forward(out.f32(), att, qkv.f32(), B, T, C, NH);
    const std::size_t TC = std::size_t(T) * std::size_t(C), TT = std::size_t(NH) * T * T;
    std::vector<float> rows(out.is_bf16() ? TC : 0), wide(qkv.is_bf16() ? 3 * TC : 0);
    for (int b = 0; b < B; ++b) {
      float* o = out.is_bf16() ? rows.data() : out.f32() + b * TC;
      cpu::attention_forward(o, att + b * TT, span_f32(qkv, b * 3 * TC, 3 * TC, wide), 1, T, C, NH);
      if (out.is_bf16()) cpu::round_to_bf16(out.half() + b * TC, o, TC);
    }
  }
  // The probabilities in att are what the CPU's backward reads; not the output.
  void attention_backward(float* dqkv, float* datt, const float* dout, ActView qkv,
                          const float* att, ActView, int B, int T, int C, int NH) override {
    if (!qkv.is_bf16())
      return cpu::attention_backward(dqkv, datt, dout, qkv.f32(), att, B, T, C, NH);
    const std::size_t TC = std::size_t(T) * std::size_t(C), TT = std::size_t(NH) * T * T;
    std::vector<float> wide(3 * TC);
    for (int b = 0; b < B; ++b)
      cpu::attention_backward(dqkv + 3 * b * TC, datt + b * TT, dout + b * TC,
                              span_f32(qkv, b * 3 * TC, 3 * TC, wide), att + b * TT, 1, T, C, NH);
  }
  // bf16 q, kv or output widened whole (ring attention's blocks are the CPU's test path).
  void attention_block_forward(float* o, float* lse, ActView q, int q_stride, ActView kv, int B,
                               int Tq, int Tk, int NH, int KV, int hs, TokenPositions qpos,
                               TokenPositions kpos, bool first) override {
    std::vector<float> wq(q.is_bf16() ? std::size_t(B) * Tq * q_stride : 0),
        wkv(kv.is_bf16() ? std::size_t(B) * Tk * 2 * KV * hs : 0);
    const std::vector<int> qp = positions(qpos, Tq), kp = positions(kpos, Tk);
    cpu::attention_block_forward(o, lse, span_f32(q, 0, wq.size(), wq), q_stride,
                                 span_f32(kv, 0, wkv.size(), wkv), B, Tq, Tk, NH, KV, hs, qp.data(),
                                 kp.data(), first);
  }
  void attention_block_backward(float* dq, int dq_stride, float* dkv, const float* dout,
                                ActView out, const float* lse, ActView q, int q_stride, ActView kv,
                                int B, int Tq, int Tk, int NH, int KV, int hs, TokenPositions qpos,
                                TokenPositions kpos) override {
    std::vector<float> wq(q.is_bf16() ? std::size_t(B) * Tq * q_stride : 0),
        wkv(kv.is_bf16() ? std::size_t(B) * Tk * 2 * KV * hs : 0),
        wout(out.is_bf16() ? std::size_t(B) * Tq * NH * hs : 0);
    const std::vector<int> qp = positions(qpos, Tq), kp = positions(kpos, Tk);
    cpu::attention_block_backward(dq, dq_stride, dkv, dout, span_f32(out, 0, wout.size(), wout),
                                  lse, span_f32(q, 0, wq.size(), wq), q_stride,
                                  span_f32(kv, 0, wkv.size(), wkv), B, Tq, Tk, NH, KV, hs,
                                  qp.data(), kp.data());
  }
  // A bf16 tensor a block at a time: widened, the fp32 GELU, rounded (in place is allowed).
  void gelu_forward(ActView out, ActView inp, std::int64_t n) override {
    if (out.dtype != inp.dtype)
      throw Error("gelu_forward: the output and input in different dtypes");
    if (!out.is_bf16()) return cpu::gelu_forward(out.f32(), inp.f32(), n);
    const std::size_t total = std::size_t(n), block = kBlockElems;
    std::vector<float> wide(std::min(total, block));
    for (std::size_t at = 0; at < total; at += block) {
      const std::size_t len = std::min(block, total - at);
      cpu::widen_bf16(wide.data(), inp.half() + at, len);
      cpu::gelu_forward(wide.data(), wide.data(), std::int64_t(len));
      cpu::round_to_bf16(out.half() + at, wide.data(), len);
    }
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) override {
    cpu::gelu_backward(dinp, inp, dout, n);
  }
  void residual_forward(ActView out, const float* a, ActView b, std::int64_t n) override {
    if (!out.is_bf16() && !b.is_bf16()) return cpu::residual_forward(out.f32(), a, b.f32(), n);
    const std::size_t total = std::size_t(n), block = kBlockElems;
    std::vector<float> acc(std::min(total, block)), wide(b.is_bf16() ? acc.size() : 0);
    for (std::size_t at = 0; at < total; at += block) {
      const std::size_t len = std::min(block, total - at);
      float* o = out.is_bf16() ? acc.data() : out.f32() + at;
      cpu::residual_forward(o, a + at, span_f32(b, at, len, wide), std::int64_t(len));
      if (out.is_bf16()) cpu::round_to_bf16(out.half() + at, o, len);
    }
  }
  void rmsnorm_forward(ActView out, float* rstd, ActView inp, const float* weight, int N,
                       int C) override {
    by_row_blocks(out, C, inp, C, N, [&](float* o, const float* i, int n0, int n) {
      cpu::rmsnorm_forward(o, rstd + n0, i, weight, n, C);
    });
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, ActView inp,
                        const float* weight, const float* rstd, int N, int C) override {
    by_row_blocks(ActView{dinp}, C, inp, C, N, [&](float* o, const float* i, int n0, int n) {
      const std::size_t at = std::size_t(n0) * C;
      cpu::rmsnorm_backward(o, dweight, dout + at, i, weight, rstd + n0, n, C);
    });
  }
  void swiglu_forward(ActView out, ActView gu, int N, int F) override {
    by_row_blocks(out, F, gu, 2 * std::size_t(F), N,
                  [&](float* o, const float* i, int, int n) { cpu::swiglu_forward(o, i, n, F); });
  }
  void swiglu_backward(float* dgu, ActView gu, const float* dout, int N, int F) override {
    by_row_blocks(ActView{dgu}, 2 * std::size_t(F), gu, 2 * std::size_t(F), N,
                  [&](float* o, const float* i, int n0, int n) {
                    cpu::swiglu_backward(o, i, dout + std::size_t(n0) * F, n, F);
                  });
  }
  void rope_forward(ActView x, const float* table, int N, int T, int row0, int heads, int hs,
                    int row_stride) override {
    by_row_blocks(x, row_stride, x, row_stride, N, [&](float* o, const float*, int n0, int n) {
      cpu::rope_forward(o, table, n, T, row0 + n0, heads, hs, row_stride);
    });
  }
  void rope_backward(float* dx, const float* table, int N, int T, int row0, int heads, int hs,
                     int row_stride) override {
    cpu::rope_backward(dx, table, N, T, row0, heads, hs, row_stride);
  }
  void repeat_kv_forward(ActView out, ActView in, int N, int NH, int KV, int hs) override {
    if (out.dtype != in.dtype) throw Error("repeat_kv_forward: in and out in different dtypes");
    const std::size_t C = std::size_t(NH) * hs;
    by_row_blocks(
        out, 3 * C, in, C + 2 * std::size_t(KV) * hs, N,
        [&](float* o, const float* i, int, int n) { cpu::repeat_kv_forward(o, i, n, NH, KV, hs); });
  }
  void repeat_kv_backward(float* din, const float* dout, int N, int NH, int KV, int hs) override {
    cpu::repeat_kv_backward(din, dout, N, NH, KV, hs);
  }
  void router_topk_forward(float* probs, std::int32_t* experts, float* gates, const float* logits,
                           int N, int E, int k) override {
    cpu::router_topk_forward(probs, experts, gates, logits, N, E, k);
  }
  void router_topk_backward(float* dlogits, const float* probs, const std::int32_t* experts,
                            const float* gates, const float* dgates, const float* dprobs, int N,
                            int E, int k) override {
    cpu::router_topk_backward(dlogits, probs, experts, gates, dgates, dprobs, N, E, k);
  }
  void moe_aux_loss_forward(float* loss, float*, const float* probs, const std::int32_t* choices,
                            int B, int T, int seq, int E, int k, float coef) override {
    cpu::moe_aux_loss_forward(loss, probs, choices, B, T, seq, E, k, coef);
  }
  void moe_aux_loss_backward(float* dprobs, float*, const std::int32_t* choices, int B, int T,
                             int seq, int E, int k, float coef_scale) override {
    cpu::moe_aux_loss_backward(dprobs, choices, B, T, seq, E, k, coef_scale);
  }
  void moe_gather(ActView out, ActView x, const std::int32_t* token_of, int rows, int C) override {
    if (out.dtype != x.dtype) throw Error("moe_gather: x and out in different dtypes");
    if (!out.is_bf16()) return cpu::moe_gather(out.f32(), x.f32(), token_of, rows, C);
    for (std::int64_t r = 0; r < rows; ++r)  // bf16 rows copied as they are
      std::memcpy(out.half() + r * C, x.half() + std::int64_t(token_of[r]) * C,
                  std::size_t(C) * sizeof(bf16));
  }
  void moe_gather_backward(float* dx, const float* din, const std::int32_t* row_of, int N, int k,
                           int C) override {
    cpu::moe_gather_backward(dx, din, row_of, N, k, C);
  }
  void moe_combine(float* y, const float* eout, const std::int32_t* row_of, const float* gates,
                   int N, int k, int C) override {
    cpu::moe_combine(y, eout, row_of, gates, N, k, C);
  }
  void moe_combine_backward(float* deout, float* dgates, const float* dy, const float* eout,
                            const std::int32_t* row_of, const float* gates, int N, int k,
                            int C) override {
    cpu::moe_combine_backward(deout, dgates, dy, eout, row_of, gates, N, k, C);
  }
  void softmax_crossentropy_forward(float* probs, float* losses, const float* logits,
                                    const std::int32_t* targets, int N, int V) override {
    cpu::softmax_crossentropy_forward(probs, losses, logits, targets, N, V);
  }
  void crossentropy_softmax_backward(float* dlogits, const float* probs,
                                     const std::int32_t* targets, float grad_scale, int N,
                                     int V) override {
    cpu::crossentropy_softmax_backward(dlogits, probs, targets, grad_scale, N, V);
  }

  void round_to_bf16(bf16* out, const float* in, std::size_t n) override {
    cpu::round_to_bf16(out, in, n);
  }
  void widen_bf16(float* out, const bf16* in, std::size_t n) override {
    cpu::widen_bf16(out, in, n);
  }
  void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, const bf16* B,
                 void* C, DType c_dtype, bool accumulate, void* scratchpad,
                 std::size_t scratchpad_bytes) override {
    cpu::gemm_bf16(trans_a, trans_b, M, N, K, A, B, C, c_dtype, accumulate,
                   {scratchpad, scratchpad_bytes});
  }
  std::size_t gemm_bf16_scratchpad_bytes(bool trans_a, bool trans_b, int M, int N, int K,
                                         DType c_dtype, bool accumulate) override {
    return cpu::gemm_bf16_scratchpad_bytes(trans_a, trans_b, M, N, K, c_dtype, accumulate);
  }
  // As its steps: GEMM, bias, GELU and, for bf16 outputs, the roundings.
  void matmul_bf16_forward(ActView out, ActView gelu_out, const bf16* inp, const bf16* weight,
                           const float* bias, int N, int C, int OC, void* scratchpad,
                           std::size_t scratchpad_bytes, float* f32) override {
    matmul_bf16_forward_steps(out, gelu_out, inp, weight, bias, N, C, OC, scratchpad,
                              scratchpad_bytes, f32);
  }

  void zero(float* p, std::size_t n) override { std::memset(p, 0, n * sizeof(float)); }
  void add_bias(float* out, const float* bias, std::size_t rows, int C) override {
    for (std::size_t n = 0; n < rows; ++n)
#pragma omp simd
      for (int c = 0; c < C; ++c) out[n * C + c] += bias[c];
  }
  // d = GELU'(inp) dout in scratch (a bf16 inp widened a block of rows at a time), then the
  // rounding and the bias gradient.
  void gelu_backward_bf16_bias_grad(bf16* out, float* dbias, float* scratch, ActView inp,
                                    const float* dout, std::size_t rows, int C) override {
    const std::size_t n = rows * std::size_t(C);
    zero(scratch, n);
    if (!inp.is_bf16()) {
      gelu_backward(scratch, inp.f32(), dout, std::int64_t(n));
    } else {
      constexpr std::size_t kRows = 64;
      std::vector<float> x(std::min(rows, kRows) * std::size_t(C));
      for (std::size_t r0 = 0; r0 < rows; r0 += kRows) {
        const std::size_t at = r0 * std::size_t(C), m = std::min(kRows, rows - r0) * std::size_t(C);
        cpu::widen_bf16(x.data(), inp.half() + at, m);
        gelu_backward(scratch + at, x.data(), dout + at, std::int64_t(m));
      }
    }
    round_to_bf16_bias_grad(out, dbias, scratch, rows, C);
  }
  void round_to_bf16_bias_grad(bf16* out, float* dbias, const float* dout, std::size_t rows,
                               int C) override {
    cpu::round_to_bf16(out, dout, rows * std::size_t(C));
    bias_grad(dbias, dout, rows, C);
  }
  void bias_grad(float* dbias, const float* dout, std::size_t rows, int C) override {
    constexpr int kCols = 256;  // a tile of columns, its chunk sums on the stack
    for (int c0 = 0; c0 < C; c0 += kCols) {
      const int w = std::min(kCols, C - c0);
      for (std::size_t r0 = 0; r0 < rows; r0 += kBiasGradRows) {
        float sum[kCols];
#pragma omp simd
        for (int c = 0; c < w; ++c) sum[c] = 0.0f;
        for (std::size_t n = r0; n < std::min(rows, r0 + kBiasGradRows); ++n)
#pragma omp simd
          for (int c = 0; c < w; ++c) sum[c] += dout[n * C + c0 + c];
#pragma omp simd
        for (int c = 0; c < w; ++c) dbias[c0 + c] += sum[c];
      }
    }
  }
  void add_into_bf16(bf16* dst, const float* src, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) dst[i] = to_bf16(to_float(dst[i]) + src[i]);
  }

  void embedding_rows(float* rows, const std::int32_t* tokens, std::size_t N, BufferView wte,
                      std::size_t v0, std::size_t Vl, int C) override {
    for (std::size_t n = 0; n < N; ++n) {
      float* row = rows + n * C;
      const std::size_t v = std::size_t(tokens[n]) - v0;              // wraps for tokens below v0
      const float* src = v < Vl ? row_f32(wte, v, C, row) : nullptr;  // bf16: widened into row
      if (!src)
        std::fill_n(row, C, 0.0f);
      else if (src != row)
        std::copy_n(src, C, row);
    }
  }
  // wpe's bf16 widened as it is added (no scratch row on every call); a bf16 out rounded per
  // element.
  void add_positions(ActView out, const float* x, BufferView wpe, std::size_t rows,
                     std::size_t row0, int T, int C) override {
    for (std::size_t i = 0; i < rows; ++i) {
      const std::size_t t = (row0 + i) % T, at = i * C;
      for (int c = 0; c < C; ++c) {
        const float pos = wpe.dtype == DType::f32
                              ? static_cast<const float*>(wpe.data)[t * C + c]
                              : to_float(static_cast<const bf16*>(wpe.data)[t * C + c]);
        const float v = x[at + c] + pos;
        if (out.is_bf16())
          out.half()[at + c] = to_bf16(v);
        else
          out.f32()[at + c] = v;
      }
    }
  }
  void embedding_rows_backward(BufferView gwte, const float* d, const std::int32_t* tokens,
                               std::size_t N, std::size_t v0, std::size_t Vl, int C) override {
    for (std::size_t n = 0; n < N; ++n) {
      const std::size_t v = std::size_t(tokens[n]) - v0;
      if (v < Vl) add_row(gwte, v, d + n * C, C);
    }
  }
  void positions_backward(BufferView gwpe, const float* d, std::size_t rows, std::size_t row0,
                          int T, int C) override {
    for (std::size_t i = 0; i < rows; ++i) add_row(gwpe, (row0 + i) % T, d + i * C, C);
  }

  // bf16 logits (the bf16 head's): a row at a time widened.
  void xent_row_max(float* mx, ActView logits, std::size_t N, std::size_t Vl) override {
    std::vector<float> wide(logits.is_bf16() ? Vl : 0);
    for (std::size_t n = 0; n < N; ++n) {
      const float* x = span_f32(logits, n * Vl, Vl, wide);
      mx[n] = *std::max_element(x, x + Vl);
    }
  }
  void xent_exp(ActView probs, float* sum, float* target, const float* mx,
                const std::int32_t* targets, std::size_t v0, std::size_t N,
                std::size_t Vl) override {
    std::vector<float> wide(probs.is_bf16() ? Vl : 0);
    for (std::size_t n = 0; n < N; ++n) {
      const float* x = span_f32(probs, n * Vl, Vl, wide);
      const std::size_t v = std::size_t(targets[n]) - v0;
      target[n] = v < Vl ? x[v] - mx[n] : 0.0f;
      float s = 0.0f;
      if (probs.is_bf16()) {  // the exps are not kept (xent_normalise_grad_bf16 recomputes them)
#pragma omp simd reduction(+ : s)
        for (std::size_t i = 0; i < Vl; ++i) s += cpu::vm::exp_approx(x[i] - mx[n]);
      } else {
        float* e = probs.f32() + n * Vl;
#pragma omp simd reduction(+ : s)
        for (std::size_t i = 0; i < Vl; ++i) {
          e[i] = cpu::vm::exp_approx(x[i] - mx[n]);
          s += e[i];
        }
      }
      sum[n] = s;
    }
  }
  void xent_normalise(float* probs, float* losses, const float* sum, const float* target,
                      std::size_t N, std::size_t Vl) override {
    for (std::size_t n = 0; n < N; ++n) {
      const float inv = 1.0f / sum[n];
      float* x = probs + n * Vl;
#pragma omp simd
      for (std::size_t i = 0; i < Vl; ++i) x[i] *= inv;
      losses[n] = float(std::log(double(sum[n])) - double(target[n]));
    }
  }
  void xent_backward_shard(float* dlogits, const float* probs, const std::int32_t* targets,
                           std::size_t v0, float scale, std::size_t N, std::size_t Vl) override {
    for (std::size_t n = 0; n < N; ++n) {
      float* dl = dlogits + n * Vl;
      const float* pr = probs + n * Vl;
#pragma omp simd
      for (std::size_t i = 0; i < Vl; ++i) dl[i] = pr[i] * scale;
      const std::size_t v = std::size_t(targets[n]) - v0;
      if (v < Vl) dl[v] -= scale;
    }
  }
  // A row at a time: widened, the fp32 path's softmax and loss (bit for bit), the onehot
  // subtracted, rounded back over the logits.
  void softmax_crossentropy_grad_bf16(bf16* logits, float* losses, const std::int32_t* targets,
                                      std::size_t N, std::size_t V) override {
    std::vector<float> row(V);
    for (std::size_t n = 0; n < N; ++n) {
      cpu::widen_bf16(row.data(), logits + n * V, V);
      cpu::softmax_crossentropy_forward(row.data(), losses + n, row.data(), targets + n, 1, int(V));
      row[std::size_t(targets[n])] -= 1.0f;
      cpu::round_to_bf16(logits + n * V, row.data(), V);
    }
  }
  // xent_exp's exps again from the widened row, then xent_normalise's steps.
  void xent_normalise_grad_bf16(bf16* logits, float* losses, const float* mx, const float* sum,
                                const float* target, const std::int32_t* targets, std::size_t v0,
                                std::size_t N, std::size_t Vl) override {
    std::vector<float> row(Vl);
    for (std::size_t n = 0; n < N; ++n) {
      cpu::widen_bf16(row.data(), logits + n * Vl, Vl);
      const float inv = 1.0f / sum[n];
#pragma omp simd
      for (std::size_t i = 0; i < Vl; ++i) row[i] = cpu::vm::exp_approx(row[i] - mx[n]) * inv;
      const std::size_t v = std::size_t(targets[n]) - v0;  // wraps for targets below v0
      if (v < Vl) row[v] -= 1.0f;
      cpu::round_to_bf16(logits + n * Vl, row.data(), Vl);
      losses[n] = float(std::log(double(sum[n])) - double(target[n]));
    }
  }
  void scale_bf16(bf16* x, float scale, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) x[i] = to_bf16(to_float(x[i]) * scale);
  }
  double sum(const float* x, std::size_t n) override {
    double s = 0.0;
    for (std::size_t i = 0; i < n; ++i) s += x[i];
    return s;
  }
};

}  // namespace

Kernels& cpu_kernels() {
  static CpuKernels kernels;
  return kernels;
}

}  // namespace strata
