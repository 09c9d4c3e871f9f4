// CUDA layer passes against the CPU reference (strata::cpu, itself checked against finite
// differences in test_layers.cpp): the same random inputs through both, every output compared.
// Gradient outputs start from random non-zero values on both sides, so the += convention is
// checked too.
//
// Tolerances, per element |gpu - cpu| <= atol + rtol |cpu| (fp32 on both sides, no TF32):
//   elementwise passes (encoder forward, residual, GELU, AdamW, cross-entropy backward):
//     rtol 1e-5, atol 1e-6 -- different exp/tanh/sqrt implementations (CPU: vecmath.hpp
//     approximations within 2-3 ulp; GPU: CUDA's expf/tanhf/sqrtf), a few ulp apart.
//   reductions (LayerNorm, softmax, cross-entropy loss, encoder backward with atomics):
//     rtol 1e-4, atol 1e-5 -- summation order differs (warp trees vs sequential SIMD lanes).
//   column sums over many rows (the norms' dweight and dbias): |gpu - cpu| <= atol + rtol S, with
//     S = |initial| + sum over rows of |term|, rtol 4e-6 ~ sqrt(4200) * 6e-8: the reordered sum's
//     error scales with its terms, and a sum that cancels to near 0 (0.0495 of terms summing 1.7e3
//     in absolute value: 2.7e-5 apart under ASan's build) fails any bound relative to the result.
//     One row left out moves a sum by its term, ~0.5, far outside.
//   GEMM-derived outputs (matmul, attention): rtol 1e-4, atol 1e-5 on K <= 80-long dot products
//     of O(1) values, whose reordering error is ~ sqrt(K) * 6e-8 * |terms| ~ 1e-6.
//   tensor-core attention (bf16 operands): per-element first-order bounds from the reference's
//     terms, derived above CudaTcAttention.
//   GELU backward: against a double reference, |gpu - ref| <= 1e-6 + 1e-5 (|dinp0| + |dout|). In
//     fp32, tanh's 1-ulp error (6e-8) is multiplied by 0.5 |x| du/dx (up to 14 at |x| = 6) in the
//     derivative, ~1.7e-6 |dout|, and the += onto dinp0 can cancel the sum to near 0: the error
//     scales with the terms, not with the result. Measured on this test's inputs: the fp32 GPU
//     formula within 5.4e-7 (|dinp0| + |dout|) of the double result, the fp32 CPU reference (a
//     sigmoid approximation) within 1.9e-6, but up to 1.8e-3 of the result itself, so it cannot
//     be the reference at rtol 1e-5.
// A wrong transposition, index or missing term gives O(1) errors, far outside these.
//
// Every GPU test skips (visibly, by name) on a machine without a CUDA device. The peak-FLOP table
// and cuda_device_count() are checked everywhere.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cpu/layers.hpp"
#include "backends/cuda/device.hpp"
#include "backends/cuda/kernels.hpp"
#include "backends/cuda/layers.cuh"
#include "cuda_test.hpp"
#include "model/moe_dispatch.hpp"
#include "strata/types.hpp"

namespace cpu = strata::cpu;
namespace gpu = strata::cuda;

namespace {

constexpr double kElemRtol = 1e-5, kElemAtol = 1e-6;
constexpr double kReduceRtol = 1e-4, kReduceAtol = 1e-5;
constexpr double kGemmRtol = 1e-4, kGemmAtol = 1e-5;

// A device copy of a host vector (or n zeros); freed on scope exit.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : n_(host.size()) {
    STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), bytes()));
    STRATA_CUDA_CHECK(cudaMemcpy(p_, host.data(), bytes(), cudaMemcpyHostToDevice));
    // A pageable upload may still be in flight when cudaMemcpy returns, and the layers run on a
    // non-blocking stream that does not wait for the legacy default stream: finish it here.
    STRATA_CUDA_CHECK(cudaDeviceSynchronize());
  }
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), bytes()));
    STRATA_CUDA_CHECK(cudaMemset(p_, 0, bytes()));
    STRATA_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  // Waits for all device work, then copies back.
  std::vector<T> host() const {
    STRATA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> h(n_);
    STRATA_CUDA_CHECK(cudaMemcpy(h.data(), p_, bytes(), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  std::size_t bytes() const { return n_ * sizeof(T); }
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

// Every element within atol + rtol scale[i]; reports the count and the worst element.
void expect_close_scaled(const char* what, const std::vector<float>& got,
                         const std::vector<double>& want, const std::vector<double>& scale,
                         double rtol, double atol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(got.size(), scale.size()) << what;
  std::size_t bad = 0, worst = 0;
  double worst_excess = -1.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    const double lim = atol + rtol * scale[i];
    if (!(err <= lim)) ++bad;  // NaN counts as bad
    const double excess = std::isnan(err) ? 1e300 : err - lim;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                     << " elements out of tolerance (rtol " << rtol << ", atol " << atol
                     << "); worst at " << worst << ": gpu " << got[worst] << " reference "
                     << want[worst];
}

// Every element within atol + rtol |want|.
void expect_close(const char* what, const std::vector<float>& got, const std::vector<float>& want,
                  double rtol, double atol) {
  const std::vector<double> want_d(want.begin(), want.end());
  std::vector<double> scale(want.size());
  for (std::size_t i = 0; i < want.size(); ++i) scale[i] = std::fabs(want_d[i]);
  expect_close_scaled(what, got, want_d, scale, rtol, atol);
}

// S[c] = |init[c]| + sum over the Nr rows of |term(r, c)|: the scale of a column sum's error.
template <class Term>
std::vector<double> column_sum_scale(const std::vector<float>& init, int Nr, int Cw, Term term) {
  std::vector<double> scale(init.begin(), init.end());
  for (double& s : scale) s = std::fabs(s);
  for (int r = 0; r < Nr; ++r)
    for (int c = 0; c < Cw; ++c) scale[std::size_t(c)] += std::fabs(double(term(r, c)));
  return scale;
}
constexpr double kColumnSumRtol = 4e-6;

// Shapes shared by the tests: not multiples of 32, so every partial warp / block path runs.
constexpr int B = 3, T = 37, C = 48, NH = 4, V = 101;
constexpr int N = B * T;

class CudaLayers : public ::testing::Test {
 protected:
  void SetUp() override {
    STRATA_REQUIRE_GPU();
    ctx_ = std::make_unique<gpu::CudaContext>(0);
  }
  const gpu::CudaContext& ctx() const { return *ctx_; }

 private:
  std::unique_ptr<gpu::CudaContext> ctx_;
};

// ---------------------------------------------------------------------------------------------

TEST_F(CudaLayers, EncoderForward) {
  const auto tokens = random_tokens(N, V, 1);
  const auto wte = random_floats(std::size_t(V) * C, 2), wpe = random_floats(std::size_t(T) * C, 3);
  std::vector<float> want(std::size_t(N) * C);
  cpu::encoder_forward(want.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);

  DeviceBuffer<std::int32_t> d_tokens(tokens);
  DeviceBuffer<float> d_wte(wte), d_wpe(wpe), d_out(want.size());
  gpu::encoder_forward(ctx(), d_out.get(), d_tokens.get(), d_wte.get(), d_wpe.get(), B, T, C);
  expect_close("out", d_out.host(), want, kElemRtol, kElemAtol);
}

TEST_F(CudaLayers, EncoderBackward) {
  // A small vocabulary so that tokens repeat and their gradients collide.
  const int Vs = 7;
  const auto tokens = random_tokens(N, Vs, 4);
  const auto dout = random_floats(std::size_t(N) * C, 5);
  auto dwte = random_floats(std::size_t(Vs) * C, 6), dwpe = random_floats(std::size_t(T) * C, 7);
  DeviceBuffer<std::int32_t> d_tokens(tokens);
  DeviceBuffer<float> d_dout(dout), d_dwte(dwte), d_dwpe(dwpe);
  cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  gpu::encoder_backward(ctx(), d_dwte.get(), d_dwpe.get(), d_dout.get(), d_tokens.get(), B, T, C);
  expect_close("dwte", d_dwte.host(), dwte, kReduceRtol, kReduceAtol);
  expect_close("dwpe", d_dwpe.host(), dwpe, kReduceRtol, kReduceAtol);
}

// ---------------------------------------------------------------------------------------------

// LayerNorm forward and backward at a width below and above one warp's stride, over more rows
// than the backward's 512 blocks of 8 warps hold at once (each warp then sums two or more rows
// into its slice), at a width whose backward takes 3 warps a block (2,048), and at one whose
// backward needs more than 48 KiB of shared memory for one warp (the opt-in path).
class CudaLayerNorm : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(CudaLayerNorm, ForwardAndBackward) {
  STRATA_REQUIRE_GPU();
  gpu::CudaContext ctx(0);
  const auto [Nr, Cw] = GetParam();
  const std::size_t n = std::size_t(Nr) * Cw;
  const auto x = random_floats(n, 10, -2.0f, 3.0f), w = random_floats(Cw, 11),
             b = random_floats(Cw, 12);
  std::vector<float> out(n), mean(Nr), rstd(Nr);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), Nr,
                         Cw);
  DeviceBuffer<float> d_x(x), d_w(w), d_b(b), d_out(n), d_mean(Nr), d_rstd(Nr);
  gpu::layernorm_forward(ctx, d_out.get(), d_mean.get(), d_rstd.get(), d_x.get(), d_w.get(),
                         d_b.get(), Nr, Cw);
  expect_close("out", d_out.host(), out, kReduceRtol, kReduceAtol);
  expect_close("mean", d_mean.host(), mean, kReduceRtol, kReduceAtol);
  expect_close("rstd", d_rstd.host(), rstd, kReduceRtol, kReduceAtol);

  const auto dout = random_floats(n, 13);
  auto dx = random_floats(n, 14), dw = random_floats(Cw, 15), db = random_floats(Cw, 16);
  DeviceBuffer<float> d_dout(dout), d_dx(dx), d_dw(dw), d_db(db);
  const auto at = [Cw](int r, int c) { return std::size_t(r) * Cw + c; };
  const auto dw_scale = column_sum_scale(
      dw, Nr, Cw, [&](int r, int c) { return dout[at(r, c)] * (x[at(r, c)] - mean[r]) * rstd[r]; });
  const auto db_scale = column_sum_scale(db, Nr, Cw, [&](int r, int c) { return dout[at(r, c)]; });
  cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), Nr, Cw);
  gpu::layernorm_backward(ctx, d_dx.get(), d_dw.get(), d_db.get(), d_dout.get(), d_x.get(),
                          d_w.get(), d_mean.get(), d_rstd.get(), Nr, Cw);
  expect_close("dinp", d_dx.host(), dx, kReduceRtol, kReduceAtol);
  const std::vector<double> dw_want(dw.begin(), dw.end()), db_want(db.begin(), db.end());
  expect_close_scaled("dweight", d_dw.host(), dw_want, dw_scale, kColumnSumRtol, kReduceAtol);
  expect_close_scaled("dbias", d_db.host(), db_want, db_scale, kColumnSumRtol, kReduceAtol);
}

