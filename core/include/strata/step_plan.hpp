// strata SDK: a strategy's step as data, for the step-time predictor (docs/predict.md,
// "Predicting step time"). Strategy::plan_step() returns one rank's actions in the order the
// rank issues them; the core replays them with a machine profile's calibrated durations: unit
// passes, the optimizer, comm fitted per op, bytes and group shape. The policy (what to gather,
// reduce, send, when) is the plugin's, as in its train_step(); the durations are the machine's.
//
// The replay's rules, one compute clock per rank:
//   forward, backward, update, fresh   advance the compute clock by their calibrated time
//   weight                             the weight pass of a split backward (split_backward): the
//                                      weight GEMMs' share of the unit's backward, which the
//                                      plan's backwards then leave out
//   comm on a stream (stream >= 0)     starts when both the clock has issued it and the stream is
//                                      free; the stream's time advances, the clock does not
//   comm with stream < 0               blocks the compute clock for its time (an all-reduce on the
//                                      compute thread)
//   copy                               host <-> device on a stream, like a comm on a stream
//   wait                               the clock waits for `event` (the end of the last comm or
//                                      copy that carried it), or for every stream when event < 0
//   send, recv                         point to point with rank `peer`: a send never blocks (it
//                                      runs on a comm stream); the recv of the same tag waits for
//                                      the send's issue plus its transfer time
//   alloc, free                        memory, no time: `bytes` of `tag` taken or given back
//                                      (plan_memory; the setup list holds setup()'s allocations)
// At the end of the step the clock waits for every stream. Collectives are costs of the rank's
// own group (its peers run the same plan); sends and receives pair ranks of different pipeline
// stages, so the predictor asks for the plan of every stage (rank 0's pp group).
#pragma once
#include <array>
#include <string>
#include <vector>

#include "strata/comm.hpp"
#include "strata/context.hpp"
#include "strata/export.hpp"
#include "strata/mesh.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

enum class PlanOp {
  forward,
  backward,
  weight,
  update,
  fresh,
  comm,
  copy,
  wait,
  send,
  recv,
  alloc,
  free
};

struct PlanAction {
  PlanOp op = PlanOp::forward;
  int unit = -1;  // forward, backward, weight: a unit of the model (ParamLayout's numbering), one
                  // micro-batch, as this mesh's StageModel runs it (tp split included)
  double count = 0;  // update: parameters the optimizer steps
  double bytes = 0;  // fresh, copy, send, recv; comm: nccl-tests bytes of `collective`
  // comm: all_reduce, reduce_scatter, all_gather, reduce or broadcast; copy: d2h or h2d.
  CommOp collective = CommOp::all_reduce;
  Axis axis = Axis::dp;  // comm: the group it runs on
  int stream = -1;       // comm, copy: the stream it is issued on; comm only: < 0 blocks
  int event = -1;        // comm, copy: the event its end sets; wait: the event waited for
  int peer = -1;         // send, recv: the other rank
  int tag = 0;           // send, recv: pairs a recv with its send
  MemTag memory = MemTag::workspace;  // alloc, free: the ledger tag of `bytes`
};

// One rank's step: `micro_batch` replayed `micro_batches` times, then `step` once. `setup`: the
// allocations setup() makes and the run holds (alloc actions only).
struct StepPlan {
  std::vector<PlanAction> setup;
  std::vector<PlanAction> micro_batch;
  int micro_batches = 0;
  std::vector<PlanAction> step;
  // The units run with Megatron's sequence parallelism (Partition::sequence_parallel): the core
  // charges their tp collectives as all-gathers and reduce-scatters instead of all-reduces.
  bool sequence_parallel = false;
  // The moe blocks' routed experts split over an ep group of this many ranks (Partition::ep_size):
  // the core charges their exchanges inside the unit passes (expert_parallel_collectives).
  int expert_parallel = 1;
  // Each sequence split over a cp group of this many ranks (Partition::cp_size), its attention by
  // context_attention (Partition::cp_attention): the core charges its exchanges inside the
  // blocks' passes (context_parallel_collectives).
  int context_parallel = 1;
  ContextAttention context_attention = ContextAttention::ulysses;
  // The backwards compute the units' input gradients only and each unit's weight gradients are a
  // weight action of their own (StageModel's split_backward; zero-bubble pipelines).
  bool split_backward = false;
  // Empty plan: why this configuration has no time model (e.g. "no plan for offload yet").
  std::string unmodelled;
  // What predict() reports beside the memory: assumptions, padding, the rank's stage (--dry-run
  // prints them), and a pipeline's ideal bubble ((p-1)/(m+p-1) for GPipe and 1F1B; zb-h1's by
  // its schedule's simulation with the weight passes' FLOP share; negative: not a pipeline),
  // recorded beside the measured one.
  std::string notes;
  double bubble_fraction = -1;
  bool empty() const { return micro_batch.empty() && step.empty(); }
};

