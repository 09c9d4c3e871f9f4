// StageModel: a unit range of the GPT-2 workload, split Megatron-style across a tensor-parallel
// group (see strata/stage_model.hpp). Built on the same CPU layer passes as Model; with tp = 1 it
// runs exactly Model's kernels in Model's order, so pipeline-only runs are bitwise equal to it.
#include "strata/stage_model.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "cpu/layers.hpp"
#include "cpu/vecmath.hpp"
#include "model_parts.hpp"
#include "strata/types.hpp"

namespace strata {
namespace {

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

// Sizes of one partition. N = B*T token rows; Nl the rows of the residual stream on this rank.
struct Dims {
  int B, T, C, NH, V, tp, blocks;
  bool sp, embedding, head;
  std::size_t N, Nl, Cl, NHl, Vl, row0;  // row0: first token row of this rank (sequence parallel)
  Dims(const ModelSpec& s, int micro_batch, const Partition& p)
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
  }
};

struct BlockActs {
  float *ln1, *ln1_mean, *ln1_rstd, *ln1_full;  // [Nl,C] [Nl] [Nl] [N,C] (= ln1 without sp)
  float* qkv;                                   // [N,3Cl] this rank's heads of q | k | v
  float* atty;                                  // [N,Cl]
  float* att;                                   // [B,NHl,T,T]
  float* xmid;                                  // [Nl,C]
  float *ln2, *ln2_mean, *ln2_rstd, *ln2_full;  // as ln1
  float *fch, *fch_gelu;                        // [N,4Cl]
};

struct SlotActs {
  std::vector<float*> x;  // residual stream [Nl,C]: x[0] input (or embedding output) .. x[blocks]
  std::vector<BlockActs> block;
  float *lnf, *lnf_mean, *lnf_rstd, *lnf_full;  // head
  float *probs, *losses;                        // [N,Vl] [N]
  float* grad_in;                               // [Nl,C] d(input), partitions without embedding

  void carve(const Dims& d, Carver& c) {
    const std::size_t N = d.N, Nl = d.Nl, C = d.C;
    x.resize(d.blocks + 1);
    for (auto& p : x) p = c.take(Nl * C);
    block.resize(d.blocks);
    for (BlockActs& b : block) {
      b.ln1 = c.take(Nl * C);
      b.ln1_mean = c.take(Nl);
      b.ln1_rstd = c.take(Nl);
      b.ln1_full = d.sp ? c.take(N * C) : b.ln1;
      b.qkv = c.take(3 * N * d.Cl);
      b.atty = c.take(N * d.Cl);
      b.att = c.take(std::size_t(d.B) * d.NHl * d.T * d.T);
      b.xmid = c.take(Nl * C);
      b.ln2 = c.take(Nl * C);
      b.ln2_mean = c.take(Nl);
      b.ln2_rstd = c.take(Nl);
      b.ln2_full = d.sp ? c.take(N * C) : b.ln2;
      b.fch = c.take(4 * N * d.Cl);
      b.fch_gelu = c.take(4 * N * d.Cl);
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
};

// Shared gradient scratch: one backward at a time.
struct Scratch {
  float* dres;       // [Nl,C] d(residual stream)
  float* full;       // [N,C] all-gathered d(residual) (sequence parallel; else = dres)
  float* partial;    // [N,C] partial sums before the tp reduction (also forward, sequence parallel)
  float* shard;      // [Nl,C] reduce-scattered (sequence parallel; else = partial)
  float *a, *b, *c;  // block: [N,4Cl], [max(N 4Cl, B NHl T T)], [N,3Cl]
  float *logits, *ce;  // head: d(logits) [N,Vl]; vocab-parallel cross-entropy [3N]

  void carve(const Dims& d, Carver& c) {
    const std::size_t N = d.N, C = d.C;
    dres = c.take(d.Nl * C);
    full = d.sp ? c.take(N * C) : dres;
    partial = c.take(N * C);
    shard = d.sp ? c.take(d.Nl * C) : partial;
    a = b = this->c = logits = ce = nullptr;
    if (d.blocks > 0) {
      a = c.take(4 * N * d.Cl);
      b = c.take(std::max(4 * N * d.Cl, std::size_t(d.B) * d.NHl * d.T * d.T));
      this->c = c.take(3 * N * d.Cl);
    }
    if (d.head) {
      logits = c.take(N * d.Vl);
      ce = c.take(3 * N);
    }
  }
};

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
      throw Error(std::string("StageModel: ") + what + " token " + std::to_string(tok[i]) +
                  " out of range [0, " + std::to_string(V) + ")");
}

}  // namespace

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

struct StageModel::Impl {
  ModelSpec spec;
  ParamLayout layout;
  Partition part;
  Dims d;
  MemoryLedger& memory;
  std::vector<LocalTensor> tensors;
  std::size_t count = 0;
  std::vector<std::array<std::size_t, kBlockTensors>> block_off;  // local offsets per block
  std::size_t wte_off = 0, wpe_off = 0, lnf_off = 0;
  bool have_wte = false;
  Buffer<float> scratch_mem;
  Scratch g;
  struct Slot {
    Buffer<float> mem;
    Buffer<std::int32_t> tokens;  // inputs [N] | targets [N]
    SlotActs a;
    bool busy = false;
  };
  std::vector<std::unique_ptr<Slot>> slots;

