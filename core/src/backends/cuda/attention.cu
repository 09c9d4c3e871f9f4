// Fused causal self-attention, FlashAttention-2 style (Dao 2023), fp32 on CUDA cores: the T x T
// scores and probabilities exist only one 32 x 32 tile at a time, in registers and shared memory.
// Shapes and the += convention as in layers.cuh; hs = C / NH <= 128.
//
// Forward, one block per (query tile of 32 rows, b, h): Q stays in shared memory while the key
// tiles 0..qt stream through (K, V in shared memory); each row keeps its running max m and sum l
// of exp(s - m) (online softmax) and rescales its output accumulator when m grows. At the end
// out = acc / l and lse = m + log l.
//
// Backward, three launches, no atomics (every output element has one writer, so the result does
// not depend on the run):
//   delta[b,h,t] = sum_d dout[b,t,h*hs+d] out[b,t,h*hs+d]  (one warp per row);
//   dK, dV: one block per (key tile, b, h), over query tiles kt..last:
//     P = exp(scale q.k - lse), dP = dout v^T, dS = P (dP - delta),
//     dV += P^T dout, dK += scale dS^T q;
//   dQ: one block per (query tile, b, h), over key tiles 0..qt: dQ += scale dS k
//   (P and dP recomputed once more: the price of no atomics).
//
// Thread layout, the same in the three tile kernels: 128 threads as 16 x 8 (ty, tx). Thread
// (ty, tx) owns the score micro-tile rows 2 ty + r (r < 2) x columns tx + 8 c (c < 4), and of the
// [32, head] accumulators rows 2 ty + r x head columns tx + 8 i (i < kD / 8). The 8 threads of a
// row share one ty and are 8 consecutive lanes, so row reductions are 3 shuffles. Shared tiles
// have a row stride of kD + 1 floats, so the column reads of a warp fall in different banks.
// The rows of a [32, 32] probability tile that a thread reads are its own rows, written by the 8
// lanes of its row group: a __syncwarp orders them; tiles shared across warps need __syncthreads.
//
// The head size is padded to kD in {16, 32, 64, 128} (a template parameter: the per-thread
// arrays are sized and indexed by compile-time constants and stay in registers); the padding
// columns and rows past T are loaded as zeros and masked out of the softmax.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backends/cuda/bf16.cuh"
#include "backends/cuda/device.hpp"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/layers.cuh"
#include "strata/types.hpp"

// Unrolling: full for the loops over per-thread arrays (their indices must be compile-time
// constants to keep the arrays in registers), 4 for the loops over a tile's rows or head columns.
// nvcc only: the emulator's host compiler would warn about the unknown pragma.
#if defined(__CUDACC__)
#define STRATA_UNROLL _Pragma("unroll")
#define STRATA_UNROLL_4 _Pragma("unroll 4")
#else
#define STRATA_UNROLL
#define STRATA_UNROLL_4
#endif

