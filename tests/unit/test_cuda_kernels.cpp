// The CUDA backend of the model's kernels (cuda/kernels.hpp) against the CPU backend
// (cpu_kernels()) on the same random inputs: copied to the device, run on both, copied back.
// Small odd shapes (N = 37 rows, C = 24, a vocab shard [13, 37) of V = 50 with tokens inside and
// outside it, T = 5 positions starting mid-sequence), f32 and bf16 tables and gradients. Runs on a
// GPU (test_cuda_kernels) and on the CUDA emulator in every build (test_cuda_kernels_emu).
// Tolerances, and why:
// - bit for bit: the elementwise steps, the embedding / position gathers and scatter-adds, bias
//   and bias gradient, bf16 rounding and widening, the cross-entropy max, normalisation and
//   backward: the same fp32 operations in the same order (__fmul_rn / __fadd_rn, not contracted),
//   each rounded once as the CPU rounds it (bf16 per addition);
// - xent_exp: CUDA's expf vs the CPU's exp_approx differ by a few ulp per element, and the row
//   sums are reordered: rtol 1e-5;
// - xent_normalise's losses: fp32 log(sum) - target vs the CPU's double: a few ulp of the operands;
// - the norms' dweight / dbias (a bf16 and an fp32 input of the same values): atomics add the
//   rows in any order, so 2 gamma_n of sum |terms| (Higham's bound for any order of n terms);
// - sum: fp32 block partials vs the CPU's double running sum: rtol 1e-5 of sum |x|;
// - gemm_bf16: fp32 accumulation in any order vs a double reference: 1e-5 of sum |a b| (f32 C),
//   plus one bf16 rounding (2^-8 relative) for a bf16 C;
// - matmul_bf16_forward (cuBLASLt's bias epilogue, then the GELU kernel): as gemm_bf16 for the
//   output, and a few fp32 ulp of the tanh formula for the GELU of that output as stored;
// - the layer passes (cuda/layers.cuh, tested against cpu/layers.hpp in test_cuda_layers): that
//   each is wired to the right function and arguments, to fp32 reordering error (1e-4).
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <numbers>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/cpu/layers.hpp"
#include "backends/cuda/device.hpp"
#include "backends/cuda/kernels.hpp"
#include "backends/kernels.hpp"
#include "cuda_test.hpp"
#include "strata/types.hpp"

using namespace strata;

namespace {

// A device copy of a host vector.
template <class T>
struct Dev {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Dev(const std::vector<T>& h) : n(h.size()) {
    STRATA_CUDA_CHECK(
        cudaMalloc(reinterpret_cast<void**>(&p), std::max<std::size_t>(1, n) * sizeof(T)));
    if (n) STRATA_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  std::vector<T> host() const {
    std::vector<T> h(n);
    if (n) STRATA_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

std::vector<bf16> random_bf16(std::size_t n, std::uint32_t seed) {
  std::vector<bf16> v(n);
  const std::vector<float> f = random_floats(n, seed, -2, 2);
  for (std::size_t i = 0; i < n; ++i) v[i] = to_bf16(f[i]);
  return v;
}

// The same bits (floats compared as bits: -0 and NaN payloads count).
void expect_bits(const char* what, const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i]) && !bad++)
      first = i;
  EXPECT_EQ(bad, 0u) << what << ": first at " << first << ": gpu " << got[first] << " cpu "
                     << want[first];
}
void expect_bits(const char* what, const std::vector<bf16>& got, const std::vector<bf16>& want) {
  std::vector<float> g(got.size()), w(want.size());
  for (std::size_t i = 0; i < got.size(); ++i) g[i] = to_float(got[i]);
  for (std::size_t i = 0; i < want.size(); ++i) w[i] = to_float(want[i]);
  expect_bits(what, g, w);
}
// |got - want| <= atol + rtol |want| everywhere.
void expect_close(const char* what, const std::vector<float>& got, const std::vector<float>& want,
                  double rtol, double atol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(double(got[i]) - want[i]) <= atol + rtol * std::fabs(want[i])) && !bad++)
      first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                     << " out of tolerance; first at " << first << ": gpu " << got[first] << " cpu "
                     << want[first];
}

// Column sums accumulated by atomics (the norms' dweight / dbias): the order of the additions
// differs run to run, so each sum is within gamma_n sum |terms| of the exact one, whatever the
// order (Higham's bound for n - 1 additions, u = 2^-24). Two such sums differ by twice that.
// abs_sums[c] is sum |terms| of column c, the starting value counted as a term.
void expect_sums_close(const char* what, const std::vector<float>& got,
                       const std::vector<float>& want, const std::vector<double>& abs_sums,
                       int terms) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(abs_sums.size(), want.size()) << what;
  const double nu = terms * std::ldexp(1.0, -24), gamma = nu / (1 - nu);
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(double(got[i]) - want[i]) <= 2 * gamma * abs_sums[i]) && !bad++) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " out of 2 gamma_" << terms
                     << " sum |terms|; first at " << first << ": " << got[first] << " vs "
                     << want[first] << ", bound " << 2 * gamma * abs_sums[first];
}
// sum over rows of |f(r, c)| for each column c, plus |start[c]|.
template <class F>
std::vector<double> column_abs_sums(int rows, int cols, const std::vector<float>& start, F f) {
  std::vector<double> s(cols);
  for (int c = 0; c < cols; ++c) {
    s[c] = std::fabs(double(start[c]));
    for (int r = 0; r < rows; ++r) s[c] += std::fabs(f(r, c));
  }
  return s;
}

// A host vector with Dev's interface: the CPU backend's half of a test written once for both.
template <class T>
struct Host {
  std::vector<T> v;
  T* p;
  explicit Host(const std::vector<T>& h) : v(h), p(v.data()) {}
  Host(const Host&) = delete;
  std::vector<T> host() const { return v; }
};

// A bf16 run's residual stream on backend k (its memory M: Dev or Host): the residual add writes
// a + b rounded once; the LayerNorm fused with it normalises that rounded sum; a LayerNorm reading
// a bf16 input (forward and backward) gives the bits it gives on the input widened to fp32. 150
// rows (more than the CPU's block of 64), C = 70 (not a multiple of 32). The GPU sums the
// LayerNorm's weight and bias gradients with atomics across blocks, in no fixed order: those to
// 1e-5.
template <template <class> class M>
void check_bf16_residual_stream(Kernels& k, const std::function<void()>& sync) {
  constexpr int Nr = 150, Cc = 70;
  const std::size_t n = std::size_t(Nr) * Cc;
  const std::vector<float> a = random_floats(n, 80, -2, 2), dout = random_floats(n, 81, -1, 1);
  const std::vector<float> w = random_floats(Cc, 82, 0.5, 1.5), bias = random_floats(Cc, 83, -1, 1);
  const std::vector<bf16> x_h = random_bf16(n, 84), zeros_h(n);
  std::vector<float> x(n), sum(n);  // x_h widened; the rounded sum a + x, widened
  std::vector<bf16> sum_h(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = to_float(x_h[i]);
    sum_h[i] = to_bf16(a[i] + x[i]);
    sum[i] = to_float(sum_h[i]);
  }
  const std::vector<float> zeros(n), zero_rows(Nr), zero_cols(Cc);
  M<float> d_a(a), d_x(x), d_sum(sum), d_w(w), d_bias(bias), d_dout(dout);
  M<bf16> d_x_h(x_h), d_added(zeros_h), d_fused_sum(zeros_h), d_fused_out(zeros_h),
      d_ln_sum(zeros_h), d_ln_h(zeros_h), d_ln(zeros_h);
  M<float> fm(zero_rows), fr(zero_rows), sm(zero_rows), sr(zero_rows), hm(zero_rows), hr(zero_rows),
      m(zero_rows), r(zero_rows);
  M<float> dinp_h(zeros), dinp(zeros), dw_h(zero_cols), dw(zero_cols), db_h(zero_cols),
      db(zero_cols);
  k.residual_forward(d_added.p, d_a.p, d_x_h.p, std::int64_t(n));
  k.residual_layernorm_forward(d_fused_sum.p, d_fused_out.p, fm.p, fr.p, d_a.p, d_x_h.p, d_w.p,
                               d_bias.p, Nr, Cc);
  k.layernorm_forward(d_ln_sum.p, sm.p, sr.p, d_sum.p, d_w.p, d_bias.p, Nr, Cc);
  k.layernorm_forward(d_ln_h.p, hm.p, hr.p, d_x_h.p, d_w.p, d_bias.p, Nr, Cc);
  k.layernorm_forward(d_ln.p, m.p, r.p, d_x.p, d_w.p, d_bias.p, Nr, Cc);
  k.layernorm_backward(dinp_h.p, dw_h.p, db_h.p, d_dout.p, d_x_h.p, d_w.p, m.p, r.p, Nr, Cc);
  k.layernorm_backward(dinp.p, dw.p, db.p, d_dout.p, d_x.p, d_w.p, m.p, r.p, Nr, Cc);
  sync();
  expect_bits("residual_forward", d_added.host(), sum_h);
  expect_bits("fused sum", d_fused_sum.host(), sum_h);
  expect_bits("fused out", d_fused_out.host(), d_ln_sum.host());
  expect_bits("fused mean", fm.host(), sm.host());
  expect_bits("fused rstd", fr.host(), sr.host());
  expect_bits("layernorm of bf16", d_ln_h.host(), d_ln.host());
  expect_bits("mean", hm.host(), m.host());
  expect_bits("rstd", hr.host(), r.host());
  expect_bits("layernorm_backward dinp", dinp_h.host(), dinp.host());
  const std::vector<float> mean = m.host(), rstd = r.host();
  auto at = [&](int row, int c) { return std::size_t(row) * Cc + c; };
  expect_sums_close("layernorm_backward dweight", dw_h.host(), dw.host(),
                    column_abs_sums(Nr, Cc, zero_cols,
                                    [&](int row, int c) {
                                      return double(dout[at(row, c)]) *
                                             (x[at(row, c)] - mean[row]) * rstd[row];
                                    }),
                    Nr + 1);
  expect_sums_close(
      "layernorm_backward dbias", db_h.host(), db.host(),
      column_abs_sums(Nr, Cc, zero_cols, [&](int row, int c) { return dout[at(row, c)]; }), Nr + 1);
  EXPECT_NE(dinp.host(), zeros);  // the backward did run
}

