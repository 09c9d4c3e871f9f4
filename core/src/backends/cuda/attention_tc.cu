// Fused causal self-attention on tensor cores: FlashAttention-2 (Dao 2023), bf16 operands and fp32
// accumulation on mma.sync m16n8k16 (ptx.cuh). The same API, state and += convention as the fp32
// kernel (attention.cu, layers.cuh): lse [B,NH,T] kept by the forward, delta [B,NH,T] scratch of
// the backward, no T x T matrix in memory, deterministic (no atomics).
//
// Precision: Q, K, V and dout are rounded to bf16 (to nearest even) as they are loaded into shared
// memory; P and dS are rounded to bf16 as the operands of the second GEMMs (P V, P^T dout, dS^T q,
// dS k). Scores, softmax, lse, delta and every accumulator are fp32. The softmax runs in base 2
// (exp2f of scores scaled by log2(e) / sqrt(hs)); lse is stored in natural log, as the fp32 kernel.
//
// Blocks of 4 warps (128 threads) own 64 rows, 16 per warp (one MMA tile high), and stream tiles
// of 64 columns through two shared buffers: the next tile's copies (cp.async for a bf16 run's
// Q, K, V) fly while this one's products run, and one __syncthreads a tile both publishes a tile
// and frees the other buffer. Everything else is registers, in the PTX fragment layouts (ptx.cuh),
// which say which rows a lane holds: lane l holds rows g = l / 4 and g + 8 of its warp's 16, at
// columns 2t, 2t + 1 (t = l % 4) of every 8-column block. A row is spread over the 4 lanes of a
// quad (its max and sum: two shuffles), and an accumulator block of scores is, packed to bf16,
// the A fragment of the next product (pack_a_frags), so S, P, dP and dS never touch shared memory.
//
// Forward, one block per (query tile, b, h), longest first: per key tile S = Q K^T, the online
// softmax (O = O * exp2(m_old - m_new) + P V), and at the end O / l and lse from each lane.
// Backward, three launches: delta = rowsum(dout * out) (one warp per row), then
//   dK, dV: one block per (key tile, b, h); per query tile, 32 queries at a time (16 at head
//     size 128, where dK and dV hold 128 registers): S^T = K q^T and dP^T = V dout^T, P^T =
//     exp2(S^T scale - lse), dS^T = P^T (dP^T - delta), then dV += P^T dout and dK += dS^T q (dK
//     scaled at the end);
//   dQ: one block per (query tile, b, h), longest first; per key tile, as many keys at a time:
//     S = Q K^T, dP = dout V^T, P and dS, then dQ += dS K.
//   P and dP are computed twice (dK/dV and dQ): the price of no atomics.
// The same kernels run ring attention's blocks (FlashOperands, flash_operands.cuh, as the fp32
// kernels do): a query tile's key tiles are those it sees, a key tile's dK/dV block runs the
// query heads that share its K/V head, each over the query tiles that see it; the mask (by the
// tokens' positions) is evaluated only on the tile pairs not wholly visible; a block's out and
// lse are merged into the earlier blocks'; where there is no delta scratch each query tile makes
// its rows' deltas.
//
// Shared memory: bf16 tiles have rows of kD + 8 (16 bytes of padding: ldmatrix and cp.async take
// 16-byte aligned rows, and the padding puts the 8 rows of an ldmatrix in 8 different banks). The
// head size hs (a multiple of 16, at most 128) is padded to kD = 64 or 128 with zero columns.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "../kernels.hpp"  // cuda_tensor_core_attention ("kernels.hpp" is cuda/kernels.hpp here)
#include "backends/cuda/bf16.cuh"
#include "backends/cuda/device.hpp"
#include "backends/cuda/flash_operands.cuh"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/layers.cuh"
#include "backends/cuda/ptx.cuh"
#include "strata/types.hpp"

// Full unrolling of the loops over fragment arrays (their indices must be compile-time constants
// to keep the fragments in registers). nvcc only: the host compiler would warn about the pragma.
#if defined(__CUDACC__)
#define STRATA_UNROLL _Pragma("unroll")
#define STRATA_NO_UNROLL _Pragma("unroll 1")
#else
#define STRATA_UNROLL
#define STRATA_NO_UNROLL
#endif

