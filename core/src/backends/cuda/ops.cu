// The CUDA backend of strata/device.hpp (cuda/ops.hpp): elementwise work, norms and the AdamW
// update on device memory, asynchronous on the backend's stream. fp32 and bf16 (stored as its 16
// bits, converted exactly as strata::to_bf16 / to_float do); no double arithmetic on the device
// (ptxas -warn-double-usage is an error in this build): a sum of squares is summed in fp32 per
// block and the block sums in double on the host.
#include <cmath>
#include <cstdint>
#include <string>

#include "backends/cuda/bf16.cuh"
#include "backends/cuda/device.hpp"
#include "backends/cuda/grid.cuh"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/ops.hpp"
#include "comm/thread_role.hpp"

namespace strata::cuda {
namespace {

// The elementwise ops, each result rounded once to y's dtype. __fmul_rn / __fadd_rn are never
// contracted into an FMA, so the arithmetic is the CPU backend's, operation for operation.
enum class Affine { fill, scale, axpy, cast };
__global__ void affine_kernel(Affine op, void* y, bool y_bf16, const void* x, bool x_bf16,
                              std::size_t n, float a) {
  STRATA_GRID_STRIDE(i, n) {
    float r = a;  // fill
    if (op == Affine::scale) r = __fmul_rn(a, load(y, y_bf16, i));
    if (op == Affine::axpy) r = __fadd_rn(load(y, y_bf16, i), __fmul_rn(a, load(x, x_bf16, i)));
    if (op == Affine::cast) r = load(x, x_bf16, i);
    store(y, y_bf16, i, r);
  }
}

// AdamW on fp32 p32 (the parameters, or the master of bf16 ones, then rounded into params).
__global__ void adamw_kernel(void* params, bool params_bf16, float* p32, const void* grads,
                             bool grads_bf16, float* m, float* v, std::size_t n, float lr,
                             float beta1, float beta2, float eps, float decay, float grad_scale,
                             float inv_bc1, float inv_bc2) {
  STRATA_GRID_STRIDE(i, n) {
    const float g = load(grads, grads_bf16, i) * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float p = p32[i];
    const float next = p - lr * (mi * inv_bc1 / (sqrtf(vi * inv_bc2) + eps) + decay * p);
    p32[i] = next;
    if (params_bf16) store(params, true, i, next);
  }
}

}  // namespace

CudaOps::CudaOps(cudaStream_t stream) : stream_(stream) {}
CudaOps::~CudaOps() = default;

void CudaOps::check(const char* op, std::initializer_list<BufferView> views) const {
  std::size_t count = views.begin()->count;
  for (const BufferView& x : views) {
    if (x.device != Device::cuda)
      throw Error(std::string(op) + ": a view of " + device_name(x.device) +
                      " memory given to the cuda backend",
                  "use the run's backend (Context::ops()) for its own buffers");
    if (x.dtype != DType::f32 && x.dtype != DType::bf16)
      throw Error(std::string(op) + ": " + dtype_name(x.dtype) + " on the cuda backend",
                  "fp32 or bf16 device buffers");
    if (x.count != count)
      throw Error(std::string(op) + ": " + std::to_string(x.count) + " elements vs " +
                      std::to_string(count),
                  "the views must have the same count");
  }
}

// An op called on a comm stream's worker (work a plugin enqueued, e.g. a copy before a
// collective) completes before it returns, as on the CPU: the collective the same work issues next
// waits only for the compute event recorded before the work was enqueued, not for this op.
void CudaOps::finish_off_compute_thread() const {
  if (t_on_comm_worker) STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaOps::affine(int op, BufferView y, const BufferView* x, float a) {
  if (y.count == 0) return;
  STRATA_LAUNCH(affine_kernel, blocks_for(y.count), kThreads, 0, stream_)
  (Affine(op), y.data, y.dtype == DType::bf16, x ? x->data : nullptr, x && x->dtype == DType::bf16,
   y.count, a);
  STRATA_CUDA_CHECK_LAUNCH();
  finish_off_compute_thread();
}

void CudaOps::copy(BufferView dst, BufferView src) {
  check("copy", {dst, src});
  if (dst.dtype != src.dtype) throw Error("copy: dtypes differ", "cast converts between dtypes");
  if (dst.count)
    STRATA_CUDA_CHECK(
        cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice, stream_));
  finish_off_compute_thread();
}
void CudaOps::cast(BufferView dst, BufferView src) {
  check("cast", {dst, src});
  affine(int(Affine::cast), dst, &src, 0.0f);
}
void CudaOps::fill(BufferView dst, double value) {
  check("fill", {dst});
  affine(int(Affine::fill), dst, nullptr, float(value));
}
void CudaOps::scale(BufferView x, double a) {
  check("scale", {x});
  affine(int(Affine::scale), x, nullptr, float(a));
}
void CudaOps::axpy(BufferView y, double a, BufferView x) {
  check("axpy", {y, x});
  if (y.dtype != x.dtype) throw Error("axpy: dtypes differ", "the same dtype for both");
  affine(int(Affine::axpy), y, &x, float(a));
}

double CudaOps::sum_of_squares(BufferView x) {
  check("sum_of_squares", {x});
  if (x.count == 0) return 0.0;
  return sum_(stream_, x.data, x.dtype == DType::bf16, x.count, true);
}

void CudaOps::adamw(BufferView params, BufferView master, BufferView grads, BufferView m,
                    BufferView v, const AdamWStep& st) {
  const bool mixed = params.dtype == DType::bf16;
  const BufferView p32 = mixed ? master : params;
  check("adamw", {params, p32, grads, m, v});
  if (p32.dtype != DType::f32 || m.dtype != DType::f32 || v.dtype != DType::f32)
    throw Error("adamw: fp32 master (or parameters), m and v on the cuda backend");
  if (params.count == 0) return;
  // On the host, as the CPU backend computes them (cpu::adamw_update).
  const float inv_bc1 = float(1.0 / (1.0 - std::pow(double(st.beta1), st.t)));
  const float inv_bc2 = float(1.0 / (1.0 - std::pow(double(st.beta2), st.t)));
  STRATA_LAUNCH(adamw_kernel, blocks_for(params.count), kThreads, 0, stream_)
  (params.data, mixed, static_cast<float*>(p32.data), grads.data, grads.dtype == DType::bf16,
   static_cast<float*>(m.data), static_cast<float*>(v.data), params.count, st.lr, st.beta1,
   st.beta2, st.eps, st.weight_decay, st.grad_scale, inv_bc1, inv_bc2);
  STRATA_CUDA_CHECK_LAUNCH();
  finish_off_compute_thread();
}

}  // namespace strata::cuda