// The llama block's layers on backend k in a bf16 run: each reads a bf16 activation as its widened
// fp32 values and writes a bf16 one as its fp32 result rounded once (RMSNorm forward and backward,
// SwiGLU forward and backward, the rotary embedding in place, the K/V repeat); the repeat's
// backward sums each K/V head's query heads. 150 rows (more than the CPU's block of 64).
template <template <class> class M>
void check_bf16_llama_layers(Kernels& k, const std::function<void()>& sync) {
  constexpr int Nr = 150, Cc = 70, F = 45, NHq = 4, KV = 2, hs = 8, Tt = 7;
  constexpr int qkv_w = (NHq + 2 * KV) * hs, att_w = 3 * NHq * hs;
  auto widened = [](const std::vector<bf16>& h) {
    std::vector<float> f(h.size());
    for (std::size_t i = 0; i < h.size(); ++i) f[i] = to_float(h[i]);
    return f;
  };
  const std::vector<bf16> x_h = random_bf16(std::size_t(Nr) * Cc, 90),
                          gu_h = random_bf16(std::size_t(Nr) * 2 * F, 91),
                          qkv_h = random_bf16(std::size_t(Nr) * qkv_w, 92);
  const std::vector<float> x = widened(x_h), gu = widened(gu_h), qkv = widened(qkv_h);
  const std::vector<float> w = random_floats(Cc, 93, 0.5, 1.5),
                           dx0 = random_floats(x.size(), 94, -1, 1),
                           dh = random_floats(std::size_t(Nr) * F, 95, -1, 1),
                           datt = random_floats(std::size_t(Nr) * att_w, 96, -1, 1);
  std::vector<float> table(std::size_t(Tt) * hs);
  cpu::rope_table(table.data(), Tt, hs, 500000.0);
  M<bf16> d_x_h(x_h), d_gu_h(gu_h), d_qkv_h(qkv_h), d_norm_h(std::vector<bf16>(x.size())),
      d_act_h(std::vector<bf16>(dh.size())), d_att_h(std::vector<bf16>(datt.size()));
  M<float> d_x(x), d_gu(gu), d_qkv(qkv), d_w(w), d_table(table),
      d_norm(std::vector<float>(x.size())), d_act(std::vector<float>(dh.size())),
      d_att(std::vector<float>(datt.size())), r_h{std::vector<float>(Nr)},
      r{std::vector<float>(Nr)}, dx_h(dx0), dx(dx0), dw_h(w), dw(w), d_dh(dh),
      dgu_h(std::vector<float>(gu.size())), dgu(std::vector<float>(gu.size())), d_datt(datt),
      d_dqkv(std::vector<float>(qkv.size(), NAN)), d_g(random_floats(x.size(), 97, -1, 1));
  k.rmsnorm_forward(d_norm_h.p, r_h.p, d_x_h.p, d_w.p, Nr, Cc);
  k.rmsnorm_forward(d_norm.p, r.p, d_x.p, d_w.p, Nr, Cc);
  k.rmsnorm_backward(dx_h.p, dw_h.p, d_g.p, d_x_h.p, d_w.p, r.p, Nr, Cc);
  k.rmsnorm_backward(dx.p, dw.p, d_g.p, d_x.p, d_w.p, r.p, Nr, Cc);
  k.swiglu_forward(d_act_h.p, d_gu_h.p, Nr, F);
  k.swiglu_forward(d_act.p, d_gu.p, Nr, F);
  k.swiglu_backward(dgu_h.p, d_gu_h.p, d_dh.p, Nr, F);
  k.swiglu_backward(dgu.p, d_gu.p, d_dh.p, Nr, F);
  k.rope_forward(d_qkv_h.p, d_table.p, Nr, Tt, 3, NHq + KV, hs, qkv_w);
  k.rope_forward(d_qkv.p, d_table.p, Nr, Tt, 3, NHq + KV, hs, qkv_w);
  k.repeat_kv_forward(d_att_h.p, d_qkv_h.p, Nr, NHq, KV, hs);
  k.repeat_kv_forward(d_att.p, d_qkv.p, Nr, NHq, KV, hs);
  k.repeat_kv_backward(d_dqkv.p, d_datt.p, Nr, NHq, KV, hs);
  sync();
  auto rounded = [](const std::vector<float>& f) {
    std::vector<bf16> h(f.size());
    for (std::size_t i = 0; i < f.size(); ++i) h[i] = to_bf16(f[i]);
    return h;
  };
  expect_bits("rmsnorm of bf16, to bf16", d_norm_h.host(), rounded(d_norm.host()));
  expect_bits("rmsnorm rstd", r_h.host(), r.host());
  expect_bits("rmsnorm_backward dinp", dx_h.host(), dx.host());
  const std::vector<float> g = d_g.host(), rstd = r.host();
  expect_sums_close("rmsnorm_backward dweight", dw_h.host(), dw.host(),
                    column_abs_sums(Nr, Cc, w,
                                    [&](int row, int c) {
                                      const std::size_t i = std::size_t(row) * Cc + c;
                                      return double(g[i]) * x[i] * rstd[row];
                                    }),
                    Nr + 1);
  expect_bits("swiglu of bf16, to bf16", d_act_h.host(), rounded(d_act.host()));
  expect_bits("swiglu_backward", dgu_h.host(), dgu.host());
  expect_bits("rope of bf16, in place", d_qkv_h.host(), rounded(d_qkv.host()));
  expect_bits("repeat_kv of bf16", d_att_h.host(), rounded(d_att.host()));
  // The repeat's backward: q as it is, each K/V head the sum over its NHq / KV query heads.
  const std::vector<float> got = d_dqkv.host();
  for (int n = 0; n < Nr; ++n)
    for (int j = 0; j < qkv_w; ++j) {
      float want = datt[std::size_t(n) * att_w + j];
      if (j >= NHq * hs) {
        const int part = (j - NHq * hs) / (KV * hs), g = (j - NHq * hs) % (KV * hs) / hs,
                  e = j % hs;
        want = 0.0f;
        for (int rep = 0; rep < NHq / KV; ++rep)
          want += datt[std::size_t(n) * att_w + (part + 1) * NHq * hs +
                       (g * (NHq / KV) + rep) * hs + e];
      }
      ASSERT_EQ(got[std::size_t(n) * qkv_w + j], want) << "row " << n << " column " << j;
    }
}

constexpr int N = 37, C = 24, V = 50, T = 5;
constexpr std::size_t v0 = 13, Vl = 24, row0 = 3;

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    STRATA_REQUIRE_GPU();
    ctx = std::make_unique<cuda::CudaContext>(0);
    gpu = std::make_unique<cuda::CudaKernels>(*ctx);
  }
  void sync() { ctx->synchronize(); }
  std::unique_ptr<cuda::CudaContext> ctx;
  std::unique_ptr<cuda::CudaKernels> gpu;
  Kernels& cpu = cpu_kernels();
};

}  // namespace

TEST_F(CudaKernelsTest, ElementwiseStepsMatchBitForBit) {
  STRATA_REQUIRE_GPU();
  std::vector<float> out = random_floats(N * C, 1, -2, 2), bias = random_floats(C, 2, -2, 2);
  const std::vector<float> src = random_floats(N * C, 3, -2, 2);
  std::vector<bf16> acc = random_bf16(N * C, 4);
  Dev<float> d_out(out), d_bias(bias), d_src(src), d_wide(out);
  Dev<bf16> d_acc(acc), d_round(acc);

  gpu->add_bias(d_out.p, d_bias.p, N, C);
  cpu.add_bias(out.data(), bias.data(), N, C);
  gpu->bias_grad(d_bias.p, d_src.p, N, C);
  cpu.bias_grad(bias.data(), src.data(), N, C);
  gpu->add_into_bf16(d_acc.p, d_src.p, N * C);
  cpu.add_into_bf16(acc.data(), src.data(), N * C);
  std::vector<bf16> rounded(N * C);
  std::vector<float> wide(N * C);
  gpu->round_to_bf16(d_round.p, d_src.p, N * C);
  cpu.round_to_bf16(rounded.data(), src.data(), N * C);
  gpu->widen_bf16(d_wide.p, d_acc.p, N * C);  // after add_into_bf16: stream order
  cpu.widen_bf16(wide.data(), acc.data(), N * C);
  sync();
  expect_bits("add_bias", d_out.host(), out);
  expect_bits("bias_grad", d_bias.host(), bias);
  expect_bits("add_into_bf16", d_acc.host(), acc);
  expect_bits("round_to_bf16", d_round.host(), rounded);
  expect_bits("widen_bf16", d_wide.host(), wide);

  gpu->zero(d_out.p, N * C - 1);  // the last element stays
  sync();
  const std::vector<float> zeroed = d_out.host();
  for (int i = 0; i < N * C - 1; ++i) ASSERT_EQ(std::bit_cast<std::uint32_t>(zeroed[i]), 0u) << i;
  EXPECT_EQ(zeroed.back(), out.back());
}

// Gathers and scatter-adds of the vocab-parallel embedding, f32 and bf16 tables.
// bias_grad over many chunks of kBiasGradRows rows (several blocks of 8 chunks), a partial last
// chunk and a partial last block of columns: the GPU's parallel chunk sums are the CPU's bit
// for bit, and both are the column sums (against double, to fp32 rounding of ~rows additions).
TEST_F(CudaKernelsTest, BiasGradSumsChunksInTheCpusOrder) {
  STRATA_REQUIRE_GPU();
  constexpr std::size_t rows = 2 * 32 * kBiasGradRows + 37;
  constexpr int cols = 70;
  const std::vector<float> dout = random_floats(rows * cols, 60, -2, 2);
  std::vector<float> dbias = random_floats(cols, 61, -1, 1);
  std::vector<double> want(dbias.begin(), dbias.end());
  for (std::size_t n = 0; n < rows; ++n)
    for (int c = 0; c < cols; ++c) want[c] += dout[n * cols + c];
  Dev<float> d_dout(dout), d_dbias(dbias);
  gpu->bias_grad(d_dbias.p, d_dout.p, rows, cols);
  cpu.bias_grad(dbias.data(), dout.data(), rows, cols);
  sync();
  expect_bits("bias_grad", d_dbias.host(), dbias);
  for (int c = 0; c < cols; ++c) EXPECT_NEAR(dbias[c], want[c], 1e-4) << "column " << c;
}