namespace strata::cuda {
namespace {

using bfloat16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kWarpRows = 16;              // an MMA tile's height
constexpr int kRows = kWarps * kWarpRows;  // rows of a block: queries, or keys (dK/dV)
constexpr int kCols = 64;                  // columns of a streamed tile: keys, or queries (dK/dV)
constexpr int kMaxHead = 128;
constexpr unsigned kFull = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int kD>
constexpr int kTileStride = kD + 8;  // bf16 [64, kD] Q / K / V / dout tiles
template <int kD>
constexpr int kTileElements = kRows* kTileStride<kD>;
template <int kD>
constexpr std::size_t kTileBytes = sizeof(bfloat16) * kTileElements<kD>;
constexpr std::size_t kRowValueBytes = sizeof(float) * kRows;
// Blocks an SM should hold (__launch_bounds__): ptxas then keeps a thread within 65536 / (128 n)
// registers. Without it, sm_90's ptxas capped the forward at head size 64 at 128 registers and
// spilled.
// The backward's columns at a time: 32, or 16 at kD 128 (dK and dV take 128 registers there).
template <int kD>
constexpr int kSubCols = kD <= 64 ? 32 : 16;
template <int kD>
constexpr int kBlocksPerSm = kD <= 64 ? 3 : 2;

// The unit of the dynamic shared memory: 128-byte aligned, more than ldmatrix's and cp.async's
// 16 bytes (CUDA promises only 16 bytes for an array of floats).
struct alignas(128) SharedUnit {
  unsigned char bytes[128];
};

// Carves consecutive buffers out of the dynamic shared memory.
struct SharedCarver {
  unsigned char* next;
  template <class T>
  __device__ T* take(std::size_t bytes) {
    T* p = reinterpret_cast<T*>(next);
    next += bytes;
    return p;
  }
};

// --- Global memory: the only functions that read or write the activations ------------------------

// tile[r][d] = bf16(src[(row0 + r) * ld + d]) for r < 64, d < kD; 0 where row0 + r >= T or d >= hs.
// Four columns a thread where src and ld allow 16-byte fp32 or 8-byte bf16 loads (hs is a
// multiple of 16, so four columns never straddle hs), a quarter of the load instructions.
// src: dout, or an fp32 run's Q, K, V (or a bf16 view that cp.async cannot take: stage_tile).
template <int kD>
__device__ __forceinline__ void load_tile_bf16(bfloat16* tile, const float* src, int ld, int row0,
                                               int T, int hs) {
  if (ld % 4 == 0 && reinterpret_cast<std::uintptr_t>(src) % 16 == 0) {
    for (int e = 4 * int(threadIdx.x); e < kRows * kD; e += 4 * kThreads) {
      const int r = e / kD, d = e % kD, t = row0 + r;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (t < T && d < hs) v = *reinterpret_cast<const float4*>(src + std::int64_t(t) * ld + d);
      bfloat16* out = tile + r * kTileStride<kD> + d;  // 8-byte aligned: kTileStride and d even
      out[0] = __float2bfloat16_rn(v.x), out[1] = __float2bfloat16_rn(v.y);
      out[2] = __float2bfloat16_rn(v.z), out[3] = __float2bfloat16_rn(v.w);
    }
    return;
  }
  for (int e = threadIdx.x; e < kRows * kD; e += kThreads) {
    const int r = e / kD, d = e % kD, t = row0 + r;
    const float v = t < T && d < hs ? src[std::int64_t(t) * ld + d] : 0.0f;
    tile[r * kTileStride<kD> + d] = __float2bfloat16_rn(v);
  }
}
// The same from bf16 (a bf16 run's Q, K, V: its 16 bits), copied as they are: four columns a
// thread with 8-byte loads where src and ld allow.
template <int kD>
__device__ __forceinline__ void load_tile_bf16(bfloat16* tile, const std::uint16_t* src, int ld,
                                               int row0, int T, int hs) {
  if (ld % 4 == 0 && reinterpret_cast<std::uintptr_t>(src) % 8 == 0) {
    for (int e = 4 * int(threadIdx.x); e < kRows * kD; e += 4 * kThreads) {
      const int r = e / kD, d = e % kD, t = row0 + r;
      uint2 v = make_uint2(0u, 0u);
      if (t < T && d < hs) v = *reinterpret_cast<const uint2*>(src + std::int64_t(t) * ld + d);
      bfloat16* out = tile + r * kTileStride<kD> + d;
      out[0] = __ushort_as_bfloat16(std::uint16_t(v.x & 0xffffu));
      out[1] = __ushort_as_bfloat16(std::uint16_t(v.x >> 16));
      out[2] = __ushort_as_bfloat16(std::uint16_t(v.y & 0xffffu));
      out[3] = __ushort_as_bfloat16(std::uint16_t(v.y >> 16));
    }
    return;
  }
  for (int e = threadIdx.x; e < kRows * kD; e += kThreads) {
    const int r = e / kD, d = e % kD, t = row0 + r;
    tile[r * kTileStride<kD> + d] =
        __ushort_as_bfloat16(t < T && d < hs ? src[std::int64_t(t) * ld + d] : std::uint16_t(0));
  }
}

// v[r] = factor src[bh * T + row0 + r] for r < 64; 0 past T. (lse or delta of a tile's rows.)
__device__ __forceinline__ void load_row_values(float* v, const float* src, std::int64_t bh,
                                                int row0, int T, float factor) {
  for (int r = threadIdx.x; r < kRows; r += kThreads)
    v[r] = row0 + r < T ? factor * src[bh * T + row0 + r] : 0.0f;
}

// A tile of 64 rows x kD columns into shared memory (row stride kTileStride): a bf16 source whose
// rows are 16-byte aligned by cp.async, 16 bytes a copy, without registers (zeros past T and hs);
// otherwise, or from fp32, by load_tile_bf16. Either way the caller's cp_async_wait_all and
// __syncthreads make it visible.
template <int kD>
__device__ __forceinline__ void stage_tile(bfloat16* tile, const std::uint16_t* src, int ld,
                                           int row0, int T, int hs) {
  if (ld % 8 != 0 || reinterpret_cast<std::uintptr_t>(src) % 16 != 0)
    return load_tile_bf16<kD>(tile, src, ld, row0, T, hs);
  constexpr int kChunks = kD / 8;  // 16-byte chunks of a row
  for (int e = threadIdx.x; e < kRows * kChunks; e += kThreads) {
    const int r = e / kChunks, d = 8 * (e % kChunks), t = row0 + r;
    const bool inside = t < T && d < hs;  // hs is a multiple of 16: a chunk is all in or all out
    cp_async_16(tile + r * kTileStride<kD> + d, inside ? src + std::int64_t(t) * ld + d : src,
                inside);
  }
}
template <int kD>
__device__ __forceinline__ void stage_tile(bfloat16* tile, const float* src, int ld, int row0,
                                           int T, int hs) {
  load_tile_bf16<kD>(tile, src, ld, row0, T, hs);
}

// --- Warp-level fragments (mma.sync m16n8k16, ptx.cuh) -------------------------------------------

// c[nb] = A B^T for the 8 rows 8 nb .. 8 nb + 7 of `b_rows` (kBlocks blocks): A the warp's 16
// rows of a head tile (a_rows), B^T the rows of another (as the column-major B operand, the
// row-major tile itself): Q K^T, K q^T, V dout^T, dout V^T. Per 16 columns of kD, one ldmatrix
// gives A's fragment and one each two blocks' B (A is reloaded rather than kept: registers).
template <int kD, int kBlocks>
__device__ __forceinline__ void product_with_rows(float (&c)[kBlocks][4], const bfloat16* a_rows,
                                                  const bfloat16* b_rows) {
  const int lane = threadIdx.x % 32, m = lane / 8;
  STRATA_UNROLL
  for (int nb = 0; nb < kBlocks; ++nb) c[nb][0] = c[nb][1] = c[nb][2] = c[nb][3] = 0.0f;
  STRATA_UNROLL
  for (int kk = 0; kk < kD / 16; ++kk) {
    std::uint32_t a[4];
    ldmatrix_x4(a, a_rows + (lane % 16) * kTileStride<kD> + 16 * kk + 8 * (lane / 16));
    STRATA_UNROLL
    for (int p = 0; p < kBlocks / 2; ++p) {
      std::uint32_t r[4];
      ldmatrix_x4(
          r, b_rows + ((2 * p + m / 2) * 8 + lane % 8) * kTileStride<kD> + 16 * kk + 8 * (m % 2));
      const std::uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_bf16_16816(c[2 * p], a, b0);
      mma_bf16_16816(c[2 * p + 1], a, b1);
    }
  }
}

// acc[nd] += P M for dims 8 nd .. 8 nd + 7: P the warp's A fragments over 16 kSteps columns, M
// the head tile's rows from `m_rows` on (row-major B: ldmatrix's transpose gives two dim blocks'
// B at one 16-row step). P V, P^T dout, dS^T q, dS k.
template <int kD, int kSteps>
__device__ __forceinline__ void accumulate_product(float (&acc)[kD / 8][4],
                                                   const std::uint32_t (&pa)[kSteps][4],
                                                   const bfloat16* m_rows) {
  const int lane = threadIdx.x % 32, m = lane / 8;
  STRATA_UNROLL
  for (int j = 0; j < kSteps; ++j) {
    STRATA_UNROLL
    for (int q = 0; q < kD / 16; ++q) {
      std::uint32_t r[4];
      ldmatrix_x4_trans(
          r, m_rows + (16 * j + 8 * (m % 2) + lane % 8) * kTileStride<kD> + 8 * (2 * q + m / 2));
      const std::uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_bf16_16816(acc[2 * q], pa[j], b0);
      mma_bf16_16816(acc[2 * q + 1], pa[j], b1);
    }
  }
}

// Two fp32 as bf16 (rounded to nearest even) in a register, a in the low half.
__device__ __forceinline__ std::uint32_t pack_bf16(float a, float b) {
  return std::uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(a))) |
         std::uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(b))) << 16;
}

