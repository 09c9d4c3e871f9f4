// Fused causal self-attention, FlashAttention-2 style (Dao 2023), fp32 on CUDA cores: the T x T
// scores and probabilities exist only one 32 x 32 tile at a time, in registers and shared memory.
// Shapes and the += convention as in layers.cuh; hs = C / NH <= 128. The same kernels run ring
// attention's blocks (FlashOperands: separate q and k/v rows, grouped-query heads, a mask by the
// tokens' positions, and a block's result merged into the out and lse of the blocks before it).
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
#include "backends/cuda/flash_operands.cuh"
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

// --- A ring block's row deltas (the operands: flash_operands.cuh) -----------------------------

// delta[r] = dout row . out row of the query tile's 32 rows (0 past Tq), both read where they
// are (dout's rows, just loaded into the tile, come from the cache): ring attention's blocks have
// no delta scratch, so each tile kernel makes its own, before the barrier that ends its loads.
template <int kD>
__device__ __forceinline__ void tile_row_deltas(float* delta_rows, const float* dout,
                                                const void* out, bool out_bf16,
                                                std::int64_t out_head,  // row 0 of (b, h)
                                                const FlashOperands& op, int q0, int ty, int tx) {
  STRATA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int row = ty * kRows + r, t = q0 + row;
    float s = 0.0f;
    if (t < op.Tq) {
      STRATA_UNROLL
      for (int i = 0; i < kD / kGroup; ++i) {
        const int d = tx + kGroup * i;
        if (d < op.hs) {
          const std::int64_t at = out_head + std::int64_t(t) * op.o_ld + d;
          s += dout[at] * load(out, out_bf16, std::size_t(at));
        }
      }
    }
    s = row_sum(s);
    if (tx == 0) delta_rows[row] = s;
  }
}

// --- Forward ----------------------------------------------------------------------------------

// One online-softmax step of the thread's rows over key tile k0: s (raw q.k) becomes the masked,
// scaled scores' exponentials, written to p_tile; m, l and acc are rescaled to the new max. A row
// that has seen no visible key yet keeps m = -inf, l = 0 (the exponentials are taken from 0, not
// from -inf, so nothing becomes NaN).
template <int kD>
__device__ __forceinline__ void online_softmax_step(float (&s)[kRows][kCols], float (&m)[kRows],
                                                    float (&l)[kRows],
                                                    float (&acc)[kRows][kD / kGroup], float* p_tile,
                                                    float scale, const FlashOperands& op, int q0,
                                                    int k0, int ty, int tx) {
  STRATA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int qi = q0 + ty * kRows + r;
    float mx = -INFINITY;
    STRATA_UNROLL
    for (int c = 0; c < kCols; ++c) {
      const int kj = k0 + tx + kGroup * c;
      s[r][c] = visible(op, qi, kj) ? s[r][c] * scale : -INFINITY;
      mx = fmaxf(mx, s[r][c]);
    }
    const float m_new = fmaxf(m[r], row_max(mx));
    const float base = m_new == -INFINITY ? 0.0f : m_new;
    const float correction = expf(m[r] - base);  // 0 on the row's first visible tile (m = -inf)
    float sum = 0.0f;
    STRATA_UNROLL
    for (int c = 0; c < kCols; ++c) {
      const float p = expf(s[r][c] - base);  // 0 where masked
      p_tile[(ty * kRows + r) * kPStride + tx + kGroup * c] = p;
      sum += p;
    }
    l[r] = l[r] * correction + row_sum(sum);
    m[r] = m_new;
    STRATA_UNROLL
    for (int i = 0; i < kD / kGroup; ++i) acc[r][i] *= correction;
  }
}