// The fused residual_layernorm_forward against its unfused composition on the same backend,
// residual_forward then layernorm_forward: the sum, output, mean and rstd bit for bit, with the sum
// in place over its first input as the model runs it (xmid = xmid + x), C not a multiple of 32.
TEST_F(CudaKernelsTest, ResidualLayerNormIsTheUnfusedComposition) {
  STRATA_REQUIRE_GPU();
  constexpr int Nr = 37, Cc = 70;
  const std::vector<float> a = random_floats(Nr * Cc, 70, -2, 2),
                           b = random_floats(Nr * Cc, 71, -2, 2);
  const std::vector<float> w = random_floats(Cc, 72, 0.5, 1.5), bias = random_floats(Cc, 73, -1, 1);
  Dev<float> d_fused_sum(a), d_sum(a), d_b(b), d_w(w), d_bias(bias);
  const std::vector<float> rows_c(Nr * Cc), rows(Nr);
  Dev<float> d_fused_out(rows_c), d_out(rows_c), d_fused_mean(rows), d_mean(rows),
      d_fused_rstd(rows), d_rstd(rows);
  gpu->residual_layernorm_forward(d_fused_sum.p, d_fused_out.p, d_fused_mean.p, d_fused_rstd.p,
                                  d_fused_sum.p, d_b.p, d_w.p, d_bias.p, Nr, Cc);
  gpu->residual_forward(d_sum.p, d_sum.p, d_b.p, std::int64_t(Nr) * Cc);
  gpu->layernorm_forward(d_out.p, d_mean.p, d_rstd.p, d_sum.p, d_w.p, d_bias.p, Nr, Cc);
  sync();
  expect_bits("sum", d_fused_sum.host(), d_sum.host());
  expect_bits("out", d_fused_out.host(), d_out.host());
  expect_bits("mean", d_fused_mean.host(), d_mean.host());
  expect_bits("rstd", d_fused_rstd.host(), d_rstd.host());
  const std::vector<float> sum = d_sum.host();
  for (int i = 0; i < Nr * Cc; ++i) ASSERT_EQ(sum[i], a[i] + b[i]) << "sum[" << i << "]";
}

// The GELU's backward reading a bf16 input (a bf16 run's pre-GELU activations) gives the bits
// its widened fp32 values give, on the GPU and on the CPU (more rows than the CPU's block of 64).
TEST_F(CudaKernelsTest, GeluBackwardReadsABf16InputAsItsWidenedValues) {
  STRATA_REQUIRE_GPU();
  constexpr std::size_t rows = 3 * kBiasGradRows + 7;
  constexpr int cols = 45;
  constexpr std::size_t n = rows * cols;
  std::vector<bf16> pre_h = random_bf16(n, 90);
  std::vector<float> pre(n);
  for (std::size_t i = 0; i < n; ++i) pre[i] = to_float(pre_h[i]);
  const std::vector<float> dgelu = random_floats(n, 91, -3, 3),
                           dbias0 = random_floats(cols, 92, -1, 1), nans(n, NAN);
  const std::vector<bf16> zeros_h(n);
  Dev<bf16> d_pre_h(pre_h), d_out_h(zeros_h), d_out(zeros_h);
  Dev<float> d_pre(pre), d_dgelu(dgelu), d_bias_h(dbias0), d_bias(dbias0), d_scratch(nans);
  gpu->gelu_backward_bf16_bias_grad(d_out_h.p, d_bias_h.p, d_scratch.p, d_pre_h.p, d_dgelu.p, rows,
                                    cols);
  gpu->gelu_backward_bf16_bias_grad(d_out.p, d_bias.p, d_scratch.p, d_pre.p, d_dgelu.p, rows, cols);
  std::vector<bf16> out_h(n), out(n);
  std::vector<float> bias_h = dbias0, bias = dbias0, scratch(n);
  cpu.gelu_backward_bf16_bias_grad(out_h.data(), bias_h.data(), scratch.data(), pre_h.data(),
                                   dgelu.data(), rows, cols);
  cpu.gelu_backward_bf16_bias_grad(out.data(), bias.data(), scratch.data(), pre.data(),
                                   dgelu.data(), rows, cols);
  sync();
  expect_bits("gpu d(output)", d_out_h.host(), d_out.host());
  expect_bits("gpu bias_grad", d_bias_h.host(), d_bias.host());
  expect_bits("cpu d(output)", out_h, out);
  expect_bits("cpu bias_grad", bias_h, bias);
  EXPECT_NE(bias, dbias0);  // the backward did run
}

// The attention of each backend reading bf16 q | k | v and writing a bf16 output (the CPU's a
// sequence at a time, widened; the GPU's fused fp32 kernel) gives what it gives from the same
// values in fp32: the output rounded once, the kept state and the backward's dqkv bit for bit.
TEST_F(CudaKernelsTest, AttentionReadsAndWritesBf16AsTheSameValuesInFp32) {
  STRATA_REQUIRE_GPU();
  constexpr int Bc = 2, Tc = 21, Cc = 32, NHc = 2;
  const std::size_t n = std::size_t(Bc) * Tc * Cc,
                    state = attention_state_floats(Device::cpu, Bc, Tc, Cc, NHc);
  std::vector<bf16> qkv_h = random_bf16(3 * n, 93);
  std::vector<float> qkv(3 * n);
  for (std::size_t i = 0; i < 3 * n; ++i) qkv[i] = to_float(qkv_h[i]);
  const std::vector<float> dout = random_floats(n, 94, -1, 1), dqkv0 = random_floats(3 * n, 95),
                           zeros(n), zero_state(state);
  const std::vector<bf16> zeros_h(n);
  // Each backend on its own memory: the fp32 pass on qkv, the bf16 pass on qkv_h.
  for (bool on_gpu : {false, true}) {
    SCOPED_TRACE(on_gpu ? "gpu" : "cpu");
    Kernels& k = on_gpu ? static_cast<Kernels&>(*gpu) : cpu;
    Dev<float> d_qkv(qkv), d_out(zeros), d_att(zero_state), d_att_h(zero_state), d_datt(zero_state),
        d_dout(dout), d_dqkv(dqkv0), d_dqkv_h(dqkv0);
    Dev<bf16> d_qkv_h(qkv_h), d_out_h(zeros_h);
    std::vector<float> h_qkv = qkv, h_out(n), h_att(state), h_att_h(state), h_datt(state),
                       h_dout = dout, h_dqkv = dqkv0, h_dqkv_h = dqkv0;
    std::vector<bf16> h_qkv_h = qkv_h, h_out_h(n);
    auto pick = [&](float* dev, std::vector<float>& host) { return on_gpu ? dev : host.data(); };
    auto pick_h = [&](bf16* dev, std::vector<bf16>& host) { return on_gpu ? dev : host.data(); };
    k.attention_forward(pick(d_out.p, h_out), pick(d_att.p, h_att), pick(d_qkv.p, h_qkv), Bc, Tc,
                        Cc, NHc);
    k.attention_forward(pick_h(d_out_h.p, h_out_h), pick(d_att_h.p, h_att_h),
                        pick_h(d_qkv_h.p, h_qkv_h), Bc, Tc, Cc, NHc);
    k.attention_backward(pick(d_dqkv.p, h_dqkv), pick(d_datt.p, h_datt), pick(d_dout.p, h_dout),
                         pick(d_qkv.p, h_qkv), pick(d_att.p, h_att), pick(d_out.p, h_out), Bc, Tc,
                         Cc, NHc);
    // The bf16 backward reads the bf16 output; the fp32 one the fp32 output, so compare against
    // an fp32 backward fed the rounded output: on the CPU the output is not read at all.
    sync();
    std::vector<float> rounded(n);
    const std::vector<float> out = on_gpu ? d_out.host() : h_out;
    for (std::size_t i = 0; i < n; ++i) rounded[i] = to_float(to_bf16(out[i]));
    Dev<float> d_rounded(rounded), d_dqkv_r(dqkv0);
    std::vector<float> h_dqkv_r = dqkv0;
    k.attention_backward(pick(d_dqkv_r.p, h_dqkv_r), pick(d_datt.p, h_datt), pick(d_dout.p, h_dout),
                         pick(d_qkv.p, h_qkv), pick(d_att.p, h_att), pick(d_rounded.p, rounded), Bc,
                         Tc, Cc, NHc);
    k.attention_backward(pick(d_dqkv_h.p, h_dqkv_h), pick(d_datt.p, h_datt), pick(d_dout.p, h_dout),
                         pick_h(d_qkv_h.p, h_qkv_h), pick(d_att_h.p, h_att_h),
                         pick_h(d_out_h.p, h_out_h), Bc, Tc, Cc, NHc);
    sync();
    std::vector<bf16> want_h(n);
    for (std::size_t i = 0; i < n; ++i) want_h[i] = to_bf16(out[i]);
    expect_bits("out", on_gpu ? d_out_h.host() : h_out_h, want_h);
    expect_bits("state", on_gpu ? d_att_h.host() : h_att_h, on_gpu ? d_att.host() : h_att);
    expect_bits("dqkv", on_gpu ? d_dqkv_h.host() : h_dqkv_h, on_gpu ? d_dqkv_r.host() : h_dqkv_r);
    EXPECT_NE(on_gpu ? d_dqkv.host() : h_dqkv, dqkv0);  // the backward did run
  }
}