// pa[j] = the A fragment of columns 16 j .. 16 j + 15 of accumulator blocks c (8 columns each):
// block 2 j gives a0 (row g), a1 (row g + 8), block 2 j + 1 gives a2, a3.
template <int kSteps>
__device__ __forceinline__ void pack_a_frags(std::uint32_t (&pa)[kSteps][4],
                                             const float (&c)[2 * kSteps][4]) {
  STRATA_UNROLL
  for (int j = 0; j < kSteps; ++j) {
    STRATA_UNROLL
    for (int r = 0; r < 4; ++r)
      pa[j][r] = pack_bf16(c[2 * j + r / 2][2 * (r % 2)], c[2 * j + r / 2][2 * (r % 2) + 1]);
  }
}

// dst[(row + 8 (i / 2)) ld + d] += scale acc for the lane's elements inside T rows and hs columns
// (row: global row of the lane's g). dK, dV, dQ.
template <int kD>
__device__ __forceinline__ void add_lane_rows(float* dst, int ld, const float (&acc)[kD / 8][4],
                                              float scale, int row, int T, int hs) {
  const int t = threadIdx.x % 4;
  STRATA_UNROLL
  for (int nd = 0; nd < kD / 8; ++nd) {
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int r = row + 8 * (i / 2), d = 8 * nd + 2 * t + i % 2;
      if (r < T && d < hs) dst[std::int64_t(r) * ld + d] += scale * acc[nd][i];
    }
  }
}

// --- Forward -------------------------------------------------------------------------------------

// One online-softmax step of the lane's two rows (h = 0: row g, 1: row g + 8) over a key tile:
// raw scores s become P = exp2(s scale_log2 - m_new), packed to bf16 as the A fragments pa of P V;
// l (this lane's partial row sum) adds those rounded weights, read back from pa's bits; m moves to
// the new max, l and o are rescaled by exp2(m_old - m_new). Where the tiles need it (`mask`), the
// keys a row does not see are masked (FlashOperands' positions, keys past Tk). A row that has seen
// no key yet keeps m = -inf and l = 0: its exponentials are taken from 0, so nothing is NaN.
template <int kD>
__device__ __forceinline__ void online_softmax(float (&s)[kCols / 8][4],
                                               std::uint32_t (&pa)[kCols / 16][4], float (&m)[2],
                                               float (&l)[2], float (&o)[kD / 8][4],
                                               const FlashOperands& op, bool mask, int row_query,
                                               int k0, float scale_log2) {
  const int t = threadIdx.x % 4;
  float mx[2] = {-INFINITY, -INFINITY};
  STRATA_UNROLL
  for (int nb = 0; nb < kCols / 8; ++nb) {
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int key = k0 + 8 * nb + 2 * t + i % 2, query = row_query + 8 * (i / 2);
      s[nb][i] = mask && !visible(op, query, key) ? -INFINITY : s[nb][i] * scale_log2;
      mx[i / 2] = fmaxf(mx[i / 2], s[nb][i]);
    }
  }
  float correction[2], base[2];
  STRATA_UNROLL
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(kFull, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(kFull, mx[h], 2));
    const float m_new = fmaxf(m[h], mx[h]);
    base[h] = m_new == -INFINITY ? 0.0f : m_new;
    correction[h] = exp2f(m[h] - base[h]);  // 0 on the row's first tile with a key (m = -inf)
    m[h] = m_new, l[h] *= correction[h];
  }
  STRATA_UNROLL
  for (int nb = 0; nb < kCols / 8; ++nb) {
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) s[nb][i] = exp2f(s[nb][i] - base[i / 2]);
  }
  pack_a_frags(pa, s);
  // One weight at a time, in key order: a0 then a2 hold row g's, a1 then a3 row g + 8's.
  STRATA_UNROLL
  for (int j = 0; j < kCols / 16; ++j) {
    STRATA_UNROLL
    for (int r = 0; r < 4; ++r) {
      l[r % 2] += __uint_as_float(pa[j][r] << 16);          // the low bf16: the even key
      l[r % 2] += __uint_as_float(pa[j][r] & 0xffff0000u);  // the high: the odd key
    }
  }
  STRATA_UNROLL
  for (int nd = 0; nd < kD / 8; ++nd) {
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) o[nd][i] *= correction[i / 2];
  }
}

