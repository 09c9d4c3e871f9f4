// Fused causal self-attention on tensor cores: FlashAttention-2 (Dao 2023), bf16 operands and fp32
// accumulation; the forward on mma.sync m16n8k16 (ptx.cuh), the backward on WMMA 16 x 16 x 16. The same API, state and += convention as the fp32
// kernel (attention.cu, layers.cuh): lse [B,NH,T] kept by the forward, delta [B,NH,T] scratch of
// the backward, no T x T matrix in memory, deterministic (no atomics).
//
// Precision: Q, K, V and dout are rounded to bf16 (to nearest even) as they are loaded into shared
// memory; P and dS are rounded to bf16 as the operands of the second GEMMs (P V, P^T dout, dS^T q,
// dS k). Scores, softmax, lse, delta and every accumulator are fp32. The softmax runs in base 2
// (exp2f of scores scaled by log2(e) / sqrt(hs)); lse is stored in natural log, as the fp32 kernel.
//
// Blocks of 4 warps (128 threads) own 64 rows, 16 per warp (one MMA tile high), and stream tiles
// of 64 columns. Everything a warp computes lies in its own 16 rows, so apart from the block-wide
// tile loads (__syncthreads) a warp only orders itself (__syncwarp).
//
// Forward, one block per (query tile of 64 rows, b, h), longest first. Q is staged once, K and V
// tiles in two buffers by cp.async (the next tile's copies fly while this one's products run).
// Everything else is registers in the PTX fragment layouts, which (unlike WMMA's) say which rows
// a lane holds: Q as A fragments; per key tile S = Q K^T (8 blocks of 8 keys, fp32), the online
// softmax of each row over the 4 lanes that hold it (two shuffles), P packed to bf16 straight
// from S's accumulators as the A fragments of P V, and O = O * exp2(m_old - m_new) + P V. Each
// lane writes its own elements of O / l and the rows' lse at the end.
//
// Backward, three launches: delta = rowsum(dout * out) (one warp per row), then
//   dK, dV: one block per (key tile, b, h), its warps' K and V rows as fragments; per query tile
//     and per 16 queries: S^T = K q^T and dP^T = V dout^T (fragments into a per-warp 16 x 16
//     scratch), P^T = exp(S^T scale - lse), dS^T = P^T (dP^T - delta) as bf16 tiles; then
//     dV += P^T dout, dK += dS^T q (fp32 accumulator fragments in registers up to kD 64, in
//     shared memory at kD 128, where registers would spill; dK scaled at the end);
//   dQ: one block per (query tile, b, h), its Q and dout rows as fragments; per key tile the same
//     P and dS (not transposed), then dQ += dS K (a shared fp32 accumulator: in registers it
//     spilled on sm_90).
//   P and dP are computed twice (dK/dV and dQ): the price of no atomics.
//
// Shared memory: bf16 tiles have rows of kD + 8 (16 bytes of padding: WMMA wants a leading
// dimension that is a multiple of 16 bytes and every fragment 32-byte aligned, ldmatrix and
// cp.async 16-byte rows; the padding also moves consecutive rows to other banks), fp32 tiles rows of kD + 4 or 64 + 4. The head size hs
// (a multiple of 16, at most 128) is padded to kD = 64 or 128 with zero columns.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "../kernels.hpp"  // cuda_tensor_core_attention ("kernels.hpp" is cuda/kernels.hpp here)
#include "backends/cuda/bf16.cuh"
#include "backends/cuda/device.hpp"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/layers.cuh"
#include "backends/cuda/ptx.cuh"
#include "strata/types.hpp"

// Full unrolling of the loops over fragment arrays (their indices must be compile-time constants
// to keep the fragments in registers). nvcc only: the host compiler would warn about the pragma.
#if defined(__CUDACC__)
#define STRATA_UNROLL _Pragma("unroll")
#else
#define STRATA_UNROLL
#endif

namespace strata::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using bfloat16 = __nv_bfloat16;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bfloat16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bfloat16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bfloat16, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kFrag = 16;                 // a WMMA tile's side
constexpr int kRows = kWarps * kFrag;     // rows of a block: queries, or keys (dK/dV)
constexpr int kCols = 64;                 // columns of a streamed tile: keys, or queries (dK/dV)
constexpr int kColFrags = kCols / kFrag;  // 4
constexpr int kProbStride = kCols + 8;    // bf16 [16 x 64] P / dS rows
constexpr int kScratchFloats = kFrag * kFrag;  // a warp's 16 x 16 fp32 scratch, ldm 16
constexpr int kMaxHead = 128;
constexpr unsigned kFull = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int kD>
constexpr int kTileStride = kD + 8;  // bf16 [64, kD] Q / K / V / dout tiles
template <int kD>
constexpr int kAccStride = kD + 4;  // fp32 [64, kD] O / dQ / dK / dV accumulators

// The bytes of a bf16 head tile, a bf16 P tile, an fp32 score tile and an fp32 accumulator;
// every one a multiple of 32 bytes, so each buffer carved after another stays WMMA-aligned.
template <int kD>
constexpr std::size_t kTileBytes = sizeof(bfloat16) * kRows* kTileStride<kD>;
constexpr std::size_t kProbBytes = sizeof(bfloat16) * kRows * kProbStride;
constexpr std::size_t kScratchBytes = sizeof(float) * kWarps * 2 * kScratchFloats;
constexpr std::size_t kRowValueBytes = sizeof(float) * kRows;
template <int kD>
constexpr std::size_t kAccBytes = sizeof(float) * kRows* kAccStride<kD>;
// The dK/dV kernel keeps its accumulators in registers up to kD 64; at kD 128 (16 fragments more)
// they would spill, so there they live in shared memory.
template <int kD>
constexpr bool kDkDvInRegisters = kD <= 64;