namespace strata::cuda {
namespace {

constexpr int kTile = 32;              // query rows and key rows of a tile
constexpr int kTileThreads = 128;      // threads of a tile kernel: 16 x 8
constexpr int kGroup = 8;              // threads sharing a score row (tx)
constexpr int kRows = 2;               // score / accumulator rows per thread
constexpr int kCols = kTile / kGroup;  // score columns per thread (4)
constexpr int kPStride = kTile + 1;    // row stride of a 32 x 32 shared tile
constexpr int kMaxHead = 128;
constexpr int kDeltaThreads = 256;  // the delta kernel: one warp per row
constexpr unsigned kFull = 0xffffffffu;

static_assert((kTileThreads / kGroup) * kRows == kTile, "16 row groups of 2 rows cover a tile");

// The row stride and the floats of a [32, kD] shared tile (variables: device code may read them).
template <int kD>
constexpr int kHeadStride = kD + 1;
template <int kD>
constexpr int kHeadTileFloats = (kD + 1) * kTile;

// Sum / max over the 8 lanes of one score row (consecutive lanes; the whole warp takes part).
__device__ __forceinline__ float row_sum(float v) {
  STRATA_UNROLL
  for (int o = 1; o < kGroup; o <<= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}
__device__ __forceinline__ float row_max(float v) {
  STRATA_UNROLL
  for (int o = 1; o < kGroup; o <<= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// tile[r][d] = src[(row0 + r) * ld + d] for r < 32, d < kD; 0 where row0 + r >= T or d >= hs.
// src: fp32, or a bf16 run's Q, K, V (a bf16's 16 bits), widened.
template <int kD, class E>
__device__ __forceinline__ void load_head_tile(float* tile,   // [32, kD + 1] shared
                                               const E* src,  // row t at src + t * ld
                                               int ld, int row0, int T, int hs) {
  for (int e = threadIdx.x; e < kTile * kD; e += kTileThreads) {
    const int r = e / kD, d = e % kD, t = row0 + r;
    tile[r * kHeadStride<kD> + d] = t < T && d < hs ? widen(src[std::int64_t(t) * ld + d]) : 0.0f;
  }
}

// v[r] = src[(bh * T + row0 + r)] for r < 32; 0 past T. (lse or delta of a query tile.)
__device__ __forceinline__ void load_row_values(float* v, const float* src, std::int64_t bh,
                                                int row0, int T) {
  for (int r = threadIdx.x; r < kTile; r += kTileThreads)
    v[r] = row0 + r < T ? src[bh * T + row0 + r] : 0.0f;
}

// acc[r][c] = a[2 ty + r] . b[tx + 8 c] over the kD head columns of two shared tiles.
template <int kD>
__device__ __forceinline__ void tile_dot(float (&acc)[kRows][kCols], const float* a, const float* b,
                                         int ty, int tx) {
  STRATA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    STRATA_UNROLL
    for (int c = 0; c < kCols; ++c) acc[r][c] = 0.0f;
  }
  constexpr int ld = kHeadStride<kD>;
  STRATA_UNROLL_4
  for (int d = 0; d < kD; ++d) {
    float av[kRows], bv[kCols];
    STRATA_UNROLL
    for (int r = 0; r < kRows; ++r) av[r] = a[(ty * kRows + r) * ld + d];
    STRATA_UNROLL
    for (int c = 0; c < kCols; ++c) bv[c] = b[(tx + kGroup * c) * ld + d];
    STRATA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      STRATA_UNROLL
      for (int c = 0; c < kCols; ++c) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
    }
  }
}

// acc[r][i] += sum_j p[2 ty + r][j] m[j][tx + 8 i]: a [32,32] shared tile times a head tile.
template <int kD>
__device__ __forceinline__ void tile_accumulate(float (&acc)[kRows][kD / kGroup],
                                                const float* p,  // [32, 33] shared
                                                const float* m,  // [32, kD + 1] shared
                                                int ty, int tx) {
  constexpr int ld = kHeadStride<kD>;
  STRATA_UNROLL_4
  for (int j = 0; j < kTile; ++j) {
    float pv[kRows];
    STRATA_UNROLL
    for (int r = 0; r < kRows; ++r) pv[r] = p[(ty * kRows + r) * kPStride + j];
    STRATA_UNROLL
    for (int i = 0; i < kD / kGroup; ++i) {
      const float mv = m[j * ld + tx + kGroup * i];
      STRATA_UNROLL
      for (int r = 0; r < kRows; ++r) acc[r][i] = fmaf(pv[r], mv, acc[r][i]);
    }
  }
}

// dst[(row0 + 2 ty + r) * ld + tx + 8 i] += scale acc[r][i], inside T rows and hs columns.
template <int kD>
__device__ __forceinline__ void add_head_tile(float* dst, const float (&acc)[kRows][kD / kGroup],
                                              float scale, int ld, int row0, int T, int hs, int ty,
                                              int tx) {
  STRATA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int t = row0 + ty * kRows + r;
    if (t >= T) continue;
    STRATA_UNROLL
    for (int i = 0; i < kD / kGroup; ++i) {
      const int d = tx + kGroup * i;
      if (d < hs) dst[std::int64_t(t) * ld + d] += scale * acc[r][i];
    }
  }
}

// --- Forward ----------------------------------------------------------------------------------

// One online-softmax step of the thread's rows over key tile k0: s (raw q.k) becomes the masked,
// scaled scores' exponentials, written to p_tile; m, l and acc are rescaled to the new max.
template <int kD>
__device__ __forceinline__ void online_softmax_step(float (&s)[kRows][kCols], float (&m)[kRows],
                                                    float (&l)[kRows],
                                                    float (&acc)[kRows][kD / kGroup], float* p_tile,
                                                    float scale, int q0, int k0, int T, int ty,
                                                    int tx) {
  STRATA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int qi = q0 + ty * kRows + r;
    float mx = -INFINITY;
    STRATA_UNROLL
    for (int c = 0; c < kCols; ++c) {
      const int kj = k0 + tx + kGroup * c;
      s[r][c] = kj <= qi && kj < T ? s[r][c] * scale : -INFINITY;
      mx = fmaxf(mx, s[r][c]);
    }
    // Finite: key 0 is in every row's first tile, so m is finite from then on.
    const float m_new = fmaxf(m[r], row_max(mx));
    const float correction = expf(m[r] - m_new);  // 0 on the first tile (m = -inf)
    float sum = 0.0f;
    STRATA_UNROLL
    for (int c = 0; c < kCols; ++c) {
      const float p = expf(s[r][c] - m_new);  // 0 where masked
      p_tile[(ty * kRows + r) * kPStride + tx + kGroup * c] = p;
      sum += p;
    }
    l[r] = l[r] * correction + row_sum(sum);
    m[r] = m_new;
    STRATA_UNROLL
    for (int i = 0; i < kD / kGroup; ++i) acc[r][i] *= correction;
  }
}

// out, lse of query tile qt (longest first: block x = 0 takes the last tile) of head (b, h).
template <int kD, class Qkv>
__global__ void __launch_bounds__(kTileThreads)
    flash_forward_kernel(void* out,       // [B, T, C] fp32 or bf16
                         bool out_bf16,   //
                         float* lse,      // [B, NH, T]
                         const Qkv* qkv,  // [B, T, 3C] fp32 or bf16's bits
                         int T, int C, int NH, float scale) {
  STRATA_DYNAMIC_SHARED(float, smem);
  float* q_tile = smem;                          // [32, kD + 1]
  float* k_tile = q_tile + kHeadTileFloats<kD>;  // [32, kD + 1]
  float* v_tile = k_tile + kHeadTileFloats<kD>;  // [32, kD + 1]
  float* p_tile = v_tile + kHeadTileFloats<kD>;  // [32, 33]
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x), q0 = qt * kTile;
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, hs = C / NH, C3 = 3 * C;
  const int ty = threadIdx.x / kGroup, tx = threadIdx.x % kGroup;
  const Qkv* q = qkv + std::int64_t(b) * T * C3 + h * hs;  // k at + C, v at + 2C

