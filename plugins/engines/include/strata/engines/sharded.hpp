// The sharded data-parallel engine behind zero1/2/3 and fsdp/fsdp-grad-op/fsdp-hybrid, and the
// data-parallel axis of tp and of the pipelines (Shards: the one implementation of a ZeRO/FSDP
// step, which the pipelines drive with their own schedule).
//
// Parameters are sharded per *group*: a contiguous run of model units (a ZeRO bucket or an FSDP
// unit). A group of `count` elements is padded to n * chunk (n = shard group size) and rank i owns
// chunk i. What is sharded decides the stage:
//   zero1  optimizer state                    grads reduce-scattered once per step
//   zero2  + gradients                        reduce-scattered per group during backward
//   zero3  + parameters                       gathered per group before use, freed after
// The per-micro-batch schedule is data (a list of actions); the engine executes it and predict()
// accounts it, so memory and bytes on the wire can be predicted exactly and compared.
#pragma once
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/data_parallel.hpp"
#include "strata/export.hpp"
#include "strata/stage_model.hpp"

STRATA_EXPORT_BEGIN
namespace strata::sharded {

struct EngineConfig {
  bool shard_grads = false;           // zero2 and up
  bool shard_params = false;          // zero3, fsdp*
  bool reshard_after_forward = true;  // zero3, fsdp (FULL_SHARD); false: fsdp-grad-op
  bool hybrid = false;                // shard inside a node, all-reduce across nodes
  int units_per_group = 1;            // fsdp `wrap` (when parameters are sharded)
  double bucket_mb = 25;              // zero1/zero2: units grouped up to this size
  int forward_prefetch = 1;           // groups gathered ahead in forward
  int backward_prefetch = 1;          // groups gathered ahead in backward (0: none)
  bool prefetch_post = false;         // fsdp backward_prefetch=post: issue after the compute
  int max_gathers_in_flight = 0;      // fsdp limit_all_gathers (0: unlimited)
  bool overlap = true;                // comm overlaps the next group's compute
  // offload=optimizer (ZeRO-Offload, FSDP CPUOffload): AdamW state in host memory
  // (MemTag::offload) with host copies of this rank's gradient (and fp32 parameter) shards, kept
  // for the run. Per group the shard is copied to the host (d2h) on a comm stream of its own,
  // updated there while the next groups copy, and copied back (h2d) before the all-gather.
  bool offload_optimizer = false;
  // dp=allreduce under tp and the pipelines: no shard group (every rank holds all the state), the
  // gradients all-reduced over dp once per step.
  bool replicate = false;
};

struct ShardGroup;

// Where a rank sits on the data-parallel axis: its shard group (dp; dp_intra_node with hybrid;
// none with replicate) and its index there, and the replicas its reduced gradients are
// all-reduced with (dp_inter_node with hybrid; dp with replicate). With expert parallelism
// (--mesh ep > 1) and a sharded optimizer, the routed experts' groups are sharded over ep_dp
// instead (the ranks holding the same experts): its size and this rank's index there.
struct Placement {
  Axis shard_axis = Axis::dp;
  int shards = 1, index = 0;
  Axis replica_axis = Axis::dp_inter_node;
  int replicas = 1;
  int expert_shards = 1, expert_index = 0;
  // This rank's shard of group g, and the axis g is sharded over.
  int index_of(const ShardGroup& g) const;
  Axis axis_of(const ShardGroup& g) const;
};
Placement placement(const MeshSpec& mesh, int rank, const EngineConfig& c);

struct ShardGroup {
  int first_unit = 0, last_unit = 0;  // inclusive
  std::size_t offset = 0, count = 0;  // flat parameter range
  std::size_t chunk = 0;              // per-rank shard (padded)
  std::size_t padded() const { return chunk * shards; }
  int shards = 1;
  int part = 0;  // the partition (a pipeline stage's chunk) whose units it holds
  // Expert parallelism with a sharded optimizer or gradients (Megatron-Core's distributed
  // optimizer with EP, torchtitan's FSDP2 with EP): the groups are runs of a partition's tensors
  // of one kind, the routed experts' (sharded over ep_dp, `shards` = dp / ep) or the rest (over
  // dp), so a unit may span groups.
  bool experts = false;
  // The bucket (a ZeRO bucket or an FSDP unit: what the schedule gathers, reduces and frees at
  // once) this group is a run of; its runs are adjacent and share its buffers (bucket_span).
  int bucket = 0;
  // Elements of chunk `i` that are real parameters (the rest is padding).
  std::size_t valid(int i) const {
    std::size_t begin = std::size_t(i) * chunk;
    return begin >= count ? 0 : std::min(chunk, count - begin);
  }
};

// Elements [at, at + count) of group `group`'s shard on one rank.
struct ShardSlice {
  int group;
  std::size_t at, count;
};
// The elements of the shards of the rank at `at` that lie in the local tensors `keep` selects
// (tensors[p]: partition p's), in group order, adjacent ones merged: the norm's elements
// (StageModel::in_grad_norm), or under sequence parallelism the replicated tensors' (partial per
// tp rank).
std::vector<ShardSlice> owned_slices(const std::vector<std::vector<LocalTensor>>& tensors,
                                     const std::vector<ShardGroup>& groups, const Placement& at,
                                     const std::function<bool(const LocalTensor&)>& keep);

// Under sequence parallelism, the elements of the rank's shards in replicated tensors (their
// gradients are partial per tp rank, all-reduced over tp before the update); 0 otherwise.
double partial_count(const ModelSpec& model, const std::vector<Partition>& parts,
                     const std::vector<ShardGroup>& groups, const Placement& at);

// The groups of the local units [first_unit, first_unit + units.size()), each (offset, count) in
// the rank's local flat order (StageModel::unit_ranges; at tp 1 the model's ParamLayout).
std::vector<ShardGroup> make_groups(const std::vector<std::pair<std::size_t, std::size_t>>& units,
                                    int first_unit, int shards, const EngineConfig& c);
// The whole model's groups at tp 1.
std::vector<ShardGroup> make_groups(const ParamLayout& layout, int shards, const EngineConfig& c);
// The groups of a rank's partitions (a pipeline stage's chunks), each partition's own, in order;
// a group's offset is in its partition's local flat order. Partitions with experts split over ep
// (Partition::ep_size > 1) under a sharded optimizer: each group cut into runs of the routed
// experts' tensors (ShardGroup::experts, over ep_dp: shards / ep_size) and the others'.
std::vector<ShardGroup> make_groups(const ModelSpec& model, const std::vector<Partition>& parts,
                                    int shards, const EngineConfig& c);

// The schedule's groups (micro_batch_schedule, mp::dp_schedule): one per bucket, over its runs'
// units and elements (the groups themselves where no bucket is cut into runs).
std::vector<ShardGroup> bucket_groups(const std::vector<ShardGroup>& groups);
// The elements bucket b's gathered parameters and unsharded gradients take: from its first run's
// offset to the end of its last run's padded range; each run's padding runs into the next run,
// which is gathered after it and overwrites it (its reduce-scatter only reads there).
std::size_t bucket_span(const std::vector<ShardGroup>& groups, int b);

// Where each group starts in a rank's replica of its partitions' parameters (or gradients) and
// the replica's size. Groups of whole units: padded one after another, so that each group's shards
// are all-gathered in place. Groups that split units (ShardGroup::experts): the partitions'
// contiguous local order, so that a unit's view is one range, with room after it for the last
// group's padding; a group's padded range then runs into the next group's, which its
// reduce-scatter only reads and its all-gather does not write (it gathers into a comm buffer and
// copies the group's elements in).
struct ReplicaLayout {
  std::vector<std::size_t> base;
  std::size_t size = 0;
  bool contiguous = false;
};
ReplicaLayout replica_layout(const std::vector<ShardGroup>& groups);

// One step of the schedule; `index` of a group's action is its bucket's (bucket_groups).
enum class Act {
  gather,        // issue the all-gather of a group's parameters (allocates the gathered buffer)
  wait_gather,   // block until that all-gather is done
  forward,       // forward of one unit
  backward,      // backward of one unit
  free_params,   // release a group's gathered parameters
  alloc_grads,   // a group's (padded) gradient buffer, zeroed
  reduce_grads,  // issue reduce-scatter (+ inter-node all-reduce) of a group's gradients
  finish_grads,  // wait for it, accumulate into the shard, release the buffers
};
struct Action {
  Act act;
  int index;  // group, or unit for forward/backward
};

// Writes an action list while tracking each group's state, so that a group is gathered once,
// waited for before use, never freed while its gather is in flight, and its reductions are kept
// one in flight behind the next group's backward (with overlap): the micro-batch schedule below
// and the pipelines' data-parallel schedule (model_parallel.hpp) are both written with it.
class ScheduleBuilder {
 public:
  ScheduleBuilder(const std::vector<ShardGroup>& groups, const EngineConfig& c);
  void want(int g, bool prefetch);  // issue g's gather unless issued (prefetch: within the limit)
  void ready(int g);                // g gathered and waited for
  void release(int g);              // free g's gathered parameters
  void grads(int g);                // g's gradient buffer, once until reduced
  void reduce(int g);               // issue g's reduction (finishing older ones past the overlap)
  void finish_all();                // finish every reduction in flight
  void add(Action a) { out_.push_back(a); }
  std::vector<Action> take();  // the actions written since the last take()