  // allocate = false builds only the tensor table (for predictions).
  Impl(const ModelSpec& s, int B, const Partition& p, MemoryLedger& m, bool allocate = true)
      : spec(s), layout(s), part(p), d(s, B, p), memory(m) {
    const int L = s.layers;
    if (B <= 0) throw ConfigError("model: micro-batch must be positive");
    if (p.first_unit < 0 || p.last_unit > L + 1 || p.first_unit > p.last_unit)
      throw Error("StageModel: unit range [" + std::to_string(p.first_unit) + ", " +
                  std::to_string(p.last_unit) + "] outside [0, " + std::to_string(L + 1) + "]");
    if (p.tp_rank < 0 || p.tp_rank >= p.tp_size)
      throw Error("StageModel: tp rank " + std::to_string(p.tp_rank) + " of " +
                  std::to_string(p.tp_size));
    validate_tensor_parallel(s, B, p.tp_size, p.sequence_parallel);
    build_tensors();
    if (!allocate) return;
    Carver c;
    g.carve(d, c);
    scratch_mem = Buffer<float>(memory, MemTag::activations, c.used);
    Carver real{scratch_mem.data(), 0};
    g.carve(d, real);
  }

  std::size_t local_count(const TensorInfo& t, ShardKind k) const {
    return k == ShardKind::replicated ? t.count : t.count / part.tp_size;
  }

  void add(int global, ShardKind shard, bool tied_copy = false) {
    const TensorInfo& t = layout.tensors()[global];
    LocalTensor lt;
    lt.global = global;
    lt.offset = count;
    lt.shard = shard;
    lt.count = local_count(t, shard);
    lt.decay = t.decay;
    lt.tied_copy = tied_copy;
    count += lt.count;
    tensors.push_back(lt);
  }

  void build_tensors() {
    const int L = spec.layers;
    for (int u = part.first_unit; u <= part.last_unit; ++u) {
      const UnitInfo& unit = layout.units()[u];
      if (u == 0) {
        wte_off = count;
        have_wte = true;
        add(unit.first_tensor, ShardKind::rows);
        wpe_off = count;
        add(unit.first_tensor + 1, ShardKind::replicated);
      } else if (u <= L) {
        std::array<std::size_t, kBlockTensors> off{};
        for (int k = 0; k < kBlockTensors; ++k) {
          off[k] = count;
          add(unit.first_tensor + k, block_shard(k));
        }
        block_off.push_back(off);
      } else {
        if (!have_wte) {  // the LM head's own copy of the tied embedding
          wte_off = count;
          have_wte = true;
          add(layout.units()[0].first_tensor, ShardKind::rows, true);
        }
        lnf_off = count;
        add(unit.first_tensor, ShardKind::replicated);
        add(unit.first_tensor + 1, ShardKind::replicated);
      }
    }
  }