// The lane's two rows inside Tq rows and hs columns at their end: out = o / l and lse = (m + log2
// l) ln 2 where `first` (a row that saw no key: out 0, lse -inf); otherwise merged into the out and
// lse already there by their log-sum-exps (ring attention's later blocks; a row that saw no key
// of this block is left as it is).
template <int kD>
__device__ __forceinline__ void write_forward_rows(void* out, bool out_bf16, std::int64_t out_head,
                                                   float* lse, std::int64_t lse_head,
                                                   const float (&o)[kD / 8][4], const float (&m)[2],
                                                   float (&l)[2], const FlashOperands& op,
                                                   bool first, int row_query) {
  const int t = threadIdx.x % 4;
  float keep[2] = {0.0f, 0.0f}, weight[2];
  bool write[2];
  STRATA_UNROLL
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(kFull, l[h], 1);
    l[h] += __shfl_xor_sync(kFull, l[h], 2);
    const int query = row_query + 8 * h;
    const float block = l[h] > 0.0f ? (m[h] + log2f(l[h])) * kLn2 : -INFINITY;
    const float old = query < op.Tq && !first ? lse[lse_head + query] : 0.0f;
    __syncwarp();  // the row's 4 lanes read lse before its lane 0 replaces it
    write[h] = query < op.Tq && (first || l[h] > 0.0f);
    float merged = block;
    weight[h] = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    if (!first && l[h] > 0.0f) {
      merged = fmaxf(old, block) + log1pf(expf(-fabsf(old - block)));
      keep[h] = expf(old - merged), weight[h] = expf(block - merged) / l[h];
    }
    if (t == 0 && write[h]) lse[lse_head + query] = merged;
  }
  STRATA_UNROLL
  for (int nd = 0; nd < kD / 8; ++nd) {
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int h = i / 2, query = row_query + 8 * h, d = 8 * nd + 2 * t + i % 2;
      if (!write[h] || d >= op.hs) continue;
      const std::size_t at = std::size_t(out_head + std::int64_t(query) * op.o_ld + d);
      // The whole sequence's (first) divides, as before the merge existed.
      const float value = first ? (l[h] > 0.0f ? o[nd][i] / l[h] : 0.0f)
                                : keep[h] * load(out, out_bf16, at) + o[nd][i] * weight[h];
      store(out, out_bf16, at, value);
    }
  }
}

// out, lse of query tile qt (longest first: block x = 0 takes the last tile) of head (b, h), over
// the key tiles it sees (a prefix).
template <int kD, class E>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm<kD>)
    tc_forward_kernel(void* out,                           // rows of o_ld, fp32 or bf16
                      bool out_bf16,                       //
                      float* lse,                          // [B, NH, Tq]
                      const E* q, const E* k, const E* v,  // fp32 or bf16's bits
                      FlashOperands op, float scale_log2, bool first) {
  STRATA_DYNAMIC_SHARED(SharedUnit, smem);
  SharedCarver carve{smem->bytes};
  bfloat16* q_tile = carve.take<bfloat16>(kTileBytes<kD>);       // [64, kD + 8]
  bfloat16* k_tiles = carve.take<bfloat16>(2 * kTileBytes<kD>);  // [2][64, kD + 8]
  bfloat16* v_tiles = carve.take<bfloat16>(2 * kTileBytes<kD>);  // [2][64, kD + 8]
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x), q0 = qt * kRows;
  const int bh = blockIdx.y, b = bh / op.NH, h = bh % op.NH, g = h / (op.NH / op.KV);
  const int w0 = threadIdx.x / 32 * kWarpRows, row_query = q0 + w0 + threadIdx.x % 32 / 4;
  const E* q_head = q + std::int64_t(b) * op.Tq * op.q_ld + h * op.hs;
  const std::int64_t kv_head = std::int64_t(b) * op.Tk * op.kv_ld + g * op.hs;

  stage_tile<kD>(q_tile, q_head, op.q_ld, q0, op.Tq, op.hs);
  stage_tile<kD>(k_tiles, k + kv_head, op.kv_ld, 0, op.Tk, op.hs);
  stage_tile<kD>(v_tiles, v + kv_head, op.kv_ld, 0, op.Tk, op.hs);
  cp_async_commit();
  std::uint32_t pa[kCols / 16][4];
  float s[kCols / 8][4], o[kD / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  STRATA_UNROLL
  for (int nd = 0; nd < kD / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
  for (int kt = 0; tiles_meet<kRows>(op, q0, kt * kCols); ++kt) {
    const int buffer = kt % 2 * kTileElements<kD>, next = (kt + 1) % 2 * kTileElements<kD>;
    cp_async_wait_all();
    __syncthreads();  // tile kt staged; every warp done with tile kt - 1's buffers
    if (tiles_meet<kRows>(op, q0, (kt + 1) * kCols)) {
      stage_tile<kD>(k_tiles + next, k + kv_head, op.kv_ld, (kt + 1) * kCols, op.Tk, op.hs);
      stage_tile<kD>(v_tiles + next, v + kv_head, op.kv_ld, (kt + 1) * kCols, op.Tk, op.hs);
      cp_async_commit();
    }
    product_with_rows<kD, kCols / 8>(s, q_tile + w0 * kTileStride<kD>, k_tiles + buffer);
    online_softmax<kD>(s, pa, m, l, o, op, !tiles_all_visible<kRows, kCols>(op, q0, kt * kCols),
                       row_query, kt * kCols, scale_log2);
    accumulate_product<kD, kCols / 16>(o, pa, v_tiles + buffer);
  }
  cp_async_wait_all();  // a tile staged for a query tile that sees none
  write_forward_rows<kD>(out, out_bf16, std::int64_t(b) * op.Tq * op.o_ld + h * op.hs, lse,
                         std::int64_t(bh) * op.Tq, o, m, l, op, first, row_query);
}

// --- Backward ------------------------------------------------------------------------------------

// P = exp2(s scale_log2 - lse2) (0 where masked) into s and dS = P (dp - delta) into dp, for the
// lane's elements of kBlocks blocks of 8 columns of a 16-row block. kKeyRows (dK/dV: P^T, dS^T):
// rows are keys (row: the lane's g's key), columns queries (col0: the first column's query; lse2
// and delta indexed by column from col0); else rows are queries (lse2, delta indexed by row from
// the lane's g) and columns keys. Where the tiles need it (`mask`), a query sees only the keys
// FlashOperands makes visible to it, and queries past Tq see none.
template <bool kKeyRows, int kBlocks>
__device__ __forceinline__ void probabilities_and_ds(float (&s)[kBlocks][4],
                                                     float (&dp)[kBlocks][4], const float* lse2,
                                                     const float* delta, int row, int col0,
                                                     const FlashOperands& op, bool mask,
                                                     float scale_log2) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  STRATA_UNROLL
  for (int nb = 0; nb < kBlocks; ++nb) {
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int r = row + 8 * (i / 2), c = col0 + 8 * nb + 2 * t + i % 2;
      const int key = kKeyRows ? r : c, query = kKeyRows ? c : r;
      const int local = kKeyRows ? 8 * nb + 2 * t + i % 2 : g + 8 * (i / 2);
      const float p =
          !mask || visible(op, query, key) ? exp2f(s[nb][i] * scale_log2 - lse2[local]) : 0.0f;
      s[nb][i] = p;
      dp[nb][i] = p * (dp[nb][i] - delta[local]);
    }
  }
}

