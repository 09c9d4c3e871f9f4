// The one implementation of the workload's passes and activation plan (see model_passes.hpp),
// Megatron-LM style tensor parallelism included:
//   QKV, FC1   column-parallel (this rank's heads / rows of the 4h MLP)
//   proj, FC2  row-parallel; the partial outputs are all-reduced (reduce-scattered with sp)
//   wte        vocab-parallel embedding and LM head, vocab-parallel cross-entropy
// At tp 1 every pass is the plain kernel sequence (biases inside the GEMM calls, the fused
// softmax cross-entropy), so a pipeline of tp 1 stages is bitwise equal to the whole model.
#include "model_passes.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/layers.hpp"
#include "cpu/vecmath.hpp"
#include "strata/stage_model.hpp"
#include "strata/types.hpp"

namespace strata {
namespace {

void zero(float* p, std::size_t n) { std::memset(p, 0, n * sizeof(float)); }

// out[n, :] += bias for each of n rows.
void add_bias(float* out, const float* bias, std::size_t rows, int C) {
  for (std::size_t n = 0; n < rows; ++n)
#pragma omp simd
    for (int c = 0; c < C; ++c) out[n * C + c] += bias[c];
}

// dbias += sum over rows of dout.
void bias_grad(float* dbias, const float* dout, std::size_t rows, int C) {
  for (std::size_t n = 0; n < rows; ++n)
#pragma omp simd
    for (int c = 0; c < C; ++c) dbias[c] += dout[n * C + c];
}

void check_tokens(const std::int32_t* tok, std::size_t n, int V, const char* what) {
  for (std::size_t i = 0; i < n; ++i)
    if (tok[i] < 0 || tok[i] >= V)
      throw Error(std::string("model: ") + what + " token " + std::to_string(tok[i]) +
                  " out of range [0, " + std::to_string(V) + ")");
}

}  // namespace

ShardKind block_shard(int k) {
  switch (k) {
    case kQkvW:
    case kQkvB:
      return ShardKind::qkv_rows;
    case kFcW:
    case kFcB:
      return ShardKind::rows;
    case kProjW:
    case kFcprojW:
      return ShardKind::columns;
    default:
      return ShardKind::replicated;
  }
}

void validate_tensor_parallel(const ModelSpec& s, int micro_batch, int tp, bool sp) {
  auto need = [&](int value, const char* what) {
    if (value % tp != 0)
      throw ConfigError("--mesh tp=" + std::to_string(tp) + ": must divide the model's " + what +
                        " (" + std::to_string(value) + ")");
  };
  if (tp < 1) throw ConfigError("--mesh tp=" + std::to_string(tp) + ": must be >= 1");
  need(s.heads, "heads");
  need(s.hidden, "hidden size");
  need(s.vocab, "vocabulary (the embedding is vocab-parallel)");
  if (sp && (micro_batch * s.seq) % tp != 0)
    throw ConfigError("--plugin-opt sp=on: tp=" + std::to_string(tp) +
                      " must divide micro-batch x seq (" + std::to_string(micro_batch * s.seq) +
                      " token rows)");
}

void validate_partition(const ModelSpec& s, int B, const Partition& p, Recompute r) {
  validate_model_spec(s);
  if (B <= 0) throw ConfigError("model: micro-batch must be positive, got " + std::to_string(B));
  const int L = s.layers;
  if (p.first_unit < 0 || p.last_unit > L + 1 || p.first_unit > p.last_unit)
    throw Error("model: unit range [" + std::to_string(p.first_unit) + ", " +
                std::to_string(p.last_unit) + "] outside [0, " + std::to_string(L + 1) + "]");
  if (p.tp_rank < 0 || p.tp_rank >= p.tp_size)
    throw Error("model: tp rank " + std::to_string(p.tp_rank) + " of " + std::to_string(p.tp_size));
  validate_tensor_parallel(s, B, p.tp_size, p.sequence_parallel);
  if (r != Recompute::none && r != Recompute::full && r != Recompute::selective)
    throw ConfigError("model: recompute must be one of none, full, selective; got value " +
                      std::to_string(int(r)));
}

Partition whole_model(const ModelSpec& spec) { return {0, spec.layers + 1, 1, 0, false}; }

Dims::Dims(const ModelSpec& s, int micro_batch, const Partition& p)
    : B(micro_batch), T(s.seq), C(s.hidden), NH(s.heads), V(s.vocab), tp(p.tp_size) {
  const int L = s.layers;
  blocks = std::max(0, std::min(p.last_unit, L) - std::max(p.first_unit, 1) + 1);
  embedding = p.first_unit == 0;
  head = p.last_unit == L + 1;
  sp = p.sequence_parallel && tp > 1;
  N = std::size_t(B) * T;
  Nl = sp ? N / tp : N;
  Cl = std::size_t(C) / tp;
  NHl = std::size_t(NH) / tp;
  Vl = std::size_t(V) / tp;
  row0 = sp ? Nl * p.tp_rank : 0;
  att = std::size_t(B) * NHl * T * T;
}

// ---------------------------------------------------------------------------------------------
// The activation plan: the same carve sizes the buffers (null base) and lays them out.

void BlockActs::carve(const Dims& d, bool with_att, Carver& c) {
  const std::size_t N = d.N, Nl = d.Nl, C = d.C;
  ln1 = c.take(Nl * C);
  ln1_mean = c.take(Nl);
  ln1_rstd = c.take(Nl);
  ln1_full = d.sp ? c.take(N * C) : ln1;
  qkv = c.take(3 * N * d.Cl);
  atty = c.take(N * d.Cl);
  att = with_att ? c.take(d.att) : nullptr;
  xmid = c.take(Nl * C);
  ln2 = c.take(Nl * C);
  ln2_mean = c.take(Nl);
  ln2_rstd = c.take(Nl);
  ln2_full = d.sp ? c.take(N * C) : ln2;
  fch = c.take(4 * N * d.Cl);
  fch_gelu = c.take(4 * N * d.Cl);
}

void Scratch::carve(const Dims& d, Recompute r, Carver& c) {
  const std::size_t N = d.N, C = d.C;
  dres = c.take(d.Nl * C);
  partial = c.take(N * C);
  full = d.sp ? c.take(N * C) : dres;
  shard = d.sp ? c.take(d.Nl * C) : partial;
  Carver head{c.base, c.used}, block{c.base, c.used};
  logits = ce = a = b = nullptr;
  shared = BlockActs{};
  if (d.head) {
    logits = head.take(N * d.Vl);
    if (d.tp > 1) ce = head.take(3 * N);
  }
  if (d.blocks > 0) {
    a = block.take(4 * N * d.Cl);
    b = block.take(std::max(4 * N * d.Cl, d.att));
    if (r == Recompute::full) shared.carve(d, true, block);
    if (r == Recompute::selective) shared.att = block.take(d.att);
  }
  c.used = std::max(head.used, block.used);
}

void SlotActs::carve(const Dims& d, Recompute r, const Scratch& scratch, Carver& c) {
  const std::size_t N = d.N, Nl = d.Nl, C = d.C;
  x.resize(d.blocks + 1);
  for (auto& p : x) p = c.take(Nl * C);
  block.resize(d.blocks);
  for (BlockActs& b : block) {
    if (r == Recompute::full) {
      b = scratch.shared;
      continue;
    }
    b.carve(d, r == Recompute::none, c);
    if (r == Recompute::selective) b.att = scratch.shared.att;
  }
  lnf = lnf_mean = lnf_rstd = lnf_full = probs = losses = nullptr;
  if (d.head) {
    lnf = c.take(Nl * C);
    lnf_mean = c.take(Nl);
    lnf_rstd = c.take(Nl);
    lnf_full = d.sp ? c.take(N * C) : lnf;
    probs = c.take(N * d.Vl);
    losses = c.take(N);
  }
  grad_in = d.embedding ? nullptr : c.take(Nl * C);
}

ActivationBytes predict_activations(const ModelSpec& spec, int B, const Partition& part,
                                    Recompute r) {
  validate_partition(spec, B, part, r);
  const Dims d(spec, B, part);
  Carver scratch, slot;
  Scratch g;
  g.carve(d, r, scratch);
  SlotActs().carve(d, r, g, slot);
  return {slot.used * sizeof(float), scratch.used * sizeof(float)};
}

// ---------------------------------------------------------------------------------------------
// ModelPasses

ModelPasses::ModelPasses(const ModelSpec& spec, int B, const Partition& part, Recompute r,
                         MemoryLedger& memory)
    : spec_(spec),
      part_(part),
      recompute_(r),
      alloc_((validate_partition(spec, B, part, r), Dims(spec, B, part))),
      run_(alloc_),
      memory_(memory) {
  const ParamLayout layout(spec);
  const int first = layout.units()[1].first_tensor;
  std::size_t at = 0;
  for (int k = 0; k < kBlockTensors; ++k) {
    block_off_[k] = at;
    const std::size_t n = layout.tensors()[first + k].count;
    at += block_shard(k) == ShardKind::replicated ? n : n / part.tp_size;
  }
  Carver count;
  g_.carve(alloc_, r, count);
  scratch_memory_ = Buffer<float>(memory, MemTag::activations, count.used);
  Carver c{scratch_memory_.data(), 0};
  g_.carve(alloc_, r, c);
}

std::unique_ptr<ModelPasses::Slot> ModelPasses::make_slot() {
  auto s = std::make_unique<Slot>();
  Carver count;
  s->acts.carve(alloc_, recompute_, g_, count);
  s->memory = Buffer<float>(memory_, MemTag::activations, count.used);
  Carver c{s->memory.data(), 0};
  s->acts.carve(alloc_, recompute_, g_, c);
  return s;
}

void ModelPasses::set_batch(int batch) {
  if (batch <= 0 || batch > alloc_.B || (alloc_.tp > 1 && batch != alloc_.B))
    throw Error("model: micro-batch of " + std::to_string(batch) + " sequences, built for " +
                std::to_string(alloc_.B) + (alloc_.tp > 1 ? " (exactly, with tp)" : " at most"));
  if (batch != run_.B) run_ = Dims(spec_, batch, part_);
}

double ModelPasses::loss_sum(const SlotActs& s, std::size_t rows) {
  double sum = 0.0;
  for (std::size_t i = 0; i < rows; ++i) sum += s.losses[i];
  return sum;
}

// --- tensor-parallel communication (never called at tp 1)

void ModelPasses::gather(TensorParallelComm* tp, const float* shard,
                         float* full) {  // [Nl,C] -> [N,C]
  tp->all_gather(view(const_cast<float*>(shard), run_.Nl * run_.C), view(full, run_.N * run_.C));
}

void ModelPasses::scatter(TensorParallelComm* tp, float* full,
                          float* shard) {  // [N,C] partial -> [Nl,C]
  tp->reduce_scatter(view(full, run_.N * run_.C), view(shard, run_.Nl * run_.C));
}

// Row-parallel matmul (proj, FC2): out[Nl,C] = reduce(inp[N,ICl] @ W[C,ICl]^T) + bias. At tp 1
// the bias goes into the GEMM call.
void ModelPasses::row_parallel(TensorParallelComm* tp, float* out, const float* inp, const float* w,
                               const float* bias, int icl) {
  const Dims& d = run_;
  if (d.tp == 1) {
    cpu::matmul_forward(out, inp, w, bias, int(d.N), icl, d.C);
    return;
  }
  if (d.sp) {
    cpu::matmul_forward(g_.partial, inp, w, nullptr, int(d.N), icl, d.C);
    scatter(tp, g_.partial, out);
  } else {
    cpu::matmul_forward(out, inp, w, nullptr, int(d.N), icl, d.C);
    tp->all_reduce_sum(view(out, d.N * d.C));
  }
  add_bias(out, bias, d.Nl, d.C);
}

// d(input of a column-parallel matmul): partial [N,C] in g_.partial -> the rank's rows, summed.
float* ModelPasses::reduce_input_grad(TensorParallelComm* tp) {
  if (run_.tp == 1) return g_.partial;
  if (run_.sp) {
    scatter(tp, g_.partial, g_.shard);
    return g_.shard;
  }
  tp->all_reduce_sum(view(g_.partial, run_.N * run_.C));
  return g_.partial;
}

// recomputing: Recompute::full's rerun in backward, which stops at fch_gelu: the block's output
// (FC2, its reduction and the second residual) is not needed by the backward, x[l+1] is kept.
void ModelPasses::forward_block(int l, SlotActs& s, const float* p, TensorParallelComm* tp,
                                bool recomputing) {
  const Dims& d = run_;
  const std::size_t* o = block_off_;
  BlockActs& a = s.block[l];
  const int N = int(d.N), Nl = int(d.Nl), C = d.C, Cl = int(d.Cl);
  const float* x_in = s.x[l];
  cpu::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x_in, p + o[kLn1W], p + o[kLn1B], Nl, C);
  if (d.sp) gather(tp, a.ln1, a.ln1_full);
  cpu::matmul_forward(a.qkv, a.ln1_full, p + o[kQkvW], p + o[kQkvB], N, C, 3 * Cl);
  cpu::attention_forward(a.atty, a.att, a.qkv, d.B, d.T, Cl, int(d.NHl));
  row_parallel(tp, a.xmid, a.atty, p + o[kProjW], p + o[kProjB], Cl);
  cpu::residual_forward(a.xmid, a.xmid, x_in, std::int64_t(Nl) * C);
  cpu::layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.xmid, p + o[kLn2W], p + o[kLn2B], Nl, C);
  if (d.sp) gather(tp, a.ln2, a.ln2_full);
  cpu::matmul_forward(a.fch, a.ln2_full, p + o[kFcW], p + o[kFcB], N, C, 4 * Cl);
  cpu::gelu_forward(a.fch_gelu, a.fch, std::int64_t(N) * 4 * Cl);
  if (recomputing) return;
  float* x_out = s.x[l + 1];
  row_parallel(tp, x_out, a.fch_gelu, p + o[kFcprojW], p + o[kFcprojB], 4 * Cl);
  cpu::residual_forward(x_out, x_out, a.xmid, std::int64_t(Nl) * C);
}

