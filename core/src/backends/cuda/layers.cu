// CUDA layer passes of the GPT-2 workload (see layers.cuh for shapes and the += convention), llm.c
// style: one kernel per layer pass, cuBLAS for every matrix product.
//
// Row-major GEMMs through column-major cuBLAS: a row-major X[r,c] with leading dimension l is the
// column-major X^T[c,r] with the same l, so row-major  C = op(A) @ op(B)  is issued as the
// column-major  C^T = op(B)^T @ op(A)^T,  i.e. cuBLAS(opB, opA, m = cols(C), n = rows(C), k, B, A).
//
// Attention: per batch b, one cublasSgemmStridedBatched over the NH heads (q, k, v of head h are
// the hs columns at h*hs inside qkv, so heads are a constant stride hs apart; the T x T blocks of
// att are T*T apart). The full T x T score matrix is computed and the causal softmax zeroes the
// upper triangle, exactly as the CPU reference does. TODO(perf): fused memory-efficient attention.
//
// fp32 only (CUBLAS_DEFAULT_MATH: no TF32). TODO(bf16): bf16 storage, fp32 accumulation.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "backends/cuda/bf16.cuh"
#include "backends/cuda/device.hpp"
#include "backends/cuda/gelu.cuh"
#include "backends/cuda/grid.cuh"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/layers.cuh"

namespace strata::cuda {

namespace {

constexpr float kLayerNormEps = 1e-5f;
constexpr int kBlock = 256;  // threads per block of the elementwise kernels
constexpr int kWarpsPerBlock = kBlock / 32;
constexpr std::int64_t kMaxGrid = 1 << 20;  // elementwise kernels loop (grid-stride) beyond this

// Blocks for an elementwise kernel over n items, kBlock threads each, capped (grid-stride loops).
unsigned grid_for(std::int64_t n) {
  return unsigned(std::min<std::int64_t>((n + kBlock - 1) / kBlock, kMaxGrid));
}

// Blocks for a warp-per-row kernel over `rows` rows.
unsigned grid_for_rows(std::int64_t rows) {
  return unsigned(std::min<std::int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxGrid));
}

// --- Reductions -------------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) over the whole block; every thread gets the result. blockDim.x % 32 == 0.
template <bool kMax>
__device__ float block_reduce(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  const float identity = kMax ? -INFINITY : 0.0f;
  v = kMax ? warp_max(v) : warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float r = lane < nwarps ? partial[lane] : identity;
  r = kMax ? warp_max(r) : warp_sum(r);
  __syncthreads();  // partial may be reused by the next call
  return r;
}

// --- Kernels ----------------------------------------------------------------------------------

// out[N,C] = wte[tokens[n], :] + wpe[n % T, :]; one thread per output element.
__global__ void encoder_forward_kernel(float* out,                  // [N, C]
                                       const std::int32_t* tokens,  // [N]
                                       const float* wte,            // [V, C]
                                       const float* wpe,            // [T, C]
                                       std::int64_t N, int T, int C) {
  const std::int64_t total = N * C;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t n = i / C;
    const int c = int(i % C), t = int(n % T);
    out[i] = wte[std::int64_t(tokens[n]) * C + c] + wpe[std::int64_t(t) * C + c];
  }
}

// dwte[tokens[n], :] += dout[n, :], dwpe[n % T, :] += dout[n, :]; one thread per dout element.
__global__ void encoder_backward_kernel(float* dwte,                 // [V, C] +=
                                        float* dwpe,                 // [T, C] +=
                                        const float* dout,           // [N, C]
                                        const std::int32_t* tokens,  // [N]
                                        std::int64_t N, int T, int C) {
  const std::int64_t total = N * C;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t n = i / C;
    const int c = int(i % C), t = int(n % T);
    const float d = dout[i];
    atomicAdd(dwte + std::int64_t(tokens[n]) * C + c, d);
    atomicAdd(dwpe + std::int64_t(t) * C + c, d);
  }
}

// One warp per row: mean, biased variance (two passes, fp32), normalise, scale and shift.
// With `a` (not null) the row is first sum = a + x (the residual add; sum may be a or x), written
// rounded to sum's dtype by the lane that reads it back: residual_forward then layernorm_forward
// of the stored sum, the same values in one pass. x (the residual stream) and sum fp32 or bf16.
__global__ void layernorm_forward_kernel(void* out,            // [N, C] fp32 or bf16
                                         bool out_bf16,        //
                                         float* mean,          // [N]
                                         float* rstd,          // [N]
                                         void* sum,            // [N, C] or null
                                         bool sum_bf16,        //
                                         const float* a,       // [N, C] or null
                                         const void* x,        // [N, C]
                                         bool x_bf16,          //
                                         const float* weight,  // [C]
                                         const float* bias,    // [C]
                                         int N, int C) {
  const int lane = threadIdx.x % 32;
  for (std::int64_t row = blockIdx.x * std::int64_t(kWarpsPerBlock) + threadIdx.x / 32; row < N;
       row += std::int64_t(gridDim.x) * kWarpsPerBlock) {
    const std::size_t r0 = std::size_t(row) * std::size_t(C);
    const void* in = x;
    bool in_bf16 = x_bf16;
    if (a) {
      for (int i = lane; i < C; i += 32)
        store(sum, sum_bf16, r0 + i, a[r0 + i] + load(x, x_bf16, r0 + i));
      in = sum;
      in_bf16 = sum_bf16;
    }
    float s = 0.0f;
    for (int i = lane; i < C; i += 32) s += load(in, in_bf16, r0 + i);
    const float m = warp_sum(s) / float(C);
    float v = 0.0f;
    for (int i = lane; i < C; i += 32) {
      const float d = load(in, in_bf16, r0 + i) - m;
      v += d * d;
    }
    const float r = 1.0f / sqrtf(warp_sum(v) / float(C) + kLayerNormEps);
    for (int i = lane; i < C; i += 32)
      store(out, out_bf16, r0 + i, (load(in, in_bf16, r0 + i) - m) * r * weight[i] + bias[i]);
    if (lane == 0) {
      mean[row] = m;
      rstd[row] = r;
    }
  }
}