  load_head_tile<kD>(q_tile, q, C3, q0, T, hs);
  float acc[kRows][kD / kGroup] = {}, m[kRows], l[kRows];
  STRATA_UNROLL
  for (int r = 0; r < kRows; ++r) m[r] = -INFINITY, l[r] = 0.0f;
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    load_head_tile<kD>(k_tile, q + C, C3, k0, T, hs);
    load_head_tile<kD>(v_tile, q + 2 * C, C3, k0, T, hs);
    __syncthreads();  // q, k, v tiles loaded
    float s[kRows][kCols];
    tile_dot<kD>(s, q_tile, k_tile, ty, tx);
    online_softmax_step<kD>(s, m, l, acc, p_tile, scale, q0, k0, T, ty, tx);
    __syncwarp();  // p tile rows complete (a row's 8 writers and its readers are one warp)
    tile_accumulate<kD>(acc, p_tile, v_tile, ty, tx);
    __syncthreads();  // k, v and p tiles read before the next tile overwrites them
  }
  float inv_l[kRows];
  STRATA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    inv_l[r] = 1.0f / l[r];
    const int t = q0 + ty * kRows + r;
    if (tx == 0 && t < T) lse[std::int64_t(bh) * T + t] = m[r] + logf(l[r]);
    STRATA_UNROLL
    for (int i = 0; i < kD / kGroup; ++i) acc[r][i] *= inv_l[r];
  }
  const std::int64_t o = std::int64_t(b) * T * C + h * hs;
  STRATA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int t = q0 + ty * kRows + r;
    if (t >= T) continue;
    STRATA_UNROLL
    for (int i = 0; i < kD / kGroup; ++i) {
      const int d = tx + kGroup * i;
      if (d < hs) store(out, out_bf16, std::size_t(o + std::int64_t(t) * C + d), acc[r][i]);
    }
  }
}

// --- Backward ---------------------------------------------------------------------------------