// The unit of the dynamic shared memory: declaring it 128-byte aligned makes the base as aligned
// as WMMA's 32-byte fragments need (CUDA promises only 16 bytes for an array of floats).
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
// kVector: four columns a thread where src and ld allow 16-byte fp32 or 8-byte bf16 loads (hs is a
// multiple of 16, so four columns never straddle hs), a quarter of the load instructions. Off in
// the dK/dV kernel: its fragments leave no registers for the loads in flight (ptxas spilled it at
// 168 registers). src: dout, or an fp32 run's Q, K, V.
template <int kD, bool kVector = true>
__device__ __forceinline__ void load_tile_bf16(bfloat16* tile, const float* src, int ld, int row0,
                                               int T, int hs) {
  if (kVector && ld % 4 == 0 && reinterpret_cast<std::uintptr_t>(src) % 16 == 0) {
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
template <int kD, bool kVector = true>
__device__ __forceinline__ void load_tile_bf16(bfloat16* tile, const std::uint16_t* src, int ld,
                                               int row0, int T, int hs) {
  if (kVector && ld % 4 == 0 && reinterpret_cast<std::uintptr_t>(src) % 8 == 0) {
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

// dst[base + (row0 + r) * ld + d] (+)= scale rows[r][d] / divisor[r] over the warp's 16 rows,
// inside T rows and hs columns (consecutive lanes write consecutive columns). `divisor` may be
// null (1). dst fp32, or bf16 (dst_bf16; written, not accumulated: the forward's output).
template <int kD, bool kAccumulate>
__device__ __forceinline__ void write_warp_rows(void* dst, bool dst_bf16, std::size_t base, int ld,
                                                const float* rows, const float* divisor,
                                                float scale, int row0, int T, int hs) {
  for (int e = threadIdx.x % 32; e < kFrag * kD; e += 32) {
    const int r = e / kD, d = e % kD, t = row0 + r;
    if (t >= T || d >= hs) continue;
    const float v = scale * rows[r * kAccStride<kD> + d] / (divisor ? divisor[r] : 1.0f);
    const std::size_t at = base + std::size_t(std::int64_t(t) * ld + d);
    if (kAccumulate)
      static_cast<float*>(dst)[at] += v;
    else
      store(dst, dst_bf16, at, v);
  }
}

// --- Warp-level WMMA steps -----------------------------------------------------------------------

// frags[i] = rows 0..15, columns 16 i.. of a bf16 head tile (the warp's A operands, kept).
template <int kD>
__device__ __forceinline__ void load_row_frags(FragA (&frags)[kD / kFrag], const bfloat16* rows) {
  STRATA_UNROLL
  for (int i = 0; i < kD / kFrag; ++i)
    wmma::load_matrix_sync(frags[i], rows + i * kFrag, kTileStride<kD>);
}

// out[16 x 16] (fp32, ldm out_ld) = A B^T over kD: A the warp's fragments, B 16 rows of a head
// tile (b as column-major: element (d, j) of B^T is tile[j][d]).
template <int kD>
__device__ __forceinline__ void dot_rows(float* out, int out_ld, const FragA (&a)[kD / kFrag],
                                         const bfloat16* b_rows) {
  FragAcc acc;
  wmma::fill_fragment(acc, 0.0f);
  STRATA_UNROLL
  for (int i = 0; i < kD / kFrag; ++i) {
    FragBCol b;
    wmma::load_matrix_sync(b, b_rows + i * kFrag, kTileStride<kD>);
    wmma::mma_sync(acc, a[i], b, acc);
  }
  wmma::store_matrix_sync(out, acc, out_ld, wmma::mem_row_major);
}

// acc_rows[16 x kD] += P[16 x 64] M[64 x kD]: P the warp's bf16 rows, M a head tile; the fp32
// accumulator rows are loaded into fragments and stored back.
template <int kD>
__device__ __forceinline__ void accumulate_product(float* acc_rows, const bfloat16* p_rows,
                                                   const bfloat16* m_tile) {
  FragA p[kColFrags];
  STRATA_UNROLL
  for (int j = 0; j < kColFrags; ++j) wmma::load_matrix_sync(p[j], p_rows + j * kFrag, kProbStride);
  STRATA_UNROLL
  for (int n = 0; n < kD / kFrag; ++n) {
    FragAcc acc;
    wmma::load_matrix_sync(acc, acc_rows + n * kFrag, kAccStride<kD>, wmma::mem_row_major);
    STRATA_UNROLL
    for (int j = 0; j < kColFrags; ++j) {
      FragBRow m;
      wmma::load_matrix_sync(m, m_tile + j * kFrag * kTileStride<kD> + n * kFrag, kTileStride<kD>);
      wmma::mma_sync(acc, p[j], m, acc);
    }
    wmma::store_matrix_sync(acc_rows + n * kFrag, acc, kAccStride<kD>, wmma::mem_row_major);
  }
}

// acc[n] += P[16 x 64] M[64 x 16 n..]: the same product into the warp's accumulator fragments
// (registers), for accumulators that need no per-row rescale.
template <int kD>
__device__ __forceinline__ void accumulate_product(FragAcc (&acc)[kD / kFrag],
                                                   const bfloat16* p_rows, const bfloat16* m_tile) {
  FragA p[kColFrags];
  STRATA_UNROLL
  for (int j = 0; j < kColFrags; ++j) wmma::load_matrix_sync(p[j], p_rows + j * kFrag, kProbStride);
  STRATA_UNROLL
  for (int n = 0; n < kD / kFrag; ++n) {
    STRATA_UNROLL
    for (int j = 0; j < kColFrags; ++j) {
      FragBRow m;
      wmma::load_matrix_sync(m, m_tile + j * kFrag * kTileStride<kD> + n * kFrag, kTileStride<kD>);
      wmma::mma_sync(acc[n], p[j], m, acc[n]);
    }
  }
}

// The warp's accumulator fragments set to zero, and stored as its 16 fp32 rows (ldm kAccStride).
template <int kD>
__device__ __forceinline__ void clear_frags(FragAcc (&acc)[kD / kFrag]) {
  STRATA_UNROLL
  for (int n = 0; n < kD / kFrag; ++n) wmma::fill_fragment(acc[n], 0.0f);
}
template <int kD>
__device__ __forceinline__ void store_frags(float* acc_rows, const FragAcc (&acc)[kD / kFrag]) {
  STRATA_UNROLL
  for (int n = 0; n < kD / kFrag; ++n)
    wmma::store_matrix_sync(acc_rows + n * kFrag, acc[n], kAccStride<kD>, wmma::mem_row_major);
}

// The warp's 16 accumulator rows set to zero.
template <int kD>
__device__ __forceinline__ void clear_warp_rows(float* acc_rows) {
  for (int e = threadIdx.x % 32; e < kFrag * kD; e += 32)
    acc_rows[(e / kD) * kAccStride<kD> + e % kD] = 0.0f;
}

// --- Forward: mma.sync fragments in registers (ptx.cuh) ------------------------------------------

// The forward keeps everything a warp computes in registers, in the PTX fragment layouts
// (ptx.cuh): lane l holds, of its warp's 16 query rows, rows g = l / 4 and g + 8, at columns
// 2t, 2t + 1 (t = l % 4) of every 8-column block. A row is spread over the 4 lanes of a quad, so
// its max and sum take two shuffles; a score block's C fragment is, packed to bf16, the A fragment
// of P V (FlashAttention-2's register reuse), so neither S nor P touches shared memory.
constexpr int kKeyBlocks = kCols / 8;  // 8 key blocks of 8 in a 64-key tile
// Blocks an SM should hold (__launch_bounds__): ptxas then keeps a thread within 65536 / (128 n)
// registers. Without it, sm_90's ptxas capped kD 64 at 128 registers and spilled.
template <int kD>
constexpr int kForwardBlocksPerSm = kD <= 64 ? 3 : 2;

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

// qa[kk] = the A fragments of the warp's 16 rows of a head tile, columns 16 kk .. 16 kk + 15.
template <int kD>
__device__ __forceinline__ void load_a_frags(std::uint32_t (&qa)[kD / 16][4],
                                             const bfloat16* rows) {
  const int lane = threadIdx.x % 32;
  STRATA_UNROLL
  for (int kk = 0; kk < kD / 16; ++kk)
    ldmatrix_x4(qa[kk], rows + (lane % 16) * kTileStride<kD> + 16 * kk + 8 * (lane / 16));
}

// s[nb] = Q K^T for keys 8 nb .. 8 nb + 7 of the tile: the warp's Q fragments against the K tile's
// rows as B (column-major B = row-major K; one ldmatrix gives two key blocks' B at one k step).
template <int kD>
__device__ __forceinline__ void score_tile(float (&s)[kKeyBlocks][4],
                                           const std::uint32_t (&qa)[kD / 16][4],
                                           const bfloat16* k_tile) {
  const int lane = threadIdx.x % 32, m = lane / 8;
  STRATA_UNROLL
  for (int nb = 0; nb < kKeyBlocks; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
  STRATA_UNROLL
  for (int kk = 0; kk < kD / 16; ++kk) {
    STRATA_UNROLL
    for (int p = 0; p < kKeyBlocks / 2; ++p) {
      std::uint32_t r[4];
      ldmatrix_x4(
          r, k_tile + ((2 * p + m / 2) * 8 + lane % 8) * kTileStride<kD> + 16 * kk + 8 * (m % 2));
      const std::uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_bf16_16816(s[2 * p], qa[kk], b0);
      mma_bf16_16816(s[2 * p + 1], qa[kk], b1);
    }
  }
}

// Two bf16 (low: a) in a register; `sum` gains their rounded values (l sums the weights P V uses).
__device__ __forceinline__ std::uint32_t pack_bf16(float a, float b, float& sum) {
  const bfloat16 ra = __float2bfloat16_rn(a), rb = __float2bfloat16_rn(b);
  sum += __bfloat162float(ra) + __bfloat162float(rb);
  return std::uint32_t(__bfloat16_as_ushort(ra)) | std::uint32_t(__bfloat16_as_ushort(rb)) << 16;
}

// One online-softmax step of the lane's two rows (h = 0: row g, 1: row g + 8) over a key tile:
// raw scores s become P = exp2(s scale_log2 - m_new), packed as the A fragments pa of P V (16 keys
// each); m moves to the new max, l (this lane's partial row sum) and o are rescaled by
// exp2(m_old - m_new). On the diagonal tile keys after the row's query are masked (every key past
// T is after every query inside T, and the rows past T are not written).
template <int kD>
__device__ __forceinline__ void online_softmax(float (&s)[kKeyBlocks][4],
                                               std::uint32_t (&pa)[kColFrags][4], float (&m)[2],
                                               float (&l)[2], float (&o)[kD / 8][4], bool diagonal,
                                               int row_query, int k0, float scale_log2) {
  const int t = threadIdx.x % 4;
  float mx[2] = {-INFINITY, -INFINITY};
  STRATA_UNROLL
  for (int nb = 0; nb < kKeyBlocks; ++nb) STRATA_UNROLL
  for (int i = 0; i < 4; ++i) {
    const int key = k0 + 8 * nb + 2 * t + i % 2, query = row_query + 8 * (i / 2);
    s[nb][i] = diagonal && key > query ? -INFINITY : s[nb][i] * scale_log2;
    mx[i / 2] = fmaxf(mx[i / 2], s[nb][i]);
  }
  float correction[2];
  STRATA_UNROLL
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(kFull, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(kFull, mx[h], 2));
    // Finite: key 0 is in every row's first tile, so m is finite from then on.
    const float m_new = fmaxf(m[h], mx[h]);
    correction[h] = exp2f(m[h] - m_new);  // 0 on the first tile (m = -inf)
    m[h] = m_new, l[h] *= correction[h];
  }
  STRATA_UNROLL
  for (int j = 0; j < kColFrags; ++j)  // keys 16 j..: blocks 2 j (a0, a1) and 2 j + 1 (a2, a3)
    STRATA_UNROLL
  for (int r = 0; r < 4; ++r) {
    const float* block = s[2 * j + r / 2];
    const int h = r % 2;  // a0, a2: row g; a1, a3: row g + 8
    pa[j][r] = pack_bf16(exp2f(block[2 * h] - m[h]), exp2f(block[2 * h + 1] - m[h]), l[h]);
  }
  STRATA_UNROLL
  for (int nd = 0; nd < kD / 8; ++nd) STRATA_UNROLL
  for (int i = 0; i < 4; ++i) o[nd][i] *= correction[i / 2];
}

// o[nd] += P V for dims 8 nd .. 8 nd + 7: pa the warp's P fragments, V the tile's rows as B
// (row-major B: ldmatrix's transpose gives two dim blocks' B at one 16-key step).
template <int kD>
__device__ __forceinline__ void accumulate_pv(float (&o)[kD / 8][4],
                                              const std::uint32_t (&pa)[kColFrags][4],
                                              const bfloat16* v_tile) {
  const int lane = threadIdx.x % 32, m = lane / 8;
  STRATA_UNROLL
  for (int j = 0; j < kColFrags; ++j) STRATA_UNROLL
  for (int q = 0; q < kD / 16; ++q) {
    std::uint32_t r[4];
    ldmatrix_x4_trans(
        r, v_tile + (16 * j + 8 * (m % 2) + lane % 8) * kTileStride<kD> + 8 * (2 * q + m / 2));
    const std::uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
    mma_bf16_16816(o[2 * q], pa[j], b0);
    mma_bf16_16816(o[2 * q + 1], pa[j], b1);
  }
}

// out = o / l and lse = (m + log2 l) ln 2 of the lane's two rows, inside T rows and hs columns.
template <int kD>
__device__ __forceinline__ void write_forward_rows(void* out, bool out_bf16, std::size_t base,
                                                   int ld, float* lse, std::int64_t lse_base,
                                                   const float (&o)[kD / 8][4], const float (&m)[2],
                                                   float (&l)[2], int row_query, int T, int hs) {
  const int t = threadIdx.x % 4;
  STRATA_UNROLL
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(kFull, l[h], 1);
    l[h] += __shfl_xor_sync(kFull, l[h], 2);
    const int query = row_query + 8 * h;
    if (t == 0 && query < T) lse[lse_base + query] = (m[h] + log2f(l[h])) * kLn2;
  }
  STRATA_UNROLL
  for (int nd = 0; nd < kD / 8; ++nd) STRATA_UNROLL
  for (int i = 0; i < 4; ++i) {
    const int query = row_query + 8 * (i / 2), d = 8 * nd + 2 * t + i % 2;
    if (query < T && d < hs)
      store(out, out_bf16, base + std::size_t(std::int64_t(query) * ld + d), o[nd][i] / l[i / 2]);
  }
}

// out, lse of query tile qt (longest first: block x = 0 takes the last tile) of head (b, h). Q is
// staged once, K and V in two buffers: the next tile's copies (cp.async) fly while this one's
// products run; one __syncthreads a tile both publishes a tile and frees the other buffer.
template <int kD, class Qkv>
__global__ void __launch_bounds__(kThreads, kForwardBlocksPerSm<kD>)
    tc_forward_kernel(void* out,       // [B, T, C] fp32 or bf16
                      bool out_bf16,   //
                      float* lse,      // [B, NH, T]
                      const Qkv* qkv,  // [B, T, 3C] fp32 or bf16's bits
                      int T, int C, int NH, float scale_log2) {
  STRATA_DYNAMIC_SHARED(SharedUnit, smem);
  SharedCarver carve{smem->bytes};
  bfloat16* q_tile = carve.take<bfloat16>(kTileBytes<kD>);       // [64, kD + 8]
  bfloat16* k_tiles = carve.take<bfloat16>(2 * kTileBytes<kD>);  // [2][64, kD + 8]
  bfloat16* v_tiles = carve.take<bfloat16>(2 * kTileBytes<kD>);  // [2][64, kD + 8]
  // Buffer i of k_tiles / v_tiles (a pointer array indexed at run time would live in local memory).
  constexpr int kTileElements = kRows * kTileStride<kD>;
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x), q0 = qt * kRows;
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, hs = C / NH, C3 = 3 * C;
  const int warp = threadIdx.x / 32, w0 = warp * kFrag,
            row_query = q0 + w0 + (threadIdx.x % 32) / 4;
  const Qkv* q = qkv + std::int64_t(b) * T * C3 + h * hs;  // k at + C, v at + 2C

  stage_tile<kD>(q_tile, q, C3, q0, T, hs);
  stage_tile<kD>(k_tiles, q + C, C3, 0, T, hs);
  stage_tile<kD>(v_tiles, q + 2 * C, C3, 0, T, hs);
  cp_async_commit();
  std::uint32_t qa[kD / 16][4], pa[kColFrags][4];
  float s[kKeyBlocks][4], o[kD / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  STRATA_UNROLL
  for (int nd = 0; nd < kD / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
  for (int kt = 0; kt <= qt; ++kt) {
    cp_async_wait_all();
    __syncthreads();  // tile kt staged; every warp done with tile kt - 1's buffers
    if (kt == 0) load_a_frags<kD>(qa, q_tile + w0 * kTileStride<kD>);
    if (kt < qt) {
      stage_tile<kD>(k_tiles + (kt + 1) % 2 * kTileElements, q + C, C3, (kt + 1) * kCols, T, hs);
      stage_tile<kD>(v_tiles + (kt + 1) % 2 * kTileElements, q + 2 * C, C3, (kt + 1) * kCols, T,
                     hs);
      cp_async_commit();
    }
    score_tile<kD>(s, qa, k_tiles + kt % 2 * kTileElements);
    online_softmax<kD>(s, pa, m, l, o, kt == qt, row_query, kt * kCols, scale_log2);
    accumulate_pv<kD>(o, pa, v_tiles + kt % 2 * kTileElements);
  }
  write_forward_rows<kD>(out, out_bf16, std::size_t(std::int64_t(b) * T * C + h * hs), C, lse,
                         std::int64_t(bh) * T, o, m, l, row_query, T, hs);
}

// --- Backward ------------------------------------------------------------------------------------

// P and dS of one 16 x 16 fragment from the warp's scratch (s: raw scores, dp: dout . v), written
// as bf16 at p_out / ds_out (ldm kProbStride; p_out may be null). Row r is key key0 + r and column
// c query query0 + c when kKeyRows (dK/dV: P^T, dS^T), else row r query query0 + r and column c
// key key0 + c (dQ). lse2 (lse log2 e) and delta are indexed by the fragment's local query.
template <bool kKeyRows>
__device__ __forceinline__ void probabilities_and_ds(bfloat16* p_out, bfloat16* ds_out,
                                                     const float* s, const float* dp,
                                                     const float* lse2, const float* delta,
                                                     int key0, int query0, int T,
                                                     float scale_log2) {
  for (int e = threadIdx.x % 32; e < kScratchFloats; e += 32) {
    const int r = e / kFrag, c = e % kFrag;
    const int local_q = kKeyRows ? c : r, kj = key0 + (kKeyRows ? r : c), qi = query0 + local_q;
    const float p = kj <= qi && qi < T ? exp2f(s[e] * scale_log2 - lse2[local_q]) : 0.0f;
    if (p_out) p_out[r * kProbStride + c] = __float2bfloat16_rn(p);
    ds_out[r * kProbStride + c] = __float2bfloat16_rn(p * (dp[e] - delta[local_q]));
  }
}

// P^T and dS^T of the warp's 16 keys (k, v its K and V fragments) against the 64 queries of the
// loaded tile, into the warp's rows of pt_tile and dst_tile.
template <int kD>
__device__ __forceinline__ void key_rows_p_and_ds(bfloat16* pt_rows, bfloat16* dst_rows,
                                                  float* scratch, const FragA (&k)[kD / kFrag],
                                                  const FragA (&v)[kD / kFrag],
                                                  const bfloat16* q_tile, const bfloat16* do_tile,
                                                  const float* lse2, const float* delta, int key0,
                                                  int q0, int T, float scale_log2) {
  for (int j = 0; j < kColFrags; ++j) {
    const int col = j * kFrag;
    dot_rows<kD>(scratch, kFrag, k, q_tile + col * kTileStride<kD>);                    // S^T
    dot_rows<kD>(scratch + kScratchFloats, kFrag, v, do_tile + col * kTileStride<kD>);  // dP^T
    __syncwarp();  // scratch stored
    probabilities_and_ds<true>(pt_rows + col, dst_rows + col, scratch, scratch + kScratchFloats,
                               lse2 + col, delta + col, key0, q0 + col, T, scale_log2);
    __syncwarp();  // scratch read before the next fragment's
  }
}

// dK, dV of key tile kt = blockIdx.x (the first tiles see the most query tiles) of head (b, h).
template <int kD, class Qkv>
__global__ void __launch_bounds__(kThreads)
    tc_backward_dkdv_kernel(float* dqkv,         // [B, T, 3C] += (dk, dv columns)
                            const float* dout,   // [B, T, C]
                            const Qkv* qkv,      // [B, T, 3C] fp32 or bf16's bits
                            const float* lse,    // [B, NH, T]
                            const float* delta,  // [B, NH, T]
                            int T, int C, int NH, float scale, float scale_log2) {
  STRATA_DYNAMIC_SHARED(SharedUnit, smem);
  SharedCarver carve{smem->bytes};
  bfloat16* k_tile = carve.take<bfloat16>(kTileBytes<kD>);   // [64 keys, kD + 8]
  bfloat16* v_tile = carve.take<bfloat16>(kTileBytes<kD>);   // [64 keys, kD + 8]
  bfloat16* q_tile = carve.take<bfloat16>(kTileBytes<kD>);   // [64 queries, kD + 8]
  bfloat16* do_tile = carve.take<bfloat16>(kTileBytes<kD>);  // [64 queries, kD + 8]
  bfloat16* pt_tile = carve.take<bfloat16>(kProbBytes);      // [64 keys, 72] P^T
  bfloat16* dst_tile = carve.take<bfloat16>(kProbBytes);     // [64 keys, 72] dS^T
  float* scratch = carve.take<float>(kScratchBytes);         // per warp [2][16 x 16]
  // dK, dV [64 keys, kD + 4]: from registers, stored at the end over Q, dout, P^T and dS^T; or
  // accumulated in shared memory of their own (kDkDvInRegisters).
  constexpr bool kRegisters = kDkDvInRegisters<kD>;
  float* dk_tile = kRegisters ? reinterpret_cast<float*>(q_tile) : carve.take<float>(kAccBytes<kD>);
  float* dv_tile = kRegisters ? dk_tile + kRows * kAccStride<kD> : carve.take<float>(kAccBytes<kD>);
  float* lse2_rows = carve.take<float>(kRowValueBytes);   // [64] lse log2(e) of the queries
  float* delta_rows = carve.take<float>(kRowValueBytes);  // [64]
  const int kt = blockIdx.x, k0 = kt * kRows, tiles = gridDim.x;
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, hs = C / NH, C3 = 3 * C;
  const int warp = threadIdx.x / 32, w0 = warp * kFrag;
  const Qkv* q = qkv + std::int64_t(b) * T * C3 + h * hs;  // k at + C, v at + 2C
  const float* dob = dout + std::int64_t(b) * T * C + h * hs;

  load_tile_bf16<kD, false>(k_tile, q + C, C3, k0, T, hs);
  load_tile_bf16<kD, false>(v_tile, q + 2 * C, C3, k0, T, hs);
  __syncthreads();  // K, V tiles loaded
  FragA k_frags[kD / kFrag], v_frags[kD / kFrag];
  load_row_frags<kD>(k_frags, k_tile + w0 * kTileStride<kD>);
  load_row_frags<kD>(v_frags, v_tile + w0 * kTileStride<kD>);
  FragAcc dk[kD / kFrag], dv[kD / kFrag];
  if constexpr (kRegisters) {
    clear_frags<kD>(dk);
    clear_frags<kD>(dv);
  } else {
    clear_warp_rows<kD>(dk_tile + w0 * kAccStride<kD>);
    clear_warp_rows<kD>(dv_tile + w0 * kAccStride<kD>);
  }
  for (int qt = kt; qt < tiles; ++qt) {  // query tile qt * 64 == key tile kt * 64 on the diagonal
    const int q0 = qt * kCols;
    load_tile_bf16<kD, false>(q_tile, q, C3, q0, T, hs);
    load_tile_bf16<kD, false>(do_tile, dob, C, q0, T, hs);
    load_row_values(lse2_rows, lse, bh, q0, T, kLog2e);
    load_row_values(delta_rows, delta, bh, q0, T, 1.0f);
    __syncthreads();  // tiles loaded
    key_rows_p_and_ds<kD>(pt_tile + w0 * kProbStride, dst_tile + w0 * kProbStride,
                          scratch + warp * 2 * kScratchFloats, k_frags, v_frags, q_tile, do_tile,
                          lse2_rows, delta_rows, k0 + w0, q0, T, scale_log2);
    if constexpr (kRegisters) {
      accumulate_product<kD>(dv, pt_tile + w0 * kProbStride, do_tile);  // dV += P^T dout
      accumulate_product<kD>(dk, dst_tile + w0 * kProbStride, q_tile);  // dK += dS^T q
    } else {
      accumulate_product<kD>(dv_tile + w0 * kAccStride<kD>, pt_tile + w0 * kProbStride, do_tile);
      accumulate_product<kD>(dk_tile + w0 * kAccStride<kD>, dst_tile + w0 * kProbStride, q_tile);
    }
    __syncthreads();  // Q, dout read before the next query tile overwrites them
  }
  if constexpr (kRegisters) {  // after the loop's last __syncthreads: Q, dout, P^T, dS^T are free
    store_frags<kD>(dk_tile + w0 * kAccStride<kD>, dk);
    store_frags<kD>(dv_tile + w0 * kAccStride<kD>, dv);
    __syncwarp();  // dK, dV rows stored (fragment lanes != writing lanes)
  }
  float* dk_out = dqkv + std::int64_t(b) * T * C3 + C + h * hs;  // dv at + C
  write_warp_rows<kD, true>(dk_out, false, 0, C3, dk_tile + w0 * kAccStride<kD>, nullptr, scale,
                            k0 + w0, T, hs);
  write_warp_rows<kD, true>(dk_out + C, false, 0, C3, dv_tile + w0 * kAccStride<kD>, nullptr, 1.0f,
                            k0 + w0, T, hs);
}

// dS of the warp's 16 queries (q, dout its fragments) against the 64 keys of the loaded tile.
template <int kD>
__device__ __forceinline__ void query_rows_ds(bfloat16* ds_rows, float* scratch,
                                              const FragA (&q)[kD / kFrag],
                                              const FragA (&dout)[kD / kFrag],
                                              const bfloat16* k_tile, const bfloat16* v_tile,
                                              const float* lse2, const float* delta, int query0,
                                              int k0, int T, float scale_log2) {
  for (int j = 0; j < kColFrags; ++j) {
    const int col = j * kFrag;
    dot_rows<kD>(scratch, kFrag, q, k_tile + col * kTileStride<kD>);                      // S
    dot_rows<kD>(scratch + kScratchFloats, kFrag, dout, v_tile + col * kTileStride<kD>);  // dP
    __syncwarp();  // scratch stored
    probabilities_and_ds<false>(nullptr, ds_rows + col, scratch, scratch + kScratchFloats, lse2,
                                delta, k0 + col, query0, T, scale_log2);
    __syncwarp();  // scratch read before the next fragment's
  }
}

// dQ of query tile qt (longest first, as the forward) of head (b, h).
template <int kD, class Qkv>
__global__ void __launch_bounds__(kThreads)
    tc_backward_dq_kernel(float* dqkv,         // [B, T, 3C] += (dq columns)
                          const float* dout,   // [B, T, C]
                          const Qkv* qkv,      // [B, T, 3C] fp32 or bf16's bits
                          const float* lse,    // [B, NH, T]
                          const float* delta,  // [B, NH, T]
                          int T, int C, int NH, float scale, float scale_log2) {
  STRATA_DYNAMIC_SHARED(SharedUnit, smem);
  SharedCarver carve{smem->bytes};
  bfloat16* q_tile = carve.take<bfloat16>(kTileBytes<kD>);   // [64 queries, kD + 8]
  bfloat16* do_tile = carve.take<bfloat16>(kTileBytes<kD>);  // [64 queries, kD + 8]
  bfloat16* k_tile = carve.take<bfloat16>(kTileBytes<kD>);   // [64 keys, kD + 8]
  bfloat16* v_tile = carve.take<bfloat16>(kTileBytes<kD>);   // [64 keys, kD + 8]
  bfloat16* ds_tile = carve.take<bfloat16>(kProbBytes);      // [64 queries, 72] dS
  float* scratch = carve.take<float>(kScratchBytes);         // per warp [2][16 x 16]
  float* dq_tile = carve.take<float>(kAccBytes<kD>);         // [64 queries, kD + 4]
  float* lse2_rows = carve.take<float>(kRowValueBytes);      // [64]
  float* delta_rows = carve.take<float>(kRowValueBytes);     // [64]
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x), q0 = qt * kRows;
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, hs = C / NH, C3 = 3 * C;
  const int warp = threadIdx.x / 32, w0 = warp * kFrag;
  const Qkv* q = qkv + std::int64_t(b) * T * C3 + h * hs;  // k at + C, v at + 2C

  load_tile_bf16<kD>(q_tile, q, C3, q0, T, hs);
  load_tile_bf16<kD>(do_tile, dout + std::int64_t(b) * T * C + h * hs, C, q0, T, hs);
  load_row_values(lse2_rows, lse, bh, q0, T, kLog2e);
  load_row_values(delta_rows, delta, bh, q0, T, 1.0f);
  clear_warp_rows<kD>(dq_tile + w0 * kAccStride<kD>);
  __syncthreads();  // Q, dout tiles loaded
  FragA q_frags[kD / kFrag], do_frags[kD / kFrag];
  load_row_frags<kD>(q_frags, q_tile + w0 * kTileStride<kD>);
  load_row_frags<kD>(do_frags, do_tile + w0 * kTileStride<kD>);
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kCols;
    load_tile_bf16<kD>(k_tile, q + C, C3, k0, T, hs);
    load_tile_bf16<kD>(v_tile, q + 2 * C, C3, k0, T, hs);
    __syncthreads();  // K, V tiles loaded
    query_rows_ds<kD>(ds_tile + w0 * kProbStride, scratch + warp * 2 * kScratchFloats, q_frags,
                      do_frags, k_tile, v_tile, lse2_rows + w0, delta_rows + w0, q0 + w0, k0, T,
                      scale_log2);
    accumulate_product<kD>(dq_tile + w0 * kAccStride<kD>, ds_tile + w0 * kProbStride, k_tile);
    __syncthreads();  // K, V read before the next key tile overwrites them
  }
  write_warp_rows<kD, true>(dqkv + std::int64_t(b) * T * C3 + h * hs, false, 0, C3,
                            dq_tile + w0 * kAccStride<kD>, nullptr, scale, q0 + w0, T, hs);
}

// --- Host side -----------------------------------------------------------------------------------

// Shared memory sets how many blocks share an SM (up to 227 KiB on sm_90): buffers used only at a
// kernel's end take the space of tiles the loop no longer needs.
template <int kD>
constexpr std::size_t forward_smem_bytes() {
  return 5 * kTileBytes<kD>;
}
template <int kD>
constexpr std::size_t dkdv_smem_bytes() {
  static_assert(2 * kAccBytes<64> <= 2 * kTileBytes<64> + 2 * kProbBytes,
                "dK, dV fit over the Q, dout, P^T and dS^T tiles");
  const std::size_t accumulators = kDkDvInRegisters<kD> ? 0 : 2 * kAccBytes<kD>;
  return 4 * kTileBytes<kD> + 2 * kProbBytes + kScratchBytes + accumulators + 2 * kRowValueBytes;
}
template <int kD>
constexpr std::size_t dq_smem_bytes() {
  return 4 * kTileBytes<kD> + kProbBytes + kScratchBytes + kAccBytes<kD> + 2 * kRowValueBytes;
}
// sm_80 (A100) opts in to at most 163 KiB per block; sm_90 to 227 KiB.
constexpr std::size_t kSharedLimitSm80 = 163 * 1024;
static_assert(dkdv_smem_bytes<kMaxHead>() <= kSharedLimitSm80, "dK/dV shared memory above sm_80's");
static_assert(forward_smem_bytes<kMaxHead>() <= kSharedLimitSm80 &&
                  dq_smem_bytes<kMaxHead>() <= kSharedLimitSm80,
              "shared memory above sm_80's");
static_assert(kTileBytes<64> % 32 == 0 && kTileBytes<128> % 32 == 0 && kProbBytes % 32 == 0 &&
                  kScratchBytes % 32 == 0 && kAccBytes<64> % 32 == 0 && kAccBytes<128> % 32 == 0,
              "every shared buffer starts 32-byte aligned (WMMA)");

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

// The grid of a tile kernel: tiles of 64 rows x (b, h).
dim3 tc_grid(int B, int T, int NH) { return dim3(unsigned((T + kRows - 1) / kRows), B * NH); }

float scale_of(int C, int NH) { return 1.0f / std::sqrt(float(C / NH)); }

}  // namespace

bool tc_attention_supported(int B, int C, int NH) {
  static_assert(kFrag == 16 && kMaxHead == 128, "the shapes kernels.hpp says the kernel takes");
  return B >= 0 && cuda_tensor_core_attention(B, C, NH);
}

void tc_flash_attention_forward(const CudaContext& ctx, ActView out, float* lse, ActView qkv, int B,
                                int T, int C, int NH) {
  with_tc_head_size("tc_flash_attention_forward", B, T, C, NH, [&](auto head) {
    constexpr int kD = decltype(head)::value;
    if (B == 0 || T == 0) return;
    with_element_type(qkv.is_bf16(), [&](auto type) {
      using Qkv = typename decltype(type)::type;
      allow_shared_memory(tc_forward_kernel<kD, Qkv>, forward_smem_bytes<kD>());
      STRATA_LAUNCH((tc_forward_kernel<kD, Qkv>), tc_grid(B, T, NH), kThreads,
                    forward_smem_bytes<kD>(), ctx.stream)
      (out.data, out.is_bf16(), lse, static_cast<const Qkv*>(qkv.data), T, C, NH,
       scale_of(C, NH) * kLog2e);
      STRATA_CUDA_CHECK_LAUNCH();
    });
  });
}

void tc_flash_attention_backward(const CudaContext& ctx, float* dqkv, float* delta,
                                 const float* dout, ActView qkv, ActView out, const float* lse,
                                 int B, int T, int C, int NH) {
  with_tc_head_size("tc_flash_attention_backward", B, T, C, NH, [&](auto head) {
    constexpr int kD = decltype(head)::value;
    if (B == 0 || T == 0) return;
    const float scale = scale_of(C, NH);
    attention_delta(ctx, delta, dout, out, B, T, C, NH);
    with_element_type(qkv.is_bf16(), [&](auto type) {
      using Qkv = typename decltype(type)::type;
      const Qkv* q = static_cast<const Qkv*>(qkv.data);
      allow_shared_memory(tc_backward_dkdv_kernel<kD, Qkv>, dkdv_smem_bytes<kD>());
      STRATA_LAUNCH((tc_backward_dkdv_kernel<kD, Qkv>), tc_grid(B, T, NH), kThreads,
                    dkdv_smem_bytes<kD>(), ctx.stream)
      (dqkv, dout, q, lse, delta, T, C, NH, scale, scale * kLog2e);
      STRATA_CUDA_CHECK_LAUNCH();

      allow_shared_memory(tc_backward_dq_kernel<kD, Qkv>, dq_smem_bytes<kD>());
      STRATA_LAUNCH((tc_backward_dq_kernel<kD, Qkv>), tc_grid(B, T, NH), kThreads,
                    dq_smem_bytes<kD>(), ctx.stream)
      (dqkv, dout, q, lse, delta, T, C, NH, scale, scale * kLog2e);
      STRATA_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace strata::cuda