// A norm's backward, one warp per row, LayerNorm (kCentered: the mean subtracted, a bias) or
// RMSNorm (mean 0, no bias):
//   xhat = (x - m) * rstd, g = dout * weight:  dinp += rstd * (g - mean(g) - xhat * mean(g xhat))
// (RMSNorm without the mean(g) term). The column sums dweight = sum dout xhat (and dbias = sum
// dout): each warp adds its rows' terms into its own slice of shared memory, [P, C] floats
// (P = 2, or 1), where each lane owns its columns (no atomics); the block then writes the sum of
// its warps' slices, in warp order, to partial[blockIdx.x] [P, C], which add_chunk_sums adds up
// in block order. The same sums in every run, and no global atomics (which serialize every block
// on each column's address).
template <bool kCentered>
__global__ void norm_backward_kernel(float* partial,       // [gridDim.x, P, C] =
                                     float* dinp,          // [N, C] +=
                                     const float* dout,    // [N, C]
                                     const void* inp,      // [N, C] fp32 or bf16
                                     bool inp_bf16,        //
                                     const float* weight,  // [C]
                                     const float* mean,    // [N] (LayerNorm)
                                     const float* rstd,    // [N]
                                     int N, int C) {
  constexpr int P = kCentered ? 2 : 1;
  STRATA_DYNAMIC_SHARED(float, shared);  // [warps, P, C]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float* s_dweight = shared + std::size_t(warp) * P * C;
  float* s_dbias = s_dweight + C;  // kCentered only
  for (int i = lane; i < P * C; i += 32) s_dweight[i] = 0.0f;
  for (std::int64_t row = blockIdx.x * std::int64_t(warps) + warp; row < N;
       row += std::int64_t(gridDim.x) * warps) {
    const std::size_t r0 = std::size_t(row) * std::size_t(C);
    const float* d = dout + r0;
    const float m = kCentered ? mean[row] : 0.0f, r = rstd[row];
    float gsum = 0.0f, gxsum = 0.0f;
    for (int i = lane; i < C; i += 32) {
      const float g = d[i] * weight[i];
      if (kCentered) gsum += g;
      gxsum += g * ((load(inp, inp_bf16, r0 + i) - m) * r);
    }
    const float gmean = kCentered ? warp_sum(gsum) / float(C) : 0.0f;
    const float gxmean = warp_sum(gxsum) / float(C);
    for (int i = lane; i < C; i += 32) {
      const float xhat = (load(inp, inp_bf16, r0 + i) - m) * r, di = d[i];
      if (kCentered) s_dbias[i] += di;
      s_dweight[i] += di * xhat;
      dinp[r0 + i] += r * (di * weight[i] - gmean - xhat * gxmean);
    }
  }
  __syncthreads();
  float* out = partial + std::size_t(blockIdx.x) * P * C;
  for (int i = threadIdx.x; i < P * C; i += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < warps; ++w) sum += shared[std::size_t(w) * P * C + i];
    out[i] = sum;
  }
}