void ModelPasses::backward_block(int l, SlotActs& s, const float* p, float* gr,
                                 TensorParallelComm* tp) {
  const Dims& d = run_;
  const std::size_t* o = block_off_;
  // Full recompute: rebuild this block's activations from its kept input x[l] into the shared
  // buffers (disjoint from a, b and partial, which are free until the backward below starts).
  if (recompute_ == Recompute::full) forward_block(l, s, p, tp, true);
  const BlockActs& a = s.block[l];
  const int N = int(d.N), Nl = int(d.Nl), C = d.C, Cl = int(d.Cl);
  const std::size_t NC = d.N * C, NCl = d.N * d.Cl;
  const bool tp1 = d.tp == 1;
  // MLP: x_out = xmid + fcproj(gelu(fc(ln2(xmid)))). d(x_out) is all-gathered with sp.
  if (d.sp) gather(tp, g_.dres, g_.full);
  if (!tp1) bias_grad(gr + o[kFcprojB], g_.dres, d.Nl, C);
  zero(g_.a, 4 * NCl);
  cpu::matmul_backward(g_.a, gr + o[kFcprojW], tp1 ? gr + o[kFcprojB] : nullptr, g_.full,
                       a.fch_gelu, p + o[kFcprojW], N, 4 * Cl, C);
  zero(g_.b, 4 * NCl);
  cpu::gelu_backward(g_.b, a.fch, g_.a, std::int64_t(N) * 4 * Cl);
  zero(g_.partial, NC);
  cpu::matmul_backward(g_.partial, gr + o[kFcW], gr + o[kFcB], g_.b, a.ln2_full, p + o[kFcW], N, C,
                       4 * Cl);
  const float* dln2 = reduce_input_grad(tp);
  cpu::layernorm_backward(g_.dres, gr + o[kLn2W], gr + o[kLn2B], dln2, a.xmid, p + o[kLn2W],
                          a.ln2_mean, a.ln2_rstd, Nl, C);
  // Attention: xmid = x_in + proj(attention(qkv(ln1(x_in)))); d(atty) goes to partial (free).
  if (d.sp) gather(tp, g_.dres, g_.full);
  if (!tp1) bias_grad(gr + o[kProjB], g_.dres, d.Nl, C);
  float* datty = g_.partial;
  zero(datty, NCl);
  cpu::matmul_backward(datty, gr + o[kProjW], tp1 ? gr + o[kProjB] : nullptr, g_.full, a.atty,
                       p + o[kProjW], N, Cl, C);
  // Selective recompute: att was not kept; rebuild it from this block's saved qkv into the
  // shared att. The attention output it also produces (atty is kept) goes to a, free until d(qkv).
  if (recompute_ == Recompute::selective)
    cpu::attention_forward(g_.a, a.att, a.qkv, d.B, d.T, Cl, int(d.NHl));
  float* dqkv = g_.a;
  zero(dqkv, 3 * NCl);
  cpu::attention_backward(dqkv, g_.b, datty, a.qkv, a.att, d.B, d.T, Cl, int(d.NHl));
  zero(g_.partial, NC);
  cpu::matmul_backward(g_.partial, gr + o[kQkvW], gr + o[kQkvB], dqkv, a.ln1_full, p + o[kQkvW], N,
                       C, 3 * Cl);
  const float* dln1 = reduce_input_grad(tp);
  cpu::layernorm_backward(g_.dres, gr + o[kLn1W], gr + o[kLn1B], dln1, s.x[l], p + o[kLn1W],
                          a.ln1_mean, a.ln1_rstd, Nl, C);
}