// dV += P^T dout and dK += dS^T q of the warp's 16 keys (k_rows, v_rows: theirs in the K and V
// tiles; key: the lane's g's) against a staged query tile at q0 (q_tile, do_tile; lse2 and delta
// of its 64 queries), kSubCols queries at a time.
template <int kD>
__device__ __forceinline__ void key_rows_step(float (&dk)[kD / 8][4], float (&dv)[kD / 8][4],
                                              const bfloat16* k_rows, const bfloat16* v_rows,
                                              const bfloat16* q_tile, const bfloat16* do_tile,
                                              const float* lse2, const float* delta, int key,
                                              int q0, const FlashOperands& op, bool mask,
                                              float scale_log2) {
  constexpr int kSub = kSubCols<kD>;
  STRATA_NO_UNROLL  // one copy of the body: unrolled, each copy held its own addresses
      for (int c0 = 0; c0 < kCols; c0 += kSub) {
    float s[kSub / 8][4], dp[kSub / 8][4];
    std::uint32_t pa[kSub / 16][4];
    product_with_rows<kD, kSub / 8>(s, k_rows, q_tile + c0 * kTileStride<kD>);    // S^T
    product_with_rows<kD, kSub / 8>(dp, v_rows, do_tile + c0 * kTileStride<kD>);  // dP^T
    probabilities_and_ds<true, kSub / 8>(s, dp, lse2 + c0, delta + c0, key, q0 + c0, op, mask,
                                         scale_log2);
    pack_a_frags(pa, s);
    accumulate_product<kD, kSub / 16>(dv, pa, do_tile + c0 * kTileStride<kD>);
    pack_a_frags(pa, dp);
    accumulate_product<kD, kSub / 16>(dk, pa, q_tile + c0 * kTileStride<kD>);
  }
}

// delta[r] = dout row . out row of a query tile's 64 rows (0 past Tq), two threads a row, read
// where they are: ring attention's blocks have no delta scratch (FlashGrads::delta null).
__device__ __forceinline__ void tile_row_deltas(float* delta_rows, const FlashGrads& g,
                                                std::int64_t o_head, const FlashOperands& op,
                                                int q0) {
  static_assert(kThreads == 2 * kRows, "two threads a row");
  const int r = threadIdx.x / 2, t = q0 + r;
  float s = 0.0f;
  if (t < op.Tq)
    for (int d = threadIdx.x % 2; d < op.hs; d += 2) {
      const std::int64_t at = o_head + std::int64_t(t) * op.o_ld + d;
      s += g.dout[at] * load(g.out, g.out_bf16, std::size_t(at));
    }
  s += __shfl_xor_sync(kFull, s, 1);
  if (threadIdx.x % 2 == 0) delta_rows[r] = s;
}

// Query tile q0 of head (b, h) into shared memory: Q (by cp.async where it can), dout, lse log2(e)
// and delta (made from dout and out where g.delta is null).
template <int kD, class E>
__device__ __forceinline__ void stage_query_tile(bfloat16* q_tile, bfloat16* do_tile, float* lse2,
                                                 float* delta_rows, const E* q, const FlashGrads& g,
                                                 const FlashOperands& op, int b, int h, int q0) {
  const std::int64_t bh = std::int64_t(b) * op.NH + h;
  const std::int64_t o_head = std::int64_t(b) * op.Tq * op.o_ld + h * op.hs;
  stage_tile<kD>(q_tile, q + std::int64_t(b) * op.Tq * op.q_ld + h * op.hs, op.q_ld, q0, op.Tq,
                 op.hs);
  load_tile_bf16<kD>(do_tile, g.dout + o_head, op.o_ld, q0, op.Tq, op.hs);
  load_row_values(lse2, g.lse, bh, q0, op.Tq, kLog2e);
  if (g.delta)
    load_row_values(delta_rows, g.delta, bh, q0, op.Tq, 1.0f);
  else
    tile_row_deltas(delta_rows, g, o_head, op, q0);
}

