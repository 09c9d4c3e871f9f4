// What one rank of a model-parallel mesh holds and does, from the configuration alone: the
// engine's setup and its plan_step() share it (the engines library's own, not
// an SDK header).
#pragma once
#include <vector>

#include "strata/engines/model_parallel.hpp"

namespace strata::mp {

struct Plan {
  int P = 1, stage = 0, v = 1, K = 1, m = 1;
  std::vector<Partition> parts;  // local chunk c
  std::vector<int> global;       // global chunk index of local chunk c
  std::vector<pp::PipeAction> actions;
  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == P - 1; }
  bool tied = true;  // the model's LM head is its embedding (ModelSpec::tied)
  // The first and the last stage each hold a copy of the tied wte when they are different ranks.
  bool tied_exchange() const { return tied && P > 1 && (first_stage() || last_stage()); }
};

// Which of local chunk c's boundary tensors move in another dtype than they are kept in, through
// the engine's send and receive buffers (BoundaryBuffers): every boundary moves in the tp comm
// dtype; activations are kept in the parameters' dtype (StageModel::input, output), their
// gradients in fp32. A chunk receives its input and sends its output unless it is the first /
// the last, and the reverse for the gradients.
struct BoundaryCasts {
  bool send = false, recv = false;
};
inline BoundaryCasts boundary_casts(const Plan& plan, int c, const MixedPrecision& precision) {
  const int k = plan.global[std::size_t(c)];
  const bool first = k == 0, last = k == plan.K - 1;
  const bool act = precision.param != precision.tp_comm, grad = precision.tp_comm != DType::f32;
  return {(!last && act) || (!first && grad), (!first && act) || (!last && grad)};
}
// Whether the rank needs the receive buffer: a pipeline one of whose chunks casts what it receives.
inline bool receives_cast(const Plan& plan, const MixedPrecision& precision) {
  bool any = false;
  for (int c = 0; c < plan.v; ++c) any = any || boundary_casts(plan, c, precision).recv;
  return plan.K > 1 && any;
}
Plan make_plan(const MeshSpec& mesh, const MeshCoord& coord, const ModelSpec& model,
               const TrainSpec& t, const MpConfig& cfg);

// The data-parallel axis's actions around the rank's schedule (dp_schedule), for Shards' groups
// of the rank's chunks.
DpSchedule dp_schedule_of(const Plan& plan, const std::vector<sharded::ShardGroup>& groups,
                          const MpConfig& cfg, const ModelSpec& model);

}  // namespace strata::mp
