// The CUDA emulator's WMMA (tests/cuda_emu/include/mma.h): bf16 x bf16 -> fp32 16 x 16 x 16 tiles
// in every layout against a double reference, fragment loads / stores / fills as round trips, and
// the warp-collective check; and its PTX instructions (cuda_emu/ptx.hpp, through ptx.cuh). One
// warp per launch, in device memory, as a kernel would use it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/cuda/launch.cuh"
#include "backends/cuda/ptx.cuh"
#include "random_inputs.hpp"

namespace wmma = nvcuda::wmma;

namespace {

constexpr int kN = 16;  // the tile: 16 x 16, k 16

// Device copies of n values (the emulator's device memory is host memory).
template <class T>
T* device_copy(const std::vector<T>& host) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return static_cast<T*>(p);
}
template <class T>
std::vector<T> host_copy(const T* p, std::size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(host.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

// d = a b + c; a, b with leading dimension ld in their layouts, c read and d written in c_layout.
template <class LayoutA, class LayoutB>
__global__ void mma_kernel(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c,
                           unsigned ld, wmma::layout_t c_layout) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::load_matrix_sync(fa, a, ld);
  wmma::load_matrix_sync(fb, b, ld);
  wmma::load_matrix_sync(fc, c, ld, c_layout);
  wmma::mma_sync(fc, fa, fb, fc);  // d aliasing c, as kernels accumulate
  wmma::store_matrix_sync(d, fc, ld, c_layout);
}

// Element (r, col) of a 16 x 16 tile stored with leading dimension ld.
std::size_t at(int r, int col, unsigned ld, bool row_major) {
  return row_major ? std::size_t(r) * ld + col : std::size_t(col) * ld + r;
}

template <class LayoutA, class LayoutB>
void check_mma(wmma::layout_t c_layout, std::uint32_t seed) {
  constexpr unsigned ld = 24;  // a padded leading dimension (a multiple of 8 bf16 / 4 floats)
  constexpr bool a_rows = std::is_same_v<LayoutA, wmma::row_major>;
  constexpr bool b_rows = std::is_same_v<LayoutB, wmma::row_major>;
  const bool c_rows = c_layout == wmma::mem_row_major;
  const auto av = random_floats(kN * ld, seed, -2.0f, 2.0f), bv = random_floats(kN * ld, seed + 1);
  const auto cv = random_floats(kN * ld, seed + 2, -4.0f, 4.0f);
  std::vector<__nv_bfloat16> a(av.size()), b(bv.size());
  for (std::size_t i = 0; i < av.size(); ++i) a[i] = __float2bfloat16_rn(av[i]);
  for (std::size_t i = 0; i < bv.size(); ++i) b[i] = __float2bfloat16_rn(bv[i]);
  __nv_bfloat16 *da = device_copy(a), *db = device_copy(b);
  float *dc = device_copy(cv), *dd = device_copy(std::vector<float>(cv.size(), -1.0f));
  STRATA_LAUNCH((mma_kernel<LayoutA, LayoutB>), 1, 32, 0, nullptr)
  (dd, da, db, dc, ld, c_layout);
  const auto d = host_copy(dd, cv.size());
  // The reference in double from the same bf16 values; fp32 adds 17 terms one by one, each
  // addition within 2^-24 of its partial sum, so |d - ref| <= 16 2^-24 sum |terms|.
  double worst = 0.0;
  for (int m = 0; m < kN; ++m)
    for (int n = 0; n < kN; ++n) {
      const float c = cv[at(m, n, ld, c_rows)];
      double ref = c, terms = std::fabs(c);
      for (int k = 0; k < kN; ++k) {
        const double p = double(__bfloat162float(a[at(m, k, ld, a_rows)])) *
                         __bfloat162float(b[at(k, n, ld, b_rows)]);
        ref += p;
        terms += std::fabs(p);
      }
      const double err = std::fabs(d[at(m, n, ld, c_rows)] - ref);
      EXPECT_LE(err, 16.0 * std::ldexp(terms, -24)) << "d[" << m << "][" << n << "]";
      worst = std::max(worst, err / terms);
    }
  // Outside the tile (the padding columns of the leading dimension) nothing was written.
  for (int i = 0; i < kN; ++i)
    for (unsigned j = kN; j < ld; ++j) EXPECT_EQ(d[i * ld + j], -1.0f);
  ::testing::Test::RecordProperty("max_relative_error", std::to_string(worst));
  cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dd);
}