INSTANTIATE_TEST_SUITE_P(Widths, CudaLayerNorm,
                         ::testing::Values(std::pair{N, 20}, std::pair{N, 80}, std::pair{4200, 100},
                                           std::pair{40, 2048}, std::pair{16, 8192}),
                         [](const auto& info) {
                           return "N" + std::to_string(info.param.first) + "_C" +
                                  std::to_string(info.param.second);
                         });

// ---------------------------------------------------------------------------------------------

class CudaMatmul : public ::testing::TestWithParam<bool> {};  // with / without bias

TEST_P(CudaMatmul, ForwardAndBackward) {
  STRATA_REQUIRE_GPU();
  gpu::CudaContext ctx(0);
  const bool with_bias = GetParam();
  const int Cin = 80, OC = 72;
  const auto x = random_floats(std::size_t(N) * Cin, 20),
             w = random_floats(std::size_t(OC) * Cin, 21), bias = random_floats(OC, 22);
  std::vector<float> out(std::size_t(N) * OC);
  cpu::matmul_forward(out.data(), x.data(), w.data(), with_bias ? bias.data() : nullptr, N, Cin,
                      OC);
  DeviceBuffer<float> d_x(x), d_w(w), d_bias(bias), d_out(out.size());
  gpu::matmul_forward(ctx, d_out.get(), d_x.get(), d_w.get(), with_bias ? d_bias.get() : nullptr, N,
                      Cin, OC);
  expect_close("out", d_out.host(), out, kGemmRtol, kGemmAtol);

  const auto dout = random_floats(out.size(), 23);
  auto dx = random_floats(x.size(), 24), dw = random_floats(w.size(), 25),
       db = random_floats(OC, 26);
  DeviceBuffer<float> d_dout(dout), d_dx(dx), d_dw(dw), d_db(db);
  cpu::matmul_backward(dx.data(), dw.data(), with_bias ? db.data() : nullptr, dout.data(), x.data(),
                       w.data(), N, Cin, OC);
  gpu::matmul_backward(ctx, d_dx.get(), d_dw.get(), with_bias ? d_db.get() : nullptr, d_dout.get(),
                       d_x.get(), d_w.get(), N, Cin, OC);
  expect_close("dinp", d_dx.host(), dx, kGemmRtol, kGemmAtol);
  expect_close("dweight", d_dw.host(), dw, kGemmRtol, kGemmAtol);
  expect_close("dbias", d_db.host(), db, kReduceRtol, kReduceAtol);  // untouched without bias
}

INSTANTIATE_TEST_SUITE_P(Bias, CudaMatmul, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Bias" : "NoBias"; });

TEST_F(CudaLayers, MatmulBackwardSkipsNullGradients) {
  // Only dweight requested: dinp and dbias stay null (the first layer's input needs no gradient).
  const int Cin = 40, OC = 24;
  const auto x = random_floats(std::size_t(N) * Cin, 27),
             w = random_floats(std::size_t(OC) * Cin, 28),
             dout = random_floats(std::size_t(N) * OC, 29);
  auto dw = random_floats(w.size(), 30);
  DeviceBuffer<float> d_x(x), d_w(w), d_dout(dout), d_dw(dw);
  cpu::matmul_backward(nullptr, dw.data(), nullptr, dout.data(), x.data(), w.data(), N, Cin, OC);
  gpu::matmul_backward(ctx(), nullptr, d_dw.get(), nullptr, d_dout.get(), d_x.get(), d_w.get(), N,
                       Cin, OC);
  expect_close("dweight", d_dw.host(), dw, kGemmRtol, kGemmAtol);
}

// ---------------------------------------------------------------------------------------------

TEST_F(CudaLayers, AttentionForwardAndBackward) {
  const std::size_t nqkv = std::size_t(N) * 3 * C, natt = std::size_t(B) * NH * T * T;
  const auto qkv = random_floats(nqkv, 40, -2.0f, 2.0f);
  std::vector<float> out(std::size_t(N) * C), att(natt);
  cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  DeviceBuffer<float> d_qkv(qkv), d_out(out.size()), d_att(natt);
  gpu::attention_forward(ctx(), d_out.get(), d_att.get(), d_qkv.get(), B, T, C, NH);
  expect_close("out", d_out.host(), out, kGemmRtol, kGemmAtol);
  expect_close("att", d_att.host(), att, kReduceRtol, kReduceAtol);  // includes the zero triangle

  const auto dout = random_floats(out.size(), 41);
  auto dqkv = random_floats(nqkv, 42);
  std::vector<float> datt(natt);
  DeviceBuffer<float> d_dout(dout), d_dqkv(dqkv), d_datt(random_floats(natt, 43));  // scratch
  cpu::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), B, T, C,
                          NH);
  gpu::attention_backward(ctx(), d_dqkv.get(), d_datt.get(), d_dout.get(), d_qkv.get(), d_att.get(),
                          B, T, C, NH);
  expect_close("dqkv", d_dqkv.host(), dqkv, kGemmRtol, kGemmAtol);
}

// Ring attention's blocks against the CPU's (test_layers.cpp checks those against the whole
// sequence's attention): zig-zag positions of cp 2 (chunks of `chunk` tokens; rank 0 holds chunks
// 0 and 3, rank 1 chunks 1 and 2), rank 0's queries on its own block first (o and lse overwritten:
// they start as garbage), then on rank 1's (which its first chunk cannot see), grouped-query heads.
void ring_blocks_match_cpu(const gpu::CudaContext& context, int Bq, int chunk, int NHq, int KV,
                           int hs) {
  const int Tq = 2 * chunk, Cq = NHq * hs, q_stride = 3 * Cq;
  const strata::TokenPositions own_at{0, 3 * chunk, chunk}, other_at{chunk, 2 * chunk, chunk};
  std::vector<int> own_v(Tq), other_v(Tq);
  for (int t = 0; t < Tq; ++t) own_v[t] = own_at(t), other_v[t] = other_at(t);
  const int *own = own_v.data(), *other = other_v.data();
  const std::size_t nkv = std::size_t(Bq) * Tq * 2 * KV * hs, no = std::size_t(Bq) * Tq * Cq;
  const auto q = random_floats(std::size_t(Bq) * Tq * q_stride, 70, -1.5f, 1.5f);
  const auto kv_own = random_floats(nkv, 71, -1.5f, 1.5f), kv_other = random_floats(nkv, 72);
  std::vector<float> o(no, 3.0f), lse(std::size_t(Bq) * NHq * Tq, 3.0f);
  DeviceBuffer<float> d_q(q), d_own(kv_own), d_other(kv_other), d_o(o), d_lse(lse);
  cpu::attention_block_forward(o.data(), lse.data(), q.data(), q_stride, kv_own.data(), Bq, Tq, Tq,
                               NHq, KV, hs, own, own, true);
  cpu::attention_block_forward(o.data(), lse.data(), q.data(), q_stride, kv_other.data(), Bq, Tq,
                               Tq, NHq, KV, hs, own, other, false);
  gpu::attention_block_forward(context, d_o.get(), d_lse.get(), d_q.get(), q_stride, d_own.get(),
                               Bq, Tq, Tq, NHq, KV, hs, own_at, own_at, true);
  gpu::attention_block_forward(context, d_o.get(), d_lse.get(), d_q.get(), q_stride, d_other.get(),
                               Bq, Tq, Tq, NHq, KV, hs, own_at, other_at, false);
  expect_close("o", d_o.host(), o, kGemmRtol, kGemmAtol);
  expect_close("lse", d_lse.host(), lse, kReduceRtol, kReduceAtol);

  const auto dout = random_floats(no, 73);
  auto dq = random_floats(std::size_t(Bq) * Tq * q_stride, 74), dkv = random_floats(nkv, 75);
  DeviceBuffer<float> d_dout(dout), d_dq(dq), d_dkv(dkv);
  for (const auto& [kv, at, d_kv] :
       {std::tuple{&kv_own, own, &d_own}, std::tuple{&kv_other, other, &d_other}}) {
    cpu::attention_block_backward(dq.data(), q_stride, dkv.data(), dout.data(), o.data(),
                                  lse.data(), q.data(), q_stride, kv->data(), Bq, Tq, Tq, NHq, KV,
                                  hs, own, at);
    gpu::attention_block_backward(context, d_dq.get(), q_stride, d_dkv.get(), d_dout.get(),
                                  d_o.get(), d_lse.get(), d_q.get(), q_stride, d_kv->get(), Bq, Tq,
                                  Tq, NHq, KV, hs, own_at, at == own ? own_at : other_at);
  }
  expect_close("dq", d_dq.host(), dq, kGemmRtol, kGemmAtol);
  expect_close("dkv", d_dkv.host(), dkv, kGemmRtol, kGemmAtol);
}

