// The GPT-2 workload: parameter layout, deterministic initialisation, and the per-unit passes on
// the CPU layer functions (cpu/layers.hpp).
#include "strata/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "cpu/layers.hpp"
#include "model_parts.hpp"
#include "strata/types.hpp"

namespace strata {

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      {{"tiny", 2, 64, 4, 64, 256}, 3e-3},
      {{"small", 4, 256, 4, 128, 4096}, 1e-3},
      {{"gpt2-124m", 12, 768, 12, 1024, 50257}, 6e-4},  // GPT-2 small; lr as in GPT-3's table
  };
  return presets;
}

const ModelPreset* find_model_preset(const std::string& name) {
  for (const ModelPreset& p : model_presets())
    if (p.spec.preset == name) return &p;
  return nullptr;
}

bool is_model_preset(const std::string& name) { return find_model_preset(name) != nullptr; }

ModelSpec model_preset(const std::string& name) {
  if (const ModelPreset* p = find_model_preset(name)) return p->spec;
  std::string names;
  for (const ModelPreset& p : model_presets()) names += (names.empty() ? "" : ", ") + p.spec.preset;
  throw ConfigError("model preset " + name + ": must be one of " + names);
}

namespace {

void validate(const ModelSpec& s) {
  auto positive = [](int v, const char* name) {
    if (v <= 0) {
      throw ConfigError("model: " + std::string(name) + " must be positive, got " +
                        std::to_string(v));
    }
  };
  positive(s.layers, "layers");
  positive(s.hidden, "hidden");
  positive(s.heads, "heads");
  positive(s.seq, "seq");
  positive(s.vocab, "vocab");
  if (s.hidden % s.heads != 0) {
    throw ConfigError("model: hidden (" + std::to_string(s.hidden) +
                      ") must be a multiple of heads (" + std::to_string(s.heads) + ")");
  }
}

// --- Deterministic initialisation: a counter-based generator keyed by (seed, tensor id, index).

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Two independent standard normals for the element pair (2p, 2p + 1) of the tensor whose key is
// `key`: Box-Muller on two uniforms hashed from (key, p), cos half for 2p and sin half for 2p + 1.
struct NormalPair {
  double z0, z1;
};
NormalPair hashed_normals(std::uint64_t key, std::uint64_t p) {
  const std::uint64_t h1 = splitmix64(key ^ (2 * p));
  const std::uint64_t h2 = splitmix64(key ^ (2 * p + 1));
  const double u1 = double((h1 >> 11) + 1) * 0x1.0p-53;  // (0, 1]: log is finite
  const double u2 = double(h2 >> 11) * 0x1.0p-53;        // [0, 1)
  const double r = std::sqrt(-2.0 * std::log(u1)), theta = 2.0 * std::numbers::pi * u2;
  return {r * std::cos(theta), r * std::sin(theta)};
}

std::uint64_t tensor_key(std::uint64_t seed, int tensor_id) {
  return splitmix64(seed ^ splitmix64(0xD1B54A32D192ED03ull * std::uint64_t(tensor_id + 1)));
}

// --- Activation memory plan: one buffer carved into pieces (Carver, model_parts.hpp).

struct LayerActs {
  float *ln1, *ln1_mean, *ln1_rstd;  // [N,C], [N], [N]
  float* qkv;                        // [N,3C]
  float* atty;                       // [N,C]  attention output (heads concatenated)
  float* att;                        // [B,NH,T,T] softmax probabilities
  float* xmid;                       // [N,C]  x_in + attention projection
  float *ln2, *ln2_mean, *ln2_rstd;  // [N,C], [N], [N]
  float* fch;                        // [N,4C] MLP pre-activation
  float* fch_gelu;                   // [N,4C]

