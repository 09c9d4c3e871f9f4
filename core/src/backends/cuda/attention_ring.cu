// Ring attention's blocks on a GPU, as cpu/layers.hpp defines them (Kernels::
// attention_block_forward / _backward): a thread per (sequence, query head, query) for the forward
// and for d(q), a thread per (sequence, K/V head, key) for d(k) and d(v), so every output is
// written by one thread (no atomics) in a fixed order. fp32 arithmetic on fp32 or bf16 inputs. The
// context-parallel path's kernels, for correctness on every shape: not tiled, not tensor-core.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backends/cuda/bf16.cuh"
#include "backends/cuda/device.hpp"
#include "backends/cuda/grid.cuh"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/layers.cuh"

namespace strata::cuda {
namespace {

// The shape of one block's launch: queries q [B, Tq] (rows of q_stride), keys and values
// kv [B, Tk, 2, KV, hs], NH query heads of hs.
struct RingShape {
  int B, Tq, Tk, NH, KV, hs, q_stride;
  TokenPositions qpos, kpos;
};

__device__ __forceinline__ int position_of(const TokenPositions& p, int t) {
  return t < p.chunk ? p.first + t : p.second + t - p.chunk;
}

// q_i . k_j of query row `row` (head h) and key j of sequence b.
__device__ __forceinline__ float score(const RingShape& s, const void* q, const void* kv, bool half,
                                       std::int64_t row, int h, int b, int j) {
  const std::size_t qi = std::size_t(row) * s.q_stride + std::size_t(h) * s.hs;
  const std::size_t kj =
      (std::size_t(b) * s.Tk + j) * 2 * s.KV * s.hs + std::size_t(h / (s.NH / s.KV)) * s.hs;
  float d = 0.0f;
  for (int c = 0; c < s.hs; ++c) d += load(q, half, qi + c) * load(kv, half, kj + c);
  return d * rsqrtf(float(s.hs));
}

__global__ void ring_block_forward_kernel(float* o, float* lse, const void* q, const void* kv,
                                          bool half, RingShape s, bool first) {
  STRATA_GRID_STRIDE(idx, std::size_t(s.B) * s.NH * s.Tq) {
    const int i = int(idx % s.Tq), h = int(idx / s.Tq % s.NH), b = int(idx / s.Tq / s.NH);
    const std::int64_t row = std::int64_t(b) * s.Tq + i;
    const int qp = position_of(s.qpos, i);
    float mx = -INFINITY;
    for (int j = 0; j < s.Tk; ++j)
      if (position_of(s.kpos, j) <= qp) mx = fmaxf(mx, score(s, q, kv, half, row, h, b, j));
    float* oi = o + std::size_t(row) * s.NH * s.hs + std::size_t(h) * s.hs;
    float* l = lse + (std::size_t(b) * s.NH + h) * s.Tq + i;
    if (mx == -INFINITY) {  // no key of this block is visible: nothing to merge
      if (first) {
        for (int c = 0; c < s.hs; ++c) oi[c] = 0.0f;
        *l = -INFINITY;
      }
      continue;
    }
    float sum = 0.0f;
    for (int j = 0; j < s.Tk; ++j)
      if (position_of(s.kpos, j) <= qp) sum += expf(score(s, q, kv, half, row, h, b, j) - mx);
    const float block = mx + logf(sum);
    const float merged = first ? block : fmaxf(*l, block) + log1pf(expf(-fabsf(*l - block)));
    const float keep = first ? 0.0f : expf(*l - merged);
    for (int c = 0; c < s.hs; ++c) oi[c] = first ? 0.0f : oi[c] * keep;
    const int g = h / (s.NH / s.KV);
    for (int j = 0; j < s.Tk; ++j) {
      if (position_of(s.kpos, j) > qp) continue;
      const float p = expf(score(s, q, kv, half, row, h, b, j) - merged);
      const std::size_t vj =
          ((std::size_t(b) * s.Tk + j) * 2 + 1) * s.KV * s.hs + std::size_t(g) * s.hs;
      for (int c = 0; c < s.hs; ++c) oi[c] += p * load(kv, half, vj + c);
    }
    *l = merged;
  }
}

// dout . out of query row `row`, head h: the backward's D.
__device__ __forceinline__ float row_delta(const RingShape& s, const float* dout, const void* out,
                                           bool out_half, std::int64_t row, int h) {
  const std::size_t at = std::size_t(row) * s.NH * s.hs + std::size_t(h) * s.hs;
  float d = 0.0f;
  for (int c = 0; c < s.hs; ++c) d += dout[at + c] * load(out, out_half, at + c);
  return d;
}

// dout_i . v_j (head h of query row `row`, key j of sequence b).
__device__ __forceinline__ float dout_v(const RingShape& s, const float* dout, const void* kv,
                                        bool half, std::int64_t row, int h, int b, int j) {
  const std::size_t at = std::size_t(row) * s.NH * s.hs + std::size_t(h) * s.hs;
  const std::size_t vj =
      ((std::size_t(b) * s.Tk + j) * 2 + 1) * s.KV * s.hs + std::size_t(h / (s.NH / s.KV)) * s.hs;
  float d = 0.0f;
  for (int c = 0; c < s.hs; ++c) d += dout[at + c] * load(kv, half, vj + c);
  return d;
}

__global__ void ring_block_dq_kernel(float* dq, int dq_stride, const float* dout, const void* out,
                                     bool out_half, const float* lse, const void* q, const void* kv,
                                     bool half, RingShape s) {
  STRATA_GRID_STRIDE(idx, std::size_t(s.B) * s.NH * s.Tq) {
    const int i = int(idx % s.Tq), h = int(idx / s.Tq % s.NH), b = int(idx / s.Tq / s.NH);
    const std::int64_t row = std::int64_t(b) * s.Tq + i;
    const int qp = position_of(s.qpos, i);
    const float D = row_delta(s, dout, out, out_half, row, h);
    const float l = lse[(std::size_t(b) * s.NH + h) * s.Tq + i];
    float* dqi = dq + std::size_t(row) * dq_stride + std::size_t(h) * s.hs;
    const float scale = rsqrtf(float(s.hs));
    for (int j = 0; j < s.Tk; ++j) {
      if (position_of(s.kpos, j) > qp) continue;
      const float p = expf(score(s, q, kv, half, row, h, b, j) - l);
      const float ds = p * (dout_v(s, dout, kv, half, row, h, b, j) - D) * scale;
      const std::size_t kj =
          (std::size_t(b) * s.Tk + j) * 2 * s.KV * s.hs + std::size_t(h / (s.NH / s.KV)) * s.hs;
      for (int c = 0; c < s.hs; ++c) dqi[c] += ds * load(kv, half, kj + c);
    }
  }
}

__global__ void ring_block_dkv_kernel(float* dkv, const float* dout, const void* out, bool out_half,
                                      const float* lse, const void* q, const void* kv, bool half,
                                      RingShape s) {
  STRATA_GRID_STRIDE(idx, std::size_t(s.B) * s.KV * s.Tk) {
    const int j = int(idx % s.Tk), g = int(idx / s.Tk % s.KV), b = int(idx / s.Tk / s.KV);
    const int kp = position_of(s.kpos, j), group = s.NH / s.KV;
    const std::size_t kj = (std::size_t(b) * s.Tk + j) * 2 * s.KV * s.hs + std::size_t(g) * s.hs;
    float *dk = dkv + kj, *dv = dkv + kj + std::size_t(s.KV) * s.hs;
    const float scale = rsqrtf(float(s.hs));
    for (int h = g * group; h < (g + 1) * group; ++h)
      for (int i = 0; i < s.Tq; ++i) {
        if (kp > position_of(s.qpos, i)) continue;
        const std::int64_t row = std::int64_t(b) * s.Tq + i;
        const float l = lse[(std::size_t(b) * s.NH + h) * s.Tq + i];
        const float p = expf(score(s, q, kv, half, row, h, b, j) - l);
        const float ds =
            p *
            (dout_v(s, dout, kv, half, row, h, b, j) - row_delta(s, dout, out, out_half, row, h)) *
            scale;
        const std::size_t qi = std::size_t(row) * s.q_stride + std::size_t(h) * s.hs;
        const std::size_t at = std::size_t(row) * s.NH * s.hs + std::size_t(h) * s.hs;
        for (int c = 0; c < s.hs; ++c) {
          dk[c] += ds * load(q, half, qi + c);
          dv[c] += p * dout[at + c];
        }
      }
  }
}

}  // namespace

void attention_block_forward(const CudaContext& ctx, float* o, float* lse, ActView q, int q_stride,
                             ActView kv, int B, int Tq, int Tk, int NH, int KV, int hs,
                             TokenPositions qpos, TokenPositions kpos, bool first) {
  if (q.dtype != kv.dtype) throw Error("attention_block_forward: q and kv in different dtypes");
  const RingShape s{B, Tq, Tk, NH, KV, hs, q_stride, qpos, kpos};
  const std::size_t n = std::size_t(B) * NH * Tq;
  if (n == 0) return;
  STRATA_LAUNCH(ring_block_forward_kernel, blocks_for(n), kThreads, 0, ctx.stream)
  (o, lse, q.data, kv.data, q.is_bf16(), s, first);
  STRATA_CUDA_CHECK_LAUNCH();
}

void attention_block_backward(const CudaContext& ctx, float* dq, int dq_stride, float* dkv,
                              const float* dout, ActView out, const float* lse, ActView q,
                              int q_stride, ActView kv, int B, int Tq, int Tk, int NH, int KV,
                              int hs, TokenPositions qpos, TokenPositions kpos) {
  if (q.dtype != kv.dtype) throw Error("attention_block_backward: q and kv in different dtypes");
  const RingShape s{B, Tq, Tk, NH, KV, hs, q_stride, qpos, kpos};
  const std::size_t rows = std::size_t(B) * NH * Tq, keys = std::size_t(B) * KV * Tk;
  if (rows == 0 || keys == 0) return;
  STRATA_LAUNCH(ring_block_dq_kernel, blocks_for(rows), kThreads, 0, ctx.stream)
  (dq, dq_stride, dout, out.data, out.is_bf16(), lse, q.data, kv.data, q.is_bf16(), s);
  STRATA_CUDA_CHECK_LAUNCH();
  STRATA_LAUNCH(ring_block_dkv_kernel, blocks_for(keys), kThreads, 0, ctx.stream)
  (dkv, dout, out.data, out.is_bf16(), lse, q.data, kv.data, q.is_bf16(), s);
  STRATA_CUDA_CHECK_LAUNCH();
}

}  // namespace strata::cuda
