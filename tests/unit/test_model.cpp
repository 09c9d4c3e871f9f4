// The GPT-2 workload as a whole: parameter layout, deterministic sliced initialisation, whole-model
// gradients against finite differences, gradient accumulation, loss behaviour, AdamW and the
// activation memory account.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "strata/memory.hpp"
#include "strata/model.hpp"
#include "strata/optimizer.hpp"
#include "strata/stage_model.hpp"
#include "strata/types.hpp"

using namespace strata;

namespace {

ModelSpec tiny_spec() { return {"tiny", 2, 16, 2, 8, 32}; }
// The llama block at the same size: 4 query heads sharing 2 K/V heads (grouped-query attention),
// head size 4, an MLP of 24.
ModelSpec tiny_llama_spec() { return {"tiny-l", 2, 16, 4, 8, 32, Arch::llama, 2, 24, 10000}; }
// 4 experts of 12, top 2, dropless (capacity_factor 0), a load-balancing coefficient large
// enough that its gradient shows beside the loss's.
ModelSpec tiny_moe_spec() {
  return {"tiny-m", 2, 16, 4, 8, 32, Arch::moe, 2, 12, 10000, 4, 2, 0, 0.1};
}

ModelSpec small_spec() { return model_preset("small"); }

std::vector<std::int32_t> random_tokens(std::size_t n, int vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(0, vocab - 1);
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

// The whole model (a StageModel of whole_model(), one slot, as Context::model()) with its own flat
// parameter and gradient buffers and a token batch.
struct Harness {
  ModelSpec spec;
  ParamLayout layout;
  MemoryLedger memory;
  StageModel model;
  int slot;
  std::vector<float> params, grads;
  UnitPtrs pp, gg;

  Harness(const ModelSpec& s, int micro_batch, std::uint64_t seed = 7,
          Recompute recompute = Recompute::none)
      : spec(s),
        layout(s),
        model(s, micro_batch, whole_model(s), memory, recompute),
        slot(model.acquire_slot()) {
    params.resize(layout.total());
    grads.assign(layout.total(), 0.0f);
    init_params(layout, seed, 0, params);
    for (const UnitInfo& u : layout.units()) {
      pp.push_back(view(params.data() + u.offset, u.count));
      gg.push_back(view(grads.data() + u.offset, u.count));
    }
  }
  int units() const { return spec.layers + 2; }
  void forward(int unit, const MicroBatch& mb) { model.forward(slot, unit, pp, mb, nullptr); }
  void backward(int unit, const MicroBatch& mb, float grad_scale) {
    (void)mb;  // the slot holds the micro-batch's tokens since its forward
    model.backward(slot, unit, pp, gg, nullptr, grad_scale);
  }

  double forward(const MicroBatch& mb) {
    for (int u = 0; u < units(); ++u) forward(u, mb);
    return model.loss_sum(slot);
  }
  void backward(const MicroBatch& mb, float grad_scale) {
    for (int u = units() - 1; u >= 0; --u) backward(u, mb, grad_scale);
  }
  double step(const MicroBatch& mb, float grad_scale) {
    const double loss = forward(mb);
    backward(mb, grad_scale);
    return loss;
  }
};

// The whole model's activation bytes for one slot (what Context::model() allocates).
std::uint64_t activation_bytes(const ModelSpec& spec, int B, Recompute r = Recompute::none,
                               DType dtype = DType::f32, Device device = Device::cpu) {
  return predict_activations(spec, B, whole_model(spec), r, dtype, device).total(1);
}

struct Batch {
  std::vector<std::int32_t> inputs, targets;
  MicroBatch mb;
  Batch(int B, int T, int V, std::uint32_t seed)
      : inputs(random_tokens(std::size_t(B) * T, V, seed)),
        targets(random_tokens(std::size_t(B) * T, V, seed + 1000)),
        mb{inputs.data(), targets.data(), B, T} {}
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Layout

TEST(ParamLayout, SizesAndOffsetsFollowTheSpec) {
  for (const ModelSpec& spec : {tiny_spec(), small_spec()}) {
    const ParamLayout layout(spec);
    const std::size_t C = spec.hidden, V = spec.vocab, T = spec.seq;
    const int L = spec.layers;
    EXPECT_EQ(layout.total(), std::size_t(spec.total_params()));
    ASSERT_EQ(layout.num_units(), L + 2);
    const auto& units = layout.units();
    EXPECT_EQ(units[0].kind, UnitKind::embedding);
    EXPECT_EQ(units[0].name, "embedding");
    EXPECT_EQ(units[0].count, V * C + T * C);
    for (int b = 0; b < L; ++b) {
      EXPECT_EQ(units[b + 1].kind, UnitKind::block);
      EXPECT_EQ(units[b + 1].block, b);
      EXPECT_EQ(units[b + 1].name, "block" + std::to_string(b));
      EXPECT_EQ(units[b + 1].count, std::size_t(spec.block_params()));
      EXPECT_EQ(units[b + 1].num_tensors, 12);
    }
    EXPECT_EQ(units[L + 1].kind, UnitKind::head);
    EXPECT_EQ(units[L + 1].count, 2 * C);
    // Units and tensors tile the index space in order, ids are 0, 1, 2, ...
    std::size_t off = 0;
    int tid = 0;
    for (int u = 0; u < layout.num_units(); ++u) {
      EXPECT_EQ(units[u].offset, off);
      EXPECT_EQ(units[u].first_tensor, tid);
      std::size_t in_unit = 0;
      for (int k = 0; k < units[u].num_tensors; ++k, ++tid) {
        const TensorInfo& t = layout.tensors()[tid];
        EXPECT_EQ(t.id, tid);
        EXPECT_EQ(t.unit, u);
        EXPECT_EQ(t.offset, off + in_unit);
        std::size_t prod = 1;
        for (int d : t.shape) prod *= std::size_t(d);
        EXPECT_EQ(t.count, prod) << t.name;
        EXPECT_EQ(t.decay, t.shape.size() == 2) << t.name;  // 2-D weights decay, as nanoGPT
        in_unit += t.count;
      }
      EXPECT_EQ(in_unit, units[u].count);
      off += units[u].count;
    }
    EXPECT_EQ(off, layout.total());
    EXPECT_EQ(tid, int(layout.tensors().size()));
  }
}

// ParamLayout::of shares one layout while the model asked for stays the same, and makes a new one,
// equal to a fresh ParamLayout, when any field of the spec changes.
TEST(ParamLayout, SharedLayoutFollowsTheSpec) {
  ModelSpec spec = small_spec();
  const std::shared_ptr<const ParamLayout> first = ParamLayout::of(spec);
  EXPECT_EQ(ParamLayout::of(spec), first);
  auto same = [](const ParamLayout& a, const ParamLayout& b) {
    if (a.total() != b.total() || a.tensors().size() != b.tensors().size()) return false;
    for (std::size_t i = 0; i < a.tensors().size(); ++i)
      if (a.tensors()[i].name != b.tensors()[i].name ||
          a.tensors()[i].offset != b.tensors()[i].offset)
        return false;
    return true;
  };
  EXPECT_TRUE(same(*first, ParamLayout(spec)));
  spec.vocab += 8;  // one field
  const std::shared_ptr<const ParamLayout> other = ParamLayout::of(spec);
  EXPECT_NE(other, first);
  EXPECT_TRUE(same(*other, ParamLayout(spec)));
  EXPECT_EQ(other->total(), first->total() + 8 * std::size_t(spec.hidden));
  EXPECT_EQ(first->total(), std::size_t(small_spec().total_params()));  // still held, unchanged
  spec.vocab = 0;  // a spec that is refused is not kept
  EXPECT_THROW(ParamLayout::of(spec), ConfigError);
  EXPECT_EQ(ParamLayout::of(small_spec())->total(), first->total());
}

TEST(ParamLayout, TensorNamesShapesAndInit) {
  const ModelSpec spec = small_spec();
  const ParamLayout layout(spec);
  const int C = spec.hidden, L = spec.layers;
  auto find = [&](const std::string& name) -> const TensorInfo& {
    for (const auto& t : layout.tensors())
      if (t.name == name) return t;
    ADD_FAILURE() << "no tensor " << name;
    return layout.tensors()[0];
  };
  EXPECT_EQ(find("embedding.wte").shape, (std::vector<int>{spec.vocab, C}));
  EXPECT_EQ(find("embedding.wpe").shape, (std::vector<int>{spec.seq, C}));
  EXPECT_EQ(find("block3.qkv_w").shape, (std::vector<int>{3 * C, C}));
  EXPECT_EQ(find("block0.fc_w").shape, (std::vector<int>{4 * C, C}));
  EXPECT_EQ(find("block0.fcproj_w").shape, (std::vector<int>{C, 4 * C}));
  EXPECT_EQ(find("head.lnf_w").shape, (std::vector<int>{C}));
  EXPECT_FLOAT_EQ(find("block1.qkv_w").init_std, 0.02f);
  EXPECT_FLOAT_EQ(find("block1.proj_w").init_std, 0.02f / std::sqrt(2.0f * L));
  EXPECT_FLOAT_EQ(find("block1.fcproj_w").init_std, 0.02f / std::sqrt(2.0f * L));
  EXPECT_EQ(find("block2.ln1_w").init_value, 1.0f);
  EXPECT_EQ(find("block2.ln1_w").init_std, 0.0f);
  EXPECT_EQ(find("block2.fc_b").init_value, 0.0f);
  // tensor_at maps every boundary to the right tensor.
  for (const auto& t : layout.tensors()) {
    EXPECT_EQ(layout.tensor_at(t.offset).id, t.id);
    EXPECT_EQ(layout.tensor_at(t.offset + t.count - 1).id, t.id);
  }
  EXPECT_THROW(layout.tensor_at(layout.total()), Error);
}

// A llama's tensors, with grouped-query attention: q | k | v rows (NH + 2 KV) hs, gate | up 2F,
// no biases, no wpe, an untied LM head; its unit sizes the formulas' and the published counts of
// Llama 3 8B (8,030,261,248) and 70B (70,553,706,496) parameters from the presets.
TEST(ParamLayout, LlamaTensorsAndPublishedParameterCounts) {
  const ModelSpec spec = tiny_llama_spec();
  const ParamLayout layout(spec);
  const int C = spec.hidden, F = spec.ffn, hs = spec.head_dim(), L = spec.layers;
  std::vector<std::string> names;
  std::vector<std::vector<int>> shapes;
  for (const TensorInfo& t : layout.tensors()) names.push_back(t.name), shapes.push_back(t.shape);
  const std::vector<std::string> want_names = {
      "embedding.wte",     "block0.attn_norm_w", "block0.qkv_w",      "block0.proj_w",
      "block0.mlp_norm_w", "block0.gate_up_w",   "block0.down_w",     "block1.attn_norm_w",
      "block1.qkv_w",      "block1.proj_w",      "block1.mlp_norm_w", "block1.gate_up_w",
      "block1.down_w",     "head.lnf_w",         "head.lm_head"};
  EXPECT_EQ(names, want_names);
  EXPECT_EQ(shapes[2], (std::vector<int>{(4 + 2 * 2) * hs, C}));
  EXPECT_EQ(shapes[5], (std::vector<int>{2 * F, C}));
  EXPECT_EQ(shapes[6], (std::vector<int>{C, F}));
  EXPECT_EQ(shapes[14], (std::vector<int>{spec.vocab, C}));
  EXPECT_EQ(layout.units()[0].count, std::size_t(spec.vocab) * C);
  EXPECT_EQ(layout.units()[L + 1].count, std::size_t(spec.vocab + 1) * C);
  const std::size_t block = std::size_t(C) * ((4 + 2 * 2) * hs + C + 3 * F) + 2 * C;
  EXPECT_EQ(layout.units()[1].count, block);
  EXPECT_EQ(layout.total(), std::size_t(spec.total_params()));
  EXPECT_FALSE(spec.tied());
  EXPECT_EQ(model_preset("llama3-8b").total_params(), 8030261248LL);
  EXPECT_EQ(model_preset("llama3-70b").total_params(), 70553706496LL);
  EXPECT_EQ(ParamLayout(model_preset("llama3-8b")).total(), 8030261248ull);
  // FLOPs per token: 6 (non-embedding parameters + the LM head's V C) + 12 L C T.
  const ModelSpec l8 = model_preset("llama3-8b");
  const double n = 8030261248.0 - 128256.0 * 4096;  // all but the embedding's table
  EXPECT_DOUBLE_EQ(l8.flops_per_token(), 6 * n + 12.0 * 32 * 4096 * 8192);
}

// A moe block: a llama's attention, then the router and every expert's gate | up and down as one
// tensor each; Mixtral 8x7B's published counts (46.7B, 12.9B active), and FLOPs on the active ones.
TEST(ParamLayout, MoeTensorsAndMixtralsPublishedCounts) {
  const ModelSpec spec = tiny_moe_spec();
  const ParamLayout layout(spec);
  const int C = spec.hidden, F = spec.ffn, E = spec.experts, hs = spec.head_dim();
  std::vector<std::string> names;
  for (int i = 1; i <= 7; ++i) names.push_back(layout.tensors()[std::size_t(i)].name);
  EXPECT_EQ(names, (std::vector<std::string>{"block0.attn_norm_w", "block0.qkv_w", "block0.proj_w",
                                             "block0.mlp_norm_w", "block0.router_w",
                                             "block0.experts.gate_up_w", "block0.experts.down_w"}));
  EXPECT_EQ(layout.tensors()[5].shape, (std::vector<int>{E, C}));
  EXPECT_EQ(layout.tensors()[6].shape, (std::vector<int>{E, 2 * F, C}));
  EXPECT_EQ(layout.tensors()[7].shape, (std::vector<int>{E, C, F}));
  const std::size_t attention = std::size_t(C) * ((4 + 2 * 2) * hs + C);
  EXPECT_EQ(layout.units()[1].count, attention + std::size_t(E) * C * (1 + 3 * F) + 2 * C);
  EXPECT_EQ(layout.total(), std::size_t(spec.total_params()));
  EXPECT_EQ(spec.block_active_params(), std::int64_t(attention + E * C + 2 * 3 * F * C + 2 * C));

  ModelSpec shared = spec;  // shared experts: one SwiGLU of S F after the routed experts
  shared.shared_experts = 2;
  const ParamLayout with_shared(shared);
  EXPECT_EQ(with_shared.tensors()[8].name, "block0.shared.gate_up_w");
  EXPECT_EQ(with_shared.tensors()[8].shape, (std::vector<int>{2 * 2 * F, C}));
  EXPECT_EQ(with_shared.tensors()[9].shape, (std::vector<int>{C, 2 * F}));
  EXPECT_EQ(shared.block_active_params() - spec.block_active_params(), 2 * 3 * F * C);
  EXPECT_EQ(with_shared.total(), std::size_t(shared.total_params()));

  const ModelSpec mixtral = model_preset("mixtral-8x7b");
  EXPECT_EQ(mixtral.total_params(), 46702792704LL);
  EXPECT_EQ(mixtral.active_params(), 12879925248LL);
  EXPECT_EQ(ParamLayout(mixtral).total(), 46702792704ull);
  const double n = 12879925248.0 - 32000.0 * 4096;  // active, less the embedding's table
  EXPECT_DOUBLE_EQ(mixtral.flops_per_token(), 6 * n + 12.0 * 32 * 4096 * 4096);
  // DeepSeekMoE 16B's shape, every block a moe: 28 x (attention 4 C^2 + router 64 C + (64 + 2)
  // experts of 3 x 1408 C + 2 norms) + 2 embeddings + the final norm; active 6 + 2 experts.
  const ModelSpec fine = model_preset("fine-moe-16b");
  const std::int64_t C16 = 2048, attn = 4 * C16 * C16, expert = 3 * 1408 * C16;
  const std::int64_t rest = 2 * 102400 * C16 + C16, block_rest = attn + 64 * C16 + 2 * C16;
  EXPECT_EQ(fine.total_params(), 28 * (block_rest + 66 * expert) + rest);
  EXPECT_EQ(fine.active_params(), 28 * (block_rest + 8 * expert) + rest);
}

TEST(ParamLayout, RejectsBadSpecs) {
  ModelSpec s = tiny_spec();
  s.heads = 3;  // 16 % 3 != 0
  EXPECT_THROW(ParamLayout{s}, ConfigError);
  s = tiny_spec();
  s.layers = 0;
  EXPECT_THROW(ParamLayout{s}, ConfigError);
  for (auto bad :
       {+[](ModelSpec& m) { m.experts = 1; }, +[](ModelSpec& m) { m.top_k = 5; },
        +[](ModelSpec& m) { m.top_k = 0; }, +[](ModelSpec& m) { m.capacity_factor = -1; },
        +[](ModelSpec& m) { m.aux_loss_coef = -0.1; },
        +[](ModelSpec& m) { m.arch = Arch::llama; }}) {  // experts without moe
    s = tiny_moe_spec();
    bad(s);
    EXPECT_THROW(ParamLayout{s}, ConfigError);
  }
  s = tiny_spec();
  s.kv_heads = 1;  // grouped-query attention is a llama's
  EXPECT_THROW(ParamLayout{s}, ConfigError);
  s = tiny_llama_spec();
  s.kv_heads = 3;  // 4 heads
  EXPECT_THROW(ParamLayout{s}, ConfigError);
  s = tiny_llama_spec();
  s.heads = 16;  // head size 1: no rotary pairs
  s.kv_heads = 16;
  EXPECT_THROW(ParamLayout{s}, ConfigError);
}

// ---------------------------------------------------------------------------------------------
// Initialisation

TEST(InitParams, AnySliceEqualsTheSliceOfAFullInit) {
  const ParamLayout layout(tiny_spec());
  const std::size_t total = layout.total();
  std::vector<float> full(total);
  init_params(layout, 42, 0, full);
  // Slices crossing every unit boundary, plus random ones.
  std::vector<std::pair<std::size_t, std::size_t>> slices;
  for (const UnitInfo& u : layout.units()) {
    if (u.offset >= 5) slices.push_back({u.offset - 5, 11});
    slices.push_back({u.offset, u.count});
  }
  std::mt19937_64 rng(3);
  for (int i = 0; i < 40; ++i) {
    const std::size_t b = rng() % total;
    slices.push_back({b, 1 + rng() % (total - b)});
  }
  slices.push_back({total - 1, 1});
  for (auto [b, n] : slices) {
    std::vector<float> part(n, -123.0f);
    init_params(layout, 42, b, part);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(part[i], full[b + i]) << "slice " << b << "+" << i;
  }
  std::vector<float> too_far(2);
  EXPECT_THROW(init_params(layout, 42, total - 1, too_far), Error);
}

TEST(InitParams, DependsOnSeedAndFollowsTheTensorInit) {
  const ModelSpec spec = small_spec();
  const ParamLayout layout(spec);
  const TensorInfo& wte = layout.tensors()[0];
  std::vector<float> a(wte.count), b(wte.count);
  init_params(layout, 1, wte.offset, a);
  init_params(layout, 2, wte.offset, b);
  std::size_t same = 0;
  for (std::size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  EXPECT_LT(same, a.size() / 1000) << "seed must change the values";
  // Statistics of normal(0, 0.02) over 1M samples: mean within 4 standard errors, std within 1%.
  double m = 0, m2 = 0;
  for (float x : a) m += x;
  m /= double(a.size());
  for (float x : a) m2 += (x - m) * (x - m);
  const double sd = std::sqrt(m2 / double(a.size()));
  EXPECT_NEAR(m, 0.0, 4 * 0.02 / std::sqrt(double(a.size())));
  EXPECT_NEAR(sd, 0.02, 0.0002);
  // Tensors drawn with different ids are different streams (no repeated block).
  const TensorInfo& q0 = layout.tensors()[layout.units()[1].first_tensor + 2];
  const TensorInfo& q1 = layout.tensors()[layout.units()[2].first_tensor + 2];
  std::vector<float> x0(64), x1(64);
  init_params(layout, 1, q0.offset, x0);
  init_params(layout, 1, q1.offset, x1);
  EXPECT_NE(x0, x1);
  // Constants: LayerNorm weights 1, biases 0.
  for (const auto& t : layout.tensors()) {
    if (t.init_std > 0) continue;
    std::vector<float> v(t.count);
    init_params(layout, 1, t.offset, v);
    for (float x : v) ASSERT_EQ(x, t.init_value) << t.name;
  }
}

// ---------------------------------------------------------------------------------------------
// Whole-model gradient

// Finite differences of f = loss_sum * grad_scale on a sample of elements of every tensor.
//
// Parameters are drawn at O(1) scale for this check (weights ~ U(+-1.5/sqrt(fan_in)), embeddings
// U(+-1), LayerNorm weights U(0.6, 1.4), biases U(+-0.2)) rather than from init_params: at the
// GPT-2 init the residual stream has std ~0.03, so LayerNorm is sharply curved on the scale of any
// step h large enough to rise above fp32 rounding, and q/k gradients are ~1e-4 (near-uniform
// attention), i.e. at the rounding floor. With O(1) parameters every path carries signal.
// The derivative uses the 4th-order stencil (8 (f(h) - f(-h)) - (f(2h) - f(-2h))) / 12h with
// h = 2e-2; observed per-tensor relative 2-norm errors are 4e-5 .. 5e-4 and element errors below
// 1e-4. Tolerances: element |fd - analytic| <= 5e-4 + 1e-2 |fd|, tensor relative 2-norm <= 5e-3.
// A missing contribution (e.g. wte's embedding or tied-head part) is an O(1) relative error.
// The 5-point central difference of f at 0 with step 2e-2. A moe's objective jumps where a token's
// top-k experts switch; with `refine`, a stencil whose two central differences disagree (a switch
// inside it) is redone with a step 4 times smaller, at most twice (the routing of these tests is
// smooth at 1.25e-3, fp32's noise still below the bounds), and one that still jumps fails.
template <class F>
double stencil(F&& f, bool refine) {
  double step = 2e-2;
  for (int tries = 0;; ++tries, step /= 4) {
    const double d1 = f(float(step)) - f(float(-step)),
                 d2 = f(float(2 * step)) - f(float(-2 * step));
    const double narrow = d1 / (2 * step), wide = d2 / (4 * step);
    if (!refine || std::fabs(narrow - wide) <= 2e-3 + 0.05 * std::fabs(narrow))
      return (8 * d1 - d2) / (12.0 * step);
    if (tries == 2) {
      ADD_FAILURE() << "the objective jumps within +-" << 2 * step << ": " << narrow << " vs "
                    << wide;
      return (8 * d1 - d2) / (12.0 * step);
    }
  }
}

void expect_gradients_match_finite_differences(const ModelSpec& spec) {
  const int B = 2;
  Harness h(spec, B);
  const ParamLayout& layout = h.layout;
  std::mt19937 rng(9);
  for (const TensorInfo& t : layout.tensors()) {
    float lo = -0.2f, hi = 0.2f;
    if (t.unit == 0) {
      lo = -1.0f, hi = 1.0f;
    } else if (t.shape.size() == 2) {
      hi = 1.5f / std::sqrt(float(t.shape[1]));
      lo = -hi;
    } else if (t.init_value == 1.0f) {
      lo = 0.6f, hi = 1.4f;
    }
    std::uniform_real_distribution<float> d(lo, hi);
    for (std::size_t i = 0; i < t.count; ++i) h.params[t.offset + i] = d(rng);
  }
  Batch batch(B, spec.seq, spec.vocab, 11);
  const float scale = 0.5f;
  h.step(batch.mb, scale);
  const std::vector<float> analytic = h.grads;

  const std::set<std::int32_t> input_tokens(batch.inputs.begin(), batch.inputs.end());
  int checked = 0;
  for (const TensorInfo& t : layout.tensors()) {
    std::vector<std::size_t> idx;
    for (int k = 0; k < 6; ++k) idx.push_back(t.offset + rng() % t.count);
    if (t.id == 0) {  // wte: rows that are inputs get embedding + head parts; others head only
      for (std::int32_t tok : {batch.inputs[0], batch.inputs[5]})
        idx.push_back(t.offset + std::size_t(tok) * spec.hidden + rng() % spec.hidden);
      for (int v = 0; v < spec.vocab; ++v)
        if (!input_tokens.count(v)) {
          idx.push_back(t.offset + std::size_t(v) * spec.hidden + 3);
          break;
        }
    }
    double err2 = 0, ref2 = 0;
    for (std::size_t j : idx) {
      const float x0 = h.params[j];
      auto f = [&](float d) {  // the objective: the loss (and moe's load-balancing loss)
        h.params[j] = x0 + d;
        const double lm = h.forward(batch.mb);
        return (lm + spec.seq * h.model.aux_loss_sum(h.slot)) * scale;
      };
      const double fd = stencil(f, spec.arch == Arch::moe);
      h.params[j] = x0;
      EXPECT_NEAR(analytic[j], fd, 5e-4 + 1e-2 * std::fabs(fd))
          << t.name << " element " << j - t.offset;
      err2 += (analytic[j] - fd) * (analytic[j] - fd);
      ref2 += fd * fd;
      ++checked;
    }
    EXPECT_GT(ref2, 0.0) << t.name << " has a zero gradient sample";
    EXPECT_LE(std::sqrt(err2), 5e-3 * std::sqrt(ref2)) << t.name;
  }
  EXPECT_GE(checked, 6 * int(layout.tensors().size()));
}

TEST(ModelGradient, MatchesFiniteDifferencesForEveryTensor) {
  expect_gradients_match_finite_differences(tiny_spec());
}

// RMSNorm, SwiGLU, the rotary embedding, grouped-query attention and the untied LM head: every
// tensor of a llama (attn_norm_w .. down_w, lm_head) by the same stencil and bounds.
TEST(ModelGradient, LlamaMatchesFiniteDifferencesForEveryTensor) {
  expect_gradients_match_finite_differences(tiny_llama_spec());
}

// The router, its top-k gates, the experts on their dispatched rows, the combine and the
// sequence-wise load-balancing loss (in the objective as the backward differentiates it: the mean
// over sequences, grad_scale x seq per sequence): every tensor of a moe, dropless and with a
// capacity that drops choices (a dropped choice adds nothing, its gate's gradient is 0). A step
// moves no token's top 2 at these seeds (a switch would break the stencil by O(1)).
TEST(ModelGradient, MoeMatchesFiniteDifferencesForEveryTensor) {
  expect_gradients_match_finite_differences(tiny_moe_spec());
}

TEST(ModelGradient, MoeWithDroppedChoicesMatchesFiniteDifferences) {
  ModelSpec spec = tiny_moe_spec();
  spec.capacity_factor = 0.75;  // 3 choices of each expert per sequence of 8 tokens x 2
  expect_gradients_match_finite_differences(spec);
}

// DeepSeekMoE's shape: finer experts (6 of 8, top 3) and 2 shared experts beside them.
TEST(ModelGradient, MoeWithSharedExpertsMatchesFiniteDifferences) {
  ModelSpec spec = tiny_moe_spec();
  spec.experts = 6, spec.ffn = 8, spec.top_k = 3, spec.shared_experts = 2;
  expect_gradients_match_finite_differences(spec);
}

TEST(ModelGradient, WteGetsEmbeddingAndTiedHeadContributions) {
  // The head's contribution to wte alone (backward of the head only) differs from the total on
  // rows used as inputs, and equals it on rows that are not.
  const ModelSpec spec = tiny_spec();
  const int B = 2;
  Harness h(spec, B);
  Batch batch(B, spec.seq, spec.vocab, 12);
  const float scale = 0.0625f;
  h.forward(batch.mb);
  h.backward(spec.layers + 1, batch.mb, scale);
  const std::vector<float> head_only(h.grads.begin(), h.grads.begin() + spec.vocab * spec.hidden);
  for (int u = spec.layers; u >= 0; --u) h.backward(u, batch.mb, scale);
  const std::set<std::int32_t> inputs(batch.inputs.begin(), batch.inputs.end());
  for (int v = 0; v < spec.vocab; ++v) {
    double diff = 0;
    for (int c = 0; c < spec.hidden; ++c)
      diff += std::fabs(h.grads[v * spec.hidden + c] - head_only[v * spec.hidden + c]);
    if (inputs.count(v)) {
      EXPECT_GT(diff, 1e-6) << "row " << v;
    } else {
      EXPECT_EQ(diff, 0.0) << "row " << v;
    }
  }
}

TEST(ModelGradient, MicroBatchesAccumulate) {
  const ModelSpec spec = tiny_spec();
  const int B = 2;
  Batch b1(B, spec.seq, spec.vocab, 21), b2(B, spec.seq, spec.vocab, 22);
  const float scale = 1.0f / 32;
  Harness acc(spec, B), one(spec, B), two(spec, B);
  const double l1 = acc.step(b1.mb, scale);
  const double l2 = acc.step(b2.mb, scale);
  EXPECT_EQ(one.step(b1.mb, scale), l1);
  EXPECT_EQ(two.step(b2.mb, scale), l2);
  double max_g = 0;
  for (float g : acc.grads) max_g = std::max(max_g, double(std::fabs(g)));
  EXPECT_GT(max_g, 1e-4);
  for (std::size_t i = 0; i < acc.grads.size(); ++i) {
    const double sum = double(one.grads[i]) + double(two.grads[i]);
    ASSERT_NEAR(acc.grads[i], sum, 1e-6 * max_g) << i;
  }
}

// ---------------------------------------------------------------------------------------------
// Loss and training

TEST(ModelLoss, AtInitIsAboutLogVocab) {
  ModelSpec spec = tiny_spec();
  spec.hidden = 64;
  spec.heads = 4;
  spec.vocab = 256;
  spec.seq = 16;
  Harness h(spec, 4);
  Batch batch(4, spec.seq, spec.vocab, 41);
  const double mean = h.forward(batch.mb) / (4.0 * spec.seq);
  EXPECT_NEAR(mean, std::log(double(spec.vocab)), 0.05);
}

TEST(ModelLoss, AdamWStepsOnARepeatedBatchReduceTheLoss) {
  const ModelSpec spec = tiny_spec();
  const int B = 2;
  Harness h(spec, B);
  Batch batch(B, spec.seq, spec.vocab, 51);
  AdamWConfig cfg;
  cfg.lr = 1e-2f;
  AdamW opt(h.layout, 0, h.params.size(), cfg, h.memory);
  const float scale = 1.0f / float(B * spec.seq);
  std::vector<double> losses;
  for (int t = 1; t <= 30; ++t) {
    std::fill(h.grads.begin(), h.grads.end(), 0.0f);
    losses.push_back(h.step(batch.mb, scale) * scale);
    opt.step(view(h.params.data(), h.params.size()), view(h.grads.data(), h.grads.size()), t);
  }
  EXPECT_NEAR(losses.front(), std::log(double(spec.vocab)), 0.1);
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << "memorising 16 tokens should halve the loss";
  EXPECT_LT(losses[10], losses[0]);
  EXPECT_LT(losses[20], losses[10]);
}

TEST(ModelLoss, RejectsBadMicroBatches) {
  const ModelSpec spec = tiny_spec();
  Harness h(spec, 2);
  Batch ok(2, spec.seq, spec.vocab, 61);
  Batch big(3, spec.seq, spec.vocab, 62);
  EXPECT_THROW(h.forward(0, big.mb), Error);
  MicroBatch wrong_seq = ok.mb;
  wrong_seq.seq = spec.seq - 1;
  EXPECT_THROW(h.forward(0, wrong_seq), Error);
  ok.inputs[3] = spec.vocab;
  EXPECT_THROW(h.forward(0, ok.mb), Error);
  ok.inputs[3] = 0;
  ok.targets[4] = -1;
  EXPECT_THROW(h.forward(ok.mb), Error);
  EXPECT_THROW(h.forward(spec.layers + 2, ok.mb), Error);
}

// ---------------------------------------------------------------------------------------------
// Memory

TEST(ModelMemory, ActivationBytesEqualTheLedgerPeak) {
  for (const ModelSpec& spec : {tiny_spec(), small_spec()}) {
    for (int B : {1, 2, 8}) {
      MemoryLedger ledger;
      {
        StageModel m(spec, B, whole_model(spec), ledger);
        m.acquire_slot();  // the one slot, as Context::model() holds it
        EXPECT_EQ(ledger.peak(MemTag::activations), activation_bytes(spec, B))
            << spec.preset << " B=" << B;
        EXPECT_EQ(ledger.current(MemTag::activations), activation_bytes(spec, B));
        EXPECT_EQ(ledger.peak(MemTag::params), 0u);
      }
      EXPECT_EQ(ledger.current(MemTag::activations), 0u);
    }
  }
  // Roughly linear in the micro-batch, and at least the residual stream and logits.
  const ModelSpec s = small_spec();
  const double per_b = double(activation_bytes(s, 8)) / 8;
  EXPECT_NEAR(double(activation_bytes(s, 4)) / 4, per_b, 0.01 * per_b);
  EXPECT_GT(per_b, 4.0 * s.seq * (double(s.layers + 1) * s.hidden + s.vocab));
}

// On CUDA the fused attention keeps a log-sum-exp per row instead of the T x T probabilities: each
// block's slot and the backward's scratch for them (the larger of it and 4 [N,C]) shrink by that.
TEST(ModelMemory, FusedAttentionKeepsNoProbabilities) {
  for (const ModelSpec& s : {tiny_spec(), small_spec()}) {
    const int B = 2;
    const double rows = double(B) * s.heads * s.seq, nc4 = 4.0 * B * s.seq * s.hidden;
    const double want = 4.0 * (s.layers * (rows * s.seq - rows) + std::max(nc4, rows * s.seq) -
                               std::max(nc4, rows));
    const double cpu = double(activation_bytes(s, B, Recompute::none, DType::f32));
    const double gpu = double(activation_bytes(s, B, Recompute::none, DType::f32, Device::cuda));
    EXPECT_EQ(cpu - gpu, want) << s.preset;
  }
}

TEST(ModelMemory, ActivationsStayAfterTraining) {
  // Forward and backward allocate nothing beyond the construction-time buffers, in every mode.
  const ModelSpec spec = tiny_spec();
  for (Recompute r : {Recompute::none, Recompute::full, Recompute::selective}) {
    Harness h(spec, 2, 7, r);
    Batch batch(2, spec.seq, spec.vocab, 71);
    const auto before = h.memory.peak(MemTag::activations);
    EXPECT_EQ(before, activation_bytes(spec, 2, r)) << recompute_name(r);
    h.step(batch.mb, 0.1f);
    h.step(batch.mb, 0.1f);
    EXPECT_EQ(h.memory.peak(MemTag::activations), before) << recompute_name(r);
    EXPECT_EQ(h.memory.current(MemTag::activations), before) << recompute_name(r);
  }
}

// ---------------------------------------------------------------------------------------------
// Activation recomputation

namespace {

constexpr Recompute kModes[] = {Recompute::none, Recompute::full, Recompute::selective};

// Attention probabilities dominate the block activations: T=32 with C=32.
ModelSpec att_heavy_spec() {
  ModelSpec s;
  s.preset = "att-heavy";
  s.layers = 3;
  s.hidden = 32;
  s.heads = 4;
  s.seq = 32;
  s.vocab = 64;
  return s;
}

// The logits dominate: the head's scratch is larger than a block's scratch plus the shared
// recompute buffers, so those overlap the head's scratch.
ModelSpec logit_heavy_spec() {
  ModelSpec s = att_heavy_spec();
  s.preset = "logit-heavy";
  s.seq = 16;
  s.vocab = 1024;
  return s;
}

ModelSpec gpt2_124m_spec() { return model_preset("gpt2-124m"); }

// The activation layout as documented in model.cpp, counted independently, for shapes where
// N = B*T is a multiple of 16 (then every piece is already 64-byte aligned: no padding).
//   kept always     x_0..x_L (L+1)NC; lnf NC + 2N; probs NV; losses N; dres NC
//   per block       ln1 NC + 2N, qkv 3NC, atty NC, xmid NC, ln2 NC + 2N, fch 4NC, fch_act 4NC
//                   = 15NC + 4N, plus att = B*NH*T*T
//   scratch         max(head: NV + NC, block: 4NC + max(4NC, att) + NC + shared recompute)
//   none:      all L blocks with att; no shared recompute buffers
//   selective: all L blocks without att; shared = one att
//   full:      no per-block buffers; shared = one whole block (15NC + 4N + att)
std::uint64_t expected_activation_bytes(const ModelSpec& s, int B, Recompute r) {
  const std::uint64_t N = std::uint64_t(B) * s.seq, C = s.hidden, L = s.layers, V = s.vocab;
  const std::uint64_t NC = N * C, att = std::uint64_t(B) * s.heads * s.seq * s.seq;
  const std::uint64_t kept = (L + 1) * NC + (NC + 2 * N) + N * V + N + NC;
  const std::uint64_t block = 15 * NC + 4 * N;
  const std::uint64_t head_ws = N * V + NC, block_ws = 4 * NC + std::max(4 * NC, att) + NC;
  std::uint64_t floats = 0;
  switch (r) {
    case Recompute::none:
      floats = kept + L * (block + att) + std::max(head_ws, block_ws);
      break;
    case Recompute::selective:
      floats = kept + L * block + std::max(head_ws, block_ws + att);
      break;
    case Recompute::full:
      floats = kept + std::max(head_ws, block_ws + block + att);
      break;
  }
  return floats * sizeof(float);
}

// Trains `steps` steps of `micro` micro-batches each (gradients accumulate over the micro-batches
// of a step, AdamW after each step); returns every micro-batch's loss_sum and, per step, the
// accumulated gradients. The last micro-batch of a step after the first uses a smaller batch than
// the model was built for.
struct Trajectory {
  std::vector<double> losses;
  std::vector<std::vector<float>> grads;
};
Trajectory train(const ModelSpec& spec, int B, Recompute r, int steps, int micro) {
  Harness h(spec, B, 7, r);
  EXPECT_EQ(h.model.recompute(), r);
  AdamWConfig cfg;
  cfg.lr = 1e-2f;
  AdamW opt(h.layout, 0, h.params.size(), cfg, h.memory);
  Trajectory out;
  for (int t = 1; t <= steps; ++t) {
    std::fill(h.grads.begin(), h.grads.end(), 0.0f);
    for (int m = 0; m < micro; ++m) {
      Batch batch(B, spec.seq, spec.vocab, std::uint32_t(100 * t + m));
      out.losses.push_back(h.step(batch.mb, 1.0f / float(micro * B * spec.seq)));
    }
    out.grads.push_back(h.grads);
    opt.step(view(h.params.data(), h.params.size()), view(h.grads.data(), h.grads.size()), t);
  }
  return out;
}

}  // namespace

TEST(Recompute, NamesRoundTripAndBadNamesAreRejected) {
  for (Recompute r : kModes) {
    Recompute parsed = r == Recompute::none ? Recompute::full : Recompute::none;
    ASSERT_TRUE(parse_recompute(recompute_name(r), &parsed)) << recompute_name(r);
    EXPECT_EQ(parsed, r);
  }
  EXPECT_STREQ(recompute_name(Recompute::none), "none");
  EXPECT_STREQ(recompute_name(Recompute::full), "full");
  EXPECT_STREQ(recompute_name(Recompute::selective), "selective");
  for (const char* bad : {"", "Full", "sel", "selective ", "true", "1"}) {
    Recompute r = Recompute::selective;
    EXPECT_FALSE(parse_recompute(bad, &r)) << '"' << bad << '"';
    EXPECT_EQ(r, Recompute::selective) << "untouched on failure";
  }
  EXPECT_THROW(activation_bytes(tiny_spec(), 1, static_cast<Recompute>(7)), ConfigError);
  MemoryLedger ledger;
  EXPECT_THROW(
      StageModel(tiny_spec(), 1, whole_model(tiny_spec()), ledger, static_cast<Recompute>(-1)),
      ConfigError);
  EXPECT_EQ(ledger.peak(MemTag::activations), 0u);
}

// Every mode runs the same kernels on the same inputs in the same order, so the losses and
// gradients are expected to be bit-for-bit those of Recompute::none. Asserted: losses equal
// within 1e-12 relative, every gradient element within 1e-6 relative to itself plus 1e-9 of the
// largest gradient (room only for a reordered reduction; a stale or missing recompute is an O(1)
// error). Two shapes: one where the attention probabilities dominate, one where the logits do (so
// the shared recompute buffers overlap the head's scratch, which the head's backward overwrites).
TEST(Recompute, LossesAndGradientsEqualNoRecompute) {
  for (const ModelSpec& spec : {att_heavy_spec(), logit_heavy_spec()}) {
    const int B = 2, steps = 3, micro = 2;
    const Trajectory ref = train(spec, B, Recompute::none, steps, micro);
    for (Recompute r : {Recompute::full, Recompute::selective}) {
      SCOPED_TRACE(spec.preset + " " + recompute_name(r));
      const Trajectory got = train(spec, B, r, steps, micro);
      ASSERT_EQ(got.losses.size(), ref.losses.size());
      for (std::size_t i = 0; i < ref.losses.size(); ++i)
        EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-12 * std::fabs(ref.losses[i])) << i;
      std::size_t not_bitwise = 0;
      for (int t = 0; t < steps; ++t) {
        const std::vector<float>& g0 = ref.grads[t];
        const std::vector<float>& g1 = got.grads[t];
        double max_g = 0;
        for (float g : g0) max_g = std::max(max_g, double(std::fabs(g)));
        ASSERT_GT(max_g, 1e-4);
        for (std::size_t i = 0; i < g0.size(); ++i) {
          ASSERT_NEAR(g1[i], g0[i], 1e-6 * std::fabs(g0[i]) + 1e-9 * max_g)
              << "step " << t << " element " << i << " (" << ParamLayout(spec).tensor_at(i).name
              << ")";
          not_bitwise += g1[i] != g0[i];
        }
      }
      EXPECT_EQ(not_bitwise, 0u) << "gradient elements not bit-for-bit equal (informative)";
    }
  }
}

TEST(Recompute, ActivationBytesFollowTheLayoutAndEqualTheLedgerPeak) {
  for (const ModelSpec& spec : {tiny_spec(), small_spec(), att_heavy_spec(), logit_heavy_spec()}) {
    for (int B : {1, 2, 8}) {
      for (Recompute r : kModes) {
        SCOPED_TRACE(spec.preset + " B=" + std::to_string(B) + " " + recompute_name(r));
        MemoryLedger ledger;
        {
          StageModel m(spec, B, whole_model(spec), ledger, r);
          m.acquire_slot();
          EXPECT_EQ(m.recompute(), r);
          EXPECT_EQ(ledger.peak(MemTag::activations), activation_bytes(spec, B, r));
          EXPECT_EQ(ledger.current(MemTag::activations), activation_bytes(spec, B, r));
        }
        EXPECT_EQ(ledger.current(MemTag::activations), 0u);
        if (B * spec.seq % 16 == 0)
          EXPECT_EQ(activation_bytes(spec, B, r), expected_activation_bytes(spec, B, r));
      }
      // The default is no recompute.
      EXPECT_EQ(activation_bytes(spec, B), activation_bytes(spec, B, Recompute::none));
    }
  }
  // gpt2-124m: the formula only (nothing allocated).
  for (Recompute r : kModes)
    EXPECT_EQ(activation_bytes(gpt2_124m_spec(), 8, r),
              expected_activation_bytes(gpt2_124m_spec(), 8, r));
}

TEST(Recompute, FullUsesLessThanSelectiveLessThanNone) {
  for (const ModelSpec& spec :
       {small_spec(), att_heavy_spec(), logit_heavy_spec(), gpt2_124m_spec()}) {
    for (int B : {1, 8}) {
      const auto none = activation_bytes(spec, B, Recompute::none);
      const auto sel = activation_bytes(spec, B, Recompute::selective);
      const auto full = activation_bytes(spec, B, Recompute::full);
      EXPECT_LT(full, sel) << spec.preset << " B=" << B;
      EXPECT_LT(sel, none) << spec.preset << " B=" << B;
      // Full keeps the L+1 residual-stream tensors, the head and at most one block's buffers.
      const std::uint64_t NC = std::uint64_t(B) * spec.seq * spec.hidden;
      EXPECT_GT(full, (spec.layers + 1) * NC * 4);
      if (spec.preset == "small" || spec.preset == "gpt2-124m") {
        std::printf("[ activations ] %s B=%d: none %llu  selective %llu  full %llu bytes\n",
                    spec.preset.c_str(), B, (unsigned long long)none, (unsigned long long)sel,
                    (unsigned long long)full);
      }
    }
  }
  // small at B=8 (L=4, C=256, NH=4, T=128, V=4096; N = 1024 rows, NC = 2^18 floats = 1 MiB,
  // att = 2 NC, NV = 16 NC): kept 23 NC + 3N, per block 15 NC + 4N (+ att), head scratch 17 NC,
  // block scratch 9 NC. none = 108 NC + 19N, selective = 100 NC + 19N (the shared att fits in
  // the head's scratch), full = 23 NC + 3N + (9 + 15 + 2) NC + 4N = 49 NC + 7N.
  const ModelSpec small = small_spec();
  EXPECT_EQ(activation_bytes(small, 8, Recompute::none), 113324032u);
  EXPECT_EQ(activation_bytes(small, 8, Recompute::selective), 104935424u);
  EXPECT_EQ(activation_bytes(small, 8, Recompute::full), 51408896u);
}

// What selective saves relative to none, in bytes, with att = B*NH*T*T*4 the attention
// probabilities of one block: L*att (no per-block att) minus what the one shared att adds to the
// scratch region, which is max(0, min(att, block_ws + att - head_ws)) (it overlaps the head's
// scratch where that is larger). So exactly (L-1)*att when a block's scratch is at least the
// head's (att-heavy shapes), exactly L*att when the head's scratch has room for a block's
// scratch plus att (small, gpt2-124m: large vocabularies), and in between otherwise.
TEST(Recompute, SelectiveSavesTheAttentionProbabilities) {
  auto saved = [](const ModelSpec& s, int B) {
    return activation_bytes(s, B, Recompute::none) - activation_bytes(s, B, Recompute::selective);
  };
  auto att_bytes = [](const ModelSpec& s, int B) {
    return std::uint64_t(B) * s.heads * s.seq * s.seq * sizeof(float);
  };
  for (int B : {1, 2, 8}) {
    const ModelSpec a = att_heavy_spec();
    EXPECT_EQ(saved(a, B), (a.layers - 1) * att_bytes(a, B)) << "att-heavy B=" << B;
    const ModelSpec s = small_spec();
    EXPECT_EQ(saved(s, B), s.layers * att_bytes(s, B)) << "small B=" << B;
    const ModelSpec g = gpt2_124m_spec();
    EXPECT_EQ(saved(g, B), g.layers * att_bytes(g, B)) << "gpt2-124m B=" << B;
  }
  // small at B=8: att is 8*4*128*128 floats = 2 MiB per block, 4 blocks.
  EXPECT_EQ(saved(small_spec(), 8), 4u * 2 * 1024 * 1024);
}

// ---------------------------------------------------------------------------------------------
// Optimizer class

TEST(AdamWClass, DecaysOnlyDecayTensorsOverAnyRange) {
  const ParamLayout layout(tiny_spec());
  // A range from the middle of block0.ln1_b (no decay) into block0.qkv_w (decay).
  const TensorInfo& ln1_b = layout.tensors()[layout.units()[1].first_tensor + 1];
  const TensorInfo& qkv_w = layout.tensors()[layout.units()[1].first_tensor + 2];
  ASSERT_EQ(ln1_b.offset + ln1_b.count, qkv_w.offset);
  const std::size_t begin = ln1_b.offset + 4, count = (ln1_b.count - 4) + 10;
  MemoryLedger ledger;
  AdamWConfig cfg;
  cfg.lr = 0.1f;
  cfg.weight_decay = 0.5f;
  AdamW opt(layout, begin, count, cfg, ledger);
  EXPECT_EQ(opt.state_bytes(), 2 * count * sizeof(float));
  EXPECT_EQ(ledger.peak(MemTag::optimizer), 2 * count * sizeof(float));
  std::vector<float> p(count, 2.0f), g(count, 0.0f);
  opt.step(view(p.data(), p.size()), view(g.data(), g.size()), 1);
  for (std::size_t i = 0; i < count; ++i) {
    const bool decays = begin + i >= qkv_w.offset;
    EXPECT_FLOAT_EQ(p[i], decays ? 2.0f * (1.0f - 0.1f * 0.5f) : 2.0f) << i;
  }
  EXPECT_THROW(opt.step(view(p.data(), p.size()), view(g.data(), g.size()), 0), Error);
  EXPECT_THROW(AdamW(layout, layout.total() - 1, 2, cfg, ledger), Error);
}

TEST(AdamWClass, GradScaleActsLikeScaledGradients) {
  const ParamLayout layout(tiny_spec());
  MemoryLedger ledger;
  AdamW a(layout, 0, 100, AdamWConfig{}, ledger), b(layout, 0, 100, AdamWConfig{}, ledger);
  std::vector<float> pa(100, 0.3f), pb(100, 0.3f), g(100), gs(100);
  for (int i = 0; i < 100; ++i) {
    g[i] = 0.01f * float(i - 50);
    gs[i] = g[i] * 0.25f;
  }
  for (int t = 1; t <= 3; ++t) {
    a.step(view(pa.data(), pa.size()), view(g.data(), g.size()), t, 0.25f);
    b.step(view(pb.data(), pb.size()), view(gs.data(), gs.size()), t);
  }
  for (int i = 0; i < 100; ++i) EXPECT_NEAR(pa[i], pb[i], 1e-6);
}

TEST(GradNorm, SumOfSquaresAndClipScale) {
  std::vector<float> g(1001);
  double ref = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    g[i] = 0.001f * float(i) - 0.3f;
    ref += double(g[i]) * double(g[i]);
  }
  EXPECT_NEAR(sum_of_squares(g.data(), g.size()), ref, 1e-12 * ref);
  EXPECT_EQ(sum_of_squares(g.data(), 0), 0.0);
  EXPECT_EQ(clip_scale(0.5, 1.0), 1.0f);
  EXPECT_EQ(clip_scale(5.0, 0.0), 1.0f);
  EXPECT_NEAR(clip_scale(4.0, 1.0), 0.25f, 1e-6);
}