TEST(CudaEmuWmma, MmaRowRow) {
  check_mma<wmma::row_major, wmma::row_major>(wmma::mem_row_major, 1);
}
TEST(CudaEmuWmma, MmaRowCol) {
  check_mma<wmma::row_major, wmma::col_major>(wmma::mem_col_major, 4);
}
TEST(CudaEmuWmma, MmaColRow) {
  check_mma<wmma::col_major, wmma::row_major>(wmma::mem_row_major, 7);
}
TEST(CudaEmuWmma, MmaColCol) {
  check_mma<wmma::col_major, wmma::col_major>(wmma::mem_col_major, 9);
}

// An accumulator loaded row-major and stored column-major is the transpose; a filled one is the
// value everywhere; and a product with the identity gives b back exactly.
__global__ void round_trip_kernel(float* transposed, float* filled, float* product, const float* c,
                                  const __nv_bfloat16* identity, const __nv_bfloat16* b) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
  wmma::load_matrix_sync(f, c, 16, wmma::mem_row_major);
  wmma::store_matrix_sync(transposed, f, 16, wmma::mem_col_major);
  wmma::fill_fragment(f, 2.5f);
  wmma::store_matrix_sync(filled, f, 16, wmma::mem_row_major);
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
  wmma::load_matrix_sync(fa, identity, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::fill_fragment(f, 0.0f);
  wmma::mma_sync(f, fa, fb, f);
  wmma::store_matrix_sync(product, f, 16, wmma::mem_row_major);
}

TEST(CudaEmuWmma, LoadStoreFillRoundTrips) {
  const auto c = random_floats(kN * kN, 20);
  std::vector<__nv_bfloat16> identity(kN * kN), b(kN * kN);
  const auto bv = random_floats(kN * kN, 21);
  for (int i = 0; i < kN * kN; ++i) {
    identity[i] = __float2bfloat16_rn(i / kN == i % kN ? 1.0f : 0.0f);
    b[i] = __float2bfloat16_rn(bv[i]);
  }
  float *dc = device_copy(c), *dt = device_copy(std::vector<float>(kN * kN)),
        *df = device_copy(std::vector<float>(kN * kN)),
        *dp = device_copy(std::vector<float>(kN * kN));
  __nv_bfloat16 *di = device_copy(identity), *db = device_copy(b);
  STRATA_LAUNCH(round_trip_kernel, 1, 32, 0, nullptr)(dt, df, dp, dc, di, db);
  const auto t = host_copy(dt, kN * kN), f = host_copy(df, kN * kN), p = host_copy(dp, kN * kN);
  for (int r = 0; r < kN; ++r)
    for (int col = 0; col < kN; ++col) {
      EXPECT_EQ(t[col * kN + r], c[r * kN + col]);
      EXPECT_EQ(f[r * kN + col], 2.5f);
      EXPECT_EQ(p[r * kN + col], __bfloat162float(b[r * kN + col]));
    }
  cudaFree(dc), cudaFree(dt), cudaFree(df), cudaFree(dp), cudaFree(di), cudaFree(db);
}

// bf16 rounding: to nearest, ties to even, NaN kept.
TEST(CudaEmuWmma, Bfloat16RoundsToNearestEven) {
  EXPECT_EQ(__float2bfloat16_rn(1.0f).__x, 0x3f80);
  EXPECT_EQ(__float2bfloat16_rn(std::bit_cast<float>(0x3f808000u)).__x, 0x3f80);  // tie: even
  EXPECT_EQ(__float2bfloat16_rn(std::bit_cast<float>(0x3f818000u)).__x, 0x3f82);  // tie: even
  EXPECT_EQ(__float2bfloat16_rn(std::bit_cast<float>(0x3f808001u)).__x, 0x3f81);  // above
  EXPECT_TRUE(std::isnan(__bfloat162float(__float2bfloat16_rn(NAN))));
  EXPECT_EQ(__bfloat162float(__float2bfloat16(-3.0f)), -3.0f);
}

