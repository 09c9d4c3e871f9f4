// Machine profiles and the step-time predictor (core/src/predict) on synthetic profiles whose
// step times are computed by hand here.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "installed_plugins.hpp"
#include "predict/predictor.hpp"
#include "predict/profile.hpp"
#include "predict/published_profile.hpp"
#include "strata/data_parallel.hpp"
#include "strata/engines/pipe_schedule.hpp"
#include "strata/stage_model.hpp"

namespace strata {
namespace {

namespace fs = std::filesystem;

ModelSpec tiny() { return model_preset("tiny"); }  // 2 blocks: units emb, b1, b2, head

// Compute: embedding 1 / 2 ms, blocks 10 / 20 ms, head 5 / 10 ms (forward / backward).
ComputeEntry synthetic_compute(const ModelSpec& m, int micro_batch) {
  ComputeEntry e;
  e.model = m;
  e.micro_batch = micro_batch;
  e.threads = 1;
  e.ranks_per_node = 2;
  e.embedding_forward_s = 1e-3, e.embedding_backward_s = 2e-3;
  e.block_forward_s = 10e-3, e.block_backward_s = 20e-3;
  e.head_forward_s = 5e-3, e.head_backward_s = 10e-3;
  e.block_recompute_full_s = 10e-3;
  e.optimizer_s_per_param = 1e-9;
  return e;
}

// Every op on 2 ranks of one node: alpha 100 us, beta 1 GB/s.
MachineProfile synthetic_profile(const ModelSpec& m, int micro_batch, double alpha = 1e-4,
                                 double beta = 1e9) {
  MachineProfile p;
  p.source = "synthetic";
  p.node_peak_flops = 100e9;
  p.compute.push_back(synthetic_compute(m, micro_batch));
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"})
    p.comm.push_back(CommFit{op, 2, 2, alpha, beta, 2, 0});
  return p;
}

// The plugin's own step plans for a mesh dp x tp x pp on `nodes` nodes.
StepQuery query(const std::string& strategy, const std::map<std::string, std::string>& options,
                const ModelSpec& m, int dp, int pp, int micro_batch, int global_batch, int tp = 1,
                int nodes = 1, int ep = 1) {
  MeshSpec mesh{dp, tp, pp, nodes, dp * tp * pp / nodes};
  mesh.ep = ep;
  TrainSpec train;
  train.micro_batch = micro_batch;
  train.global_batch = global_batch;
  return step_query(strategy, *installed_strategy(strategy, options), mesh, m, train, 1);
}

TEST(AlphaBetaFit, RecoversLatencyAndBandwidthOfExactPoints) {
  std::vector<CommSample> points;
  for (double bytes : {4096.0, 65536.0, 1048576.0, 16777216.0})
    points.push_back({"all_reduce", 2, 2, bytes, 20e-6 + bytes / 2e9});
  const CommFit f = fit_alpha_beta(points);
  EXPECT_NEAR(f.alpha_s, 20e-6, 1e-9);
  EXPECT_NEAR(f.beta_bytes_per_s, 2e9, 1e3);
  EXPECT_LT(f.max_rel_error, 1e-6);
  EXPECT_EQ(f.points, 4);
}

TEST(AlphaBetaFit, DropsAPointSlowerThanALargerSize) {
  std::vector<CommSample> points;
  for (double bytes : {65536.0, 1048576.0, 16777216.0})
    points.push_back({"all_gather", 2, 2, bytes, 20e-6 + bytes / 2e9});
  points.push_back({"all_gather", 2, 2, 4096, 16e-3});  // descheduled: slower than 16 MiB
  const CommFit f = fit_alpha_beta(points);
  EXPECT_NEAR(f.alpha_s, 20e-6, 1e-9);
  EXPECT_NEAR(f.beta_bytes_per_s, 2e9, 1e3);
  EXPECT_EQ(f.points, 3);
}

TEST(CommTime, InterpolatesTheSamplesOfItsShape) {
  MachineProfile p;
  p.samples = {{"all_reduce", 2, 2, 1e6, 1e-3},
               {"all_reduce", 2, 2, 2e6, 3e-3},
               {"all_reduce", 2, 2, 4e6, 4e-3}};
  refit_comm(p);
  ASSERT_EQ(p.comm.size(), 1u);
  EXPECT_NEAR(comm_time(p, "all_reduce", 1.5e6, 2, 2), 2e-3, 1e-15);
  EXPECT_NEAR(comm_time(p, "all_reduce", 3e6, 2, 2), 3.5e-3, 1e-15);
  EXPECT_NEAR(comm_time(p, "all_reduce", 8e6, 2, 2), 6e-3, 1e-15);  // last segment extended
  EXPECT_NEAR(comm_time(p, "all_reduce", 0.5e6, 2, 2), 0, 1e-15);   // first one, down to 0
}

// A run's /calibration measures every group of a shape (dp and dp_intra_node on one node): one
// size measured twice interpolates through the faster point (it once divided by zero: inf).
TEST(CommTime, OneSizeMeasuredTwiceKeepsTheFasterPoint) {
  MachineProfile p;
  p.samples = {{"all_reduce", 2, 2, 1e6, 1e-3},
               {"all_reduce", 2, 2, 1e6, 2e-3},
               {"all_reduce", 2, 2, 4e6, 4e-3},
               {"all_reduce", 2, 2, 4e6, 4e-3}};
  refit_comm(p);
  EXPECT_NEAR(comm_time(p, "all_reduce", 2.5e6, 2, 2), 2.5e-3, 1e-15);
  EXPECT_NEAR(comm_time(p, "all_reduce", 8, 2, 2), 8e-9, 1e-15);
}

TEST(CommTime, CarriesBusBandwidthToAnotherGroupSize) {
  MachineProfile p;
  p.comm.push_back(CommFit{"all_reduce", 2, 2, 1e-5, 1e9, 3, 0});
  EXPECT_DOUBLE_EQ(comm_time(p, "all_reduce", 1e6, 2, 2), 1e-5 + 1e-3);
  // 4 ranks: busbw 1e9 x 2(1)/2 = 1 GB/s; time = alpha + bytes x 2(3)/4 / busbw.
  EXPECT_DOUBLE_EQ(comm_time(p, "all_reduce", 1e6, 4, 4), 1e-5 + 1.5e-3);
  EXPECT_EQ(comm_time(p, "all_gather", 1e6, 2, 2), -1);  // no fit for the op
  EXPECT_EQ(comm_time(p, "all_reduce", 1e6, 1, 1), 0);   // one rank: no comm
}

TEST(ProfileFile, WritesAndReadsBackEveryField) {
  MachineProfile p = synthetic_profile(tiny(), 4);
  p.description = "unit test";
  p.host = "h";
  p.created_utc = "2026-11-24T00:00:00Z";
  p.samples.push_back({"all_gather", 4, 2, 65536, 3.5e-4, 4});
  p.compute[0].copy_s_per_byte = 2e-10;
  p.compute[0].pass_spread = 0.034;
  p.compute[0].block_input_backward_s = 13e-3, p.compute[0].block_weight_backward_s = 9e-3;
  p.compute[0].tp = 2;
  p.compute.push_back(p.compute[0]);  // the same sizes as a llama: another entry
  p.compute[1].model = model_preset("tiny-llama");
  p.comm[1].host_ranks = 2;
  const fs::path path =
      fs::temp_directory_path() / ("strata-profile-" + std::to_string(::getpid()) + ".h5");
  write_profile(p, path.string());
  const MachineProfile q = read_profile(path.string());
  fs::remove(path);
  EXPECT_EQ(q.source, "synthetic");
  EXPECT_EQ(q.description, "unit test");
  EXPECT_DOUBLE_EQ(q.node_peak_flops, 100e9);
  ASSERT_EQ(q.compute.size(), 2u);
  EXPECT_EQ(q.compute[1].model.arch, Arch::llama);
  EXPECT_EQ(q.compute[1].model.kv_heads, 2);
  EXPECT_EQ(q.compute[1].model.ffn, 192);
  EXPECT_EQ(q.compute[1].model.flops_per_token(), model_preset("tiny-llama").flops_per_token());
  const ComputeEntry& e = q.compute[0];
  EXPECT_EQ(e.model.arch, Arch::gpt2);
  EXPECT_EQ(e.model.preset, "tiny");
  EXPECT_EQ(e.model.hidden, 64);
  EXPECT_EQ(e.model.vocab, 256);
  EXPECT_EQ(e.micro_batch, 4);
  EXPECT_EQ(e.ranks_per_node, 2);
  EXPECT_EQ(e.precision, "fp32");
  EXPECT_DOUBLE_EQ(e.block_backward_s, 20e-3);
  EXPECT_DOUBLE_EQ(e.block_recompute_full_s, 10e-3);
  EXPECT_DOUBLE_EQ(e.optimizer_s_per_param, 1e-9);
  EXPECT_DOUBLE_EQ(e.copy_s_per_byte, 2e-10);
  EXPECT_DOUBLE_EQ(e.pass_spread, 0.034);
  EXPECT_DOUBLE_EQ(e.block_input_backward_s, 13e-3);
  EXPECT_DOUBLE_EQ(e.block_weight_backward_s, 9e-3);
  EXPECT_EQ(e.tp, 2);
  ASSERT_EQ(q.comm.size(), 3u);
  EXPECT_EQ(q.comm[1].op, "reduce_scatter");
  EXPECT_DOUBLE_EQ(q.comm[1].alpha_s, 1e-4);
  EXPECT_EQ(q.comm[1].host_ranks, 2);
  ASSERT_EQ(q.samples.size(), 1u);
  EXPECT_EQ(q.samples[0].ranks, 4);
  EXPECT_DOUBLE_EQ(q.samples[0].time_s, 3.5e-4);
  EXPECT_EQ(q.samples[0].host_ranks, 4);
}

// Virtual nodes measure a 2-rank group among 4 ranks on one host: slower than 2 ranks alone.
// A run takes the measurement made with as many ranks on its host.
TEST(CommTime, PrefersTheFitMeasuredWithAsManyRanksOnTheHost) {
  MachineProfile p;
  p.comm.push_back(CommFit{"all_reduce", 2, 2, 0, 4e9, 4, 0, 2});
  p.comm.push_back(CommFit{"all_reduce", 2, 2, 0, 1e9, 4, 0, 4});
  EXPECT_DOUBLE_EQ(comm_time(p, "all_reduce", 4e6, 2, 2, nullptr, 2), 1e-3);
  EXPECT_DOUBLE_EQ(comm_time(p, "all_reduce", 4e6, 2, 2, nullptr, 4), 4e-3);
  // Samples of both: each host's own, merged under one shape (refit keeps them apart).
  p.comm.clear();
  p.samples = {{"all_reduce", 2, 2, 1e6, 1e-3, 2},
               {"all_reduce", 2, 2, 2e6, 2e-3, 2},
               {"all_reduce", 2, 2, 1e6, 3e-3, 4},
               {"all_reduce", 2, 2, 2e6, 6e-3, 4}};
  refit_comm(p);
  ASSERT_EQ(p.comm.size(), 2u);
  EXPECT_NEAR(comm_time(p, "all_reduce", 1.5e6, 2, 2, nullptr, 2), 1.5e-3, 1e-15);
  EXPECT_NEAR(comm_time(p, "all_reduce", 1.5e6, 2, 2, nullptr, 4), 4.5e-3, 1e-15);
}

TEST(ProfileFile, RefusesAFileThatIsNotAProfile) {
  try {
    read_profile("/dev/null");
    FAIL() << "read /dev/null";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--profile /dev/null"), std::string::npos) << e.what();
  }
}

TEST(FindCompute, PublishedProfilesScaleToOtherShapesByFlops) {
  const ModelSpec m = tiny();  // h 64, T 64, V 256
  MachineProfile p = synthetic_profile(m, 4);
  ModelSpec wide = m;
  wide.preset = "custom", wide.hidden = 128, wide.layers = 5;
  std::string how;
  // A measured profile answers only for the shapes it measured.
  EXPECT_FALSE(find_compute(p, wide, 4, "cpu", "fp32", 1, 2, &how));
  p.source = "published";
  const auto e = find_compute(p, wide, 4, "cpu", "fp32", 1, 2, &how);
  ASSERT_TRUE(e);
  EXPECT_NE(how.find("scaled FLOP-proportionally from the tiny entry"), std::string::npos) << how;
  // Per token: a block 24 h^2 + 4 h T (98304 + 16384 at h 64; 393216 + 32768 at h 128), the head
  // 2 h V, the embedding h; same tokens.
  const double block = (393216.0 + 32768) / (98304 + 16384);
  EXPECT_NEAR(e->block_forward_s, 10e-3 * block, 1e-15);
  EXPECT_NEAR(e->block_backward_s, 20e-3 * block, 1e-15);
  EXPECT_NEAR(e->block_recompute_full_s, 10e-3 * block, 1e-15);
  EXPECT_NEAR(e->head_forward_s, 5e-3 * 2, 1e-15);
  EXPECT_NEAR(e->embedding_backward_s, 2e-3 * 2, 1e-15);
  EXPECT_EQ(e->model.hidden, 128);
  // Another device or precision is still no entry.
  EXPECT_FALSE(find_compute(p, wide, 4, "cuda", "fp32", 1, 2, &how));
}

TEST(PublishedProfile, TableGivesComputeAndFitsAndRefusesBadLines) {
  const fs::path path =
      fs::temp_directory_path() / ("strata-table-" + std::to_string(::getpid()) + ".txt");
  const std::string table =
      "description  test node\nsource  made up\ndevice cuda\nprecision bf16  # the dtype\n"
      "gpus_per_node 4\npeak_flops_per_gpu 100e12\ngemm_efficiency 0.5\n"
      "hbm_bytes_per_s 2e12\nmemory_efficiency 0.5\noptimizer_bytes_per_param 30\n"
      "reference_model tiny\nmicro_batch 2\nnvlink_bytes_per_s 100e9\nnvlink_efficiency 0.5\n"
      "nvlink_latency_s 1e-5\nnetwork_bytes_per_s 10e9\nnetwork_efficiency 0.5\n"
      "network_latency_s 2e-5\nhost_link_bytes_per_s 20e9\nhost_link_efficiency 0.5\n";
  auto write = [&](const std::string& text) { std::ofstream(path) << text; };
  write(table);
  const MachineProfile p = profile_from_table(path.string());
  EXPECT_EQ(p.source, "published");
  EXPECT_NE(p.description.find("source = published figures: made up"), std::string::npos);
  EXPECT_EQ(p.node_peak_flops, 4 * 100e12);
  ASSERT_EQ(p.compute.size(), 1u);
  const ComputeEntry& e = p.compute[0];
  EXPECT_EQ(e.device, "cuda");
  EXPECT_EQ(e.ranks_per_node, 4);
  // tiny, 2 x 64 tokens: a block's forward (24 h^2 + 4 h T) per token at 50 TFLOP/s.
  EXPECT_NEAR(e.block_forward_s, 128 * (24.0 * 64 * 64 + 4.0 * 64 * 64) / 50e12, 1e-20);
  EXPECT_NEAR(e.optimizer_s_per_param, 30 / 1e12, 1e-24);
  EXPECT_NEAR(e.copy_s_per_byte, 1 / 10e9, 1e-24);  // the host link at half its 20 GB/s
  // Inside the node: all_reduce at 50 GB/s busbw over 4 ranks is algbw 50 / 1.5.
  EXPECT_NEAR(comm_time(p, "all_reduce", 1e9, 4, 4), 1e-5 + 1e9 * 1.5 / 50e9, 1e-12);
  EXPECT_NEAR(comm_time(p, "all_gather", 1e9, 2, 1), 2e-5 + 1e9 * 0.5 / 5e9, 1e-12);
  // MFU on a GPU: one rank on a node of 4 GPUs has one GPU's peak (100 TFLOP/s), not the node's
  // whole peak divided among the query's ranks (as CPU ranks share cores).
  StepQuery q = query("ddp", {{"bucket_mb", "25"}}, tiny(), 1, 1, 2, 2);
  q.train.device = Device::cuda, q.train.precision.param = DType::bf16;
  const StepTime t = predict_step_time(p, q);
  ASSERT_TRUE(t.modelled) << t.why;
  EXPECT_NEAR(t.mfu, t.tokens_per_s * tiny().flops_per_token() / 100e12, 1e-12);
  // Without sm_count other shapes scale by FLOPs; with it, by the GEMM roofline (gemm_model).
  EXPECT_EQ(p.roofline.flops_per_s, 0);
  write(table + "sm_count 4\n");
  const MachineProfile r = profile_from_table(path.string());
  EXPECT_EQ(r.roofline.flops_per_s, 50e12);
  EXPECT_EQ(r.roofline.bytes_per_s, 1e12);
  EXPECT_EQ(r.roofline.sms, 4);
  ModelSpec wide = tiny();
  wide.preset = "custom", wide.hidden = 128;
  std::string how;
  ASSERT_TRUE(find_compute(r, wide, 2, "cuda", "bf16", 1, 4, &how));
  EXPECT_NE(how.find("by the GEMM roofline (4 SMs, 128x128 tiles)"), std::string::npos) << how;
  for (const auto& [bad, says] : std::vector<std::pair<std::string, std::string>>{
           {table + "colour blue\n", "line 21: unknown key 'colour'"},
           {table + "gemm_efficiency fast\n", "gemm_efficiency must be a positive number"},
           {table.substr(table.find("source")), "no 'description' line"}}) {
    write(bad);
    try {
      profile_from_table(path.string());
      ADD_FAILURE() << "accepted: " << says;
    } catch (const ConfigError& err) {
      EXPECT_NE(std::string(err.what()).find(says), std::string::npos) << err.what();
    }
  }
  fs::remove(path);
}

TEST(Predictor, DdpWithOneBucketExposesTheWholeAllReduce) {
  const ModelSpec m = tiny();
  const MachineProfile p = synthetic_profile(m, 4);
  const StepQuery q = query("ddp", {{"bucket_mb", "25"}}, m, 2, 1, 4, 16);  // 2 micro-steps
  const StepTime t = predict_step_time(p, q);
  ASSERT_TRUE(t.modelled) << t.why;
  const double N = double(m.total_params());
  const double F = 1e-3 + 2 * 10e-3 + 5e-3, B = 2e-3 + 2 * 20e-3 + 10e-3;
  const double all_reduce = 1e-4 + 4 * N / 1e9;  // fp32 gradients, one bucket, after backward
  EXPECT_NEAR(t.step_s, 2 * (F + B) + 1e-9 * N + all_reduce, 1e-12);
  EXPECT_NEAR(t.exposed_comm_s, all_reduce, 1e-12);
  EXPECT_NEAR(t.tokens_per_s, 16.0 * m.seq / t.step_s, 1e-6);
  // MFU: the rank's FLOP/s over the node's peak shared by its 2 ranks.
  EXPECT_NEAR(t.mfu, t.tokens_per_s * m.flops_per_token() / 2 / 50e9, 1e-12);
}

// A blocking all_to_all after the step costs its fit's alpha + bytes / beta; a profile made
// before all_to_all was measured times it by its all_gather fit (the same bus bytes) and says so.
TEST(Predictor, AllToAllByItsFitOrAllGathers) {
  const ModelSpec m = tiny();
  MachineProfile p = synthetic_profile(m, 4);
  StepQuery q = query("ddp", {{"bucket_mb", "25"}}, m, 2, 1, 4, 16);
  const StepTime base = predict_step_time(p, q);
  const double bytes = 3e6;
  q.plans[0].step.push_back(plan_comm(CommOp::all_to_all, bytes, Axis::dp));
  const StepTime borrowed = predict_step_time(p, q);
  ASSERT_TRUE(borrowed.modelled) << borrowed.why;
  EXPECT_NEAR(borrowed.step_s - base.step_s, 1e-4 + bytes / 1e9, 1e-12);
  EXPECT_NE(borrowed.notes.find("all_to_all timed as all_gather"), std::string::npos)
      << borrowed.notes;
  p.comm.push_back(CommFit{"all_to_all", 2, 2, 2e-4, 5e8, 2, 0});
  const StepTime fitted = predict_step_time(p, q);
  EXPECT_NEAR(fitted.step_s - base.step_s, 2e-4 + bytes / 5e8, 1e-12);
  EXPECT_EQ(fitted.notes.find("all_to_all timed as"), std::string::npos) << fitted.notes;
}

// Expert parallelism (the ep plugin on tiny-moe, dp = ep = 2): each moe block's exchanges inside
// its passes, on the compute thread, at a uniform routing. Per block and micro-batch of B T = 256
// tokens: forward the counts' all-gather (2 ranks x 4 experts x 4 bytes) and two all_to_alls of
// the rank's k B T = 512 rows of C = 64 fp32 (131072 bytes), backward two more; a full recompute
// repeats the forward's in backward. The same plans without expert_parallel are that much faster.
TEST(Predictor, ExpertParallelChargesItsExchangesInsideThePasses) {
  const ModelSpec m = model_preset("tiny-moe");  // 2 blocks, 4 experts, top 2
  MachineProfile p = synthetic_profile(m, 4);
  p.comm.push_back(CommFit{"all_to_all", 2, 2, 2e-4, 5e8, 2, 0});
  StepQuery q = query("ep", {{"dp", "allreduce"}}, m, 2, 1, 4, 8, 1, 1, 2);  // one micro-batch
  ASSERT_EQ(q.plans.front().expert_parallel, 2);
  const auto bytes = plan_comm_bytes(q.plans.front(), m, q.train, 1);
  EXPECT_EQ(bytes[int(CommOp::all_to_all)], 2 * 4 * 131072.0);
  EXPECT_EQ(bytes[int(CommOp::all_gather)], 2 * 32.0);
  const double ag = 1e-4 + 32 / 1e9, a2a = 2e-4 + 131072 / 5e8;
  const StepTime t = predict_step_time(p, q);
  ASSERT_TRUE(t.modelled) << t.why;
  StepQuery plain = q;
  for (StepPlan& plan : plain.plans) plan.expert_parallel = 1;
  const StepTime t0 = predict_step_time(p, plain);
  EXPECT_NEAR(t.step_s - t0.step_s, 2 * (ag + 4 * a2a), 1e-12);
  EXPECT_NEAR(t.exposed_comm_s - t0.exposed_comm_s, 2 * (ag + 4 * a2a), 1e-12);
  EXPECT_NE(t.notes.find("ep: "), std::string::npos) << t.notes;
  q.train.recompute = plain.train.recompute = Recompute::full;
  EXPECT_NEAR(predict_step_time(p, q).step_s - predict_step_time(p, plain).step_s,
              2 * (2 * ag + 6 * a2a), 1e-12);
}

// The template plugin (plugins/template): one all-reduce of every gradient after backward.
// A plan's memory: setup's allocations held, a micro-batch's freed ones peaking once however
// often it repeats, one it never frees growing with each repeat, the step's on top; every tag's
// peak on its own.
TEST(StepPlanMemory, PeaksPerTagOverSetupMicroBatchesAndStep) {
  StepPlan plan;
  plan.setup = {plan_alloc(MemTag::params, 100), plan_alloc(MemTag::grads, 100)};
  plan.micro_batch = {plan_alloc(MemTag::activations, 50), plan_forward(0),
                      plan_alloc(MemTag::workspace, 10), plan_backward(0),
                      plan_free(MemTag::activations, 50)};
  plan.micro_batches = 3;
  plan.step = {plan_alloc(MemTag::comm_buffers, 20), plan_free(MemTag::comm_buffers, 20),
               plan_free(MemTag::grads, 100), plan_alloc(MemTag::grads, 40)};
  const std::array<double, kNumMemTags> peak = plan_memory(plan);
  auto at = [&](MemTag t) { return peak[static_cast<int>(t)]; };
  EXPECT_EQ(at(MemTag::params), 100);
  EXPECT_EQ(at(MemTag::grads), 100);
  EXPECT_EQ(at(MemTag::activations), 50);
  EXPECT_EQ(at(MemTag::workspace), 30);
  EXPECT_EQ(at(MemTag::comm_buffers), 20);
  EXPECT_EQ(at(MemTag::optimizer), 0);
  EXPECT_TRUE(plan_allocates(plan));
  StepPlan compute;
  plan_forward_backward(4, compute.micro_batch);
  EXPECT_FALSE(plan_allocates(compute));
}

// predict(): the plan's memory when it allocates (the template plugin states
// a replica's in its setup list), else a full replica's; the two agree for the template.
TEST(StepPlanMemory, DefaultPredictIsThePlansMemory) {
  struct Planned final : Strategy {
    StepPlan plan_step(const PredictInput&) const override {
      StepPlan plan;
      plan.setup = {plan_alloc(MemTag::params, 7), plan_alloc(MemTag::offload, 3)};
      return plan;
    }
    void setup(Context&) override {}
    void train_step(Context&, int) override {}
  };
  struct Unplanned final : Strategy {
    void setup(Context&) override {}
    void train_step(Context&, int) override {}
  };
  const ModelSpec m = tiny();
  TrainSpec train;
  train.micro_batch = 4;
  train.global_batch = 8;
  const PredictInput in{MeshSpec{2, 1, 1, 1, 2}, m, train, 0};
  const Prediction planned = predict(Planned(), in);
  EXPECT_EQ(planned.memory_bytes[static_cast<int>(MemTag::params)], 7);
  EXPECT_EQ(planned.memory_bytes[static_cast<int>(MemTag::offload)], 3);
  EXPECT_EQ(planned.memory_bytes[static_cast<int>(MemTag::activations)], 0);
  const Prediction replica = replicated_prediction(in);
  EXPECT_EQ(predict(Unplanned(), in).memory_bytes, replica.memory_bytes);
  EXPECT_EQ(replica.memory_bytes[static_cast<int>(MemTag::params)], 4.0 * m.total_params());
  EXPECT_EQ(predict(*installed_strategy("allreduce", {}), in).memory_bytes, replica.memory_bytes);
}

TEST(Predictor, TemplatePluginsAllReduceFollowsTheBackward) {
  const ModelSpec m = tiny();
  const StepTime t =
      predict_step_time(synthetic_profile(m, 4), query("allreduce", {}, m, 2, 1, 4, 16));
  ASSERT_TRUE(t.modelled) << t.why;
  const double N = double(m.total_params());
  const double F = 1e-3 + 2 * 10e-3 + 5e-3, B = 2e-3 + 2 * 20e-3 + 10e-3;
  EXPECT_NEAR(t.step_s, 2 * (F + B) + 1e-9 * N + 1e-4 + 4 * N / 1e9, 1e-12);
  EXPECT_NEAR(t.exposed_comm_s, 1e-4 + 4 * N / 1e9, 1e-12);
}

TEST(Predictor, DdpOverlapsEarlyBucketsWithBackward) {
  const ModelSpec m = tiny();
  const MachineProfile p = synthetic_profile(m, 4);
  const StepTime one = predict_step_time(p, query("ddp", {{"bucket_mb", "25"}}, m, 2, 1, 4, 8));
  const StepTime many = predict_step_time(p, query("ddp", {{"bucket_mb", "0.05"}}, m, 2, 1, 4, 8));
  ASSERT_TRUE(many.modelled) << many.why;
  const double compute = 26e-3 + 52e-3 + 1e-9 * double(m.total_params());
  // CPU ranks: the passes and the update, plus the comm hidden beside them (CpuRanksLose...).
  EXPECT_NEAR(many.compute_s - (many.comm_s - many.exposed_comm_s), compute, 1e-12);
  // Buckets of 13107 floats cut from the end of 120576 (embedding 20480, blocks 49984, head
  // 128): begins 107469, 94362, 81255 (ready after block 2), 68148 .. 28827 (block 1), 15720,
  // 2613, 0 (embedding). Each 0.1 ms + 4 bytes/ns; the block buckets finish during the next
  // units' backward (>= 2 ms), the embedding's three are all exposed.
  EXPECT_NEAR(many.exposed_comm_s, 3e-4 + 4 * (2 * 13107 + 2613) / 1e9, 1e-12);
  EXPECT_NEAR(many.comm_s, 10e-4 + 4 * 120576 / 1e9, 1e-12);
  EXPECT_LT(many.exposed_comm_s, one.exposed_comm_s);
}

// CPU ranks fill the cores, so comm that backward hides still takes its time from the compute
// (the comm thread spins beside it); a GPU's collectives run on the device's own engines.
TEST(Predictor, CpuRanksLoseTheComputeTheirHiddenCommTakes) {
  const ModelSpec m = tiny();
  MachineProfile p = synthetic_profile(m, 4);
  p.compute.push_back(p.compute[0]);
  p.compute[1].device = "cuda";
  StepQuery cpu = query("ddp", {{"bucket_mb", "0.05"}}, m, 2, 1, 4, 8), gpu = cpu;
  gpu.train.device = Device::cuda;
  const StepTime on_cpu = predict_step_time(p, cpu), on_gpu = predict_step_time(p, gpu);
  ASSERT_TRUE(on_cpu.modelled && on_gpu.modelled) << on_cpu.why << on_gpu.why;
  // The buckets of DdpOverlapsEarlyBucketsWithBackward: comm 1e-3 + 4 x 120576 bytes / 1 GB/s, of
  // which 3e-4 + 4 x (2 x 13107 + 2613) bytes are exposed.
  const double compute = 26e-3 + 52e-3 + 1e-9 * double(m.total_params());
  const double comm = 10e-4 + 4 * 120576 / 1e9, exposed = 3e-4 + 4 * (2 * 13107 + 2613) / 1e9;
  EXPECT_NEAR(on_gpu.step_s, compute + exposed, 1e-12);
  EXPECT_NEAR(on_cpu.step_s, compute + comm, 1e-12);  // exposed + hidden
  EXPECT_NEAR(on_cpu.compute_s, compute + comm - exposed, 1e-12);
  EXPECT_NEAR(on_cpu.exposed_comm_s, exposed, 1e-12);
}

// zero3 with its defaults on dp=2, micro-batch 4, global batch 8 (one micro-step).
StepQuery zero3_query(const ModelSpec& m) {
  return query("zero3",
               {{"bucket_mb", "25"}, {"prefetch", "1"}, {"overlap", "true"}, {"offload", "none"}},
               m, 2, 1, 4, 8);
}

TEST(Predictor, Zero3CommBoundIsTheSumOfItsSerialCollectives) {
  const ModelSpec m = tiny();
  MachineProfile p = synthetic_profile(m, 4);
  ComputeEntry& e = p.compute[0];
  e = ComputeEntry{e.model, 4, "cpu", "fp32", 1, 2};  // compute free: only the comm stream
  const StepTime t = predict_step_time(p, zero3_query(m));
  ASSERT_TRUE(t.modelled) << t.why;
  // Per unit group g (4 units, 2 shards, fp32): all-gather and reduce-scatter of its padded
  // elements. Forward gathers all 4; backward gathers again the 2 middle groups freed after
  // their forward (the first and last stay gathered); every group reduces once; the norm's
  // all-reduce of 8 bytes.
  const ParamLayout layout(m);
  double expect = 1e-4 + 8 / 1e9;
  for (int u = 0; u < 4; ++u) {
    const double padded = double((layout.units()[u].count + 1) / 2 * 2);
    const int gathers = (u == 1 || u == 2) ? 2 : 1;
    expect += gathers * (1e-4 + 4 * padded / 1e9) + (1e-4 + 4 * padded / 1e9);
  }
  EXPECT_NEAR(t.step_s, expect, 1e-12);
}

TEST(Predictor, Zero3WithFreeCommIsComputePlusTheShardsUpdate) {
  const ModelSpec m = tiny();
  const MachineProfile p = synthetic_profile(m, 4, 0, 1e30);
  const StepTime t = predict_step_time(p, zero3_query(m));
  ASSERT_TRUE(t.modelled) << t.why;
  const ParamLayout layout(m);
  double shard = 0;  // rank 0's chunk of each unit group
  for (const UnitInfo& u : layout.units()) shard += double((u.count + 1) / 2);
  EXPECT_NEAR(t.step_s, 26e-3 + 52e-3 + 1e-9 * shard, 1e-9);
  EXPECT_NEAR(t.exposed_comm_s, 0, 1e-9);
}

TEST(Predictor, Zero3PaysForItsNewBuffers) {
  const ModelSpec m = tiny();
  MachineProfile p = synthetic_profile(m, 4, 0, 1e30);  // comm free
  ComputeEntry& e = p.compute[0];
  e = ComputeEntry{e.model, 4, "cpu", "fp32", 1, 2};  // passes free
  e.fresh_memory_s_per_byte = 1e-9;
  const StepTime t = predict_step_time(p, zero3_query(m));
  ASSERT_TRUE(t.modelled) << t.why;
  // Per group: a gathered buffer each time it is gathered (the 2 middle ones twice), a padded
  // gradient buffer, a reduced chunk; fp32, 1 ns per byte.
  const ParamLayout layout(m);
  double bytes = 0;
  for (int u = 0; u < 4; ++u) {
    const double chunk = double((layout.units()[u].count + 1) / 2);
    bytes += ((u == 1 || u == 2) ? 2 : 1) * 4 * 2 * chunk + 4 * 2 * chunk + 4 * chunk;
  }
  EXPECT_NEAR(t.step_s, 1e-9 * bytes, 1e-12);
}

// ZeRO-Offload on 1 rank with free passes: every group's gradients and fp32 parameters go down
// (8 bytes a parameter at 1 ns/byte), the host's AdamW (1 ns/param) follows each group's copy,
// and the parameters come back (4 bytes) behind the last copy down.
TEST(Predictor, OffloadCopiesAndTheHostsAdamWPipeline) {
  const ModelSpec m = tiny();
  MachineProfile p = synthetic_profile(m, 4, 0, 1e30);
  ComputeEntry& e = p.compute[0];
  e = ComputeEntry{e.model, 4, "cpu", "fp32", 1, 1};
  e.optimizer_s_per_param = 1e-9, e.copy_s_per_byte = 1e-9;
  p.compute.push_back(e);
  p.compute[1].device = "cuda";
  StepQuery cpu = query("zero3",
                        {{"bucket_mb", "25"},
                         {"prefetch", "1"},
                         {"overlap", "true"},
                         {"offload", "optimizer"}},
                        m, 1, 1, 4, 4),
            gpu = cpu;
  gpu.train.device = Device::cuda;
  // Units 20480, 49984, 49984, 128 parameters (V = 120576): the copies down end at 8V, the
  // host's AdamW of the last group at 8V + 128 ns, the copies up (4V) run from 8V behind it:
  // 12V. On the CPU the copy thread also takes the cores the AdamW hides it from: V more.
  const double V = double(m.total_params());
  ASSERT_EQ(V, 120576);
  const StepTime on_gpu = predict_step_time(p, gpu), on_cpu = predict_step_time(p, cpu);
  ASSERT_TRUE(on_gpu.modelled && on_cpu.modelled) << on_gpu.why << on_cpu.why;
  EXPECT_NEAR(on_gpu.step_s, 12 * V * 1e-9, 1e-15);
  EXPECT_NEAR(on_cpu.step_s, 13 * V * 1e-9, 1e-15);
  // A profile without a copy rate (made from runs) has no time model for it.
  for (ComputeEntry& entry : p.compute) entry.copy_s_per_byte = 0;
  const StepTime none = predict_step_time(p, cpu);
  EXPECT_FALSE(none.modelled);
  EXPECT_NE(none.why.find("copy rate"), std::string::npos) << none.why;
}

// The ideal pipeline of tiny with 4 blocks: free transfers, no embedding, head or optimizer time,
// each block's forward 1 ms and backward 2 ms.
ModelSpec four_blocks() {
  ModelSpec m = tiny();
  m.preset = "custom";
  m.layers = 4;
  return m;
}
MachineProfile equal_blocks_profile(const ModelSpec& m) {
  MachineProfile p = synthetic_profile(m, 2, 0, 1e30);  // transfers free
  ComputeEntry& e = p.compute[0];
  e.embedding_forward_s = e.embedding_backward_s = e.head_forward_s = e.head_backward_s = 0;
  e.block_forward_s = 1e-3, e.block_backward_s = 2e-3, e.optimizer_s_per_param = 0;
  return p;
}
// `schedule` on it at pp 2 with 4 micro-batches (2 blocks per stage).
StepTime pipeline_step(const MachineProfile& p, const ModelSpec& m, const char* schedule) {
  return predict_step_time(
      p, query(schedule,
               {{"microbatches", "0"}, {"stage_layers", ""}, {"sp", "off"}, {"dp", "allreduce"}}, m,
               1, 2, 2, 8));
}

TEST(Predictor, OneFOneBBubbleIsTheFormula) {
  const ModelSpec m = four_blocks();
  const MachineProfile p = equal_blocks_profile(m);
  for (const char* s : {"1f1b", "gpipe"}) {
    const StepTime t = pipeline_step(p, m, s);
    ASSERT_TRUE(t.modelled) << t.why;
    // 2 blocks per stage: f = 2 ms, b = 4 ms; step (m + p - 1)(f + b) = 5 x 6 ms.
    EXPECT_NEAR(t.step_s, 30e-3, 1e-12) << s;
    EXPECT_NEAR(t.bubble_s / t.step_s, (2.0 - 1) / (4 + 2 - 1), 1e-12) << s;
  }
}

// zb-h1's and 1f1b's replays on p: zb-h1's step and stages' mean idle time are the schedule
// simulator's with per-stage costs {f, b, w} (free transfers), 1f1b's step 5 x 6 ms.
std::pair<StepTime, StepTime> expect_zb_h1_simulated(const MachineProfile& p, const ModelSpec& m,
                                                     double f, double b, double w) {
  const pp::PipeSimulation sim = pp::simulate_pipeline(pp::PipeSchedule::zb_h1, 2, 4, 1, {f, b, w});
  const StepTime zb = pipeline_step(p, m, "zb-h1"), fb = pipeline_step(p, m, "1f1b");
  EXPECT_TRUE(zb.modelled && fb.modelled) << zb.why << fb.why;
  EXPECT_NEAR(zb.step_s, sim.makespan, 1e-12);
  EXPECT_NEAR(zb.bubble_s, (sim.idle[0] + sim.idle[1]) / 2, 1e-12);
  EXPECT_NEAR(fb.step_s, 30e-3, 1e-12);
  return {zb, fb};
}

// zb-h1's plan replayed: each block's backward split into B and the weight pass W, W the weight
// GEMMs' FLOP share of it (UnitFlops); with free transfers the step and the stages' mean idle
// time are the schedule simulator's with those costs, and both below 1f1b's on the same mesh.
TEST(Predictor, ZeroBubbleH1IsItsSimulationAndBelowOneFOneB) {
  const ModelSpec m = four_blocks();
  const MachineProfile p = equal_blocks_profile(m);
  const UnitFlops flops(m);  // the share from the flops the profile splits passes by
  const double f = 2e-3, b = 4e-3, w = b * (flops.block - flops.attention) / (2 * flops.block);
  EXPECT_NEAR(w, b * m.block_weight_grad_share(), 1e-15);
  ASSERT_GT(w, 0.25 * b);
  const auto [zb, fb] = expect_zb_h1_simulated(p, m, f, b, w);
  EXPECT_LT(zb.step_s, fb.step_s);
  EXPECT_LT(zb.bubble_s / zb.step_s, fb.bubble_s / fb.step_s);
}

// With the split passes --calibrate measured (input 1.4 ms + weight 0.9 ms a block, 15% over its
// unsplit 2 ms backward), zb-h1's replay is the simulation with those: the input pass on the
// critical path as measured, not the FLOP share's. 1f1b keeps the unsplit backward.
TEST(Predictor, ZeroBubbleH1ReplaysTheMeasuredSplitPasses) {
  const ModelSpec m = four_blocks();
  MachineProfile p = equal_blocks_profile(m);
  p.compute[0].block_input_backward_s = 1.4e-3, p.compute[0].block_weight_backward_s = 0.9e-3;
  // 2 blocks per stage
  const StepTime zb = expect_zb_h1_simulated(p, m, 2e-3, 2 * (1.4e-3 + 0.9e-3), 2 * 0.9e-3).first;
  // Not the FLOP share's replay.
  const StepTime by_flops = pipeline_step(equal_blocks_profile(m), m, "zb-h1");
  EXPECT_GT(std::fabs(zb.bubble_s - by_flops.bubble_s), 1e-4);
}

TEST(Predictor, PipelineTransfersDelayEachHop) {
  ModelSpec m = tiny();
  m.layers = 4;
  MachineProfile p = synthetic_profile(m, 2, 0, 1e30);
  ComputeEntry& e = p.compute[0];
  e.embedding_forward_s = e.embedding_backward_s = e.head_forward_s = e.head_backward_s = 0;
  e.block_forward_s = 1e-3, e.block_backward_s = 2e-3, e.optimizer_s_per_param = 0;
  for (CommFit& f : p.comm) f.alpha_s = 0.5e-3;  // every send 0.5 ms
  const StepTime t = predict_step_time(
      p, query("gpipe",
               {{"microbatches", "0"}, {"stage_layers", ""}, {"sp", "off"}, {"dp", "allreduce"}}, m,
               1, 2, 2, 4));  // m = 2
  ASSERT_TRUE(t.modelled) << t.why;
  // GPipe, p 2, m 2, f 2, b 4, x 0.5: stage 1 starts at f + x = 2.5 and runs F0 F1 B0 B1 back to
  // back (F1 arrives at 4.5 = its end of F0): ends 2.5 + 2 + 2 + 4 + 4 = 14.5; stage 0's B1
  // needs stage 1's B1 (14.5) + x, ends 15 + 4 = 19 ms. Then the tied-embedding exchange: stage
  // 1's copy arrived at 15, stage 0's arrives at stage 1 at 19.5; then the norm's all-reduce over
  // pp, 0.5 ms: stage 0 ends at 19.5, stage 1 at 20.
  EXPECT_NEAR(t.step_s, 20e-3, 1e-9);
  // Each stage computes 2 x 2 + 2 x 4 = 12 ms of the 20. Stage 0 idles 7 ms for its inputs and
  // 0.5 at the end; stage 1 2.5 ms for its inputs and 5 for stage 0's tied gradient: both wait
  // for the pipeline (the runs' bubble timer covers the exchange too). The all-reduce is exposed.
  EXPECT_NEAR(t.bubble_s, 7.5e-3, 1e-9);
  EXPECT_NEAR(t.exposed_comm_s, 0.5e-3, 1e-9);
}

TEST(Predictor, TensorParallelismHandComputed) {
  const ModelSpec m = tiny();                        // C 64, T 64; emb, 2 blocks, head
  const MachineProfile p = synthetic_profile(m, 4);  // alpha 100 us, beta 1 GB/s
  StepQuery q = query("tp", {{"sp", "off"}, {"dp", "allreduce"}}, m, 1, 1, 4, 8, 2);  // m = 2
  const StepTime t = predict_step_time(p, q);
  ASSERT_TRUE(t.modelled) << t.why;
  // One [B*T, C] fp32 activation all-reduced: 4 x 64 x 64 x 4 bytes = 65536 -> 165.536 us.
  const double ar = 1e-4 + 65536 / 1e9;
  const double ce = (1e-4 + 1024 / 1e9) + (1e-4 + 2048 / 1e9);  // row max, (sum, target)
  // Forward: emb 1 ms + ar; 2 blocks of 10/2 ms + 2 ar; head 5/2 ms + ce. Backward: emb 2 ms;
  // 2 blocks of 20/2 ms + 2 ar; head 10/2 ms + ar. Then the norm's all-reduce over tp and AdamW
  // over this rank's parameters: half of the 120576, plus half of the 4992 that every tp rank
  // holds whole (wpe 4096; per block 2 LayerNorms, 2 output biases: 384; ln_f 128).
  const double f = 1e-3 + ar + 2 * (5e-3 + 2 * ar) + 2.5e-3 + ce;
  const double b = 2e-3 + 2 * (10e-3 + 2 * ar) + 5e-3 + ar;
  const double norm = 1e-4 + 8 / 1e9, local = (120576 + 4992) / 2;
  EXPECT_NEAR(t.step_s, 2 * (f + b) + norm + 1e-9 * local, 1e-12);
  const double tp_comm = 2 * (10 * ar + ce) + norm;
  EXPECT_NEAR(t.exposed_comm_s, tp_comm, 1e-12);
  EXPECT_NEAR(t.compute_s, t.step_s - tp_comm, 1e-12);
  // A full recompute adds a block forward (10/2 ms) and one all-reduce per block and micro-batch.
  q.train.recompute = Recompute::full;
  EXPECT_NEAR(predict_step_time(p, q).step_s - t.step_s, 2 * 2 * (5e-3 + ar), 1e-12);
}

// A profile with the tp ranks' own passes (--calibrate on a tp mesh) is taken as measured: no
// 1/tp scaling, no all-reduces added (they are inside); a tp 4 query still falls back to tp 1's.
TEST(Predictor, TensorParallelEntryStandsAsMeasured) {
  const ModelSpec m = tiny();
  MachineProfile p = synthetic_profile(m, 4);
  ComputeEntry tp2 = p.compute[0];
  tp2.tp = 2;
  tp2.embedding_forward_s = 3e-3, tp2.block_forward_s = 7e-3, tp2.head_forward_s = 4e-3;
  tp2.embedding_backward_s = 1e-3, tp2.block_backward_s = 13e-3, tp2.head_backward_s = 6e-3;
  p.compute.push_back(tp2);
  StepQuery q = query("tp", {{"sp", "off"}, {"dp", "allreduce"}}, m, 1, 1, 4, 8, 2);  // m = 2
  const StepTime t = predict_step_time(p, q);
  ASSERT_TRUE(t.modelled) << t.why;
  const double f = 3e-3 + 2 * 7e-3 + 4e-3, b = 1e-3 + 2 * 13e-3 + 6e-3;
  const double norm = 1e-4 + 8 / 1e9;  // the norm's all-reduce over tp, as TensorParallelism...
  EXPECT_NEAR(t.step_s, 2 * (f + b) + norm + 1e-9 * (120576 + 4992) / 2, 1e-12);
  // The all-reduces' calibrated times say how much of it is comm.
  const double ar = 1e-4 + 65536 / 1e9, ce = (1e-4 + 1024 / 1e9) + (1e-4 + 2048 / 1e9);
  EXPECT_NEAR(t.exposed_comm_s, 2 * (10 * ar + ce) + norm, 1e-12);
  EXPECT_NE(t.notes.find("the profile's tp 2 passes"), std::string::npos) << t.notes;
  // Another tp takes the tp 1 entry at 1/tp (the tp 2 one says nothing of tp 4's passes).
  q = query("tp", {{"sp", "off"}, {"dp", "allreduce"}}, m, 1, 1, 4, 8, 4);
  EXPECT_NE(predict_step_time(p, q).notes.find("at 1/4 of the profile's time"), std::string::npos);
}

TEST(Predictor, PipelineTimesTensorParallel) {
  ModelSpec m = tiny();
  m.layers = 4;
  MachineProfile p = synthetic_profile(m, 2, 0, 1e30);  // comm free: the compute split is seen
  ComputeEntry& e = p.compute[0];
  e.embedding_forward_s = e.embedding_backward_s = e.head_forward_s = e.head_backward_s = 0;
  e.block_forward_s = 2e-3, e.block_backward_s = 4e-3, e.optimizer_s_per_param = 0;
  p.comm.push_back(CommFit{"all_gather", 2, 1, 0, 1e30, 2, 0});  // pp across the 2 nodes
  p.comm.push_back(CommFit{"all_reduce", 2, 1, 0, 1e30, 2, 0});
  const std::map<std::string, std::string> options{
      {"microbatches", "0"}, {"stage_layers", ""}, {"sp", "off"}, {"dp", "allreduce"}};
  StepQuery q = query("1f1b", options, m, 1, 2, 2, 8, 2, 2);  // pp 2 across 2 nodes, m = 4
  const StepTime t = predict_step_time(p, q);
  ASSERT_TRUE(t.modelled) << t.why;
  // At tp 2 the blocks take 1 / 2 ms: 2 blocks per stage, f = 2, b = 4 ms, (m + p - 1)(f + b) =
  // 5 x 6 ms; at tp 1 twice that.
  EXPECT_NEAR(t.step_s, 30e-3, 1e-12);
  EXPECT_NEAR(t.bubble_s / t.step_s, 1.0 / 5, 1e-12);
  q = query("1f1b", options, m, 1, 2, 2, 8, 1, 2);
  p.compute[0].ranks_per_node = 1;
  EXPECT_NEAR(predict_step_time(p, q).step_s, 60e-3, 1e-12);
}

// Megatron's sequence parallelism: each tp all-reduce of a pass becomes an all-gather and a
// reduce-scatter (here each as long as the all-reduce: the synthetic fits are alike), and the
// replicated tensors' partial gradients are all-reduced over tp after the micro-batches.
TEST(Predictor, SequenceParallelismGathersAndScatters) {
  const ModelSpec m = tiny();
  const MachineProfile p = synthetic_profile(m, 4);
  const StepTime t =
      predict_step_time(p, query("tp", {{"sp", "on"}, {"dp", "allreduce"}}, m, 1, 1, 4, 8, 2));
  ASSERT_TRUE(t.modelled) << t.why;
  const double c = 1e-4 + 65536 / 1e9;  // an all-gather or reduce-scatter of [B*T, C] fp32
  const double ce = (1e-4 + 1024 / 1e9) + (1e-4 + 2048 / 1e9);
  // Forward: emb 1 ms + rs; 2 blocks of 10/2 ms + 2 (ag + rs); head 5/2 ms + ag + ce. Backward:
  // emb 2 ms + ag; 2 blocks of 20/2 ms + 2 (ag + rs); head 10/2 ms + rs.
  const double f = 1e-3 + c + 2 * (5e-3 + 4 * c) + 2.5e-3 + c + ce;
  const double b = 2e-3 + c + 2 * (10e-3 + 4 * c) + 5e-3 + c;
  // The 4992 replicated parameters' gradients (fp32) over tp, the norm, AdamW of 62784.
  const double after = (1e-4 + 4 * 4992 / 1e9) + (1e-4 + 8 / 1e9) + 1e-9 * 62784;
  EXPECT_NEAR(t.step_s, 2 * (f + b) + after, 1e-12);
  EXPECT_NE(t.notes.find("sp:"), std::string::npos) << t.notes;
}

// dp=zero2 and dp=fsdp on the tp plugin's dp axis run on the sharded engine, every unit its own
// shard group; comm-bound (no compute), a step is its collectives one after the other.
TEST(Predictor, TensorParallelsZero2AndFsdpUnitsCommBound) {
  const ModelSpec m = tiny();
  MachineProfile p = synthetic_profile(m, 4);
  ComputeEntry& e = p.compute[0];
  e = ComputeEntry{e.model, 4, "cpu", "fp32", 1, 2};
  const ParamLayout layout(m);
  // Per unit: one all-gather or reduce-scatter of its padded fp32 elements.
  auto unit = [&](int u) { return 1e-4 + 4 * double((layout.units()[u].count + 1) / 2 * 2) / 1e9; };
  double units = 0;
  for (int u = 0; u < layout.num_units(); ++u) units += unit(u);
  const double norm = 1e-4 + 8 / 1e9;
  // fsdp: every unit gathered before its forward and reduced once; gathered again before its
  // backward but the embedding and the head, which stay gathered from forward to backward.
  StepTime t = predict_step_time(p, query("tp", {{"sp", "off"}, {"dp", "fsdp"}}, m, 2, 1, 4, 8));
  ASSERT_TRUE(t.modelled) << t.why;
  EXPECT_NEAR(t.step_s, 3 * units - unit(0) - unit(layout.num_units() - 1) + norm, 1e-12);
  // zero2: reduced once, the updated shards all-gathered after the step.
  t = predict_step_time(p, query("tp", {{"sp", "off"}, {"dp", "zero2"}}, m, 2, 1, 4, 8));
  ASSERT_TRUE(t.modelled) << t.why;
  EXPECT_NEAR(t.step_s, 2 * units + norm, 1e-12);
}

TEST(Predictor, UnplannedStrategiesAndUnknownShapesHaveNoTimeModel) {
  const ModelSpec m = tiny();
  const MachineProfile p = synthetic_profile(m, 4);
  StepTime t;
  // An out-of-tree strategy that does not describe its step (Strategy::plan_step's default).
  struct Unplanned final : Strategy {
    void setup(Context&) override {}
    void train_step(Context&, int) override {}
  };
  TrainSpec train;
  train.micro_batch = 4, train.global_batch = 8;
  t = predict_step_time(
      p, step_query("my-strategy", Unplanned{}, MeshSpec{2, 1, 1, 1, 2}, m, train, 1));
  EXPECT_FALSE(t.modelled);
  EXPECT_NE(t.why.find("'my-strategy' gives no step plan"), std::string::npos) << t.why;
  // A shape the profile never saw.
  ModelSpec other = m;
  other.hidden = 128;
  t = predict_step_time(p, query("ddp", {{"bucket_mb", "25"}}, other, 2, 1, 4, 8));
  EXPECT_FALSE(t.modelled);
  EXPECT_NE(t.why.find("compute entry"), std::string::npos) << t.why;
}

// The bytes per op the core predicts for rank in.rank (plan_comm_bytes of its plan), by op name.
std::map<std::string, double> planned_bytes(const Strategy& s, const PredictInput& in) {
  const StepPlan plan = s.plan_step(in);
  EXPECT_FALSE(plan.empty()) << plan.unmodelled;
  const auto bytes = plan_comm_bytes(plan, in.model, in.train, in.mesh.tp);
  std::map<std::string, double> named;
  for (int op = 0; op < kNumCommOps; ++op)
    if (bytes[op] > 0) named[op_name(CommOp(op))] = bytes[op];
  return named;
}

// Megatron's tensor-parallel volume of one micro-batch through a partition (`blocks` blocks, with
// or without the embedding and the head), written out from its parts: per block 2 activations
// reduced forward and 2 gradients backward (sp: each an all-gather and a reduce-scatter), a full
// recompute's repeat of the attention (sp: its 2 gathers and a reduce-scatter), the embedding's
// output, the head's input gradient, the cross-entropy's 3 fp32 floats per token.
std::map<std::string, double> megatron_tp_bytes(const ModelSpec& m, int B, int blocks,
                                                bool embedding, bool head, bool sp, bool full,
                                                DType dtype) {
  const double N = double(B) * m.seq, E = N * m.hidden * double(dtype_size(dtype));
  const double ce = 3 * N * sizeof(float), again = full ? blocks : 0;
  const double ends = (embedding ? E : 0) + (head ? E : 0);
  std::map<std::string, double> b;
  if (sp) {
    b["all_gather"] = 4 * E * blocks + ends + 2 * E * again;
    b["reduce_scatter"] = 4 * E * blocks + ends + E * again;
    if (head) b["all_reduce"] = ce;
  } else {
    b["all_reduce"] = 4 * E * blocks + ends + (head ? ce : 0) + E * again;
  }
  return b;
}

// tp's predicted bytes are its passes' tensor-parallel collectives (Megatron's volume, per
// micro-batch) plus the step's gradient collectives: the sp all-reduce of the replicated tensors'
// partial gradients, the dp all-reduce and the norm's doubles over dp and tp.
TEST(StepPlan, TpBytesAreMegatronsVolumePerMicroBatch) {
  ModelSpec m = tiny();
  m.preset = "custom", m.layers = 4;
  const auto strategy_sp = installed_strategy("tp", {{"sp", "on"}});
  const auto strategy = installed_strategy("tp", {{"sp", "off"}});
  const MeshSpec dp1_tp2{1, 2, 1, 1, 2};
  for (DType dtype : {DType::f32, DType::bf16})
    for (bool sp : {false, true})
      for (Recompute r : {Recompute::none, Recompute::full}) {
        TrainSpec train;
        train.micro_batch = 2, train.global_batch = 6;  // 3 micro-batches
        train.precision.param = train.precision.tp_comm = dtype;
        train.recompute = r;
        const PredictInput in{dp1_tp2, m, train, 1};
        const auto got = planned_bytes(sp ? *strategy_sp : *strategy, in);
        auto want = megatron_tp_bytes(m, 2, m.layers, true, true, sp, r == Recompute::full, dtype);
        for (auto& [op, b] : want) b *= 3;
        // The step: the norm's double over tp; under sp the replicated tensors' (LayerNorms',
        // biases after a row split, positions') partial gradients, all-reduced over tp.
        double partial = 0;
        for (const LocalTensor& t : StageModel::local_tensors(m, {0, m.layers + 1, 2, 1, sp}))
          if (sp && t.shard == ShardKind::replicated) partial += double(t.count);
        want["all_reduce"] += 8 + partial * state_bytes_per_param(train.precision).grads;
        const std::string label = std::string(dtype_name(dtype)) + (sp ? " sp" : "") +
                                  (r == Recompute::full ? " full recompute" : "");
        EXPECT_EQ(got.size(), want.size()) << label;
        for (const auto& [op, b] : want) EXPECT_NEAR(got.at(op), b, 1e-9 * b) << label << " " << op;
      }
}

// Under a pipeline each stage's plan carries the tp volume of its own partition: 1f1b at pp 2 and
// tp 2 splits 4 blocks 2 + 2, the embedding with stage 0, the head with stage 1.
TEST(StepPlan, PipelineStagesCarryTheirPartitionsTpBytes) {
  ModelSpec m = tiny();
  m.preset = "custom", m.layers = 4;
  const auto strategy = installed_strategy("1f1b", {});
  const MeshSpec tp2_pp2{1, 2, 2, 1, 4};
  TrainSpec train;
  train.micro_batch = 2, train.global_batch = 8;  // 4 micro-batches
  const Mesh mesh(tp2_pp2);
  for (int stage : {0, 1}) {
    const auto got = planned_bytes(*strategy, {tp2_pp2, m, train, mesh.rank_of(0, 1, stage, 0)});
    const auto want = megatron_tp_bytes(m, 2, 2, stage == 0, stage == 1, false, false, DType::f32);
    // The tp volume four times, the norm's doubles over tp and pp.
    EXPECT_NEAR(got.at("all_reduce"), 4 * want.at("all_reduce") + 8 + 8, 1e-6) << stage;
  }
}

TEST(StepPlan, Bf16TpCommHalvesTheActivationBytes) {
  ModelSpec m = tiny();
  m.preset = "custom", m.layers = 4;
  const int B = 2;
  const double N = double(B) * m.seq, ce = 3 * N * sizeof(float);
  const double E = N * m.hidden * sizeof(float);  // one fp32 [N, C] activation
  for (bool sp : {false, true}) {
    const Partition whole{0, m.layers + 1, 2, 0, sp};
    std::map<std::string, double> fp32, bf16;
    for (int u = 0; u <= m.layers + 1; ++u)
      for (bool backward : {false, true})
        for (DType dtype : {DType::f32, DType::bf16})
          for (const PassCollective& c :
               tensor_parallel_collectives(m, B, u, backward, 2, sp, 1, Recompute::none, dtype))
            (dtype == DType::f32 ? fp32 : bf16)[op_name(c.op)] += c.bytes;
    // Per block 4 activations (sp: 4 all-gathers and 4 reduce-scatters), the embedding's and
    // the head's one each.
    const double acts = (4 * m.layers + 2) * E;
    if (sp) {
      EXPECT_EQ(fp32["all_gather"], acts);
      EXPECT_EQ(bf16["all_gather"], acts / 2);
      EXPECT_EQ(bf16["reduce_scatter"], acts / 2);
      EXPECT_EQ(bf16["all_reduce"], ce);
    } else {
      EXPECT_EQ(fp32["all_reduce"], acts + ce);
      EXPECT_EQ(bf16["all_reduce"], acts / 2 + ce);
    }
    EXPECT_EQ(StageModel::tp_comm_buffer_bytes(m, B, whole, DType::f32), 0u);
    EXPECT_EQ(double(StageModel::tp_comm_buffer_bytes(m, B, whole, DType::bf16)),
              E / 2 * (sp ? 1.5 : 1.0));
  }
  // 1f1b at pp 2, 4 micro-batches: each stage sends and receives one [N, C] boundary per
  // micro-batch each way, plus the tied wte's gradient (reduce dtype: fp32) once.
  const MeshSpec pp2{1, 1, 2, 1, 2};
  const auto strategy = installed_strategy("1f1b", {});
  const double wte = double(m.vocab) * m.hidden * sizeof(float);
  for (int rank : {0, 1}) {
    TrainSpec train;
    train.micro_batch = B, train.global_batch = 4 * B;
    const Prediction f = predict(*strategy, {pp2, m, train, rank});
    const auto f_bytes = planned_bytes(*strategy, {pp2, m, train, rank});
    train.precision.param = train.precision.tp_comm = DType::bf16;
    const Prediction h = predict(*strategy, {pp2, m, train, rank});
    const auto h_bytes = planned_bytes(*strategy, {pp2, m, train, rank});
    for (const char* op : {"send", "recv"}) {
      EXPECT_EQ(f_bytes.at(op), 4 * E + wte) << op;
      EXPECT_EQ(h_bytes.at(op), 4 * E / 2 + wte) << op;
    }
    // bf16: the activations cross as they are kept (the bf16 residual stream: no buffer); the
    // fp32 gradients are cast, the first stage's into its receive buffer, the last stage's into
    // a send buffer per slot in flight (1f1b: pp - stage = 1).
    const auto comm_buffers = [](const Prediction& p) {
      return p.memory_bytes[static_cast<int>(MemTag::comm_buffers)];
    };
    EXPECT_EQ(comm_buffers(h) - comm_buffers(f), E / 2) << "rank " << rank;
    // A bf16 run moving fp32 (--tp-comm-dtype fp32): the activations are cast instead, the first
    // stage's into a send buffer per slot in flight (2), the last stage's into its receive buffer.
    train.precision.tp_comm = DType::f32;
    const Prediction w = predict(*strategy, {pp2, m, train, rank});
    EXPECT_EQ(comm_buffers(w) - comm_buffers(f), (2 - rank) * E) << "rank " << rank;
  }
}

}  // namespace
}  // namespace strata
