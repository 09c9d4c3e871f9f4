// CPU layer passes: forward values against naive double-precision references, and every backward
// against central finite differences of a scalar objective J = sum(out * R) (R fixed random),
// accumulated in double.
//
// Tolerances (fp32 kernels): a central difference with step h has truncation error O(h^2 f''')
// and rounding error about sqrt(#outputs) * 6e-8 * |J terms| / h. With inputs O(1) and h = 1e-2
// both stay below 1e-4; the observed relative 2-norm errors are 2e-7 .. 3e-5. Each gradient
// element must satisfy |fd - analytic| <= 5e-4 + 5e-3 |fd|, and the whole gradient must agree in
// relative 2-norm to 1e-3. A wrong sign, a missing term or a wrong factor gives errors of order
// 1e-1 .. 1, far outside both (checked by mutating the kernels).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <numbers>
#include <random>
#include <vector>

#include "backends/cpu/layers.hpp"
#include "backends/cpu/vecmath.hpp"
#include "random_inputs.hpp"

namespace cpu = strata::cpu;

namespace {

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

// Checks `analytic` (d objective / d x) against central differences of `objective`, which must
// recompute the forward from the current contents of x.
void check_gradient(const char* what, std::vector<float>& x, const std::vector<float>& analytic,
                    const std::function<double()>& objective, float h = 1e-2f, double atol = 5e-4,
                    double rtol = 5e-3) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  double err2 = 0.0, ref2 = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float x0 = x[i];
    const float xp = x0 + h, xm = x0 - h;
    x[i] = xp;
    const double fp = objective();
    x[i] = xm;
    const double fm = objective();
    x[i] = x0;
    const double fd = (fp - fm) / (double(xp) - double(xm));
    EXPECT_NEAR(analytic[i], fd, atol + rtol * std::fabs(fd)) << what << " element " << i;
    err2 += (analytic[i] - fd) * (analytic[i] - fd);
    ref2 += fd * fd;
  }
  EXPECT_LE(std::sqrt(err2), 1e-3 * std::sqrt(ref2) + 1e-7) << what << ": relative 2-norm error";
}

// The += convention: backward adds to what is there. Buffers start at this value, and the
// analytic gradient is (result - kPrefill).
constexpr float kPrefill = 0.25f;

std::vector<float> minus_prefill(std::vector<float> v) {
  for (auto& x : v) x -= kPrefill;
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST(Encoder, ForwardGathersTokenAndPositionRows) {
  const int B = 2, T = 3, C = 4, V = 5;
  const std::vector<std::int32_t> tok = {1, 4, 1, 0, 1, 3};
  auto wte = random_floats(V * C, 1), wpe = random_floats(T * C, 2);
  std::vector<float> out(B * T * C);
  cpu::encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        EXPECT_FLOAT_EQ(out[(b * T + t) * C + c], wte[tok[b * T + t] * C + c] + wpe[t * C + c]);
}

TEST(Encoder, BackwardMatchesFiniteDifferences) {
  const int B = 2, T = 3, C = 4, V = 5;
  const std::vector<std::int32_t> tok = {1, 4, 1, 0, 1, 3};  // token 1 repeats: scatter-add
  auto wte = random_floats(V * C, 1), wpe = random_floats(T * C, 2),
       R = random_floats(B * T * C, 3);
  std::vector<float> out(B * T * C);
  auto J = [&] {
    cpu::encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out, R);
  };
  std::vector<float> dwte(V * C, kPrefill), dwpe(T * C, kPrefill);
  cpu::encoder_backward(dwte.data(), dwpe.data(), R.data(), tok.data(), B, T, C);
  check_gradient("dwte", wte, minus_prefill(dwte), J);
  check_gradient("dwpe", wpe, minus_prefill(dwpe), J);
  // Token 2 never occurs: its row gets nothing.
  for (int c = 0; c < C; ++c) EXPECT_EQ(dwte[2 * C + c], kPrefill);
}

// ---------------------------------------------------------------------------------------------