 private:
  void finish_oldest();
  const std::vector<ShardGroup>& groups_;
  const EngineConfig& c_;
  std::vector<Action> out_;
  std::vector<int> state_;  // 0 not gathered, 1 gather issued, 2 gathered and waited
  std::vector<bool> has_grads_;
  std::vector<int> pending_;  // groups with a reduction in flight, oldest first
  int in_flight_ = 0;
};

// The actions of one micro-batch's forward and backward under config `c`. tied_head: the head's
// passes read the embedding's wte and write its gradient (ModelSpec::tied), so the first group
// stays gathered from its forward to its backward (as FSDP's root unit) and its gradients are
// taken with the head's; an untied model (a llama) reshards it after its forward like any other.
std::vector<Action> micro_batch_schedule(const std::vector<ShardGroup>& groups, int units,
                                         const EngineConfig& c, bool tied_head = true);
// The plan of one action (sharded_plan.cpp): a gather's buffer and all-gather, a reduction's
// buffer, reduce-scatter and inter-replica all-reduce on comm stream 0, their waits, the passes.
// Gathered parameters and reduction outputs are comm_buffers, a group's unsharded gradients
// grads: allocated and freed as the engine does.
void plan_action(const Action& a, const std::vector<ShardGroup>& groups, const StateBytes& per,
                 const Placement& at, std::vector<PlanAction>& out);

// Human-readable schedule (for --dry-run and docs).
std::string describe_schedule(const std::vector<Action>& actions);

// One step of rank in.rank as it allocates, runs and moves bytes (src/sharded_plan.cpp): the
// engine on `part`, the rank's partition of the model (whole_model at tp 1; a tp rank's, sequence
// parallel or not, under tensor parallelism).
StepPlan plan_step(const PredictInput& in, const EngineConfig& c, const Partition& part);
StepPlan plan_step(const PredictInput& in, const EngineConfig& c);  // the whole model at tp 1
// Rank in.rank's shards of its partitions `parts`: its placement and the groups at its shard count
// (make_groups), what Shards holds; made once for a plan and read by each part of it (the
// advisor plans thousands of ranks, and making the groups builds every partition's tensor list).
struct RankShards {
  Placement at;
  std::vector<ShardGroup> groups;
};
RankShards rank_shards(const PredictInput& in, const EngineConfig& c,
                       const std::vector<Partition>& parts);
// What Shards holds for those partitions for the whole run, as setup allocations: parameters,
// gradients, AdamW state (or its offload), the sequence-parallel pack.
void plan_state(const PredictInput& in, const EngineConfig& c, const std::vector<Partition>& parts,
                const RankShards& shards, std::vector<PlanAction>& setup);
// Shards::update's plan for those partitions (sharded_plan.cpp).
void plan_shards_update(const PredictInput& in, const EngineConfig& c,
                        const std::vector<Partition>& parts, const RankShards& shards,
                        std::vector<PlanAction>& step);
// The whole model's partition on tp rank `tp_rank` of `tp` (the whole model at tp 1).
Partition tp_partition(const ModelSpec& model, int tp, int tp_rank, bool sequence_parallel);

// offload=optimizer's update (ZeRO-Offload, FSDP CPUOffload): host copies (MemTag::offload) of
// each shard's gradients and (fp32) parameters, kept for the run, and the step that copies every
// shard down on a comm stream of its own (comm_stream(3)), runs each shard's AdamW on the host as
// soon as its copy is in, and copies its parameters back behind the copies still going down. The
// sharded engine's groups and the pipelines' ZeRO-1 shard both update through it.
class HostUpdate {
 public:
  // One host copy per shard of `counts[i]` elements.
  HostUpdate(MemoryLedger& memory, DType grad_dtype, DType param_dtype,
             const std::vector<std::size_t>& counts);
  // One shard: its AdamW (state in host memory) and the device views it updates.
  struct Shard {
    AdamW* optimizer;
    BufferView params, grads;
  };
  // shards[i] through host copy i.
  void step(Context& ctx, int step, float clip, const std::vector<Shard>& shards);
  static constexpr int kStream = 3;  // comm_stream(3): the device<->host copies

