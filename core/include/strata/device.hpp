// strata SDK: elementwise work on the run's buffers, done by the run's backend. A plugin never
// loops over, copies or reads parameter, gradient or communication memory itself: on a GPU that
// memory lives on the device. Context::ops() gives the backend of the run; the CPU backend
// implements every operation now, the CUDA backend the same interface.
//
// Every operation takes BufferViews: counts must match (dst.count == src.count), dtypes must be
// floating point (f32, f64 or bf16; bf16 arithmetic goes through float, each result rounded once
// to nearest even); otherwise strata::Error naming the operation and the mismatch.
#pragma once
#include "strata/types.hpp"

namespace strata {

const char* device_name(Device d);  // "cpu", "cuda"

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  virtual Device device() const = 0;
  virtual void copy(BufferView dst, BufferView src) = 0;  // same dtype
  virtual void cast(BufferView dst,
                    BufferView src) = 0;  // any floating dtypes, rounding to nearest
  virtual void fill(BufferView dst, double value) = 0;
  virtual void scale(BufferView x, double a) = 0;               // x *= a
  virtual void axpy(BufferView y, double a, BufferView x) = 0;  // y += a x, same dtype
  // Sum of x[i]^2, accumulated in double (gradient norms).
  virtual double sum_of_squares(BufferView x) = 0;
};

// The CPU backend's operations (stateless; safe from any thread, e.g. a comm stream's).
DeviceOps& cpu_ops();

}  // namespace strata