TEST(LayerNorm, ForwardNormalises) {
  const int N = 3, C = 16;
  auto x = random_floats(N * C, 4, -3.0f, 5.0f), w = random_floats(C, 5), b = random_floats(C, 6);
  std::vector<float> out(N * C), mean(N), rstd(N);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    const double s = 1.0 / std::sqrt(v + 1e-5);
    EXPECT_NEAR(mean[n], m, 1e-5);
    EXPECT_NEAR(rstd[n], s, 1e-5 * s);
    for (int c = 0; c < C; ++c)
      EXPECT_NEAR(out[n * C + c], (x[n * C + c] - m) * s * w[c] + b[c], 1e-5);
  }
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  const int N = 3, C = 8;
  auto x = random_floats(N * C, 7, -2.0f, 2.0f), w = random_floats(C, 8, 0.5f, 1.5f),
       b = random_floats(C, 9), R = random_floats(N * C, 10);
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto J = [&] {
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                           C);
    return dot(out, R);
  };
  J();
  std::vector<float> dx(N * C, kPrefill), dw(C, kPrefill), db(C, kPrefill);
  cpu::layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
  check_gradient("dinp", x, minus_prefill(dx), J);
  check_gradient("dweight", w, minus_prefill(dw), J);
  check_gradient("dbias", b, minus_prefill(db), J);
}

// ---------------------------------------------------------------------------------------------

// The Llama block's layers (RMSNorm, SwiGLU, rotary position embedding).

TEST(RmsNorm, ForwardScalesByTheRootMeanSquare) {
  const int N = 3, C = 16;
  auto x = random_floats(N * C, 40, -3.0f, 5.0f), w = random_floats(C, 41);
  std::vector<float> out(N * C), rstd(N);
  cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C);
  for (int n = 0; n < N; ++n) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += double(x[n * C + c]) * x[n * C + c];
    const double s = 1.0 / std::sqrt(ss / C + 1e-5);
    EXPECT_NEAR(rstd[n], s, 1e-5 * s);
    for (int c = 0; c < C; ++c) EXPECT_NEAR(out[n * C + c], x[n * C + c] * s * w[c], 1e-5);
  }
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  const int N = 3, C = 8;
  auto x = random_floats(N * C, 42, -2.0f, 2.0f), w = random_floats(C, 43, 0.5f, 1.5f),
       R = random_floats(N * C, 44);
  std::vector<float> out(N * C), rstd(N);
  auto J = [&] {
    cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C);
    return dot(out, R);
  };
  J();
  std::vector<float> dx(N * C, kPrefill), dw(C, kPrefill);
  cpu::rmsnorm_backward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
  check_gradient("dinp", x, minus_prefill(dx), J);
  check_gradient("dweight", w, minus_prefill(dw), J);
}

TEST(SwiGlu, ForwardAndBackward) {
  const int N = 3, F = 5;
  auto gu = random_floats(N * 2 * F, 45, -3.0f, 3.0f), R = random_floats(N * F, 46);
  std::vector<float> out(N * F);
  auto J = [&] {
    cpu::swiglu_forward(out.data(), gu.data(), N, F);
    return dot(out, R);
  };
  J();
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < F; ++i) {
      const double g = gu[n * 2 * F + i], u = gu[n * 2 * F + F + i];
      EXPECT_NEAR(out[n * F + i], g / (1 + std::exp(-g)) * u, 1e-6) << n << " " << i;
    }
  std::vector<float> dgu(N * 2 * F, kPrefill);
  cpu::swiglu_backward(dgu.data(), gu.data(), R.data(), N, F);
  check_gradient("dgu", gu, minus_prefill(dgu), J);
}

