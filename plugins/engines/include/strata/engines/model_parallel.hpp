// Model parallelism shared by the tp and pp plugins: Megatron tensor parallelism inside each
// partition (StageModel), a pipeline schedule over partitions, data parallelism outside.
//
// One step on a rank: run the schedule's actions (forward / backward of one micro-batch through one
// local chunk). Activations go to the next stage and gradients to the previous one as sends on two
// comm streams (one per direction, so a send never waits behind the other direction), received on
// the compute thread where they are needed; waiting there is the pipeline bubble. Then the tied
// embedding gradient is exchanged between the first and last stage, the gradients are reduced
// over dp, the rank's part of the sequence-parallel gradients all-reduced over tp, the norm added
// over dp, tp and pp (with clipping on), and AdamW updates the rank's shard.
//
// The data-parallel axis is the sharded engine's (strata/engines/sharded.hpp), applied to the
// rank's chunks: sharded::Shards holds their parameters, gradients and AdamW state. dp=allreduce
// all-reduces each chunk's gradients over dp; dp=zero1 (Megatron-LM's distributed optimizer)
// reduce-scatters them (each chunk padded to a multiple of dp), AdamW keeps state for this rank's
// 1/dp of them only, the norm adds the shards' squares over dp, tp and pp, and the updated
// shards are all-gathered over dp.
//
// dp=zero2 and dp=fsdp, each unit its own shard group over dp, AdamW state optionally in host
// memory (`offload`). At pp = 1 (tp alone): the sharded engine (strata/engines/sharded.hpp) on the
// rank's tp partition, gradients reduce-scattered per unit every micro-batch as the backward
// produces them, parameters (fsdp) all-gathered per unit before use and freed after, `prefetch`
// units ahead. Under a pipeline, as torchtitan applies FSDP2 with PP (DeepSpeed refuses ZeRO-2/3
// with its pipeline engine): Shards under the pipeline schedule (dp_schedule below), parameters
// gathered once per step and gradients reduced once per step, at each chunk's last micro-batch.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "strata/engines/pipe_schedule.hpp"
#include "strata/engines/sharded.hpp"
#include "strata/export.hpp"
#include "strata/plugin.hpp"
#include "strata/stage_model.hpp"
#include "strata/tensor_parallel.hpp"

