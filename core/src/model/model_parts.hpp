// Pieces of the model implementation: the order of a block's tensors and the activation carver.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/kernels.hpp"
#include "strata/model.hpp"

namespace strata {

// Tensors of one block (block_tensors gives an architecture's flat order). A llama block's are
// named attn_norm_w, qkv_w, proj_w, mlp_norm_w, gate_up_w, down_w: the same roles; a moe block's
// are a llama's with router_w [E, C] before its experts' experts.gate_up_w [E, 2F, C] and
// experts.down_w [E, C, F], then with shared experts their shared.gate_up_w [2 S F, C] and
// shared.down_w [C, S F].
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
  kRouterW,
  kSharedFcW,
  kSharedFcprojW,
  kBlockTensors
};

// The block tensors of a spec's blocks, in flat order: GPT-2 every one, llama the weights only
// (RMSNorm has no bias, nor have its linear layers), moe a llama's with the router (and the
// shared experts').
inline const std::vector<int>& block_tensors(const ModelSpec& spec) {
  static const std::vector<int> gpt2 = {kLn1W, kLn1B, kQkvW, kQkvB, kProjW,   kProjB,
                                        kLn2W, kLn2B, kFcW,  kFcB,  kFcprojW, kFcprojB};
  static const std::vector<int> llama = {kLn1W, kQkvW, kProjW, kLn2W, kFcW, kFcprojW};
  static const std::vector<int> moe = {kLn1W, kQkvW, kProjW, kLn2W, kRouterW, kFcW, kFcprojW};
  static const std::vector<int> moe_shared = {kLn1W, kQkvW,    kProjW,     kLn2W,         kRouterW,
                                              kFcW,  kFcprojW, kSharedFcW, kSharedFcprojW};
  if (spec.arch == Arch::gpt2) return gpt2;
  if (spec.arch == Arch::llama) return llama;
  return spec.shared_experts > 0 ? moe_shared : moe;
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
  std::int32_t* take_i32(std::size_t n) { return reinterpret_cast<std::int32_t*>(take(n)); }
  // n elements of `dtype` (f32 or bf16; bf16 rounded up to whole floats).
  ActView take(std::size_t n, DType dtype) {
    if (dtype == DType::f32) return take(n);
    return reinterpret_cast<bf16*>(take((n + 1) / 2));
  }
};

}  // namespace strata