// A LayerNorm writing bf16 (a bf16 run's GEMM inputs) writes its fp32 output rounded once: plain
// and fused with the residual add, on the GPU and on the CPU (more rows than the CPU's block of
// 64, C not a multiple of 32), each equal to round_to_bf16 of the same backend's fp32 output, with
// the same mean, rstd and sum.
TEST_F(CudaKernelsTest, LayerNormWritesItsFp32OutputRoundedToBf16) {
  STRATA_REQUIRE_GPU();
  constexpr int Nr = 150, Cc = 70;
  const std::size_t n = std::size_t(Nr) * Cc;
  const std::vector<float> a = random_floats(n, 74, -2, 2), b = random_floats(n, 75, -2, 2);
  const std::vector<float> w = random_floats(Cc, 76, 0.5, 1.5), bias = random_floats(Cc, 77, -1, 1);
  for (bool fused : {false, true}) {
    const char* what = fused ? "residual_layernorm" : "layernorm";
    auto run = [&](Kernels& k, float* x, float* out, bf16* half, float* mean, float* rstd,
                   float* mean_h, float* rstd_h, float* sum_h, float* y, const float* wp,
                   const float* bp) {
      if (fused) {
        k.residual_layernorm_forward(x, out, mean, rstd, x, y, wp, bp, Nr, Cc);
        k.residual_layernorm_forward(sum_h, half, mean_h, rstd_h, sum_h, y, wp, bp, Nr, Cc);
      } else {
        k.layernorm_forward(out, mean, rstd, x, wp, bp, Nr, Cc);
        k.layernorm_forward(half, mean_h, rstd_h, x, wp, bp, Nr, Cc);
      }
    };
    // GPU: the fp32 pass on one copy of a, the bf16 pass on another.
    const std::vector<float> zeros(n), zero_rows(Nr);
    const std::vector<bf16> zeros_h(n);
    Dev<float> d_x(a), d_sum_h(a), d_y(b), d_w(w), d_bias(bias), d_out(zeros), d_mean(zero_rows),
        d_rstd(zero_rows), d_mean_h(zero_rows), d_rstd_h(zero_rows);
    Dev<bf16> d_half(zeros_h), d_rounded(zeros_h);
    run(*gpu, d_x.p, d_out.p, d_half.p, d_mean.p, d_rstd.p, d_mean_h.p, d_rstd_h.p, d_sum_h.p,
        d_y.p, d_w.p, d_bias.p);
    gpu->round_to_bf16(d_rounded.p, d_out.p, n);
    sync();
    expect_bits(what, d_half.host(), d_rounded.host());
    expect_bits("mean", d_mean_h.host(), d_mean.host());
    expect_bits("rstd", d_rstd_h.host(), d_rstd.host());
    if (fused) expect_bits("sum", d_sum_h.host(), d_x.host());
    // CPU: the same.
    std::vector<float> x = a, sum_h = a, y = b, out(n), mean(Nr), rstd(Nr), mean_h(Nr), rstd_h(Nr);
    std::vector<bf16> half(n), rounded(n);
    run(cpu, x.data(), out.data(), half.data(), mean.data(), rstd.data(), mean_h.data(),
        rstd_h.data(), sum_h.data(), y.data(), w.data(), bias.data());
    cpu.round_to_bf16(rounded.data(), out.data(), n);
    expect_bits(what, half, rounded);
    expect_bits("mean", mean_h, mean);
    expect_bits("rstd", rstd_h, rstd);
    if (fused) expect_bits("sum", sum_h, x);
  }
}

TEST_F(CudaKernelsTest, Bf16ResidualStreamIsWrittenRoundedOnceAndReadWidened) {
  STRATA_REQUIRE_GPU();
  {
    SCOPED_TRACE("gpu");
    check_bf16_residual_stream<Dev>(*gpu, [&] { sync(); });
  }
  SCOPED_TRACE("cpu");
  check_bf16_residual_stream<Host>(cpu, [] {});
}

TEST_F(CudaKernelsTest, LlamaLayersReadBf16WidenedAndWriteItRoundedOnce) {
  STRATA_REQUIRE_GPU();
  {
    SCOPED_TRACE("gpu");
    check_bf16_llama_layers<Dev>(*gpu, [&] { sync(); });
  }
  SCOPED_TRACE("cpu");
  check_bf16_llama_layers<Host>(cpu, [] {});
}

// The fused round_to_bf16_bias_grad against its unfused composition, round_to_bf16 then bias_grad,
// on the same backend: the bf16 operand and the bias gradient bit for bit (a partial last chunk
// and a partial last block of columns), and the CPU's composition equal to both.
TEST_F(CudaKernelsTest, RoundingWithBiasGradIsTheUnfusedComposition) {
  STRATA_REQUIRE_GPU();
  constexpr std::size_t rows = 9 * kBiasGradRows + 5;
  constexpr int cols = 45;
  const std::vector<float> dout = random_floats(rows * cols, 64, -3, 3);
  const std::vector<float> dbias0 = random_floats(cols, 65, -1, 1);
  Dev<float> d_dout(dout), d_fused_bias(dbias0), d_bias(dbias0);
  Dev<bf16> d_fused(std::vector<bf16>(rows * cols)), d_rounded(std::vector<bf16>(rows * cols));
  gpu->round_to_bf16_bias_grad(d_fused.p, d_fused_bias.p, d_dout.p, rows, cols);
  gpu->round_to_bf16(d_rounded.p, d_dout.p, rows * cols);
  gpu->bias_grad(d_bias.p, d_dout.p, rows, cols);
  std::vector<bf16> cpu_rounded(rows * cols);
  std::vector<float> cpu_bias = dbias0;
  cpu.round_to_bf16_bias_grad(cpu_rounded.data(), cpu_bias.data(), dout.data(), rows, cols);
  sync();
  expect_bits("fused rounding", d_fused.host(), d_rounded.host());
  expect_bits("cpu fused rounding", cpu_rounded, d_rounded.host());
  expect_bits("fused bias_grad", d_fused_bias.host(), d_bias.host());
  expect_bits("cpu fused bias_grad", cpu_bias, d_bias.host());
}

// The fused GELU backward (gelu_backward_bf16_bias_grad: one pass, no fp32 d(output)) against
// the three calls it replaces on the same backend: zero, gelu_backward, round_to_bf16_bias_grad.
// The bf16 operand and the bias gradient bit for bit, a partial last chunk and block of columns;
// the CPU (whose GELU differs by ulps) runs the default composition and is checked for its bias
// gradient being the column sums of its own fp32 d(output).
TEST_F(CudaKernelsTest, GeluBackwardWithRoundingAndBiasGradIsTheUnfusedComposition) {
  STRATA_REQUIRE_GPU();
  constexpr std::size_t rows = 9 * kBiasGradRows + 5;
  constexpr int cols = 45;
  constexpr std::size_t n = rows * cols;
  std::vector<float> pre = random_floats(n, 66, -4, 4);  // not const: an ActView is read-write
  const std::vector<float> dgelu = random_floats(n, 67, -3, 3);
  const std::vector<float> dbias0 = random_floats(cols, 68, -1, 1);
  Dev<float> d_pre(pre), d_dgelu(dgelu), d_fused_bias(dbias0), d_bias(dbias0);
  Dev<float> d_scratch{std::vector<float>(n, NAN)}, d_d{std::vector<float>(n, 0.0f)};
  Dev<bf16> d_fused{std::vector<bf16>(n)}, d_rounded{std::vector<bf16>(n)};
  gpu->gelu_backward_bf16_bias_grad(d_fused.p, d_fused_bias.p, d_scratch.p, d_pre.p, d_dgelu.p,
                                    rows, cols);
  gpu->gelu_backward(d_d.p, d_pre.p, d_dgelu.p, std::int64_t(n));
  gpu->round_to_bf16_bias_grad(d_rounded.p, d_bias.p, d_d.p, rows, cols);
  std::vector<bf16> cpu_rounded(n);
  std::vector<float> cpu_bias = dbias0, cpu_scratch(n, NAN), cpu_d(n, 0.0f), cpu_sums = dbias0;
  cpu.gelu_backward_bf16_bias_grad(cpu_rounded.data(), cpu_bias.data(), cpu_scratch.data(),
                                   pre.data(), dgelu.data(), rows, cols);
  cpu.gelu_backward(cpu_d.data(), pre.data(), dgelu.data(), std::int64_t(n));
  cpu.bias_grad(cpu_sums.data(), cpu_d.data(), rows, cols);
  sync();
  expect_bits("fused rounding", d_fused.host(), d_rounded.host());
  expect_bits("fused bias_grad", d_fused_bias.host(), d_bias.host());
  expect_bits("cpu bias_grad", cpu_bias, cpu_sums);
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_EQ(to_float(cpu_rounded[i]), to_float(to_bf16(cpu_d[i])))
        << "cpu rounding [" << i << "]";
  // The GELU's local gradient reached the result: not dgelu itself rounded.
  std::size_t differs = 0;
  const std::vector<bf16> fused = d_fused.host();
  for (std::size_t i = 0; i < n; ++i) differs += to_float(fused[i]) != to_float(to_bf16(dgelu[i]));
  EXPECT_GT(differs, n / 2);
}

TEST_F(CudaKernelsTest, EmbeddingsMatchBitForBit) {
  STRATA_REQUIRE_GPU();
  const std::vector<std::int32_t> tokens = random_tokens(N, V, 5);  // repeats, in and out of shard
  Dev<std::int32_t> d_tokens(tokens);
  const std::vector<float> d = random_floats(N * C, 6, -2, 2);
  Dev<float> d_d(d);
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    // Tables as raw bytes of either dtype (bf16: the low half of the f32 buffer).
    auto table = [&](std::size_t rows, std::uint32_t seed) {
      std::vector<float> t = random_floats(rows * C, seed, -2, 2);
      if (dt == DType::bf16) {
        std::vector<bf16> b = random_bf16(rows * C, seed);
        std::memcpy(t.data(), b.data(), b.size() * sizeof(bf16));
      }
      return t;
    };
    std::vector<float> wte = table(Vl, 7), wpe = table(T, 8);
    Dev<float> d_wte(wte), d_wpe(wpe);
    const BufferView hw{wte.data(), Vl * C, dt, Device::cpu}, dw{d_wte.p, Vl * C, dt, Device::cuda};
    const BufferView hp{wpe.data(), std::size_t(T) * C, dt, Device::cpu},
        dp{d_wpe.p, std::size_t(T) * C, dt, Device::cuda};
    std::vector<float> rows(N * C, 7.0f);
    std::vector<bf16> rows_h(N * C);
    Dev<float> d_rows(rows);
    Dev<bf16> d_rows_h(rows_h);
    gpu->embedding_rows(d_rows.p, d_tokens.p, N, dw, v0, Vl, C);
    cpu.embedding_rows(rows.data(), tokens.data(), N, hw, v0, Vl, C);
    // Into a bf16 residual stream (a bf16 run's), then in place in fp32.
    gpu->add_positions(d_rows_h.p, d_rows.p, dp, N, row0, T, C);
    cpu.add_positions(rows_h.data(), rows.data(), hp, N, row0, T, C);
    gpu->add_positions(d_rows.p, d_rows.p, dp, N, row0, T, C);
    cpu.add_positions(rows.data(), rows.data(), hp, N, row0, T, C);
    gpu->embedding_rows_backward(dw, d_d.p, d_tokens.p, N, v0, Vl, C);
    cpu.embedding_rows_backward(hw, d.data(), tokens.data(), N, v0, Vl, C);
    gpu->positions_backward(dp, d_d.p, N, row0, T, C);
    cpu.positions_backward(hp, d.data(), N, row0, T, C);
    sync();
    expect_bits("embedding_rows + add_positions", d_rows.host(), rows);
    std::vector<bf16> rounded(N * C);
    for (std::size_t i = 0; i < rows.size(); ++i) rounded[i] = to_bf16(rows[i]);
    expect_bits("add_positions into bf16", d_rows_h.host(), rounded);
    expect_bits("add_positions into bf16 (CPU)", rows_h, rounded);
    expect_bits("embedding_rows_backward", d_wte.host(), wte);
    expect_bits("positions_backward", d_wpe.host(), wpe);
  }
}

