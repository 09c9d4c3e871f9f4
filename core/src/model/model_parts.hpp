// Pieces of the model implementation: the order of a block's tensors and the activation carver.
#pragma once
#include <cstddef>
#include <vector>

#include "backends/kernels.hpp"
#include "strata/model.hpp"

namespace strata {

// Tensors of one block, in flat order (ParamLayout builds them in this order). A llama block's are
// named attn_norm_w, qkv_w, proj_w, mlp_norm_w, gate_up_w, down_w: the same roles.
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

// The block tensors an architecture has, in flat order: GPT-2 every one, llama the weights only
// (RMSNorm has no bias, nor have its linear layers).
inline const std::vector<int>& block_tensors(Arch arch) {
  static const std::vector<int> gpt2 = {kLn1W, kLn1B, kQkvW, kQkvB, kProjW,   kProjB,
                                        kLn2W, kLn2B, kFcW,  kFcB,  kFcprojW, kFcprojB};
  static const std::vector<int> llama = {kLn1W, kQkvW, kProjW, kLn2W, kFcW, kFcprojW};
  return arch == Arch::llama ? llama : gpt2;
}

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