// Half a warp at a WMMA call: undefined on a GPU, stopped with a message here.
__global__ void half_warp_fill_kernel(float* out) {
  if (threadIdx.x < 16) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
    wmma::fill_fragment(f, 1.0f);
    wmma::store_matrix_sync(out, f, 16, wmma::mem_row_major);
  }
}

TEST(CudaEmuWmmaDeathTest, PartOfAWarpIsRefused) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float* out = device_copy(std::vector<float>(kN * kN));
  EXPECT_DEATH(
      {
        STRATA_LAUNCH(half_warp_fill_kernel, 1, 32, 0, nullptr)(out);
        (void)cudaDeviceSynchronize();
      },
      "lane 16 is not in wmma::fill_fragment");
  cudaFree(out);
}

// A fragment load from memory WMMA does not accept (misaligned, or a leading dimension that is
// not a multiple of 16 bytes): undefined on a GPU, stopped with a message here.
__global__ void misaligned_load_kernel(const __nv_bfloat16* a, unsigned offset, unsigned ldm) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> f;
  wmma::load_matrix_sync(f, a + offset, ldm);
}

TEST(CudaEmuWmmaDeathTest, MisalignedMemoryIsRefused) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  __nv_bfloat16* a = device_copy(std::vector<__nv_bfloat16>(kN * 32));
  STRATA_LAUNCH(misaligned_load_kernel, 1, 32, 0, nullptr)(a, 16, 24);  // 32 bytes in, 48 B rows
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_DEATH(
      {
        STRATA_LAUNCH(misaligned_load_kernel, 1, 32, 0, nullptr)(a, 8, 16);  // 16 bytes in
        (void)cudaDeviceSynchronize();
      },
      "must be 32-byte aligned");
  EXPECT_DEATH(
      {
        STRATA_LAUNCH(misaligned_load_kernel, 1, 32, 0, nullptr)(a, 0, 20);  // 40-byte rows
        (void)cudaDeviceSynchronize();
      },
      "not as WMMA requires");
  cudaFree(a);
}

// --- The PTX instructions (cuda_emu/ptx.hpp, through backends/cuda/ptx.cuh) ----------------------

// A [16 x 16] (ld 24), K [8 x 16] (ld 24) and V [16 x 8] (ld 8), bf16 and row-major, staged in
// shared memory by cp.async (a 16-byte chunk marked empty is zeroed), read back as fragments by
// ldmatrix, then d_k = A K^T and d_v = A V by mma.sync, each lane storing its C registers where
// the PTX ISA puts them: c0, c1 at (g, 2t), (g, 2t + 1), c2, c3 eight rows below.
__global__ void ptx_mma_kernel(float* d_k, float* d_v, const __nv_bfloat16* a,
                               const __nv_bfloat16* k, const __nv_bfloat16* v, int empty_chunk) {
  STRATA_DYNAMIC_SHARED(__nv_bfloat16, smem);
  __nv_bfloat16 *sa = smem, *sk = sa + 16 * 24, *sv = sk + 8 * 24;
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  for (int c = lane; c < 2 * 16; c += 32)  // A: 16 rows of 2 chunks
    strata::cuda::cp_async_16(sa + (c / 2) * 24 + 8 * (c % 2), a + (c / 2) * 24 + 8 * (c % 2),
                              c != empty_chunk);
  if (lane < 16)
    strata::cuda::cp_async_16(sk + (lane / 2) * 24 + 8 * (lane % 2),
                              k + (lane / 2) * 24 + 8 * (lane % 2), true);
  if (lane < 16) strata::cuda::cp_async_16(sv + lane * 8, v + lane * 8, true);
  strata::cuda::cp_async_commit();
  strata::cuda::cp_async_wait_all();
  __syncthreads();
  std::uint32_t fa[4], fk[4], fv[4];
  strata::cuda::ldmatrix_x4(fa, sa + (lane % 16) * 24 + 8 * (lane / 16));
  strata::cuda::ldmatrix_x4(fk, sk + (lane % 8) * 24 + 8 * (lane / 8 % 2));  // matrices 2, 3 = 0, 1
  strata::cuda::ldmatrix_x4_trans(fv, sv + (lane % 16) * 8);                 // the same
  const std::uint32_t bk[2] = {fk[0], fk[1]}, bv[2] = {fv[0], fv[1]};
  float ck[4] = {}, cv[4] = {};
  strata::cuda::mma_bf16_16816(ck, fa, bk);
  strata::cuda::mma_bf16_16816(cv, fa, bv);
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    d_k[row * 8 + col] = ck[i], d_v[row * 8 + col] = cv[i];
  }
}