// Pairs turn by pos * theta^(-2i/hs): a turn keeps each pair's length, position 0 is the identity,
// the backward is the transpose (finite differences) and undoes the forward.
TEST(Rope, TurnsPairsByPositionAndBackwardIsTheTranspose) {
  const int T = 5, hs = 8, heads = 2, N = 7, stride = 19, row0 = 3;  // rows wrap past T
  std::vector<float> table(T * hs);
  cpu::rope_table(table.data(), T, hs, 10000.0);
  auto x = random_floats(N * stride, 47, -2.0f, 2.0f), R = random_floats(N * stride, 48);
  const std::vector<float> x0 = x;
  std::vector<float> y;
  auto J = [&] {
    y = x;
    cpu::rope_forward(y.data(), table.data(), N, T, row0, heads, hs, stride);
    return dot(y, R);
  };
  J();
  for (int n = 0; n < N; ++n) {
    const int pos = (row0 + n) % T;
    for (int c = 0; c < stride; ++c) {
      const std::size_t at = std::size_t(n) * stride + c;
      if (c >= heads * hs) {
        EXPECT_EQ(y[at], x0[at]) << "column " << c << " is not a head's";
        continue;
      }
      if (c % 2) continue;
      const int i = (c % hs) / 2;
      const double angle = pos * std::pow(10000.0, -2.0 * i / hs);
      EXPECT_NEAR(y[at], x0[at] * std::cos(angle) - x0[at + 1] * std::sin(angle), 1e-5);
      EXPECT_NEAR(y[at + 1], x0[at] * std::sin(angle) + x0[at + 1] * std::cos(angle), 1e-5);
    }
  }
  std::vector<float> dx = R;
  cpu::rope_backward(dx.data(), table.data(), N, T, row0, heads, hs, stride);
  check_gradient("dx", x, dx, J);
  J();  // y of x0 again (the differences left y of a perturbed x)
  std::vector<float> back = y;
  cpu::rope_backward(back.data(), table.data(), N, T, row0, heads, hs, stride);
  for (std::size_t i = 0; i < back.size(); ++i) EXPECT_NEAR(back[i], x0[i], 1e-5);
}

class Matmul : public ::testing::TestWithParam<bool> {};  // parameter: with bias

TEST_P(Matmul, ForwardMatchesReference) {
  const bool with_bias = GetParam();
  const int N = 5, C = 7, OC = 6;
  auto x = random_floats(N * C, 11), w = random_floats(OC * C, 12), b = random_floats(OC, 13);
  std::vector<float> out(N * OC, 99.0f);  // overwritten, not accumulated
  cpu::matmul_forward(out.data(), x.data(), w.data(), with_bias ? b.data() : nullptr, N, C, OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double ref = with_bias ? b[o] : 0.0;
      for (int c = 0; c < C; ++c) ref += double(x[n * C + c]) * w[o * C + c];
      EXPECT_NEAR(out[n * OC + o], ref, 1e-5);
    }
}

TEST_P(Matmul, BackwardMatchesFiniteDifferences) {
  const bool with_bias = GetParam();
  const int N = 4, C = 5, OC = 3;
  auto x = random_floats(N * C, 14), w = random_floats(OC * C, 15), b = random_floats(OC, 16),
       R = random_floats(N * OC, 17);
  std::vector<float> out(N * OC);
  auto J = [&] {
    cpu::matmul_forward(out.data(), x.data(), w.data(), with_bias ? b.data() : nullptr, N, C, OC);
    return dot(out, R);
  };
  std::vector<float> dx(N * C, kPrefill), dw(OC * C, kPrefill), db(OC, kPrefill);
  cpu::matmul_backward(dx.data(), dw.data(), with_bias ? db.data() : nullptr, R.data(), x.data(),
                       w.data(), N, C, OC);
  check_gradient("dinp", x, minus_prefill(dx), J);
  check_gradient("dweight", w, minus_prefill(dw), J);
  if (with_bias) {
    check_gradient("dbias", b, minus_prefill(db), J);
  } else {
    for (float v : db) EXPECT_EQ(v, kPrefill);  // untouched when dbias is null
  }
}

