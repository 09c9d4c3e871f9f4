// strata SDK: basic types shared by the core and plugins.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

namespace strata {

// Element types a collective can move. f32 is the training dtype on the CPU.
enum class DType : std::uint8_t { f32, f64, i32, i64, u8 };

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
  }
  return 0;
}

// A typed, non-owning view of a buffer: what every collective takes.
struct BufferView {
  void* data = nullptr;
  std::size_t count = 0;  // elements, not bytes
  DType dtype = DType::f32;
  std::size_t bytes() const { return count * dtype_size(dtype); }
};

inline BufferView view(std::span<float> s) { return {s.data(), s.size(), DType::f32}; }
inline BufferView view(std::span<double> s) { return {s.data(), s.size(), DType::f64}; }
inline BufferView view(float* p, std::size_t n) { return {p, n, DType::f32}; }
inline BufferView view(double* p, std::size_t n) { return {p, n, DType::f64}; }

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
