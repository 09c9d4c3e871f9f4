// The CPU backend of strata/device.hpp.
#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "backends/cpu/gemm_bf16.hpp"
#include "backends/cpu/layers.hpp"
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
    throw Error(std::string(op) + ": unsupported dtypes",
                "f32, f64 or bf16 (the same for both, except in cast)");
}

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

template <class T>
using Elem = std::remove_pointer_t<T>;

// f(p, n) with p the view's elements as float* or double*; false for bf16, whose arithmetic goes
// element by element through float (load/store: each result rounded once).
template <class F>
bool with_floats(const char* op, BufferView x, F&& f) {
  check_on_cpu(op, x);
  if (!floating(x.dtype)) throw Error(std::string(op) + ": unsupported dtype", "f32, f64 or bf16");
  if (x.dtype == DType::f32)
    f(static_cast<float*>(x.data), x.count);
  else if (x.dtype == DType::f64)
    f(static_cast<double*>(x.data), x.count);
  return x.dtype != DType::bf16;
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
    if (with_floats("fill", dst,
                    [&](auto* d, std::size_t n) { std::fill_n(d, n, Elem<decltype(d)>(value)); }))
      return;
    for (std::size_t i = 0; i < dst.count; ++i) store(dst.data, dst.dtype, i, value);
  }
  void scale(BufferView x, double a) override {
    if (with_floats("scale", x, [&](auto* p, std::size_t n) {
          for (std::size_t i = 0; i < n; ++i) p[i] *= Elem<decltype(p)>(a);
        }))
      return;
    for (std::size_t i = 0; i < x.count; ++i)
      store(x.data, x.dtype, i, float(a) * float(load(x.data, x.dtype, i)));
  }
  void axpy(BufferView y, double a, BufferView x) override {
    check("axpy", y, x, true);
    if (with_floats("axpy", y, [&](auto* py, std::size_t n) {
          const auto* px = static_cast<const Elem<decltype(py)>*>(x.data);
          const auto alpha = Elem<decltype(py)>(a);
          for (std::size_t i = 0; i < n; ++i) py[i] += alpha * px[i];
        }))
      return;
    const float alpha = float(a);
    for (std::size_t i = 0; i < y.count; ++i)
      store(y.data, y.dtype, i,
            float(load(y.data, y.dtype, i)) + alpha * float(load(x.data, x.dtype, i)));
  }
  double sum_of_squares(BufferView x) override {
    double s = 0;
    if (with_floats("sum_of_squares", x, [&](auto* p, std::size_t n) {
#pragma omp simd reduction(+ : s)
          for (std::size_t i = 0; i < n; ++i) s += double(p[i]) * double(p[i]);
        }))
      return s;
    const bf16* p = static_cast<const bf16*>(x.data);
#pragma omp simd reduction(+ : s)
    for (std::size_t i = 0; i < x.count; ++i) {
      const double v = to_float(p[i]);
      s += v * v;
    }
    return s;
  }
  void adamw(BufferView params, BufferView master, BufferView grads, BufferView m, BufferView v,
             const AdamWStep& st) override;
};

void CpuOps::adamw(BufferView params, BufferView master, BufferView grads, BufferView m,
                   BufferView v, const AdamWStep& st) {
  const bool mixed = params.dtype == DType::bf16;
  for (BufferView x : {params, master, grads, m, v}) check_on_cpu("adamw", x);
  const std::size_t n = params.count;
  BufferView p32 = mixed ? master : params;
  if (p32.dtype != DType::f32 || m.dtype != DType::f32 || v.dtype != DType::f32 ||
      (grads.dtype != DType::f32 && grads.dtype != DType::bf16) || p32.count != n ||
      grads.count != n || m.count != n || v.count != n || (mixed && params.dtype != DType::bf16))
    throw Error("adamw: " + std::to_string(n) + " " + dtype_name(params.dtype) +
                    " parameters need fp32 m, v (and master for bf16) and f32 or bf16 gradients "
                    "of the same count",
                "pass one AdamW segment's views");
  float* p = static_cast<float*>(p32.data);
  float* mm = static_cast<float*>(m.data);
  float* vv = static_cast<float*>(v.data);
  // In chunks, on the rank's BLAS threads (elementwise: the same result on any number): bf16
  // gradients are widened, and the master rounded into the bf16 parameters, a chunk at a time, so
  // the fp32 copies stay in cache and no full-size temporary exists. Threads matter for CPU
  // offload, where this is the host's step over a GPU's whole shard (gpt2-124m bf16, zero3 with
  // offload=optimizer on an H100: 727 ms per step with this step on one thread, 79 ms without
  // offload).
  constexpr std::size_t kChunk = 4096;
  const std::int64_t chunks = std::int64_t((n + kChunk - 1) / kChunk);
#pragma omp parallel for num_threads(cpu::blas_threads()) if (chunks > 16) schedule(static)
  for (std::int64_t i = 0; i < chunks; ++i) {
    const std::size_t k = std::size_t(i) * kChunk, c = std::min(kChunk, n - k);
    float wide[kChunk];
    const float* g = static_cast<const float*>(grads.data) + k;
    if (grads.dtype == DType::bf16) {
      cpu::widen_bf16(wide, static_cast<const bf16*>(grads.data) + k, c);
      g = wide;
    }
    cpu::adamw_update(p + k, g, mm + k, vv + k, std::int64_t(c), st.lr, st.beta1, st.beta2, st.eps,
                      st.weight_decay, st.t, st.grad_scale);
    if (mixed) cpu::round_to_bf16(static_cast<bf16*>(params.data) + k, p + k, c);
  }
}

}  // namespace

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "fp32";
    case DType::f64:
      return "fp64";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
    case DType::bf16:
      return "bf16";
  }
  return "?";
}

DeviceOps& cpu_ops() {
  static CpuOps ops;
  return ops;
}

}  // namespace strata
