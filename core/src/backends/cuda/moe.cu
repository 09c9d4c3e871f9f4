// The mixture-of-experts layer's pieces on a GPU, as cpu/layers.hpp defines them: top-k softmax
// routing and its backward (a thread per token), the sequence-wise load-balancing loss (a thread
// per sequence and expert, then per sequence: fixed summation orders), dispatch and combine over a
// plan's rows (a thread per element; every output written by one thread, no atomics).
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/device.hpp"
#include "backends/cuda/grid.cuh"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/layers.cuh"
#include "strata/types.hpp"

namespace strata::cuda {
namespace {

__global__ void router_topk_forward_kernel(float* probs, std::int32_t* experts, float* gates,
                                           const float* logits, std::int64_t N, int E, int k) {
  STRATA_GRID_STRIDE(n, std::size_t(N)) {
    const float* l = logits + n * E;
    float* p = probs + n * E;
    std::int32_t* ex = experts + n * k;
    float* g = gates + n * k;
    float mx = l[0];
    for (int e = 1; e < E; ++e) mx = fmaxf(mx, l[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) sum += (p[e] = expf(l[e] - mx));
    for (int e = 0; e < E; ++e) p[e] /= sum;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken = taken || ex[i] == e;
        if (!taken && (best < 0 || l[e] > l[best])) best = e;
      }
      ex[j] = best;
    }
    float gsum = 0.0f;
    for (int j = 0; j < k; ++j) gsum += (g[j] = expf(l[ex[j]] - l[ex[0]]));
    for (int j = 0; j < k; ++j) g[j] /= gsum;
  }
}

__global__ void router_topk_backward_kernel(float* dlogits, const float* probs,
                                            const std::int32_t* experts, const float* gates,
                                            const float* dgates, const float* dprobs,
                                            std::int64_t N, int E, int k) {
  STRATA_GRID_STRIDE(n, std::size_t(N)) {
    const float* p = probs + n * E;
    float* d = dlogits + n * E;
    float pdp = 0.0f;
    if (dprobs)
      for (int e = 0; e < E; ++e) pdp += p[e] * dprobs[n * E + e];
    for (int e = 0; e < E; ++e) d[e] = dprobs ? p[e] * (dprobs[n * E + e] - pdp) : 0.0f;
    float gdg = 0.0f;
    for (int j = 0; j < k; ++j) gdg += gates[n * k + j] * dgates[n * k + j];
    for (int j = 0; j < k; ++j)
      d[experts[n * k + j]] += gates[n * k + j] * (dgates[n * k + j] - gdg);
  }
}

// frac[b, e] = E / (k seq) x sequence b's choices of expert e (choices[b, e]); with probs,
// term[b, e] = frac x the sum of probs[:, e] over the rank's T tokens of it / seq.
__global__ void expert_fraction_kernel(float* frac, float* term, const float* probs,
                                       const std::int32_t* choices, int B, int T, int seq, int E,
                                       int k) {
  STRATA_GRID_STRIDE(i, std::size_t(std::int64_t(B) * E)) {
    const std::int64_t b = i / E;
    const int e = int(i % E);
    const float f = float(choices[i]) * (float(E) / float(std::int64_t(k) * seq));
    if (frac) frac[i] = f;
    if (term) {
      float P = 0.0f;
      for (std::int64_t t = 0; t < T; ++t) P += probs[(b * T + t) * E + e];
      term[i] = f * (P / float(seq));
    }
  }
}

__global__ void aux_loss_sum_kernel(float* loss, const float* term, int B, int E, float coef) {
  STRATA_GRID_STRIDE(b, std::size_t(B)) {
    float l = 0.0f;
    for (int e = 0; e < E; ++e) l += term[b * E + e];
    loss[b] = coef * l;
  }
}

__global__ void aux_loss_backward_kernel(float* dprobs, const float* frac, int B, int T, int seq,
                                         int E, float coef_scale) {
  STRATA_GRID_STRIDE(i, std::size_t(std::int64_t(B) * T * E)) {
    const std::int64_t b = i / (std::int64_t(T) * E);
    dprobs[i] = coef_scale * frac[b * E + i % E] / float(seq);
  }
}

// Rows copied as they are: 4-byte (fp32) or 2-byte (bf16) elements.
__global__ void moe_gather_kernel(void* out, const void* x, bool half, const std::int32_t* token_of,
                                  std::int64_t rows, int C) {
  STRATA_GRID_STRIDE(i, std::size_t(rows * C)) {
    const std::size_t from = std::size_t(token_of[i / C]) * C + i % C;
    if (half)
      static_cast<std::uint16_t*>(out)[i] = static_cast<const std::uint16_t*>(x)[from];
    else
      static_cast<float*>(out)[i] = static_cast<const float*>(x)[from];
  }
}

__global__ void moe_gather_backward_kernel(float* dx, const float* din, const std::int32_t* row_of,
                                           std::int64_t N, int k, int C) {
  STRATA_GRID_STRIDE(i, std::size_t(N * C)) {
    const std::int64_t n = i / C;
    float s = dx[i];
    for (int j = 0; j < k; ++j) {
      const std::int32_t r = row_of[n * k + j];
      if (r >= 0) s += din[std::int64_t(r) * C + i % C];
    }
    dx[i] = s;
  }
}

__global__ void moe_combine_kernel(float* y, const float* eout, const std::int32_t* row_of,
                                   const float* gates, std::int64_t N, int k, int C) {
  STRATA_GRID_STRIDE(i, std::size_t(N * C)) {
    const std::int64_t n = i / C;
    float s = 0.0f;
    for (int j = 0; j < k; ++j) {
      const std::int32_t r = row_of[n * k + j];
      if (r >= 0) s += gates[n * k + j] * eout[std::int64_t(r) * C + i % C];
    }
    y[i] = s;
  }
}

__global__ void moe_combine_backward_rows_kernel(float* deout, const float* dy,
                                                 const std::int32_t* row_of, const float* gates,
                                                 std::int64_t N, int k, int C) {
  STRATA_GRID_STRIDE(i, std::size_t(N * k * C)) {
    const std::int64_t choice = i / C;
    const std::int32_t r = row_of[choice];
    if (r >= 0) deout[std::int64_t(r) * C + i % C] = gates[choice] * dy[choice / k * C + i % C];
  }
}

__global__ void moe_combine_backward_gates_kernel(float* dgates, const float* dy, const float* eout,
                                                  const std::int32_t* row_of, std::int64_t N, int k,
                                                  int C) {
  STRATA_GRID_STRIDE(choice, std::size_t(N * k)) {
    const std::int32_t r = row_of[choice];
    float dot = 0.0f;
    if (r >= 0)
      for (int c = 0; c < C; ++c) dot += dy[choice / k * C + c] * eout[std::int64_t(r) * C + c];
    dgates[choice] = dot;
  }
}

}  // namespace