// The thread's rows of a query tile at its end: out = acc / l, lse = m + log l where `first` (a
// row that saw no key: out 0, lse -inf); otherwise merged into the out and lse already there by
// their log-sum-exps (ring attention's later blocks; a row that saw no key is left as it is).
template <int kD>
__device__ __forceinline__ void finish_rows(void* out, bool out_bf16, float* lse,
                                            std::int64_t out_head, std::int64_t lse_head,
                                            float (&acc)[kRows][kD / kGroup],
                                            const float (&m)[kRows], const float (&l)[kRows],
                                            const FlashOperands& op, bool first, int q0, int ty,
                                            int tx) {
  STRATA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int t = q0 + ty * kRows + r;
    const bool row = t < op.Tq;
    const float block = m[r] + logf(l[r]), old = row && !first ? lse[lse_head + t] : 0.0f;
    __syncwarp();  // the row's 8 lanes read lse before its lane 0 replaces it
    if (!row || (!first && l[r] == 0.0f)) continue;
    float keep = 0.0f, weight = 1.0f / l[r], merged = block;
    if (l[r] == 0.0f) {
      weight = 0.0f, merged = -INFINITY;  // first, and nothing visible
    } else if (!first) {
      merged = fmaxf(old, block) + log1pf(expf(-fabsf(old - block)));
      keep = expf(old - merged), weight = expf(block - merged) / l[r];
    }
    if (tx == 0) lse[lse_head + t] = merged;
    STRATA_UNROLL
    for (int i = 0; i < kD / kGroup; ++i) {
      const int d = tx + kGroup * i;
      if (d >= op.hs) continue;
      const std::size_t at = std::size_t(out_head + std::int64_t(t) * op.o_ld + d);
      const float before = first ? 0.0f : keep * load(out, out_bf16, at);
      store(out, out_bf16, at, before + acc[r][i] * weight);
    }
  }
}

// out, lse of query tile qt (longest first: block x = 0 takes the last tile) of head (b, h).
template <int kD, class E>
__global__ void __launch_bounds__(kTileThreads)
    flash_forward_kernel(void* out,                           // rows of o_ld, fp32 or bf16
                         bool out_bf16,                       //
                         float* lse,                          // [B, NH, Tq]
                         const E* q, const E* k, const E* v,  // fp32 or bf16's bits
                         FlashOperands op, float scale, bool first) {
  STRATA_DYNAMIC_SHARED(float, smem);
  float* q_tile = smem;                          // [32, kD + 1]
  float* k_tile = q_tile + kHeadTileFloats<kD>;  // [32, kD + 1]
  float* v_tile = k_tile + kHeadTileFloats<kD>;  // [32, kD + 1]
  float* p_tile = v_tile + kHeadTileFloats<kD>;  // [32, 33]
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x), q0 = qt * kTile;
  const int bh = blockIdx.y, b = bh / op.NH, h = bh % op.NH, g = h / (op.NH / op.KV);
  const int ty = threadIdx.x / kGroup, tx = threadIdx.x % kGroup;
  const std::int64_t kv_head = std::int64_t(b) * op.Tk * op.kv_ld + g * op.hs;

  load_head_tile<kD>(q_tile, q + std::int64_t(b) * op.Tq * op.q_ld + h * op.hs, op.q_ld, q0, op.Tq,
                     op.hs);
  float acc[kRows][kD / kGroup] = {}, m[kRows], l[kRows];
  STRATA_UNROLL
  for (int r = 0; r < kRows; ++r) m[r] = -INFINITY, l[r] = 0.0f;
  for (int k0 = 0; tiles_meet<kTile>(op, q0, k0); k0 += kTile) {
    load_head_tile<kD>(k_tile, k + kv_head, op.kv_ld, k0, op.Tk, op.hs);
    load_head_tile<kD>(v_tile, v + kv_head, op.kv_ld, k0, op.Tk, op.hs);
    __syncthreads();  // q, k, v tiles loaded
    float s[kRows][kCols];
    tile_dot<kD>(s, q_tile, k_tile, ty, tx);
    online_softmax_step<kD>(s, m, l, acc, p_tile, scale, op, q0, k0, ty, tx);
    __syncwarp();  // p tile rows complete (a row's 8 writers and its readers are one warp)
    tile_accumulate<kD>(acc, p_tile, v_tile, ty, tx);
    __syncthreads();  // k, v and p tiles read before the next tile overwrites them
  }
  finish_rows<kD>(out, out_bf16, lse, std::int64_t(b) * op.Tq * op.o_ld + h * op.hs,
                  std::int64_t(bh) * op.Tq, acc, m, l, op, first, q0, ty, tx);
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

