// The CUDA emulator's mma.h (tests/cuda_emu): nvcuda::wmma for 16 x 16 x 16 tiles of bf16 operands
// (__nv_bfloat16, matrix_a / matrix_b, row- or column-major) and fp32 accumulators, as strata's
// tensor-core kernels use them.
//
// Every call is warp-collective, as on a GPU: all 32 lanes of a full warp make it, or the
// emulator stops with a message (strata_emu::warp_collective_begin, the shuffles' check).
//
// The fragment's element mapping (CUDA leaves it unspecified; a kernel may only apply the same
// operation to every element): element i of lane l is the tile's element e = 32 i + l in row-major
// order, row e / 16, column e % 16, where a tile is m x k (matrix_a), k x n (matrix_b) or m x n
// (accumulator), whatever layout its memory had.
//
// mma_sync(d, a, b, c): d[m][n] = c[m][n] + sum_k a[m][k] b[k][n], added in fp32 in the order
// c, k = 0, 1, ..., 15. A product of two bf16 (8-bit significands) is exact in fp32, so only the
// 16 additions round (to nearest even). Tensor cores add in another order (and keep more bits
// inside a group of products), so results agree to fp32 rounding of a 16-term sum, not bit for
// bit. Each lane computes its own elements of d, reading the other lanes' a and b fragments.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "cuda_emu/kernel.hpp"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulator's WMMA has 16 x 16 x 16 tiles only");
  static_assert(std::is_same_v<Use, accumulator> ? std::is_same_v<T, float>
                                                 : std::is_same_v<T, __nv_bfloat16>,
                "the emulator's WMMA has bf16 matrix_a / matrix_b and fp32 accumulators only");
  static_assert(std::is_same_v<Use, accumulator> == std::is_void_v<Layout>,
                "matrix_a / matrix_b fragments name a layout, accumulators do not");

 public:
  static constexpr int num_elements = 8;  // 256 elements over 32 lanes
  T x[num_elements];
};

namespace detail {

constexpr int kTile = 16;
constexpr int kLanes = 32;

// Row and column of element i of this lane's fragment (see the top).
inline int element_row(int i) { return (kLanes * i + strata_emu::lane_id()) / kTile; }
inline int element_col(int i) { return (kLanes * i + strata_emu::lane_id()) % kTile; }

// CUDA's requirements of a fragment load or store: a 256-bit aligned pointer and a leading
// dimension of a multiple of 16 bytes (8 bf16, 4 floats); undefined on a GPU otherwise.
template <class T>
void check_memory(const char* what, const T* p, unsigned ldm) {
  if (reinterpret_cast<std::uintptr_t>(p) % 32 != 0 || ldm * sizeof(T) % 16 != 0)
    strata_emu::fatal_in_kernel(
        "%s: pointer %p (must be 32-byte aligned) or ldm %u (must be a multiple of %zu elements) "
        "not as WMMA requires",
        what, static_cast<const void*>(p), ldm, 16 / sizeof(T));
}

// Offset of tile element (row, col) in memory with leading dimension ldm.
inline unsigned offset(int row, int col, unsigned ldm, bool row_major) {
  return row_major ? unsigned(row) * ldm + unsigned(col) : unsigned(col) * ldm + unsigned(row);
}

// Element (row, col) of a bf16 fragment whose lanes' copies are `lanes`: e = 16 row + col is
// element e / 32 of lane e % 32.
template <class Fragment>
float element_of(const void* const* lanes, int row, int col) {
  const int e = row * kTile + col;
  return __bfloat162float(static_cast<const Fragment*>(lanes[e % kLanes])->x[e / kLanes]);
}

}  // namespace detail

template <class Use, class T, class Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& a, const T* p, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "an accumulator load names its memory layout");
  strata_emu::warp_collective_begin("wmma::load_matrix_sync", nullptr);
  detail::check_memory("wmma::load_matrix_sync", p, ldm);
  for (int i = 0; i < a.num_elements; ++i)
    a.x[i] = p[detail::offset(detail::element_row(i), detail::element_col(i), ldm,
                              std::is_same_v<Layout, row_major>)];
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& c, const float* p,
                             unsigned ldm, layout_t layout) {
  strata_emu::warp_collective_begin("wmma::load_matrix_sync", nullptr);
  detail::check_memory("wmma::load_matrix_sync", p, ldm);
  for (int i = 0; i < c.num_elements; ++i)
    c.x[i] = p[detail::offset(detail::element_row(i), detail::element_col(i), ldm,
                              layout == mem_row_major)];
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& c,
                              unsigned ldm, layout_t layout) {
  strata_emu::warp_collective_begin("wmma::store_matrix_sync", nullptr);
  detail::check_memory("wmma::store_matrix_sync", p, ldm);
  for (int i = 0; i < c.num_elements; ++i)
    p[detail::offset(detail::element_row(i), detail::element_col(i), ldm,
                     layout == mem_row_major)] = c.x[i];
}

template <class Use, class T, class Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, const T& value) {
  strata_emu::warp_collective_begin("wmma::fill_fragment", nullptr);
  for (int i = 0; i < f.num_elements; ++i) f.x[i] = value;
}

// d = a b + c (see the top for the order of the fp32 additions); d may be c.
template <class LayoutA, class LayoutB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  using A = fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA>;
  using B = fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB>;
  const void* const operands[2] = {&a, &b};
  const void* const* lanes = strata_emu::warp_collective_begin("wmma::mma_sync", operands);
  const void* a_lanes[detail::kLanes];
  const void* b_lanes[detail::kLanes];
  for (int l = 0; l < detail::kLanes; ++l) {
    a_lanes[l] = static_cast<const void* const*>(lanes[l])[0];
    b_lanes[l] = static_cast<const void* const*>(lanes[l])[1];
  }
  float result[fragment<accumulator, 16, 16, 16, float>::num_elements];
  for (int i = 0; i < d.num_elements; ++i) {
    const int row = detail::element_row(i), col = detail::element_col(i);
    float sum = c.x[i];
    for (int k = 0; k < detail::kTile; ++k)
      sum += detail::element_of<A>(a_lanes, row, k) * detail::element_of<B>(b_lanes, k, col);
    result[i] = sum;
  }
  strata_emu::warp_collective_end();  // every lane has read the others' a and b
  for (int i = 0; i < d.num_elements; ++i) d.x[i] = result[i];
}

}  // namespace nvcuda::wmma