  // The global elements of one local tensor, in local order. Each slice is initialised in place
  // (init_params of any range equals that range of a full initialisation), so no temporary of
  // the full tensor is needed (gpt2-124m's wte would be 154 MiB outside the ledger).
  void init_tensor(const LocalTensor& lt, std::uint64_t seed, float* out) const {
    const TensorInfo& t = layout.tensors()[lt.global];
    const std::size_t r = part.tp_rank, tp = part.tp_size;
    auto init = [&](std::size_t first, std::size_t n, float* dst) {  // t's elements [first, +n)
      strata::init_params(layout, seed, t.offset + first, {dst, n});
    };
    if (lt.shard == ShardKind::replicated) {
      init(0, t.count, out);
    } else if (lt.shard == ShardKind::rows) {  // contiguous
      init(r * lt.count, lt.count, out);
    } else if (lt.shard == ShardKind::qkv_rows) {  // [3C(, C)]: rows r*Cl.. of each of q, k, v
      const std::size_t third = t.count / 3, part_n = third / tp;
      for (std::size_t i = 0; i < 3; ++i) init(i * third + r * part_n, part_n, out + i * part_n);
    } else {  // columns of [OC, IC]: columns r*ICl.. of every row
      const std::size_t oc = t.shape[0], ic = t.shape[1], icl = ic / tp;
      for (std::size_t o = 0; o < oc; ++o) init(o * ic + r * icl, icl, out + o * icl);
    }
  }

  Slot& slot(int i) {
    if (i < 0 || i >= int(slots.size()) || !slots[i]->busy)
      throw Error("StageModel: slot " + std::to_string(i) + " is not acquired");
    return *slots[i];
  }

  // --- tensor-parallel communication (no-ops at tp = 1)
  void all_reduce(Group* tp, float* p, std::size_t n) {
    if (d.tp > 1) tp->all_reduce(view(p, n));
  }
  void gather(Group* tp, const float* shard, float* full) {  // [Nl,C] -> [N,C]
    tp->all_gather(view(const_cast<float*>(shard), d.Nl * d.C), view(full, d.N * d.C));
  }
  void scatter(Group* tp, float* full, float* shard) {  // [N,C] partial -> [Nl,C] summed
    tp->reduce_scatter(view(full, d.N * d.C), view(shard, d.Nl * d.C));
  }

  // Row-parallel matmul (proj, FC2): out[Nl,C] = reduce(inp[N,ICl] @ W[C,ICl]^T) + bias. At tp 1
  // the bias goes into the GEMM call, as in Model.
  void row_parallel(Group* tp, float* out, const float* inp, const float* w, const float* bias,
                    int icl) {
    const int C = d.C;
    if (d.tp == 1) {
      cpu::matmul_forward(out, inp, w, bias, int(d.N), icl, C);
      return;
    }
    if (d.sp) {
      cpu::matmul_forward(g.partial, inp, w, nullptr, int(d.N), icl, C);
      scatter(tp, g.partial, out);
    } else {
      cpu::matmul_forward(out, inp, w, nullptr, int(d.N), icl, C);
      tp->all_reduce(view(out, d.N * C));
    }
    add_bias(out, bias, d.Nl, C);
  }

  // d(input of a column-parallel matmul): partial [N,C] in g.partial -> the rank's rows, summed.
  float* reduce_input_grad(Group* tp) {
    if (d.sp) {
      scatter(tp, g.partial, g.shard);
      return g.shard;
    }
    all_reduce(tp, g.partial, d.N * d.C);
    return g.partial;
  }