// Vocab-parallel embedding: each rank looks up the tokens of its vocab rows, the partial rows
// are summed across tp, then wpe is added per token row.
void ModelPasses::forward_embedding(SlotActs& s, const float* wte, const float* wpe,
                                    const std::int32_t* tok, TensorParallelComm* tp) {
  const Dims& d = run_;
  const int C = d.C;
  check_tokens(tok, d.N, d.V, "input");
  float* x0 = s.x[0];
  if (d.tp == 1) {
    cpu::encoder_forward(x0, tok, wte, wpe, d.B, d.T, C);
    return;
  }
  const std::size_t v0 = d.Vl * part_.tp_rank;
  float* rows = d.sp ? g_.partial : x0;
  for (std::size_t n = 0; n < d.N; ++n) {
    const std::size_t v = std::size_t(tok[n]) - v0;  // wraps for tokens below v0
    if (v < d.Vl)
      std::copy_n(wte + v * C, C, rows + n * C);
    else
      std::fill_n(rows + n * C, C, 0.0f);
  }
  if (d.sp)
    scatter(tp, g_.partial, x0);
  else
    tp->all_reduce_sum(view(x0, d.N * C));
  for (std::size_t i = 0; i < d.Nl; ++i) {
    const float* pos = wpe + ((d.row0 + i) % d.T) * C;
    for (int c = 0; c < C; ++c) x0[i * C + c] += pos[c];
  }
}