// dK, dV of key tile kt = blockIdx.x (the first tiles see the most query tiles) of K/V head (b,
// g), over the query heads that share it and, of each, the query tiles that see the key tile (a
// suffix): one sequence of (head, query tile) pairs through the two buffers.
template <int kD, class E>
__global__ void __launch_bounds__(kThreads, 2)
    tc_backward_dkdv_kernel(float* dk, float* dv,  // rows of kv_ld +=
                            const E* q, const E* k, const E* v, FlashGrads g, FlashOperands op,
                            float scale, float scale_log2) {
  STRATA_DYNAMIC_SHARED(SharedUnit, smem);
  SharedCarver carve{smem->bytes};
  bfloat16* k_tile = carve.take<bfloat16>(kTileBytes<kD>);        // [64 keys, kD + 8]
  bfloat16* v_tile = carve.take<bfloat16>(kTileBytes<kD>);        // [64 keys, kD + 8]
  bfloat16* q_tiles = carve.take<bfloat16>(2 * kTileBytes<kD>);   // [2][64 queries, kD + 8]
  bfloat16* do_tiles = carve.take<bfloat16>(2 * kTileBytes<kD>);  // [2][64 queries, kD + 8]
  float* lse2_rows = carve.take<float>(2 * kRowValueBytes);       // [2][64] lse log2(e)
  float* delta_rows = carve.take<float>(2 * kRowValueBytes);      // [2][64]
  const int k0 = blockIdx.x * kRows, b = blockIdx.y / op.KV, kvh = blockIdx.y % op.KV;
  const int group = op.NH / op.KV, q_tiles_all = (op.Tq + kCols - 1) / kCols;
  const int w0 = threadIdx.x / 32 * kWarpRows, key = k0 + w0 + threadIdx.x % 32 / 4;
  const std::int64_t kv_head = std::int64_t(b) * op.Tk * op.kv_ld + kvh * op.hs;
  int first_qt = 0;  // the first query tile that sees this key tile; the later ones all do
  while (first_qt < q_tiles_all && !tiles_meet<kCols>(op, first_qt * kCols, k0)) ++first_qt;
  const int per_head = q_tiles_all - first_qt, pairs = group * per_head;
  if (pairs == 0) return;  // no query sees these keys: their dK, dV get nothing
  // Pair i: query head kvh * group + i / per_head, query tile first_qt + i % per_head.
  auto stage_pair = [&](int i, int buffer) {
    stage_query_tile<kD>(q_tiles + buffer * kTileElements<kD>,
                         do_tiles + buffer * kTileElements<kD>, lse2_rows + buffer * kRows,
                         delta_rows + buffer * kRows, q, g, op, b, kvh * group + i / per_head,
                         (first_qt + i % per_head) * kCols);
  };

  stage_tile<kD>(k_tile, k + kv_head, op.kv_ld, k0, op.Tk, op.hs);
  stage_tile<kD>(v_tile, v + kv_head, op.kv_ld, k0, op.Tk, op.hs);
  stage_pair(0, 0);
  cp_async_commit();
  float dkr[kD / 8][4], dvr[kD / 8][4];
  STRATA_UNROLL
  for (int nd = 0; nd < kD / 8; ++nd) {
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) dkr[nd][i] = dvr[nd][i] = 0.0f;
  }
  for (int i = 0; i < pairs; ++i) {
    const int buffer = i % 2, q0 = (first_qt + i % per_head) * kCols;
    cp_async_wait_all();
    __syncthreads();  // pair i staged; every warp done with pair i - 1's buffers
    if (i + 1 < pairs) {
      stage_pair(i + 1, 1 - buffer);
      cp_async_commit();
    }
    key_rows_step<kD>(dkr, dvr, k_tile + w0 * kTileStride<kD>, v_tile + w0 * kTileStride<kD>,
                      q_tiles + buffer * kTileElements<kD>, do_tiles + buffer * kTileElements<kD>,
                      lse2_rows + buffer * kRows, delta_rows + buffer * kRows, key, q0, op,
                      !tiles_all_visible<kCols, kRows>(op, q0, k0), scale_log2);
  }
  add_lane_rows<kD>(dk + kv_head, op.kv_ld, dkr, scale, key, op.Tk, op.hs);
  add_lane_rows<kD>(dv + kv_head, op.kv_ld, dvr, 1.0f, key, op.Tk, op.hs);
}

// dQ += dS k of the warp's 16 queries (q_rows, do_rows: theirs in the Q and dout tiles; lse2,
// delta: theirs; query: the lane's g's) against a staged key tile at k0, kSubCols keys at a time.
template <int kD>
__device__ __forceinline__ void query_rows_step(float (&dq)[kD / 8][4], const bfloat16* q_rows,
                                                const bfloat16* do_rows, const bfloat16* k_tile,
                                                const bfloat16* v_tile, const float* lse2,
                                                const float* delta, int query, int k0,
                                                const FlashOperands& op, bool mask,
                                                float scale_log2) {
  constexpr int kSub = kSubCols<kD>;
  STRATA_NO_UNROLL  // one copy of the body: unrolled, each copy held its own addresses
      for (int c0 = 0; c0 < kCols; c0 += kSub) {
    float s[kSub / 8][4], dp[kSub / 8][4];
    std::uint32_t dsa[kSub / 16][4];
    product_with_rows<kD, kSub / 8>(s, q_rows, k_tile + c0 * kTileStride<kD>);    // S
    product_with_rows<kD, kSub / 8>(dp, do_rows, v_tile + c0 * kTileStride<kD>);  // dP
    probabilities_and_ds<false, kSub / 8>(s, dp, lse2, delta, query, k0 + c0, op, mask, scale_log2);
    pack_a_frags(dsa, dp);
    accumulate_product<kD, kSub / 16>(dq, dsa, k_tile + c0 * kTileStride<kD>);
  }
}