// One tile (chunks of 4, head size 8); then two query and key tiles of 32, the second partial, with
// the chunks' seam inside the first (chunks of 20), at head size 64 and one K/V head for four: in
// its own block, rank 0's first query tile sees none of the second key tile (the kernels skip it),
// and in rank 1's block, the rows of rank 0's first chunk see nothing while the rest of their tile
// does.
TEST_F(CudaLayers, RingAttentionBlocks) {
  ring_blocks_match_cpu(ctx(), 2, 4, 4, 2, 8);
  ring_blocks_match_cpu(ctx(), 1, 20, 4, 1, 64);
}

// ---------------------------------------------------------------------------------------------

// The fused (flash) attention against the CPU reference. Its tiles are 32 queries x 32 keys and
// its head size is padded to 16/32/64/128: the shapes cover one partial tile (T 17), several
// with a partial last one (T 33..40), whole tiles (T 64), every padding (hs 12, 16, 32, 64, 128;
// hs 128 needs the shared-memory opt-in) and B * NH > 1.
struct FlashShape {
  int B, T, C, NH;
};
void PrintTo(const FlashShape& s, std::ostream* os) {
  *os << "B " << s.B << ", T " << s.T << ", C " << s.C << ", NH " << s.NH << " (hs " << s.C / s.NH
      << ")";
}

class CudaFlashAttention : public ::testing::TestWithParam<FlashShape> {};

// log sum_{j<=t} exp(q_t . k_j / sqrt(hs)) per (b, h, t), in double.
std::vector<double> host_lse(const std::vector<float>& qkv, const FlashShape& s) {
  const int hs = s.C / s.NH, C3 = 3 * s.C;
  const double scale = 1.0 / std::sqrt(double(hs));
  std::vector<double> lse(std::size_t(s.B) * s.NH * s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        const float* q = qkv.data() + (std::size_t(b) * s.T + t) * C3 + h * hs;
        std::vector<double> scores(t + 1);
        for (int j = 0; j <= t; ++j) {
          const float* k = qkv.data() + (std::size_t(b) * s.T + j) * C3 + s.C + h * hs;
          double dot = 0.0;
          for (int d = 0; d < hs; ++d) dot += double(q[d]) * k[d];
          scores[j] = dot * scale;
        }
        const double mx = *std::max_element(scores.begin(), scores.end());
        double sum = 0.0;
        for (const double x : scores) sum += std::exp(x - mx);
        lse[(std::size_t(b) * s.NH + h) * s.T + t] = mx + std::log(sum);
      }
  return lse;
}

TEST_P(CudaFlashAttention, ForwardLseAndBackward) {
  STRATA_REQUIRE_GPU();
  gpu::CudaContext ctx(0);
  const FlashShape s = GetParam();
  const std::size_t rows = std::size_t(s.B) * s.T, nqkv = rows * 3 * s.C,
                    nlse = std::size_t(s.B) * s.NH * s.T;
  const auto qkv = random_floats(nqkv, 50, -2.0f, 2.0f);
  std::vector<float> out(rows * s.C), att(nlse * s.T);
  cpu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  DeviceBuffer<float> d_qkv(qkv), d_out(random_floats(out.size(), 51)),
      d_lse(random_floats(nlse, 52));
  gpu::flash_attention_forward(ctx, d_out.get(), d_lse.get(), d_qkv.get(), s.B, s.T, s.C, s.NH);
  expect_close("out", d_out.host(), out, kGemmRtol, kGemmAtol);
  const auto lse = host_lse(qkv, s);
  std::vector<double> lse_scale(nlse);
  for (std::size_t i = 0; i < nlse; ++i) lse_scale[i] = std::fabs(lse[i]);
  expect_close_scaled("lse", d_lse.host(), lse, lse_scale, kReduceRtol, kReduceAtol);

  // Backward from the flash forward's own out and lse; dqkv starts non-zero (+=), the scratch
  // full of values it must overwrite.
  const auto dout = random_floats(out.size(), 53);
  auto dqkv = random_floats(nqkv, 54);
  std::vector<float> datt(att.size());
  DeviceBuffer<float> d_dout(dout), d_dqkv(dqkv), d_delta(random_floats(nlse, 55));
  cpu::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), s.B, s.T,
                          s.C, s.NH);
  gpu::flash_attention_backward(ctx, d_dqkv.get(), d_delta.get(), d_dout.get(), d_qkv.get(),
                                d_out.get(), d_lse.get(), s.B, s.T, s.C, s.NH);
  const auto got = d_dqkv.host();
  expect_close("dqkv", got, dqkv, kGemmRtol, kGemmAtol);

  // No atomics: a second run gives the same bits.
  DeviceBuffer<float> d_dqkv2(random_floats(nqkv, 54));
  gpu::flash_attention_backward(ctx, d_dqkv2.get(), d_delta.get(), d_dout.get(), d_qkv.get(),
                                d_out.get(), d_lse.get(), s.B, s.T, s.C, s.NH);
  EXPECT_TRUE(d_dqkv2.host() == got) << "flash_attention_backward is not deterministic";
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaFlashAttention,
                         ::testing::Values(FlashShape{B, T, C, NH},     // hs 12, T 37
                                           FlashShape{2, 40, 32, 2},    // hs 16
                                           FlashShape{1, 64, 64, 4},    // hs 16, 2 whole tiles
                                           FlashShape{1, 33, 64, 2},    // hs 32
                                           FlashShape{2, 17, 128, 2},   // hs 64, one partial tile
                                           FlashShape{1, 35, 128, 1}),  // hs 128
                         [](const auto& info) {
                           const FlashShape& p = info.param;
                           return "B" + std::to_string(p.B) + "_T" + std::to_string(p.T) + "_C" +
                                  std::to_string(p.C) + "_NH" + std::to_string(p.NH);
                         });

TEST_F(CudaLayers, FlashAttentionRejectsUnsupportedHeads) {
  DeviceBuffer<float> d_buf(std::size_t(3) * 258);
  for (const auto [Cw, NHw] : {std::pair{258, 1}, std::pair{48, 5}}) {  // hs 258 > 128; 5 !| 48
    try {
      gpu::flash_attention_forward(ctx(), d_buf.get(), d_buf.get(), d_buf.get(), 1, 1, Cw, NHw);
      FAIL() << "C " << Cw << ", NH " << NHw << " did not throw";
    } catch (const strata::Error& e) {
      EXPECT_NE(std::string(e.what()).find("flash_attention_forward"), std::string::npos);
      EXPECT_NE(e.hint().find("128"), std::string::npos) << e.hint();
    }
  }
}

// ---------------------------------------------------------------------------------------------

// The tensor-core attention (attention_tc.cu) against the fp32 CPU reference. It rounds Q, K, V and
// dout to bf16 (unit roundoff u = 2^-9) as it loads them, and P and dS as GEMM operands; the rest
// is fp32 (its rounding, ~2^-24 per term, is far below). First-order error bounds, per element,
// from the reference's own terms (all in double):
//   a score s_tj = scale q_t . k_j moves by at most 2u a_tj, a_tj = scale sum_d |q_td k_jd|
//     (two rounded operands); with A = max a_tj the softmax weights move by at most a factor
//     exp(+-4uA) (the normalisation doubles it), i.e. relatively 4uA;
//   out_td = sum_j p_tj v_jd: + u for the rounded P (l sums the rounded weights, so at most one
//     more u from the normalisation) + u for v: |err| <= u (4A + 4) sum_j p_tj |v_jd|;
//   lse_t: 2uA from the scores + u from l: |err| <= u (2A + 2) (absolute);
//   dV_jd = sum_t p_tj dout_td: the same, |err| <= u (4A + 4) sum_t p_tj |dout_td|;
//   dS_tj = p_tj (dP_tj - delta_t), dP_tj = dout_t . v_j, delta_t = dout_t . out_t: with
//     D_tj = sum_d |dout_td v_jd| and E_t = sum_j p_tj D_tj (which bounds sum_d |dout_td|
//     |out_td|), G_tj = p_tj (D_tj + |delta_t| + E_t) bounds every term, and the errors add to at
//     most u (4A + 2 + 4A + 4 + 1) G_tj (P; dP's two operands; delta through out; dS's rounding);
//   dQ_td = scale sum_j dS_tj k_jd and dK_jd = scale sum_t dS_tj q_td, one more u for k or q:
//     |err| <= u (8A + 8) scale sum_j G_tj |k_jd| (dK: sum over t with |q_td|).
// Inputs in [-1, 1] keep A near 2-3 (hs 64: 8 of the 64 |q k| terms' mean 1/4), so the bounds are
// 2-6% of the terms' magnitude; an index or transposition error is of the order of the magnitude
// itself (10x and more outside), and the causality check below catches a single leaked key.
struct TcShape {
  int B, T, C, NH;
};
void PrintTo(const TcShape& s, std::ostream* os) {
  *os << "B " << s.B << ", T " << s.T << ", C " << s.C << ", NH " << s.NH << " (hs " << s.C / s.NH
      << ")";
}

