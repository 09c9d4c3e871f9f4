// The CUDA backend of strata/device.hpp: DeviceOps on device memory (Device::cuda views), every
// operation asynchronous on one stream except sum_of_squares, which returns its value to the host
// (and so waits for the stream). fp32 and bf16 only (the device has no fp64 path: refused).
// Plain C++ header: host-only sources include it.
#pragma once
#include <cuda_runtime_api.h>

#include <initializer_list>

#include "backends/cuda/reduce.hpp"
#include "strata/device.hpp"

namespace strata::cuda {

class CudaOps final : public DeviceOps {
 public:
  explicit CudaOps(cudaStream_t stream);
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  Device device() const override { return Device::cuda; }
  void copy(BufferView dst, BufferView src) override;
  void cast(BufferView dst, BufferView src) override;
  void fill(BufferView dst, double value) override;
  void scale(BufferView x, double a) override;
  void axpy(BufferView y, double a, BufferView x) override;
  double sum_of_squares(BufferView x) override;
  void adamw(BufferView params, BufferView master, BufferView grads, BufferView m, BufferView v,
             const AdamWStep& step) override;

 private:
  void check(const char* op, std::initializer_list<BufferView> views) const;
  void affine(int op, BufferView y, const BufferView* x, float a);  // ops.cu's Affine
  void finish_off_compute_thread() const;
  cudaStream_t stream_;
  DeviceSum sum_;
};

}  // namespace strata::cuda