// A query tile's lse and delta rows (delta made from dout and out where g.delta is null).
template <int kD>
__device__ __forceinline__ void load_query_rows(float* lse_rows, float* delta_rows,
                                                const FlashGrads& g, const FlashOperands& op, int b,
                                                int h, int q0, int ty, int tx) {
  const std::int64_t bh = std::int64_t(b) * op.NH + h;
  load_row_values(lse_rows, g.lse, bh, q0, op.Tq);
  if (g.delta)
    load_row_values(delta_rows, g.delta, bh, q0, op.Tq);
  else
    tile_row_deltas<kD>(delta_rows, g.dout, g.out, g.out_bf16,
                        std::int64_t(b) * op.Tq * op.o_ld + h * op.hs, op, q0, ty, tx);
}

// The dK/dV kernel's blocks an SM for __launch_bounds__, as many as an H100 SM's shared memory
// holds at head size 128 and 64 (75 and 42 KiB a block). Without a count, sm_90's ptxas held the
// head-size-32 bf16 kernel to 64 registers and spilled.
template <int kD>
constexpr int kDkdvBlocksPerSm = kD == 128  ? 3
                                 : kD == 64 ? 5
                                            : 4;

// dK, dV of key tile blockIdx.x (the first tiles see the most query tiles) of K/V head (b, g),
// over the query heads that share it. The thread's score rows are keys, its columns queries.
template <int kD, class E>
__global__ void __launch_bounds__(kTileThreads, kDkdvBlocksPerSm<kD>)
    flash_backward_dkdv_kernel(float* dk, float* dv,  // rows of kv_ld +=
                               const E* q, const E* k, const E* v, FlashGrads g, FlashOperands op,
                               float scale) {
  STRATA_DYNAMIC_SHARED(float, smem);
  float* k_tile = smem;                            // [32, kD + 1]
  float* v_tile = k_tile + kHeadTileFloats<kD>;    // [32, kD + 1]
  float* q_tile = v_tile + kHeadTileFloats<kD>;    // [32, kD + 1]
  float* do_tile = q_tile + kHeadTileFloats<kD>;   // [32, kD + 1]
  float* pt_tile = do_tile + kHeadTileFloats<kD>;  // [32 keys, 33] P^T
  float* dst_tile = pt_tile + kTile * kPStride;    // [32 keys, 33] dS^T
  float* lse_rows = dst_tile + kTile * kPStride;   // [32] of the query tile
  float* delta_rows = lse_rows + kTile;            // [32]
  const int k0 = blockIdx.x * kTile, b = blockIdx.y / op.KV, kvh = blockIdx.y % op.KV;
  const int group = op.NH / op.KV, ty = threadIdx.x / kGroup, tx = threadIdx.x % kGroup;
  const std::int64_t kv_head = std::int64_t(b) * op.Tk * op.kv_ld + kvh * op.hs;

  load_head_tile<kD>(k_tile, k + kv_head, op.kv_ld, k0, op.Tk, op.hs);
  load_head_tile<kD>(v_tile, v + kv_head, op.kv_ld, k0, op.Tk, op.hs);
  float dkr[kRows][kD / kGroup] = {}, dvr[kRows][kD / kGroup] = {};
  int first_q0 = 0;  // the first query tile that sees this key tile; the later ones all do
  while (first_q0 < op.Tq && !tiles_meet<kTile>(op, first_q0, k0)) first_q0 += kTile;
  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    const std::int64_t o_head = std::int64_t(b) * op.Tq * op.o_ld + h * op.hs;
    for (int q0 = first_q0; q0 < op.Tq; q0 += kTile) {
      load_head_tile<kD>(q_tile, q + std::int64_t(b) * op.Tq * op.q_ld + h * op.hs, op.q_ld, q0,
                         op.Tq, op.hs);
      load_head_tile<kD>(do_tile, g.dout + o_head, op.o_ld, q0, op.Tq, op.hs);
      load_query_rows<kD>(lse_rows, delta_rows, g, op, b, h, q0, ty, tx);
      __syncthreads();  // tiles and rows loaded
      float s[kRows][kCols], dp[kRows][kCols];
      tile_dot<kD>(s, k_tile, q_tile, ty, tx);    // S^T = k q^T (unscaled)
      tile_dot<kD>(dp, v_tile, do_tile, ty, tx);  // dP^T = v dout^T
      STRATA_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int kj = k0 + ty * kRows + r;
        STRATA_UNROLL
        for (int c = 0; c < kCols; ++c) {
          const int col = tx + kGroup * c;
          const float p = visible(op, q0 + col, kj) ? expf(s[r][c] * scale - lse_rows[col]) : 0.0f;
          pt_tile[(ty * kRows + r) * kPStride + col] = p;
          dst_tile[(ty * kRows + r) * kPStride + col] = p * (dp[r][c] - delta_rows[col]);
        }
      }
      __syncwarp();  // P^T, dS^T rows complete (written and read within one warp)
      tile_accumulate<kD>(dvr, pt_tile, do_tile, ty, tx);  // dV += P^T dout
      tile_accumulate<kD>(dkr, dst_tile, q_tile, ty, tx);  // dK += dS^T q (scaled at the end)
      __syncthreads();  // every tile read before the next query tile overwrites them
    }
  }
  add_head_tile<kD>(dk + kv_head, dkr, scale, op.kv_ld, k0, op.Tk, op.hs, ty, tx);
  add_head_tile<kD>(dv + kv_head, dvr, 1.0f, op.kv_ld, k0, op.Tk, op.hs, ty, tx);
}

