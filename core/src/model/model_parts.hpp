// Pieces of the model implementation: the order of a block's tensors and the activation carver.
#pragma once
#include <cstddef>

#include "backends/kernels.hpp"

namespace strata {

// Tensors of one block, in flat order (ParamLayout builds them in this order).
enum BlockTensor {
  kLn1W,
  kLn1B,
  kQkvW,
  kQkvB,
  kProjW,
  kProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFcprojW,
  kFcprojB,
  kBlockTensors
};

// Carves 64-byte aligned pieces from one float buffer; running the same carve with a null base
// counts the floats, so activation byte predictions are exact by construction.
struct Carver {
  float* base = nullptr;
  std::size_t used = 0;  // floats
  float* take(std::size_t n) {
    float* p = base ? base + used : nullptr;
    used += (n + 15) / 16 * 16;
    return p;
  }
  // n elements of `dtype` (f32 or bf16; bf16 rounded up to whole floats).
  ActView take(std::size_t n, DType dtype) {
    if (dtype == DType::f32) return take(n);
    return reinterpret_cast<bf16*>(take((n + 1) / 2));
  }
};

}  // namespace strata