// The embedding's backward over more positions than one tile of the CUDA kernel's token links
// (700 > 256): tokens repeated across tiles (12 distinct, one of them 200 times), some outside
// the shard, 40 columns (not a multiple of 32): the CPU's sums, bit for bit, in fp32 and bf16.
TEST_F(CudaKernelsTest, EmbeddingBackwardOverManyTilesMatchesBitForBit) {
  STRATA_REQUIRE_GPU();
  constexpr std::size_t Nr = 700, Vt = 12, first = 2, shard = 8;
  constexpr int Cc = 40;
  std::vector<std::int32_t> tokens = random_tokens(Nr, int(Vt), 41);
  for (std::size_t n = 0; n < Nr; n += 7) tokens[n] = 5;
  Dev<std::int32_t> d_tokens(tokens);
  const std::vector<float> d = random_floats(Nr * Cc, 42, -2, 2);
  Dev<float> d_d(d);
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<float> table = random_floats(shard * Cc, 43, -2, 2);
    if (dt == DType::bf16) {
      const std::vector<bf16> b = random_bf16(shard * Cc, 43);
      std::memcpy(table.data(), b.data(), b.size() * sizeof(bf16));
    }
    Dev<float> d_table(table);
    gpu->embedding_rows_backward({d_table.p, shard * Cc, dt, Device::cuda}, d_d.p, d_tokens.p, Nr,
                                 first, shard, Cc);
    cpu.embedding_rows_backward({table.data(), shard * Cc, dt, Device::cpu}, d.data(),
                                tokens.data(), Nr, first, shard, Cc);
    sync();
    expect_bits("embedding_rows_backward", d_table.host(), table);
  }
}

TEST_F(CudaKernelsTest, HostTablesAreRefused) {
  STRATA_REQUIRE_GPU();
  std::vector<float> wte(Vl * C), rows(N * C);
  Dev<float> d_rows(rows);
  Dev<std::int32_t> d_tokens(random_tokens(N, V, 9));
  EXPECT_THROW(
      gpu->embedding_rows(d_rows.p, d_tokens.p, N, view(wte.data(), wte.size()), v0, Vl, C), Error);
}

// Each cross-entropy step on the same inputs on both backends.
TEST_F(CudaKernelsTest, VocabParallelCrossEntropySteps) {
  STRATA_REQUIRE_GPU();
  std::vector<float> logits = random_floats(N * Vl, 10, -6, 6);
  const std::vector<std::int32_t> targets = random_tokens(N, V, 11);
  Dev<std::int32_t> d_targets(targets);
  std::vector<float> mx(N);
  Dev<float> d_logits(logits), d_mx(mx);
  gpu->xent_row_max(d_mx.p, d_logits.p, N, Vl);
  cpu.xent_row_max(mx.data(), logits.data(), N, Vl);
  sync();
  expect_bits("xent_row_max", d_mx.host(), mx);

  std::vector<float> probs = logits, sum(N, -1.0f), target(N, -1.0f);
  Dev<float> d_probs(probs), d_sum(sum), d_target(target);
  gpu->xent_exp(d_probs.p, d_sum.p, d_target.p, d_mx.p, d_targets.p, v0, N, Vl);
  cpu.xent_exp(probs.data(), sum.data(), target.data(), mx.data(), targets.data(), v0, N, Vl);
  sync();
  expect_close("xent_exp probs", d_probs.host(), probs, 1e-5, 0);
  expect_close("xent_exp sum", d_sum.host(), sum, 1e-5, 0);
  expect_bits("xent_exp target", d_target.host(), target);
  int inside = 0;
  for (auto t : targets) inside += std::size_t(t) - v0 < Vl;
  ASSERT_GT(inside, 0);
  ASSERT_LT(inside, N);  // both branches ran

  // Normalise from the CPU's state on both, so the comparison is of this step alone.
  std::vector<float> losses(N);
  Dev<float> d_probs2(probs), d_sum2(sum), d_target2(target), d_losses(losses);
  gpu->xent_normalise(d_probs2.p, d_losses.p, d_sum2.p, d_target2.p, N, Vl);
  cpu.xent_normalise(probs.data(), losses.data(), sum.data(), target.data(), N, Vl);
  sync();
  expect_bits("xent_normalise probs", d_probs2.host(), probs);
  expect_close("xent_normalise losses", d_losses.host(), losses, 1e-6, 1e-6);

  std::vector<float> dlogits(N * Vl, 5.0f);
  Dev<float> d_dlogits(dlogits);
  gpu->xent_backward_shard(d_dlogits.p, d_probs2.p, d_targets.p, v0, 0.37f, N, Vl);
  cpu.xent_backward_shard(dlogits.data(), probs.data(), targets.data(), v0, 0.37f, N, Vl);
  sync();
  expect_bits("xent_backward_shard", d_dlogits.host(), dlogits);
}

TEST_F(CudaKernelsTest, SumToFp32Error) {
  STRATA_REQUIRE_GPU();
  for (std::size_t n : {std::size_t(1), std::size_t(1000), std::size_t(70001)}) {
    const std::vector<float> x = random_floats(n, 12, -1, 3);
    Dev<float> d_x(x);
    double abs_sum = 0;
    for (float v : x) abs_sum += std::fabs(v);
    EXPECT_NEAR(gpu->sum(d_x.p, n), cpu.sum(x.data(), n), 1e-5 * abs_sum) << n;
  }
  EXPECT_EQ(gpu->sum(nullptr, 0), 0.0);
}

// Row-major C[M,N] (+)= op(A) op(B) against a double reference, every transpose and C dtype.
TEST_F(CudaKernelsTest, GemmBf16AgainstADoubleReference) {
  STRATA_REQUIRE_GPU();
  constexpr int M = 7, Nc = 37, K = 24;
  const std::vector<bf16> a = random_bf16(M * K, 13), b = random_bf16(K * Nc, 14);
  Dev<bf16> d_a(a), d_b(b);
  EXPECT_EQ(gpu->gemm_bf16_scratchpad_bytes(false, false, M, Nc, K, DType::f32, false), 0u);
  for (int mode = 0; mode < 16; ++mode) {
    const bool ta = mode & 1, tb = mode & 2, acc = mode & 4, c_bf16 = mode & 8;
    SCOPED_TRACE(::testing::Message() << "trans_a " << ta << " trans_b " << tb << " accumulate "
                                      << acc << " bf16 C " << c_bf16);
    const std::vector<float> c0 = random_floats(M * Nc, 15, -2, 2);
    std::vector<double> want(M * Nc), scale(M * Nc);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < Nc; ++j) {
        double s = 0, s_abs = 0;
        for (int l = 0; l < K; ++l) {
          const double x = to_float(a[ta ? l * M + i : i * K + l]);
          const double y = to_float(b[tb ? j * K + l : l * Nc + j]);
          s += x * y;
          s_abs += std::fabs(x * y);
        }
        const double c = c_bf16 ? to_float(to_bf16(c0[i * Nc + j])) : c0[i * Nc + j];
        want[i * Nc + j] = s + (acc ? c : 0.0);
        scale[i * Nc + j] = s_abs + (acc ? std::fabs(c) : 0.0);
      }
    std::vector<float> got(M * Nc);
    if (c_bf16) {
      std::vector<bf16> c(M * Nc);
      for (int i = 0; i < M * Nc; ++i) c[i] = to_bf16(c0[i]);
      Dev<bf16> d_c(c);
      gpu->gemm_bf16(ta, tb, M, Nc, K, d_a.p, d_b.p, d_c.p, DType::bf16, acc, nullptr, 0);
      sync();
      const std::vector<bf16> back = d_c.host();
      for (int i = 0; i < M * Nc; ++i) got[i] = to_float(back[i]);
    } else {
      Dev<float> d_c(c0);
      gpu->gemm_bf16(ta, tb, M, Nc, K, d_a.p, d_b.p, d_c.p, DType::f32, acc, nullptr, 0);
      sync();
      got = d_c.host();
    }
    std::size_t bad = 0;
    for (int i = 0; i < M * Nc; ++i) {
      const double tol = 1e-5 * scale[i] + (c_bf16 ? std::ldexp(std::fabs(want[i]), -8) : 0.0);
      if (!(std::fabs(got[i] - want[i]) <= tol) && !bad++)
        ADD_FAILURE() << "C[" << i << "] = " << got[i] << ", want " << want[i];
    }
    EXPECT_EQ(bad, 0u);
  }
}