// The bounds above for every out, lse and dqkv element, from the CPU reference's values.
struct TcBounds {
  std::vector<double> out, lse, dqkv;
};
TcBounds tc_bounds(const std::vector<float>& qkv, const std::vector<float>& att,
                   const std::vector<float>& out, const std::vector<float>& dout,
                   const TcShape& s) {
  const int hs = s.C / s.NH, C3 = 3 * s.C, T = s.T;
  const double u = std::ldexp(1.0, -9), scale = 1.0 / std::sqrt(double(hs));
  TcBounds bound{std::vector<double>(out.size()), std::vector<double>(std::size_t(s.B) * s.NH * T),
                 std::vector<double>(qkv.size())};
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h) {
      const auto q = [&](int t, int d) {
        return double(qkv[(std::size_t(b) * T + t) * C3 + h * hs + d]);
      };
      const auto k = [&](int t, int d) { return q(t, d + s.C); };
      const auto v = [&](int t, int d) { return q(t, d + 2 * s.C); };
      const auto dO = [&](int t, int d) {
        return double(dout[(std::size_t(b) * T + t) * s.C + h * hs + d]);
      };
      const auto p = [&](int t, int j) {
        return double(att[((std::size_t(b) * s.NH + h) * T + t) * T + j]);
      };
      double A = 0.0;
      std::vector<double> D(std::size_t(T) * T), E(T, 0.0), delta(T, 0.0);
      for (int t = 0; t < T; ++t) {
        for (int d = 0; d < hs; ++d)
          delta[t] += dO(t, d) * out[(std::size_t(b) * T + t) * s.C + h * hs + d];
        for (int j = 0; j <= t; ++j) {
          double a = 0.0, dd = 0.0;
          for (int d = 0; d < hs; ++d)
            a += std::fabs(q(t, d) * k(j, d)), dd += std::fabs(dO(t, d) * v(j, d));
          A = std::max(A, scale * a);
          D[std::size_t(t) * T + j] = dd;
          E[t] += p(t, j) * dd;
        }
      }
      const auto G = [&](int t, int j) {
        return p(t, j) * (D[std::size_t(t) * T + j] + std::fabs(delta[t]) + E[t]);
      };
      for (int t = 0; t < T; ++t) {
        bound.lse[(std::size_t(b) * s.NH + h) * T + t] = u * (2 * A + 2);
        for (int d = 0; d < hs; ++d) {
          double mo = 0.0, mdv = 0.0, mdq = 0.0, mdk = 0.0;
          for (int j = 0; j <= t; ++j)
            mo += p(t, j) * std::fabs(v(j, d)), mdq += G(t, j) * std::fabs(k(j, d));
          for (int i = t; i < T; ++i)
            mdv += p(i, t) * std::fabs(dO(i, d)), mdk += G(i, t) * std::fabs(q(i, d));
          const std::size_t row = (std::size_t(b) * T + t) * C3 + h * hs + d;
          bound.out[(std::size_t(b) * T + t) * s.C + h * hs + d] = u * (4 * A + 4) * mo;
          bound.dqkv[row] = u * (8 * A + 8) * scale * mdq;
          bound.dqkv[row + s.C] = u * (8 * A + 8) * scale * mdk;
          bound.dqkv[row + 2 * s.C] = u * (4 * A + 4) * mdv;
        }
      }
    }
  return bound;
}

// Every |got - want| within atol + bound; returns the largest error / bound.
double expect_within(const char* what, const std::vector<float>& got,
                     const std::vector<float>& want, const std::vector<double>& bound,
                     double atol) {
  EXPECT_EQ(got.size(), want.size()) << what;
  std::size_t bad = 0, worst = 0;
  double worst_ratio = 0.0;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]), lim = atol + bound[i];
    if (!(err <= lim)) ++bad;
    const double ratio = std::isnan(err) ? 1e300 : err / lim;
    if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                     << " elements outside the bound; worst at " << worst << ": gpu " << got[worst]
                     << " reference " << want[worst] << " bound " << atol + bound[worst];
  return worst_ratio;
}

class CudaTcAttention : public ::testing::TestWithParam<TcShape> {};

TEST_P(CudaTcAttention, ForwardLseAndBackward) {
  STRATA_REQUIRE_GPU();
  gpu::CudaContext ctx(0);
  const TcShape s = GetParam();
  ASSERT_TRUE(gpu::tc_attention_supported(s.B, s.C, s.NH));
  const std::size_t rows = std::size_t(s.B) * s.T, nqkv = rows * 3 * s.C,
                    nlse = std::size_t(s.B) * s.NH * s.T;
  const auto qkv = random_floats(nqkv, 60);
  std::vector<float> out(rows * s.C), att(nlse * s.T);
  cpu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  DeviceBuffer<float> d_qkv(qkv), d_out(random_floats(out.size(), 61)),
      d_lse(random_floats(nlse, 62));
  gpu::tc_flash_attention_forward(ctx, d_out.get(), d_lse.get(), d_qkv.get(), s.B, s.T, s.C, s.NH);
  const auto dout = random_floats(out.size(), 63);
  const TcBounds bound = tc_bounds(qkv, att, out, dout, s);
  constexpr double kAtol = 1e-6;  // fp32 rounding of near-zero results
  const auto got_out = d_out.host();
  const double r_out = expect_within("out", got_out, out, bound.out, kAtol);
  double out_error = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i)
    out_error = std::max(out_error, std::fabs(double(got_out[i]) - out[i]));
  const auto lse = host_lse(qkv, FlashShape{s.B, s.T, s.C, s.NH});
  const double r_lse = expect_within("lse", d_lse.host(),
                                     std::vector<float>(lse.begin(), lse.end()), bound.lse, kAtol);

  // Backward from the forward's own out and lse; dqkv starts non-zero (+=), the scratch full of
  // values it must overwrite.
  auto dqkv = random_floats(nqkv, 64);
  std::vector<float> datt(att.size());
  DeviceBuffer<float> d_dout(dout), d_dqkv(dqkv), d_delta(random_floats(nlse, 65));
  cpu::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), s.B, s.T,
                          s.C, s.NH);
  gpu::tc_flash_attention_backward(ctx, d_dqkv.get(), d_delta.get(), d_dout.get(), d_qkv.get(),
                                   d_out.get(), d_lse.get(), s.B, s.T, s.C, s.NH);
  const auto got = d_dqkv.host();
  const double r_dqkv = expect_within("dqkv", got, dqkv, bound.dqkv, kAtol);
  // The largest |error| of the dq, dk or dv columns (part 0, 1, 2 of each row of 3C).
  const auto max_error = [&](int part) {
    double e = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i)
      if (int(i % (3 * s.C)) / s.C == part) e = std::max(e, std::fabs(double(got[i]) - dqkv[i]));
    return e;
  };
  std::printf(
      "tc attention B %d T %d C %d NH %d: max error / bound: out %.3g, lse %.3g, dqkv %.3g; max "
      "|error|: out %.3g, dq %.3g, dk %.3g, dv %.3g\n",
      s.B, s.T, s.C, s.NH, r_out, r_lse, r_dqkv, out_error, max_error(0), max_error(1),
      max_error(2));

  // No atomics: a second run gives the same bits.
  DeviceBuffer<float> d_dqkv2(random_floats(nqkv, 64));
  gpu::tc_flash_attention_backward(ctx, d_dqkv2.get(), d_delta.get(), d_dout.get(), d_qkv.get(),
                                   d_out.get(), d_lse.get(), s.B, s.T, s.C, s.NH);
  EXPECT_TRUE(d_dqkv2.host() == got) << "tc_flash_attention_backward is not deterministic";
}

#if STRATA_HAVE_CUDNN
// cuDNN's fused attention (--attention cudnn), called as a run calls it (CudaKernels, bf16 qkv and
// out, fp32 dout and dqkv), within the same bounds plus one rounding of each bf16 result: out, and
// dq, dk, dv before they are added into dqkv. The real runtime only (cuDNN is not emulated); what
// its graphs compute is also checked on the CPU by test_sdpa_graph.
TEST_P(CudaTcAttention, CudnnForwardLseAndBackward) {
  STRATA_REQUIRE_GPU();
  gpu::CudaContext ctx(0);
  const TcShape s = GetParam();
  ASSERT_TRUE(strata::cuda_cudnn_attention(s.C, s.NH));
  gpu::CudaKernels kernels(ctx, strata::AttentionKernel::cudnn);
  const std::size_t rows = std::size_t(s.B) * s.T, nqkv = rows * 3 * s.C,
                    nlse = std::size_t(s.B) * s.NH * s.T;
  const double u = std::ldexp(1.0, -9);
  constexpr double kAtol = 1e-6;
  const auto qkv = random_floats(nqkv, 60);
  std::vector<float> out(rows * s.C), att(nlse * s.T);
  cpu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  std::vector<strata::bf16> qkv_h(nqkv);
  for (std::size_t i = 0; i < nqkv; ++i) qkv_h[i] = strata::to_bf16(qkv[i]);
  DeviceBuffer<strata::bf16> d_qkv(qkv_h), d_out(out.size());
  DeviceBuffer<float> d_lse(random_floats(nlse, 62));
  kernels.attention_forward(d_out.get(), d_lse.get(), d_qkv.get(), s.B, s.T, s.C, s.NH);
  const auto dout = random_floats(out.size(), 63);
  TcBounds bound = tc_bounds(qkv, att, out, dout, s);
  std::vector<float> got_out;
  for (strata::bf16 v : d_out.host()) got_out.push_back(strata::to_float(v));
  for (std::size_t i = 0; i < out.size(); ++i) bound.out[i] += u * std::fabs(out[i]);
  const double r_out = expect_within("out", got_out, out, bound.out, kAtol);
  const auto lse = host_lse(qkv, FlashShape{s.B, s.T, s.C, s.NH});
  const double r_lse = expect_within("lse", d_lse.host(),
                                     std::vector<float>(lse.begin(), lse.end()), bound.lse, kAtol);

  // Backward from the forward's bf16 out and its lse, into a dqkv that starts non-zero (+=).
  const auto dqkv_init = random_floats(nqkv, 64);
  auto dqkv = dqkv_init;
  std::vector<float> datt(att.size());
  DeviceBuffer<float> d_dout(dout), d_dqkv(dqkv_init), d_delta(random_floats(nlse, 65));
  cpu::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), s.B, s.T,
                          s.C, s.NH);
  kernels.attention_backward(d_dqkv.get(), d_delta.get(), d_dout.get(), d_qkv.get(), d_lse.get(),
                             d_out.get(), s.B, s.T, s.C, s.NH);
  for (std::size_t i = 0; i < nqkv; ++i) bound.dqkv[i] += u * std::fabs(dqkv[i] - dqkv_init[i]);
  const double r_dqkv = expect_within("dqkv", d_dqkv.host(), dqkv, bound.dqkv, kAtol);
  std::printf(
      "cudnn attention B %d T %d C %d NH %d: max error / bound: out %.3g, lse %.3g, "
      "dqkv %.3g; %zu bytes of cuDNN working memory\n",
      s.B, s.T, s.C, s.NH, r_out, r_lse, r_dqkv, kernels.library_bytes());
}
#endif