void router_topk_forward(const CudaContext& ctx, float* probs, std::int32_t* experts, float* gates,
                         const float* logits, int N, int E, int k) {
  if (N == 0) return;
  STRATA_LAUNCH(router_topk_forward_kernel, blocks_for(N), kThreads, 0, ctx.stream)
  (probs, experts, gates, logits, N, E, k);
  STRATA_CUDA_CHECK_LAUNCH();
}

void router_topk_backward(const CudaContext& ctx, float* dlogits, const float* probs,
                          const std::int32_t* experts, const float* gates, const float* dgates,
                          const float* dprobs, int N, int E, int k) {
  if (N == 0) return;
  STRATA_LAUNCH(router_topk_backward_kernel, blocks_for(N), kThreads, 0, ctx.stream)
  (dlogits, probs, experts, gates, dgates, dprobs, N, E, k);
  STRATA_CUDA_CHECK_LAUNCH();
}

void moe_aux_loss_forward(const CudaContext& ctx, float* loss, float* scratch, const float* probs,
                          const std::int32_t* choices, int B, int T, int seq, int E, int k,
                          float coef) {
  if (B == 0) return;
  STRATA_LAUNCH(expert_fraction_kernel, blocks_for(std::int64_t(B) * E), kThreads, 0, ctx.stream)
  (nullptr, scratch, probs, choices, B, T, seq, E, k);
  STRATA_CUDA_CHECK_LAUNCH();
  STRATA_LAUNCH(aux_loss_sum_kernel, blocks_for(B), kThreads, 0, ctx.stream)
  (loss, scratch, B, E, coef);
  STRATA_CUDA_CHECK_LAUNCH();
}

