// Pipeline-parallel schedules as Megatron-LM defines them, and a simulator that replays them.
//
// Pure and dependency-free, so the planner, the engine and the unit tests share one definition of
// the order in which each pipeline rank runs its forwards and backwards:
//   gpipe        all forwards, then all backwards (GPipe); a rank holds every micro-batch
//   1f1b         PipeDream-Flush (Megatron forward_backward_pipelining_without_interleaving):
//                warm-up forwards, then one forward / one backward, then cool-down backwards
//   interleaved  Megatron forward_backward_pipelining_with_interleaving: each rank holds
//                virtual_stages model chunks (global chunk k on rank k % stages), which divides
//                the bubble by virtual_stages
//   zb-h1        ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): each backward
//                split into the input-gradient pass B, which the stage before waits for, and the
//                weight-gradient pass W, which nobody waits for; 1f1b's order of forwards and B
//                passes, stage s deferring its first s W passes so that every stage holds at most
//                as many micro-batches as 1f1b's first stage, and the deferred W passes fill the
//                cool-down. A third of 1f1b's bubble when F, B and W cost the same.
//   zb-v         ZB-V (the same paper, section 6; torchtitan's ZBVZeroBubble): two chunks per
//                rank placed in a V (rank s holds global chunks s and 2p - 1 - s, so the first
//                and the last chunk share rank 0 and the turn at rank p - 1 is local), the
//                backward split as zb-h1's; its order keeps every rank at 1f1b's first stage's
//                activations (2p half-stage chunks) and, with F, B and W of equal cost, leaves
//                zb-h1's bubble up to m = p and half of it, (p - 1) chunk forwards, from m = 2p.
//
// All functions throw std::invalid_argument with one line naming the bad argument.
#pragma once
#include <vector>

#include "strata/export.hpp"

STRATA_EXPORT_BEGIN
namespace strata::pp {

enum class PipeSchedule { gpipe, one_f_one_b, interleaved, zb_h1, zb_v };

// How global chunks sit on the ranks: in a loop (chunk c of rank s is c * p + s; gpipe, 1f1b,
// zb-h1 have one chunk, interleaved v) or in a V (zb-v: chunk 0 of rank s is s, chunk 1 is
// 2p - 1 - s).
enum class ChunkPlacement { loop, v_shape };
ChunkPlacement chunk_placement(PipeSchedule schedule);

// The passes of a micro-batch through a chunk. A schedule that splits the backward (zb-h1) runs a
// backward (the gradients of the chunk's input only) and later a weight pass (its parameters'
// gradients); the others run one backward computing both and no weight pass.
enum class PipePass : unsigned char { forward, backward, weight };

// One compute action of one pipeline rank: `pass` of micro-batch `micro` through the rank's local
// model chunk `chunk` (0..virtual_stages-1; always 0 unless interleaved).
struct PipeAction {
  PipePass pass = PipePass::forward;
  int micro = 0;
  int chunk = 0;
  bool forward() const { return pass == PipePass::forward; }
  bool operator==(const PipeAction&) const = default;
};

// Whether the schedule splits each backward into a backward and a weight pass (zb-h1, zb-v).
bool splits_backward(PipeSchedule schedule);

// Returns the ordered list of actions that pipeline rank `stage` (0..stages-1) executes in one
// training step: every (micro, chunk) forward and backward (and, splitting, weight pass) exactly
// once, each forward before its backward, each backward before its weight pass. virtual_stages
// must be 1 for gpipe, 1f1b and zb-h1, and 2 for zb-v; interleaved needs micro_batches to be a
// multiple of stages (as Megatron-LM requires).
std::vector<PipeAction> pipeline_schedule(PipeSchedule schedule, int stages, int stage,
                                          int micro_batches, int virtual_stages = 1);

// Returns the global model chunk index of local chunk `chunk` on rank `stage` (chunk_placement).
// Forward data flows from global chunk k to k + 1 (on rank chunk_stage(k + 1)); gradients flow
// the other way.
int global_chunk(ChunkPlacement placement, int stages, int stage, int chunk);
// Returns the rank holding global chunk k, of stages * chunks per rank.
int chunk_stage(ChunkPlacement placement, int stages, int k);

// Returns the maximum, over the step, of the number of (micro, chunk) pairs whose forward has run
// and whose last pass (the weight pass where the list has them, else the backward) has not, on one
// rank's action list: the activations it holds at once.
int max_in_flight(const std::vector<PipeAction>& actions);

// The same as max_in_flight(actions), counting only the pairs of local chunk `chunk`.
int max_in_flight(const std::vector<PipeAction>& actions, int chunk);

struct PipeSimulation {
  double makespan = 0;       // time when the last action of any rank ends
  std::vector<double> busy;  // per rank: total compute time
  std::vector<double> idle;  // per rank: makespan - busy (the bubble)
  bool deadlock = false;     // true if some rank can never run its next action
  // The ranks' mean idle time over the makespan.
  double bubble_fraction() const {
    double sum = 0;
    for (double i : idle) sum += i;
    return sum / double(idle.size()) / makespan;
  }
};

// The compute time of one micro-batch's passes through one whole stage: forward, backward (both
// gradients) and, of the backward, the weight gradients' part (0 <= weight <= backward). A split
// backward costs backward - weight, its weight pass weight.
struct PassCosts {
  double forward = 1.0, backward = 2.0, weight = 1.0;
};

// Returns the simulation of all ranks executing their lists from pipeline_schedule in order, with
// sends that never block (as with asynchronous sends) and zero transfer time. A pass through one
// chunk costs its PassCosts / virtual_stages. Dependencies (k = global chunk): F(m, k) needs
// F(m, k - 1) done (k = 0 needs nothing); B(m, k) needs F(m, k) done on the same rank and
// B(m, k + 1) done (the last global chunk needs only its own forward); W(m, k) needs B(m, k).
// Costs must be >= 0.
PipeSimulation simulate_pipeline(PipeSchedule schedule, int stages, int micro_batches,
                                 int virtual_stages = 1, PassCosts costs = {});

// Returns the same simulation for arbitrary per-rank action lists (rank_actions[s] is rank s's
// list; rank_actions.size() is the number of stages), e.g. to check a hand-made order for
// deadlock. Every action's micro must be in [0, micro_batches) and chunk in [0, virtual_stages).
// A list with weight passes splits every backward (all of them must have one).
PipeSimulation simulate_actions(const std::vector<std::vector<PipeAction>>& rank_actions,
                                int micro_batches, int virtual_stages = 1, PassCosts costs = {},
                                ChunkPlacement placement = ChunkPlacement::loop);

// Returns the predicted bubble fraction (idle time / step time) of the ideal pipeline with uniform
// chunk costs: (p - 1) / (m + p - 1) for gpipe and 1f1b, (p - 1) / (v * m + p - 1) for
// interleaved (Megatron-LM paper: bubble time (p - 1) * (f + b) / v), and for zb-h1 with F, B and
// W of equal cost (p - 1) / (3 m + p - 1) (the ZB paper: bubble time (p - 1) * (f + b - w)); for
// zb-v, whose bubble has no closed form, the simulation's mean idle time with F, B and W of equal
// cost.
double predicted_bubble_fraction(PipeSchedule schedule, int stages, int micro_batches,
                                 int virtual_stages = 1);

// Returns "gpipe", "1f1b", "interleaved", "zb-h1" or "zb-v".
const char* schedule_name(PipeSchedule schedule);

}  // namespace strata::pp
STRATA_EXPORT_END