  void forward_block(int l, const float* p, SlotActs& s, Group* tp) {
    const std::array<std::size_t, kBlockTensors>& o = block_off[l];
    BlockActs& a = s.block[l];
    const int N = int(d.N), Nl = int(d.Nl), C = d.C, Cl = int(d.Cl);
    const float* x_in = s.x[l];
    float* x_out = s.x[l + 1];
    cpu::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x_in, p + o[kLn1W], p + o[kLn1B], Nl, C);
    if (d.sp) gather(tp, a.ln1, a.ln1_full);
    cpu::matmul_forward(a.qkv, a.ln1_full, p + o[kQkvW], p + o[kQkvB], N, C, 3 * Cl);
    cpu::attention_forward(a.atty, a.att, a.qkv, d.B, d.T, Cl, int(d.NHl));
    row_parallel(tp, a.xmid, a.atty, p + o[kProjW], p + o[kProjB], Cl);
    cpu::residual_forward(a.xmid, a.xmid, x_in, std::int64_t(Nl) * C);
    cpu::layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.xmid, p + o[kLn2W], p + o[kLn2B], Nl,
                           C);
    if (d.sp) gather(tp, a.ln2, a.ln2_full);
    cpu::matmul_forward(a.fch, a.ln2_full, p + o[kFcW], p + o[kFcB], N, C, 4 * Cl);
    cpu::gelu_forward(a.fch_gelu, a.fch, std::int64_t(N) * 4 * Cl);
    row_parallel(tp, x_out, a.fch_gelu, p + o[kFcprojW], p + o[kFcprojB], 4 * Cl);
    cpu::residual_forward(x_out, x_out, a.xmid, std::int64_t(Nl) * C);
  }

  // g.dres holds d(x_out) on entry, d(x_in) on return.
  void backward_block(int l, const float* p, float* gr, SlotActs& s, Group* tp) {
    const std::array<std::size_t, kBlockTensors>& o = block_off[l];
    const BlockActs& a = s.block[l];
    const int N = int(d.N), Nl = int(d.Nl), C = d.C, Cl = int(d.Cl);
    const std::size_t NC = d.N * C;
    const bool tp1 = d.tp == 1;
    // MLP. d(FC2 output) is d(x_out): all-gathered to every row with sequence parallelism.
    if (d.sp) gather(tp, g.dres, g.full);
    if (!tp1) bias_grad(gr + o[kFcprojB], g.dres, d.Nl, C);
    zero(g.a, 4 * d.N * Cl);
    cpu::matmul_backward(g.a, gr + o[kFcprojW], tp1 ? gr + o[kFcprojB] : nullptr, g.full,
                         a.fch_gelu, p + o[kFcprojW], N, 4 * Cl, C);
    zero(g.b, 4 * d.N * Cl);
    cpu::gelu_backward(g.b, a.fch, g.a, std::int64_t(N) * 4 * Cl);
    zero(g.partial, NC);
    cpu::matmul_backward(g.partial, gr + o[kFcW], gr + o[kFcB], g.b, a.ln2_full, p + o[kFcW], N, C,
                         4 * Cl);
    const float* dln2 = reduce_input_grad(tp);
    cpu::layernorm_backward(g.dres, gr + o[kLn2W], gr + o[kLn2B], dln2, a.xmid, p + o[kLn2W],
                            a.ln2_mean, a.ln2_rstd, Nl, C);
    // Attention.
    if (d.sp) gather(tp, g.dres, g.full);
    if (!tp1) bias_grad(gr + o[kProjB], g.dres, d.Nl, C);
    zero(g.a, d.N * Cl);
    cpu::matmul_backward(g.a, gr + o[kProjW], tp1 ? gr + o[kProjB] : nullptr, g.full, a.atty,
                         p + o[kProjW], N, Cl, C);
    zero(g.c, 3 * d.N * Cl);
    cpu::attention_backward(g.c, g.b, g.a, a.qkv, a.att, d.B, d.T, Cl, int(d.NHl));
    zero(g.partial, NC);
    cpu::matmul_backward(g.partial, gr + o[kQkvW], gr + o[kQkvB], g.c, a.ln1_full, p + o[kQkvW], N,
                         C, 3 * Cl);
    const float* dln1 = reduce_input_grad(tp);
    cpu::layernorm_backward(g.dres, gr + o[kLn1W], gr + o[kLn1B], dln1, s.x[l], p + o[kLn1W],
                            a.ln1_mean, a.ln1_rstd, Nl, C);
  }

  // Vocab-parallel embedding: each rank looks up the tokens of its vocab rows, the partial rows
  // are summed across tp, then wpe is added per token row.
  void forward_embedding(const float* p, const std::int32_t* tok, float* x0, Group* tp) {
    const int C = d.C;
    const float* wte = p + wte_off;
    const float* wpe = p + wpe_off;
    if (d.tp == 1) {
      cpu::encoder_forward(x0, tok, wte, wpe, d.B, d.T, C);
      return;
    }
    const std::size_t v0 = d.Vl * part.tp_rank;
    float* rows = d.sp ? g.partial : x0;
    for (std::size_t n = 0; n < d.N; ++n) {
      const std::size_t v = std::size_t(tok[n]) - v0;  // wraps for tokens below v0
      if (v < d.Vl)
        std::copy_n(wte + v * C, C, rows + n * C);
      else
        std::fill_n(rows + n * C, C, 0.0f);
    }
    if (d.sp)
      scatter(tp, g.partial, x0);
    else
      tp->all_reduce(view(x0, d.N * C));
    for (std::size_t i = 0; i < d.Nl; ++i) {
      const float* pos = wpe + ((d.row0 + i) % d.T) * C;
      for (int c = 0; c < C; ++c) x0[i * C + c] += pos[c];
    }
  }

  void backward_embedding(float* gr, const std::int32_t* tok, Group* tp) {
    const int C = d.C;
    float* dwte = gr + wte_off;
    float* dwpe = gr + wpe_off;
    if (d.tp == 1) {
      cpu::encoder_backward(dwte, dwpe, g.dres, tok, d.B, d.T, C);
      return;
    }
    for (std::size_t i = 0; i < d.Nl; ++i) {
      float* pos = dwpe + ((d.row0 + i) % d.T) * C;
      for (int c = 0; c < C; ++c) pos[c] += g.dres[i * C + c];
    }
    if (d.sp) gather(tp, g.dres, g.full);
    const std::size_t v0 = d.Vl * part.tp_rank;
    for (std::size_t n = 0; n < d.N; ++n) {
      const std::size_t v = std::size_t(tok[n]) - v0;
      if (v < d.Vl)
        for (int c = 0; c < C; ++c) dwte[v * C + c] += g.full[n * C + c];
    }
  }

  // Vocab-parallel softmax cross-entropy over logits [N,Vl] (in probs): the row max and the
  // (sum of exp, target logit) pairs are all-reduced; the logits never leave the rank.
  void vocab_parallel_xent(SlotActs& s, const std::int32_t* targets, Group* tp) {
    const std::size_t N = d.N, Vl = d.Vl, v0 = Vl * part.tp_rank;
    float* mx = g.ce;         // [N]
    float* sum_t = g.ce + N;  // [N] sums of exp | [N] target logit - max
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
    tp->all_reduce(view(sum_t, 2 * N));
    for (std::size_t n = 0; n < N; ++n) {
      const float inv = 1.0f / sum_t[n];
      float* x = s.probs + n * Vl;
#pragma omp simd
      for (std::size_t i = 0; i < Vl; ++i) x[i] *= inv;
      s.losses[n] = float(std::log(double(sum_t[n])) - double(sum_t[N + n]));
    }
  }

  void forward_head(const float* p, SlotActs& s, const std::int32_t* targets, Group* tp) {
    const int C = d.C;
    const float* x = s.x[d.blocks];
    cpu::layernorm_forward(s.lnf, s.lnf_mean, s.lnf_rstd, x, p + lnf_off, p + lnf_off + C,
                           int(d.Nl), C);
    if (d.sp) gather(tp, s.lnf, s.lnf_full);
    cpu::matmul_forward(s.probs, s.lnf_full, p + wte_off, nullptr, int(d.N), C, int(d.Vl));
    if (d.tp == 1)
      cpu::softmax_crossentropy_forward(s.probs, s.losses, s.probs, targets, int(d.N), d.V);
    else
      vocab_parallel_xent(s, targets, tp);
  }

  void backward_head(const float* p, float* gr, SlotActs& s, const std::int32_t* targets, Group* tp,
                     float scale) {
    const int C = d.C;
    const std::size_t N = d.N, Vl = d.Vl;
    zero(g.logits, N * Vl);
    if (d.tp == 1) {
      cpu::crossentropy_softmax_backward(g.logits, s.probs, targets, scale, int(N), d.V);
    } else {
      const std::size_t v0 = Vl * part.tp_rank;
      for (std::size_t n = 0; n < N; ++n) {
        float* dl = g.logits + n * Vl;
        const float* pr = s.probs + n * Vl;
#pragma omp simd
        for (std::size_t i = 0; i < Vl; ++i) dl[i] = pr[i] * scale;
        const std::size_t v = std::size_t(targets[n]) - v0;
        if (v < Vl) dl[v] -= scale;
      }
    }
    zero(g.partial, N * C);
    cpu::matmul_backward(g.partial, gr + wte_off, nullptr, g.logits, s.lnf_full, p + wte_off,
                         int(N), C, int(Vl));
    const float* dlnf = reduce_input_grad(tp);
    zero(g.dres, d.Nl * C);
    cpu::layernorm_backward(g.dres, gr + lnf_off, gr + lnf_off + C, dlnf, s.x[d.blocks],
                            p + lnf_off, s.lnf_mean, s.lnf_rstd, int(d.Nl), C);
  }
};