STRATA_EXPORT_BEGIN
namespace strata::mp {

// The data-parallel part: all-reduce, ZeRO-1 (Megatron's distributed optimizer), ZeRO-2, or
// FSDP / ZeRO-3. No effect at dp 1 (except that zero2 and fsdp keep a unit's gradients only
// from its chunk's first backward to its reduction).
enum class DpMode { allreduce, zero1, zero2, fsdp };
DpMode dp_mode(const std::string& option);  // the `dp` option's value
const char* dp_mode_name(DpMode mode);

struct MpConfig {
  std::string strategy;   // "tp", "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", ...
  bool pipeline = false;  // false: the tp plugin (pp must be 1)
  pp::PipeSchedule schedule = pp::PipeSchedule::one_f_one_b;
  int virtual_stages = 1;  // chunks per rank: interleaved's option, zb-v's 2, else 1
  bool sequence_parallel = false;
  DpMode dp = DpMode::allreduce;  // the `dp` option
  std::vector<int> stage_layers;  // blocks per global chunk (pp x virtual_stages); empty: balanced
  int microbatches = 0;           // 0: global_batch / (micro_batch x dp); else must equal that
  // dp=zero2|fsdp (the sharded engine): units gathered ahead, AdamW state in host memory.
  int prefetch = 1;
  bool offload_optimizer = false;
  // The tensor-parallel collectives inside the layers (strata/tensor_parallel.hpp), made once per
  // run from the tp group; empty: SyncTensorParallelComm (one blocking collective per call). A tp
  // strategy that overlaps them supplies its own here.
  std::function<std::unique_ptr<TensorParallelComm>(Group& tp)> make_tp_comm;
  // Expert parallelism (the ep plugin; the pipelines at --mesh ep > 1): a moe's routed experts
  // split over the mesh's ep group, E / ep on each rank (Partition::ep_size = ep), each block's
  // rows exchanged with all_to_allv on it (SyncExpertParallelComm); the experts' gradients
  // all-reduced (dp=allreduce) or reduce-scattered (the sharded modes) over ep_dp, the rest over
  // dp.
  bool expert_parallel = false;
  // Context parallelism (the cp plugin; the pipelines at --mesh cp > 1): each sequence split over
  // the mesh's cp group (Partition::cp_size = cp), each attention by context_attention: Ulysses'
  // all-to-alls around it, or ring attention's passes on a comm stream (SyncContextParallelComm);
  // the gradients reduced over dp x cp. tp alone leaves it to cp.
  bool context_parallel = false;
  ContextAttention context_attention = ContextAttention::ulysses;
};

// Whether the sharded engine runs this configuration with its own micro-batch schedule
// (dp=zero2|fsdp at dp > 1, pp = 1); otherwise the pipeline schedule runs over Shards.
bool on_sharded_engine(const MpConfig& config, const MeshSpec& mesh);
// The cp size a configuration splits sequences over: the mesh's with context_parallel, else 1.
int context_parallel_size(const MpConfig& config, const MeshSpec& mesh);
// The whole model at this rank's tp (and cp) place: the sharded engine's partition then.
Partition sharded_partition(const MeshSpec& mesh, const MeshCoord& coord, const ModelSpec& model,
                            const MpConfig& config);
// The data-parallel axis's configuration: allreduce replicates and zero1 shards the optimizer
// state, each chunk one group; zero2 and fsdp every unit its own group with the config's
// prefetch; offload as configured.
sharded::EngineConfig dp_axis_config(const MpConfig& config);

// The data-parallel axis's actions around a pipeline schedule's unit passes, for the rank's local
// chunks `parts` and Shards' `groups` of them (torchtitan's FSDP2 under PP). fsdp: a chunk's units
// all-gathered one by one in its first forward of the step, `prefetch` units ahead within the
// chunk, and kept gathered until its last backward (FSDP's reshard_after_forward=False, which
// torchtitan sets under PP: no gather per micro-batch). zero2 and fsdp: gradients accumulated
// unsharded over the micro-batches from the chunk's first backward, each unit's reduce-scattered
// after its backward in the chunk's last micro-batch, one in flight behind the next unit's
// (gradient sync on the last micro-batch only); under a split backward (zb-h1, zb-v) after its
// pass in the chunk's last weight pass instead, where its GEMMs' weight gradients are complete.
// With `tied_exchange` (the first and the last chunk each hold the tied embedding; in zb-v's V
// both on stage 0) the units holding it are reduced at the end, after its gradient is summed.
// allreduce and zero1: no actions (Shards::update reduces). One description for Engine::train_step,
// predict() (replayed for memory) and plan_step().
struct UnitPassActions {
  std::vector<sharded::Action> before, after;
};
// The unit passes of every pipeline action in one array (a 175B stage has thousands of actions:
// an array each was most of the advisor's allocations).
struct DpSchedule {
  std::vector<UnitPassActions> unit_passes;  // every action's unit passes, in the step's order
  std::vector<std::size_t> first;            // [pipeline action]: its first; one past the last
  std::vector<sharded::Action> end;          // after the schedule and the tied exchange
  // Pipeline action i's unit passes, in its order.
  std::span<const UnitPassActions> passes(std::size_t i) const {
    return {unit_passes.data() + first[i], first[i + 1] - first[i]};
  }
  std::size_t actions() const { return first.size() - 1; }
  std::vector<sharded::Action> flat() const;  // every action in order
};
DpSchedule dp_schedule(const std::vector<pp::PipeAction>& actions,
                       const std::vector<Partition>& parts,
                       const std::vector<sharded::ShardGroup>& groups,
                       const sharded::EngineConfig& c, bool tied_exchange, int head_unit);

// The `dp` plugin option the tp and pp plugins share (allreduce, zero1, zero2, fsdp; MpConfig::dp).
OptionSpec dp_option();
// The options of a strategy without a pipeline over tp (the tp and cp plugins): sp, dp, prefetch
// and offload; and the MpConfig they give (no pipeline) for strategy `name`.
std::vector<OptionSpec> tensor_parallel_options();
MpConfig tensor_parallel_config(const std::string& name, const Options& options);

// Unit ranges [first, last] of the pp x virtual_stages global chunks, in pipeline order: blocks
// split as stage_layers says or evenly (earlier chunks take the remainder), the embedding joins
// chunk 0 and the head the last chunk.
std::vector<std::pair<int, int>> chunk_units(const ModelSpec& model, int chunks,
                                             const std::vector<int>& stage_layers);

// One clear ConfigError line for a configuration the strategy cannot run.
void validate(const MeshSpec& mesh, const TrainSpec& train, const ModelSpec& model,
              const MpConfig& config);
// One step of rank in.rank as it allocates, runs and moves bytes (src/mp_plan.cpp).
StepPlan plan_step(const PredictInput& in, const MpConfig& config);

class Engine;

class MpStrategy final : public Strategy {
 public:
  explicit MpStrategy(MpConfig c);
  ~MpStrategy() override;
  void validate(const MeshSpec& mesh, const TrainSpec& train,
                const ModelSpec& model) const override {
    mp::validate(mesh, train, model, config_);
  }
  StepPlan plan_step(const PredictInput& in) const override { return mp::plan_step(in, config_); }
  void setup(Context& ctx) override;
  void train_step(Context& ctx, int step) override;

 private:
  MpConfig config_;
  std::unique_ptr<Engine> engine_;
  // dp=zero2|fsdp at pp = 1: the sharded engine on the tp partition, and its tp collectives.
  std::unique_ptr<TensorParallelComm> tp_comm_;
  std::unique_ptr<ContextParallelComm> cp_comm_;  // the sharded engine's (cp > 1)
  std::unique_ptr<ExpertParallelComm> ep_comm_;   // the sharded engine's (ep > 1)
  std::unique_ptr<sharded::Engine> sharded_;
};

}  // namespace strata::mp
STRATA_EXPORT_END