// delta[b,h,t] = dout[b,t,h head] . out[b,t,h head]; one warp per row (b, h, t).
__global__ void attention_delta_kernel(float* delta,       // [B, NH, T]
                                       const float* dout,  // [B, T, C]
                                       const void* out,    // [B, T, C] fp32 or bf16
                                       bool out_bf16, std::int64_t rows, int T, int C, int NH) {
  constexpr int kWarps = kDeltaThreads / 32;
  const int lane = threadIdx.x % 32, hs = C / NH;
  for (std::int64_t row = blockIdx.x * std::int64_t(kWarps) + threadIdx.x / 32; row < rows;
       row += std::int64_t(gridDim.x) * kWarps) {
    const std::int64_t bh = row / T, b = bh / NH;
    const int t = int(row % T), h = int(bh % NH);
    const std::int64_t off = (b * T + t) * C + std::int64_t(h) * hs;
    float s = 0.0f;
    for (int d = lane; d < hs; d += 32)
      s += dout[off + d] * load(out, out_bf16, std::size_t(off + d));
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFull, s, o);
    if (lane == 0) delta[row] = s;
  }
}

// dK, dV of key tile kt = blockIdx.x (the first tiles see the most query tiles) of head (b, h).
// The thread's score rows are keys here, its columns queries (S^T, P^T).
template <int kD, class Qkv>
__global__ void __launch_bounds__(kTileThreads)
    flash_backward_dkdv_kernel(float* dqkv,         // [B, T, 3C] += (dk, dv columns)
                               const float* dout,   // [B, T, C]
                               const Qkv* qkv,      // [B, T, 3C] fp32 or bf16's bits
                               const float* lse,    // [B, NH, T]
                               const float* delta,  // [B, NH, T]
                               int T, int C, int NH, float scale) {
  STRATA_DYNAMIC_SHARED(float, smem);
  float* k_tile = smem;                            // [32, kD + 1]
  float* v_tile = k_tile + kHeadTileFloats<kD>;    // [32, kD + 1]
  float* q_tile = v_tile + kHeadTileFloats<kD>;    // [32, kD + 1]
  float* do_tile = q_tile + kHeadTileFloats<kD>;   // [32, kD + 1]
  float* pt_tile = do_tile + kHeadTileFloats<kD>;  // [32 keys, 33] P^T
  float* dst_tile = pt_tile + kTile * kPStride;    // [32 keys, 33] dS^T
  float* lse_rows = dst_tile + kTile * kPStride;   // [32] of the query tile
  float* delta_rows = lse_rows + kTile;            // [32]
  const int kt = blockIdx.x, k0 = kt * kTile, tiles = gridDim.x;
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, hs = C / NH, C3 = 3 * C;
  const int ty = threadIdx.x / kGroup, tx = threadIdx.x % kGroup;
  const Qkv* q = qkv + std::int64_t(b) * T * C3 + h * hs;  // k at + C, v at + 2C
  const float* dob = dout + std::int64_t(b) * T * C + h * hs;

  load_head_tile<kD>(k_tile, q + C, C3, k0, T, hs);
  load_head_tile<kD>(v_tile, q + 2 * C, C3, k0, T, hs);
  float dk[kRows][kD / kGroup] = {}, dv[kRows][kD / kGroup] = {};
  for (int qt = kt; qt < tiles; ++qt) {
    const int q0 = qt * kTile;
    load_head_tile<kD>(q_tile, q, C3, q0, T, hs);
    load_head_tile<kD>(do_tile, dob, C, q0, T, hs);
    load_row_values(lse_rows, lse, bh, q0, T);
    load_row_values(delta_rows, delta, bh, q0, T);
    __syncthreads();  // tiles loaded
    float s[kRows][kCols], dp[kRows][kCols];
    tile_dot<kD>(s, k_tile, q_tile, ty, tx);    // S^T = k q^T (unscaled)
    tile_dot<kD>(dp, v_tile, do_tile, ty, tx);  // dP^T = v dout^T
    STRATA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int kj = k0 + ty * kRows + r;
      STRATA_UNROLL
      for (int c = 0; c < kCols; ++c) {
        const int col = tx + kGroup * c, qi = q0 + col;
        const float p = kj <= qi && qi < T ? expf(s[r][c] * scale - lse_rows[col]) : 0.0f;
        pt_tile[(ty * kRows + r) * kPStride + col] = p;
        dst_tile[(ty * kRows + r) * kPStride + col] = p * (dp[r][c] - delta_rows[col]);
      }
    }
    __syncwarp();  // P^T, dS^T rows complete (written and read within one warp)
    tile_accumulate<kD>(dv, pt_tile, do_tile, ty, tx);  // dV += P^T dout
    tile_accumulate<kD>(dk, dst_tile, q_tile, ty, tx);  // dK += dS^T q (scaled at the end)
    __syncthreads();  // every tile read before the next query tile overwrites them
  }
  float* dkb = dqkv + std::int64_t(b) * T * C3 + C + h * hs;
  add_head_tile<kD>(dkb, dk, scale, C3, k0, T, hs, ty, tx);
  add_head_tile<kD>(dkb + C, dv, 1.0f, C3, k0, T, hs, ty, tx);
}