// Shapes beyond one GEMM block (1024 rows of C, see kGemmBlock in layers.cpp): every block, the
// partial last ones included, lands where it belongs, in forward and both gradients.
TEST(MatmulBlocks, LargerThanOneGemmBlockMatchesReference) {
  const int N = 2100, C = 9, OC = 1100;  // forward and dinp: 3 blocks of rows; dweight: 2
  auto x = random_floats(std::size_t(N) * C, 21), w = random_floats(std::size_t(OC) * C, 22),
       b = random_floats(OC, 23), R = random_floats(std::size_t(N) * OC, 24);
  std::vector<float> out(std::size_t(N) * OC);
  cpu::matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
  std::vector<float> dx(std::size_t(N) * C, kPrefill), dw(std::size_t(OC) * C, kPrefill);
  cpu::matmul_backward(dx.data(), dw.data(), nullptr, R.data(), x.data(), w.data(), N, C, OC);
  std::vector<double> dx_ref(dx.size(), kPrefill), dw_ref(dw.size(), kPrefill);
  int wrong = 0;
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      const std::size_t i = std::size_t(n) * OC + o;
      double ref = b[o];
      for (int c = 0; c < C; ++c) {
        ref += double(x[std::size_t(n) * C + c]) * w[std::size_t(o) * C + c];
        dx_ref[std::size_t(n) * C + c] += double(R[i]) * w[std::size_t(o) * C + c];
        dw_ref[std::size_t(o) * C + c] += double(R[i]) * x[std::size_t(n) * C + c];
      }
      wrong += std::fabs(out[i] - ref) > 1e-5;
    }
  EXPECT_EQ(wrong, 0) << "forward elements off by more than 1e-5";
  // Sums over N = 2100 or OC = 1100 products of O(1) terms: fp32 error ~ sqrt(K) * 6e-8 * O(1).
  for (std::size_t i = 0; i < dx.size(); ++i) wrong += std::fabs(dx[i] - dx_ref[i]) > 1e-4;
  EXPECT_EQ(wrong, 0) << "dinp elements off by more than 1e-4";
  for (std::size_t i = 0; i < dw.size(); ++i) wrong += std::fabs(dw[i] - dw_ref[i]) > 1e-4;
  EXPECT_EQ(wrong, 0) << "dweight elements off by more than 1e-4";
}

INSTANTIATE_TEST_SUITE_P(Bias, Matmul, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "WithBias" : "NoBias"; });

// ---------------------------------------------------------------------------------------------

namespace {

// Naive causal attention in double, the reference for attention_forward.
std::vector<double> attention_reference(const std::vector<float>& qkv, int B, int T, int C,
                                        int NH) {
  const int hs = C / NH;
  std::vector<double> out(std::size_t(B) * T * C);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const float* q = &qkv[(b * T + t) * 3 * C + h * hs];
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          const float* k = &qkv[(b * T + j) * 3 * C + C + h * hs];
          double d = 0;
          for (int i = 0; i < hs; ++i) d += double(q[i]) * k[i];
          s[j] = d / std::sqrt(double(hs));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (int i = 0; i < hs; ++i) {
          double o = 0;
          for (int j = 0; j <= t; ++j)
            o += s[j] / sum * qkv[(b * T + j) * 3 * C + 2 * C + h * hs + i];
          out[(b * T + t) * C + h * hs + i] = o;
        }
      }
  return out;
}

}  // namespace

TEST(Attention, ForwardMatchesReferenceAndIsCausal) {
  const int B = 2, T = 6, C = 8, NH = 2;
  auto qkv = random_floats(B * T * 3 * C, 18, -1.5f, 1.5f);
  std::vector<float> out(B * T * C), att(B * NH * T * T, 7.0f);
  cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  const auto ref = attention_reference(qkv, B, T, C, NH);
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], ref[i], 2e-6) << i;
  for (int bh = 0; bh < B * NH; ++bh)
    for (int t = 0; t < T; ++t) {
      double sum = 0;
      for (int j = 0; j < T; ++j) {
        const float p = att[(bh * T + t) * T + j];
        if (j > t) {
          EXPECT_EQ(p, 0.0f) << "future position " << j << " of row " << t;
        } else {
          EXPECT_GT(p, 0.0f);
        }
        sum += p;
      }
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
}

