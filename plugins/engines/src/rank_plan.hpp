// What one rank of a model-parallel mesh holds and does, from the configuration alone: the
// engine's setup and its plan_step() share it (the engines library's own, not
// an SDK header).
#pragma once
#include <algorithm>
#include <vector>

#include "strata/engines/model_parallel.hpp"

namespace strata::mp {

struct Plan {
  int P = 1, stage = 0, v = 1, K = 1, m = 1;
  pp::ChunkPlacement placement = pp::ChunkPlacement::loop;
  std::vector<Partition> parts;  // local chunk c
  std::vector<int> global;       // global chunk index of local chunk c
  std::vector<pp::PipeAction> actions;
  // The stage holding global chunk k; whether global chunk k's neighbour k + d (d = +-1) is
  // another rank's, so that what passes between them is sent (zb-v's turn at stage P - 1 is not).
  int holder(int k) const { return pp::chunk_stage(placement, P, k); }
  bool remote(int k, int d) const { return k + d >= 0 && k + d < K && holder(k + d) != stage; }
  // The local chunk holding global chunk k (which must be this stage's).
  int local_chunk(int k) const {
    return int(std::find(global.begin(), global.end(), k) - global.begin());
  }
  bool tied = true;  // the model's LM head is its embedding (ModelSpec::tied)
  // Whether this stage holds a copy of the tied wte, the first or the last chunk's: each holder
  // adds the other's gradient. In a V both are stage 0's: the sum is local.
  bool tied_exchange() const {
    return tied && K > 1 && (holder(0) == stage || holder(K - 1) == stage);
  }
  bool tied_local() const { return holder(0) == holder(K - 1); }
  // The local chunk holding this stage's copy of the tied wte (the embedding's where it has both)
  // and the stage holding the other copy.
  int tied_chunk() const { return local_chunk(holder(0) == stage ? 0 : K - 1); }
  int tied_peer() const { return holder(0) == stage ? holder(K - 1) : holder(0); }
};

// Which of local chunk c's boundary tensors move in another dtype than they are kept in, through
// the engine's send and receive buffers (BoundaryBuffers): every boundary moves in the tp comm
// dtype; activations are kept in the parameters' dtype (StageModel::input, output), their
// gradients in fp32. A chunk receives its input and sends its output unless it is the first /
// the last, and the reverse for the gradients.
struct BoundaryCasts {
  bool send = false, recv = false;
};
// A boundary passed within the rank (zb-v's turn) is copied as it is kept: no cast.
inline BoundaryCasts boundary_casts(const Plan& plan, int c, const MixedPrecision& precision) {
  const int k = plan.global[std::size_t(c)];
  const bool from = plan.remote(k, -1), to = plan.remote(k, +1);
  const bool act = precision.param != precision.tp_comm, grad = precision.tp_comm != DType::f32;
  return {(to && act) || (from && grad), (from && act) || (to && grad)};
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