// dQ of query tile qt (longest first, as the forward) of head (b, h).
template <int kD, class E>
__global__ void __launch_bounds__(kTileThreads)
    flash_backward_dq_kernel(float* dq,  // rows of dq_ld +=
                             const E* q, const E* k, const E* v, FlashGrads g, FlashOperands op,
                             float scale) {
  STRATA_DYNAMIC_SHARED(float, smem);
  float* q_tile = smem;                           // [32, kD + 1]
  float* do_tile = q_tile + kHeadTileFloats<kD>;  // [32, kD + 1]
  float* k_tile = do_tile + kHeadTileFloats<kD>;  // [32, kD + 1]
  float* v_tile = k_tile + kHeadTileFloats<kD>;   // [32, kD + 1]
  float* ds_tile = v_tile + kHeadTileFloats<kD>;  // [32 queries, 33] dS
  float* lse_rows = ds_tile + kTile * kPStride;   // [32]
  float* delta_rows = lse_rows + kTile;           // [32]
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x), q0 = qt * kTile;
  const int bh = blockIdx.y, b = bh / op.NH, h = bh % op.NH, kvh = h / (op.NH / op.KV);
  const int ty = threadIdx.x / kGroup, tx = threadIdx.x % kGroup;
  const std::int64_t kv_head = std::int64_t(b) * op.Tk * op.kv_ld + kvh * op.hs;

  load_head_tile<kD>(q_tile, q + std::int64_t(b) * op.Tq * op.q_ld + h * op.hs, op.q_ld, q0, op.Tq,
                     op.hs);
  load_head_tile<kD>(do_tile, g.dout + std::int64_t(b) * op.Tq * op.o_ld + h * op.hs, op.o_ld, q0,
                     op.Tq, op.hs);
  load_query_rows<kD>(lse_rows, delta_rows, g, op, b, h, q0, ty, tx);
  float dqr[kRows][kD / kGroup] = {};
  for (int k0 = 0; tiles_meet<kTile>(op, q0, k0); k0 += kTile) {
    load_head_tile<kD>(k_tile, k + kv_head, op.kv_ld, k0, op.Tk, op.hs);
    load_head_tile<kD>(v_tile, v + kv_head, op.kv_ld, k0, op.Tk, op.hs);
    __syncthreads();  // tiles loaded
    float s[kRows][kCols], dp[kRows][kCols];
    tile_dot<kD>(s, q_tile, k_tile, ty, tx);    // S = q k^T (unscaled)
    tile_dot<kD>(dp, do_tile, v_tile, ty, tx);  // dP = dout v^T
    STRATA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = ty * kRows + r;
      STRATA_UNROLL
      for (int c = 0; c < kCols; ++c) {
        const int col = tx + kGroup * c;
        const float p =
            visible(op, q0 + row, k0 + col) ? expf(s[r][c] * scale - lse_rows[row]) : 0.0f;
        ds_tile[row * kPStride + col] = p * (dp[r][c] - delta_rows[row]);
      }
    }
    __syncwarp();  // dS rows complete (written and read within one warp)
    tile_accumulate<kD>(dqr, ds_tile, k_tile, ty, tx);  // dQ += dS k (scaled at the end)
    __syncthreads();  // k and dS read before the next key tile overwrites them
  }
  add_head_tile<kD>(dq + std::int64_t(b) * op.Tq * op.dq_ld + h * op.hs, dqr, scale, op.dq_ld, q0,
                    op.Tq, op.hs, ty, tx);
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
void with_head_size(const char* op, int B, int NH, int KV, int hs, F&& f) {
  if (B < 0 || NH <= 0 || KV <= 0 || NH % KV != 0 || hs <= 0 || hs > kMaxHead ||
      std::int64_t(B) * NH > 65535)
    throw Error(std::string(op) + ": shape B " + std::to_string(B) + ", " + std::to_string(NH) +
                    " heads of " + std::to_string(hs) + " (" + std::to_string(KV) +
                    " key-value heads) not supported",
                "the head size must be at most 128, the key-value heads divide the heads, and "
                "B * heads <= 65535");
  if (hs <= 16)
    f(std::integral_constant<int, 16>{});
  else if (hs <= 32)
    f(std::integral_constant<int, 32>{});
  else if (hs <= 64)
    f(std::integral_constant<int, 64>{});
  else
    f(std::integral_constant<int, 128>{});
}
void check_whole_sequence(const char* op, int T, int C, int NH) {
  if (T < 0 || C <= 0 || NH <= 0 || C % NH != 0)
    throw Error(std::string(op) + ": shape T " + std::to_string(T) + ", C " + std::to_string(C) +
                    ", NH " + std::to_string(NH) + " not supported",
                "NH must divide C with a head size C / NH of at most 128");
}
// The grid of a tile kernel: query or key tiles x heads.
dim3 tile_grid(int B, int T, int heads) {
  return dim3(unsigned((T + kTile - 1) / kTile), unsigned(B * heads));
}