TEST(Attention, FutureKeysAndValuesDoNotChangeEarlierOutputs) {
  const int B = 2, T = 7, C = 8, NH = 2, tf = 4;  // perturb position tf of batch row 1
  auto qkv = random_floats(B * T * 3 * C, 19);
  std::vector<float> out0(B * T * C), out1(B * T * C), att(B * NH * T * T);
  cpu::attention_forward(out0.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int i = C; i < 3 * C; ++i) qkv[(1 * T + tf) * 3 * C + i] += 0.75f;  // its k and v
  cpu::attention_forward(out1.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      bool changed = false;
      for (int c = 0; c < C; ++c) changed |= out0[(b * T + t) * C + c] != out1[(b * T + t) * C + c];
      const bool expect_change = (b == 1 && t >= tf);
      EXPECT_EQ(changed, expect_change) << "b " << b << " t " << t;
    }
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  const int B = 2, T = 5, C = 8, NH = 2;
  auto qkv = random_floats(B * T * 3 * C, 20), R = random_floats(B * T * C, 21);
  std::vector<float> out(B * T * C), att(B * NH * T * T), datt(B * NH * T * T);
  auto J = [&] {
    cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return dot(out, R);
  };
  J();
  std::vector<float> dqkv(B * T * 3 * C, kPrefill);
  cpu::attention_backward(dqkv.data(), datt.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
  check_gradient("dqkv", qkv, minus_prefill(dqkv), J);
}

// Ring attention's blocks: cp = 2 ranks with zig-zag chunks (rank 0 positions 0-3 and 12-15,
// rank 1 4-11) and grouped-query heads (4 query heads on 2 K/V heads). Each rank's queries merged
// over both ranks' key-value blocks, in ring order, give the whole-sequence attention's rows, and
// the blocks' backwards its gradients (a K/V head's: the sum over the query heads reading it).
TEST(Attention, RingBlocksMergeIntoTheWholeSequenceAttention) {
  const int B = 2, T = 16, NH = 4, KV = 2, hs = 4, C = NH * hs, cp = 2, Tr = T / cp, chunk = 4;
  const int KVC = 2 * KV * hs;
  auto kv_heads = random_floats(B * T * KVC, 60, -1.5f, 1.5f), q = random_floats(B * T * C, 61);
  std::vector<float> qkv(B * T * 3 * C);  // the whole sequences, K/V repeated per query head
  for (int n = 0; n < B * T; ++n)
    for (int h = 0; h < NH; ++h)
      for (int c = 0; c < hs; ++c) {
        qkv[n * 3 * C + h * hs + c] = q[n * C + h * hs + c];
        for (int s = 0; s < 2; ++s)
          qkv[n * 3 * C + (1 + s) * C + h * hs + c] = kv_heads[n * KVC + (s * KV + h / 2) * hs + c];
      }
  std::vector<float> out(B * T * C), att(B * NH * T * T), datt(att.size());
  cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  const auto dout = random_floats(B * T * C, 62);
  std::vector<float> dqkv(qkv.size(), 0.0f);
  cpu::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), B, T, C,
                          NH);
  // Rank r's rows of a [B, T, width] tensor, at its positions.
  std::vector<std::vector<int>> pos(cp);
  for (int r = 0; r < cp; ++r)
    for (int t = 0; t < Tr; ++t)
      pos[r].push_back(t < chunk ? r * chunk + t : (2 * cp - 1 - r) * chunk + t - chunk);
  auto rows = [&](const std::vector<float>& x, int width, int r) {
    std::vector<float> y;
    for (int b = 0; b < B; ++b)
      for (int t : pos[r]) {
        const float* row = x.data() + std::size_t(b * T + t) * width;
        y.insert(y.end(), row, row + width);
      }
    return y;
  };
  std::vector<std::vector<float>> dkv(cp, std::vector<float>(B * Tr * KVC, 0.0f));
  for (int r = 0; r < cp; ++r) {
    const auto qr = rows(q, C, r), doutr = rows(dout, C, r);
    std::vector<float> o(B * Tr * C, 7.0f), lse(B * NH * Tr, 7.0f), dq(B * Tr * C, 0.0f);
    for (int s = 0; s < cp; ++s) {
      const int owner = (r - s + cp) % cp;
      cpu::attention_block_forward(o.data(), lse.data(), qr.data(), C,
                                   rows(kv_heads, KVC, owner).data(), B, Tr, Tr, NH, KV, hs,
                                   pos[r].data(), pos[owner].data(), s == 0);
    }
    const auto want = rows(out, C, r);
    for (std::size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(o[i], want[i], 1e-5) << r << " " << i;
    for (int s = 0; s < cp; ++s) {
      const int owner = (r - s + cp) % cp;
      cpu::attention_block_backward(dq.data(), C, dkv[owner].data(), doutr.data(), o.data(),
                                    lse.data(), qr.data(), C, rows(kv_heads, KVC, owner).data(), B,
                                    Tr, Tr, NH, KV, hs, pos[r].data(), pos[owner].data());
    }
    const auto dqkv_r = rows(dqkv, 3 * C, r);
    for (int n = 0; n < B * Tr; ++n)
      for (int i = 0; i < C; ++i) ASSERT_NEAR(dq[n * C + i], dqkv_r[n * 3 * C + i], 1e-5) << n;
  }
  for (int r = 0; r < cp; ++r) {
    const auto dqkv_r = rows(dqkv, 3 * C, r);
    for (int n = 0; n < B * Tr; ++n)
      for (int s = 0; s < 2; ++s)
        for (int g = 0; g < KV; ++g)
          for (int c = 0; c < hs; ++c) {
            const float* d = &dqkv_r[n * 3 * C + (1 + s) * C];
            const double want = d[(2 * g) * hs + c] + d[(2 * g + 1) * hs + c];
            ASSERT_NEAR(dkv[r][n * KVC + (s * KV + g) * hs + c], want, 1e-5) << r << " " << n;
          }
  }
}