 private:
  DType param_dtype_;
  std::vector<DeviceBuffer> grads_, params_;
};

// The plan of HostUpdate::step for shards of `counts[i]` elements (sharded_plan.cpp).
void plan_host_update(const std::vector<std::size_t>& counts, const TrainSpec& train,
                      std::vector<PlanAction>& out);

// The data-parallel axis of a rank's units: their parameters, gradients and AdamW state, sharded
// per group over the shard group (or replicated), the collectives that keep them and the update.
// The one implementation of a ZeRO-1/2/3 and FSDP step, and of dp=allreduce under tp and the
// pipelines. `models` are the rank's partitions (a pipeline stage's chunks, or one); their
// callers run the passes: the Engine below by micro_batch_schedule's actions, the pipelines by
// their own schedule (zero1 and allreduce: parameters and gradients replicated, reduced once per
// step). Under tp the gradient norm adds the tp ranks' shares and, with sequence parallelism, the
// owned parts of the replicated tensors' partial gradients are all-reduced over tp before the
// update (Megatron's sequence-parallel reduction); under a pipeline the norm adds the stages'.
// With expert parallelism (Partition::ep_size > 1): under allreduce the routed experts' gradients
// are all-reduced over ep_dp (the ranks holding the same experts in the other ep groups; none when
// ep = dp) and their squares added over the ep group; under zero1 the experts' groups are
// reduce-scattered over ep_dp and their updated shards all-gathered there, the others' over dp
// (make_groups, replica_layout), and every shard's squares added over dp.
class Shards {
 public:
  Shards(Context& ctx, const EngineConfig& c, std::vector<const StageModel*> models);
  ~Shards();
  Shards(const Shards&) = delete;
  Shards& operator=(const Shards&) = delete;