// Builders, so that a plan reads like the train_step it describes.
inline PlanAction plan_forward(int unit) { return {.op = PlanOp::forward, .unit = unit}; }
inline PlanAction plan_backward(int unit) { return {.op = PlanOp::backward, .unit = unit}; }
inline PlanAction plan_weight(int unit) { return {.op = PlanOp::weight, .unit = unit}; }
inline PlanAction plan_update(double params) { return {.op = PlanOp::update, .count = params}; }
inline PlanAction plan_fresh(double bytes) { return {.op = PlanOp::fresh, .bytes = bytes}; }
// A collective: blocking with stream < 0, else on that comm stream, setting `event` at its end.
inline PlanAction plan_comm(CommOp collective, double bytes, Axis axis, int stream = -1,
                            int event = -1) {
  return {.op = PlanOp::comm,
          .bytes = bytes,
          .collective = collective,
          .axis = axis,
          .stream = stream,
          .event = event};
}
// A copy between device and host memory (CommOp::d2h or CommOp::h2d) on a comm stream.
inline PlanAction plan_copy(CommOp direction, double bytes, int stream, int event = -1) {
  return {.op = PlanOp::copy,
          .bytes = bytes,
          .collective = direction,
          .stream = stream,
          .event = event};
}
inline PlanAction plan_wait(int event = -1) { return {.op = PlanOp::wait, .event = event}; }
inline PlanAction plan_send(int peer, int tag, double bytes) {
  return {.op = PlanOp::send, .bytes = bytes, .axis = Axis::pp, .peer = peer, .tag = tag};
}
inline PlanAction plan_recv(int peer, int tag, double bytes) {
  return {.op = PlanOp::recv, .bytes = bytes, .axis = Axis::pp, .peer = peer, .tag = tag};
}
// Memory the rank takes (the ledger's `tag`, as the Buffer that allocates it says) and gives back.
inline PlanAction plan_alloc(MemTag tag, double bytes) {
  return {.op = PlanOp::alloc, .bytes = bytes, .memory = tag};
}
inline PlanAction plan_free(MemTag tag, double bytes) {
  return {.op = PlanOp::free, .bytes = bytes, .memory = tag};
}

// Every unit's forward then backward (in reverse) of one micro-batch, nothing else: the compute
// of a replica or a pipeline-free rank.
void plan_forward_backward(int num_units, std::vector<PlanAction>& out);

// The peak bytes per tag a plan holds: setup's allocations, then `micro_batch` `micro_batches`
// times, then `step`, each alloc adding to its tag and each free taking from it; every tag's peak
// on its own, as the memory ledger keeps them. A strategy's predicted memory when its plan
// allocates (plan_allocates; predict(), strata/plugin.hpp).
std::array<double, kNumMemTags> plan_memory(const StepPlan& plan);
bool plan_allocates(const StepPlan& plan);

// The bytes per step a plan moves, per op (indexed by CommOp; nccl-tests size convention): its
// collectives, copies, sends and receives, and the tensor-parallel collectives inside each unit
// pass it runs (tensor_parallel_collectives, strata/stage_model.hpp). This is what the core
// records as a run's predicted bytes and what every run's measured bytes are checked against: a
// strategy describes its communication once, in its plan.
std::array<double, kNumCommOps> plan_comm_bytes(const StepPlan& plan, const ModelSpec& model,
                                                const TrainSpec& train, int tp);

}  // namespace strata
STRATA_EXPORT_END