// ---------------------------------------------------------------------------------------------

TEST(Gelu, ForwardMatchesTanhFormula) {
  auto x = random_floats(257, 22, -6.0f, 6.0f);
  x.push_back(0.0f);
  x.push_back(-20.0f);
  x.push_back(20.0f);
  std::vector<float> out(x.size());
  cpu::gelu_forward(out.data(), x.data(), std::int64_t(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    const double ref =
        0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(out[i], ref, 1e-6 + 1e-6 * std::fabs(ref)) << "x = " << v;
  }
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  auto x = random_floats(67, 23, -4.0f, 4.0f), R = random_floats(67, 24);
  std::vector<float> out(x.size());
  auto J = [&] {
    cpu::gelu_forward(out.data(), x.data(), std::int64_t(x.size()));
    return dot(out, R);
  };
  std::vector<float> dx(x.size(), kPrefill);
  cpu::gelu_backward(dx.data(), x.data(), R.data(), std::int64_t(x.size()));
  check_gradient("dinp", x, minus_prefill(dx), J);
}

TEST(Residual, ForwardAddsAndGradientIsIdentity) {
  const int n = 37;
  auto a = random_floats(n, 25), b = random_floats(n, 26), R = random_floats(n, 27);
  std::vector<float> out(n);
  auto J = [&] {
    cpu::residual_forward(out.data(), a.data(), b.data(), n);
    return dot(out, R);
  };
  J();
  for (int i = 0; i < n; ++i) EXPECT_EQ(out[i], a[i] + b[i]);
  // d(out)/d(a) = d(out)/d(b) = identity, so both gradients are R.
  check_gradient("da", a, R, J);
  check_gradient("db", b, R, J);
  // In place (out aliasing an input), as the model uses it.
  std::vector<float> c = a;
  cpu::residual_forward(c.data(), c.data(), b.data(), n);
  for (int i = 0; i < n; ++i) EXPECT_EQ(c[i], a[i] + b[i]);
}

// ---------------------------------------------------------------------------------------------

TEST(SoftmaxCrossEntropy, ForwardMatchesReference) {
  const int N = 4, V = 37;
  auto logits = random_floats(N * V, 28, -8.0f, 8.0f);
  logits[5] = 60.0f;  // large logits must not overflow (max subtraction)
  const std::vector<std::int32_t> tgt = {0, 36, 5, 17};
  std::vector<float> probs(N * V), losses(N);
  cpu::softmax_crossentropy_forward(probs.data(), losses.data(), logits.data(), tgt.data(), N, V);
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, sum = 0;
    for (int v = 0; v < V; ++v) mx = std::max(mx, double(logits[n * V + v]));
    for (int v = 0; v < V; ++v) sum += std::exp(logits[n * V + v] - mx);
    double psum = 0;
    for (int v = 0; v < V; ++v) {
      const double p = std::exp(logits[n * V + v] - mx) / sum;
      EXPECT_NEAR(probs[n * V + v], p, 1e-6 + 2e-6 * p);
      psum += probs[n * V + v];
    }
    EXPECT_NEAR(psum, 1.0, 1e-5);
    const double loss = std::log(sum) + mx - logits[n * V + tgt[n]];
    EXPECT_NEAR(losses[n], loss, 1e-5 * std::max(1.0, loss));
  }
  // logits may alias probs.
  std::vector<float> inplace = logits, losses2(N);
  cpu::softmax_crossentropy_forward(inplace.data(), losses2.data(), inplace.data(), tgt.data(), N,
                                    V);
  for (int i = 0; i < N * V; ++i) EXPECT_EQ(inplace[i], probs[i]);
  for (int n = 0; n < N; ++n) EXPECT_EQ(losses2[n], losses[n]);
}

