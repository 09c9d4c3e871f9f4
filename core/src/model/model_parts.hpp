// Pieces of the model implementation: the order of a block's tensors and the activation carver.
#pragma once
#include <cstddef>

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
};

}  // namespace strata
