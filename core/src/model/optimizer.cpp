// AdamW over a contiguous range of the flat parameter index space.
#include "strata/optimizer.hpp"

#include <algorithm>
#include <string>

#include "backends/cpu/layers.hpp"
#include "strata/device.hpp"
#include "strata/types.hpp"

namespace strata {

AdamW::AdamW(const ParamLayout& layout, std::size_t begin, std::size_t count,
             const AdamWConfig& config, MemoryLedger& memory, DType param_dtype, MemTag state_tag)
    : begin_(begin), count_(count), config_(config), param_dtype_(param_dtype) {
  if (begin + count > layout.total() || begin + count < begin) {
    throw Error("AdamW: range [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                ") exceeds the " + std::to_string(layout.total()) + " parameters");
  }
  // Weight decay is per tensor: one segment per tensor the range touches.
  const std::size_t end = begin + count;
  for (std::size_t j = begin; j < end;) {
    const TensorInfo& ti = layout.tensor_at(j);
    const std::size_t seg_end = std::min(ti.offset + ti.count, end);
    segments_.push_back({seg_end - j, ti.decay});
    j = seg_end;
  }
  allocate(memory, state_tag);
}

AdamW::AdamW(std::vector<AdamWSegment> segments, const AdamWConfig& config, MemoryLedger& memory,
             DType param_dtype, MemTag state_tag)
    : segments_(std::move(segments)), config_(config), param_dtype_(param_dtype) {
  for (const AdamWSegment& s : segments_) count_ += s.count;
  allocate(memory, state_tag);
}

void AdamW::allocate(MemoryLedger& memory, MemTag state_tag) {
  if (param_dtype_ != DType::f32 && param_dtype_ != DType::bf16)
    throw Error(std::string("AdamW: parameters in ") + dtype_name(param_dtype_),
                "f32, or bf16 with an fp32 master copy");
  m_ = Buffer<float>(memory, state_tag, count_);
  v_ = Buffer<float>(memory, state_tag, count_);
  if (param_dtype_ == DType::bf16) master_ = Buffer<float>(memory, state_tag, count_);
}

namespace {

void check_view(const char* what, BufferView v, std::size_t count, bool bf16_ok) {
  if (v.count != count || !(v.dtype == DType::f32 || (bf16_ok && v.dtype == DType::bf16)))
    throw Error(std::string("AdamW::step: ") + what + " view of " + std::to_string(v.count) + " " +
                    dtype_name(v.dtype) + " elements, the optimizer holds " + std::to_string(count),
                "pass the range this AdamW was built for, in the run's dtypes");
}

}  // namespace

void AdamW::step(BufferView params, BufferView grads, int t, float grad_scale) {
  if (t < 1)
    throw Error("AdamW::step: step t must be >= 1 (bias correction), got " + std::to_string(t));
  check_view("parameter", params, count_, param_dtype_ == DType::bf16);
  check_view("gradient", grads, count_, true);
  if (params.dtype != param_dtype_)
    throw Error(std::string("AdamW::step: ") + dtype_name(params.dtype) +
                " parameters, built for " + dtype_name(param_dtype_));
  // The update runs where the parameters live, one segment (one weight decay) at a time.
  DeviceOps& ops = device_ops(params.device);
  const bool mixed = param_dtype_ == DType::bf16;
  std::size_t k = 0;
  for (const AdamWSegment& s : segments_) {
    const DeviceOps::AdamWStep st{config_.lr,
                                  config_.beta1,
                                  config_.beta2,
                                  config_.eps,
                                  s.decay ? config_.weight_decay : 0.0f,
                                  t,
                                  grad_scale};
    const BufferView master = mixed ? slice(master_.view(), k, s.count) : BufferView{};
    ops.adamw(slice(params, k, s.count), master, slice(grads, k, s.count),
              slice(m_.view(), k, s.count), slice(v_.view(), k, s.count), st);
    k += s.count;
  }
}

double sum_of_squares(const float* grads, std::size_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (std::size_t i = 0; i < n; ++i) s += double(grads[i]) * double(grads[i]);
  return s;
}

std::vector<AdamWSegment> slice_segments(const std::vector<AdamWSegment>& all, std::size_t begin,
                                         std::size_t count) {
  std::vector<AdamWSegment> r;
  std::size_t at = 0;
  const std::size_t end = begin + count;
  for (const AdamWSegment& s : all) {
    const std::size_t lo = std::max(at, begin), hi = std::min(at + s.count, end);
    if (lo < hi) r.push_back({hi - lo, s.decay});
    at += s.count;
  }
  return r;
}

}  // namespace strata
