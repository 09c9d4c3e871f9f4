// ZeRO-2 and FSDP on the data-parallel axis of the model-parallel engine (tp, pp = 1).
//
// Every local unit (the embedding, each block, the head) is its own shard group over dp, as
// ZeRO-2's buckets and FSDP's wrapped modules: a unit of `count` elements is padded to dp x chunk
// and dp rank i owns chunk i. StageModel's unit-at-a-time passes ask for one unit's parameters or
// gradients at a time:
//   zero2  parameters: a full replica in the per-unit padded layout, all-gathered per unit after
//          the step. Gradients: a unit's padded buffer lives from its backward to the end of its
//          reduce-scatter (once per micro-batch), which adds it into the rank's owned shard; the
//          reduce-scatter runs on the comm stream during the next unit's backward (one in flight).
//   fsdp   as zero2, and parameters are only the owned shards: each unit is all-gathered into a
//          buffer (MemTag::comm_buffers) before its forward and again before its backward, freed
//          after (FSDP's FULL_SHARD, reshard after forward).
// The embedding unit is held from its first use to the end of each pass (the head reads its wte).
// AdamW keeps state for the owned elements of each unit; the gradient norm is the owned shards'
// squares summed over dp, then tp.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "strata/data_parallel.hpp"
#include "strata/engines/sharded.hpp"
#include "strata/stage_model.hpp"

namespace strata::mp {

struct UnitGroups {
  std::vector<sharded::ShardGroup> groups;  // one per local unit; offset: its local offset
  std::vector<std::size_t> base;            // group g's start in the per-unit padded layout
  std::vector<std::size_t> own;             // its owned chunk's start in the concatenated shards
  std::size_t padded = 0;                   // sum of padded(): the padded layout's size
  std::size_t chunks = 0;                   // sum of chunk: the concatenated shards' size
  int first_unit = 0;
  int index(int unit) const { return unit - first_unit; }
};
UnitGroups unit_groups(const ModelSpec& model, const Partition& part, int dp);

// A replicated tensor's gradient under sequence parallelism is partial per tp rank: the parts of
// those tensors inside this rank's owned shards (at `at` in the concatenated shards) are
// all-reduced over tp after the dp reduce-scatters.
struct OwnedSlice {
  std::size_t local = 0, at = 0, count = 0;
};
std::vector<OwnedSlice> owned_partials(const ModelSpec& model, const Partition& part,
                                       const UnitGroups& u, int shard);

// Memory of zero2 / fsdp for one rank (added to `p`): per = bytes per element by state. Its bytes
// on the wire are its plan's (mp_plan.cpp).
void predict_dp_units(const ModelSpec& model, const Partition& part, int dp, int shard, bool fsdp,
                      const StateBytes& per, Prediction& p);

class DpUnits {
 public:
  DpUnits(Context& ctx, StageModel& sm, bool fsdp);
  // Zero the owned gradient shards (start of a step).
  void begin_step(Context& ctx);
  StageModel::UnitAccess params();
  StageModel::UnitAccess grads(Context& ctx);
  // After the last backward: the sequence-parallel all-reduce over tp, the norm, AdamW on the
  // owned shards, and for zero2 the all-gather of every unit.
  void step(Context& ctx, int step, Group* tp);

 private:
  void init_params(Context& ctx);
  // Waits for the reduce-scatter in flight (if any), adds its output into the owned shard and
  // frees its buffers.
  void finish_reduce(Context& ctx);
  int held_unit() const;  // the embedding unit (0) when this partition has it, else -1
  BufferView shard_params(int g);
  double sum_of_squares();
  StageModel* sm_;
  bool fsdp_;
  int shard_ = 0;
  Group* dp_;
  DType param_dtype_, grad_dtype_;
  UnitGroups u_;
  std::vector<OwnedSlice> partials_;
  MemoryLedger* memory_;
  // zero2: the padded replica; fsdp: the owned shards. Gradients: the owned shards.
  DeviceBuffer params_, shard_grads_, partial_pack_;
  std::vector<DeviceBuffer> gathered_, unit_grads_;  // per group, while a pass holds it
  // The reduce-scatter in flight: its group (-1: none), output and completion.
  int reducing_ = -1;
  DeviceBuffer reduced_;
  std::optional<Event> reduce_done_;
  std::vector<AdamW> optimizers_;
};

}  // namespace strata::mp
