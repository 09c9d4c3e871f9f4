// Where one attention's operands are, for the two flash implementations (attention.cu on CUDA
// cores, attention_tc.cu on tensor cores): the whole sequence (causal) and ring attention's blocks
// (Kernels::attention_block_*). CUDA syntax: included by .cu sources only.
#pragma once

#include <cstddef>
#include <string>

#include "backends/cuda/bf16.cuh"
#include "backends/kernels.hpp"
#include "strata/types.hpp"

namespace strata::cuda {

// Query row t of sequence b, head h at q + (b Tq + t) q_ld + h hs (dq: dq_ld); key and value rows
// at k, v + (b Tk + t) kv_ld + g hs (dk, dv alike), g = h / (NH / KV): the NH query heads share
// KV key-value heads (grouped-query attention); out and dout rows at (b Tq + t) o_ld + h hs; lse
// and delta [B, NH, Tq]. Key j is visible to query i where kpos(j) <= qpos(i). Positions increase
// with t (a rank's two zig-zag chunks in order), so the key tiles a query tile sees are a prefix,
// and the query tiles a key tile is seen by a suffix.
struct FlashOperands {
  int Tq, Tk, NH, KV, hs;
  int q_ld, kv_ld, o_ld, dq_ld;
  TokenPositions qpos, kpos;
};

// The backward's inputs beside q, k, v: dout and out (rows of o_ld), lse, and delta (null: each
// tile kernel makes the rows' deltas from dout and out).
struct FlashGrads {
  const float* dout;
  const void* out;
  bool out_bf16;
  const float* lse;
  const float* delta;
};

// The device twin of TokenPositions::operator().
__device__ __forceinline__ int position_of(const TokenPositions& p, int t) {
  return t < p.chunk ? p.first + t : p.second + t - p.chunk;
}
__device__ __forceinline__ bool visible(const FlashOperands& op, int qi, int kj) {
  return qi < op.Tq && kj < op.Tk && position_of(op.kpos, kj) <= position_of(op.qpos, qi);
}
// Whether any key from k0 on is visible to a query of the tile of kQueryRows rows at q0.
template <int kQueryRows>
__device__ __forceinline__ bool tiles_meet(const FlashOperands& op, int q0, int k0) {
  return q0 < op.Tq && k0 < op.Tk &&
         position_of(op.kpos, k0) <=
             position_of(op.qpos, (q0 + kQueryRows < op.Tq ? q0 + kQueryRows : op.Tq) - 1);
}
// Whether every key of [k0, k0 + kKeys) is visible to every query of [q0, q0 + kQueries), all
// inside Tk and Tq: such a pair of tiles needs no mask.
template <int kQueries, int kKeys>
__device__ __forceinline__ bool tiles_all_visible(const FlashOperands& op, int q0, int k0) {
  return q0 + kQueries <= op.Tq && k0 + kKeys <= op.Tk &&
         position_of(op.kpos, k0 + kKeys - 1) <= position_of(op.qpos, q0);
}

// The whole sequence's operands: qkv [B, T, 3C], out [B, T, C], every position its index.
inline FlashOperands whole_sequence(int T, int C, int NH) {
  const TokenPositions at{0, 0, T};
  return {T, T, NH, NH, C / NH, 3 * C, 3 * C, C, 3 * C, at, at};
}

// Positions that increase with t, as the tile loops assume.
inline void check_positions(const char* op, TokenPositions p, int T) {
  if (p.chunk < 0 || (p.chunk < T && p.second < p.first + p.chunk))
    throw Error(std::string(op) + ": token positions (" + std::to_string(p.first) + ", " +
                    std::to_string(p.second) + ", chunk " + std::to_string(p.chunk) +
                    ") do not increase",
                "the second chunk must start past the first (zig-zag chunks in order)");
}

// A ring block's operands: the rank's queries against a key-value block kv [B, Tk, 2, KV, hs]
// (k at head g's columns of a row, v KV heads later); out and dout [B, Tq, NH hs]. Checks what
// the kernels assume.
inline FlashOperands ring_operands(const char* op, ActView q, int q_stride, int dq_stride,
                                   ActView kv, int Tq, int Tk, int NH, int KV, int hs,
                                   TokenPositions qpos, TokenPositions kpos) {
  if (q.dtype != kv.dtype) throw Error(std::string(op) + ": q and kv in different dtypes");
  if (KV <= 0 || NH % KV != 0)
    throw Error(std::string(op) + ": " + std::to_string(NH) + " heads on " + std::to_string(KV) +
                    " key-value heads",
                "the key-value heads must divide the heads");
  check_positions(op, qpos, Tq);
  check_positions(op, kpos, Tk);
  FlashOperands o{};
  o.Tq = Tq, o.Tk = Tk, o.NH = NH, o.KV = KV, o.hs = hs;
  o.q_ld = q_stride, o.kv_ld = 2 * KV * hs, o.o_ld = NH * hs, o.dq_ld = dq_stride;
  o.qpos = qpos, o.kpos = kpos;
  return o;
}

// Calls f(q, k, v) with a ring block's operands typed (float, or bf16's bits: E of the kernels).
template <class F>
void with_block_operands(ActView q, ActView kv, int KV, int hs, F&& f) {
  with_element_type(q.is_bf16(), [&](auto type) {
    using E = typename decltype(type)::type;
    const E* k = static_cast<const E*>(kv.data);
    f(static_cast<const E*>(q.data), k, k + std::size_t(KV) * hs);
  });
}

}  // namespace strata::cuda