INSTANTIATE_TEST_SUITE_P(Shapes, CudaTcAttention,
                         ::testing::Values(TcShape{2, 1, 128, 2},    // hs 64, one row
                                           TcShape{2, 17, 256, 2},   // hs 128, one partial tile
                                           TcShape{2, 77, 128, 2},   // hs 64, 2 tiles, partial
                                           TcShape{1, 130, 128, 1},  // hs 128, 3 tiles
                                           TcShape{1, 40, 96, 2}),   // hs 48 padded to 64
                         [](const auto& info) {
                           const TcShape& p = info.param;
                           return "B" + std::to_string(p.B) + "_T" + std::to_string(p.T) + "_C" +
                                  std::to_string(p.C) + "_NH" + std::to_string(p.NH);
                         });

// Causality and the masking of rows and keys past T, exactly: a sequence of 77 and the same
// sequence continued to 130 (dout 0 on the rows past 77) give the same bits for the first 77 rows
// of out and lse and for every dq, dk, dv of the first 77 positions (the later rows add P * 0 and
// dS = 0), and leave the later positions' dk, dv as they were (no earlier query sees them). A
// query that saw a later key, or a padded key or row that leaked in, breaks one of these.
TEST_F(CudaLayers, TcAttentionIsCausalAndMasksPastT) {
  constexpr int Bc = 1, T0 = 77, T1 = 130, Cc = 64, NHc = 1;
  const auto qkv1 = random_floats(std::size_t(T1) * 3 * Cc, 70);
  const std::vector<float> qkv0(qkv1.begin(), qkv1.begin() + std::size_t(T0) * 3 * Cc);
  auto dout1 = random_floats(std::size_t(T1) * Cc, 71);
  std::fill(dout1.begin() + std::size_t(T0) * Cc, dout1.end(), 0.0f);
  const std::vector<float> dout0(dout1.begin(), dout1.begin() + std::size_t(T0) * Cc);
  const auto dqkv1_init = random_floats(qkv1.size(), 72);
  const std::vector<float> dqkv0_init(dqkv1_init.begin(), dqkv1_init.begin() + qkv0.size());
  // Runs forward and backward over T tokens; returns out | lse | dqkv.
  const auto run = [&](const std::vector<float>& qkv, const std::vector<float>& dout,
                       const std::vector<float>& dqkv_init, int T) {
    DeviceBuffer<float> d_qkv(qkv), d_out(std::size_t(T) * Cc), d_lse(std::size_t(NHc) * T),
        d_delta(std::size_t(NHc) * T), d_dout(dout), d_dqkv(dqkv_init);
    gpu::tc_flash_attention_forward(ctx(), d_out.get(), d_lse.get(), d_qkv.get(), Bc, T, Cc, NHc);
    gpu::tc_flash_attention_backward(ctx(), d_dqkv.get(), d_delta.get(), d_dout.get(), d_qkv.get(),
                                     d_out.get(), d_lse.get(), Bc, T, Cc, NHc);
    return std::tuple{d_out.host(), d_lse.host(), d_dqkv.host()};
  };
  const auto [out0, lse0, dqkv0] = run(qkv0, dout0, dqkv0_init, T0);
  const auto [out1, lse1, dqkv1] = run(qkv1, dout1, dqkv1_init, T1);
  EXPECT_TRUE(std::equal(out0.begin(), out0.end(), out1.begin())) << "out of the first 77 rows";
  for (int h = 0; h < NHc; ++h)
    EXPECT_TRUE(
        std::equal(lse0.begin() + h * T0, lse0.begin() + (h + 1) * T0, lse1.begin() + h * T1))
        << "lse of head " << h;
  EXPECT_TRUE(std::equal(dqkv0.begin(), dqkv0.end(), dqkv1.begin())) << "dqkv of the first 77 rows";
  EXPECT_TRUE(
      std::equal(dqkv1.begin() + dqkv0.size(), dqkv1.end(), dqkv1_init.begin() + dqkv0.size()))
      << "dqkv of the rows past 77 (dout 0 there; no earlier query sees their keys)";
  EXPECT_NE(dqkv0, dqkv0_init);  // the backward did run
}

// Ring attention's blocks on the tensor cores make the whole sequence: cp 2's zig-zag ranks (chunks
// of 40: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2) each run their queries against their
// own key-value block, then against the other's (o and lse start as garbage and are merged), and
// the backward of both ranks' queries on both blocks; the merged out and lse, dq, and each block's
// dk and dv summed over the ranks equal the whole causal sequence's within the bounds above. Two
// query heads share a key-value head (the reference repeats it; its dk, dv are the group's sums,
// within the summed bounds). Each rank's 80 rows are two query tiles, the second partial, with the
// chunks' seam inside the first: rank 0's first chunk sees nothing of rank 1's block, and its
// second all of it (the tiles that need no mask).
// One rank of the ring test on the device: its rows of q and dout, its key-value block
// [B, Tq, 2, KV, hs] (each group's first head's K and V), and the outputs its blocks accumulate
// into (o and lse start as garbage, dq and dkv as zeros).
struct RingRank {
  std::unique_ptr<DeviceBuffer<float>> q, kv, dout, o, lse, dq, dkv;
};
RingRank ring_rank(const std::vector<float>& qkv, const std::vector<float>& dout, int B, int T,
                   int Tq, int NH, int KV, int hs, const strata::TokenPositions& at, int seed) {
  const int Cq = NH * hs, C3 = 3 * Cq, group = NH / KV;
  const std::size_t nq = std::size_t(B) * Tq * Cq, nkv = std::size_t(B) * Tq * 2 * KV * hs;
  std::vector<float> q(nq), kv(nkv), dO(nq);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tq; ++t) {
      const std::size_t row = std::size_t(b) * T + at(t), local = std::size_t(b) * Tq + t;
      std::copy_n(&qkv[row * C3], Cq, &q[local * Cq]);
      std::copy_n(&dout[row * Cq], Cq, &dO[local * Cq]);
      for (int part = 0; part < 2; ++part)
        for (int g = 0; g < KV; ++g)
          std::copy_n(&qkv[row * C3 + (1 + part) * Cq + g * group * hs], hs,
                      &kv[((local * 2 + part) * KV + g) * hs]);
    }
  auto up = [](const std::vector<float>& v) { return std::make_unique<DeviceBuffer<float>>(v); };
  return {up(q),
          up(kv),
          up(dO),
          up(random_floats(nq, seed)),
          up(random_floats(std::size_t(B) * NH * Tq, seed + 2)),
          up(std::vector<float>(nq, 0.0f)),
          up(std::vector<float>(nkv, 0.0f))};
}

