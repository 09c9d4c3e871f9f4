// The GPT-2 workload: presets, parameter layout, deterministic initialisation, and Model, the
// whole-model front end of the passes in model_passes.cpp.
#include "strata/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "cpu/layers.hpp"
#include "model_passes.hpp"
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

void validate_model_spec(const ModelSpec& s) {
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

namespace {

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

}  // namespace

// ---------------------------------------------------------------------------------------------
// ParamLayout

ParamLayout::ParamLayout(const ModelSpec& spec) {
  validate_model_spec(spec);
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

// ---------------------------------------------------------------------------------------------
// Model: the whole model at tp 1 with one activation slot, unit by unit, on ModelPasses.

struct Model::Impl {
  ModelSpec spec;
  ParamLayout layout;
  int B;
  ModelPasses passes;
  std::unique_ptr<ModelPasses::Slot> slot;
  std::size_t wpe_off;  // wpe's offset in the embedding unit
  int last_batch = 0;   // micro-batch size of the last head forward, for loss_sum()

  Impl(const ModelSpec& s, int micro_batch, MemoryLedger& ledger, Recompute r)
      : spec(s),
        layout(s),
        B(micro_batch),
        passes(s, micro_batch, whole_model(s), r, ledger),
        slot(passes.make_slot()),
        wpe_off(layout.tensors()[1].offset) {}

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
};

Model::Model(const ModelSpec& spec, int micro_batch, MemoryLedger& memory, Recompute recompute)
    : impl_(std::make_unique<Impl>(spec, micro_batch, memory, recompute)) {}
Model::~Model() = default;

const ModelSpec& Model::spec() const { return impl_->spec; }
const ParamLayout& Model::layout() const { return impl_->layout; }
int Model::micro_batch() const { return impl_->B; }
Recompute Model::recompute() const { return impl_->passes.recompute(); }

void Model::forward(int unit, const UnitPtrs& params, const MicroBatch& mb) {
  Impl& m = *impl_;
  m.check(unit, params, mb);
  m.passes.set_batch(mb.batch);
  SlotActs& acts = m.slot->acts;
  const int L = m.spec.layers;
  if (unit == 0) {
    m.passes.forward_embedding(acts, params[0], params[0] + m.wpe_off, mb.inputs, nullptr);
  } else if (unit <= L) {
    m.passes.forward_block(unit - 1, acts, params[unit], nullptr);
  } else {
    m.passes.forward_head(acts, params[unit], params[0], mb.targets, nullptr);
    m.last_batch = mb.batch;
  }
}

void Model::backward(int unit, const UnitPtrs& params, const UnitPtrs& grads, const MicroBatch& mb,
                     float grad_scale) {
  Impl& m = *impl_;
  m.check(unit, params, mb);
  m.check(unit, grads, mb);
  m.passes.set_batch(mb.batch);
  SlotActs& acts = m.slot->acts;
  const int L = m.spec.layers;
  if (unit == 0) {
    m.passes.backward_embedding(grads[0], grads[0] + m.wpe_off, mb.inputs, nullptr);
  } else if (unit <= L) {
    m.passes.backward_block(unit - 1, acts, params[unit], grads[unit], nullptr);
  } else {
    m.passes.backward_head(acts, params[unit], params[0], grads[unit], grads[0], mb.targets,
                           nullptr, grad_scale);
  }
}

double Model::loss_sum() const {
  const Impl& m = *impl_;
  return ModelPasses::loss_sum(m.slot->acts, std::size_t(m.last_batch) * m.spec.seq);
}

std::uint64_t Model::activation_bytes(const ModelSpec& spec, int micro_batch, Recompute recompute) {
  return predict_activations(spec, micro_batch, whole_model(spec), recompute).total(1);
}

}  // namespace strata