TEST(SoftmaxCrossEntropy, BackwardMatchesFiniteDifferences) {
  const int N = 3, V = 11;
  const float scale = 0.37f;  // d(objective)/d(loss_n)
  auto logits = random_floats(N * V, 29, -3.0f, 3.0f);
  const std::vector<std::int32_t> tgt = {3, 0, 10};
  std::vector<float> probs(N * V), losses(N);
  auto J = [&] {
    cpu::softmax_crossentropy_forward(probs.data(), losses.data(), logits.data(), tgt.data(), N, V);
    double s = 0;
    for (float l : losses) s += l;
    return s * scale;
  };
  J();
  std::vector<float> dlogits(N * V, kPrefill);
  cpu::crossentropy_softmax_backward(dlogits.data(), probs.data(), tgt.data(), scale, N, V);
  check_gradient("dlogits", logits, minus_prefill(dlogits), J);
}

// ---------------------------------------------------------------------------------------------

TEST(AdamW, MatchesHandComputedSteps) {
  // Two elements, two steps, with weight decay and a clip factor, against the update written out
  // in double: g' = s g; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
  // p -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd p).
  const float lr = 0.01f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, s = 0.5f;
  std::vector<float> p = {0.5f, -1.25f}, m(2, 0.0f), v(2, 0.0f);
  const std::vector<float> g1 = {0.2f, -0.4f}, g2 = {-0.1f, 0.3f};
  double P[2] = {0.5, -1.25}, M[2] = {0, 0}, Vv[2] = {0, 0};
  int t = 0;
  for (const auto* g : {&g1, &g2}) {
    ++t;
    cpu::adamw_update(p.data(), g->data(), m.data(), v.data(), 2, lr, b1, b2, eps, wd, t, s);
    for (int i = 0; i < 2; ++i) {
      const double gs = double(s) * (*g)[i];
      M[i] = b1 * M[i] + (1 - double(b1)) * gs;
      Vv[i] = b2 * Vv[i] + (1 - double(b2)) * gs * gs;
      const double mh = M[i] / (1 - std::pow(double(b1), t));
      const double vh = Vv[i] / (1 - std::pow(double(b2), t));
      P[i] -= lr * (mh / (std::sqrt(vh) + eps) + wd * P[i]);
      EXPECT_NEAR(m[i], M[i], 1e-7);
      EXPECT_NEAR(v[i], Vv[i], 1e-8);
      EXPECT_NEAR(p[i], P[i], 1e-6) << "step " << t << " element " << i;
    }
  }
  // First step of Adam moves each weight by about lr * sign(g) (plus decay): check by hand.
  // Element 0 after step 1: 0.5 - 0.01 * (1 + 0.1 * 0.5) = 0.4895.
  std::vector<float> q = {0.5f}, mq = {0}, vq = {0};
  const float gq = 0.2f;
  cpu::adamw_update(q.data(), &gq, mq.data(), vq.data(), 1, lr, b1, b2, eps, wd, 1, 1.0f);
  EXPECT_NEAR(q[0], 0.4895f, 1e-6);
}

