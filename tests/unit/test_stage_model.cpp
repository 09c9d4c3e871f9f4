// StageModel: tensor-parallel shards are exact slices of the global initialisation, and a chain of
// tp = 1 partitions (a pipeline) computes exactly what Model computes, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "strata/stage_model.hpp"

namespace strata {
namespace {

ModelSpec tiny4() {
  ModelSpec s = model_preset("tiny");
  s.layers = 4;
  return s;
}

TEST(StageModel, ShardsReassembleTheGlobalInit) {
  const ModelSpec spec = tiny4();
  const ParamLayout layout(spec);
  std::vector<float> full(layout.total());
  init_params(layout, 7, 0, full);
  for (int tp : {2, 4}) {
    Partition part{0, spec.layers + 1, tp, 0, false};
    std::vector<std::vector<float>> local(tp);
    std::vector<LocalTensor> tensors;
    for (int r = 0; r < tp; ++r) {
      MemoryLedger mem;
      part.tp_rank = r;
      StageModel m(spec, 1, part, mem);
      local[r].resize(m.param_count());
      m.init_params(7, local[r].data());
      tensors = m.tensors();
    }
    for (const LocalTensor& lt : tensors) {
      const TensorInfo& t = layout.tensors()[lt.global];
      const float* g = full.data() + t.offset;
      for (int r = 0; r < tp; ++r) {
        const float* l = local[r].data() + lt.offset;
        for (std::size_t i = 0; i < lt.count; ++i) {
          std::size_t gi = i;  // global index of local element i
          if (lt.shard == ShardKind::rows) {
            gi = r * lt.count + i;
          } else if (lt.shard == ShardKind::qkv_rows) {
            const std::size_t part_n = lt.count / 3;
            gi = (i / part_n) * (t.count / 3) + r * part_n + i % part_n;
          } else if (lt.shard == ShardKind::columns) {
            const std::size_t ic = t.shape[1], icl = ic / tp;
            gi = (i / icl) * ic + r * icl + i % icl;
          }
          ASSERT_EQ(l[i], g[gi]) << t.name << " tp " << tp << " rank " << r << " element " << i;
        }
      }
    }
  }
}

TEST(StageModel, TensorParallelCountsAndValidation) {
  const ModelSpec spec = tiny4();
  Partition all{0, spec.layers + 1, 4, 1, false};
  std::size_t sharded = 0, replicated = 0;
  for (const LocalTensor& t : StageModel::local_tensors(spec, all))
    (t.shard == ShardKind::replicated ? replicated : sharded) += t.count;
  EXPECT_EQ(sharded * 4 + replicated, std::size_t(spec.total_params()));
  EXPECT_THROW(validate_tensor_parallel(spec, 1, 3, false), ConfigError);  // 4 heads
  ModelSpec odd = spec;
  odd.vocab = 250;
  EXPECT_THROW(validate_tensor_parallel(odd, 1, 4, false), ConfigError);
  EXPECT_THROW(validate_tensor_parallel(spec, 1, 128, true), ConfigError);
  EXPECT_NO_THROW(validate_tensor_parallel(spec, 2, 4, true));
}

// Two pipeline stages at tp = 1 equal the whole Model: losses and every gradient, bitwise.
TEST(StageModel, PipelineChainEqualsModel) {
  const ModelSpec spec = tiny4();
  const int B = 2, N = B * spec.seq, L = spec.layers;
  std::vector<std::int32_t> in(N), tg(N);
  for (int i = 0; i < N; ++i) {
    in[i] = (i * 37 + 11) % spec.vocab;
    tg[i] = (i * 53 + 5) % spec.vocab;
  }
  const MicroBatch mb{in.data(), tg.data(), B, spec.seq};
  const float scale = 1.0f / N;

  MemoryLedger mem;
  Model model(spec, B, mem);
  const ParamLayout& layout = model.layout();
  std::vector<float> params(layout.total()), grads(layout.total(), 0.0f);
  init_params(layout, 3, 0, params);
  UnitPtrs p, g;
  for (const UnitInfo& u : layout.units()) {
    p.push_back(params.data() + u.offset);
    g.push_back(grads.data() + u.offset);
  }
  for (int u = 0; u <= L + 1; ++u) model.forward(u, p, mb);
  for (int u = L + 1; u >= 0; --u) model.backward(u, p, g, mb, scale);

  StageModel first(spec, B, {0, 2, 1, 0, false}, mem), last(spec, B, {3, L + 1, 1, 0, false}, mem);
  std::vector<float> p0(first.param_count()), g0(first.param_count(), 0.0f);
  std::vector<float> p1(last.param_count()), g1(last.param_count(), 0.0f);
  first.init_params(3, p0.data());
  last.init_params(3, p1.data());
  const int s0 = first.acquire_slot(), s1 = last.acquire_slot();
  first.forward(s0, p0.data(), mb, nullptr);
  std::memcpy(last.input(s1), first.output(s0), first.boundary_count() * sizeof(float));
  last.forward(s1, p1.data(), mb, nullptr);
  EXPECT_EQ(last.loss_sum(s1), model.loss_sum());
  last.backward(s1, p1.data(), g1.data(), nullptr, scale);
  std::memcpy(first.output_grad(), last.input_grad(s1), first.boundary_count() * sizeof(float));
  first.backward(s0, p0.data(), g0.data(), nullptr, scale);

  // The tied wte gradient is the sum of both stages' parts (the pipeline's exchange).
  for (const auto* stage : {&first, &last}) {
    const std::vector<float>& gl = stage == &first ? g0 : g1;
    for (const LocalTensor& lt : stage->tensors()) {
      const TensorInfo& t = layout.tensors()[lt.global];
      if (t.name.ends_with("wte")) continue;
      for (std::size_t i = 0; i < lt.count; ++i)
        ASSERT_EQ(gl[lt.offset + i], grads[t.offset + i]) << t.name << " element " << i;
    }
  }
  for (std::size_t i = 0; i < first.wte_count(); ++i)
    ASSERT_NEAR(g0[first.wte_offset() + i] + g1[last.wte_offset() + i], grads[i],
                1e-9 + 1e-5 * std::fabs(grads[i]))
        << i;
}

}  // namespace
}  // namespace strata