  // Carves one block's activations; att only if with_att (otherwise it is left null).
  void carve(std::size_t N, std::size_t C, std::size_t att_n, bool with_att, Carver& c) {
    ln1 = c.take(N * C);
    ln1_mean = c.take(N);
    ln1_rstd = c.take(N);
    qkv = c.take(3 * N * C);
    atty = c.take(N * C);
    att = with_att ? c.take(att_n) : nullptr;
    xmid = c.take(N * C);
    ln2 = c.take(N * C);
    ln2_mean = c.take(N);
    ln2_rstd = c.take(N);
    fch = c.take(4 * N * C);
    fch_gelu = c.take(4 * N * C);
  }
};

void check_recompute(Recompute r) {
  if (r != Recompute::none && r != Recompute::full && r != Recompute::selective) {
    throw ConfigError("model: recompute must be one of none, full, selective; got value " +
                      std::to_string(int(r)));
  }
}

struct ActPlan {
  std::vector<float*> x;  // residual stream x_0 .. x_L, each [N,C]; x_l is block l's input
  // Per block. Recompute::none: L separate sets. Recompute::selective: L separate sets whose att
  // all point at one shared buffer. Recompute::full: all L entries name one shared set.
  std::vector<LayerActs> layers;
  float *lnf, *lnf_mean, *lnf_rstd;  // [N,C], [N], [N]
  float* probs;                      // [N,V] (the logits, then softmax in place)
  float* losses;                     // [N]
  // Gradients. dres is d(residual stream), carried from the head down to the embedding.
  // The rest is one shared scratch region, live only inside one backward (or, for the shared
  // recompute buffers, one forward) call. The head uses [dlogits N*V | dlnf N*C]; each block
  // reuses three pieces of it, in the order of Impl::backward_block:
  //   ws_a [4NC]                 : d(fch_gelu), later d(qkv) (and the discarded output of the
  //                                selective attention recompute just before that)
  //   ws_b [max(4NC, B*NH*T*T)]  : d(fch), later the d(att) scratch, later d(ln1)
  //   ws_d [NC]                  : d(ln2), later d(atty)
  // followed, in the block view, by the shared recompute buffers: Recompute::selective the one
  // att [B,NH,T,T], Recompute::full one whole LayerActs. A block's forward writes them and
  // nothing reads them afterwards (its backward recomputes them), and the head's scratch is dead
  // outside the head's backward, so the two views can overlap.
  float* dres;
  float *dlogits, *dlnf;
  float *ws_a, *ws_b, *ws_d;