void moe_aux_loss_backward(const CudaContext& ctx, float* dprobs, float* scratch,
                           const std::int32_t* choices, int B, int T, int seq, int E, int k,
                           float coef_scale) {
  if (B == 0) return;
  STRATA_LAUNCH(expert_fraction_kernel, blocks_for(std::int64_t(B) * E), kThreads, 0, ctx.stream)
  (scratch, nullptr, nullptr, choices, B, T, seq, E, k);
  STRATA_CUDA_CHECK_LAUNCH();
  const std::int64_t n = std::int64_t(B) * T * E;
  STRATA_LAUNCH(aux_loss_backward_kernel, blocks_for(n), kThreads, 0, ctx.stream)
  (dprobs, scratch, B, T, seq, E, coef_scale);
  STRATA_CUDA_CHECK_LAUNCH();
}

void moe_gather(const CudaContext& ctx, ActView out, ActView x, const std::int32_t* token_of,
                int rows, int C) {
  if (out.dtype != x.dtype) throw Error("moe_gather: x and out in different dtypes");
  const std::int64_t n = std::int64_t(rows) * C;
  if (n == 0) return;
  STRATA_LAUNCH(moe_gather_kernel, blocks_for(n), kThreads, 0, ctx.stream)
  (out.data, x.data, out.is_bf16(), token_of, rows, C);
  STRATA_CUDA_CHECK_LAUNCH();
}

void moe_gather_backward(const CudaContext& ctx, float* dx, const float* din,
                         const std::int32_t* row_of, int N, int k, int C) {
  const std::int64_t n = std::int64_t(N) * C;
  if (n == 0) return;
  STRATA_LAUNCH(moe_gather_backward_kernel, blocks_for(n), kThreads, 0, ctx.stream)
  (dx, din, row_of, N, k, C);
  STRATA_CUDA_CHECK_LAUNCH();
}

void moe_combine(const CudaContext& ctx, float* y, const float* eout, const std::int32_t* row_of,
                 const float* gates, int N, int k, int C) {
  const std::int64_t n = std::int64_t(N) * C;
  if (n == 0) return;
  STRATA_LAUNCH(moe_combine_kernel, blocks_for(n), kThreads, 0, ctx.stream)
  (y, eout, row_of, gates, N, k, C);
  STRATA_CUDA_CHECK_LAUNCH();
}

void moe_combine_backward(const CudaContext& ctx, float* deout, float* dgates, const float* dy,
                          const float* eout, const std::int32_t* row_of, const float* gates, int N,
                          int k, int C) {
  const std::int64_t choices = std::int64_t(N) * k;
  if (choices == 0) return;
  STRATA_LAUNCH(moe_combine_backward_rows_kernel, blocks_for(choices * C), kThreads, 0, ctx.stream)
  (deout, dy, row_of, gates, N, k, C);
  STRATA_CUDA_CHECK_LAUNCH();
  STRATA_LAUNCH(moe_combine_backward_gates_kernel, blocks_for(choices), kThreads, 0, ctx.stream)
  (dgates, dy, eout, row_of, N, k, C);
  STRATA_CUDA_CHECK_LAUNCH();
}

}  // namespace strata::cuda