// RMSNorm, one warp per row: rstd = 1 / sqrt(mean(x^2) + eps), out = x * rstd * weight.
// out and inp fp32 or bf16 (widened as read, out rounded once).
__global__ void rmsnorm_forward_kernel(void* out, bool out_bf16,        // [N, C]
                                       float* rstd,                     // [N]
                                       const void* inp, bool inp_bf16,  // [N, C]
                                       const float* weight,             // [C]
                                       int N, int C) {
  const int lane = threadIdx.x % 32;
  for (std::int64_t row = blockIdx.x * std::int64_t(kWarpsPerBlock) + threadIdx.x / 32; row < N;
       row += std::int64_t(gridDim.x) * kWarpsPerBlock) {
    const std::size_t at = std::size_t(row) * C;
    float ss = 0.0f;
    for (int i = lane; i < C; i += 32) {
      const float x = load(inp, inp_bf16, at + i);
      ss += x * x;
    }
    const float r = 1.0f / sqrtf(warp_sum(ss) / float(C) + kLayerNormEps);
    for (int i = lane; i < C; i += 32)
      store(out, out_bf16, at + i, load(inp, inp_bf16, at + i) * r * weight[i]);
    if (lane == 0) rstd[row] = r;
  }
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// out[n, i] = silu(gu[n, i]) * gu[n, F + i]; out and gu fp32 or bf16.
__global__ void swiglu_forward_kernel(void* out, bool out_bf16, const void* gu, bool gu_bf16,
                                      std::int64_t N, int F) {
  const std::int64_t total = N * F;
  for (std::int64_t k = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; k < total;
       k += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t n = k / F, i = k % F;
    const float g = load(gu, gu_bf16, n * 2 * F + i), u = load(gu, gu_bf16, n * 2 * F + F + i);
    store(out, out_bf16, k, g * sigmoid(g) * u);
  }
}

// dgu[n, i] += dout up silu'(gate), dgu[n, F + i] += dout silu(gate).
__global__ void swiglu_backward_kernel(float* dgu, const void* gu, bool gu_bf16, const float* dout,
                                       std::int64_t N, int F) {
  const std::int64_t total = N * F;
  for (std::int64_t k = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; k < total;
       k += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t n = k / F, i = k % F;
    const float g = load(gu, gu_bf16, n * 2 * F + i), u = load(gu, gu_bf16, n * 2 * F + F + i),
                d = dout[k];
    const float sg = sigmoid(g);
    dgu[n * 2 * F + i] += d * u * (sg * (1.0f + g * (1.0f - sg)));
    dgu[n * 2 * F + F + i] += d * g * sg;
  }
}

// One thread per (row, head, pair): the pair turned by the table's angle (sign -1: back); x fp32
// or bf16, turned in place.
__global__ void rope_kernel(void* x, bool x_bf16, const float* table, std::int64_t N, int T,
                            int row0, int heads, int hs, int row_stride, float sign) {
  const int pairs = hs / 2;
  const std::int64_t total = N * heads * pairs;
  for (std::int64_t k = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; k < total;
       k += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t n = k / (std::int64_t(heads) * pairs);
    const int h = int(k / pairs % heads), i = int(k % pairs);
    const float* cs = table + (std::int64_t((row0 + n) % T) * pairs + i) * 2;
    const float c = cs[0], s = sign * cs[1];
    const std::size_t at = std::size_t(n) * row_stride + std::size_t(h) * hs + 2 * i;
    const float a = load(x, x_bf16, at), b = load(x, x_bf16, at + 1);
    store(x, x_bf16, at, __fadd_rn(__fmul_rn(a, c), -__fmul_rn(b, s)));
    store(x, x_bf16, at + 1, __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)));
  }
}

// Grouped-query attention's K/V for every query head: row n of in [N, (NH + 2 KV) hs] is q | k |
// v with KV heads in k and v; out [N, 3 NH hs] the same q and each K/V head repeated NH / KV times
// (query head h reads K/V head h / (NH / KV)), fp32 or bf16 (the same dtype both sides).
__global__ void repeat_kv_forward_kernel(void* out, const void* in, bool bf16, std::int64_t N,
                                         int NH, int KV, int hs) {
  const std::int64_t C = std::int64_t(NH) * hs, in_row = C + 2 * std::int64_t(KV) * hs;
  const std::int64_t total = N * 3 * C;
  const int rep = NH / KV;
  for (std::int64_t k = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; k < total;
       k += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t n = k / (3 * C), j = k % (3 * C);
    std::int64_t src = j;  // q
    if (j >= C) {          // k or v: part 1 or 2, head h of that part reads K/V head h / rep
      const std::int64_t part = j / C, h = j % C / hs, e = j % hs;
      src = C + (part - 1) * KV * hs + (h / rep) * hs + e;
    }
    store(out, bf16, std::size_t(k), load(in, bf16, std::size_t(n * in_row + src)));
  }
}

// Its backward: din[n, q] = dout's q; din's K/V head g = the sum over its query heads g * rep ..
// (g + 1) * rep - 1 in head order (=, not +=).
__global__ void repeat_kv_backward_kernel(float* din, const float* dout, std::int64_t N, int NH,
                                          int KV, int hs) {
  const std::int64_t C = std::int64_t(NH) * hs, in_row = C + 2 * std::int64_t(KV) * hs;
  const std::int64_t total = N * in_row;
  const int rep = NH / KV;
  for (std::int64_t k = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; k < total;
       k += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t n = k / in_row, j = k % in_row;
    const float* d = dout + n * 3 * C;
    if (j < C) {
      din[k] = d[j];
      continue;
    }
    const std::int64_t kv_row = std::int64_t(KV) * hs, part = (j - C) / kv_row,
                       g = (j - C) % kv_row / hs, e = j % hs;
    float sum = 0.0f;
    for (int r = 0; r < rep; ++r) sum += d[(part + 1) * C + (g * rep + r) * hs + e];
    din[k] = sum;
  }
}

// out[n, :] = bias, before a beta = 1 GEMM adds inp @ weight^T.
__global__ void broadcast_bias_kernel(float* out,         // [N, OC]
                                      const float* bias,  // [OC]
                                      std::int64_t N, int OC) {
  const std::int64_t total = N * OC;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x)
    out[i] = bias[i % OC];
}

