// Machine profiles from finished runs (core/src/predict/profile_from_runs.cpp): a run file's
// configuration read back as the predictor's question, compute entries from phase timers split by
// FLOPs, and the new-buffer rate fitted to a sharded run's step.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "installed_plugins.hpp"
#include "predict/profile_from_runs.hpp"
#include "strata/data_parallel.hpp"

namespace strata {
namespace {

// A run of `plugin` on 2 ranks of one node, dp 2, micro-batch 4, global batch 16 (2 micro-steps),
// 4 steps of which 1 warm-up; rank 1 is the slower one in forward.
RunRecord two_rank_run(const std::string& plugin, const std::string& plugin_opts) {
  RunRecord r;
  r.ranks = 2, r.steps = 4;
  r.config = {{"plugin", plugin},
              {"plugin_opts", plugin_opts},
              {"device", "cpu"},
              {"model", "tiny"},
              {"layers", "2"},
              {"hidden", "64"},
              {"heads", "4"},
              {"seq", "64"},
              {"vocab", "256"},
              {"micro_batch", "4"},
              {"global_batch", "16"},
              {"steps", "4"},
              {"warmup", "1"},
              {"grad_clip", "1"},
              {"recompute", "none"},
              {"precision", "fp32"},
              {"reduce_dtype", "fp32"},
              {"nodes", "1"},
              {"ranks_per_node", "2"},
              {"dp", "2"},
              {"tp", "1"},
              {"pp", "1"}};
  r.provenance = {{"blas_threads", "1"}};
  // [rank x step]: the warm-up step is slow and ignored; the timed steps' median of the max.
  r.step_values["forward_s"] = {9, 0.020, 0.022, 0.021, 9, 0.030, 0.032, 0.031};
  r.step_values["backward_s"] = {9, 0.060, 0.060, 0.060, 9, 0.050, 0.050, 0.050};
  r.step_values["optimizer_s"] = {9, 0.001, 0.001, 0.001, 9, 0.001, 0.001, 0.001};
  r.summary = {{"step_s_p50", 0.2, "s"}, {"peak_flops_per_rank", 50e9, "FLOP/s"}};
  return r;
}

// The run's question with the plans of its strategy (the run's options not needed here).
RunQuestion planned(const RunRecord& run, const std::string& strategy) {
  RunQuestion q = question_of_run(run);
  const StepQuery& as_run = q.query;
  q.query = step_query(strategy, *installed_strategy(strategy, {}), as_run.mesh, as_run.model,
                       as_run.train, as_run.threads);
  return q;
}

TEST(ProfileFromRuns, ReadsTheRunsQuestionBack) {
  const RunQuestion q = question_of_run(two_rank_run("1f1b", "stage_layers=1,1,dp=zero1"));
  EXPECT_EQ(q.query.strategy, "1f1b");
  EXPECT_EQ(q.plugin_opts, (std::vector<std::string>{"stage_layers=1,1", "dp=zero1"}));
  EXPECT_EQ(q.query.model.total_params(), model_preset("tiny").total_params());
  EXPECT_EQ(q.query.mesh.dp, 2);
  EXPECT_EQ(q.query.mesh.ranks_per_node, 2);
  EXPECT_EQ(q.query.train.micro_steps(q.query.mesh), 2);
  EXPECT_EQ(q.query.threads, 1);
  EXPECT_DOUBLE_EQ(q.step_p50_s, 0.2);
  EXPECT_DOUBLE_EQ(q.node_peak_flops, 100e9);  // 50 GFLOP/s per rank x 2 ranks
}

TEST(ProfileFromRuns, SplitsTheSlowestRanksPhasesByFlops) {
  const RunRecord run = two_rank_run("zero1", "");
  const RunQuestion q = planned(run, "zero1");
  std::string why;
  const auto e = compute_from_run(run, q, &why);
  ASSERT_TRUE(e) << why;
  // Forward: max over ranks 0.030, 0.032, 0.031 -> median 0.031 s per step, 2 micro-batches.
  const ModelSpec m = model_preset("tiny");
  const UnitFlops f(m);
  const double total = f.embedding + 2 * f.block + f.head;
  EXPECT_NEAR(e->block_forward_s, 0.031 / 2 * f.block / total, 1e-15);
  EXPECT_NEAR(e->embedding_forward_s + 2 * e->block_forward_s + e->head_forward_s, 0.0155, 1e-15);
  EXPECT_NEAR(e->embedding_backward_s + 2 * e->block_backward_s + e->head_backward_s, 0.030, 1e-15);
  EXPECT_NEAR(e->block_recompute_full_s, e->block_forward_s, 1e-15);
  // zero1's plan updates this rank's half of the parameters; ddp's all of them.
  EXPECT_NEAR(e->optimizer_s_per_param, 0.001 / (double(m.total_params()) / 2), 1e-18);
  EXPECT_NEAR(compute_from_run(run, planned(run, "ddp"), &why)->optimizer_s_per_param,
              0.001 / double(m.total_params()), 1e-18);
  EXPECT_FALSE(compute_from_run(run, question_of_run(run), &why));  // no plan
  EXPECT_NE(why.find("plan"), std::string::npos) << why;
  EXPECT_EQ(e->threads, 1);
  EXPECT_EQ(e->ranks_per_node, 2);
  EXPECT_EQ(e->micro_batch, 4);
  EXPECT_EQ(e->fresh_memory_s_per_byte, 0);
}

TEST(ProfileFromRuns, LeavesOutRunsThatDoNotRunTheWholeModel) {
  RunRecord run = two_rank_run("1f1b", "");
  for (auto& [key, value] : run.config)
    if (key == "dp" || key == "pp") value = key == "dp" ? "1" : "2";
  std::string why;
  EXPECT_FALSE(compute_from_run(run, question_of_run(run), &why));
  EXPECT_NE(why.find("pp"), std::string::npos) << why;
  run = two_rank_run("zero3", "offload=optimizer");
  EXPECT_FALSE(compute_from_run(run, question_of_run(run), &why));
  EXPECT_NE(why.find("offload"), std::string::npos) << why;
}

TEST(ProfileFromRuns, FitsTheNewBufferRateThatGivesTheMeasuredStep) {
  const RunRecord run = two_rank_run("zero3", "");
  RunQuestion q = planned(run, "zero3");
  std::string why;
  auto e = compute_from_run(run, q, &why);
  ASSERT_TRUE(e) << why;
  MachineProfile p;
  p.compute.push_back(*e);
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"})
    p.comm.push_back(CommFit{op, 2, 2, 1e-4, 1e9, 2, 0});
  // The step this profile predicts at 0.5 GB/s of new buffers is fitted back to that rate.
  p.compute[0].fresh_memory_s_per_byte = 2e-9;
  const StepTime t = predict_step_time(p, q.query);
  ASSERT_TRUE(t.modelled) << t.why;
  const auto rate = fit_fresh_rate(p, q.query, t.step_s);
  ASSERT_TRUE(rate);
  EXPECT_NEAR(*rate, 2e-9, 1e-15);
  // ddp allocates nothing per step: no rate to fit.
  EXPECT_FALSE(fit_fresh_rate(p, planned(run, "ddp").query, t.step_s));
}

// bench_comm's --benchmark_out JSON: the three collectives the predictor fits, all_gather in
// place, the mean time of the slowest rank in the file's unit; anything else refused in one line.
TEST(ProfileFromBench, ReadsTheCollectivesPoints) {
  const std::string path = ::testing::TempDir() + "bench_comm_points.json";
  auto write = [&](const std::string& text) { std::ofstream(path) << text; };
  auto point = [](const std::string& name, double bytes, double us) {
    return R"({"name": ")" + name + R"(/iterations:3/manual_time", "run_type": "iteration",
               "real_time": )" +
           std::to_string(us) + R"(, "time_unit": "us", "bytes": )" + std::to_string(bytes) +
           R"(, "ranks": 4})";
  };
  const std::string context = R"({"context": {"ranks": "4", "ranks_per_node": "2"}, )";
  write(context + R"("benchmarks": [)" +
        point("BM_Coll/mpi/all_reduce/in-place/bytes:65536", 65536, 120) + ", " +
        point("BM_Coll/mpi/all_gather/out-of-place/bytes:65536", 65536, 90) + ", " +
        point("BM_Coll/mpi/all_gather/in-place/bytes:65536", 65536, 80) + ", " +
        point("BM_Coll/mpi/sendrecv/out-of-place/bytes:65536", 65536, 50) + "]}");
  std::string transport;
  const std::vector<CommSample> s = samples_from_bench(path, &transport);
  EXPECT_EQ(transport, "mpi");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].op, "all_reduce");
  EXPECT_EQ(s[1].op, "all_gather");
  EXPECT_NEAR(s[1].time_s, 80e-6, 1e-15);
  EXPECT_EQ(s[0].ranks, 4);
  EXPECT_EQ(s[0].ranks_per_node, 2);
  EXPECT_EQ(s[0].host_ranks, 2);
  EXPECT_DOUBLE_EQ(s[0].bytes, 65536);
  for (const auto& [text, says] : std::vector<std::pair<std::string, std::string>>{
           {"{not json", "not readable as JSON"},
           {R"({"benchmarks": []})", "no context.ranks_per_node"},
           {context + R"("benchmarks": []})",
            "no all_reduce, reduce_scatter, all_gather or all_to_all point"},
           {context + R"("benchmarks": [)" +
                point("BM_Coll/mpi/all_reduce/in-place/bytes:8", 8, 1) + ", " +
                point("BM_Coll/ucx/all_reduce/in-place/bytes:8", 8, 1) + "]}",
            "2 transports; a profile is of one"}}) {
    write(text);
    try {
      samples_from_bench(path, &transport);
      ADD_FAILURE() << "accepted: " << says;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace strata
