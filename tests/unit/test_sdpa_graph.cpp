// What cuDNN's attention graphs compute (cuda/sdpa_graph.hpp), on any machine: each graph is
// evaluated (cudnn_standin/sdpa_evaluator.hpp: operation by operation as cuDNN's backend defines
// them, bf16 tensors rounded when written, fp32 everywhere else) on bf16 memory in the packed qkv
// layout the CUDA backend binds, and compared with the CPU's reference attention. cuDNN's
// acceptance of the same graphs for an H100 is test_cudnn_sdpa's; their execution is
// CudaTcAttention.CudnnForwardLseAndBackward's (on a GPU, and as emu.* on the cuDNN stand-in).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "backends/cuda/sdpa_graph.hpp"
#include "backends/kernels.hpp"
#include "cudnn_standin/sdpa_evaluator.hpp"
#include "strata/types.hpp"

namespace {

using namespace strata;
using namespace strata::cuda;
using strata::cudnn_standin::SdpaEvaluator;

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}
// max |a - b| over the largest |b|: the error relative to the tensor's scale.
double scaled_error(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, double(std::abs(a[i] - b[i])));
  return e / max_abs(b);
}

std::vector<bf16> to_bf16_vector(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = to_bf16(v[i]);
  return out;
}
std::vector<float> to_float_vector(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = to_float(v[i]);
  return out;
}

std::vector<float> bf16_values(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = to_float(to_bf16(u(rng)));
  return v;
}

// Forward and backward of one shape against the CPU's attention (fp32 arithmetic on the same bf16
// inputs). The bound is 2^-6 of each tensor's largest value: the graph rounds P, O and the
// gradients to bf16 (2^-9 relative each) and accumulates in fp32.
void check_shape(const SdpaShape& s) {
  const int B = s.B, T = s.T, NH = s.NH, C = s.NH * s.hs;
  std::mt19937 rng(7);
  std::vector<float> qkv = bf16_values(std::size_t(B) * T * 3 * C, rng);
  std::vector<float> dout = bf16_values(std::size_t(B) * T * C, rng);
  const std::map<std::int64_t, float> scalars = {{kSdpaScale, 1.0f / std::sqrt(float(s.hs))},
                                                 {kSdpaMaskFill, sdpa_mask_fill()},
                                                 {kSdpaOne, 1.0f}};

  // The CPU reference: out, and dqkv from dout.
  std::vector<float> out(std::size_t(B) * T * C), probs(std::size_t(B) * NH * T * T);
  std::vector<float> dqkv(qkv.size(), 0.0f), scratch(probs.size());
  Kernels& cpu = cpu_kernels();
  cpu.attention_forward(out.data(), probs.data(), qkv.data(), B, T, C, NH);
  cpu.attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), probs.data(),
                         out.data(), B, T, C, NH);

  // The forward's tensors in the memory the CUDA backend binds (bf16 activations), which the
  // backward reads too.
  std::vector<bf16> qkv16 = to_bf16_vector(qkv), dout16 = to_bf16_vector(dout), o16(out.size());
  std::vector<float> stats(std::size_t(B) * NH * T);
  std::map<std::int64_t, void*> bound = {{kSdpaQ, qkv16.data()},
                                         {kSdpaK, qkv16.data() + C},
                                         {kSdpaV, qkv16.data() + 2 * C},
                                         {kSdpaO, o16.data()},
                                         {kSdpaStats, stats.data()}};
  SdpaEvaluator(sdpa_forward_graph(s), bound, scalars).run();
  const std::vector<float> o = to_float_vector(o16);
  const double o_error = scaled_error(o, out);
  EXPECT_LT(o_error, 1.0 / 64) << "out";

  // The log-sum-exp of each row's visible scores, in double.
  double lse_error = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        double sum = 0;
        const float* q = &qkv[(std::size_t(b) * T + t) * 3 * C + h * s.hs];
        for (int u = 0; u <= t; ++u) {
          const float* k = &qkv[(std::size_t(b) * T + u) * 3 * C + C + h * s.hs];
          double dot = 0;
          for (int d = 0; d < s.hs; ++d) dot += double(q[d]) * k[d];
          sum += std::exp(dot / std::sqrt(double(s.hs)));
        }
        const double want = std::log(sum);
        lse_error = std::max(lse_error, std::abs(stats[(std::size_t(b) * NH + h) * T + t] - want) /
                                            (1 + std::abs(want)));
      }
  EXPECT_LT(lse_error, 1e-5) << "lse";

  std::vector<bf16> grads16(qkv.size());
  std::vector<float> delta(stats.size()), dq_accum(out.size(), 0.0f);  // zeroed, as cuDNN needs
  bound.insert({{kSdpaDO, dout16.data()},
                {kSdpaDQ, grads16.data()},
                {kSdpaDK, grads16.data() + C},
                {kSdpaDV, grads16.data() + 2 * C},
                {kSdpaRowDelta, delta.data()},
                {kSdpaDQAccum, dq_accum.data()}});
  SdpaEvaluator(sdpa_backward_graph(s), bound, scalars).run();
  const std::vector<float> grads = to_float_vector(grads16);
  // Each third of the gradient rows against the CPU's.
  const char* names[3] = {"dq", "dk", "dv"};
  for (int part = 0; part < 3; ++part) {
    std::vector<float> got, want;
    for (std::size_t row = 0; row < std::size_t(B) * T; ++row)
      for (int c = 0; c < C; ++c) {
        got.push_back(grads[row * 3 * C + part * C + c]);
        want.push_back(dqkv[row * 3 * C + part * C + c]);
      }
    const double error = scaled_error(got, want);
    EXPECT_LT(error, 1.0 / 64) << names[part];
    ::testing::Test::RecordProperty(names[part], std::to_string(error * 64));
    std::printf("%s %.3f of the bound\n", names[part], error * 64);
  }
  std::printf("out %.3f of the bound, lse %.3f\n", o_error * 64, lse_error * 1e5);
}

TEST(SdpaGraph, ComputesTheCpuAttentionHeadSize16OddLength) { check_shape({2, 37, 3, 16}); }
TEST(SdpaGraph, ComputesTheCpuAttentionHeadSize64) { check_shape({1, 33, 2, 64}); }
TEST(SdpaGraph, ComputesTheCpuAttentionHeadSize128) { check_shape({1, 20, 2, 128}); }

}  // namespace