// The three launches on any operands (q, k, v typed as E: float or bf16's bits).
template <int kD, class E>
void launch_forward(const CudaContext& ctx, ActView out, float* lse, const E* q, const E* k,
                    const E* v, const FlashOperands& op, int B, bool first) {
  const float scale = 1.0f / std::sqrt(float(op.hs));
  allow_shared_memory(flash_forward_kernel<kD, E>, forward_smem_bytes<kD>());
  STRATA_LAUNCH((flash_forward_kernel<kD, E>), tile_grid(B, op.Tq, op.NH), kTileThreads,
                forward_smem_bytes<kD>(), ctx.stream)
  (out.data, out.is_bf16(), lse, q, k, v, op, scale, first);
  STRATA_CUDA_CHECK_LAUNCH();
}
template <int kD, class E>
void launch_backward(const CudaContext& ctx, float* dq, float* dk, float* dv, const E* q,
                     const E* k, const E* v, const FlashGrads& g, const FlashOperands& op, int B) {
  const float scale = 1.0f / std::sqrt(float(op.hs));
  allow_shared_memory(flash_backward_dkdv_kernel<kD, E>, dkdv_smem_bytes<kD>());
  STRATA_LAUNCH((flash_backward_dkdv_kernel<kD, E>), tile_grid(B, op.Tk, op.KV), kTileThreads,
                dkdv_smem_bytes<kD>(), ctx.stream)
  (dk, dv, q, k, v, g, op, scale);
  STRATA_CUDA_CHECK_LAUNCH();
  allow_shared_memory(flash_backward_dq_kernel<kD, E>, dq_smem_bytes<kD>());
  STRATA_LAUNCH((flash_backward_dq_kernel<kD, E>), tile_grid(B, op.Tq, op.NH), kTileThreads,
                dq_smem_bytes<kD>(), ctx.stream)
  (dq, q, k, v, g, op, scale);
  STRATA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void flash_attention_forward(const CudaContext& ctx, ActView out, float* lse, ActView qkv, int B,
                             int T, int C, int NH) {
  check_whole_sequence("flash_attention_forward", T, C, NH);
  with_head_size("flash_attention_forward", B, NH, NH, C / NH, [&](auto head) {
    constexpr int kD = decltype(head)::value;
    if (B == 0 || T == 0) return;
    with_element_type(qkv.is_bf16(), [&](auto type) {
      using E = typename decltype(type)::type;
      const E* q = static_cast<const E*>(qkv.data);
      launch_forward<kD>(ctx, out, lse, q, q + C, q + 2 * C, whole_sequence(T, C, NH), B, true);
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
  check_whole_sequence("flash_attention_backward", T, C, NH);
  with_head_size("flash_attention_backward", B, NH, NH, C / NH, [&](auto head) {
    constexpr int kD = decltype(head)::value;
    if (B == 0 || T == 0) return;
    attention_delta(ctx, delta, dout, out, B, T, C, NH);
    with_element_type(qkv.is_bf16(), [&](auto type) {
      using E = typename decltype(type)::type;
      const E* q = static_cast<const E*>(qkv.data);
      const FlashGrads g{dout, out.data, out.is_bf16(), lse, delta};
      launch_backward<kD>(ctx, dqkv, dqkv + C, dqkv + 2 * C, q, q + C, q + 2 * C, g,
                          whole_sequence(T, C, NH), B);
    });
  });
}

void attention_block_forward(const CudaContext& ctx, float* o, float* lse, ActView q, int q_stride,
                             ActView kv, int B, int Tq, int Tk, int NH, int KV, int hs,
                             TokenPositions qpos, TokenPositions kpos, bool first) {
  const FlashOperands op = ring_operands("attention_block_forward", q, q_stride, q_stride, kv, Tq,
                                         Tk, NH, KV, hs, qpos, kpos);
  with_head_size("attention_block_forward", B, NH, KV, hs, [&](auto head) {
    constexpr int kD = decltype(head)::value;
    if (B == 0 || Tq == 0) return;
    with_block_operands(q, kv, KV, hs, [&](auto q_rows, auto k, auto v) {
      launch_forward<kD>(ctx, ActView(o), lse, q_rows, k, v, op, B, first);
    });
  });
}

void attention_block_backward(const CudaContext& ctx, float* dq, int dq_stride, float* dkv,
                              const float* dout, ActView out, const float* lse, ActView q,
                              int q_stride, ActView kv, int B, int Tq, int Tk, int NH, int KV,
                              int hs, TokenPositions qpos, TokenPositions kpos) {
  const FlashOperands op = ring_operands("attention_block_backward", q, q_stride, dq_stride, kv, Tq,
                                         Tk, NH, KV, hs, qpos, kpos);
  const FlashGrads g{dout, out.data, out.is_bf16(), lse, nullptr};
  with_head_size("attention_block_backward", B, NH, KV, hs, [&](auto head) {
    constexpr int kD = decltype(head)::value;
    if (B == 0 || Tq == 0 || Tk == 0) return;
    with_block_operands(q, kv, KV, hs, [&](auto q_rows, auto k, auto v) {
      launch_backward<kD>(ctx, dq, dkv, dkv + std::size_t(KV) * hs, q_rows, k, v, g, op, B);
    });
  });
}

}  // namespace strata::cuda
