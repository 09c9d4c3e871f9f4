// strata SDK: elementwise work on the run's buffers, done by the run's backend. A plugin never
// loops over, copies or reads parameter, gradient or communication memory itself: on a GPU that
// memory lives on the device. Context::ops() gives the backend of the run; the CPU backend
// implements every operation now, the CUDA backend the same interface.
//
// Every operation takes BufferViews (all of one device): counts must match (dst.count ==
// src.count), dtypes must be floating point (f32, f64 or bf16; bf16 arithmetic goes through float,
// each result rounded once to nearest even); otherwise strata::Error naming the operation and the
// mismatch.
#pragma once
#include "strata/export.hpp"
#include "strata/types.hpp"

STRATA_EXPORT_BEGIN
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
  // One AdamW update of a run of elements sharing one weight decay (strata/optimizer.hpp's AdamW
  // calls it per segment): m, v (fp32) and the fp32 parameters -- `params` itself, or, with bf16
  // parameters, `master` (then rounded into params) -- from grads (f32 or bf16) x grad_scale.
  struct AdamWStep {
    float lr, beta1, beta2, eps, weight_decay;
    int t;  // 1-based, for bias correction
    float grad_scale;
  };
  virtual void adamw(BufferView params, BufferView master, BufferView grads, BufferView m,
                     BufferView v, const AdamWStep& step) = 0;
};

// The backend of a device's memory: cpu_ops() for Device::cpu; the CUDA backend where one is
// built and present. Throws strata::Error for a device without a backend in this process.
DeviceOps& device_ops(Device d);

// The CPU backend's operations (stateless; safe from any thread, e.g. a comm stream's).
DeviceOps& cpu_ops();

// Copies src into dst (same dtype and count) where the two may live on different devices: host
// memory to or from the run's device (CPU offload of optimizer state). On the CPU a memcpy; on a
// GPU a copy in compute-stream order that returns once a host destination holds the data.
void copy_across(BufferView dst, BufferView src);

}  // namespace strata
STRATA_EXPORT_END