StageModel::StageModel(const ModelSpec& spec, int micro_batch, const Partition& part,
                       MemoryLedger& memory)
    : impl_(std::make_unique<Impl>(spec, micro_batch, part, memory)) {}
StageModel::~StageModel() = default;

const Partition& StageModel::partition() const { return impl_->part; }
bool StageModel::has_embedding() const { return impl_->d.embedding; }
bool StageModel::has_head() const { return impl_->d.head; }
bool StageModel::needs_tokens() const { return impl_->d.embedding || impl_->d.head; }
const std::vector<LocalTensor>& StageModel::tensors() const { return impl_->tensors; }
std::size_t StageModel::param_count() const { return impl_->count; }
std::size_t StageModel::wte_offset() const { return impl_->wte_off; }
std::size_t StageModel::wte_count() const { return impl_->have_wte ? impl_->d.Vl * impl_->d.C : 0; }
std::size_t StageModel::boundary_count() const { return impl_->d.Nl * impl_->d.C; }
std::size_t StageModel::boundary_count(const ModelSpec& spec, int B, const Partition& part) {
  const Dims d(spec, B, part);
  return d.Nl * d.C;
}

void StageModel::init_params(std::uint64_t seed, float* params) const {
  for (const LocalTensor& lt : impl_->tensors) impl_->init_tensor(lt, seed, params + lt.offset);
}