void ModelPasses::backward_embedding(float* dwte, float* dwpe, const std::int32_t* tok,
                                     TensorParallelComm* tp) {
  const Dims& d = run_;
  const int C = d.C;
  if (d.tp == 1) {
    cpu::encoder_backward(dwte, dwpe, g_.dres, tok, d.B, d.T, C);
    return;
  }
  for (std::size_t i = 0; i < d.Nl; ++i) {
    float* pos = dwpe + ((d.row0 + i) % d.T) * C;
    for (int c = 0; c < C; ++c) pos[c] += g_.dres[i * C + c];
  }
  if (d.sp) gather(tp, g_.dres, g_.full);
  const std::size_t v0 = d.Vl * part_.tp_rank;
  for (std::size_t n = 0; n < d.N; ++n) {
    const std::size_t v = std::size_t(tok[n]) - v0;
    if (v < d.Vl)
      for (int c = 0; c < C; ++c) dwte[v * C + c] += g_.full[n * C + c];
  }
}

// Vocab-parallel softmax cross-entropy over logits [N,Vl] (in probs): the row max and the
// (sum of exp, target logit) pairs are all-reduced; the logits never leave the rank.
void ModelPasses::vocab_parallel_xent(SlotActs& s, const std::int32_t* targets,
                                      TensorParallelComm* tp) {
  const std::size_t N = run_.N, Vl = run_.Vl, v0 = Vl * part_.tp_rank;
  float* mx = g_.ce;         // [N]
  float* sum_t = g_.ce + N;  // [N] sums of exp | [N] target logit - max
  for (std::size_t n = 0; n < N; ++n) {
    const float* x = s.probs + n * Vl;
    mx[n] = *std::max_element(x, x + Vl);
  }
  tp->all_reduce_max(view(mx, N));
  for (std::size_t n = 0; n < N; ++n) {
    float* x = s.probs + n * Vl;
    const std::size_t v = std::size_t(targets[n]) - v0;
    sum_t[N + n] = v < Vl ? x[v] - mx[n] : 0.0f;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (std::size_t i = 0; i < Vl; ++i) {
      const float e = cpu::vm::exp_approx(x[i] - mx[n]);
      x[i] = e;
      sum += e;
    }
    sum_t[n] = sum;
  }
  tp->all_reduce_sum(view(sum_t, 2 * N));
  for (std::size_t n = 0; n < N; ++n) {
    const float inv = 1.0f / sum_t[n];
    float* x = s.probs + n * Vl;
#pragma omp simd
    for (std::size_t i = 0; i < Vl; ++i) x[i] *= inv;
    s.losses[n] = float(std::log(double(sum_t[n])) - double(sum_t[N + n]));
  }
}