// dQ of query tile qt (longest first, as the forward) of head (b, h).
template <int kD, class Qkv>
__global__ void __launch_bounds__(kTileThreads)
    flash_backward_dq_kernel(float* dqkv,         // [B, T, 3C] += (dq columns)
                             const float* dout,   // [B, T, C]
                             const Qkv* qkv,      // [B, T, 3C] fp32 or bf16's bits
                             const float* lse,    // [B, NH, T]
                             const float* delta,  // [B, NH, T]
                             int T, int C, int NH, float scale) {
  STRATA_DYNAMIC_SHARED(float, smem);
  float* q_tile = smem;                           // [32, kD + 1]
  float* do_tile = q_tile + kHeadTileFloats<kD>;  // [32, kD + 1]
  float* k_tile = do_tile + kHeadTileFloats<kD>;  // [32, kD + 1]
  float* v_tile = k_tile + kHeadTileFloats<kD>;   // [32, kD + 1]
  float* ds_tile = v_tile + kHeadTileFloats<kD>;  // [32 queries, 33] dS
  float* lse_rows = ds_tile + kTile * kPStride;   // [32]
  float* delta_rows = lse_rows + kTile;           // [32]
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x), q0 = qt * kTile;
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, hs = C / NH, C3 = 3 * C;
  const int ty = threadIdx.x / kGroup, tx = threadIdx.x % kGroup;
  const Qkv* q = qkv + std::int64_t(b) * T * C3 + h * hs;  // k at + C, v at + 2C

  load_head_tile<kD>(q_tile, q, C3, q0, T, hs);
  load_head_tile<kD>(do_tile, dout + std::int64_t(b) * T * C + h * hs, C, q0, T, hs);
  load_row_values(lse_rows, lse, bh, q0, T);
  load_row_values(delta_rows, delta, bh, q0, T);
  float dq[kRows][kD / kGroup] = {};
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    load_head_tile<kD>(k_tile, q + C, C3, k0, T, hs);
    load_head_tile<kD>(v_tile, q + 2 * C, C3, k0, T, hs);
    __syncthreads();  // tiles loaded
    float s[kRows][kCols], dp[kRows][kCols];
    tile_dot<kD>(s, q_tile, k_tile, ty, tx);    // S = q k^T (unscaled)
    tile_dot<kD>(dp, do_tile, v_tile, ty, tx);  // dP = dout v^T
    STRATA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = ty * kRows + r, qi = q0 + row;
      STRATA_UNROLL
      for (int c = 0; c < kCols; ++c) {
        const int col = tx + kGroup * c, kj = k0 + col;
        const float p = kj <= qi && qi < T ? expf(s[r][c] * scale - lse_rows[row]) : 0.0f;
        ds_tile[row * kPStride + col] = p * (dp[r][c] - delta_rows[row]);
      }
    }
    __syncwarp();  // dS rows complete (written and read within one warp)
    tile_accumulate<kD>(dq, ds_tile, k_tile, ty, tx);  // dQ += dS k (scaled at the end)
    __syncthreads();  // k and dS read before the next key tile overwrites them
  }
  add_head_tile<kD>(dqkv + std::int64_t(b) * T * C3 + h * hs, dq, scale, C3, q0, T, hs, ty, tx);
}

// --- Host side --------------------------------------------------------------------------------

// Shared-memory floats of each tile kernel.
template <int kD>
constexpr std::size_t forward_smem_bytes() {
  return sizeof(float) * (3 * kHeadTileFloats<kD> + kTile * kPStride);
}
template <int kD>
constexpr std::size_t dkdv_smem_bytes() {
  return sizeof(float) * (4 * kHeadTileFloats<kD> + 2 * kTile * kPStride + 2 * kTile);
}
template <int kD>
constexpr std::size_t dq_smem_bytes() {
  return sizeof(float) * (4 * kHeadTileFloats<kD> + kTile * kPStride + 2 * kTile);
}