namespace {
double gelu_reference(double x) {
  return 0.5 * x *
         (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}
}  // namespace

// A linear layer's bf16 forward with its epilogue (cuBLASLt's BIAS epilogue and the GELU kernel
// on the GPU; gemm_bf16, add_bias and gelu_forward on the CPU), with and without bias and GELU,
// on both backends against a double reference. OC = 16 and OC = 10 (D's rows not a multiple of 8).
// Tolerances: out as gemm_bf16's (1e-5 of sum |x w| + |bias|); gelu_out against the double GELU
// of the backend's own out, 5e-7 (1 + |x|): a few fp32 ulp of the tanh formula (measured 9e-8 (1
// + |x|) on the CPU's sigmoid form and the emulator's tanhf; CUDA's tanhf is within 2 ulp).
TEST_F(CudaKernelsTest, MatmulBf16ForwardEpilogues) {
  STRATA_REQUIRE_GPU();
  constexpr int Nr = 37, Ci = 24;
  for (int OC : {16, 10})
    for (int mode = 0; mode < 4; ++mode) {
      const bool with_bias = mode & 1, with_gelu = mode & 2;
      SCOPED_TRACE(::testing::Message()
                   << "OC " << OC << " bias " << with_bias << " gelu " << with_gelu);
      const std::vector<bf16> x = random_bf16(Nr * Ci, 30), w = random_bf16(OC * Ci, 31);
      const std::vector<float> bias = random_floats(OC, 32, -2, 2);
      std::vector<double> want(Nr * OC), tol(Nr * OC);
      for (int n = 0; n < Nr; ++n)
        for (int o = 0; o < OC; ++o) {
          double sum = with_bias ? bias[o] : 0.0, scale = with_bias ? std::fabs(bias[o]) : 0.0;
          for (int c = 0; c < Ci; ++c) {
            const double p = double(to_float(x[n * Ci + c])) * to_float(w[o * Ci + c]);
            sum += p;
            scale += std::fabs(p);
          }
          want[n * OC + o] = sum;
          tol[n * OC + o] = 1e-5 * scale;
        }
      Dev<bf16> d_x(x), d_w(w);
      Dev<float> d_bias(bias), d_out(std::vector<float>(Nr * OC, NAN)),
          d_gelu(std::vector<float>(Nr * OC, NAN));
      std::vector<float> out(Nr * OC, NAN), gelu(Nr * OC, NAN);
      const float* b = with_bias ? d_bias.p : nullptr;
      gpu->matmul_bf16_forward(d_out.p, with_gelu ? d_gelu.p : nullptr, d_x.p, d_w.p, b, Nr, Ci, OC,
                               nullptr, 0, nullptr);
      std::vector<char> pad(
          cpu.gemm_bf16_scratchpad_bytes(false, true, Nr, OC, Ci, DType::f32, false));
      cpu.matmul_bf16_forward(out.data(), with_gelu ? gelu.data() : nullptr, x.data(), w.data(),
                              with_bias ? bias.data() : nullptr, Nr, Ci, OC, pad.data(), pad.size(),
                              nullptr);
      sync();
      for (auto [got, side] : {std::pair{d_out.host(), "gpu"}, {out, "cpu"}}) {
        std::size_t bad = 0;
        for (int i = 0; i < Nr * OC; ++i)
          if (!(std::fabs(got[i] - want[i]) <= tol[i]) && !bad++)
            ADD_FAILURE() << side << " out[" << i << "] = " << got[i] << ", want " << want[i];
        EXPECT_EQ(bad, 0u) << side;
      }
      if (!with_gelu) {
        for (float v : d_gelu.host()) ASSERT_TRUE(std::isnan(v)) << "gelu_out written";
        continue;
      }
      // GELU of the backend's own pre-GELU output: only the tanh formula's error.
      const std::vector<float> gpu_out = d_out.host();
      for (auto [got, pre, side] :
           {std::tuple{d_gelu.host(), gpu_out, "gpu"}, {gelu, out, "cpu"}}) {
        std::size_t bad = 0;
        for (int i = 0; i < Nr * OC; ++i) {
          const double x = pre[i], g = gelu_reference(x);
          if (!(std::fabs(got[i] - g) <= 5e-7 * (1 + std::fabs(x))) && !bad++)
            ADD_FAILURE() << side << " gelu_out[" << i << "] = " << got[i] << ", want " << g
                          << " (GELU of " << x << ")";
        }
        EXPECT_EQ(bad, 0u) << side;
      }
    }
}

// cuBLASLt's own checks, as an H100 with cuBLAS 13.1 answers them: a layout's leading dimension
// below its rows is CUBLAS_STATUS_INVALID_VALUE at the heuristic and at the matmul; a BIAS
// epilogue without a bias pointer passes the heuristic (which sees no pointers) and is refused by
// the matmul. Each case gives (heuristic, matmul).
// A bf16 run's FC layer writes its pre-GELU output in bf16, the fp32 sum rounded once, and its
// GELU output as the GELU of that bf16 value, rounded once (what Megatron-Core's bias-GELU sees):
// on the CPU (the steps) bit for bit against its fp32 output rounded and against its fp32 GELU of
// the widened bf16 values rounded; on the GPU the output within one bf16 rounding of the fp32
// one (a bf16-output algorithm may sum in another order) and the GELU within half a bf16 ulp and
// the tanh formula's error of the double GELU of its own bf16 output. And cuBLASLt has a fused
// bias algorithm for GPT-2's FC and QKV layers with bf16 outputs, so a GPU run does not fall back
// to the steps.
TEST_F(CudaKernelsTest, MatmulBf16ForwardWritesBf16Outputs) {
  STRATA_REQUIRE_GPU();
  constexpr int Nr = 37, Ci = 24;
  for (int OC : {16, 10}) {
    SCOPED_TRACE(::testing::Message() << "OC " << OC);
    const std::size_t n = std::size_t(Nr) * OC;
    const std::vector<bf16> x = random_bf16(Nr * Ci, 33), w = random_bf16(OC * Ci, 34);
    const std::vector<float> bias = random_floats(OC, 35, -2, 2), zeros(n), nans(n, NAN);
    const std::vector<bf16> zeros_h(n);
    Dev<bf16> d_x(x), d_w(w), d_out_h(zeros_h), d_gelu_h(zeros_h);
    Dev<float> d_bias(bias), d_out(zeros), d_gelu(zeros), d_f32(nans);
    gpu->matmul_bf16_forward(d_out.p, d_gelu.p, d_x.p, d_w.p, d_bias.p, Nr, Ci, OC, nullptr, 0,
                             nullptr);
    gpu->matmul_bf16_forward(d_out_h.p, d_gelu_h.p, d_x.p, d_w.p, d_bias.p, Nr, Ci, OC, nullptr, 0,
                             d_f32.p);
    std::vector<char> pad(
        cpu.gemm_bf16_scratchpad_bytes(false, true, Nr, OC, Ci, DType::f32, false));
    std::vector<float> out(n), gelu(n), f32(n);
    std::vector<bf16> out_h(n), gelu_h(n);
    cpu.matmul_bf16_forward(out.data(), gelu.data(), x.data(), w.data(), bias.data(), Nr, Ci, OC,
                            pad.data(), pad.size(), nullptr);
    cpu.matmul_bf16_forward(out_h.data(), gelu_h.data(), x.data(), w.data(), bias.data(), Nr, Ci,
                            OC, pad.data(), pad.size(), f32.data());
    sync();
    const auto rounded = [](const std::vector<float>& v) {
      std::vector<bf16> r(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) r[i] = to_bf16(v[i]);
      return r;
    };
    std::vector<float> widened(n), gelu_of_widened(n);
    for (std::size_t i = 0; i < n; ++i) widened[i] = to_float(out_h[i]);
    cpu::gelu_forward(gelu_of_widened.data(), widened.data(), std::int64_t(n));
    expect_bits("cpu out", out_h, rounded(out));
    expect_bits("cpu gelu", gelu_h, rounded(gelu_of_widened));
    const std::vector<bf16> gpu_out_h = d_out_h.host(), gpu_gelu_h = d_gelu_h.host();
    const std::vector<float> gpu_out = d_out.host();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double g = to_float(gpu_out_h[i]), f = gpu_out[i];
      if (!(std::fabs(g - f) <= std::ldexp(std::fabs(f), -8) + 1e-5 * (1 + std::fabs(f))) && !bad++)
        ADD_FAILURE() << "gpu out[" << i << "] = " << g << ", fp32 " << f;
      const double x = to_float(gpu_out_h[i]), want = gelu_reference(x),
                   got = to_float(gpu_gelu_h[i]);
      if (!(std::fabs(got - want) <= std::ldexp(std::fabs(want), -8) + 5e-7 * (1 + std::fabs(x))) &&
          !bad++)
        ADD_FAILURE() << "gpu gelu[" << i << "] = " << got << ", want " << want << " (GELU of " << x
                      << ")";
    }
    EXPECT_EQ(bad, 0u);
  }
  // GPT-2's FC layer and QKV layer at 8 x 1024 tokens.
  EXPECT_TRUE(gpu->fuses_bias(8192, 768, 3072, DType::bf16))
      << "cuBLASLt has no BIAS algorithm with bf16 outputs and an fp32 bias here: a bf16 run's FC "
         "layers fall back to a GEMM and three kernels";
  EXPECT_TRUE(gpu->fuses_bias(8192, 768, 2304, DType::bf16))
      << "cuBLASLt has no BIAS algorithm with a bf16 output and an fp32 bias here: a bf16 run's "
         "QKV layers fall back to a GEMM and two kernels";
  EXPECT_TRUE(gpu->fuses_bias(8192, 768, 3072, DType::f32));
}