TEST_F(CudaLayers, TcRingAttentionBlocksMakeTheWholeSequence) {
  constexpr int Bc = 1, chunk = 40, T = 4 * chunk, Tq = 2 * chunk, NHc = 4, KV = 2, hs = 64;
  constexpr int Cq = NHc * hs, C3 = 3 * Cq, group = NHc / KV;
  auto qkv = random_floats(std::size_t(Bc) * T * C3, 80);
  for (std::size_t row = 0; row < std::size_t(Bc) * T; ++row)  // K, V: the group's first head's
    for (int h = 0; h < NHc; ++h)
      for (int c = Cq; c < C3; c += Cq)
        std::copy_n(&qkv[row * C3 + c + h / group * group * hs], hs, &qkv[row * C3 + c + h * hs]);
  const auto dout = random_floats(std::size_t(Bc) * T * Cq, 81);
  std::vector<float> out(dout.size()), att(std::size_t(Bc) * NHc * T * T), dqkv(qkv.size(), 0.0f),
      datt(att.size());
  cpu::attention_forward(out.data(), att.data(), qkv.data(), Bc, T, Cq, NHc);
  cpu::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), Bc, T, Cq,
                          NHc);
  const TcBounds bound = tc_bounds(qkv, att, out, dout, TcShape{Bc, T, Cq, NHc});
  const auto lse = host_lse(qkv, FlashShape{Bc, T, Cq, NHc});

  const strata::TokenPositions at[2] = {{0, 3 * chunk, chunk}, {chunk, 2 * chunk, chunk}};
  const RingRank d[2] = {ring_rank(qkv, dout, Bc, T, Tq, NHc, KV, hs, at[0], 82),
                         ring_rank(qkv, dout, Bc, T, Tq, NHc, KV, hs, at[1], 83)};
  for (int r = 0; r < 2; ++r)
    for (const int j : {r, 1 - r})
      gpu::tc_attention_block_forward(ctx(), d[r].o->get(), d[r].lse->get(), d[r].q->get(), Cq,
                                      d[j].kv->get(), Bc, Tq, Tq, NHc, KV, hs, at[r], at[j],
                                      j == r);
  for (int r = 0; r < 2; ++r)
    for (const int j : {r, 1 - r})
      gpu::tc_attention_block_backward(ctx(), d[r].dq->get(), Cq, d[j].dkv->get(), d[r].dout->get(),
                                       d[r].o->get(), d[r].lse->get(), d[r].q->get(), Cq,
                                       d[j].kv->get(), Bc, Tq, Tq, NHc, KV, hs, at[r], at[j]);

  // The ranks' rows back in the sequence's order, beside the reference and its bounds.
  const std::size_t nk = std::size_t(Bc) * T * KV * hs;
  std::vector<float> got_out(out.size()), got_lse(lse.size()), got_dq(out.size()),
      want_dq(out.size());
  std::vector<float> got_dk(nk), got_dv(nk), want_dk(nk, 0.0f), want_dv(nk, 0.0f);
  std::vector<double> bound_dq(out.size()), bound_dk(nk, 0.0), bound_dv(nk, 0.0);
  for (int r = 0; r < 2; ++r) {
    const auto o = d[r].o->host(), l = d[r].lse->host(), dq = d[r].dq->host(),
               dkv = d[r].dkv->host();
    for (int b = 0; b < Bc; ++b)
      for (int t = 0; t < Tq; ++t) {
        const std::size_t row = std::size_t(b) * T + at[r](t), local = std::size_t(b) * Tq + t;
        std::copy_n(&o[local * Cq], Cq, &got_out[row * Cq]);
        std::copy_n(&dq[local * Cq], Cq, &got_dq[row * Cq]);
        for (int h = 0; h < NHc; ++h)
          got_lse[(std::size_t(b) * NHc + h) * T + at[r](t)] =
              l[(std::size_t(b) * NHc + h) * Tq + t];
        for (int g = 0; g < KV; ++g)
          std::copy_n(&dkv[((local * 2) * KV + g) * hs], hs, &got_dk[(row * KV + g) * hs]),
              std::copy_n(&dkv[((local * 2 + 1) * KV + g) * hs], hs, &got_dv[(row * KV + g) * hs]);
      }
  }
  for (std::size_t row = 0; row < std::size_t(Bc) * T; ++row)
    for (int h = 0; h < NHc; ++h)
      for (int d = 0; d < hs; ++d) {
        const std::size_t e = row * C3 + h * hs + d, k = (row * KV + h / group) * hs + d;
        want_dq[row * Cq + h * hs + d] = dqkv[e], bound_dq[row * Cq + h * hs + d] = bound.dqkv[e];
        want_dk[k] += dqkv[e + Cq], bound_dk[k] += bound.dqkv[e + Cq];
        want_dv[k] += dqkv[e + 2 * Cq], bound_dv[k] += bound.dqkv[e + 2 * Cq];
      }
  constexpr double kAtol = 1e-6;
  const double r_out = expect_within("out", got_out, out, bound.out, kAtol);
  const double r_lse =
      expect_within("lse", got_lse, std::vector<float>(lse.begin(), lse.end()), bound.lse, kAtol);
  const double r_dq = expect_within("dq", got_dq, want_dq, bound_dq, kAtol);
  const double r_dk = expect_within("dk", got_dk, want_dk, bound_dk, kAtol);
  const double r_dv = expect_within("dv", got_dv, want_dv, bound_dv, kAtol);
  std::printf("tc ring blocks: max error / bound: out %.3g, lse %.3g, dq %.3g, dk %.3g, dv %.3g\n",
              r_out, r_lse, r_dq, r_dk, r_dv);
}

TEST_F(CudaLayers, TcAttentionRejectsUnsupportedHeads) {
  EXPECT_TRUE(gpu::tc_attention_supported(4, 768, 12));     // GPT-2: hs 64
  EXPECT_FALSE(gpu::tc_attention_supported(1, 48, 4));      // hs 12: not a multiple of 16
  EXPECT_FALSE(gpu::tc_attention_supported(1, 288, 1));     // hs 288 > 128
  EXPECT_FALSE(gpu::tc_attention_supported(1, 48, 5));      // 5 does not divide 48
  EXPECT_FALSE(gpu::tc_attention_supported(65536, 64, 1));  // B * NH > 65535
  DeviceBuffer<float> d_buf(std::size_t(3) * 288);
  try {
    gpu::tc_flash_attention_forward(ctx(), d_buf.get(), d_buf.get(), d_buf.get(), 1, 1, 48, 4);
    FAIL() << "hs 12 did not throw";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tc_flash_attention_forward"), std::string::npos);
    EXPECT_NE(e.hint().find("multiple of 16"), std::string::npos) << e.hint();
  }
  EXPECT_THROW(
      gpu::tc_flash_attention_backward(ctx(), d_buf.get(), d_buf.get(), d_buf.get(), d_buf.get(),
                                       d_buf.get(), d_buf.get(), 1, 1, 288, 1),
      strata::Error);
}

// A bf16 run keeps the fused attentions' Q, K, V and output in bf16: both kernels reading bf16
// q | k | v give what they give from the same values in fp32 (forward, lse and backward, bit for
// bit), and write their fp32 output rounded once (strata::to_bf16's bits); their backward reading
// the bf16 output gives the bits it gives from the same values widened (delta = rowsum(dout out)
// is the only use). The same bits again from a bf16 view 8 bytes off 16-byte alignment (the tensor-
// core kernels' copies of 16 bytes then give way to element loads), forward and backward. Two tiles
// with a partial one at hs 64, three (the forward's K/V double buffer used twice over) at hs 128.
void fused_attentions_read_and_write_bf16(const gpu::CudaContext& context, int Bc, int Tc, int Cc,
                                          int NHc) {
  SCOPED_TRACE("T " + std::to_string(Tc) + ", hs " + std::to_string(Cc / NHc));
  const std::size_t n = std::size_t(Bc) * Tc * Cc, nlse = std::size_t(Bc) * NHc * Tc;
  const auto dout = random_floats(n, 81), dqkv_init = random_floats(3 * n, 82);
  std::vector<strata::bf16> qkv_h(3 * n);
  std::vector<float> qkv(3 * n);  // the same values in fp32
  const auto drawn = random_floats(3 * n, 80);
  for (std::size_t i = 0; i < 3 * n; ++i) {
    qkv_h[i] = strata::to_bf16(drawn[i]);
    qkv[i] = strata::to_float(qkv_h[i]);
  }
  using Forward = void (*)(const gpu::CudaContext&, strata::ActView, float*, strata::ActView, int,
                           int, int, int);
  using Backward = void (*)(const gpu::CudaContext&, float*, float*, const float*, strata::ActView,
                            strata::ActView, const float*, int, int, int, int);
  const std::tuple<const char*, Forward, Backward> kernels[] = {
      {"flash", &gpu::flash_attention_forward, &gpu::flash_attention_backward},
      {"tc", &gpu::tc_flash_attention_forward, &gpu::tc_flash_attention_backward}};
  for (const auto& [name, forward, backward] : kernels) {
    DeviceBuffer<float> d_qkv(qkv), d_out(n), d_lse(nlse), d_lse_h(nlse);
    DeviceBuffer<strata::bf16> d_qkv_h(qkv_h), d_half(n), d_half_off(n);
    std::vector<strata::bf16> shifted(4);  // 4 elements ahead: the view is 8 bytes off alignment
    shifted.insert(shifted.end(), qkv_h.begin(), qkv_h.end());
    DeviceBuffer<strata::bf16> d_qkv_off(shifted);
    forward(context, d_out.get(), d_lse.get(), d_qkv.get(), Bc, Tc, Cc, NHc);
    forward(context, d_half.get(), d_lse_h.get(), d_qkv_h.get(), Bc, Tc, Cc, NHc);
    const auto out = d_out.host(), lse = d_lse.host();
    const auto half = d_half.host();
    forward(context, d_half_off.get(), d_lse_h.get(), d_qkv_off.get() + 4, Bc, Tc, Cc, NHc);
    const auto half_off = d_half_off.host();
    EXPECT_TRUE(std::equal(half.begin(), half.end(), half_off.begin(),
                           [](strata::bf16 x, strata::bf16 y) { return x.bits == y.bits; }))
        << name << ": out from a view off 16-byte alignment";
    std::vector<float> widened(n);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      wrong += half[i].bits != strata::to_bf16(out[i]).bits;
      widened[i] = strata::to_float(half[i]);
    }
    EXPECT_EQ(wrong, 0u) << name << ": bf16 outputs that are not the fp32 ones rounded";
    EXPECT_TRUE(d_lse_h.host() == lse) << name << ": lse";
    DeviceBuffer<float> d_widened(widened), d_dout(dout), d_dqkv(dqkv_init), d_dqkv_h(dqkv_init),
        d_dqkv_off(dqkv_init), d_delta(nlse);
    backward(context, d_dqkv.get(), d_delta.get(), d_dout.get(), d_qkv.get(), d_widened.get(),
             d_lse.get(), Bc, Tc, Cc, NHc);
    backward(context, d_dqkv_h.get(), d_delta.get(), d_dout.get(), d_qkv_h.get(), d_half.get(),
             d_lse.get(), Bc, Tc, Cc, NHc);
    backward(context, d_dqkv_off.get(), d_delta.get(), d_dout.get(), d_qkv_off.get() + 4,
             d_half.get(), d_lse.get(), Bc, Tc, Cc, NHc);
    const auto dqkv = d_dqkv.host();
    EXPECT_TRUE(d_dqkv_h.host() == dqkv) << name << ": dqkv from bf16 q | k | v and output";
    EXPECT_TRUE(d_dqkv_off.host() == dqkv) << name << ": dqkv from a view off 16-byte alignment";
    EXPECT_NE(dqkv, dqkv_init) << name;  // the backward did run
  }
}

TEST_F(CudaLayers, FusedAttentionsReadAndWriteBf16Activations) {
  for (const TcShape s : {TcShape{2, 77, 128, 2}, TcShape{1, 130, 128, 1}})
    fused_attentions_read_and_write_bf16(ctx(), s.B, s.T, s.C, s.NH);
}

// ---------------------------------------------------------------------------------------------