TEST(CudaEmuPtx, MmaOfLdmatrixFragmentsIsTheProduct) {
  constexpr int kEmptyChunk = 5;  // A's row 2, columns 8..15: zero after cp.async
  std::vector<__nv_bfloat16> a(16 * 24), k(8 * 24), v(16 * 8);
  const auto av = random_floats(a.size(), 30), kv = random_floats(k.size(), 31),
             vv = random_floats(v.size(), 32);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = __float2bfloat16_rn(av[i]);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = __float2bfloat16_rn(kv[i]);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = __float2bfloat16_rn(vv[i]);
  __nv_bfloat16 *da = device_copy(a), *dk = device_copy(k), *dv = device_copy(v);
  float *d_k = device_copy(std::vector<float>(16 * 8)),
        *d_v = device_copy(std::vector<float>(16 * 8));
  STRATA_LAUNCH(ptx_mma_kernel, 1, 32, (16 + 8) * 24 * 2 + 16 * 8 * 2, nullptr)
  (d_k, d_v, da, dk, dv, kEmptyChunk);
  const auto got_k = host_copy(d_k, 16 * 8), got_v = host_copy(d_v, 16 * 8);
  const auto a_at = [&](int r, int c) {
    return r * 2 + c / 8 == kEmptyChunk ? 0.0 : double(__bfloat162float(a[r * 24 + c]));
  };
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) {
      double want_k = 0.0, want_v = 0.0, terms = 0.0;
      for (int c = 0; c < 16; ++c) {
        want_k += a_at(r, c) * __bfloat162float(k[n * 24 + c]);
        want_v += a_at(r, c) * __bfloat162float(v[c * 8 + n]);
        terms += std::fabs(a_at(r, c)) * (std::fabs(__bfloat162float(k[n * 24 + c])) +
                                          std::fabs(__bfloat162float(v[c * 8 + n])));
      }
      EXPECT_NEAR(got_k[r * 8 + n], want_k, 16.0 * std::ldexp(terms, -24)) << r << ", " << n;
      EXPECT_NEAR(got_v[r * 8 + n], want_v, 16.0 * std::ldexp(terms, -24)) << r << ", " << n;
    }
  cudaFree(da), cudaFree(dk), cudaFree(dv), cudaFree(d_k), cudaFree(d_v);
}

// An ldmatrix row that is not 16-byte aligned shared memory: undefined on a GPU, stopped here.
__global__ void misaligned_ldmatrix_kernel(int offset) {
  STRATA_DYNAMIC_SHARED(__nv_bfloat16, smem);
  std::uint32_t r[4];
  strata::cuda::ldmatrix_x4(r, smem + offset + (threadIdx.x % 8) * 8);
}

TEST(CudaEmuPtxDeathTest, LdmatrixOfAMisalignedRowIsRefused) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  STRATA_LAUNCH(misaligned_ldmatrix_kernel, 1, 32, 256, nullptr)(8);  // 16 bytes in: fine
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_DEATH(
      {
        STRATA_LAUNCH(misaligned_ldmatrix_kernel, 1, 32, 256, nullptr)(4);  // 8 bytes in
        (void)cudaDeviceSynchronize();
      },
      "ldmatrix.x4: address .* is not 16-byte aligned");
}

}  // namespace