std::vector<AdamWSegment> StageModel::adamw_segments() const {
  std::vector<AdamWSegment> s;
  for (const LocalTensor& lt : impl_->tensors) s.push_back({lt.count, lt.decay});
  return s;
}

std::vector<const LocalTensor*> StageModel::tp_partial_grads() const {
  std::vector<const LocalTensor*> r;
  if (!impl_->d.sp) return r;
  for (const LocalTensor& lt : impl_->tensors)
    if (lt.shard == ShardKind::replicated) r.push_back(&lt);
  return r;
}

double StageModel::grad_sum_of_squares(const float* grads) const {
  double s = 0;
  for (const LocalTensor& lt : impl_->tensors) {
    if (lt.tied_copy) continue;
    if (lt.shard == ShardKind::replicated && impl_->part.tp_rank != 0) continue;
    s += sum_of_squares(grads + lt.offset, lt.count);
  }
  return s;
}

int StageModel::acquire_slot() {
  Impl& m = *impl_;
  for (std::size_t i = 0; i < m.slots.size(); ++i)
    if (!m.slots[i]->busy) {
      m.slots[i]->busy = true;
      return int(i);
    }
  auto s = std::make_unique<Impl::Slot>();
  Carver count;
  s->a.carve(m.d, count);
  s->mem = Buffer<float>(m.memory, MemTag::activations, count.used);
  Carver c{s->mem.data(), 0};
  s->a.carve(m.d, c);
  s->tokens = Buffer<std::int32_t>(m.memory, MemTag::workspace, 2 * m.d.N);
  s->busy = true;
  m.slots.push_back(std::move(s));
  return int(m.slots.size()) - 1;
}

void StageModel::release_slot(int slot) { impl_->slot(slot).busy = false; }
int StageModel::slots_allocated() const { return int(impl_->slots.size()); }
float* StageModel::input(int slot) { return impl_->slot(slot).a.x[0]; }
const float* StageModel::output(int slot) const {
  const Impl::Slot& s = impl_->slot(slot);
  return s.a.x[impl_->d.blocks];
}
float* StageModel::output_grad() { return impl_->g.dres; }
const float* StageModel::input_grad(int slot) const { return impl_->slot(slot).a.grad_in; }

