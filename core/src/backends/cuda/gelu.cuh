// The GELU's tanh approximation on the device, one definition for the layer kernels (layers.cu)
// and the fused backward steps (kernels_steps.cu), so that a fused kernel computes the local
// gradient with the same operations, in the same order, as the unfused gelu_backward.
#pragma once
#include <cuda_runtime.h>

namespace strata::cuda {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// GELU'(x) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx,  u = sqrt(2/pi) (x + 0.044715 x^3).
__device__ __forceinline__ float gelu_local_grad(float x) {
  const float th = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
  const float dudx = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * dudx;
}

}  // namespace strata::cuda