TEST_F(CudaKernelsTest, CublasLtRefusesBadArguments) {
  STRATA_REQUIRE_GPU();
  constexpr int M = 16, Nc = 8, K = 24;
  Dev<bf16> d_a(random_bf16(K * M, 40)), d_b(random_bf16(K * Nc, 41));
  Dev<float> d_d(std::vector<float>(M * Nc)), d_aux(std::vector<float>((M + 4) * Nc));
  auto status = [&](std::int64_t lda, cublasLtEpilogue_t epilogue, std::int64_t aux_ld) {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulPreference_t pref;
    EXPECT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
              CUBLAS_STATUS_SUCCESS);
    const std::int32_t op_t = CUBLAS_OP_T;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                   sizeof(std::uint32_t));
    void* aux = d_aux.p;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                   sizeof aux);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                   sizeof aux_ld);
    cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, K, M, lda);
    cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, K, Nc, K);
    cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, M, Nc, M);
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t heuristic =
        cublasLtMatmulAlgoGetHeuristic(ctx->cublaslt, desc, a, b, d, d, pref, 1, &result, &found);
    const float alpha = 1, beta = 0;
    const cublasStatus_t matmul =
        cublasLtMatmul(ctx->cublaslt, desc, &alpha, d_a.p, a, d_b.p, b, &beta, d_d.p, d, d_d.p, d,
                       nullptr, nullptr, 0, ctx->stream);
    sync();
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatmulDescDestroy(desc);
    return std::pair{heuristic, matmul};
  };
  constexpr auto ok = CUBLAS_STATUS_SUCCESS, invalid = CUBLAS_STATUS_INVALID_VALUE;
  EXPECT_EQ(status(K, CUBLASLT_EPILOGUE_DEFAULT, M), std::pair(ok, ok));
  EXPECT_EQ(status(K, CUBLASLT_EPILOGUE_GELU_AUX, M), std::pair(ok, ok));
  EXPECT_EQ(status(K - 1, CUBLASLT_EPILOGUE_DEFAULT, M), std::pair(invalid, invalid));
  EXPECT_EQ(status(K, CUBLASLT_EPILOGUE_BIAS, M), std::pair(ok, invalid));
  EXPECT_EQ(status(K, CUBLASLT_EPILOGUE_GELU_AUX, M + 4), std::pair(ok, ok)) << "aux ld M + 4";
  EXPECT_EQ(status(K, CUBLASLT_EPILOGUE_GELU_AUX, M - 8), std::pair(invalid, invalid))
      << "aux ld below D's rows";
}

#ifdef STRATA_CUDA_EMULATOR
// The emulator's check beyond cuBLASLt's status codes: an algorithm chosen for 256-byte aligned
// operands (the preference's default) refuses a D that is only 4-byte aligned; on a GPU such a
// call faults or is refused. matmul_bf16_forward tells the heuristic the real alignment, so the
// same offset output works through it.
TEST_F(CudaKernelsTest, CublasLtAlgorithmKeepsItsAlignment) {
  constexpr int M = 8, Nc = 4, K = 8;
  Dev<bf16> d_a(random_bf16(K * M, 50)), d_b(random_bf16(K * Nc, 51));
  Dev<float> d_d(std::vector<float>(M * Nc + 1));
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, d;
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, M, K, M);
  cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, K, Nc, K);
  cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, M, Nc, M);
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  ASSERT_EQ(
      cublasLtMatmulAlgoGetHeuristic(ctx->cublaslt, desc, a, b, d, d, pref, 1, &result, &found),
      CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(found, 1);
  const float alpha = 1, beta = 0;
  float* shifted = d_d.p + 1;
  EXPECT_EQ(cublasLtMatmul(ctx->cublaslt, desc, &alpha, d_a.p, a, d_b.p, b, &beta, shifted, d,
                           shifted, d, &result.algo, nullptr, 0, ctx->stream),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(a);
  cublasLtMatrixLayoutDestroy(b);
  cublasLtMatrixLayoutDestroy(d);
  cublasLtMatmulDescDestroy(desc);
  // Through the kernel entry: out = x[Nc,K] @ w[M,K]^T at the same offset, no bias.
  gpu->matmul_bf16_forward(shifted, ActView{}, d_b.p, d_a.p, nullptr, Nc, K, M, nullptr, 0,
                           nullptr);
  sync();
  const std::vector<float> got = d_d.host();
  const std::vector<bf16> x = d_b.host(), w = d_a.host();
  double sum = 0;
  for (int c = 0; c < K; ++c) sum += double(to_float(x[c])) * to_float(w[c]);
  EXPECT_NEAR(got[1], sum, 1e-5 * (1 + std::fabs(sum)));
}

// matmul_bf16_forward keeps cuBLASLt's plan of a shape: its second call asks the heuristic
// nothing, and still uses that call's own bias and output pointers (set on the cached descriptor
// per call), not the first call's.
TEST_F(CudaKernelsTest, CublasLtPlanIsReusedWithEachCallsPointers) {
  constexpr int Nr = 8, Ci = 16, OC = 16;
  Dev<bf16> d_x(random_bf16(Nr * Ci, 60)), d_w(random_bf16(OC * Ci, 61));
  const std::vector<float> bias1 = random_floats(OC, 62, -2, 2),
                           bias2 = random_floats(OC, 63, 3, 5);
  Dev<float> d_b1(bias1), d_b2(bias2), d_out1(std::vector<float>(Nr * OC)),
      d_out2(std::vector<float>(Nr * OC)), d_g1(std::vector<float>(Nr * OC)),
      d_g2(std::vector<float>(Nr * OC));
  gpu->matmul_bf16_forward(d_out1.p, d_g1.p, d_x.p, d_w.p, d_b1.p, Nr, Ci, OC, nullptr, 0, nullptr);
  const long long asked = strata_emu::lt_heuristic_calls();
  gpu->matmul_bf16_forward(d_out2.p, d_g2.p, d_x.p, d_w.p, d_b2.p, Nr, Ci, OC, nullptr, 0, nullptr);
  EXPECT_EQ(strata_emu::lt_heuristic_calls(), asked) << "the plan was made again";
  sync();
  const std::vector<float> out1 = d_out1.host(), out2 = d_out2.host(), g2 = d_g2.host();
  for (int n = 0; n < Nr; ++n)
    for (int o = 0; o < OC; ++o) {
      const int i = n * OC + o;
      // Same product, the bias swapped: the pre-GELU outputs differ by exactly that.
      EXPECT_NEAR(out2[i] - out1[i], bias2[o] - bias1[o], 1e-5 * (1 + std::fabs(out2[i])))
          << "out[" << i << "]";
      EXPECT_NEAR(g2[i], gelu_reference(out2[i]), 5e-7 * (1 + std::fabs(out2[i])))
          << "gelu_out[" << i << "]";
    }
}
#endif

namespace {
// A host buffer and its device copy, run through both backends and compared.
struct Mirror {
  std::vector<float> h;
  Dev<float> d;
  explicit Mirror(std::vector<float> v) : h(std::move(v)), d(h) {}
  void expect_close(const char* what) const { ::expect_close(what, d.host(), h, 1e-4, 1e-5); }
};
}  // namespace

// Each layer pass reaches cuda/layers.cuh's function with its arguments in order.
TEST_F(CudaKernelsTest, LayerPassesMatchTheCpuBackend) {
  STRATA_REQUIRE_GPU();
  constexpr int B = 2, Ts = 5, NH = 3, OC = 10, Nr = B * Ts;
  const std::vector<std::int32_t> tokens = random_tokens(Nr, V, 20);
  Dev<std::int32_t> d_tokens(tokens);
  std::uint32_t seed = 21;
  auto rnd = [&](std::size_t n) { return random_floats(n, seed++, -2, 2); };
  auto both = [&](auto&& run) {  // run(kernels, pick) with pick choosing host or device pointers
    run(
        cpu, [](Mirror& m) { return m.h.data(); }, tokens.data());
    run(
        *gpu, [](Mirror& m) { return m.d.p; }, d_tokens.p);
    sync();
  };
  Mirror wte(rnd(V * C)), wpe(rnd(Ts * C)), x(rnd(Nr * C)), dwte(rnd(V * C)), dwpe(rnd(Ts * C)),
      dout(rnd(Nr * C));
  both([&](Kernels& k, auto p, const std::int32_t* tok) {
    k.encoder_forward(p(x), tok, p(wte), p(wpe), B, Ts, C);
    k.encoder_backward(p(dwte), p(dwpe), p(dout), tok, B, Ts, C);
  });
  x.expect_close("encoder_forward");
  dwte.expect_close("encoder_backward dwte");
  dwpe.expect_close("encoder_backward dwpe");

  Mirror ln(rnd(Nr * C)), mean(rnd(Nr)), rstd(rnd(Nr)), w(rnd(C)), b(rnd(C)), dinp(rnd(Nr * C)),
      dw(rnd(C)), db(rnd(C));
  both([&](Kernels& k, auto p, const std::int32_t*) {
    k.layernorm_forward(p(ln), p(mean), p(rstd), p(x), p(w), p(b), Nr, C);
    k.layernorm_backward(p(dinp), p(dw), p(db), p(dout), p(x), p(w), p(mean), p(rstd), Nr, C);
  });
  for (auto [m, what] : {std::pair{&ln, "layernorm out"},
                         {&mean, "mean"},
                         {&rstd, "rstd"},
                         {&dinp, "layernorm dinp"},
                         {&dw, "dweight"},
                         {&db, "dbias"}})
    m->expect_close(what);

  Mirror mo(rnd(Nr * OC)), mw(rnd(OC * C)), mb(rnd(OC)), mdo(rnd(Nr * OC)), mdi(rnd(Nr * C)),
      mdw(rnd(OC * C)), mdb(rnd(OC));
  both([&](Kernels& k, auto p, const std::int32_t*) {
    k.matmul_forward(p(mo), p(x), p(mw), p(mb), Nr, C, OC);
    k.matmul_backward(p(mdi), p(mdw), p(mdb), p(mdo), p(x), p(mw), Nr, C, OC);
  });
  for (auto [m, what] : {std::pair{&mo, "matmul out"},
                         {&mdi, "matmul dinp"},
                         {&mdw, "matmul dweight"},
                         {&mdb, "matmul dbias"}})
    m->expect_close(what);

  Mirror qkv(rnd(Nr * 3 * C)), att(rnd(B * NH * Ts * Ts)), ao(rnd(Nr * C)), dqkv(rnd(Nr * 3 * C)),
      datt(rnd(B * NH * Ts * Ts));
  both([&](Kernels& k, auto p, const std::int32_t*) {
    k.attention_forward(p(ao), p(att), p(qkv), B, Ts, C, NH);
    k.attention_backward(p(dqkv), p(datt), p(dout), p(qkv), p(att), p(ao), B, Ts, C, NH);
  });
  // att is each backend's own (the CPU's probabilities, the fused kernel's log-sum-exps).
  ao.expect_close("attention out");
  dqkv.expect_close("attention dqkv");

  Mirror g(rnd(Nr * C)), dg(rnd(Nr * C)), r(rnd(Nr * C));
  both([&](Kernels& k, auto p, const std::int32_t*) {
    k.gelu_forward(p(g), p(x), Nr * C);
    k.gelu_backward(p(dg), p(x), p(dout), Nr * C);
    k.residual_forward(p(r), p(x), p(dout), Nr * C);
  });
  g.expect_close("gelu_forward");
  dg.expect_close("gelu_backward");
  r.expect_close("residual_forward");

  Mirror probs(rnd(Nr * V)), losses(rnd(Nr)), logits(rnd(Nr * V)), dl(rnd(Nr * V));
  both([&](Kernels& k, auto p, const std::int32_t* tok) {
    k.softmax_crossentropy_forward(p(probs), p(losses), p(logits), tok, Nr, V);
    k.crossentropy_softmax_backward(p(dl), p(probs), tok, 0.5f, Nr, V);
  });
  probs.expect_close("softmax probs");
  losses.expect_close("softmax losses");
  dl.expect_close("crossentropy dlogits");
}

// ---------------------------------------------------------------------------------------------
// The bf16 head's cross-entropy (bf16(softmax - onehot) kept instead of fp32 probabilities), both
// backends against a double reference: the gradient within one bf16 rounding (2^-9 relative,
// taken as 2^-8) plus the fp32 softmax's error (1e-6), the losses within the fp32 error of
// log(sum) - target (1e-5 relative).

namespace {

struct XentReference {
  std::vector<double> grad, loss;  // [N, V] softmax - onehot, [N]
};
XentReference xent_reference(const std::vector<float>& logits,
                             const std::vector<std::int32_t>& targets, int rows, int cols) {
  XentReference r{std::vector<double>(logits.size()), std::vector<double>(rows)};
  for (int n = 0; n < rows; ++n) {
    const float* x = logits.data() + std::size_t(n) * cols;
    const double mx = *std::max_element(x, x + cols);
    double sum = 0;
    for (int i = 0; i < cols; ++i) sum += std::exp(x[i] - mx);
    for (int i = 0; i < cols; ++i)
      r.grad[std::size_t(n) * cols + i] = std::exp(x[i] - mx) / sum - (i == targets[n] ? 1 : 0);
    r.loss[n] = std::log(sum) - (x[targets[n]] - mx);
  }
  return r;
}

void expect_bf16_near(const char* what, const std::vector<bf16>& got,
                      const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = std::ldexp(std::fabs(want[i]), -8) + 1e-6;
    if (!(std::fabs(to_float(got[i]) - want[i]) <= tol) && !bad++) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                     << " out of tolerance; first at " << first << ": " << to_float(got[first])
                     << ", want " << want[first];
}
void expect_near(const char* what, const std::vector<float>& got, const std::vector<double>& want,
                 double rtol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rtol * std::fabs(want[i]) + 1e-6) << what << " [" << i << "]";
}

// Host memory, or a device copy of it (on_device), for running one sequence on either backend.
template <class T>
struct Buf {
  std::vector<T> h;
  std::unique_ptr<Dev<T>> d;
  Buf(std::vector<T> v, bool on_device) : h(std::move(v)) {
    if (on_device) d = std::make_unique<Dev<T>>(h);
  }
  T* p() { return d ? d->p : h.data(); }
  std::vector<T> get() const { return d ? d->host() : h; }
  void put(const std::vector<T>& v) {
    h = v;
    if (d) STRATA_CUDA_CHECK(cudaMemcpy(d->p, v.data(), v.size() * sizeof(T), cudaMemcpyDefault));
  }
};

// The bf16 head's logits are the GEMM's bf16 output: random bf16 values (their widened values
// the reference's inputs), the gradient written over them.
std::vector<bf16> bf16_logits(std::vector<float>& logits) {
  std::vector<bf16> h(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) {
    h[i] = to_bf16(logits[i]);
    logits[i] = to_float(h[i]);
  }
  return h;
}

}  // namespace