void ModelPasses::forward_head(SlotActs& s, const float* lnf, const float* wte,
                               const std::int32_t* targets, TensorParallelComm* tp) {
  const Dims& d = run_;
  const int C = d.C;
  check_tokens(targets, d.N, d.V, "target");
  cpu::layernorm_forward(s.lnf, s.lnf_mean, s.lnf_rstd, s.x[d.blocks], lnf, lnf + C, int(d.Nl), C);
  if (d.sp) gather(tp, s.lnf, s.lnf_full);
  cpu::matmul_forward(s.probs, s.lnf_full, wte, nullptr, int(d.N), C, int(d.Vl));
  if (d.tp == 1)
    cpu::softmax_crossentropy_forward(s.probs, s.losses, s.probs, targets, int(d.N), d.V);
  else
    vocab_parallel_xent(s, targets, tp);
}

void ModelPasses::backward_head(SlotActs& s, const float* lnf, const float* wte, float* glnf,
                                float* gwte, const std::int32_t* targets, TensorParallelComm* tp,
                                float scale) {
  const Dims& d = run_;
  const int C = d.C;
  const std::size_t N = d.N, Vl = d.Vl;
  zero(g_.logits, N * Vl);
  if (d.tp == 1) {
    cpu::crossentropy_softmax_backward(g_.logits, s.probs, targets, scale, int(N), d.V);
  } else {
    const std::size_t v0 = Vl * part_.tp_rank;
    for (std::size_t n = 0; n < N; ++n) {
      float* dl = g_.logits + n * Vl;
      const float* pr = s.probs + n * Vl;
#pragma omp simd
      for (std::size_t i = 0; i < Vl; ++i) dl[i] = pr[i] * scale;
      const std::size_t v = std::size_t(targets[n]) - v0;
      if (v < Vl) dl[v] -= scale;
    }
  }
  // Tied LM head: logits = lnf @ wte^T, so wte's gradient lands in the embedding's tensor.
  zero(g_.partial, N * C);
  cpu::matmul_backward(g_.partial, gwte, nullptr, g_.logits, s.lnf_full, wte, int(N), C, int(Vl));
  const float* dlnf = reduce_input_grad(tp);
  zero(g_.dres, d.Nl * C);
  cpu::layernorm_backward(g_.dres, glnf, glnf + C, dlnf, s.x[d.blocks], lnf, s.lnf_mean, s.lnf_rstd,
                          int(d.Nl), C);
}