  // The schedule's groups (bucket_groups): what its actions' indices name.
  const std::vector<ShardGroup>& buckets() const { return buckets_; }
  // Unit u's parameters and gradients (ModelSpec's unit numbering), where they are held now:
  // params()[u] is empty while an FSDP unit is not gathered.
  const UnitPtrs& params() const { return param_ptrs_; }
  const UnitPtrs& grads() const { return grad_ptrs_; }
  // Elements [offset, offset + count) of partition `part`'s local gradients, inside one group:
  // the replicated gradients (zero1 and allreduce), or a group's unsharded ones between its
  // alloc_grads and its reduction (zero2 and fsdp).
  BufferView local_grads(int part, std::size_t offset, std::size_t count);

  void zero_grads(Context& ctx);
  // One of a micro-batch's actions other than forward and backward.
  void run(Context& ctx, const Action& a);
  // After the micro-batches: zero1's reductions, the sequence-parallel gradients over tp, the
  // norm, AdamW of this rank's shards, zero1/2's all-gathers of the updated shards.
  void update(Context& ctx, int step);

 private:
  // Parameters (initialised from the run's seed), gradients, AdamW state, offload's host copies.
  void allocate_state(Context& ctx);
  // Bucket b's actions, each over its runs in order.
  void issue_gather(Context& ctx, int b);
  void reduce_grads(Context& ctx, int b);
  void finish_grads(Context& ctx, int b);
  // ptrs[u] for the units of bucket b in `buffer` (its elements from its first run's offset).
  void point_bucket(int b, BufferView buffer, UnitPtrs& ptrs) const;
  void reduce_replicated_grads(Context& ctx);
  BufferView params_of(int g);
  BufferView grads_of(int g);
  const StageModel& model_of(int g) const { return *models_[std::size_t(groups_[g].part)]; }
  // ptrs[u] for the units of group g: their ranges in `group` (the group's elements from its
  // start).
  void point_units(int g, BufferView group, UnitPtrs& ptrs) const;
  // AdamW for group g's elements [begin, begin + count) of its partition: their weight-decay
  // segments, the fp32 master of bf16 parameters initialised from the run's seed.
  AdamW make_optimizer(Context& ctx, int g, std::size_t begin, std::size_t count,
                       MemTag state_tag) const;
  void reduce_partial_grads(Context& ctx);
  // This rank's share of the squared gradient norm: its shards' elements StageModel counts.
  double shard_sum_of_squares(Context& ctx);
  // The all-gathers of the updated shards (zero1, zero2): in place, or into comm buffers and
  // copied in (replica_.contiguous).
  void gather_updated_shards(Context& ctx);
  // Group g's shard group: the experts' or the others'; null with one shard.
  Group* shard_group_of(int g) const {
    return groups_[std::size_t(g)].experts ? expert_shard_group_ : shard_group_;
  }

