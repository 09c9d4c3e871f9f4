// strata SDK: AdamW with fp32 state, over any contiguous range of the flat parameter index space
// (the whole model for ddp, one rank's shard for ZeRO).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "strata/export.hpp"
#include "strata/memory.hpp"
#include "strata/model.hpp"

STRATA_EXPORT_BEGIN
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

// Mixed precision (param_dtype bf16): the parameters step() updates are the bf16 compute copy;
// AdamW keeps their fp32 master copy (MemTag::optimizer, 4 bytes per element next to m and v: the
// ZeRO paper's 12 bytes of optimizer state), updates the master and rounds it into the bf16
// parameters. The plugin fills master() once before the first step (init_params of its range).
// `state_tag` MemTag::offload keeps the state in host memory (CPU offload): step() then takes
// parameters and gradients in host memory too, and runs on the CPU.
class AdamW {
 public:
  // State (m, v, and the master copy for bf16: MemTag::optimizer) for flat elements
  // [begin, begin + count).
  AdamW(const ParamLayout& layout, std::size_t begin, std::size_t count, const AdamWConfig& config,
        MemoryLedger& memory, DType param_dtype = DType::f32, MemTag state_tag = MemTag::optimizer);
  // State for a local buffer made of `segments` in order (e.g. a tensor-parallel shard of a model
  // partition, whose elements are not a range of the flat index space).
  AdamW(std::vector<AdamWSegment> segments, const AdamWConfig& config, MemoryLedger& memory,
        DType param_dtype = DType::f32, MemTag state_tag = MemTag::optimizer);

  // One update of params (count() elements, param_dtype) from grads (count() elements, f32 or
  // bf16). `t` is the 1-based step for bias correction; grads are multiplied by grad_scale first
  // (clipping).
  void step(BufferView params, BufferView grads, int t, float grad_scale = 1.0f);

  // The fp32 master copy of the parameters (bf16 param_dtype); an empty view for f32.
  BufferView master() { return master_.view(); }
  DType param_dtype() const { return param_dtype_; }
  std::size_t begin() const { return begin_; }
  std::size_t count() const { return count_; }
  std::uint64_t state_bytes() const { return m_.bytes() + v_.bytes() + master_.bytes(); }

 private:
  void allocate(MemoryLedger& memory, MemTag state_tag);
  std::vector<AdamWSegment> segments_;
  std::size_t begin_ = 0, count_ = 0;
  AdamWConfig config_;
  DType param_dtype_ = DType::f32;
  Buffer<float> m_, v_, master_;
};

// The segments covering elements [begin, begin + count) of a buffer made of `all` (a shard's).
std::vector<AdamWSegment> slice_segments(const std::vector<AdamWSegment>& all, std::size_t begin,
                                         std::size_t count);

// Sum of squares of grads[0..n), in double: the local part of a global gradient norm.
double sum_of_squares(const float* grads, std::size_t n);

// Clip factor for a global gradient norm: min(1, max_norm / norm); 1 when max_norm <= 0.
inline float clip_scale(double global_norm, double max_norm) {
  if (max_norm <= 0 || global_norm <= max_norm) return 1.0f;
  return float(max_norm / (global_norm + 1e-6));
}

}  // namespace strata
STRATA_EXPORT_END
