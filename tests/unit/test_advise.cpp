// The advisor (core/src/predict/advisor.hpp) with the real plugins on a synthetic profile: a
// ranking checked by hand, exclusions by memory (by how much) and by divisibility (which).
#include <gtest/gtest.h>

#include <algorithm>

#include "installed_plugins.hpp"
#include "predict/advisor.hpp"

namespace strata {
namespace {

// Compute of tiny at micro-batch 4 on 2 ranks of one node: embedding 1 / 2 ms, blocks 10 / 20
// ms, head 5 / 10 ms (forward / backward), full recompute 10 ms a block, selective free; AdamW
// 1 ns a parameter. Every op on those 2 ranks: alpha 100 us, beta 1 GB/s.
MachineProfile synthetic_profile(const ModelSpec& m) {
  ComputeEntry e;
  e.model = m, e.micro_batch = 4, e.threads = 1, e.ranks_per_node = 2;
  e.embedding_forward_s = 1e-3, e.embedding_backward_s = 2e-3;
  e.block_forward_s = 10e-3, e.block_backward_s = 20e-3;
  e.head_forward_s = 5e-3, e.head_backward_s = 10e-3;
  e.block_recompute_full_s = 10e-3;
  e.optimizer_s_per_param = 1e-9;
  MachineProfile p;
  p.source = "synthetic";
  p.node_peak_flops = 100e9;
  p.compute.push_back(e);
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"})
    p.comm.push_back(CommFit{op, 2, 2, 1e-4, 1e9, 2, 0});
  return p;
}

class Advisor : public ::testing::Test {
 protected:
  std::vector<AdviseStrategy> only(std::vector<std::string> names) {
    std::vector<AdviseStrategy> out;
    for (const std::string& n : names) {
      const StrategySpec* spec = nullptr;
      EXPECT_TRUE(installed_plugins().find(n, &spec)) << n;
      out.push_back({n, spec, [n](const Options& o) { return installed_plugins().create(n, o); }});
    }
    return out;
  }
  AdviseRequest request(const ModelSpec& m) {
    AdviseRequest r;
    r.model = m, r.nodes = 1, r.ranks_per_node = 2, r.memory_limit = 1e12;
    r.micro_batches = {4}, r.global_batch = 8;
    return r;
  }
};

const Candidate* find(const std::vector<Candidate>& v, const std::string& label) {
  for (const Candidate& c : v)
    if (c.label() == label) return &c;
  return nullptr;
}

TEST_F(Advisor, RanksByPredictedTokensPerSecond) {
  const ModelSpec m = model_preset("tiny");  // 120576 parameters
  const Advice a = advise(synthetic_profile(m), request(m), only({"ddp", "tp"}));
  ASSERT_EQ(a.ranked.size(), 6u);  // ddp dp2, tp tp2: 3 recompute modes each
  EXPECT_TRUE(a.excluded.empty());
  // ddp dp2 (1 micro-batch of 4): forward 1 + 20 + 5, backward 2 + 40 + 10 ms; the one 25 MiB
  // bucket (all 120576 fp32 gradients) is ready when backward reaches the embedding, its
  // all-reduce (100 us + 482304 B / 1 GB/s) exposed; then AdamW.
  const double ddp = 78e-3 + (1e-4 + 482304 / 1e9) + 1e-9 * 120576;
  // tp2 (dp 1: 2 micro-batches): blocks and head at 1/2, 10 all-reduces of [256, 64] fp32 and the
  // cross-entropy's two small ones per micro-batch, the norm's all-reduce, AdamW of the rank's
  // 62784 parameters (Predictor.TensorParallelismHandComputed).
  const double ar = 1e-4 + 65536 / 1e9, ce = 2e-4 + 3072 / 1e9;
  const double tp = 2 * (1e-3 + 2 * 5e-3 + 2.5e-3 + 2e-3 + 2 * 10e-3 + 5e-3 + 10 * ar + ce) +
                    (1e-4 + 8 / 1e9) + 1e-9 * 62784;
  // Selective recompute costs nothing here and keeps less: it ranks above none at the same speed.
  const std::vector<std::string> order = {
      "ddp dp2 tp1 pp1 mb4 selective", "ddp dp2 tp1 pp1 mb4 none", "tp dp1 tp2 pp1 mb4 selective",
      "tp dp1 tp2 pp1 mb4 none",       "ddp dp2 tp1 pp1 mb4 full", "tp dp1 tp2 pp1 mb4 full"};
  for (std::size_t i = 0; i < order.size(); ++i) EXPECT_EQ(a.ranked[i].label(), order[i]) << i;
  EXPECT_NEAR(a.ranked[0].time.step_s, ddp, 1e-12);
  EXPECT_NEAR(a.ranked[0].time.tokens_per_s, 8 * 64 / ddp, 1e-6);
  EXPECT_NEAR(find(a.ranked, "tp dp1 tp2 pp1 mb4 none")->time.step_s, tp, 1e-12);
  EXPECT_NEAR(find(a.ranked, "ddp dp2 tp1 pp1 mb4 full")->time.step_s, ddp + 2 * 10e-3, 1e-12);
  EXPECT_LT(a.ranked[0].memory_bytes, a.ranked[1].memory_bytes);
}

TEST_F(Advisor, ExcludesByMemoryAndDivisibilityWithTheReason) {
  ModelSpec m = model_preset("tiny");
  AdviseRequest r = request(m);
  const Advice all = advise(synthetic_profile(m), r, only({"ddp", "tp"}));
  const double ddp_none = find(all.ranked, "ddp dp2 tp1 pp1 mb4 none")->memory_bytes;
  const double tp_none = find(all.ranked, "tp dp1 tp2 pp1 mb4 none")->memory_bytes;
  ASSERT_LT(tp_none, ddp_none);  // tp holds half the parameters and their state
  // A limit 1000 bytes below ddp's: ddp without recompute is out, by 1000 bytes.
  r.memory_limit = ddp_none - 1000;
  r.micro_batches = {4, 3};  // 3: 8 sequences do not split into micro-batches of 3
  const Advice a = advise(synthetic_profile(m), r, only({"ddp", "tp"}));
  std::vector<std::string> by_memory, batch;
  for (const Excluded& e : a.excluded) {
    if (e.why == Exclusion::memory) {
      by_memory.push_back(e.candidate.label());
      EXPECT_GT(e.candidate.memory_bytes, r.memory_limit);
    }
    if (e.why == Exclusion::divisibility) batch.push_back(e.candidate.label() + ": " + e.detail);
  }
  EXPECT_EQ(by_memory, std::vector<std::string>{"ddp dp2 tp1 pp1 mb4 none"});
  EXPECT_NEAR(find(all.ranked, "ddp dp2 tp1 pp1 mb4 none")->memory_bytes - r.memory_limit, 1000, 0);
  ASSERT_EQ(batch.size(), 6u);
  EXPECT_EQ(batch[0],
            "ddp dp2 tp1 pp1 mb3 none: --global-batch 8 is not a multiple of micro-batch x dp = 6");
  EXPECT_EQ(batch[3],
            "tp dp1 tp2 pp1 mb3 none: --global-batch 8 is not a multiple of micro-batch x dp = 3");
  EXPECT_EQ(a.ranked.size(), 5u);
  // The model's own divisibility: 1 head does not split over tp 2 (the strategy's validate()).
  m.heads = 1;
  const Advice heads = advise(synthetic_profile(m), request(m), only({"tp"}));
  EXPECT_TRUE(heads.ranked.empty());
  ASSERT_EQ(heads.excluded.size(), 3u);
  EXPECT_EQ(heads.excluded[0].why, Exclusion::divisibility);
  EXPECT_NE(heads.excluded[0].detail.find("heads"), std::string::npos) << heads.excluded[0].detail;
  const std::string table = format_advice(a, r, 3);
  EXPECT_NE(table.find("excluded, memory: 1 need more than"), std::string::npos) << table;
  EXPECT_NE(table.find("(1000.00 B over)"), std::string::npos) << table;
  EXPECT_NE(table.find("6 x --global-batch 8 is not a multiple"), std::string::npos) << table;
}

}  // namespace
}  // namespace strata
