// bf16 mixed precision in the SDK: bf16 initialisation, the model's passes on bf16 parameters
// against the same model in fp32, their activation account, and AdamW's fp32 master copy.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backends/cpu/gemm_bf16.hpp"
#include "model/model_passes.hpp"
#include "strata/device.hpp"
#include "strata/memory.hpp"
#include "strata/model.hpp"
#include "strata/optimizer.hpp"
#include "strata/stage_model.hpp"
#include "strata/types.hpp"

using namespace strata;

namespace {

ModelSpec tiny_spec() { return {"tiny", 2, 32, 2, 16, 64}; }

// Parameters of one dtype, initialised from a seed, with per-unit views.
struct Params {
  std::vector<float> f32;
  std::vector<bf16> b16;
  UnitPtrs units;
  Params(const ParamLayout& layout, DType dtype, std::uint64_t seed) {
    f32.resize(layout.total());
    init_params(layout, seed, 0, std::span<float>(f32));
    if (dtype == DType::bf16) {
      b16.resize(layout.total());
      init_params(layout, seed, 0, view(b16.data(), b16.size()));
    }
    for (const UnitInfo& u : layout.units())
      units.push_back(dtype == DType::f32 ? view(f32.data() + u.offset, u.count)
                                          : view(b16.data() + u.offset, u.count));
  }
};

struct Grads {
  std::vector<float> f32;
  std::vector<bf16> b16;
  UnitPtrs units;
  Grads(const ParamLayout& layout, DType dtype) {
    f32.assign(layout.total(), 0.0f);
    b16.assign(layout.total(), bf16{});
    for (const UnitInfo& u : layout.units())
      units.push_back(dtype == DType::f32 ? view(f32.data() + u.offset, u.count)
                                          : view(b16.data() + u.offset, u.count));
  }
  double at(std::size_t i) const { return b16.empty() || f32[i] != 0 ? f32[i] : to_float(b16[i]); }
};

struct Batch {
  std::vector<std::int32_t> inputs, targets;
  MicroBatch mb;
  Batch(int B, const ModelSpec& s, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> d(0, s.vocab - 1);
    for (int i = 0; i < B * s.seq; ++i) inputs.push_back(d(rng)), targets.push_back(d(rng));
    mb = {inputs.data(), targets.data(), B, s.seq};
  }
};

// The whole model with its one activation slot, as Context::model() holds it.
struct Whole {
  StageModel m;
  int slot;
  Whole(const ModelSpec& s, int B, MemoryLedger& ledger, Recompute r = Recompute::none,
        DType dtype = DType::f32)
      : m(s, B, whole_model(s), ledger, r, dtype), slot(m.acquire_slot()) {}
  void forward(int u, const UnitPtrs& p, const MicroBatch& mb) {
    m.forward(slot, u, p, mb, nullptr);
  }
  void backward(int u, const UnitPtrs& p, const UnitPtrs& g, float scale) {
    m.backward(slot, u, p, g, nullptr, scale);
  }
};

// Loss and gradients of one micro-batch.
double loss_and_grads(Whole& w, const UnitPtrs& p, const UnitPtrs& g, const Batch& b) {
  const int units = int(p.size());
  for (int u = 0; u < units; ++u) w.forward(u, p, b.mb);
  const double loss = w.m.loss_sum(w.slot) / (double(b.mb.batch) * b.mb.seq);
  const float scale = 1.0f / float(b.mb.batch * b.mb.seq);
  for (int u = units - 1; u >= 0; --u) w.backward(u, p, g, scale);
  return loss;
}

TEST(MixedPrecision, Bf16InitIsTheRoundedFp32Init) {
  const ParamLayout layout(tiny_spec());
  Params p(layout, DType::bf16, 11);
  for (std::size_t i = 0; i < layout.total(); ++i)
    ASSERT_EQ(p.b16[i].bits, to_bf16(p.f32[i]).bits) << i;
  // A slice starting mid-tensor initialises as that range of the whole.
  std::vector<bf16> part(1000);
  init_params(layout, 11, 4321, view(part.data(), part.size()));
  for (std::size_t i = 0; i < part.size(); ++i) ASSERT_EQ(part[i].bits, p.b16[4321 + i].bits);
}

// The bf16 passes compute what the fp32 passes compute, to bf16 accuracy: a wrong transpose,
// dropped bias or gradient would be off by O(1), bf16 rounding is off by ~1%.
TEST(MixedPrecision, Bf16PassesFollowFp32ForLossAndGradients) {
  ASSERT_TRUE(cpu::have_bf16_gemm()) << "this build must have oneDNN";
  const ModelSpec spec = tiny_spec();
  MemoryLedger ledger;
  Whole m32(spec, 2, ledger), m16(spec, 2, ledger, Recompute::none, DType::bf16);
  EXPECT_EQ(m16.m.param_dtype(), DType::bf16);
  const ParamLayout layout(spec);
  Params p32(layout, DType::f32, 5), p16(layout, DType::bf16, 5);
  const Batch batch(2, spec, 9);
  for (DType grad_dtype : {DType::f32, DType::bf16}) {
    Grads g32(layout, DType::f32), g16(layout, grad_dtype);
    const double l32 = loss_and_grads(m32, p32.units, g32.units, batch);
    const double l16 = loss_and_grads(m16, p16.units, g16.units, batch);
    EXPECT_NEAR(l16, l32, 5e-3 * l32);
    for (const TensorInfo& t : layout.tensors()) {
      double dot = 0, n32 = 0, diff = 0;
      for (std::size_t i = t.offset; i < t.offset + t.count; ++i) {
        const double a = g32.f32[i], b = g16.at(i);
        dot += a * b, n32 += a * a, diff += (a - b) * (a - b);
      }
      EXPECT_GT(n32, 0) << t.name;
      EXPECT_LT(std::sqrt(diff / n32), 0.05) << t.name << " grads " << dtype_name(grad_dtype);
    }
    // A second micro-batch accumulates: every tensor's gradient doubles, to rounding (bf16
    // gradients round at each accumulation: per-tensor relative error below 1%).
    std::vector<double> once(layout.total());
    for (std::size_t i = 0; i < once.size(); ++i) once[i] = g16.at(i);
    loss_and_grads(m16, p16.units, g16.units, batch);
    const double tol = grad_dtype == DType::bf16 ? 1e-2 : 1e-5;
    for (const TensorInfo& t : layout.tensors()) {
      double err = 0, norm = 0;
      for (std::size_t i = t.offset; i < t.offset + t.count; ++i)
        err += std::pow(g16.at(i) - 2 * once[i], 2), norm += std::pow(2 * once[i], 2);
      EXPECT_LE(std::sqrt(err), tol * std::sqrt(norm) + 1e-9)
          << t.name << " " << dtype_name(grad_dtype);
    }
  }
}

TEST(MixedPrecision, ActivationBytesCountTheBf16ScratchExactly) {
  // tiny, and 64 channels of 64 tokens.
  for (const ModelSpec& spec : {tiny_spec(), ModelSpec{"small", 2, 64, 2, 64, 256}})
    for (Recompute r : {Recompute::none, Recompute::full}) {
      MemoryLedger ledger;
      Whole m(spec, 3, ledger, r, DType::bf16);
      auto bytes = [&](DType dtype) {
        return predict_activations(spec, 3, whole_model(spec), r, dtype).total(1);
      };
      EXPECT_EQ(ledger.peak(MemTag::activations), bytes(DType::bf16)) << spec.preset;
      // bf16 saves more (its GEMMs' inputs and outputs at half the bytes, kept per block or, with
      // a full recompute, rebuilt in the shared scratch) than its operand buffers and GEMM
      // scratchpad cost. Not for tiny's 48 tokens of 32 channels: oneDNN's scratchpad on AMX
      // (Sapphire Rapids) is larger than all it saves there under a full recompute (209,088 bytes
      // against fp32's 197,952; 183,232 where oneDNN may not use AMX).
      if (spec.preset != "tiny") EXPECT_LT(bytes(DType::bf16), bytes(DType::f32)) << spec.preset;
    }
}

// The bf16 slot keeps bf16 d(logits) [N, V] instead of fp32 probabilities [N, V], and the residual
// stream and the GEMMs' inputs and outputs in bf16: ln1, the attention's output, xmid and ln2
// [N, C] of every block, the L + 1 block boundaries x [N, C], lnf [N, C], and each block's
// q | k | v [N, 3C] and pre-GELU and GELU outputs [N, 4C]: half their bytes, the rest of the slot
// as in fp32. gpt2-124m: the formula only (nothing allocated).
TEST(MixedPrecision, Bf16SlotKeepsBf16LogitGradientsAndGemmInputs) {
  for (auto [spec, B] : {std::pair{tiny_spec(), 3}, std::pair{model_preset("gpt2-124m"), 8}}) {
    const std::uint64_t N = std::uint64_t(B) * spec.seq, NV = N * spec.vocab, NC = N * spec.hidden;
    ASSERT_EQ(NV % 32, 0u) << "no padding in these shapes";
    ASSERT_EQ(NC % 32, 0u) << "no padding in these shapes";
    for (Device device : {Device::cpu, Device::cuda}) {
      const ActivationBytes f32 = predict_activations(spec, B, whole_model(spec), Recompute::none,
                                                      DType::f32, device),
                            b16 = predict_activations(spec, B, whole_model(spec), Recompute::none,
                                                      DType::bf16, device);
      const std::uint64_t L = spec.layers;
      EXPECT_EQ(f32.slot - b16.slot, NV * 2 + (4 * L + 1 + L + 1) * NC * 2 + L * (16 + 6) * NC)
          << spec.preset << " " << device_name(device);
    }
  }
  // gpt2-124m's fp32 logits [N, V] were 1.65 GB of scratch at micro-batch 8 (and again as
  // probabilities per slot); in bf16 the largest logit piece of the scratch is one 256 MiB chunk.
  const ModelSpec gpt2 = model_preset("gpt2-124m");
  const auto scratch = [&](DType dt) {
    return predict_activations(gpt2, 8, whole_model(gpt2), Recompute::none, dt, Device::cuda)
        .scratch;
  };
  EXPECT_GT(scratch(DType::f32), 8ull * 1024 * gpt2.vocab * 4);
  EXPECT_LT(scratch(DType::bf16), 512ull << 20);
}

// Logits wider than one chunk (kHeadLogitsBudget): 1536 token rows of a 65536 vocab are two chunks
// (1024 + 512 rows) in bf16, and each chunk's losses and gradients are those of its rows.
TEST(MixedPrecision, Bf16HeadInChunksFollowsFp32) {
  const ModelSpec spec{"wide-vocab", 1, 16, 2, 32, 65536};
  const int B = 48;
  const Dims d(spec, B, whole_model(spec), Device::cpu);
  ASSERT_EQ(head_chunk_rows(d), 1024u);
  ASSERT_EQ(d.N, 1536u);
  MemoryLedger ledger;
  Whole m32(spec, B, ledger), m16(spec, B, ledger, Recompute::none, DType::bf16);
  const ParamLayout layout(spec);
  Params p32(layout, DType::f32, 5), p16(layout, DType::bf16, 5);
  const Batch batch(B, spec, 9);
  Grads g32(layout, DType::f32), g16(layout, DType::f32);
  const double l32 = loss_and_grads(m32, p32.units, g32.units, batch);
  const double l16 = loss_and_grads(m16, p16.units, g16.units, batch);
  EXPECT_NEAR(l16, l32, 1e-3 * l32);
  for (const TensorInfo& t : layout.tensors()) {
    double n32 = 0, diff = 0;
    for (std::size_t i = t.offset; i < t.offset + t.count; ++i)
      n32 += double(g32.f32[i]) * g32.f32[i], diff += std::pow(g32.f32[i] - g16.at(i), 2);
    EXPECT_GT(n32, 0) << t.name;
    EXPECT_LT(std::sqrt(diff / n32), 0.02) << t.name;
  }
}

TEST(MixedPrecision, ModelRefusesViewsOfAnotherDtypeOrSize) {
  const ModelSpec spec = tiny_spec();
  MemoryLedger ledger;
  Whole m16(spec, 1, ledger, Recompute::none, DType::bf16), m32(spec, 1, ledger);
  const ParamLayout layout(spec);
  Params p32(layout, DType::f32, 1), p16(layout, DType::bf16, 1);
  Grads g16(layout, DType::bf16);
  const Batch batch(1, spec, 3);
  EXPECT_THROW(m16.forward(0, p32.units, batch.mb), Error);  // fp32 parameters, bf16 model
  m32.forward(0, p32.units, batch.mb);
  EXPECT_THROW(m32.backward(0, p32.units, g16.units, 1.0f), Error);  // bf16 grads
  UnitPtrs short_view = p16.units;
  short_view[1].count -= 1;
  EXPECT_THROW(m16.forward(1, short_view, batch.mb), Error);
}

// AdamW with bf16 parameters updates its fp32 master exactly as fp32 AdamW updates fp32
// parameters, and the bf16 parameters are the master rounded once.
TEST(MixedPrecision, AdamWMasterStepsAsFp32AndRoundsIntoTheParameters) {
  const ParamLayout layout(tiny_spec());
  const std::size_t begin = 100, n = 3000;
  MemoryLedger l32, l16;
  AdamW a32(layout, begin, n, AdamWConfig{}, l32);
  AdamW a16(layout, begin, n, AdamWConfig{}, l16, DType::bf16);
  EXPECT_EQ(a16.state_bytes(), 12 * n);
  EXPECT_EQ(l16.peak(MemTag::optimizer), 12 * n);
  std::vector<float> p(n);
  init_params(layout, 3, begin, std::span<float>(p));
  init_params(layout, 3, begin, a16.master());
  std::vector<bf16> p16(n);
  init_params(layout, 3, begin, view(p16.data(), n));
  std::mt19937 rng(1);
  std::normal_distribution<float> noise(0.0f, 0.01f);
  for (int t = 1; t <= 3; ++t) {
    std::vector<bf16> g16(n);
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i) g16[i] = to_bf16(noise(rng)), g[i] = to_float(g16[i]);
    a32.step(view(p.data(), n), view(g.data(), n), t, 0.5f);
    a16.step(view(p16.data(), n), view(g16.data(), n), t, 0.5f);
  }
  const float* master = static_cast<const float*>(a16.master().data);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(master[i], p[i]) << i;
    ASSERT_EQ(p16[i].bits, to_bf16(p[i]).bits) << i;
  }
  std::vector<float> wrong(n);
  EXPECT_THROW(a16.step(view(wrong.data(), n), view(wrong.data(), n), 4), Error);  // fp32 params
}

}  // namespace
