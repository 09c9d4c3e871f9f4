// AdamW over a contiguous range of the flat parameter index space.
#include "strata/optimizer.hpp"

#include <algorithm>
#include <string>

#include "cpu/layers.hpp"
#include "strata/types.hpp"

namespace strata {

AdamW::AdamW(const ParamLayout& layout, std::size_t begin, std::size_t count,
             const AdamWConfig& config, MemoryLedger& memory)
    : begin_(begin),
      count_(count),
      config_(config),
      m_(memory, MemTag::optimizer, count),
      v_(memory, MemTag::optimizer, count) {
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
}

AdamW::AdamW(std::vector<AdamWSegment> segments, const AdamWConfig& config, MemoryLedger& memory)
    : segments_(std::move(segments)), config_(config) {
  for (const AdamWSegment& s : segments_) count_ += s.count;
  m_ = Buffer<float>(memory, MemTag::optimizer, count_);
  v_ = Buffer<float>(memory, MemTag::optimizer, count_);
}

void AdamW::step(float* params, const float* grads, int t, float grad_scale) {
  if (t < 1)
    throw Error("AdamW::step: step t must be >= 1 (bias correction), got " + std::to_string(t));
  std::size_t k = 0;
  for (const AdamWSegment& s : segments_) {
    cpu::adamw_update(params + k, grads + k, m_.data() + k, v_.data() + k, std::int64_t(s.count),
                      config_.lr, config_.beta1, config_.beta2, config_.eps,
                      s.decay ? config_.weight_decay : 0.0f, t, grad_scale);
    k += s.count;
  }
}

double sum_of_squares(const float* grads, std::size_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (std::size_t i = 0; i < n; ++i) s += double(grads[i]) * double(grads[i]);
  return s;
}

}  // namespace strata
