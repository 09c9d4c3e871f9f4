// The CPU backend's elementwise operations (strata/device.hpp): values, dtypes, and the errors
// for views that do not match.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "strata/device.hpp"

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