// dQ of query tile qt (longest first, as the forward) of head (b, h), over the key tiles it sees.
template <int kD, class E>
__global__ void __launch_bounds__(kThreads, 2)
    tc_backward_dq_kernel(float* dq,  // rows of dq_ld +=
                          const E* q, const E* k, const E* v, FlashGrads g, FlashOperands op,
                          float scale, float scale_log2) {
  STRATA_DYNAMIC_SHARED(SharedUnit, smem);
  SharedCarver carve{smem->bytes};
  bfloat16* q_tile = carve.take<bfloat16>(kTileBytes<kD>);       // [64 queries, kD + 8]
  bfloat16* do_tile = carve.take<bfloat16>(kTileBytes<kD>);      // [64 queries, kD + 8]
  bfloat16* k_tiles = carve.take<bfloat16>(2 * kTileBytes<kD>);  // [2][64 keys, kD + 8]
  bfloat16* v_tiles = carve.take<bfloat16>(2 * kTileBytes<kD>);  // [2][64 keys, kD + 8]
  float* lse2_rows = carve.take<float>(kRowValueBytes);          // [64]
  float* delta_rows = carve.take<float>(kRowValueBytes);         // [64]
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x), q0 = qt * kRows;
  const int bh = blockIdx.y, b = bh / op.NH, h = bh % op.NH, kvh = h / (op.NH / op.KV);
  const int w0 = threadIdx.x / 32 * kWarpRows, query = q0 + w0 + threadIdx.x % 32 / 4;
  const std::int64_t kv_head = std::int64_t(b) * op.Tk * op.kv_ld + kvh * op.hs;

  stage_query_tile<kD>(q_tile, do_tile, lse2_rows, delta_rows, q, g, op, b, h, q0);
  stage_tile<kD>(k_tiles, k + kv_head, op.kv_ld, 0, op.Tk, op.hs);
  stage_tile<kD>(v_tiles, v + kv_head, op.kv_ld, 0, op.Tk, op.hs);
  cp_async_commit();
  float dqr[kD / 8][4];
  STRATA_UNROLL
  for (int nd = 0; nd < kD / 8; ++nd) dqr[nd][0] = dqr[nd][1] = dqr[nd][2] = dqr[nd][3] = 0.0f;
  for (int kt = 0; tiles_meet<kRows>(op, q0, kt * kCols); ++kt) {
    const int buffer = kt % 2 * kTileElements<kD>, next = (kt + 1) % 2 * kTileElements<kD>;
    cp_async_wait_all();
    __syncthreads();  // key tile kt staged; every warp done with tile kt - 1's buffers
    if (tiles_meet<kRows>(op, q0, (kt + 1) * kCols)) {
      stage_tile<kD>(k_tiles + next, k + kv_head, op.kv_ld, (kt + 1) * kCols, op.Tk, op.hs);
      stage_tile<kD>(v_tiles + next, v + kv_head, op.kv_ld, (kt + 1) * kCols, op.Tk, op.hs);
      cp_async_commit();
    }
    query_rows_step<kD>(dqr, q_tile + w0 * kTileStride<kD>, do_tile + w0 * kTileStride<kD>,
                        k_tiles + buffer, v_tiles + buffer, lse2_rows + w0, delta_rows + w0, query,
                        kt * kCols, op, !tiles_all_visible<kRows, kCols>(op, q0, kt * kCols),
                        scale_log2);
  }
  cp_async_wait_all();  // a tile staged for a query tile that sees none
  add_lane_rows<kD>(dq + std::int64_t(b) * op.Tq * op.dq_ld + h * op.hs, op.dq_ld, dqr, scale,
                    query, op.Tq, op.hs);
}

// --- Host side -----------------------------------------------------------------------------------

// Shared memory sets how many blocks share an SM (up to 227 KiB on sm_90).
template <int kD>
constexpr std::size_t forward_smem_bytes() {
  return 5 * kTileBytes<kD>;
}
template <int kD>
constexpr std::size_t dkdv_smem_bytes() {
  return 6 * kTileBytes<kD> + 4 * kRowValueBytes;
}
template <int kD>
constexpr std::size_t dq_smem_bytes() {
  return 6 * kTileBytes<kD> + 2 * kRowValueBytes;
}
// sm_80 (A100) opts in to at most 163 KiB per block; sm_90 to 227 KiB.
constexpr std::size_t kSharedLimitSm80 = 163 * 1024;
static_assert(forward_smem_bytes<kMaxHead>() <= kSharedLimitSm80 &&
                  dkdv_smem_bytes<kMaxHead>() <= kSharedLimitSm80 &&
                  dq_smem_bytes<kMaxHead>() <= kSharedLimitSm80,
              "shared memory above sm_80's");
static_assert(kTileBytes<64> % 16 == 0 && kTileBytes<128> % 16 == 0 && kRowValueBytes % 16 == 0,
              "every shared buffer starts 16-byte aligned (ldmatrix, cp.async)");

// Checks the shape and calls f(std::integral_constant<int, kD>) with the head size's padding.
template <class F>
void with_tc_head_size(const char* op, int B, int T, int C, int NH, F&& f) {
  if (T < 0 || !tc_attention_supported(B, C, NH))
    throw Error(std::string(op) + ": shape B " + std::to_string(B) + ", T " + std::to_string(T) +
                    ", C " + std::to_string(C) + ", NH " + std::to_string(NH) + " not supported",
                "NH must divide C with a head size C / NH that is a multiple of 16 and at most "
                "128, and B * NH <= 65535");
  if (C / NH <= 64)
    f(std::integral_constant<int, 64>{});
  else
    f(std::integral_constant<int, 128>{});
}

// The grid of a tile kernel: tiles of 64 rows x (b, heads).
dim3 tc_grid(int B, int T, int heads) {
  return dim3(unsigned((T + kRows - 1) / kRows), unsigned(B * heads));
}

