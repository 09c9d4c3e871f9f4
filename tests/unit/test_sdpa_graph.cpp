// What cuDNN's attention graphs compute (cuda/sdpa_graph.hpp), on any machine: each graph is
// evaluated here, operation by operation as cuDNN's backend defines them (bf16 tensors rounded
// when written, fp32 everywhere else), on the packed qkv layout the CUDA backend binds, and
// compared with the CPU's reference attention. cuDNN's acceptance of the same graphs for an H100
// is test_cudnn_sdpa's; their execution on a GPU is test_cudnn_attention's (label gpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "backends/cuda/sdpa_graph.hpp"
#include "backends/kernels.hpp"
#include "strata/types.hpp"

namespace {

using namespace strata;
using namespace strata::cuda;

// The graph's operations on host memory: bound tensors at the caller's pointers, virtual ones in
// buffers of their own (a reshape's output views its input's).
class GraphEvaluator {
 public:
  GraphEvaluator(SdpaGraph graph, std::map<std::int64_t, float*> bound,
                 std::map<std::int64_t, float> scalars)
      : g_(std::move(graph)), base_(g_.tensors.size(), nullptr), scalars_(std::move(scalars)) {
    for (std::size_t i = 0; i < g_.tensors.size(); ++i) {
      const SdpaTensor& t = g_.tensors[i];
      if (t.by_value)
        base_[i] = &scalars_.at(t.uid);
      else if (!t.is_virtual)
        base_[i] = bound.at(t.uid);
    }
  }

  void run() {
    for (const SdpaOp& op : g_.ops) {
      if (op.kind == SdpaOpKind::reshape) {
        base_[op.y] = base_.at(op.x);
        continue;
      }
      if (!base_[op.y]) base_[op.y] = allocate(g_.tensors[op.y]);
      if (op.kind == SdpaOpKind::matmul)
        matmul(op);
      else if (op.kind == SdpaOpKind::pointwise)
        pointwise(op);
      else
        reduce(op);
    }
  }

 private:
  using Index = std::array<std::int64_t, 4>;

  float* allocate(const SdpaTensor& t) {
    std::int64_t n = 1;
    for (int i = 0; i < 4; ++i) n += (t.dims[i] - 1) * t.strides[i];
    owned_.emplace_back(std::size_t(n), 0.0f);
    return owned_.back().data();
  }
  // The element at `at` of tensor i, its size-1 dims broadcast.
  float& at(int i, const Index& at) {
    const SdpaTensor& t = g_.tensors[i];
    std::int64_t off = 0;
    for (int d = 0; d < 4; ++d) off += (t.dims[d] == 1 ? 0 : at[d]) * t.strides[d];
    return base_[i][off];
  }
  void store(int i, const Index& where, float v) {
    at(i, where) = g_.tensors[i].type == SdpaType::bf16 ? to_float(to_bf16(v)) : v;
  }
  template <class F>
  void each(const SdpaTensor& t, F f) {
    Index i{};
    for (i[0] = 0; i[0] < t.dims[0]; ++i[0])
      for (i[1] = 0; i[1] < t.dims[1]; ++i[1])
        for (i[2] = 0; i[2] < t.dims[2]; ++i[2])
          for (i[3] = 0; i[3] < t.dims[3]; ++i[3]) f(i);
  }

  void matmul(const SdpaOp& op) {
    const std::int64_t K = g_.tensors[op.x].dims[3];
    EXPECT_EQ(K, g_.tensors[op.b].dims[2]);
    each(g_.tensors[op.y], [&](const Index& i) {
      float acc = 0;
      for (std::int64_t k = 0; k < K; ++k)
        acc += at(op.x, {i[0], i[1], i[2], k}) * at(op.b, {i[0], i[1], k, i[3]});
      store(op.y, i, acc);
    });
  }
  void pointwise(const SdpaOp& op) {
    each(g_.tensors[op.y], [&](const Index& i) {
      const float x = at(op.x, i), b = op.b >= 0 ? at(op.b, i) : 0.0f;
      float y = 0;
      switch (op.mode) {
        case SdpaPointwise::add:
          y = x + b;
          break;
        case SdpaPointwise::sub:
          y = x - b;
          break;
        case SdpaPointwise::mul:
          y = x * b;
          break;
        case SdpaPointwise::div:
          y = x / b;
          break;
        case SdpaPointwise::exp:
          y = std::exp(x);
          break;
        case SdpaPointwise::log:
          y = std::log(x);
          break;
        case SdpaPointwise::identity:
          y = x;
          break;
        case SdpaPointwise::gen_index:
          y = float(i[op.axis]);
          break;
        case SdpaPointwise::cmp_ge:
          y = x >= b ? 1.0f : 0.0f;
          break;
        case SdpaPointwise::select:
          y = at(op.t, i) != 0 ? x : b;
          break;
      }
      store(op.y, i, y);
    });
  }
  void reduce(const SdpaOp& op) {
    const bool max = op.kind == SdpaOpKind::reduce_max;
    each(g_.tensors[op.y], [&](const Index& i) { at(op.y, i) = max ? -INFINITY : 0.0f; });
    each(g_.tensors[op.x], [&](const Index& i) {
      float& y = at(op.y, i);
      y = max ? std::max(y, at(op.x, i)) : y + at(op.x, i);
    });
  }

  SdpaGraph g_;  // first: base_ is sized from it
  std::vector<float*> base_;
  std::map<std::int64_t, float> scalars_;
  std::vector<std::vector<float>> owned_;
};

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

  // The forward's tensors, which the backward reads too (its bf16 out, as the CUDA backend binds
  // it).
  std::vector<float> o(out.size()), stats(std::size_t(B) * NH * T);
  std::map<std::int64_t, float*> bound = {{kSdpaQ, qkv.data()},
                                          {kSdpaK, qkv.data() + C},
                                          {kSdpaV, qkv.data() + 2 * C},
                                          {kSdpaO, o.data()},
                                          {kSdpaStats, stats.data()}};
  GraphEvaluator forward(sdpa_forward_graph(s), bound, scalars);
  forward.run();
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

  std::vector<float> grads(qkv.size(), 0.0f), delta(stats.size()), dq_accum(out.size());
  bound.insert({{kSdpaDO, dout.data()},
                {kSdpaDQ, grads.data()},
                {kSdpaDK, grads.data() + C},
                {kSdpaDV, grads.data() + 2 * C},
                {kSdpaRowDelta, delta.data()},
                {kSdpaDQAccum, dq_accum.data()}});
  GraphEvaluator backward(sdpa_backward_graph(s), bound, scalars);
  backward.run();
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
