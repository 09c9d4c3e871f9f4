// The element-wise reductions and chunking of strata's own collectives (the UCX transport's rings
// and trees): header-only, so every dtype's loop is compiled where it is used.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "strata/types.hpp"

namespace strata::ucx {

// Element-wise reductions: dst = a op b, where dst may be a or b itself (never a partial
// overlap). One kernel per aliasing case so that every loop has non-aliasing pointers and
// vectorizes.

enum class Op { sum, max };

template <class T>
struct Sum {
  T operator()(T a, T b) const { return T(a + b); }  // u8 wraps, as MPI_SUM on MPI_UINT8_T
};
template <class T>
struct Max {
  T operator()(T a, T b) const { return a < b ? b : a; }
};
template <>
struct Sum<bf16> {
  bf16 operator()(bf16 a, bf16 b) const { return to_bf16(to_float(a) + to_float(b)); }
};
template <>
struct Max<bf16> {
  bf16 operator()(bf16 a, bf16 b) const { return to_float(a) < to_float(b) ? b : a; }
};

template <class T, class F>
void zip3(T* __restrict d, const T* __restrict a, const T* __restrict b, std::size_t n, F f) {
  for (std::size_t i = 0; i < n; ++i) d[i] = f(a[i], b[i]);
}
template <class T, class F>
void zip_into_a(T* __restrict a, const T* __restrict b, std::size_t n, F f) {
  for (std::size_t i = 0; i < n; ++i) a[i] = f(a[i], b[i]);
}
template <class T, class F>
void zip_into_b(const T* __restrict a, T* __restrict b, std::size_t n, F f) {
  for (std::size_t i = 0; i < n; ++i) b[i] = f(a[i], b[i]);
}

template <class T, class F>
void zip(void* dst, const void* a, const void* b, std::size_t n, F f) {
  auto* d = static_cast<T*>(dst);
  if (dst == a)
    zip_into_a(d, static_cast<const T*>(b), n, f);
  else if (dst == b)
    zip_into_b(static_cast<const T*>(a), d, n, f);
  else
    zip3(d, static_cast<const T*>(a), static_cast<const T*>(b), n, f);
}

template <class T>
void combine_as(void* dst, const void* a, const void* b, std::size_t n, Op op) {
  if (op == Op::sum)
    zip<T>(dst, a, b, n, Sum<T>{});
  else
    zip<T>(dst, a, b, n, Max<T>{});
}

inline void combine(void* dst, const void* a, const void* b, std::size_t n, DType t, Op op) {
  switch (t) {
    case DType::f32:
      return combine_as<float>(dst, a, b, n, op);
    case DType::f64:
      return combine_as<double>(dst, a, b, n, op);
    case DType::i32:
      return combine_as<std::int32_t>(dst, a, b, n, op);
    case DType::i64:
      return combine_as<std::int64_t>(dst, a, b, n, op);
    case DType::u8:
      return combine_as<std::uint8_t>(dst, a, b, n, op);
    case DType::bf16:
      return combine_as<bf16>(dst, a, b, n, op);
  }
}

// `count` elements in n nearly equal chunks: the first count % n chunks hold one element more.
struct Chunks {
  std::size_t count, n, esize;
  std::size_t bytes(int i) const { return (count / n + (std::size_t(i) < count % n)) * esize; }
  std::size_t offset(int i) const {
    return (std::size_t(i) * (count / n) + std::min(std::size_t(i), count % n)) * esize;
  }
  std::size_t max_bytes() const { return bytes(0); }
};

}  // namespace strata::ucx