// The three launches on any operands (q, k, v typed as E: float or bf16's bits).
template <int kD, class E>
void tc_launch_forward(const CudaContext& ctx, ActView out, float* lse, const E* q, const E* k,
                       const E* v, const FlashOperands& op, int B, bool first) {
  const float scale_log2 = 1.0f / std::sqrt(float(op.hs)) * kLog2e;
  allow_shared_memory(tc_forward_kernel<kD, E>, forward_smem_bytes<kD>());
  STRATA_LAUNCH((tc_forward_kernel<kD, E>), tc_grid(B, op.Tq, op.NH), kThreads,
                forward_smem_bytes<kD>(), ctx.stream)
  (out.data, out.is_bf16(), lse, q, k, v, op, scale_log2, first);
  STRATA_CUDA_CHECK_LAUNCH();
}
template <int kD, class E>
void tc_launch_backward(const CudaContext& ctx, float* dq, float* dk, float* dv, const E* q,
                        const E* k, const E* v, const FlashGrads& g, const FlashOperands& op,
                        int B) {
  const float scale = 1.0f / std::sqrt(float(op.hs));
  allow_shared_memory(tc_backward_dkdv_kernel<kD, E>, dkdv_smem_bytes<kD>());
  STRATA_LAUNCH((tc_backward_dkdv_kernel<kD, E>), tc_grid(B, op.Tk, op.KV), kThreads,
                dkdv_smem_bytes<kD>(), ctx.stream)
  (dk, dv, q, k, v, g, op, scale, scale * kLog2e);
  STRATA_CUDA_CHECK_LAUNCH();
  allow_shared_memory(tc_backward_dq_kernel<kD, E>, dq_smem_bytes<kD>());
  STRATA_LAUNCH((tc_backward_dq_kernel<kD, E>), tc_grid(B, op.Tq, op.NH), kThreads,
                dq_smem_bytes<kD>(), ctx.stream)
  (dq, q, k, v, g, op, scale, scale * kLog2e);
  STRATA_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool tc_attention_supported(int B, int C, int NH) {
  static_assert(kWarpRows == 16 && kMaxHead == 128, "the shapes kernels.hpp says the kernel takes");
  return B >= 0 && cuda_tensor_core_attention(B, C, NH);
}

void tc_flash_attention_forward(const CudaContext& ctx, ActView out, float* lse, ActView qkv, int B,
                                int T, int C, int NH) {
  with_tc_head_size("tc_flash_attention_forward", B, T, C, NH, [&](auto head) {
    constexpr int kD = decltype(head)::value;
    if (B == 0 || T == 0) return;
    with_element_type(qkv.is_bf16(), [&](auto type) {
      using E = typename decltype(type)::type;
      const E* q = static_cast<const E*>(qkv.data);
      tc_launch_forward<kD>(ctx, out, lse, q, q + C, q + 2 * C, whole_sequence(T, C, NH), B, true);
    });
  });
}

void tc_flash_attention_backward(const CudaContext& ctx, float* dqkv, float* delta,
                                 const float* dout, ActView qkv, ActView out, const float* lse,
                                 int B, int T, int C, int NH) {
  with_tc_head_size("tc_flash_attention_backward", B, T, C, NH, [&](auto head) {
    constexpr int kD = decltype(head)::value;
    if (B == 0 || T == 0) return;
    attention_delta(ctx, delta, dout, out, B, T, C, NH);
    with_element_type(qkv.is_bf16(), [&](auto type) {
      using E = typename decltype(type)::type;
      const E* q = static_cast<const E*>(qkv.data);
      const FlashGrads g{dout, out.data, out.is_bf16(), lse, delta};
      tc_launch_backward<kD>(ctx, dqkv, dqkv + C, dqkv + 2 * C, q, q + C, q + 2 * C, g,
                             whole_sequence(T, C, NH), B);
    });
  });
}

void tc_attention_block_forward(const CudaContext& ctx, float* o, float* lse, ActView q,
                                int q_stride, ActView kv, int B, int Tq, int Tk, int NH, int KV,
                                int hs, TokenPositions qpos, TokenPositions kpos, bool first) {
  const FlashOperands op = ring_operands("tc_attention_block_forward", q, q_stride, q_stride, kv,
                                         Tq, Tk, NH, KV, hs, qpos, kpos);
  with_tc_head_size("tc_attention_block_forward", B, Tq, NH * hs, NH, [&](auto head) {
    constexpr int kD = decltype(head)::value;
    if (B == 0 || Tq == 0) return;
    with_block_operands(q, kv, KV, hs, [&](auto q_rows, auto k, auto v) {
      tc_launch_forward<kD>(ctx, ActView(o), lse, q_rows, k, v, op, B, first);
    });
  });
}

void tc_attention_block_backward(const CudaContext& ctx, float* dq, int dq_stride, float* dkv,
                                 const float* dout, ActView out, const float* lse, ActView q,
                                 int q_stride, ActView kv, int B, int Tq, int Tk, int NH, int KV,
                                 int hs, TokenPositions qpos, TokenPositions kpos) {
  const FlashOperands op = ring_operands("tc_attention_block_backward", q, q_stride, dq_stride, kv,
                                         Tq, Tk, NH, KV, hs, qpos, kpos);
  const FlashGrads g{dout, out.data, out.is_bf16(), lse, nullptr};
  with_tc_head_size("tc_attention_block_backward", B, Tq, NH * hs, NH, [&](auto head) {
    constexpr int kD = decltype(head)::value;
    if (B == 0 || Tq == 0 || Tk == 0) return;
    with_block_operands(q, kv, KV, hs, [&](auto q_rows, auto k, auto v) {
      tc_launch_backward<kD>(ctx, dq, dkv, dkv + std::size_t(KV) * hs, q_rows, k, v, g, op, B);
    });
  });
}

}  // namespace strata::cuda
