// cuDNN's fused attention as the operation graph its backend API takes: the forward (scores,
// scale, causal mask, softmax keeping each row's log-sum-exp, times V) and the backward (dV, dP,
// dS, dK, and dQ through an fp32 accumulator), in the shape cuDNN's flash-attention engines
// recognise (the decomposition cudnn-frontend's SDPA nodes make for cuDNN 9 before 9.21).
//
// Plain data without cuDNN: cudnn_sdpa.cpp emits a graph as backend descriptors, and the tests
// evaluate the same graph on the CPU against the CPU's reference attention
// (tests/unit/test_sdpa_graph.cpp), so what the graph computes is checked on any machine.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

namespace strata::cuda {

enum class SdpaType { f32, bf16, i32, boolean };

// A tensor of the graph, always 4-d. Non-virtual tensors are the caller's memory, bound by uid in
// the variant pack; virtual ones live only inside the fused kernel; by-value ones are host scalars.
struct SdpaTensor {
  std::int64_t uid = 0;
  SdpaType type = SdpaType::f32;
  std::array<std::int64_t, 4> dims{};
  std::array<std::int64_t, 4> strides{};
  bool is_virtual = true;
  bool by_value = false;
  // The flash backward's dQ accumulator, as cudnn-frontend declares it: fp32 in cuDNN's F16x16
  // reordered layout, which the engine adds each key block's part into (atomically), so the
  // caller must zero it before every execution.
  bool accumulates = false;
};

enum class SdpaOpKind { matmul, pointwise, reduce_add, reduce_max, reshape };
enum class SdpaPointwise { add, sub, mul, div, exp, log, identity, gen_index, cmp_ge, select };

// y = op(x, b, t): matmul y = x b (batched over the first two dims); pointwise elementwise with
// size-1 dims broadcast (gen_index: the index along `axis`; select: t ? x : b); reductions over
// the dims where y has size 1; reshape: y views x's memory with its own dims and strides.
struct SdpaOp {
  SdpaOpKind kind = SdpaOpKind::pointwise;
  SdpaPointwise mode = SdpaPointwise::identity;
  int axis = -1;
  int x = -1, b = -1, t = -1, y = -1;  // indices into SdpaGraph::tensors
};

struct SdpaGraph {
  std::vector<SdpaTensor> tensors;
  std::vector<SdpaOp> ops;  // in execution order
};

// The uids a caller binds. Q, K and V are the thirds of the packed qkv activation, dQ, dK and dV
// those of its gradient; O and dO are [B,T,C]; stats (the log-sum-exp) and the row deltas
// (rowsum(dO * O)) are [B,NH,T] fp32; the dQ accumulator is fp32 [B,NH,T,hs] scratch, zero at
// each execution (SdpaTensor::accumulates).
enum SdpaUid : std::int64_t {
  kSdpaQ = 1,
  kSdpaK,
  kSdpaV,
  kSdpaO,
  kSdpaStats,
  kSdpaScale,
  kSdpaMaskFill,
  kSdpaOne,
  kSdpaDO,
  kSdpaDQ,
  kSdpaDK,
  kSdpaDV,
  kSdpaRowDelta,
  kSdpaDQAccum,
};

// B sequences of T tokens in NH heads of hs channels (C = NH hs): Q, K and V read in bf16 from
// qkv [B,T,3C] (row stride 3C), O and dO [B,T,C] bf16, causal, scaled by 1/sqrt(hs).
struct SdpaShape {
  int B = 0, T = 0, NH = 0, hs = 0;
};

// The value the causal mask writes into the scores it hides (exp of it is 0).
float sdpa_mask_fill();

SdpaGraph sdpa_forward_graph(const SdpaShape& shape);
SdpaGraph sdpa_backward_graph(const SdpaShape& shape);

}  // namespace strata::cuda
