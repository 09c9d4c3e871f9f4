// bf16 GEMMs of the CPU backend (cpu/gemm_bf16.hpp): gemm_bf16 against a double-precision
// reference of the same bf16 operands (every transpose, odd shapes, f32 and bf16 C, accumulate on
// and off), its primitive cache, threads and errors; round_to_bf16 / widen_bf16 bit for bit.
// STRATA_EXPECT_ONEDNN (from STRATA_WITH_ONEDNN): a build with oneDNN that cannot run a bf16 GEMM
// fails here; a build without it must refuse every GEMM.
#include <gtest/gtest.h>
#include <omp.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/gemm_bf16.hpp"
#include "backends/cpu/layers.hpp"

namespace {

using strata::bf16;
using strata::DType;
namespace cpu = strata::cpu;

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

TEST(RoundToBf16, BitForBitToBf16OnRandomAndSpecialValues) {
  std::vector<std::uint32_t> patterns = {
      0x00000000, 0x80000000,              // +-0
      0x7f800000, 0xff800000,              // +-inf
      0x7fc00000, 0x7f800001, 0xffa5a5a5,  // quiet and signalling NaNs, payloads
      0x7f7fffff, 0xff7fffff,              // +-max finite: rounds up to +-inf
      0x7f7f7fff, 0x7f7f8000,              // just below and at the overflow tie
      0x3f808000, 0x3f818000, 0xbf808000,  // ties: to even down, to even up, negative
      0x3f808001, 0x3f807fff,              // just above and below a tie
      0x00000001, 0x00012345, 0x80012345,  // denormals (vcvtneps2bf16 would flush these)
      0x00008000, 0x00018000, 0x007fffff,  // denormal ties; the largest denormal rounds to normal
  };
  std::mt19937 rng(7);
  for (int i = 0; i < 100003; ++i) patterns.push_back(rng());  // every class, odd length
  std::vector<float> in(patterns.size());
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = float_of(patterns[i]);
  std::vector<bf16> out(in.size());
  cpu::round_to_bf16(out.data(), in.data(), in.size());
  for (std::size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(out[i].bits, strata::to_bf16(in[i]).bits) << std::hex << "input 0x" << patterns[i];
  EXPECT_EQ(out[7].bits, 0x7f80);           // max finite overflows to infinity
  EXPECT_EQ(out[11].bits, 0x3f80);          // tie to even (down)
  EXPECT_EQ(out[12].bits, 0x3f82);          // tie to even (up)
  EXPECT_EQ(out[17].bits, 0x0001);          // a denormal stays a denormal
  EXPECT_EQ(out[5].bits & 0x7fc0, 0x7fc0);  // a signalling NaN comes out a quiet NaN
  // Every short length and an unaligned start (the vector loop's tails).
  for (std::size_t n = 0; n <= 33; ++n) {
    std::vector<bf16> part(n + 1);
    cpu::round_to_bf16(part.data() + 1, in.data() + 1, n);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(part[i + 1].bits, strata::to_bf16(in[i + 1]).bits) << "n=" << n << " i=" << i;
  }
}

TEST(WidenBf16, EveryBitPatternExactly) {
  std::vector<bf16> in(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) in[i].bits = std::uint16_t(i);
  std::vector<float> out(in.size() + 1);
  cpu::widen_bf16(out.data() + 1, in.data(), in.size());  // unaligned output
  for (std::uint32_t i = 0; i < 65536; ++i) ASSERT_EQ(bits_of(out[i + 1]), i << 16) << i;
}

#if STRATA_EXPECT_ONEDNN

// An ordering of bf16 bit patterns in which neighbours differ by 1 (across zero too).
int ordered(std::uint16_t b) { return (b & 0x8000) ? -int(b & 0x7fff) : int(b); }

std::vector<bf16> random_bf16(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<bf16> v(n);
  for (auto& x : v) x = strata::to_bf16(dist(rng));
  return v;
}

struct Shape {
  int M, N, K;
};

// Exact count of the bf16-C results that equal the reference rounded once, over all elements.
struct Bf16Match {
  long exact = 0, total = 0;
};

// One GEMM against the reference sum_k a[m,k] b[k,n] (+ C's old value) in double. f32 C: within
// tol * (sum |a b| + |C|) with tol = 1e-5 sqrt(K) (fp32 accumulation). bf16 C: within 1 ulp of
// the reference rounded to bf16, or a rounding of a value within that fp32 error (near zero,
// cancellation makes ulps tiny).
void check_gemm(bool ta, bool tb, Shape s, DType c_dtype, bool accumulate, std::mt19937& rng,
                Bf16Match& match) {
  const auto [M, N, K] = s;
  const auto a = random_bf16(std::size_t(M) * K, rng), b = random_bf16(std::size_t(K) * N, rng);
  const auto c0 = random_bf16(std::size_t(M) * N, rng);  // the old C (bf16 values, also as f32)
  std::vector<float> c_f32(c0.size());
  std::vector<bf16> c_bf16 = c0;
  cpu::widen_bf16(c_f32.data(), c0.data(), c0.size());
  void* c = c_dtype == DType::f32 ? static_cast<void*>(c_f32.data()) : c_bf16.data();
  cpu::gemm_bf16(ta, tb, M, N, K, a.data(), b.data(), c, c_dtype, accumulate);
  const double tol = 1e-5 * std::sqrt(double(K));
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      const std::size_t i = std::size_t(m) * N + n;
      double ref = accumulate ? strata::to_float(c0[i]) : 0.0, scale = std::abs(ref);
      for (int k = 0; k < K; ++k) {
        const double p =
            double(strata::to_float(a[ta ? std::size_t(k) * M + m : std::size_t(m) * K + k])) *
            strata::to_float(b[tb ? std::size_t(n) * K + k : std::size_t(k) * N + n]);
        ref += p;
        scale += std::abs(p);
      }
      const double bound = tol * scale;
      const std::string where = "at [" + std::to_string(m) + "," + std::to_string(n) + "]";
      if (c_dtype == DType::f32) {
        ASSERT_NEAR(c_f32[i], ref, bound) << where;
        continue;
      }
      const int got = ordered(c_bf16[i].bits);
      const int want = ordered(strata::to_bf16(float(ref)).bits);
      const int lo = ordered(strata::to_bf16(float(ref - bound)).bits);
      const int hi = ordered(strata::to_bf16(float(ref + bound)).bits);
      ASSERT_TRUE(std::abs(got - want) <= 1 || (lo <= got && got <= hi))
          << where << ": got 0x" << std::hex << c_bf16[i].bits << ", reference rounds to 0x"
          << strata::to_bf16(float(ref)).bits;
      match.exact += got == want;
      ++match.total;
    }
}

// The last two cross the widened GEMM's 512-wide tiles in M and K, and in N and K.
const Shape kShapes[] = {{1, 1, 1},       {7, 13, 5},     {64, 96, 33},
                         {300, 200, 150}, {520, 17, 530}, {17, 530, 520}};

// Where oneDNN may use no ISA above AVX2 (ONEDNN_MAX_CPU_ISA=AVX2: the ctest gemm_bf16.widened runs
// this whole file so, on any x86 CPU), it has no bf16 matmul and every GEMM runs widened on
// OpenBLAS; the other tests of this file then check that path against the same references.
TEST(GemmBf16, WidenedWhereOneDnnHasNoBf16Matmul) {
  const char* isa = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (isa == nullptr || std::string(isa) != "AVX2") {
    EXPECT_EQ(cpu::bf16_gemm_widened(), cpu::bf16_gemm_impl().starts_with("widened:"));
    return;
  }
  EXPECT_TRUE(cpu::bf16_gemm_widened()) << cpu::bf16_gemm_impl();
  // The scratchpad holds tiles of the widened A, B and a bf16 C in fp32, each on 64 bytes, at most
  // 512 wide in M, N and K.
  const std::size_t floats = (7 * 5 + 15) / 16 * 16 + (5 * 13 + 15) / 16 * 16;
  EXPECT_EQ(cpu::gemm_bf16_scratchpad_bytes(false, false, 7, 13, 5, DType::f32, false), floats * 4);
  EXPECT_EQ(cpu::gemm_bf16_scratchpad_bytes(false, false, 7, 13, 5, DType::bf16, true),
            (floats + (7 * 13 + 15) / 16 * 16) * 4);
  EXPECT_EQ(cpu::gemm_bf16_scratchpad_bytes(true, true, 4096, 50304, 768, DType::bf16, true),
            (512 * 512 * 3) * 4);
}

TEST(GemmBf16, MatchesDoubleReferenceForEveryTransposeShapeAndC) {
  ASSERT_TRUE(cpu::have_bf16_gemm()) << "oneDNN is built in but has no bf16 matmul here";
  EXPECT_FALSE(cpu::bf16_gemm_impl().empty());
  std::mt19937 rng(42);
  for (DType c_dtype : {DType::f32, DType::bf16}) {
    Bf16Match match;
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (Shape s : kShapes)
          for (bool accumulate : {false, true}) {
            SCOPED_TRACE("ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                         " M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" +
                         std::to_string(s.K) + " bf16 C=" + std::to_string(c_dtype == DType::bf16) +
                         " acc=" + std::to_string(accumulate));
            check_gemm(ta, tb, s, c_dtype, accumulate, rng, match);
            if (HasFatalFailure()) return;
          }
    // Rounded once from fp32: almost every element is the correctly rounded reference (a
    // truncating conversion, or C rounded before the sum, would miss about half of them).
    if (c_dtype == DType::bf16) EXPECT_GE(double(match.exact) / double(match.total), 0.99);
  }
}

TEST(GemmBf16, RepeatedShapeReusesItsPrimitive) {
  std::mt19937 rng(1);
  // A shape no other test uses, and a new one each time this test runs in the process
  // (--gtest_repeat): the cache lives as long as the process.
  static int runs = 0;
  const int M = 37 + runs++, N = 41, K = 43;
  const auto a = random_bf16(M * K, rng), b = random_bf16(K * N, rng);
  std::vector<float> c(M * N);
  const std::size_t before = cpu::gemm_bf16_cached_primitives();
  cpu::gemm_bf16(false, false, M, N, K, a.data(), b.data(), c.data(), DType::f32, false);
  EXPECT_EQ(cpu::gemm_bf16_cached_primitives(), before + 1);
  const std::vector<float> first = c;
  cpu::gemm_bf16(false, false, M, N, K, a.data(), b.data(), c.data(), DType::f32, false);
  EXPECT_EQ(cpu::gemm_bf16_cached_primitives(), before + 1);
  EXPECT_EQ(c, first);
  cpu::gemm_bf16(false, false, M, N, K, a.data(), b.data(), c.data(), DType::f32, true);
  EXPECT_EQ(cpu::gemm_bf16_cached_primitives(), before + 2);  // accumulate is another primitive
}

// oneDNN's OpenMP threads follow the BLAS count: on the thread that set it, and on any other
// thread that calls gemm_bf16 (OpenMP's count is per thread).
TEST(GemmBf16, RunsOnTheBlasThreadCount) {
  const int saved = cpu::blas_threads();
  cpu::set_blas_threads(2);
  const int n = cpu::blas_threads();  // 1 where the BLAS has no thread setter
  EXPECT_EQ(omp_get_max_threads(), n);
  std::mt19937 rng(3);
  const auto a = random_bf16(64 * 64, rng);
  std::vector<float> c(64 * 64);
  int other_thread = 0;
  std::thread t([&] {
    omp_set_num_threads(5);
    cpu::gemm_bf16(false, true, 64, 64, 64, a.data(), a.data(), c.data(), DType::f32, false);
    other_thread = omp_get_max_threads();
  });
  t.join();
  EXPECT_EQ(other_thread, n);
  cpu::set_blas_threads(saved);
}

TEST(GemmBf16, ConcurrentCallersGetTheSerialResult) {
  std::mt19937 rng(5);
  const int M = 96, N = 80, K = 72;
  const auto a = random_bf16(M * K, rng), b = random_bf16(K * N, rng);
  std::vector<float> serial(M * N);
  cpu::gemm_bf16(true, false, M, N, K, a.data(), b.data(), serial.data(), DType::f32, false);
  std::vector<std::vector<float>> results(3, std::vector<float>(M * N));
  std::vector<std::thread> threads;
  for (auto& r : results)
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i)
        cpu::gemm_bf16(true, false, M, N, K, a.data(), b.data(), r.data(), DType::f32, false);
    });
  for (auto& t : threads) t.join();
  for (const auto& r : results) EXPECT_EQ(r, serial);
}