TEST(AdamW, ZeroGradientOnlyDecays) {
  std::vector<float> p = {2.0f, -4.0f, 0.0f}, g(3, 0.0f), m(3, 0.0f), v(3, 0.0f);
  cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), 3, 0.1f, 0.9f, 0.95f, 1e-8f, 0.5f, 1,
                    1.0f);
  EXPECT_FLOAT_EQ(p[0], 2.0f * (1 - 0.1f * 0.5f));
  EXPECT_FLOAT_EQ(p[1], -4.0f * (1 - 0.1f * 0.5f));
  EXPECT_EQ(p[2], 0.0f);
}

// ---------------------------------------------------------------------------------------------

TEST(VecMath, ApproximationsAreAccurate) {
  namespace vm = strata::cpu::vm;
  double worst_exp = 0, worst_sqrt = 0, worst_tanh = 0;
  for (double x = -87.0; x < 88.0; x += 0.0137) {
    const double e = std::exp(double(float(x)));
    worst_exp = std::max(worst_exp, std::fabs(vm::exp_approx(float(x)) - e) / e);
  }
  for (double x = 1e-30; x < 1e30; x *= 1.37) {
    const double r = std::sqrt(double(float(x)));
    worst_sqrt = std::max(worst_sqrt, std::fabs(vm::sqrt_nonneg(float(x)) - r) / r);
  }
  for (double x = -12; x < 12; x += 0.0013)
    worst_tanh = std::max(worst_tanh, std::fabs(vm::tanh_approx(float(x)) - std::tanh(x)));
  EXPECT_LT(worst_exp, 2.5e-7);  // about 2 ulp
  EXPECT_LT(worst_sqrt, 3e-7);
  EXPECT_LT(worst_tanh, 3e-7);
  EXPECT_EQ(vm::exp_approx(-100.0f), 0.0f);
  EXPECT_EQ(vm::exp_approx(0.0f), 1.0f);
  EXPECT_TRUE(std::isfinite(vm::exp_approx(1000.0f)));
  EXPECT_EQ(vm::sqrt_nonneg(0.0f), 0.0f);
  const float xs[] = {-1e30f, -3.0f, -1e-30f, -0.0f, 0.0f, 1e-30f, 2.0f, 1e30f};
  for (float a : xs) {
    EXPECT_EQ(vm::key_to_float(vm::float_to_key(a)), a);
    for (float b : xs)
      if (a < b) EXPECT_LT(vm::float_to_key(a), vm::float_to_key(b)) << a << " < " << b;
  }
}

TEST(Blas, ThreadsAndCalibration) {
  const int n = cpu::blas_threads();
  EXPECT_GE(n, 1);
  cpu::set_blas_threads(1);
  EXPECT_EQ(cpu::blas_threads(), 1);
  cpu::set_blas_threads(n);
  EXPECT_EQ(cpu::blas_threads(), n);
  const double flops = cpu::calibrate_sgemm_flops(0.05);
  EXPECT_GT(flops, 1e8);  // any real CPU does more than 0.1 GFLOP/s
  EXPECT_LT(flops, 1e14);
}