void StageModel::forward(int slot, const float* params, const MicroBatch& mb, Group* tp) {
  Impl& m = *impl_;
  const Dims& d = m.d;
  if (d.tp > 1 && (!tp || tp->size() != d.tp))
    throw Error("StageModel: needs the tp group of size " + std::to_string(d.tp));
  const bool tokens = needs_tokens();
  if (mb.batch != d.B || mb.seq != d.T || (tokens && (!mb.inputs || !mb.targets)))
    throw Error("StageModel: micro-batch " + std::to_string(mb.batch) + "x" +
                std::to_string(mb.seq) + " does not match " + std::to_string(d.B) + "x" +
                std::to_string(d.T) + (tokens ? " with tokens" : ""));
  Impl::Slot& s = m.slot(slot);
  std::int32_t* inputs = s.tokens.data();
  std::int32_t* targets = inputs + d.N;
  if (tokens) {
    std::copy_n(mb.inputs, d.N, inputs);
    std::copy_n(mb.targets, d.N, targets);
  }
  if (d.embedding) {
    check_tokens(inputs, d.N, d.V, "input");
    m.forward_embedding(params, inputs, s.a.x[0], tp);
  }
  for (int l = 0; l < d.blocks; ++l) m.forward_block(l, params, s.a, tp);
  if (d.head) {
    check_tokens(targets, d.N, d.V, "target");
    m.forward_head(params, s.a, targets, tp);
  }
}

void StageModel::backward(int slot, const float* params, float* grads, Group* tp,
                          float grad_scale) {
  Impl& m = *impl_;
  const Dims& d = m.d;
  Impl::Slot& s = m.slot(slot);
  const std::int32_t* inputs = s.tokens.data();
  const std::int32_t* targets = inputs + d.N;
  if (d.head) m.backward_head(params, grads, s.a, targets, tp, grad_scale);
  for (int l = d.blocks - 1; l >= 0; --l) m.backward_block(l, params, grads, s.a, tp);
  if (d.embedding)
    m.backward_embedding(grads, inputs, tp);
  else
    std::copy_n(m.g.dres, d.Nl * d.C, s.a.grad_in);
}

double StageModel::loss_sum(int slot) const {
  const Impl::Slot& s = impl_->slot(slot);
  if (!impl_->d.head) return 0.0;
  double sum = 0.0;
  for (std::size_t i = 0; i < impl_->d.N; ++i) sum += s.a.losses[i];
  return sum;
}

std::uint64_t StageModel::slot_bytes(const ModelSpec& spec, int B, const Partition& part) {
  Carver c;
  SlotActs().carve(Dims(spec, B, part), c);
  return c.used * sizeof(float);
}

std::uint64_t StageModel::slot_token_bytes(const ModelSpec& spec, int B) {
  return 2ull * B * spec.seq * sizeof(std::int32_t);
}

std::uint64_t StageModel::scratch_bytes(const ModelSpec& spec, int B, const Partition& part) {
  Carver c;
  Scratch().carve(Dims(spec, B, part), c);
  return c.used * sizeof(float);
}

std::vector<LocalTensor> StageModel::local_tensors(const ModelSpec& spec, const Partition& part) {
  MemoryLedger unused;
  Partition p = part;
  p.sequence_parallel = false;  // the tensor table does not depend on it (or on the batch)
  return Impl(spec, 1, p, unused, false).tensors;
}

void add_tensor_parallel_bytes(const ModelSpec& spec, int B, const Partition& part,
                               std::map<std::string, double>& bytes) {
  const Dims d(spec, B, part);
  if (d.tp == 1) return;
  const double E = double(d.N) * d.C * sizeof(float);  // one [N,C] activation
  const double ce = double(d.N) * sizeof(float) * 3;   // row max, then (sum of exp, target)
  if (d.sp) {
    // Per block: forward 2 all-gathers + 2 reduce-scatters, backward the same.
    bytes["all_gather"] += 4 * E * d.blocks + (d.embedding ? E : 0) + (d.head ? E : 0);
    bytes["reduce_scatter"] += 4 * E * d.blocks + (d.embedding ? E : 0) + (d.head ? E : 0);
    if (d.head) bytes["all_reduce"] += ce;
  } else {
    // Per block 2 all-reduces forward, 2 backward; embedding forward; head: backward and the
    // cross-entropy reductions.
    bytes["all_reduce"] += 4 * E * d.blocks + (d.embedding ? E : 0) + (d.head ? E + ce : 0);
  }
}

}  // namespace strata