// ---------------------------------------------------------------------------------------------

void add_tensor_parallel_bytes(const ModelSpec& spec, int B, const Partition& part, Recompute r,
                               std::map<std::string, double>& bytes) {
  const Dims d(spec, B, part);
  if (d.tp == 1) return;
  const double E = double(d.N) * d.C * sizeof(float);  // one [N,C] activation
  const double ce = double(d.N) * sizeof(float) * 3;   // row max, then (sum of exp, target)
  // A full recompute repeats a block's forward up to FC1 in backward: the attention's reduction
  // and, with sp, the two LayerNorm gathers.
  const double again = r == Recompute::full ? d.blocks : 0;
  if (d.sp) {
    // Per block: forward 2 all-gathers + 2 reduce-scatters, backward the same.
    const double ends = (d.embedding ? E : 0) + (d.head ? E : 0);
    bytes["all_gather"] += 4 * E * d.blocks + ends + 2 * E * again;
    bytes["reduce_scatter"] += 4 * E * d.blocks + ends + E * again;
    if (d.head) bytes["all_reduce"] += ce;
  } else {
    // Per block 2 all-reduces forward, 2 backward; embedding forward; head: backward and the
    // cross-entropy reductions.
    bytes["all_reduce"] +=
        4 * E * d.blocks + (d.embedding ? E : 0) + (d.head ? E + ce : 0) + E * again;
  }
}

}  // namespace strata