TEST_F(CudaLayers, GeluForwardAndBackward) {
  const std::int64_t n = 100003;
  const auto x = random_floats(n, 50, -6.0f, 6.0f), dout = random_floats(n, 51),
             dx = random_floats(n, 52);
  DeviceBuffer<float> d_x(x), d_out(n), d_dout(dout), d_dx(dx);
  std::vector<float> out(n);
  cpu::gelu_forward(out.data(), x.data(), n);
  gpu::gelu_forward(ctx(), d_out.get(), d_x.get(), n);
  gpu::gelu_backward(ctx(), d_dx.get(), d_x.get(), d_dout.get(), n);
  expect_close("out", d_out.host(), out, kElemRtol, kElemAtol);
  // dinp in double (see the header for the bound).
  const double k_scale = std::sqrt(2.0 / M_PI), k_cubic = 0.044715;
  std::vector<double> want(n), scale(n);
  for (std::int64_t i = 0; i < n; ++i) {
    const double xi = x[i], th = std::tanh(k_scale * (xi + k_cubic * xi * xi * xi));
    const double grad =
        0.5 * (1.0 + th) + 0.5 * xi * (1.0 - th * th) * k_scale * (1.0 + 3.0 * k_cubic * xi * xi);
    want[i] = dx[i] + grad * dout[i];
    scale[i] = std::fabs(dx[i]) + std::fabs(dout[i]);
  }
  expect_close_scaled("dinp", d_dx.host(), want, scale, kElemRtol, kElemAtol);
}

// A bf16 run's FC layer takes the GELU of its bf16 pre-activation: the bf16 kernel gives the fp32
// kernel's value of the widened input rounded once (strata::to_bf16's bits), also in place.
TEST_F(CudaLayers, GeluForwardOfBf16IsTheFp32GeluRounded) {
  const std::int64_t n = 100003;
  const auto drawn = random_floats(n, 53, -6.0f, 6.0f);
  std::vector<strata::bf16> x(n);
  std::vector<float> widened(n);
  for (std::int64_t i = 0; i < n; ++i) {
    x[i] = strata::to_bf16(drawn[i]);
    widened[i] = strata::to_float(x[i]);
  }
  DeviceBuffer<float> d_wide(widened), d_fp32(n);
  DeviceBuffer<strata::bf16> d_x(x), d_out(n), d_in_place(x);
  gpu::gelu_forward(ctx(), d_fp32.get(), d_wide.get(), n);
  gpu::gelu_forward(ctx(), d_out.get(), d_x.get(), n);
  gpu::gelu_forward(ctx(), d_in_place.get(), d_in_place.get(), n);
  const std::vector<float> fp32 = d_fp32.host();
  const std::vector<strata::bf16> out = d_out.host(), in_place = d_in_place.host();
  std::size_t wrong = 0, wrong_in_place = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    wrong += out[i].bits != strata::to_bf16(fp32[i]).bits;
    wrong_in_place += in_place[i].bits != out[i].bits;
  }
  EXPECT_EQ(wrong, 0u) << "of " << n << " bf16 GELU outputs";
  EXPECT_EQ(wrong_in_place, 0u) << "of " << n << " in place";
}

TEST_F(CudaLayers, ResidualForward) {
  const std::int64_t n = 100003;
  const auto a = random_floats(n, 60), b = random_floats(n, 61);
  std::vector<float> out(n);
  cpu::residual_forward(out.data(), a.data(), b.data(), n);
  DeviceBuffer<float> d_a(a), d_b(b), d_out(n);
  gpu::residual_forward(ctx(), d_out.get(), d_a.get(), d_b.get(), n);
  expect_close("out", d_out.host(), out, 0.0, 0.0);  // one rounding, the same on both sides
}

// The Llama block's layers against the CPU's: RMSNorm at a width below and above a warp's
// stride, over more rows than one block of warps and than the backward's 512 blocks; SwiGLU; the
// rotary embedding of q's and k's heads in a q | k | v row (GQA: fewer k heads), rows wrapping past
// T, from one host table.
TEST_F(CudaLayers, RmsNormSwiGluAndRope) {
  for (auto [Nr, Cw] : {std::pair{37, 24}, {37, 70}, {4200, 40}}) {
    const std::size_t n = std::size_t(Nr) * Cw;
    const auto x = random_floats(n, 80, -2.0f, 3.0f), w = random_floats(Cw, 81),
               dout = random_floats(n, 82);
    std::vector<float> out(n), rstd(Nr), dx = random_floats(n, 83), dw = random_floats(Cw, 84);
    const auto at = [Cw](int r, int c) { return std::size_t(r) * Cw + c; };
    DeviceBuffer<float> d_x(x), d_w(w), d_out(n), d_rstd(Nr), d_dout(dout), d_dx(dx), d_dw(dw);
    cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), Nr, Cw);
    gpu::rmsnorm_forward(ctx(), d_out.get(), d_rstd.get(), d_x.get(), d_w.get(), Nr, Cw);
    const auto dw_scale = column_sum_scale(dw, Nr, Cw, [&](int r, int c) {
      return dout[at(r, c)] * x[at(r, c)] * rstd[std::size_t(r)];
    });
    cpu::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), Nr,
                          Cw);
    gpu::rmsnorm_backward(ctx(), d_dx.get(), d_dw.get(), d_dout.get(), d_x.get(), d_w.get(),
                          d_rstd.get(), Nr, Cw);
    expect_close("rmsnorm out", d_out.host(), out, kReduceRtol, kReduceAtol);
    expect_close("rmsnorm rstd", d_rstd.host(), rstd, kReduceRtol, kReduceAtol);
    expect_close("rmsnorm dinp", d_dx.host(), dx, kReduceRtol, kReduceAtol);
    const std::vector<double> dw_want(dw.begin(), dw.end());
    expect_close_scaled("rmsnorm dweight", d_dw.host(), dw_want, dw_scale, kColumnSumRtol,
                        kReduceAtol);
  }
  const int Nr = 29, F = 45;
  const auto gu = random_floats(std::size_t(Nr) * 2 * F, 85, -4.0f, 4.0f),
             dh = random_floats(std::size_t(Nr) * F, 86);
  std::vector<float> h(std::size_t(Nr) * F), dgu = random_floats(gu.size(), 87);
  DeviceBuffer<float> d_gu(gu), d_h(h.size()), d_dh(dh), d_dgu(dgu);
  cpu::swiglu_forward(h.data(), gu.data(), Nr, F);
  gpu::swiglu_forward(ctx(), d_h.get(), d_gu.get(), Nr, F);
  cpu::swiglu_backward(dgu.data(), gu.data(), dh.data(), Nr, F);
  gpu::swiglu_backward(ctx(), d_dgu.get(), d_gu.get(), d_dh.get(), Nr, F);
  expect_close("swiglu out", d_h.host(), h, kElemRtol, kElemAtol);
  expect_close("swiglu dgu", d_dgu.host(), dgu, kElemRtol, kElemAtol);

  const int T = 6, hs = 16, q_heads = 4, k_heads = 2, row0 = 4;
  const int stride = (q_heads + 2 * k_heads) * hs;  // q | k | v of one token
  std::vector<float> table(std::size_t(T) * hs);
  cpu::rope_table(table.data(), T, hs, 500000.0);  // Llama 3's theta
  std::vector<float> qkv = random_floats(std::size_t(Nr) * stride, 88, -2.0f, 2.0f);
  DeviceBuffer<float> d_table(table), d_qkv(qkv);
  for (bool backward : {false, true})
    for (auto [at, heads] : {std::pair{0, q_heads}, {q_heads * hs, k_heads}}) {
      (backward ? cpu::rope_backward : cpu::rope_forward)(qkv.data() + at, table.data(), Nr, T,
                                                          row0, heads, hs, stride);
      if (backward)
        gpu::rope_backward(ctx(), d_qkv.get() + at, d_table.get(), Nr, T, row0, heads, hs, stride);
      else
        gpu::rope_forward(ctx(), d_qkv.get() + at, d_table.get(), Nr, T, row0, heads, hs, stride);
    }
  expect_close("rope forward and back", d_qkv.host(), qkv, kElemRtol, kElemAtol);
  const auto start = random_floats(std::size_t(Nr) * stride, 88, -2.0f, 2.0f);
  expect_close("rope back undoes forward", qkv, start, kElemRtol, kElemAtol);
  gpu::rope_forward(ctx(), d_qkv.get(), d_table.get(), Nr, T, row0, q_heads, hs, stride);
  cpu::rope_forward(qkv.data(), table.data(), Nr, T, row0, q_heads, hs, stride);
  expect_close("rope forward", d_qkv.host(), qkv, kElemRtol, kElemAtol);
}