  void carve(const ModelSpec& s, int B, Recompute r, Carver& c) {
    check_recompute(r);
    const std::size_t N = std::size_t(B) * s.seq, C = s.hidden, L = s.layers;
    const std::size_t att = std::size_t(B) * s.heads * s.seq * s.seq;
    x.resize(L + 1);
    for (auto& p : x) p = c.take(N * C);
    layers.resize(L);
    if (r != Recompute::full) {
      for (auto& a : layers) a.carve(N, C, att, r == Recompute::none, c);
    }
    lnf = c.take(N * C);
    lnf_mean = c.take(N);
    lnf_rstd = c.take(N);
    probs = c.take(N * std::size_t(s.vocab));
    losses = c.take(N);
    dres = c.take(N * C);
    // The shared scratch: carve both views from the same start, keep the larger.
    Carver head{c.base, c.used}, block{c.base, c.used};
    dlogits = head.take(N * std::size_t(s.vocab));
    dlnf = head.take(N * C);
    ws_a = block.take(4 * N * C);
    ws_b = block.take(std::max(4 * N * C, att));
    ws_d = block.take(N * C);
    if (r == Recompute::full) {
      LayerActs shared;
      shared.carve(N, C, att, true, block);
      for (auto& a : layers) a = shared;
    } else if (r == Recompute::selective) {
      float* shared_att = block.take(att);
      for (auto& a : layers) a.att = shared_att;
    }
    c.used = std::max(head.used, block.used);
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// ParamLayout

ParamLayout::ParamLayout(const ModelSpec& spec) {
  validate(spec);
  const int C = spec.hidden, L = spec.layers;
  const float std_w = 0.02f;
  const float std_out = 0.02f / std::sqrt(2.0f * float(L));  // GPT-2 residual projections

  auto begin_unit = [&](std::string name, UnitKind kind, int block) {
    UnitInfo u;
    u.name = std::move(name);
    u.kind = kind;
    u.block = block;
    u.offset = total_;
    u.first_tensor = int(tensors_.size());
    units_.push_back(std::move(u));
  };
  auto add = [&](const std::string& name, std::vector<int> shape, bool decay, float init_std,
                 float init_value) {
    TensorInfo t;
    t.name = units_.back().name + "." + name;
    t.id = int(tensors_.size());
    t.unit = int(units_.size()) - 1;
    t.offset = total_;
    t.count = 1;
    for (int d : shape) t.count *= std::size_t(d);
    t.shape = std::move(shape);
    t.decay = decay;
    t.init_std = init_std;
    t.init_value = init_value;
    total_ += t.count;
    tensors_.push_back(std::move(t));
    units_.back().count += tensors_.back().count;
    units_.back().num_tensors += 1;
  };

  begin_unit("embedding", UnitKind::embedding, -1);
  add("wte", {spec.vocab, C}, true, std_w, 0.0f);
  add("wpe", {spec.seq, C}, true, std_w, 0.0f);
  for (int b = 0; b < L; ++b) {
    begin_unit("block" + std::to_string(b), UnitKind::block, b);
    add("ln1_w", {C}, false, 0.0f, 1.0f);
    add("ln1_b", {C}, false, 0.0f, 0.0f);
    add("qkv_w", {3 * C, C}, true, std_w, 0.0f);
    add("qkv_b", {3 * C}, false, 0.0f, 0.0f);
    add("proj_w", {C, C}, true, std_out, 0.0f);
    add("proj_b", {C}, false, 0.0f, 0.0f);
    add("ln2_w", {C}, false, 0.0f, 1.0f);
    add("ln2_b", {C}, false, 0.0f, 0.0f);
    add("fc_w", {4 * C, C}, true, std_w, 0.0f);
    add("fc_b", {4 * C}, false, 0.0f, 0.0f);
    add("fcproj_w", {C, 4 * C}, true, std_out, 0.0f);
    add("fcproj_b", {C}, false, 0.0f, 0.0f);
  }
  begin_unit("head", UnitKind::head, -1);
  add("lnf_w", {C}, false, 0.0f, 1.0f);
  add("lnf_b", {C}, false, 0.0f, 0.0f);

  if (total_ != std::size_t(spec.total_params())) {
    throw Error("ParamLayout: " + std::to_string(total_) + " parameters, ModelSpec says " +
                std::to_string(spec.total_params()));
  }
}

const TensorInfo& ParamLayout::tensor_at(std::size_t index) const {
  if (index >= total_) {
    throw Error("ParamLayout::tensor_at: index " + std::to_string(index) + " >= total " +
                std::to_string(total_));
  }
  auto it = std::upper_bound(tensors_.begin(), tensors_.end(), index,
                             [](std::size_t i, const TensorInfo& t) { return i < t.offset; });
  return *(it - 1);
}

void init_params(const ParamLayout& layout, std::uint64_t seed, std::size_t begin,
                 std::span<float> out) {
  const std::size_t end = begin + out.size();
  if (end > layout.total() || end < begin) {
    throw Error("init_params: range [" + std::to_string(begin) + ", " + std::to_string(end) +
                ") exceeds the " + std::to_string(layout.total()) + " parameters");
  }
  std::size_t j = begin;
  while (j < end) {
    const TensorInfo& t = layout.tensor_at(j);
    const std::size_t i0 = j - t.offset;
    const std::size_t i1 = std::min(t.count, end - t.offset);
    float* o = out.data() + (j - begin);
    if (t.init_std > 0.0f) {
      // Element i of the tensor is half of pair i / 2; the slice covers pairs [i0 / 2, ceil(i1 /
      // 2)).
      const std::uint64_t key = tensor_key(seed, t.id);
      const double sd = t.init_std;
      const std::int64_t p0 = std::int64_t(i0 / 2), p1 = std::int64_t((i1 + 1) / 2);
#pragma omp parallel for num_threads(cpu::blas_threads()) if (p1 - p0 > (1 << 14)) schedule(static)
      for (std::int64_t p = p0; p < p1; ++p) {
        const NormalPair z = hashed_normals(key, std::uint64_t(p));
        const std::size_t i = 2 * std::size_t(p);
        if (i >= i0) o[i - i0] = float(sd * z.z0);
        if (i + 1 < i1) o[i + 1 - i0] = float(sd * z.z1);
      }
    } else {
      std::fill(o, o + (i1 - i0), t.init_value);
    }
    j = t.offset + i1;
  }
}

// ---------------------------------------------------------------------------------------------
// Model

struct Model::Impl {
  ModelSpec spec;
  ParamLayout layout;
  int B;
  Buffer<float> memory;  // every activation and activation gradient (MemTag::activations)
  ActPlan a;
  // Offsets of each block tensor from the start of its unit, and of wpe in the embedding unit.
  std::size_t block_off[kBlockTensors] = {};
  std::size_t wpe_off = 0;
  Recompute recompute;
  int last_batch = 0;  // micro-batch size of the last head forward, for loss_sum()
  bool have_loss = false;

  Impl(const ModelSpec& s, int micro_batch, MemoryLedger& ledger, Recompute r)
      : spec(s), layout(s), B(micro_batch), recompute(r) {
    if (micro_batch <= 0) {
      throw ConfigError("model: micro-batch must be positive, got " + std::to_string(B));
    }
    Carver count;
    ActPlan().carve(spec, B, recompute, count);
    memory = Buffer<float>(ledger, MemTag::activations, count.used);
    Carver c{memory.data(), 0};
    a.carve(spec, B, recompute, c);
    const UnitInfo& blk = layout.units()[1];
    for (int k = 0; k < kBlockTensors; ++k)
      block_off[k] = layout.tensors()[blk.first_tensor + k].offset - blk.offset;
    wpe_off = layout.tensors()[1].offset;
  }

  void check(int unit, const UnitPtrs& params, const MicroBatch& mb) const {
    const int units = spec.layers + 2;
    if (unit < 0 || unit >= units) {
      throw Error("Model: unit " + std::to_string(unit) + " out of range [0, " +
                  std::to_string(units) + ")");
    }
    if (int(params.size()) < units) {
      throw Error("Model: UnitPtrs has " + std::to_string(params.size()) + " entries, need " +
                  std::to_string(units));
    }
    if (mb.batch <= 0 || mb.batch > B || mb.seq != spec.seq || !mb.inputs || !mb.targets) {
      throw Error("Model: micro-batch " + std::to_string(mb.batch) + "x" + std::to_string(mb.seq) +
                  " does not fit this model (batch 1.." + std::to_string(B) + ", seq " +
                  std::to_string(spec.seq) + ", non-null tokens)");
    }
  }

  void check_tokens(const std::int32_t* tok, std::size_t n, const char* what) const {
    std::int32_t lo = 0, hi = 0;
    for (std::size_t i = 0; i < n; ++i) {
      lo = std::min(lo, tok[i]);
      hi = std::max(hi, tok[i]);
    }
    if (lo < 0 || hi >= spec.vocab) {
      throw Error(std::string("Model: ") + what + " token out of range [0, " +
                  std::to_string(spec.vocab) + "): " + std::to_string(lo < 0 ? lo : hi));
    }
  }

  // recomputing: the Recompute::full recompute in backward, which stops at fch_gelu: the block
  // output (fcproj and the second residual) is not needed by the backward and x_{l+1} is kept.
  void forward_block(int l, const float* p, int Bm, bool recomputing = false) {
    const int T = spec.seq, C = spec.hidden, NH = spec.heads, N = Bm * T;
    const std::int64_t NC = std::int64_t(N) * C;
    const std::size_t* o = block_off;
    LayerActs& s = a.layers[l];
    const float* x_in = a.x[l];
    float* x_out = a.x[l + 1];
    cpu::layernorm_forward(s.ln1, s.ln1_mean, s.ln1_rstd, x_in, p + o[kLn1W], p + o[kLn1B], N, C);
    cpu::matmul_forward(s.qkv, s.ln1, p + o[kQkvW], p + o[kQkvB], N, C, 3 * C);
    cpu::attention_forward(s.atty, s.att, s.qkv, Bm, T, C, NH);
    cpu::matmul_forward(s.xmid, s.atty, p + o[kProjW], p + o[kProjB], N, C, C);
    cpu::residual_forward(s.xmid, s.xmid, x_in, NC);
    cpu::layernorm_forward(s.ln2, s.ln2_mean, s.ln2_rstd, s.xmid, p + o[kLn2W], p + o[kLn2B], N, C);
    cpu::matmul_forward(s.fch, s.ln2, p + o[kFcW], p + o[kFcB], N, C, 4 * C);
    cpu::gelu_forward(s.fch_gelu, s.fch, 4 * NC);
    if (recomputing) return;
    cpu::matmul_forward(x_out, s.fch_gelu, p + o[kFcprojW], p + o[kFcprojB], N, 4 * C, C);
    cpu::residual_forward(x_out, x_out, s.xmid, NC);
  }

  // dres holds d(x_out) on entry and d(x_in) on return.
  void backward_block(int l, const float* p, float* g, int Bm) {
    const int T = spec.seq, C = spec.hidden, NH = spec.heads, N = Bm * T;
    const std::size_t NC = std::size_t(N) * C;
    const std::size_t* o = block_off;
    const LayerActs& s = a.layers[l];
    // Full recompute: rebuild this block's activations from its kept input x_l into the shared
    // buffers (disjoint from ws_a/ws_b/ws_d, which are free until the backward below starts).
    if (recompute == Recompute::full) forward_block(l, p, Bm, true);
    float* dres = a.dres;
    auto zero = [](float* p, std::size_t n) { std::memset(p, 0, n * sizeof(float)); };
    // MLP: x_out = xmid + fcproj(gelu(fc(ln2(xmid)))); d(xmid) starts as d(x_out).
    float* dfch_gelu = a.ws_a;
    zero(dfch_gelu, 4 * NC);
    cpu::matmul_backward(dfch_gelu, g + o[kFcprojW], g + o[kFcprojB], dres, s.fch_gelu,
                         p + o[kFcprojW], N, 4 * C, C);
    float* dfch = a.ws_b;
    zero(dfch, 4 * NC);
    cpu::gelu_backward(dfch, s.fch, dfch_gelu, 4 * std::int64_t(NC));
    float* dln2 = a.ws_d;
    zero(dln2, NC);
    cpu::matmul_backward(dln2, g + o[kFcW], g + o[kFcB], dfch, s.ln2, p + o[kFcW], N, C, 4 * C);
    cpu::layernorm_backward(dres, g + o[kLn2W], g + o[kLn2B], dln2, s.xmid, p + o[kLn2W],
                            s.ln2_mean, s.ln2_rstd, N, C);
    // Attention: xmid = x_in + proj(attention(qkv(ln1(x_in)))); d(x_in) starts as d(xmid).
    float* datty = a.ws_d;
    zero(datty, NC);
    cpu::matmul_backward(datty, g + o[kProjW], g + o[kProjB], dres, s.atty, p + o[kProjW], N, C, C);
    float* dqkv = a.ws_a;
    // Selective recompute: att was not kept; rebuild it from this block's saved qkv into the
    // shared att buffer. The attention output it also produces is not needed (atty is kept): it
    // goes to ws_a, which is free until dqkv is zeroed there.
    if (recompute == Recompute::selective)
      cpu::attention_forward(a.ws_a, s.att, s.qkv, Bm, T, C, NH);
    zero(dqkv, 3 * NC);
    cpu::attention_backward(dqkv, a.ws_b, datty, s.qkv, s.att, Bm, T, C, NH);
    float* dln1 = a.ws_b;
    zero(dln1, NC);
    cpu::matmul_backward(dln1, g + o[kQkvW], g + o[kQkvB], dqkv, s.ln1, p + o[kQkvW], N, C, 3 * C);
    cpu::layernorm_backward(dres, g + o[kLn1W], g + o[kLn1B], dln1, a.x[l], p + o[kLn1W],
                            s.ln1_mean, s.ln1_rstd, N, C);
  }
};

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none:
      return "none";
    case Recompute::full:
      return "full";
    case Recompute::selective:
      return "selective";
  }
  return "unknown";
}

bool parse_recompute(const std::string& name, Recompute* out) {
  for (Recompute r : {Recompute::none, Recompute::full, Recompute::selective}) {
    if (name == recompute_name(r)) {
      if (out) *out = r;
      return true;
    }
  }
  return false;
}

Model::Model(const ModelSpec& spec, int micro_batch, MemoryLedger& memory, Recompute recompute)
    : impl_(std::make_unique<Impl>(spec, micro_batch, memory, recompute)) {}
Model::~Model() = default;

const ModelSpec& Model::spec() const { return impl_->spec; }
const ParamLayout& Model::layout() const { return impl_->layout; }
int Model::micro_batch() const { return impl_->B; }
Recompute Model::recompute() const { return impl_->recompute; }

void Model::forward(int unit, const UnitPtrs& params, const MicroBatch& mb) {
  Impl& m = *impl_;
  m.check(unit, params, mb);
  const ModelSpec& s = m.spec;
  const int Bm = mb.batch, T = s.seq, C = s.hidden, L = s.layers, N = Bm * T;
  if (unit == 0) {
    m.check_tokens(mb.inputs, std::size_t(N), "input");
    const float* p = params[0];
    cpu::encoder_forward(m.a.x[0], mb.inputs, p, p + m.wpe_off, Bm, T, C);
  } else if (unit <= L) {
    m.forward_block(unit - 1, params[unit], Bm);
  } else {
    m.check_tokens(mb.targets, std::size_t(N), "target");
    const float* p = params[unit];
    const float* wte = params[0];
    cpu::layernorm_forward(m.a.lnf, m.a.lnf_mean, m.a.lnf_rstd, m.a.x[L], p, p + C, N, C);
    cpu::matmul_forward(m.a.probs, m.a.lnf, wte, nullptr, N, C, s.vocab);
    cpu::softmax_crossentropy_forward(m.a.probs, m.a.losses, m.a.probs, mb.targets, N, s.vocab);
    m.last_batch = Bm;
    m.have_loss = true;
  }
}

void Model::backward(int unit, const UnitPtrs& params, const UnitPtrs& grads, const MicroBatch& mb,
                     float grad_scale) {
  Impl& m = *impl_;
  m.check(unit, params, mb);
  m.check(unit, grads, mb);
  const ModelSpec& s = m.spec;
  const int Bm = mb.batch, T = s.seq, C = s.hidden, L = s.layers, N = Bm * T;
  const std::size_t NC = std::size_t(N) * C;
  if (unit == 0) {
    float* g = grads[0];
    cpu::encoder_backward(g, g + m.wpe_off, m.a.dres, mb.inputs, Bm, T, C);
  } else if (unit <= L) {
    m.backward_block(unit - 1, params[unit], grads[unit], Bm);
  } else {
    const float* p = params[unit];
    float* g = grads[unit];
    const std::size_t NV = std::size_t(N) * s.vocab;
    std::memset(m.a.dlogits, 0, NV * sizeof(float));
    std::memset(m.a.dlnf, 0, NC * sizeof(float));
    std::memset(m.a.dres, 0, NC * sizeof(float));
    cpu::crossentropy_softmax_backward(m.a.dlogits, m.a.probs, mb.targets, grad_scale, N, s.vocab);
    // Tied LM head: logits = lnf @ wte^T, so wte's gradient lands in the embedding unit.
    cpu::matmul_backward(m.a.dlnf, grads[0], nullptr, m.a.dlogits, m.a.lnf, params[0], N, C,
                         s.vocab);
    cpu::layernorm_backward(m.a.dres, g, g + C, m.a.dlnf, m.a.x[L], p, m.a.lnf_mean, m.a.lnf_rstd,
                            N, C);
  }
}

double Model::loss_sum() const {
  const Impl& m = *impl_;
  if (!m.have_loss) return 0.0;
  const std::size_t n = std::size_t(m.last_batch) * m.spec.seq;
  double sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) sum += m.a.losses[i];
  return sum;
}

std::uint64_t Model::activation_bytes(const ModelSpec& spec, int micro_batch, Recompute recompute) {
  validate(spec);
  if (micro_batch <= 0) {
    throw ConfigError("model: micro-batch must be positive, got " + std::to_string(micro_batch));
  }
  Carver count;
  ActPlan().carve(spec, micro_batch, recompute, count);
  return count.used * sizeof(float);
}

}  // namespace strata