// dbias[oc] += sum_n dout[n, oc]. Block (32, 8): 32 adjacent columns (coalesced rows), 8 row
// strides, then a fixed-order reduction in shared memory (deterministic, no atomics).
__global__ void column_sum_kernel(float* dbias,       // [OC] +=
                                  const float* dout,  // [N, OC]
                                  int N, int OC) {
  __shared__ float partial[8][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  if (col < OC)
    for (int n = threadIdx.y; n < N; n += 8) s += dout[std::int64_t(n) * OC + col];
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < OC) {
    float total = 0.0f;
    for (int y = 0; y < 8; ++y) total += partial[y][threadIdx.x];
    dbias[col] += total;
  }
}

// Causal softmax in place, one warp per row of a T x T block: row t keeps columns 0..t, the rest
// become 0. The scores already carry the 1/sqrt(hs) scale (applied in the GEMM).
__global__ void causal_softmax_forward_kernel(float* att,  // [B*NH*T, T] scores in, probs out
                                              std::int64_t rows, int T) {
  const int lane = threadIdx.x % 32;
  for (std::int64_t row = blockIdx.x * std::int64_t(kWarpsPerBlock) + threadIdx.x / 32; row < rows;
       row += std::int64_t(gridDim.x) * kWarpsPerBlock) {
    float* p = att + row * T;
    const int t = int(row % T);
    float mx = -INFINITY;
    for (int j = lane; j <= t; j += 32) mx = fmaxf(mx, p[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j <= t; j += 32) {
      const float e = expf(p[j] - mx);
      p[j] = e;
      sum += e;
    }
    const float inv = 1.0f / warp_sum(sum);
    for (int j = lane; j < T; j += 32) p[j] = j <= t ? p[j] * inv : 0.0f;
  }
}

// Softmax backward in place, one warp per row: dS = P * (dP - rowsum(P * dP)), 0 above the
// diagonal.
__global__ void causal_softmax_backward_kernel(float* datt,       // [B*NH*T, T] dP in, dS out
                                               const float* att,  // [B*NH*T, T] P
                                               std::int64_t rows, int T) {
  const int lane = threadIdx.x % 32;
  for (std::int64_t row = blockIdx.x * std::int64_t(kWarpsPerBlock) + threadIdx.x / 32; row < rows;
       row += std::int64_t(gridDim.x) * kWarpsPerBlock) {
    const float* p = att + row * T;
    float* d = datt + row * T;
    const int t = int(row % T);
    float dot = 0.0f;
    for (int j = lane; j <= t; j += 32) dot += p[j] * d[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += 32) d[j] = j <= t ? p[j] * (d[j] - dot) : 0.0f;
  }
}

// GELU(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3); E the element, float or a
// bf16's 16 bits (a bf16 run's FC layer: 4 bytes an element moved instead of 8).
__device__ __forceinline__ float to_element(float v, float) { return v; }
__device__ __forceinline__ std::uint16_t to_element(float v, std::uint16_t) {
  return float_to_bf16(v);
}
template <class E>
__global__ void gelu_forward_kernel(E* out,        // [n]
                                    const E* inp,  // [n]
                                    std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const float x = widen(inp[i]);
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    out[i] = to_element(0.5f * x * (1.0f + tanhf(u)), E{});
  }
}

// dinp += GELU'(x) dout (gelu.cuh).
__global__ void gelu_backward_kernel(float* dinp,        // [n] +=
                                     const float* inp,   // [n]
                                     const float* dout,  // [n]
                                     std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    dinp[i] += gelu_local_grad(inp[i]) * dout[i];
  }
}

__global__ void residual_forward_kernel(void* out,       // [n] fp32 or bf16
                                        bool out_bf16,   //
                                        const float* a,  // [n]
                                        const void* b,   // [n] fp32 or bf16
                                        bool b_bf16,     //
                                        std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    store(out, out_bf16, std::size_t(i), a[i] + load(b, b_bf16, std::size_t(i)));
}

// One block per row: max, sum of exp, normalise; loss = log(sum) - (x_target - max), without
// forming a tiny probability. probs may alias logits: x_target is read before any write (the
// first block_reduce's barrier orders it), and each thread rewrites only the columns it read.
__global__ void softmax_crossentropy_forward_kernel(float* probs,                 // [N, V]
                                                    float* losses,                // [N]
                                                    const float* logits,          // [N, V]
                                                    const std::int32_t* targets,  // [N]
                                                    int N, int V) {
  for (int row = blockIdx.x; row < N; row += gridDim.x) {
    const float* x = logits + std::int64_t(row) * V;
    float* p = probs + std::int64_t(row) * V;
    const float xt = x[targets[row]];  // read before the first barrier, so before any write
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, x[i]);
    mx = block_reduce<true>(mx);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      const float e = expf(x[i] - mx);
      p[i] = e;
      sum += e;
    }
    sum = block_reduce<false>(sum);
    const float inv = 1.0f / sum;
    for (int i = threadIdx.x; i < V; i += blockDim.x) p[i] *= inv;
    if (threadIdx.x == 0) losses[row] = logf(sum) - (xt - mx);
  }
}