// The mixture-of-experts pieces against the CPU's: routing (the same experts; probabilities, gates
// and the backward to rounding), the load-balancing loss and its gradient, dispatch (exact),
// combine and the backwards, over a plan with a capacity that drops choices.
TEST_F(CudaLayers, MoeRoutingDispatchAndCombine) {
  const int Bq = 3, Tq = 9, E = 5, k = 2, Cw = 37, Nq = Bq * Tq;
  const auto logits = random_floats(std::size_t(Nq) * E, 90, -3.0f, 3.0f),
             dgates = random_floats(std::size_t(Nq) * k, 91),
             dprobs = random_floats(std::size_t(Nq) * E, 92);
  std::vector<float> probs(logits.size()), gates(dgates.size()), dlogits(logits.size());
  std::vector<std::int32_t> experts(dgates.size());
  cpu::router_topk_forward(probs.data(), experts.data(), gates.data(), logits.data(), Nq, E, k);
  cpu::router_topk_backward(dlogits.data(), probs.data(), experts.data(), gates.data(),
                            dgates.data(), dprobs.data(), Nq, E, k);
  DeviceBuffer<float> d_logits(logits), d_probs(probs.size()), d_gates(gates.size()),
      d_dgates(dgates), d_dprobs(dprobs), d_dlogits(dlogits.size());
  DeviceBuffer<std::int32_t> d_experts(experts.size());
  gpu::router_topk_forward(ctx(), d_probs.get(), d_experts.get(), d_gates.get(), d_logits.get(), Nq,
                           E, k);
  gpu::router_topk_backward(ctx(), d_dlogits.get(), d_probs.get(), d_experts.get(), d_gates.get(),
                            d_dgates.get(), d_dprobs.get(), Nq, E, k);
  EXPECT_EQ(d_experts.host(), experts);
  expect_close("router probs", d_probs.host(), probs, kElemRtol, kElemAtol);
  expect_close("router gates", d_gates.host(), gates, kElemRtol, kElemAtol);
  expect_close("router dlogits", d_dlogits.host(), dlogits, kReduceRtol, kReduceAtol);

  std::vector<float> aux(Bq), daux(probs.size());
  // The sequences' counts, and a sequence of 2 Tq tokens (half of it on another cp rank).
  const std::vector<std::int32_t> choices =
      strata::moe_chunk_choices(experts.data(), Bq, Tq, E, k, 1);
  cpu::moe_aux_loss_forward(aux.data(), probs.data(), choices.data(), Bq, Tq, 2 * Tq, E, k, 0.01f);
  cpu::moe_aux_loss_backward(daux.data(), choices.data(), Bq, Tq, 2 * Tq, E, k, 0.5f);
  DeviceBuffer<float> d_aux(Bq), d_daux(daux.size()), d_scratch(std::size_t(Bq) * E);
  DeviceBuffer<std::int32_t> d_choices(choices);
  gpu::moe_aux_loss_forward(ctx(), d_aux.get(), d_scratch.get(), d_probs.get(), d_choices.get(), Bq,
                            Tq, 2 * Tq, E, k, 0.01f);
  gpu::moe_aux_loss_backward(ctx(), d_daux.get(), d_scratch.get(), d_choices.get(), Bq, Tq, 2 * Tq,
                             E, k, 0.5f);
  expect_close("aux loss", d_aux.host(), aux, kReduceRtol, kReduceAtol);
  expect_close("aux dprobs", d_daux.host(), daux, kElemRtol, kElemAtol);

  const strata::MoeDispatch plan = strata::moe_dispatch(experts.data(), Bq, Tq, E, k, 3);
  ASSERT_GT(plan.dropped, 0);
  const int R = plan.rows();
  const auto x = random_floats(std::size_t(Nq) * Cw, 93),
             eout = random_floats(std::size_t(R) * Cw, 94),
             dy = random_floats(std::size_t(Nq) * Cw, 95), din = random_floats(eout.size(), 96);
  std::vector<float> xd(eout.size()), y(x.size()), deout(eout.size()), dg(gates.size()),
      dx = random_floats(x.size(), 97);
  DeviceBuffer<float> d_x(x), d_eout(eout), d_dy(dy), d_din(din), d_xd(xd.size()), d_y(y.size()),
      d_deout(deout.size()), d_dg(dg.size()), d_dx(dx);
  DeviceBuffer<std::int32_t> d_token_of(plan.token_of), d_row_of(plan.row_of);
  cpu::moe_gather(xd.data(), x.data(), plan.token_of.data(), R, Cw);
  cpu::moe_gather_backward(dx.data(), din.data(), plan.row_of.data(), Nq, k, Cw);
  cpu::moe_combine(y.data(), eout.data(), plan.row_of.data(), gates.data(), Nq, k, Cw);
  cpu::moe_combine_backward(deout.data(), dg.data(), dy.data(), eout.data(), plan.row_of.data(),
                            gates.data(), Nq, k, Cw);
  gpu::moe_gather(ctx(), d_xd.get(), d_x.get(), d_token_of.get(), R, Cw);
  gpu::moe_gather_backward(ctx(), d_dx.get(), d_din.get(), d_row_of.get(), Nq, k, Cw);
  gpu::moe_combine(ctx(), d_y.get(), d_eout.get(), d_row_of.get(), d_gates.get(), Nq, k, Cw);
  gpu::moe_combine_backward(ctx(), d_deout.get(), d_dg.get(), d_dy.get(), d_eout.get(),
                            d_row_of.get(), d_gates.get(), Nq, k, Cw);
  EXPECT_EQ(d_xd.host(), xd);
  // A bf16 run's dispatch copies its bf16 rows as they are.
  std::vector<strata::bf16> x_h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x_h[i] = strata::to_bf16(x[i]);
  DeviceBuffer<strata::bf16> d_x_h(x_h), d_xd_h(xd.size());
  gpu::moe_gather(ctx(), d_xd_h.get(), d_x_h.get(), d_token_of.get(), R, Cw);
  const std::vector<strata::bf16> xd_h = d_xd_h.host();
  int wrong = 0;
  for (std::size_t i = 0; i < xd.size(); ++i) wrong += xd_h[i].bits != strata::to_bf16(xd[i]).bits;
  EXPECT_EQ(wrong, 0) << "of " << xd.size() << " bf16 dispatched elements";
  expect_close("gather backward", d_dx.host(), dx, kElemRtol, kElemAtol);
  expect_close("combine", d_y.host(), y, kElemRtol, kElemAtol);
  expect_close("combine backward rows", d_deout.host(), deout, kElemRtol, kElemAtol);
  expect_close("combine backward gates", d_dg.host(), dg, kReduceRtol, kReduceAtol);
}

// ---------------------------------------------------------------------------------------------

// Cross-entropy over a vocabulary smaller than, and several times larger than, one block.
class CudaCrossEntropy : public ::testing::TestWithParam<int> {};

TEST_P(CudaCrossEntropy, ForwardAndBackward) {
  STRATA_REQUIRE_GPU();
  gpu::CudaContext ctx(0);
  const int Vv = GetParam();
  const std::size_t n = std::size_t(N) * Vv;
  const auto logits = random_floats(n, 70, -8.0f, 8.0f);
  const auto targets = random_tokens(N, Vv, 71);
  std::vector<float> probs(n), losses(N);
  cpu::softmax_crossentropy_forward(probs.data(), losses.data(), logits.data(), targets.data(), N,
                                    Vv);
  DeviceBuffer<std::int32_t> d_targets(targets);
  DeviceBuffer<float> d_logits(logits), d_probs(n), d_losses(N);
  gpu::softmax_crossentropy_forward(ctx, d_probs.get(), d_losses.get(), d_logits.get(),
                                    d_targets.get(), N, Vv);
  expect_close("probs", d_probs.host(), probs, kReduceRtol, kReduceAtol);
  expect_close("losses", d_losses.host(), losses, kReduceRtol, kReduceAtol);

  // In place (probs aliasing logits), as the model calls it.
  DeviceBuffer<float> d_inplace(logits), d_losses2(N);
  gpu::softmax_crossentropy_forward(ctx, d_inplace.get(), d_losses2.get(), d_inplace.get(),
                                    d_targets.get(), N, Vv);
  expect_close("probs (in place)", d_inplace.host(), probs, kReduceRtol, kReduceAtol);
  expect_close("losses (in place)", d_losses2.host(), losses, kReduceRtol, kReduceAtol);

  const float grad_scale = 1.0f / float(N);
  auto dlogits = random_floats(n, 72);
  DeviceBuffer<float> d_dlogits(dlogits);
  cpu::crossentropy_softmax_backward(dlogits.data(), probs.data(), targets.data(), grad_scale, N,
                                     Vv);
  // The GPU backward reads the CPU's probs, so it is checked on its own.
  DeviceBuffer<float> d_cpu_probs(probs);
  gpu::crossentropy_softmax_backward(ctx, d_dlogits.get(), d_cpu_probs.get(), d_targets.get(),
                                     grad_scale, N, Vv);
  expect_close("dlogits", d_dlogits.host(), dlogits, kElemRtol, kElemAtol);
}

INSTANTIATE_TEST_SUITE_P(Vocab, CudaCrossEntropy, ::testing::Values(V, 5003),
                         [](const auto& info) { return "V" + std::to_string(info.param); });

// ---------------------------------------------------------------------------------------------

TEST_F(CudaLayers, AdamW) {
  const std::int64_t n = 100003;
  auto p = random_floats(n, 80), m = random_floats(n, 81, -0.1f, 0.1f),
       v = random_floats(n, 82, 0.0f, 0.01f);
  const auto g = random_floats(n, 83);
  DeviceBuffer<float> d_p(p), d_m(m), d_v(v), d_g(g);
  for (int t = 1; t <= 3; ++t) {
    cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t,
                      0.5f);
    gpu::adamw_update(ctx(), d_p.get(), d_g.get(), d_m.get(), d_v.get(), n, 1e-3f, 0.9f, 0.95f,
                      1e-8f, 0.1f, t, 0.5f);
  }
  expect_close("params", d_p.host(), p, kElemRtol, kElemAtol);
  expect_close("m", d_m.host(), m, kElemRtol, kElemAtol);
  expect_close("v", d_v.host(), v, kElemRtol, kElemAtol);
}

// ---------------------------------------------------------------------------------------------

TEST_F(CudaLayers, ErrorsNameTheCallAndCarryAHint) {
  // A device index past the last one: the checking macro must throw strata::Error with file:line,
  // CUDA's error name and a hint.
  const int n = gpu::cuda_device_count();
  try {
    gpu::CudaContext bad(n);
    FAIL() << "CudaContext(" << n << ") did not throw";
  } catch (const strata::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("layers.cu:"), std::string::npos) << what;
    EXPECT_NE(what.find("cudaErrorInvalidDevice"), std::string::npos) << what;
    EXPECT_FALSE(e.hint().empty());
  }
}

}  // namespace