TEST(GemmBf16, EmptyProductsAndBadCalls) {
  std::vector<float> c = {1.0f, 2.0f};
  std::vector<bf16> a(2), b(2);
  cpu::gemm_bf16(false, false, 1, 2, 0, a.data(), b.data(), c.data(), DType::f32, true);
  EXPECT_EQ(c, (std::vector<float>{1.0f, 2.0f}));  // K = 0, accumulate: C unchanged
  cpu::gemm_bf16(false, false, 1, 2, 0, nullptr, nullptr, c.data(), DType::f32, false);
  EXPECT_EQ(c, (std::vector<float>{0.0f, 0.0f}));  // K = 0: C = 0
  cpu::gemm_bf16(false, false, 0, 2, 3, nullptr, nullptr, nullptr, DType::f32, false);
  try {
    cpu::gemm_bf16(false, true, -1, 2, 3, a.data(), b.data(), c.data(), DType::f32, false);
    ADD_FAILURE() << "a negative M was taken";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemm_bf16(M=-1, N=2, K=3, trans_a=0, trans_b=1"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(
      cpu::gemm_bf16(false, false, 1, 1, 1, a.data(), b.data(), c.data(), DType::f64, false),
      strata::Error);
  EXPECT_THROW(
      cpu::gemm_bf16(false, false, 1, 1, 1, nullptr, b.data(), c.data(), DType::f32, false),
      strata::Error);
}

#else  // built without oneDNN: every GEMM is refused with the way out

TEST(GemmBf16, WithoutOneDnnEveryGemmIsRefused) {
  EXPECT_FALSE(cpu::have_bf16_gemm());
  EXPECT_TRUE(cpu::bf16_gemm_impl().empty());
  std::vector<bf16> a(4), b(4);
  std::vector<float> c(4);
  try {
    cpu::gemm_bf16(false, false, 2, 2, 2, a.data(), b.data(), c.data(), DType::f32, false);
    ADD_FAILURE() << "gemm_bf16 ran without oneDNN";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16 GEMM: this build has no oneDNN"), std::string::npos);
    EXPECT_NE(e.hint().find("libdnnl-dev"), std::string::npos);
  }
}

#endif

}  // namespace