  EngineConfig config_;
  std::vector<const StageModel*> models_;
  Group* shard_group_ = nullptr;    // more than one shard
  Group* replica_group_ = nullptr;  // hybrid's dp_inter_node, replicate's dp (more than one)
  Group* tp_group_ = nullptr;       // tp > 1: the norm's and the partial gradients' sums
  Group* pp_group_ = nullptr;       // pp > 1: the norm's sum
  // Expert parallelism (Partition::ep_size > 1). dp=allreduce: the ep group the experts' squares
  // are added over, the experts' replicas (ep_dp, when dp > ep), the slices all-reduced over dp
  // (all but the routed experts'), those all-reduced over ep_dp (the experts'). zero1: the
  // experts' groups' shard group (ep_dp, when dp > ep). Both: the experts' slices of the norm.
  Group* ep_group_ = nullptr;
  Group* expert_replica_group_ = nullptr;
  Group* expert_shard_group_ = nullptr;
  std::vector<ShardSlice> dense_slices_, expert_slices_, expert_norm_slices_;
  Placement at_;
  std::vector<ShardGroup> groups_, buckets_;
  std::vector<std::vector<int>> runs_;  // [bucket]: its groups
  std::vector<std::size_t> spans_;      // [bucket]: bucket_span, its buffers' elements
  std::vector<ShardSlice> norm_slices_, partial_slices_;
  DeviceBuffer partial_pack_;  // MemTag::comm_buffers: partial_slices_ packed for the all-reduce
  // Parameters: a full padded replica (zero1/2) or this rank's shards plus gathered buffers.
  // Parameters (and gathered copies) in the run's param dtype, gradients (and their reduction
  // buffers) in its reduce dtype; the fp32 master shards live in the optimizers. With one shard
  // and replicated gradients, a group's shard of the gradients is its replica.
  DType param_dtype_, grad_dtype_;
  DeviceBuffer replica_params_, replica_grads_;
  ReplicaLayout replica_;  // where each group starts in the replicas
  std::vector<DeviceBuffer> shard_params_, shard_grads_;
  std::vector<DeviceBuffer> gathered_, group_grads_;             // [bucket]
  std::vector<DeviceBuffer> reduced_;                            // [group]
  std::vector<std::optional<Event>> gather_done_, reduce_done_;  // [bucket]
  UnitPtrs param_ptrs_, grad_ptrs_;
  std::vector<AdamW> optimizers_;
  std::optional<HostUpdate> host_;  // offload=optimizer
  MemoryLedger* memory_ = nullptr;
};

// The engine on the rank's units of the model: a StageModel of `part` (the whole model at tp 1; a
// tp rank's partition as the data-parallel axis of tp, with the tp collectives `tp`), its passes
// one unit at a time, driven by the schedule, its state in Shards.
class Engine {
 public:
  Engine(Context& ctx, const EngineConfig& c);
  // cp, ep: the context- and expert-parallel exchanges of a part with cp_size (ep_size) > 1 (not
  // owned).
  Engine(Context& ctx, const EngineConfig& c, const Partition& part, TensorParallelComm* tp,
         ContextParallelComm* cp = nullptr, ExpertParallelComm* ep = nullptr);
  ~Engine();
  void train_step(Context& ctx, int step);

 private:
  void run_micro_batch(Context& ctx, const MicroBatch& mb);

  std::unique_ptr<StageModel> model_;  // the units this rank computes
  TensorParallelComm* tp_ = nullptr;   // tp > 1: the collectives inside the passes
  std::unique_ptr<Shards> shards_;
  std::vector<Action> schedule_;
  bool passes_only_ = false;  // no Shards action in schedule_: --cuda-graphs captures it
};

// A Strategy that runs the engine with a fixed configuration: the zero and fsdp plugins only map
// their options onto an EngineConfig.
class EngineStrategy final : public Strategy {
 public:
  EngineStrategy(std::string name, const EngineConfig& c) : name_(std::move(name)), config_(c) {}
  void validate(const MeshSpec& mesh, const TrainSpec&, const ModelSpec&) const override;
  StepPlan plan_step(const PredictInput& in) const override {
    return sharded::plan_step(in, config_);
  }
  void setup(Context& ctx) override { engine_.emplace(ctx, config_); }
  void train_step(Context& ctx, int step) override { engine_->train_step(ctx, step); }

 private:
  std::string name_;
  EngineConfig config_;
  std::optional<Engine> engine_;
};

}  // namespace strata::sharded
STRATA_EXPORT_END
