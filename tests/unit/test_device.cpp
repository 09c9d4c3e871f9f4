// The CPU backend's elementwise operations (strata/device.hpp): values, dtypes, and the errors
// for views that do not match.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "strata/device.hpp"
#include "strata/memory.hpp"

namespace {

using strata::BufferView;
using strata::view;

TEST(CpuOps, CopyFillScaleAxpyAndSumOfSquares) {
  strata::DeviceOps& ops = strata::cpu_ops();
  EXPECT_EQ(ops.device(), strata::Device::cpu);
  std::vector<float> x = {1.5f, -2.0f, 0.25f}, y(3);
  ops.copy(view(y.data(), 3), view(x.data(), 3));
  EXPECT_EQ(y, x);
  ops.scale(view(y.data(), 3), -2.0);
  EXPECT_EQ(y, (std::vector<float>{-3.0f, 4.0f, -0.5f}));
  ops.axpy(view(y.data(), 3), 0.5, view(x.data(), 3));  // y += x / 2
  EXPECT_EQ(y, (std::vector<float>{-2.25f, 3.0f, -0.375f}));
  EXPECT_DOUBLE_EQ(ops.sum_of_squares(view(x.data(), 3)), 1.5 * 1.5 + 4.0 + 0.0625);
  ops.fill(view(y.data() + 1, 2), 7.0);  // a sub-range only
  EXPECT_EQ(y, (std::vector<float>{-2.25f, 7.0f, 7.0f}));
  ops.fill(view(y.data(), 0), 1.0);  // empty: nothing
  EXPECT_EQ(y[0], -2.25f);
}

TEST(CpuOps, CastRoundsToNearestBothWays) {
  strata::DeviceOps& ops = strata::cpu_ops();
  std::vector<double> d = {0.1, 1e-50, -3.0};
  std::vector<float> f(3);
  ops.cast(view(f.data(), 3), view(d.data(), 3));
  EXPECT_EQ(f[0], 0.1f);
  EXPECT_EQ(f[1], 0.0f);  // below float's range: rounds to zero
  EXPECT_EQ(f[2], -3.0f);
  std::vector<double> back(3);
  ops.cast(view(back.data(), 3), view(f.data(), 3));
  EXPECT_EQ(back[0], double(0.1f));
}

TEST(CpuOps, MismatchedViewsAreRefused) {
  strata::DeviceOps& ops = strata::cpu_ops();
  std::vector<float> a(4), b(3);
  std::vector<double> d(4);
  std::vector<int> i(4);
  EXPECT_THROW(ops.copy(view(a.data(), 4), view(b.data(), 3)), strata::Error);
  EXPECT_THROW(ops.copy(view(a.data(), 4), view(d.data(), 4)), strata::Error);  // cast, not copy
  EXPECT_THROW(ops.axpy(view(a.data(), 4), 1.0, view(d.data(), 4)), strata::Error);
  const BufferView ints{i.data(), 4, strata::DType::i32};
  EXPECT_THROW(ops.fill(ints, 0), strata::Error);
  EXPECT_THROW(ops.sum_of_squares(ints), strata::Error);
}

}  // namespace

