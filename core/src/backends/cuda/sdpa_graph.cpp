// The forward and backward attention graphs (sdpa_graph.hpp). Shapes in comments: B batch,
// H heads, T tokens (queries and keys), D head size, R = 3C the qkv row.
#include "backends/cuda/sdpa_graph.hpp"

#include <limits>
#include <utility>

namespace strata::cuda {

namespace {

using Dims = std::array<std::int64_t, 4>;

class Builder {
 public:
  explicit Builder(const SdpaShape& s)
      : B(s.B), H(s.NH), T(s.T), D(s.hs), C(std::int64_t(s.NH) * s.hs), R(3 * C) {}

  // A tensor the caller binds.
  int bound(std::int64_t uid, SdpaType type, Dims dims, Dims strides) {
    g_.tensors.push_back({uid, type, dims, strides, false, false});
    return int(g_.tensors.size()) - 1;
  }
  // An fp32 tensor the caller binds and zeroes, which the graph's matmul adds into (packed).
  int accumulator(std::int64_t uid, Dims dims) {
    const int i = bound(uid, SdpaType::f32, dims,
                        {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1});
    g_.tensors[i].accumulates = true;
    return i;
  }
  // A host scalar.
  int scalar(std::int64_t uid) {
    g_.tensors.push_back({uid, SdpaType::f32, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true});
    return int(g_.tensors.size()) - 1;
  }
  // A tensor inside the fused kernel: packed, or with the strides given.
  int inner(SdpaType type, Dims dims) {
    return inner(type, dims, {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1});
  }
  int inner(SdpaType type, Dims dims, Dims strides) {
    g_.tensors.push_back({next_uid_++, type, dims, strides, true, false});
    return int(g_.tensors.size()) - 1;
  }

  int matmul(int a, int b, int y) { return add({SdpaOpKind::matmul, {}, -1, a, b, -1, y}); }
  int matmul(int a, int b, SdpaType type) {
    const Dims& ad = g_.tensors[a].dims;
    return matmul(a, b, inner(type, {ad[0], ad[1], ad[2], g_.tensors[b].dims[3]}));
  }
  int pointwise(SdpaPointwise mode, int x, int b, int y) {
    return add({SdpaOpKind::pointwise, mode, -1, x, b, -1, y});
  }
  int pointwise(SdpaPointwise mode, int x, int b = -1) {
    return pointwise(mode, x, b, inner(SdpaType::f32, g_.tensors[x].dims));
  }
  int reduce_rows(SdpaOpKind kind, int x, int y) { return add({kind, {}, -1, x, -1, -1, y}); }
  int reduce_rows(SdpaOpKind kind, int x) {
    const Dims& d = g_.tensors[x].dims;
    return reduce_rows(kind, x, inner(SdpaType::f32, {d[0], d[1], d[2], 1}));
  }
  int reshape(int x, int y) { return add({SdpaOpKind::reshape, {}, -1, x, -1, -1, y}); }

  // scores [B,H,T,T] with the keys after each query replaced by the mask fill.
  int causal_mask(int scores, int fill) {
    const Dims& d = g_.tensors[scores].dims;
    const int row = inner(SdpaType::i32, d), col = inner(SdpaType::i32, d);
    add({SdpaOpKind::pointwise, SdpaPointwise::gen_index, 2, scores, -1, -1, row});
    add({SdpaOpKind::pointwise, SdpaPointwise::gen_index, 3, scores, -1, -1, col});
    const int visible = pointwise(SdpaPointwise::cmp_ge, row, col, inner(SdpaType::boolean, d));
    const int masked = inner(SdpaType::f32, d);
    add({SdpaOpKind::pointwise, SdpaPointwise::select, -1, scores, fill, visible, masked});
    return masked;
  }

  // The bound tensors by layout. A third of the packed qkv rows (or of their gradient) as
  // [B,H,T,D], or as [B,H,D,T] (k and v transposed for the products that contract over D); a
  // [B,T,C] activation (o, dout) as [B,H,T,D]; one fp32 value per row, [B,H,T,1].
  int qkv_rows(std::int64_t uid) {
    return bound(uid, SdpaType::bf16, {B, H, T, D}, rows_strides());
  }
  int qkv_columns(std::int64_t uid) {
    return bound(uid, SdpaType::bf16, {B, H, D, T}, {T * R, D, 1, R});
  }
  int token_rows(std::int64_t uid) {
    return bound(uid, SdpaType::bf16, {B, H, T, D}, {T * C, D, C, 1});
  }
  int per_row(std::int64_t uid) {
    return bound(uid, SdpaType::f32, {B, H, T, 1}, {H * T, T, 1, 1});
  }
  Dims rows_strides() const { return {T * R, D, R, 1}; }
  // A [B,H,T,T] tensor read transposed: the same memory, the two last dims swapped.
  Dims transposed_scores() const { return {H * T * T, T * T, 1, T}; }

  SdpaGraph take() { return std::move(g_); }