// dlogits += (probs - onehot(target)) * grad_scale; one thread per element.
__global__ void crossentropy_softmax_backward_kernel(float* dlogits,               // [N, V] +=
                                                     const float* probs,           // [N, V]
                                                     const std::int32_t* targets,  // [N]
                                                     float grad_scale, std::int64_t N, int V) {
  const std::int64_t total = N * V;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t n = i / V;
    const int col = int(i % V);
    const float onehot = col == targets[n] ? 1.0f : 0.0f;
    dlogits[i] += (probs[i] - onehot) * grad_scale;
  }
}

// AdamW, decoupled weight decay (torch.optim.AdamW); inv_bc1/2 = 1 / (1 - beta^t).
__global__ void adamw_kernel(float* params,       // [n]
                             const float* grads,  // [n]
                             float* m,            // [n] first moment
                             float* v,            // [n] second moment
                             std::int64_t n, float lr, float beta1, float beta2, float eps,
                             float decay, float grad_scale, float inv_bc1, float inv_bc2) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const float g = grads[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float p = params[i];
    params[i] = p - lr * (mi * inv_bc1 / (sqrtf(vi * inv_bc2) + eps) + decay * p);
  }
}

// --- cuBLAS helpers (column-major arguments, see the file comment) -----------------------------

void sgemm(const CudaContext& ctx, cublasOperation_t opa, cublasOperation_t opb, int m, int n,
           int k, float alpha, const float* a, int lda, const float* b, int ldb, float beta,
           float* c, int ldc) {
  STRATA_CUBLAS_CHECK(
      cublasSgemm(ctx.cublas, opa, opb, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc));
}

void sgemm_batched(const CudaContext& ctx, cublasOperation_t opa, cublasOperation_t opb, int m,
                   int n, int k, float alpha, const float* a, int lda, long long stride_a,
                   const float* b, int ldb, long long stride_b, float beta, float* c, int ldc,
                   long long stride_c, int batch) {
  STRATA_CUBLAS_CHECK(cublasSgemmStridedBatched(ctx.cublas, opa, opb, m, n, k, &alpha, a, lda,
                                                stride_a, b, ldb, stride_b, &beta, c, ldc, stride_c,
                                                batch));
}

constexpr cublasOperation_t kN = CUBLAS_OP_N;
constexpr cublasOperation_t kT = CUBLAS_OP_T;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Context

CudaContext::CudaContext(int dev, std::size_t ws_bytes) : device(dev) {
  try {
    STRATA_CUDA_CHECK(cudaSetDevice(device));
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    STRATA_CUBLAS_CHECK(cublasCreate(&cublas));
    STRATA_CUBLAS_CHECK(cublasSetStream(cublas, stream));
    // Plain fp32 GEMMs (no TF32 tensor-core rounding): the CPU path is the reference.
    STRATA_CUBLAS_CHECK(cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH));
    STRATA_CUBLAS_CHECK(cublasLtCreate(&cublaslt));
    if (ws_bytes > 0) {
      STRATA_CUDA_CHECK(cudaMalloc(&workspace, ws_bytes));
      workspace_bytes = ws_bytes;
      STRATA_CUBLAS_CHECK(cublasSetWorkspace(cublas, workspace, workspace_bytes));
    }
  } catch (...) {
    release();
    throw;
  }
}

CudaContext::~CudaContext() { release(); }

void CudaContext::release() noexcept {
  // Errors are ignored here: this must not throw, and a sticky fault was already reported.
  if (cublas) cublasDestroy(cublas);
  if (cublaslt) cublasLtDestroy(cublaslt);
  if (workspace) cudaFree(workspace);
  if (stream) cudaStreamDestroy(stream);
  cublas = nullptr;
  cublaslt = nullptr;
  workspace = nullptr;
  stream = nullptr;
}

void CudaContext::synchronize() const { STRATA_CUDA_CHECK(cudaStreamSynchronize(stream)); }

// ---------------------------------------------------------------------------------------------
// Embedding

void encoder_forward(const CudaContext& ctx, float* out, const std::int32_t* tokens,
                     const float* wte, const float* wpe, int B, int T, int C) {
  const std::int64_t N = std::int64_t(B) * T;
  if (N == 0 || C == 0) return;
  STRATA_LAUNCH(encoder_forward_kernel, grid_for(N * C), kBlock, 0, ctx.stream)
  (out, tokens, wte, wpe, N, T, C);
  STRATA_CUDA_CHECK_LAUNCH();
}