namespace {

float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

TEST(Bf16, RoundsToNearestEvenKeepsNaNAndOverflowsToInfinity) {
  using strata::to_bf16;
  using strata::to_float;
  EXPECT_EQ(to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(to_float(to_bf16(-2.5f)), -2.5f);
  const float ulp = std::ldexp(1.0f, -7);                           // bf16's spacing just above 1
  EXPECT_EQ(to_float(to_bf16(1.0f + ulp / 2)), 1.0f);               // a tie: to the even mantissa
  EXPECT_EQ(to_float(to_bf16(1.0f + 1.5f * ulp)), 1.0f + 2 * ulp);  // a tie: to the even one
  EXPECT_EQ(to_float(to_bf16(1.0f + 0.75f * ulp)), 1.0f + ulp);     // nearer the upper one
  EXPECT_TRUE(std::isnan(to_float(to_bf16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(to_float(to_bf16(bits_to_float(0x7f800001u)))));  // a NaN that
  // truncation would have turned into infinity
  EXPECT_TRUE(std::isinf(to_float(to_bf16(3.4e38f))));
  strata::bf16 b[3];
  EXPECT_EQ(strata::view(b, 3).bytes(), 6u);  // half of f32 on the wire
}

TEST(Bf16, CastToAndFromF32ThroughTheBackend) {
  strata::DeviceOps& ops = strata::cpu_ops();
  std::vector<float> f = {1.0f, 3.14159265f, -1e-3f, 65504.0f}, back(4);
  std::vector<strata::bf16> b(4);
  ops.cast(view(b.data(), 4), view(f.data(), 4));
  ops.cast(view(back.data(), 4), view(b.data(), 4));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(back[i], strata::to_float(strata::to_bf16(f[i])));
    EXPECT_NEAR(back[i], f[i], std::fabs(f[i]) * std::ldexp(1.0, -8));  // half a bf16 ulp
  }
  std::vector<strata::bf16> copy(4);
  ops.copy(view(copy.data(), 4), view(b.data(), 4));
  EXPECT_EQ(copy[1].bits, b[1].bits);
  EXPECT_THROW(ops.axpy(view(copy.data(), 4), 1.0, view(f.data(), 4)), strata::Error);  // dtypes
}

// bf16 gradients and parameters: arithmetic goes through float and each result is rounded once.
TEST(Bf16, ArithmeticThroughTheBackendRoundsOncePerElement) {
  strata::DeviceOps& ops = strata::cpu_ops();
  const std::vector<float> xs = {1.0f, 3.14159265f, -1e-3f, 300.5f, 1.0f + 1.0f / 256};
  const std::size_t n = xs.size();
  std::vector<strata::bf16> x(n), y(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = strata::to_bf16(xs[i]), y[i] = strata::to_bf16(0.5f);
  ops.axpy(view(y.data(), n), 0.25, view(x.data(), n));  // y = 0.5 + 0.25 x
  double want_sq = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float want = strata::to_float(strata::to_bf16(0.5f + 0.25f * strata::to_float(x[i])));
    EXPECT_EQ(strata::to_float(y[i]), want) << i;
    want_sq += double(strata::to_float(x[i])) * strata::to_float(x[i]);
  }
  EXPECT_DOUBLE_EQ(ops.sum_of_squares(view(x.data(), n)), want_sq);
  ops.scale(view(x.data(), n), 3.0);
  EXPECT_EQ(strata::to_float(x[1]),
            strata::to_float(strata::to_bf16(3.0f * strata::to_float(strata::to_bf16(xs[1])))));
  ops.fill(view(x.data(), n), 0.1);
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(x[i].bits, strata::to_bf16(0.1f).bits);
}

}  // namespace

namespace {

TEST(CpuOps, ABufferViewCarriesItsDtypeAndDeviceAndOtherDevicesAreRefused) {
  strata::MemoryLedger ledger;
  strata::Buffer<float> b(ledger, strata::MemTag::workspace, 5);
  const BufferView v = b.view();
  EXPECT_EQ(v.data, b.data());
  EXPECT_EQ(v.count, 5u);
  EXPECT_EQ(v.dtype, strata::DType::f32);
  EXPECT_EQ(v.device, strata::Device::cpu);
  strata::cpu_ops().fill(v, 2.0);
  EXPECT_EQ(b[4], 2.0f);
  BufferView on_gpu = v;
  on_gpu.device = strata::Device::cuda;
  EXPECT_THROW(strata::cpu_ops().fill(on_gpu, 0), strata::Error);
  EXPECT_THROW(strata::cpu_ops().copy(v, on_gpu), strata::Error);
  EXPECT_EQ(b[0], 2.0f);  // untouched
}

}  // namespace

namespace {

// Work on a buffer goes to the backend of the buffer's device (AdamW included).
TEST(DeviceOps, EachDeviceHasItsBackendOrARefusal) {
  EXPECT_EQ(&strata::device_ops(strata::Device::cpu), &strata::cpu_ops());
  EXPECT_THROW(strata::device_ops(strata::Device::cuda), strata::Error);
  std::vector<float> p(3, 1.0f), g(3, 0.5f), m(3), v(3), short_m(2);
  strata::DeviceOps::AdamWStep st{0.1f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, 1.0f};
  strata::cpu_ops().adamw(view(p.data(), 3), {}, view(g.data(), 3), view(m.data(), 3),
                          view(v.data(), 3), st);
  for (float x : p) EXPECT_FLOAT_EQ(x, 1.0f - 0.1f);  // first Adam step: lr x sign(g)
  EXPECT_THROW(strata::cpu_ops().adamw(view(p.data(), 3), {}, view(g.data(), 3),
                                       view(short_m.data(), 2), view(v.data(), 3), st),
               strata::Error);
}

}  // namespace
