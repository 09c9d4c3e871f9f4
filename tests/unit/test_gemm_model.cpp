// Compute time by GEMM shape (core/src/predict/gemm_model.hpp): the published roofline with tile
// and wave quantization by hand, the sweep's interpolation, and an entry carried to another shape
// on a synthetic machine that follows the model exactly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "predict/gemm_model.hpp"
#include "predict/profile.hpp"

namespace strata {
namespace {

// 4 SMs of 1 TFLOP/s each, 1 TB/s, 128 x 128 tiles, bf16.
const GemmRoofline kRoofline{4e12, 1e12, 4, 128, 2};

TEST(GemmRoofline, FullWavesRunAtTheRateAndPartialOnesCostAWholeWave) {
  // 512 x 256 outputs: 4 x 2 = 8 tiles, two full waves of 4: exactly the FLOPs at 4 TFLOP/s.
  EXPECT_NEAR(kRoofline.seconds("forward", 512, 256, 1024), 2.0 * 512 * 256 * 1024 / 4e12, 1e-18);
  // One row more: 5 x 2 = 10 tiles, three waves, 1.5x the time for 0.2% more work.
  EXPECT_NEAR(kRoofline.seconds("forward", 513, 256, 1024),
              1.5 * kRoofline.seconds("forward", 512, 256, 1024), 1e-18);
  // k = 1: two bytes per element of in, W and out at 1 TB/s outlast the waves (memory-bound).
  EXPECT_NEAR(kRoofline.seconds("forward", 512, 256, 1), 2.0 * (512 + 256 + 512 * 256) / 1e12,
              1e-20);
  // Backward: d(in)[m,k] over n and d(W)[n,k] over m, each quantized on its own outputs.
  const double d_in = (4 * 32 / 4) * 2.0 * 128 * 128 * 256 / 1e12;  // 4 x 32 tiles, over n
  const double d_w = (2 * 32 / 4) * 2.0 * 128 * 128 * 512 / 1e12;   // 2 x 32 tiles, over m
  EXPECT_NEAR(kRoofline.seconds("backward", 512, 256, 4096), d_in + d_w, 1e-18);
}

GemmSample sample(const char* pass, int m, int n, int k, double gflops) {
  GemmSample s{"cpu", "fp32", 2, 1, pass, m, n, k, 0};
  s.time_s = s.flops() / (gflops * 1e9);
  return s;
}

TEST(GemmSweep, MeasuredShapesKeepTheirTimeAndOthersTakeTheNearestRates) {
  const std::vector<GemmSample> sweep = {sample("forward", 1024, 256, 256, 100),
                                         sample("forward", 1024, 1024, 1024, 200),
                                         sample("backward", 1024, 256, 256, 50)};
  EXPECT_NEAR(sweep_gemm_seconds(sweep, "forward", 1024, 256, 256) / sweep[0].time_s, 1, 1e-12);
  // Half-way in log between the two forward shapes: the rates' geometric mean.
  const double flops = 2.0 * 1024 * 512 * 512;
  EXPECT_NEAR(sweep_gemm_seconds(sweep, "forward", 1024, 512, 512), flops / (std::sqrt(2) * 100e9),
              1e-15);
  // Twice the rows of a measured shape: its rate, so twice its time.
  EXPECT_NEAR(sweep_gemm_seconds(sweep, "backward", 2048, 256, 256), 2 * sweep[2].time_s, 1e-15);
  EXPECT_LT(sweep_gemm_seconds({sweep[0]}, "backward", 1024, 256, 256), 0);
}

TEST(GemmSweep, ShapesBracketTheModelsLinearLayers) {
  ComputeEntry e;
  e.model = model_preset("small");  // h 256, V 4096, T 128
  e.micro_batch = 8;
  const std::vector<GemmSample> shapes = gemm_sweep_shapes(e);
  // Hidden 64, 128, 192, 256, 384; five linears each (qkv, proj, fc, fc proj, head); two passes.
  EXPECT_EQ(shapes.size(), 5u * 5 * 2);
  for (const GemmSample& s : shapes) EXPECT_EQ(s.m, 8 * 128);
  auto has = [&](int n, int k) {
    return std::any_of(shapes.begin(), shapes.end(),
                       [&](const GemmSample& s) { return s.n == n && s.k == k; });
  };
  EXPECT_TRUE(has(3 * 256, 256) && has(256, 4 * 256) && has(4096, 256));
  EXPECT_TRUE(has(3 * 384, 384) && has(64, 4 * 64) && has(4096, 64));
}

// A machine whose passes are their GEMMs by `gemm` plus memory-bound work at 1 ns per activation
// byte (block), per logit (head), per embedding row element: the model of carry_by_gemms.
ComputeEntry machine_entry(const ModelSpec& m, int micro_batch, const GemmSeconds& gemm) {
  ComputeEntry e;
  e.model = m, e.micro_batch = micro_batch;
  const int rows = micro_batch * m.seq;
  auto gemms = [&](const std::vector<Linear>& layers, const char* pass) {
    double t = 0;
    for (const Linear& l : layers) t += gemm(pass, rows, l.n, l.k);
    return t;
  };
  const double act = double(
      predict_activations(m, micro_batch, {1, 1, 1, 0, false}, Recompute::none, DType::f32).slot);
  e.block_forward_s = gemms(block_linears(m), "forward") + 1e-9 * act;
  e.block_backward_s = gemms(block_linears(m), "backward") + 2e-9 * act;
  e.head_forward_s = gemms(head_linears(m), "forward") + 1e-9 * rows * m.vocab;
  e.head_backward_s = gemms(head_linears(m), "backward") + 3e-9 * rows * m.vocab;
  e.embedding_forward_s = 1e-9 * rows * m.hidden, e.embedding_backward_s = 2e-9 * rows * m.hidden;
  e.block_recompute_full_s = e.block_forward_s;
  e.optimizer_s_per_param = 1e-9;
  return e;
}

TEST(CarryByGemms, AMachineThatFollowsTheModelIsPredictedExactly) {
  const GemmSeconds gemm = [](const std::string& pass, int m, int n, int k) {
    return kRoofline.seconds(pass, m, n, k) + 5e-6;  // with a launch cost
  };
  const ModelSpec small = model_preset("small");
  ModelSpec other = small;
  other.preset = "custom", other.hidden = 384, other.layers = 6, other.seq = 96, other.vocab = 1000;
  ComputeEntry carried = machine_entry(small, 8, gemm);
  carry_by_gemms(carried, other, 4, gemm);
  const ComputeEntry own = machine_entry(other, 4, gemm);
  EXPECT_EQ(carried.model.hidden, 384);
  EXPECT_EQ(carried.micro_batch, 4);
  for (auto [a, b] : {std::pair{carried.block_forward_s, own.block_forward_s},
                      {carried.block_backward_s, own.block_backward_s},
                      {carried.head_forward_s, own.head_forward_s},
                      {carried.head_backward_s, own.head_backward_s},
                      {carried.embedding_forward_s, own.embedding_forward_s},
                      {carried.embedding_backward_s, own.embedding_backward_s},
                      {carried.block_recompute_full_s, own.block_recompute_full_s}})
    EXPECT_NEAR(a / b, 1.0, 1e-12);
  EXPECT_EQ(carried.optimizer_s_per_param, 1e-9);
}

TEST(FindCompute, AMeasuredEntryAnswersForOtherShapesOnlyWithASweepOfItsConditions) {
  MachineProfile p;
  p.source = "measured";
  const ModelSpec small = model_preset("small");
  const GemmSeconds gemm = [](const std::string& pass, int m, int n, int k) {
    return kRoofline.seconds(pass, m, n, k);
  };
  ComputeEntry e = machine_entry(small, 8, gemm);
  e.threads = 2, e.ranks_per_node = 1;
  p.compute.push_back(e);
  ModelSpec other = small;
  other.preset = "custom", other.hidden = 384, other.layers = 6;
  std::string how;
  EXPECT_FALSE(find_compute(p, other, 8, "cpu", "fp32", 2, 1, &how));  // no sweep
  for (GemmSample s : gemm_sweep_shapes(e)) {
    s.time_s = gemm(s.pass, s.m, s.n, s.k);
    s.threads = 3;  // measured with another thread count: not this entry's sweep
    p.gemms.push_back(s);
  }
  EXPECT_FALSE(find_compute(p, other, 8, "cpu", "fp32", 2, 1, &how));
  for (GemmSample& s : p.gemms) s.threads = 2;
  const auto carried = find_compute(p, other, 8, "cpu", "fp32", 2, 1, &how);
  ASSERT_TRUE(carried);
  EXPECT_EQ(how, "compute carried from the small entry (h 256, 4 layers) by its GEMM sweep");
  // 384 = 1.5 x 256 is a swept hidden size: the machine is matched to rounding.
  EXPECT_NEAR(carried->block_forward_s / machine_entry(other, 8, gemm).block_forward_s, 1.0, 1e-9);
  // Its own shape still answers as measured.
  EXPECT_EQ(find_compute(p, small, 8, "cpu", "fp32", 2, 1, &how)->block_forward_s,
            e.block_forward_s);
  EXPECT_EQ(how, "");
}

TEST(ProfileFile, KeepsTheSweepAndTheRoofline) {
  MachineProfile p;
  p.source = "published";
  p.gemms = {sample("backward", 1024, 768, 256, 150)};
  p.roofline = kRoofline;
  const auto path = std::filesystem::temp_directory_path() /
                    ("strata-gemm-" + std::to_string(::getpid()) + ".h5");
  write_profile(p, path.string());
  const MachineProfile q = read_profile(path.string());
  std::filesystem::remove(path);
  ASSERT_EQ(q.gemms.size(), 1u);
  EXPECT_TRUE(same_gemm(q.gemms[0], p.gemms[0]));
  EXPECT_DOUBLE_EQ(q.gemms[0].time_s, p.gemms[0].time_s);
  EXPECT_DOUBLE_EQ(q.roofline.flops_per_s, 4e12);
  EXPECT_DOUBLE_EQ(q.roofline.bytes_per_s, 1e12);
  EXPECT_EQ(q.roofline.sms, 4);
  EXPECT_EQ(q.roofline.tile, 128);
}

}  // namespace
}  // namespace strata
