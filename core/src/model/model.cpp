// The GPT-2 workload: presets, parameter layout, deterministic initialisation (the passes are
// model_passes.cpp's, their front end StageModel).
#include "strata/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <numbers>

#include "backends/backend.hpp"
#include "backends/cpu/gemm_bf16.hpp"
#include "backends/cpu/layers.hpp"
#include "model/model_passes.hpp"
#include "strata/device.hpp"
#include "strata/types.hpp"

namespace strata {

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      {{"tiny", 2, 64, 4, 64, 256}, 3e-3},
      {{"small", 4, 256, 4, 128, 4096}, 1e-3},
      // GPT-2 small; lr as in GPT-3's table. The vocabulary is GPT-2's 50257 padded to a multiple
      // of 64 (50304), as nanoGPT and llm.c pad it: the head's operands are then aligned for the
      // GPU's tensor-core GEMMs (50257 left cuBLAS with its slowest, align-1 kernels: 14 ms of a
      // 131 ms step on an H100) and the vocabulary splits over tp = 2, 4, 8, 16, 32, 64.
      {{"gpt2-124m", 12, 768, 12, 1024, 50304}, 6e-4},
      // GPT-3's 6.7B and 175B shapes (Brown et al. 2020, table 2.1; lr as there), with the same
      // padded vocabulary: for the predictor and the advisor (--dry-run, --advise), far beyond
      // what a CPU trains.
      {{"gpt3-6.7b", 32, 4096, 32, 2048, 50304}, 1.2e-4},
      {{"gpt3-175b", 96, 12288, 96, 2048, 50304}, 0.6e-4},
      // Llama 3 (Meta, "The Llama 3 Herd of Models", 2024, table 3): grouped-query attention with
      // 8 K/V heads, the 128,256-token vocabulary, rope theta 500,000, peak learning rates as
      // there. tiny-llama is its shape at the size of tiny, for tests (2 K/V heads: GQA).
      {{"tiny-llama", 2, 64, 4, 64, 256, Arch::llama, 2, 192, 10000}, 3e-3},
      {{"llama3-8b", 32, 4096, 32, 8192, 128256, Arch::llama, 8, 14336, 500000}, 3e-4},
      {{"llama3-70b", 80, 8192, 64, 8192, 128256, Arch::llama, 8, 28672, 500000}, 1.5e-4},
      // Mixtral 8x7B (Jiang et al. 2024, table 1; Mistral's released configuration): 8 experts,
      // top 2, dropless, rope theta 1e6, the HF configuration's auxiliary coefficient 0.02; a
      // training sequence of 4096 and lr 1e-4 as Megatron-LM's Mixtral example. tiny-moe is its
      // shape at the size of tiny (4 experts of 96, top 2, 2 K/V heads).
      {{"tiny-moe", 2, 64, 4, 64, 256, Arch::moe, 2, 96, 10000, 4, 2, 0, 0.01}, 3e-3},
      {{"mixtral-8x7b", 32, 4096, 32, 4096, 32000, Arch::moe, 8, 14336, 1e6, 8, 2, 0, 0.02}, 1e-4},
      // Fine-grained experts with shared ones, DeepSeekMoE 16B's shape (Dai et al. 2024, table
      // 1 and appendix: 64 experts of 1408, top 6, 2 shared, 16 heads without GQA, the 102,400
      // vocabulary, seq 4096, lr 4.2e-4, balance factor 0.001), every block a moe: DeepSeekMoE's
      // first block is a dense MLP, so this has 16.9B parameters (2.8B active) against its 16.4B.
      {{"fine-moe-16b", 28, 2048, 16, 4096, 102400, Arch::moe, 16, 1408, 10000, 64, 6, 0, 0.001, 2},
       4.2e-4},
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

std::string params_text(const ModelSpec& spec) {
  std::string text = std::to_string(spec.total_params()) + " params";
  if (spec.arch == Arch::moe) text += ", " + std::to_string(spec.active_params()) + " active";
  return text;
}

const char* arch_name(Arch a) {
  return a == Arch::moe ? "moe" : a == Arch::llama ? "llama" : "gpt2";
}

bool parse_arch(const std::string& name, Arch* out) {
  for (Arch a : {Arch::gpt2, Arch::llama, Arch::moe})
    if (name == arch_name(a)) {
      if (out) *out = a;
      return true;
    }
  return false;
}

namespace {
void validate_experts(const ModelSpec& s) {
  if (s.arch != Arch::moe) {
    if (s.experts != 0 || s.top_k != 0 || s.capacity_factor != 0 || s.shared_experts != 0)
      throw ConfigError(
          "--experts, --top-k, --capacity-factor, --shared-experts: a mixture of experts needs "
          "--arch moe");
    return;
  }
  if (s.experts < 2)
    throw ConfigError("--experts " + std::to_string(s.experts) + ": must be at least 2");
  if (s.top_k < 1 || s.top_k > s.experts)
    throw ConfigError("--top-k " + std::to_string(s.top_k) + ": must be in [1, --experts " +
                      std::to_string(s.experts) + "]");
  if (!(s.capacity_factor >= 0))
    throw ConfigError("--capacity-factor " + std::to_string(s.capacity_factor) +
                      ": must be 0 (dropless) or positive");
  if (s.shared_experts < 0)
    throw ConfigError("--shared-experts " + std::to_string(s.shared_experts) +
                      ": must be 0 or positive");
  if (!(s.aux_loss_coef >= 0))
    throw ConfigError("--aux-loss-coef " + std::to_string(s.aux_loss_coef) +
                      ": must be 0 or positive");
}
}  // namespace

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
  if (s.ffn < 0) throw ConfigError("--ffn " + std::to_string(s.ffn) + ": must be positive");
  validate_experts(s);
  if (!s.llama_block()) {
    if (s.kv_heads > 0 && s.kv_heads != s.heads)
      throw ConfigError("--kv-heads " + std::to_string(s.kv_heads) +
                        ": grouped-query attention needs --arch llama");
    return;
  }
  const int kv = s.kv_head_count();
  if (kv <= 0 || s.heads % kv != 0)
    throw ConfigError("--kv-heads " + std::to_string(s.kv_heads) + ": must divide --heads " +
                      std::to_string(s.heads));
  if (s.head_dim() % 2 != 0)
    throw ConfigError("--arch " + std::string(arch_name(s.arch)) +
                      ": the head size (--hidden / --heads = " + std::to_string(s.head_dim()) +
                      ") must be even for rotary embeddings");
  if (!(s.rope_theta > 1))
    throw ConfigError("model: rope theta must be above 1, got " + std::to_string(s.rope_theta));
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

// One entry: a planner asks about one model thousands of times (the advisor's 175B search built a
// 96-block layout, 1,156 named tensors, for every stage of every candidate: half its time).
std::shared_ptr<const ParamLayout> ParamLayout::of(const ModelSpec& spec) {
  static std::mutex mutex;
  static ModelSpec last_spec;
  static std::shared_ptr<const ParamLayout> last;
  const std::lock_guard<std::mutex> lock(mutex);
  if (!last || !(last_spec == spec)) {
    last = std::make_shared<const ParamLayout>(spec);
    last_spec = spec;
  }
  return last;
}

namespace {

// A parameter tensor's name within its unit, shape and initialisation.
struct TensorDecl {
  std::string name;
  std::vector<int> shape;
  bool decay = false;
  float init_std = 0.0f, init_value = 0.0f;
};

constexpr float kInitStd = 0.02f;
// GPT-2's residual projections: 0.02 / sqrt(2 L).
float residual_init_std(const ModelSpec& spec) {
  return kInitStd / std::sqrt(2.0f * float(spec.layers));
}

// Block tensor k (block_tensors' order) of the spec's family.
TensorDecl block_tensor(const ModelSpec& spec, int k) {
  const int C = spec.hidden, E = spec.expert_count(), F = spec.ffn_hidden();
  const int qkv = int(spec.qkv_rows()), fc = int(spec.fc_rows());
  const bool llama = spec.llama_block(), moe = spec.arch == Arch::moe;
  const float out = residual_init_std(spec);
  switch (k) {
    case kLn1W:
      return {llama ? "attn_norm_w" : "ln1_w", {C}, false, 0.0f, 1.0f};
    case kLn2W:
      return {llama ? "mlp_norm_w" : "ln2_w", {C}, false, 0.0f, 1.0f};
    case kQkvW:
      return {"qkv_w", {qkv, C}, true, kInitStd};
    case kProjW:
      return {"proj_w", {C, C}, true, out};
    case kRouterW:
      return {"router_w", {E, C}, true, kInitStd};
    case kSharedFcW:  // the shared experts' gate | up [2 S F, C] and down [C, S F]
      return {"shared.gate_up_w", {2 * spec.shared_experts * F, C}, true, kInitStd};
    case kSharedFcprojW:
      return {"shared.down_w", {C, spec.shared_experts * F}, true, out};
    case kFcW:  // moe: every expert's, [E, 2F, C]
      if (moe) return {"experts.gate_up_w", {E, fc, C}, true, kInitStd};
      return {llama ? "gate_up_w" : "fc_w", {fc, C}, true, kInitStd};
    case kFcprojW:
      if (moe) return {"experts.down_w", {E, C, F}, true, out};
      return {llama ? "down_w" : "fcproj_w", {C, F}, true, out};
    default: {  // GPT-2's LayerNorm biases and linear biases: zeros
      static const char* const names[kBlockTensors] = {"", "ln1_b", "", "qkv_b", "", "proj_b",
                                                       "", "ln2_b", "", "fc_b",  "", "fcproj_b",
                                                       "", "",      ""};
      return {names[k], {k == kQkvB ? qkv : k == kFcB ? fc : C}, false};
    }
  }
}

}  // namespace

ParamLayout::ParamLayout(const ModelSpec& spec) {
  validate_model_spec(spec);
  const int C = spec.hidden;
  auto begin_unit = [&](std::string name, UnitKind kind, int block) {
    UnitInfo u;
    u.name = std::move(name);
    u.kind = kind;
    u.block = block;
    u.offset = total_;
    u.first_tensor = int(tensors_.size());
    units_.push_back(std::move(u));
  };
  auto add = [&](TensorDecl d) {
    TensorInfo t;
    t.name = units_.back().name + "." + d.name;
    t.id = int(tensors_.size());
    t.unit = int(units_.size()) - 1;
    t.offset = total_;
    t.count = 1;
    for (int n : d.shape) t.count *= std::size_t(n);
    t.shape = std::move(d.shape);
    t.decay = d.decay;
    t.init_std = d.init_std;
    t.init_value = d.init_value;
    total_ += t.count;
    tensors_.push_back(std::move(t));
    units_.back().count += tensors_.back().count;
    units_.back().num_tensors += 1;
  };

  const bool llama = spec.llama_block();
  begin_unit("embedding", UnitKind::embedding, -1);
  add({"wte", {spec.vocab, C}, true, kInitStd});
  if (!llama) add({"wpe", {spec.seq, C}, true, kInitStd});
  for (int b = 0; b < spec.layers; ++b) {
    begin_unit("block" + std::to_string(b), UnitKind::block, b);
    for (int k : block_tensors(spec)) add(block_tensor(spec, k));
  }
  begin_unit("head", UnitKind::head, -1);
  add({"lnf_w", {C}, false, 0.0f, 1.0f});
  if (!llama) add({"lnf_b", {C}, false});
  if (llama) add({"lm_head", {spec.vocab, C}, true, kInitStd});

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

void init_params(const ParamLayout& layout, std::uint64_t seed, std::size_t begin, BufferView out) {
  if (out.dtype != DType::f32 && out.dtype != DType::bf16)
    throw Error(std::string("init_params: a view of ") + dtype_name(out.dtype) + " on " +
                device_name(out.device) + ", need fp32 or bf16 memory");
  if (out.device != Device::cpu) {  // computed on the host, then copied: the same values
    std::vector<std::byte> host(out.bytes());
    init_params(layout, seed, begin, BufferView{host.data(), out.count, out.dtype, Device::cpu});
    copy_bytes(out.device, out.data, host.data(), host.size());
    return;
  }
  if (out.dtype == DType::f32) {
    init_params(layout, seed, begin, std::span<float>(static_cast<float*>(out.data), out.count));
    return;
  }
  constexpr std::size_t kChunk = 4096;  // fp32 values of a chunk, then rounded
  float values[kChunk];
  bf16* dst = static_cast<bf16*>(out.data);
  for (std::size_t done = 0; done < out.count; done += kChunk) {
    const std::size_t n = std::min(kChunk, out.count - done);
    init_params(layout, seed, begin + done, std::span<float>(values, n));
    cpu::round_to_bf16(dst + done, values, n);
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

const char* context_attention_name(ContextAttention a) {
  return a == ContextAttention::ring ? "ring" : "ulysses";
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

}  // namespace strata