  const std::int64_t B, H, T, D, C, R;

 private:
  int add(SdpaOp op) {
    g_.ops.push_back(op);
    return op.y;
  }
  SdpaGraph g_;
  std::int64_t next_uid_ = 100;  // virtual tensors' uids, after the bound ones
};

}  // namespace

float sdpa_mask_fill() { return std::numeric_limits<float>::lowest(); }

SdpaGraph sdpa_forward_graph(const SdpaShape& shape) {
  Builder g(shape);
  const auto bf16 = SdpaType::bf16, f32 = SdpaType::f32;
  const std::int64_t B = g.B, H = g.H, T = g.T;
  const int q = g.qkv_rows(kSdpaQ), kt = g.qkv_columns(kSdpaK), v = g.qkv_rows(kSdpaV);
  const int o = g.token_rows(kSdpaO), stats = g.per_row(kSdpaStats);
  const int scale = g.scalar(kSdpaScale), fill = g.scalar(kSdpaMaskFill);

  // s[B,H,T,T] = (q k^T) / sqrt(D), causal
  const int s = g.causal_mask(g.pointwise(SdpaPointwise::mul, g.matmul(q, kt, f32), scale), fill);
  // softmax by rows, keeping max + log(sum exp) for the backward
  const int row_max = g.reduce_rows(SdpaOpKind::reduce_max, s);
  const int e = g.pointwise(SdpaPointwise::exp, g.pointwise(SdpaPointwise::sub, s, row_max));
  const int row_sum = g.reduce_rows(SdpaOpKind::reduce_add, e);
  g.pointwise(SdpaPointwise::add, row_max, g.pointwise(SdpaPointwise::log, row_sum), stats);
  // p[B,H,T,T] in bf16 (the second product's operand), o = p v
  const int p = g.pointwise(SdpaPointwise::div, e, row_sum, g.inner(bf16, {B, H, T, T}));
  g.matmul(p, v, o);
  return g.take();
}

SdpaGraph sdpa_backward_graph(const SdpaShape& shape) {
  Builder g(shape);
  const auto bf16 = SdpaType::bf16, f32 = SdpaType::f32;
  const std::int64_t B = g.B, H = g.H, T = g.T, D = g.D;
  const int q = g.qkv_rows(kSdpaQ), kt = g.qkv_columns(kSdpaK), vt = g.qkv_columns(kSdpaV);
  const int o = g.token_rows(kSdpaO), dout = g.token_rows(kSdpaDO);
  const int stats = g.per_row(kSdpaStats), delta = g.per_row(kSdpaRowDelta);
  const int dq = g.qkv_rows(kSdpaDQ), dk = g.qkv_rows(kSdpaDK), dv = g.qkv_rows(kSdpaDV);
  const int dq_accum = g.accumulator(kSdpaDQAccum, {B, H, T, D});
  const int scale = g.scalar(kSdpaScale), fill = g.scalar(kSdpaMaskFill), one = g.scalar(kSdpaOne);

  // delta[B,H,T,1] = rowsum(dout * o)
  g.pointwise(SdpaPointwise::mul,
              g.reduce_rows(SdpaOpKind::reduce_add, g.pointwise(SdpaPointwise::mul, dout, o)), one,
              delta);
  // p[B,H,T,T] = exp(q k^T / sqrt(D) - lse), causal: the forward's probabilities again (masked
  // before the lse is subtracted, in cudnn-frontend's order)
  const int s = g.causal_mask(g.pointwise(SdpaPointwise::mul, g.matmul(q, kt, f32), scale), fill);
  const int p = g.pointwise(SdpaPointwise::exp, g.pointwise(SdpaPointwise::sub, s, stats));
  // dv[B,H,T,D] = p^T dout
  const int pt = g.inner(bf16, {B, H, T, T}, g.transposed_scores());
  g.reshape(p, pt);
  g.matmul(pt, dout, dv);
  // ds[B,H,T,T] = p * (dout v^T - delta) / sqrt(D); dp times one where a dropout mask would go,
  // as cudnn-frontend's graph has it
  const int dp = g.pointwise(SdpaPointwise::mul, g.matmul(dout, vt, f32), one);
  const int ds = g.pointwise(
      SdpaPointwise::mul,
      g.pointwise(SdpaPointwise::mul, g.pointwise(SdpaPointwise::sub, dp, delta), p), scale);
  // dk[B,H,T,D] = ds^T q
  const int dst = g.inner(bf16, {B, H, T, T}, g.transposed_scores());
  g.reshape(ds, dst);
  g.matmul(dst, q, dk);
  // dq[B,H,T,D] = ds k, accumulated in fp32 and rounded once
  const int k = g.inner(bf16, {B, H, T, D}, g.rows_strides());
  g.reshape(kt, k);
  g.matmul(ds, k, dq_accum);
  g.pointwise(SdpaPointwise::identity, dq_accum, -1, dq);
  return g.take();
}

}  // namespace strata::cuda
