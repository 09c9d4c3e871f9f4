// The CPU backend of strata/device.hpp.
#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "strata/device.hpp"

namespace strata {
namespace {

bool floating(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::bf16; }

void check_on_cpu(const char* op, BufferView x) {
  if (x.device != Device::cpu)
    throw Error(std::string(op) + ": a view of " + device_name(x.device) +
                    " memory given to the cpu backend",
                "use the run's backend (Context::ops()) for its own buffers");
}

void check(const char* op, BufferView a, BufferView b, bool same_dtype) {
  check_on_cpu(op, a);
  check_on_cpu(op, b);
  if (a.count != b.count)
    throw Error(std::string(op) + ": " + std::to_string(a.count) + " elements vs " +
                    std::to_string(b.count),
                "the two views must have the same count");
  if (!floating(a.dtype) || !floating(b.dtype) || (same_dtype && a.dtype != b.dtype))
    throw Error(std::string(op) + ": unsupported dtypes", "f32 or f64, the same for both");
}

// f(p, n) with p the view's elements as float* or double*.
template <class F>
void with_floats(BufferView x, F&& f) {
  check_on_cpu("device op", x);
  if (x.dtype != DType::f32 && x.dtype != DType::f64)
    throw Error("device op: unsupported dtype", "f32 or f64 (bf16: copy and cast only)");
  if (x.dtype == DType::f32)
    f(static_cast<float*>(x.data), x.count);
  else
    f(static_cast<double*>(x.data), x.count);
}

template <class T>
using Elem = std::remove_pointer_t<T>;

// One element as double, and back, for any floating dtype (bf16 through float).
double load(const void* p, DType t, std::size_t i) {
  if (t == DType::f32) return static_cast<const float*>(p)[i];
  if (t == DType::f64) return static_cast<const double*>(p)[i];
  return to_float(static_cast<const bf16*>(p)[i]);
}
void store(void* p, DType t, std::size_t i, double v) {
  if (t == DType::f32)
    static_cast<float*>(p)[i] = float(v);
  else if (t == DType::f64)
    static_cast<double*>(p)[i] = v;
  else  // via float: a double rounded twice could differ from one rounding in the last bf16 bit
    static_cast<bf16*>(p)[i] = to_bf16(float(v));
}

class CpuOps final : public DeviceOps {
 public:
  Device device() const override { return Device::cpu; }
  void copy(BufferView dst, BufferView src) override {
    check("copy", dst, src, true);
    if (dst.count) std::memmove(dst.data, src.data, dst.bytes());
  }
  void cast(BufferView dst, BufferView src) override {
    check("cast", dst, src, false);
    for (std::size_t i = 0; i < dst.count; ++i)
      store(dst.data, dst.dtype, i, load(src.data, src.dtype, i));
  }
  void fill(BufferView dst, double value) override {
    with_floats(dst, [&](auto* d, std::size_t n) { std::fill_n(d, n, Elem<decltype(d)>(value)); });
  }
  void scale(BufferView x, double a) override {
    with_floats(x, [&](auto* p, std::size_t n) {
      for (std::size_t i = 0; i < n; ++i) p[i] *= Elem<decltype(p)>(a);
    });
  }
  void axpy(BufferView y, double a, BufferView x) override {
    check("axpy", y, x, true);
    with_floats(y, [&](auto* py, std::size_t n) {
      const auto* px = static_cast<const Elem<decltype(py)>*>(x.data);
      const auto alpha = Elem<decltype(py)>(a);
      for (std::size_t i = 0; i < n; ++i) py[i] += alpha * px[i];
    });
  }
  double sum_of_squares(BufferView x) override {
    double s = 0;
    with_floats(x, [&](auto* p, std::size_t n) {
      for (std::size_t i = 0; i < n; ++i) s += double(p[i]) * double(p[i]);
    });
    return s;
  }
};

}  // namespace

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

DeviceOps& cpu_ops() {
  static CpuOps ops;
  return ops;
}

}  // namespace strata