TEST_F(CudaKernelsTest, Bf16CrossEntropyAgainstADoubleReference) {
  STRATA_REQUIRE_GPU();
  std::vector<float> logits = random_floats(N * V, 30, -6, 6);
  const std::vector<bf16> logits_h = bf16_logits(logits);
  const std::vector<std::int32_t> targets = random_tokens(N, V, 31);
  const XentReference ref = xent_reference(logits, targets, N, V);
  for (bool dev : {false, true}) {
    SCOPED_TRACE(dev ? "cuda" : "cpu");
    Kernels& k = dev ? static_cast<Kernels&>(*gpu) : cpu;
    Buf<std::int32_t> tg(targets, dev);
    // Whole rows (tp 1), in place; the losses start as garbage (=, not +=).
    Buf<float> losses(std::vector<float>(N, 7.0f), dev);
    Buf<bf16> grad(logits_h, dev);
    k.softmax_crossentropy_grad_bf16(grad.p(), losses.p(), tg.p(), N, V);
    sync();
    expect_bf16_near("softmax_crossentropy_grad_bf16", grad.get(), ref.grad);
    expect_near("softmax_crossentropy_grad_bf16 losses", losses.get(), ref.loss, 1e-5);

    // Vocab-parallel over two shards of W columns, the all-reduces done here: each row's target
    // is in one shard and outside the other.
    constexpr std::size_t S = 2, W = V / S;
    std::vector<Buf<float>> mx, sum, target, shard_losses;
    std::vector<Buf<bf16>> xs;
    std::vector<std::vector<bf16>> shards;
    std::vector<float> row_max(N);
    for (std::size_t s = 0; s < S; ++s) {
      std::vector<bf16> cols(N * W);
      for (int n = 0; n < N; ++n)
        std::copy_n(logits_h.begin() + n * V + s * W, W, cols.begin() + n * W);
      xs.emplace_back(cols, dev);
      shards.push_back(cols);
      for (auto* b : {&mx, &sum, &target, &shard_losses})
        b->emplace_back(std::vector<float>(N), dev);
    }
    for (int n = 0; n < N; ++n)
      row_max[n] = *std::max_element(logits.begin() + n * V, logits.begin() + (n + 1) * V);
    auto all_reduce = [&](std::vector<Buf<float>>& bufs, bool is_max) {
      sync();
      std::vector<float> r = bufs[0].get();
      for (std::size_t s = 1; s < S; ++s) {
        const std::vector<float> o = bufs[s].get();
        for (int n = 0; n < N; ++n) r[n] = is_max ? std::max(r[n], o[n]) : r[n] + o[n];
      }
      for (auto& b : bufs) b.put(r);
    };
    for (std::size_t s = 0; s < S; ++s) k.xent_row_max(mx[s].p(), xs[s].p(), N, W);
    all_reduce(mx, true);
    expect_bits("xent_row_max of bf16 logits", mx[0].get(), row_max);
    for (std::size_t s = 0; s < S; ++s)
      k.xent_exp(xs[s].p(), sum[s].p(), target[s].p(), mx[s].p(), tg.p(), s * W, N, W);
    all_reduce(sum, false);
    all_reduce(target, false);
    for (std::size_t s = 0; s < S; ++s) {
      expect_bits("bf16 logits after xent_exp (read only)", xs[s].get(), shards[s]);
      k.xent_normalise_grad_bf16(xs[s].p(), shard_losses[s].p(), mx[s].p(), sum[s].p(),
                                 target[s].p(), tg.p(), s * W, N, W);
    }
    sync();
    std::vector<bf16> whole(N * V);
    for (std::size_t s = 0; s < S; ++s) {
      const std::vector<bf16> g = xs[s].get();
      for (int n = 0; n < N; ++n) std::copy_n(g.begin() + n * W, W, whole.begin() + n * V + s * W);
      expect_near("xent_normalise_grad_bf16 losses", shard_losses[s].get(), ref.loss, 1e-5);
    }
    expect_bf16_near("xent_normalise_grad_bf16", whole, ref.grad);
  }
}

// Rows longer than a block (the CUDA kernel's running max and sum per thread, rescaled when the
// max rises): random logits, a rising ramp (the max rises at every element a thread reads), a
// falling one and a constant row, against the same double reference and bounds.
TEST_F(CudaKernelsTest, Bf16CrossEntropyOverRowsLongerThanABlock) {
  STRATA_REQUIRE_GPU();
  constexpr int rows = 4, cols = 5003;
  std::vector<float> logits = random_floats(std::size_t(rows) * cols, 33, -8, 8);
  for (int i = 0; i < cols; ++i) {
    logits[std::size_t(cols) + i] = -8.0f + 16.0f * float(i) / cols;
    logits[std::size_t(2 * cols) + i] = 8.0f - 16.0f * float(i) / cols;
    logits[std::size_t(3 * cols) + i] = 0.5f;
  }
  const std::vector<bf16> logits_h = bf16_logits(logits);
  const std::vector<std::int32_t> targets = {17, cols - 1, 0, 2500};
  const XentReference ref = xent_reference(logits, targets, rows, cols);
  Buf<std::int32_t> tg(targets, true);
  Buf<float> losses(std::vector<float>(rows, 7.0f), true);
  Buf<bf16> grad(logits_h, true);
  gpu->softmax_crossentropy_grad_bf16(grad.p(), losses.p(), tg.p(), rows, cols);
  sync();
  expect_bf16_near("softmax_crossentropy_grad_bf16", grad.get(), ref.grad);
  expect_near("softmax_crossentropy_grad_bf16 losses", losses.get(), ref.loss, 1e-5);
}

// x = bf16(float(x) * scale) in place: the same bits on both backends, one rounding of the fp32
// product, within one bf16 rounding of the double product.
TEST_F(CudaKernelsTest, ScaleBf16RoundsTheFp32ProductOnce) {
  STRATA_REQUIRE_GPU();
  const std::vector<bf16> x = random_bf16(N * V, 32);
  const float scale = 0.37f;
  std::vector<bf16> want(x.size()), host = x;
  for (std::size_t i = 0; i < x.size(); ++i) want[i] = to_bf16(to_float(x[i]) * scale);
  Dev<bf16> d_x(x);
  cpu.scale_bf16(host.data(), scale, x.size());
  gpu->scale_bf16(d_x.p, scale, x.size() - 1);  // the last element stays
  sync();
  expect_bits("scale_bf16 cpu", host, want);
  std::vector<bf16> got = d_x.host();
  EXPECT_EQ(got.back().bits, x.back().bits);
  got.back() = want.back();
  expect_bits("scale_bf16 cuda", got, want);
  std::vector<double> exact(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) exact[i] = double(to_float(x[i])) * scale;
  expect_bf16_near("scale_bf16 against double", host, exact);
}