// Checks the shape and calls f(std::integral_constant<int, kD>) with the head size's padding.
template <class F>
void with_head_size(const char* op, int B, int T, int C, int NH, F&& f) {
  if (B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH != 0 || C / NH > kMaxHead ||
      std::int64_t(B) * NH > 65535)
    throw Error(std::string(op) + ": shape B " + std::to_string(B) + ", T " + std::to_string(T) +
                    ", C " + std::to_string(C) + ", NH " + std::to_string(NH) + " not supported",
                "NH must divide C with a head size C / NH of at most 128, and B * NH <= 65535");
  const int hs = C / NH;
  if (hs <= 16)
    f(std::integral_constant<int, 16>{});
  else if (hs <= 32)
    f(std::integral_constant<int, 32>{});
  else if (hs <= 64)
    f(std::integral_constant<int, 64>{});
  else
    f(std::integral_constant<int, 128>{});
}

// The grid of a tile kernel: query or key tiles x (b, h).
dim3 tile_grid(int B, int T, int NH) { return dim3(unsigned((T + kTile - 1) / kTile), B * NH); }

}  // namespace

void flash_attention_forward(const CudaContext& ctx, ActView out, float* lse, ActView qkv, int B,
                             int T, int C, int NH) {
  with_head_size("flash_attention_forward", B, T, C, NH, [&](auto head) {
    constexpr int kD = decltype(head)::value;
    if (B == 0 || T == 0) return;
    const float scale = 1.0f / std::sqrt(float(C / NH));
    with_element_type(qkv.is_bf16(), [&](auto type) {
      using Qkv = typename decltype(type)::type;
      allow_shared_memory(flash_forward_kernel<kD, Qkv>, forward_smem_bytes<kD>());
      STRATA_LAUNCH((flash_forward_kernel<kD, Qkv>), tile_grid(B, T, NH), kTileThreads,
                    forward_smem_bytes<kD>(), ctx.stream)
      (out.data, out.is_bf16(), lse, static_cast<const Qkv*>(qkv.data), T, C, NH, scale);
      STRATA_CUDA_CHECK_LAUNCH();
    });
  });
}

void attention_delta(const CudaContext& ctx, float* delta, const float* dout, ActView out, int B,
                     int T, int C, int NH) {
  const std::int64_t rows = std::int64_t(B) * NH * T;
  if (rows == 0) return;
  const unsigned blocks = unsigned(std::min<std::int64_t>(
      (rows + kDeltaThreads / 32 - 1) / (kDeltaThreads / 32), std::int64_t(1) << 16));
  STRATA_LAUNCH(attention_delta_kernel, blocks, kDeltaThreads, 0, ctx.stream)
  (delta, dout, out.data, out.is_bf16(), rows, T, C, NH);
  STRATA_CUDA_CHECK_LAUNCH();
}

void flash_attention_backward(const CudaContext& ctx, float* dqkv, float* delta, const float* dout,
                              ActView qkv, ActView out, const float* lse, int B, int T, int C,
                              int NH) {
  with_head_size("flash_attention_backward", B, T, C, NH, [&](auto head) {
    constexpr int kD = decltype(head)::value;
    if (B == 0 || T == 0) return;
    const float scale = 1.0f / std::sqrt(float(C / NH));
    attention_delta(ctx, delta, dout, out, B, T, C, NH);

    with_element_type(qkv.is_bf16(), [&](auto type) {
      using Qkv = typename decltype(type)::type;
      const Qkv* q = static_cast<const Qkv*>(qkv.data);
      allow_shared_memory(flash_backward_dkdv_kernel<kD, Qkv>, dkdv_smem_bytes<kD>());
      STRATA_LAUNCH((flash_backward_dkdv_kernel<kD, Qkv>), tile_grid(B, T, NH), kTileThreads,
                    dkdv_smem_bytes<kD>(), ctx.stream)
      (dqkv, dout, q, lse, delta, T, C, NH, scale);
      STRATA_CUDA_CHECK_LAUNCH();

      allow_shared_memory(flash_backward_dq_kernel<kD, Qkv>, dq_smem_bytes<kD>());
      STRATA_LAUNCH((flash_backward_dq_kernel<kD, Qkv>), tile_grid(B, T, NH), kTileThreads,
                    dq_smem_bytes<kD>(), ctx.stream)
      (dqkv, dout, q, lse, delta, T, C, NH, scale);
      STRATA_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace strata::cuda
