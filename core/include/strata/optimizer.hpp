// strata SDK: AdamW with fp32 state, over any contiguous range of the flat parameter index space
// (the whole model for ddp, one rank's shard for ZeRO).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "strata/memory.hpp"
#include "strata/model.hpp"

namespace strata {

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // applied to 2-D weights only (TensorInfo::decay)
};

// A run of consecutive elements that share the weight-decay rule (one tensor, or a shard of one).
struct AdamWSegment {
  std::size_t count = 0;
  bool decay = false;
};

class AdamW {
 public:
  // State (m, v: MemTag::optimizer) for flat elements [begin, begin + count).
  AdamW(const ParamLayout& layout, std::size_t begin, std::size_t count, const AdamWConfig& config,
        MemoryLedger& memory);
  // State for a local buffer made of `segments` in order (e.g. a tensor-parallel shard of a model
  // partition, whose elements are not a range of the flat index space).
  AdamW(std::vector<AdamWSegment> segments, const AdamWConfig& config, MemoryLedger& memory);

  // One update of params[0..count) from grads[0..count) (both indexed from `begin`). `t` is the
  // 1-based step for bias correction; grads are multiplied by grad_scale first (clipping).
  void step(float* params, const float* grads, int t, float grad_scale = 1.0f);

  std::size_t begin() const { return begin_; }
  std::size_t count() const { return count_; }
  std::uint64_t state_bytes() const { return m_.bytes() + v_.bytes(); }

 private:
  std::vector<AdamWSegment> segments_;
  std::size_t begin_ = 0, count_ = 0;
  AdamWConfig config_;
  Buffer<float> m_, v_;
};

// Sum of squares of grads[0..n), in double: the local part of a global gradient norm.
double sum_of_squares(const float* grads, std::size_t n);

// Clip factor for a global gradient norm: min(1, max_norm / norm); 1 when max_norm <= 0.
inline float clip_scale(double global_norm, double max_norm) {
  if (max_norm <= 0 || global_norm <= max_norm) return 1.0f;
  return float(max_norm / (global_norm + 1e-6));
}

}  // namespace strata
