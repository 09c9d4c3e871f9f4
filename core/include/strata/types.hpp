// strata SDK: basic types shared by the core and plugins.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>

#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

// Element types a collective can move. f32 is the training dtype on the CPU; bf16 is bfloat16.
enum class DType : std::uint8_t { f32, f64, i32, i64, u8, bf16 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
    case DType::bf16:
      return 2;
  }
  return 0;
}

// bfloat16: the upper 16 bits of an IEEE-754 float (sign, 8 exponent bits, 7 mantissa bits), so
// the range of f32 at 2-3 significant digits. Arithmetic on it goes through float: every
// transport reduces bf16 as to_bf16(to_float(a) + to_float(b)), element by element.
struct bf16 {
  std::uint16_t bits = 0;
};
inline float to_float(bf16 v) {
  const std::uint32_t u = std::uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// Round to nearest, ties to even; NaN stays a (quiet) NaN, overflow becomes infinity.
inline bf16 to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {std::uint16_t((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {std::uint16_t(u >> 16)};
}

// Where a buffer's memory lives. Only the backend of that device reads or writes it
// (device.hpp); on a GPU a plugin never dereferences it.
enum class Device : std::uint8_t { cpu, cuda };

// A typed, non-owning view of a buffer: what every collective and device operation takes.
struct BufferView {
  void* data = nullptr;
  std::size_t count = 0;  // elements, not bytes
  DType dtype = DType::f32;
  Device device = Device::cpu;
  std::size_t bytes() const { return count * dtype_size(dtype); }
};

inline BufferView view(std::span<float> s) { return {s.data(), s.size(), DType::f32}; }
inline BufferView view(std::span<double> s) { return {s.data(), s.size(), DType::f64}; }
inline BufferView view(float* p, std::size_t n) { return {p, n, DType::f32}; }
inline BufferView view(double* p, std::size_t n) { return {p, n, DType::f64}; }
inline BufferView view(bf16* p, std::size_t n) { return {p, n, DType::bf16}; }

// Elements [offset, offset + count) of v, same dtype and device (no bounds check: callers own the
// layout; the backend checks counts against each other).
inline BufferView slice(BufferView v, std::size_t offset, std::size_t count) {
  return {static_cast<char*>(v.data) + offset * dtype_size(v.dtype), count, v.dtype, v.device};
}
// The dtype's name as the CLI and run file spell it: "fp32", "fp64", "i32", "i64", "u8", "bf16".
const char* dtype_name(DType t);

// The DType of a C++ element type.
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<std::uint8_t>() {
  return DType::u8;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::bf16;
}

// Any failure inside strata. `hint` tells the user what to try next.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, std::string hint = {})
      : std::runtime_error(what), hint_(std::move(hint)) {}
  const std::string& hint() const { return hint_; }

 private:
  std::string hint_;
};

// Bad user input: the message names the option and what is allowed. Raised before any work starts.
class ConfigError : public Error {
 public:
  using Error::Error;
};

}  // namespace strata
STRATA_EXPORT_END