void encoder_backward(const CudaContext& ctx, float* dwte, float* dwpe, const float* dout,
                      const std::int32_t* tokens, int B, int T, int C) {
  const std::int64_t N = std::int64_t(B) * T;
  if (N == 0 || C == 0) return;
  STRATA_LAUNCH(encoder_backward_kernel, grid_for(N * C), kBlock, 0, ctx.stream)
  (dwte, dwpe, dout, tokens, N, T, C);
  STRATA_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// LayerNorm (biased variance, eps 1e-5, as torch.nn.LayerNorm)

void layernorm_forward(const CudaContext& ctx, ActView out, float* mean, float* rstd, ActView inp,
                       const float* weight, const float* bias, int N, int C) {
  if (N == 0) return;
  STRATA_LAUNCH(layernorm_forward_kernel, grid_for_rows(N), kBlock, 0, ctx.stream)
  (out.data, out.is_bf16(), mean, rstd, nullptr, false, nullptr, inp.data, inp.is_bf16(), weight,
   bias, N, C);
  STRATA_CUDA_CHECK_LAUNCH();
}

void residual_layernorm_forward(const CudaContext& ctx, ActView sum, ActView out, float* mean,
                                float* rstd, const float* a, ActView b, const float* weight,
                                const float* bias, int N, int C) {
  if (N == 0) return;
  STRATA_LAUNCH(layernorm_forward_kernel, grid_for_rows(N), kBlock, 0, ctx.stream)
  (out.data, out.is_bf16(), mean, rstd, sum.data, sum.is_bf16(), a, b.data, b.is_bf16(), weight,
   bias, N, C);
  STRATA_CUDA_CHECK_LAUNCH();
}

// The blocks of a norm's backward: enough to fill an H100 (132 SMs, 4 blocks of 48 KiB each),
// few enough that their partial sums stay small beside the rows (8 x 1024 rows of gpt2: 2 rows a
// warp, 3 MiB of partials against 88 MiB of rows).
constexpr std::int64_t kNormBackwardBlocks = 512;

// norm_backward_kernel<kCentered> and the sums of its blocks' partials into dweight (and dbias),
// +=. Up to 8 warps a block, as many as 48 KiB of warp slices hold (one at least, opting in above
// 48 KiB: C over 6,144 for LayerNorm).
template <bool kCentered>
void norm_backward(const CudaContext& ctx, float* dinp, float* dweight, float* dbias,
                   const float* dout, ActView inp, const float* weight, const float* mean,
                   const float* rstd, int N, int C) {
  if (N == 0 || C <= 0) return;
  constexpr int P = kCentered ? 2 : 1;
  constexpr std::size_t kDefaultShared = 48 * 1024;
  const std::size_t slice = std::size_t(P) * C * sizeof(float);
  const int warps = int(std::clamp<std::size_t>(kDefaultShared / slice, 1, kWarpsPerBlock));
  const std::size_t smem = std::size_t(warps) * slice;
  if (smem > kDefaultShared)
    STRATA_CUDA_CHECK(cudaFuncSetAttribute(norm_backward_kernel<kCentered>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const auto grid =
      unsigned(std::min<std::int64_t>((std::int64_t(N) + warps - 1) / warps, kNormBackwardBlocks));
  auto* partial = static_cast<float*>(stream_scratch(grid * slice, ctx.stream));
  STRATA_LAUNCH(norm_backward_kernel<kCentered>, grid, warps * 32, smem, ctx.stream)
  (partial, dinp, dout, inp.data, inp.is_bf16(), weight, mean, rstd, N, C);
  STRATA_CUDA_CHECK_LAUNCH();
  add_chunk_sums(dweight, partial, grid, std::size_t(P) * C, C, ctx.stream);
  if (kCentered) add_chunk_sums(dbias, partial + C, grid, std::size_t(P) * C, C, ctx.stream);
  STRATA_CUDA_CHECK(cudaFreeAsync(partial, ctx.stream));
}

void layernorm_backward(const CudaContext& ctx, float* dinp, float* dweight, float* dbias,
                        const float* dout, ActView inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C) {
  norm_backward<true>(ctx, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

// ---------------------------------------------------------------------------------------------
// Matmul: out = inp @ weight^T + bias, weight stored [OC, C] (the torch.nn.Linear layout)

void matmul_forward(const CudaContext& ctx, float* out, const float* inp, const float* weight,
                    const float* bias, int N, int C, int OC) {
  if (N == 0 || OC == 0) return;
  float beta = 0.0f;
  if (bias) {
    STRATA_LAUNCH(broadcast_bias_kernel, grid_for(std::int64_t(N) * OC), kBlock, 0, ctx.stream)
    (out, bias, N, OC);
    STRATA_CUDA_CHECK_LAUNCH();
    beta = 1.0f;
  }
  // out[N,OC] = inp[N,C] @ weight[OC,C]^T
  sgemm(ctx, kT, kN, OC, N, C, 1.0f, weight, C, inp, C, beta, out, OC);
}

void matmul_backward(const CudaContext& ctx, float* dinp, float* dweight, float* dbias,
                     const float* dout, const float* inp, const float* weight, int N, int C,
                     int OC) {
  if (N == 0) return;
  if (dinp) sgemm(ctx, kN, kN, C, N, OC, 1.0f, weight, C, dout, OC, 1.0f, dinp, C);  // dout @ W
  if (dweight)
    sgemm(ctx, kN, kT, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dweight, C);  // dout^T @ inp
  if (dbias) {
    STRATA_LAUNCH(column_sum_kernel, unsigned((OC + 31) / 32), dim3(32, 8), 0, ctx.stream)
    (dbias, dout, N, OC);
    STRATA_CUDA_CHECK_LAUNCH();
  }
}

// ---------------------------------------------------------------------------------------------
// Causal self-attention. Per (b, h): S = q k^T / sqrt(hs), P = causal softmax(S), out = P v.

void attention_forward(const CudaContext& ctx, float* out, float* att, const float* qkv, int B,
                       int T, int C, int NH) {
  if (B == 0 || T == 0) return;
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
  const long long TT = static_cast<long long>(T) * T;
  for (int b = 0; b < B; ++b) {
    const float* q = qkv + std::int64_t(b) * T * C3;  // head h at + h*hs
    const float* k = q + C;
    float* p = att + std::int64_t(b) * NH * TT;  // head h at + h*T*T
    // S[T,T] = scale * q[T,hs] @ k[T,hs]^T
    sgemm_batched(ctx, kT, kN, T, T, hs, scale, k, C3, hs, q, C3, hs, 0.0f, p, T, TT, NH);
  }
  const std::int64_t rows = std::int64_t(B) * NH * T;
  STRATA_LAUNCH(causal_softmax_forward_kernel, grid_for_rows(rows), kBlock, 0, ctx.stream)
  (att, rows, T);
  STRATA_CUDA_CHECK_LAUNCH();
  for (int b = 0; b < B; ++b) {
    const float* v = qkv + std::int64_t(b) * T * C3 + 2 * C;
    const float* p = att + std::int64_t(b) * NH * TT;
    float* o = out + std::int64_t(b) * T * C;
    // out[T,hs] (ld C) = P[T,T] @ v[T,hs]
    sgemm_batched(ctx, kN, kN, hs, T, T, 1.0f, v, C3, hs, p, T, TT, 0.0f, o, C, hs, NH);
  }
}

void attention_backward(const CudaContext& ctx, float* dqkv, float* datt, const float* dout,
                        const float* qkv, const float* att, int B, int T, int C, int NH) {
  if (B == 0 || T == 0) return;
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
  const long long TT = static_cast<long long>(T) * T;
  for (int b = 0; b < B; ++b) {
    const float* v = qkv + std::int64_t(b) * T * C3 + 2 * C;
    float* dv = dqkv + std::int64_t(b) * T * C3 + 2 * C;
    const float* p = att + std::int64_t(b) * NH * TT;
    float* ds = datt + std::int64_t(b) * NH * TT;
    const float* dob = dout + std::int64_t(b) * T * C;
    // dv[T,hs] += P^T @ dout[T,hs]
    sgemm_batched(ctx, kN, kT, hs, T, T, 1.0f, dob, C, hs, p, T, TT, 1.0f, dv, C3, hs, NH);
    // dP[T,T] = dout[T,hs] @ v[T,hs]^T
    sgemm_batched(ctx, kT, kN, T, T, hs, 1.0f, v, C3, hs, dob, C, hs, 0.0f, ds, T, TT, NH);
  }
  const std::int64_t rows = std::int64_t(B) * NH * T;
  STRATA_LAUNCH(causal_softmax_backward_kernel, grid_for_rows(rows), kBlock, 0, ctx.stream)
  (datt, att, rows, T);
  STRATA_CUDA_CHECK_LAUNCH();
  for (int b = 0; b < B; ++b) {
    const float* q = qkv + std::int64_t(b) * T * C3;
    const float* k = q + C;
    float* dq = dqkv + std::int64_t(b) * T * C3;
    float* dk = dq + C;
    const float* ds = datt + std::int64_t(b) * NH * TT;
    // S = scale q k^T:  dq[T,hs] += scale dS @ k;  dk[T,hs] += scale dS^T @ q
    sgemm_batched(ctx, kN, kN, hs, T, T, scale, k, C3, hs, ds, T, TT, 1.0f, dq, C3, hs, NH);
    sgemm_batched(ctx, kN, kT, hs, T, T, scale, q, C3, hs, ds, T, TT, 1.0f, dk, C3, hs, NH);
  }
}

// ---------------------------------------------------------------------------------------------
// The Llama block: RMSNorm, SwiGLU, rotary position embedding

void rmsnorm_forward(const CudaContext& ctx, ActView out, float* rstd, ActView inp,
                     const float* weight, int N, int C) {
  if (N == 0) return;
  STRATA_LAUNCH(rmsnorm_forward_kernel, grid_for_rows(N), kBlock, 0, ctx.stream)
  (out.data, out.is_bf16(), rstd, inp.data, inp.is_bf16(), weight, N, C);
  STRATA_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(const CudaContext& ctx, float* dinp, float* dweight, const float* dout,
                      ActView inp, const float* weight, const float* rstd, int N, int C) {
  norm_backward<false>(ctx, dinp, dweight, nullptr, dout, inp, weight, nullptr, rstd, N, C);
}

void swiglu_forward(const CudaContext& ctx, ActView out, ActView gu, int N, int F) {
  const std::int64_t n = std::int64_t(N) * F;
  if (n == 0) return;
  STRATA_LAUNCH(swiglu_forward_kernel, grid_for(n), kBlock, 0, ctx.stream)
  (out.data, out.is_bf16(), gu.data, gu.is_bf16(), N, F);
  STRATA_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(const CudaContext& ctx, float* dgu, ActView gu, const float* dout, int N,
                     int F) {
  const std::int64_t n = std::int64_t(N) * F;
  if (n == 0) return;
  STRATA_LAUNCH(swiglu_backward_kernel, grid_for(n), kBlock, 0, ctx.stream)
  (dgu, gu.data, gu.is_bf16(), dout, N, F);
  STRATA_CUDA_CHECK_LAUNCH();
}

namespace {
void rope(const CudaContext& ctx, ActView x, const float* table, int N, int T, int row0, int heads,
          int hs, int row_stride, float sign) {
  const std::int64_t n = std::int64_t(N) * heads * (hs / 2);
  if (n == 0) return;
  STRATA_LAUNCH(rope_kernel, grid_for(n), kBlock, 0, ctx.stream)
  (x.data, x.is_bf16(), table, N, T, row0, heads, hs, row_stride, sign);
  STRATA_CUDA_CHECK_LAUNCH();
}
}  // namespace

void rope_forward(const CudaContext& ctx, ActView x, const float* table, int N, int T, int row0,
                  int heads, int hs, int row_stride) {
  rope(ctx, x, table, N, T, row0, heads, hs, row_stride, 1.0f);
}
void rope_backward(const CudaContext& ctx, float* dx, const float* table, int N, int T, int row0,
                   int heads, int hs, int row_stride) {
  rope(ctx, dx, table, N, T, row0, heads, hs, row_stride, -1.0f);
}

void repeat_kv_forward(const CudaContext& ctx, ActView out, ActView in, int N, int NH, int KV,
                       int hs) {
  const std::int64_t n = std::int64_t(N) * 3 * NH * hs;
  if (n == 0) return;
  if (out.dtype != in.dtype) throw Error("repeat_kv_forward: in and out in different dtypes");
  STRATA_LAUNCH(repeat_kv_forward_kernel, grid_for(n), kBlock, 0, ctx.stream)
  (out.data, in.data, in.is_bf16(), N, NH, KV, hs);
  STRATA_CUDA_CHECK_LAUNCH();
}

void repeat_kv_backward(const CudaContext& ctx, float* din, const float* dout, int N, int NH,
                        int KV, int hs) {
  const std::int64_t n = std::int64_t(N) * (NH + 2 * KV) * hs;
  if (n == 0) return;
  STRATA_LAUNCH(repeat_kv_backward_kernel, grid_for(n), kBlock, 0, ctx.stream)
  (din, dout, N, NH, KV, hs);
  STRATA_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// GELU (tanh approximation), residual

void gelu_forward(const CudaContext& ctx, ActView out, ActView inp, std::int64_t n) {
  if (n == 0) return;
  with_element_type(out.is_bf16(), [&](auto type) {
    using E = typename decltype(type)::type;
    STRATA_LAUNCH(gelu_forward_kernel<E>, grid_for(n), kBlock, 0, ctx.stream)
    (static_cast<E*>(out.data), static_cast<const E*>(inp.data), n);
  });
  STRATA_CUDA_CHECK_LAUNCH();
}

void gelu_backward(const CudaContext& ctx, float* dinp, const float* inp, const float* dout,
                   std::int64_t n) {
  if (n == 0) return;
  STRATA_LAUNCH(gelu_backward_kernel, grid_for(n), kBlock, 0, ctx.stream)(dinp, inp, dout, n);
  STRATA_CUDA_CHECK_LAUNCH();
}

void residual_forward(const CudaContext& ctx, ActView out, const float* a, ActView b,
                      std::int64_t n) {
  if (n == 0) return;
  STRATA_LAUNCH(residual_forward_kernel, grid_for(n), kBlock, 0, ctx.stream)
  (out.data, out.is_bf16(), a, b.data, b.is_bf16(), n);
  STRATA_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// Softmax + cross-entropy over the vocabulary

void softmax_crossentropy_forward(const CudaContext& ctx, float* probs, float* losses,
                                  const float* logits, const std::int32_t* targets, int N, int V) {
  if (N == 0) return;
  const unsigned grid = unsigned(std::min<std::int64_t>(N, kMaxGrid));
  STRATA_LAUNCH(softmax_crossentropy_forward_kernel, grid, 512, 0, ctx.stream)
  (probs, losses, logits, targets, N, V);
  STRATA_CUDA_CHECK_LAUNCH();
}

void crossentropy_softmax_backward(const CudaContext& ctx, float* dlogits, const float* probs,
                                   const std::int32_t* targets, float grad_scale, int N, int V) {
  const std::int64_t total = std::int64_t(N) * V;
  if (total == 0) return;
  STRATA_LAUNCH(crossentropy_softmax_backward_kernel, grid_for(total), kBlock, 0, ctx.stream)
  (dlogits, probs, targets, grad_scale, N, V);
  STRATA_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// AdamW (decoupled weight decay, as torch.optim.AdamW):
//   g = grad * grad_scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2
//   p -= lr * (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + decay * p)

void adamw_update(const CudaContext& ctx, float* params, const float* grads, float* m, float* v,
                  std::int64_t n, float lr, float beta1, float beta2, float eps, float decay, int t,
                  float grad_scale) {
  if (n == 0) return;
  const float inv_bc1 = float(1.0 / (1.0 - std::pow(double(beta1), t)));
  const float inv_bc2 = float(1.0 / (1.0 - std::pow(double(beta2), t)));
  STRATA_LAUNCH(adamw_kernel, grid_for(n), kBlock, 0, ctx.stream)
  (params, grads, m, v, n, lr, beta1, beta2, eps, decay, grad_scale, inv_bc1, inv_bc2);
  STRATA_CUDA_CHECK_LAUNCH();
}

}  // namespace strata::cuda
