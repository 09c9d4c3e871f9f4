// The CPU backend's kernels (kernels.hpp): the layer passes of cpu/layers.hpp, the bf16 GEMMs of
// cpu/gemm_bf16.hpp, and the elementwise steps of the model's passes, on host memory.
#include <algorithm>
#include <cmath>
#include <cstring>

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
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C) override {
    cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int C, int OC) override {
    cpu::matmul_forward(out, inp, weight, bias, N, C, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int C, int OC) override {
    cpu::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C,
                         int NH) override {
    cpu::attention_forward(out, att, qkv, B, T, C, NH);
  }
  void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                          const float* att, const float*, int B, int T, int C, int NH) override {
    cpu::attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH);
  }
  void gelu_forward(float* out, const float* inp, std::int64_t n) override {
    cpu::gelu_forward(out, inp, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) override {
    cpu::gelu_backward(dinp, inp, dout, n);
  }
  void residual_forward(float* out, const float* a, const float* b, std::int64_t n) override {
    cpu::residual_forward(out, a, b, n);
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
  // The three steps ModelPasses ran before this entry existed: the same arithmetic.
  void matmul_bf16_forward(float* out, float* gelu_out, const bf16* inp, const bf16* weight,
                           const float* bias, int N, int C, int OC, void* scratchpad,
                           std::size_t scratchpad_bytes) override {
    gemm_bf16(false, true, N, OC, C, inp, weight, out, DType::f32, false, scratchpad,
              scratchpad_bytes);
    if (bias) add_bias(out, bias, std::size_t(N), OC);
    if (gelu_out) gelu_forward(gelu_out, out, std::int64_t(N) * OC);
  }

  void zero(float* p, std::size_t n) override { std::memset(p, 0, n * sizeof(float)); }
  void add_bias(float* out, const float* bias, std::size_t rows, int C) override {
    for (std::size_t n = 0; n < rows; ++n)
#pragma omp simd
      for (int c = 0; c < C; ++c) out[n * C + c] += bias[c];
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
  void add_positions(float* x, BufferView wpe, std::size_t rows, std::size_t row0, int T,
                     int C) override {
    for (std::size_t i = 0; i < rows; ++i) {
      const std::size_t t = (row0 + i) % T;
      float* out = x + i * C;
      if (wpe.dtype == DType::f32) {
        const float* pos = static_cast<const float*>(wpe.data) + t * C;
        for (int c = 0; c < C; ++c) out[c] += pos[c];
      } else {  // bf16 widened as it is added: no scratch row on every call
        const bf16* pos = static_cast<const bf16*>(wpe.data) + t * C;
        for (int c = 0; c < C; ++c) out[c] += to_float(pos[c]);
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

  void xent_row_max(float* mx, const float* logits, std::size_t N, std::size_t Vl) override {
    for (std::size_t n = 0; n < N; ++n) {
      const float* x = logits + n * Vl;
      mx[n] = *std::max_element(x, x + Vl);
    }
  }
  void xent_exp(float* probs, float* sum, float* target, const float* mx,
                const std::int32_t* targets, std::size_t v0, std::size_t N,
                std::size_t Vl) override {
    for (std::size_t n = 0; n < N; ++n) {
      float* x = probs + n * Vl;
      const std::size_t v = std::size_t(targets[n]) - v0;
      target[n] = v < Vl ? x[v] - mx[n] : 0.0f;
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (std::size_t i = 0; i < Vl; ++i) {
        const float e = cpu::vm::exp_approx(x[i] - mx[n]);
        x[i] = e;
        s += e;
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
  // The fp32 path's softmax and losses in place over the logits (bit for bit), then the onehot
  // subtracted and the rows rounded.
  void softmax_crossentropy_grad_bf16(bf16* dlogits, float* losses, float* logits,
                                      const std::int32_t* targets, std::size_t N,
                                      std::size_t V) override {
    cpu::softmax_crossentropy_forward(logits, losses, logits, targets, int(N), int(V));
    for (std::size_t n = 0; n < N; ++n) logits[n * V + std::size_t(targets[n])] -= 1.0f;
    cpu::round_to_bf16(dlogits, logits, N * V);
  }
  void xent_normalise_grad_bf16(bf16* dlogits, float* losses, float* exps, const float* sum,
                                const float* target, const std::int32_t* targets, std::size_t v0,
                                std::size_t N, std::size_t Vl) override {
    xent_normalise(exps, losses, sum, target, N, Vl);
    for (std::size_t n = 0; n < N; ++n) {
      const std::size_t v = std::size_t(targets[n]) - v0;  // wraps for targets below v0
      if (v < Vl) exps[n * Vl + v] -= 1.0f;
    }
    cpu::round_to_bf16(dlogits, exps, N * Vl);
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
