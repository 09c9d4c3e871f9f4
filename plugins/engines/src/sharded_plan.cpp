// The sharded engine's step as a plan (strata/step_plan.hpp): what Shards and the StageModel hold
// for the run, its micro-batch action list (micro_batch_schedule) with the buffers it takes and
// gives back and the collectives it issues on comm stream 0, then Engine::update().
#include <algorithm>
#include <sstream>

#include "strata/data_parallel.hpp"
#include "strata/engines/sharded.hpp"

namespace strata::sharded {
namespace {

// Events: a group's gather, its gradient reduction, its offload copy to the host.
int gather_event(int g) { return 3 * g; }
int reduce_event(int g) { return 3 * g + 1; }
int offload_event(int g) { return 3 * g + 2; }

}  // namespace

// Action a of bucket a.index (Shards::run): its runs' collectives one after another on stream 0,
// setting the bucket's event; its buffers of bucket_span elements, a reduction's per run.
void plan_action(const Action& a, const std::vector<ShardGroup>& groups, const StateBytes& per,
                 const Placement& at, std::vector<PlanAction>& out) {
  const int replicas = at.replicas, b = a.index;
  const double span = double(bucket_span(groups, b));
  bool comm = false;  // any run with more than one shard
  for (const ShardGroup& g : groups) comm = comm || (g.bucket == b && g.shards > 1);
  auto each_run = [&](auto&& f) {
    for (const ShardGroup& g : groups)
      if (g.bucket == b) f(g);
  };
  switch (a.act) {
    case Act::gather:  // a new buffer for the bucket (comm_buffers), then its runs' all-gathers
      out.push_back(plan_alloc(MemTag::comm_buffers, per.params * span));
      out.push_back(plan_fresh(per.params * span));
      each_run([&](const ShardGroup& g) {
        if (g.shards > 1)
          out.push_back(plan_comm(CommOp::all_gather, per.params * double(g.padded()),
                                  at.axis_of(g), 0, gather_event(b)));
      });
      break;
    case Act::wait_gather:
      if (comm) out.push_back(plan_wait(gather_event(b)));
      break;
    case Act::forward:  // of unit a.index
      out.push_back(plan_forward(a.index));
      break;
    case Act::backward:
      out.push_back(plan_backward(a.index));
      break;
    case Act::alloc_grads:  // the bucket's unsharded gradients
      out.push_back(plan_alloc(MemTag::grads, per.grads * span));
      out.push_back(plan_fresh(per.grads * span));
      break;
    case Act::reduce_grads:  // each run into a new buffer of the rank's chunk (comm_buffers)
      each_run([&](const ShardGroup& g) {
        out.push_back(plan_alloc(MemTag::comm_buffers, per.grads * double(g.chunk)));
        out.push_back(plan_fresh(per.grads * double(g.chunk)));
      });
      each_run([&](const ShardGroup& g) {
        if (g.shards > 1)
          out.push_back(plan_comm(CommOp::reduce_scatter, per.grads * double(g.padded()),
                                  at.axis_of(g), 0, reduce_event(b)));
        if (replicas > 1)
          out.push_back(plan_comm(CommOp::all_reduce, per.grads * double(g.chunk), at.replica_axis,
                                  0, reduce_event(b)));
      });
      break;
    case Act::finish_grads:  // added into the shards: the buffers go
      if (comm || replicas > 1) out.push_back(plan_wait(reduce_event(b)));
      out.push_back(plan_free(MemTag::grads, per.grads * span));
      each_run([&](const ShardGroup& g) {
        out.push_back(plan_free(MemTag::comm_buffers, per.grads * double(g.chunk)));
      });
      break;
    case Act::free_params:
      out.push_back(plan_free(MemTag::comm_buffers, per.params * span));
      break;
  }
}

RankShards rank_shards(const PredictInput& in, const EngineConfig& c,
                       const std::vector<Partition>& parts) {
  RankShards r{placement(in.mesh, in.rank, c), {}};
  r.groups = make_groups(in.model, parts, r.at.shards, c);
  return r;
}

void plan_state(const PredictInput& in, const EngineConfig& c, const std::vector<Partition>& parts,
                const RankShards& shards, std::vector<PlanAction>& setup) {
  const Placement& at = shards.at;
  const std::vector<ShardGroup>& groups = shards.groups;
  const double replica = double(replica_layout(groups).size);
  double chunks = 0, reduced = 0, valid = 0;
  for (const ShardGroup& g : groups) {
    chunks += double(g.chunk);
    if (c.shard_grads || g.shards > 1) reduced += double(g.chunk);
    valid += double(g.valid(at.index_of(g)));
  }
  // Bytes per element by precision (state_bytes_per_param): parameters, gradients, AdamW m and v
  // (and the fp32 master with bf16 parameters).
  const StateBytes per = state_bytes_per_param(in.train.precision);
  setup.push_back(plan_alloc(MemTag::params, per.params * (c.shard_params ? chunks : replica)));
  // This rank's reduced gradients, and zero1's and allreduce's full ones; one shard of those is
  // the full buffer itself.
  if (reduced > 0) setup.push_back(plan_alloc(MemTag::grads, per.grads * reduced));
  if (!c.shard_grads) setup.push_back(plan_alloc(MemTag::grads, per.grads * replica));
  // AdamW state: on the device, or in host memory with offload=optimizer, beside host copies of
  // this rank's gradient and parameter shards (every group's, so that the copies overlap the
  // steps).
  const MemTag state = c.offload_optimizer ? MemTag::offload : MemTag::optimizer;
  setup.push_back(plan_alloc(state, per.optimizer * valid));
  if (c.offload_optimizer)
    for (const ShardGroup& g : groups)
      setup.push_back(
          plan_alloc(MemTag::offload, (per.grads + per.params) * double(g.valid(at.index_of(g)))));
  // With sequence parallelism, the pack of the partial gradients' owned parts
  // (Shards::reduce_partial_grads).
  setup.push_back(
      plan_alloc(MemTag::comm_buffers, per.grads * partial_count(in.model, parts, groups, at)));
}

namespace {

// One micro-batch: new buffers written on the compute thread, gathers and reductions on stream 0.
std::vector<PlanAction> micro_batch_plan(const std::vector<ShardGroup>& groups, int units,
                                         const EngineConfig& c, bool tied_head,
                                         const StateBytes& per, const Placement& at) {
  std::vector<PlanAction> out;
  for (const Action& a : micro_batch_schedule(bucket_groups(groups), units, c, tied_head))
    plan_action(a, groups, per, at, out);
  return out;
}

}  // namespace

// HostUpdate::step: every shard down to the host on the offload stream at once, the host's AdamW
// of a shard once its copy is in, its parameters back up behind the copies going down.
void plan_host_update(const std::vector<std::size_t>& counts, const TrainSpec& train,
                      std::vector<PlanAction>& out) {
  const StateBytes per = state_bytes_per_param(train.precision);
  const double down = per.grads + (train.precision.param == DType::f32 ? per.params : 0.0);
  const int stream = HostUpdate::kStream;
  for (std::size_t g = 0; g < counts.size(); ++g)
    out.push_back(plan_copy(CommOp::d2h, down * double(counts[g]), stream, offload_event(int(g))));
  for (std::size_t g = 0; g < counts.size(); ++g) {
    out.push_back(plan_wait(offload_event(int(g))));
    out.push_back(plan_update(double(counts[g])));
    out.push_back(plan_copy(CommOp::h2d, per.params * double(counts[g]), stream));
  }
  out.push_back(plan_wait());
}

StepPlan plan_step(const PredictInput& in, const EngineConfig& c) {
  return plan_step(in, c, whole_model(in.model));
}

namespace {

// Shards::gather_updated_shards: every group's all-gather over its shard group; in a contiguous
// replica through two comm buffers of the largest padded group, alternating.
void plan_gather_updated_shards(const std::vector<ShardGroup>& groups, const Placement& at,
                                const StateBytes& per, std::vector<PlanAction>& step) {
  const bool through_buffers = replica_layout(groups).contiguous;
  double most = 0;
  int gathered = 0;
  for (const ShardGroup& g : groups)
    if (g.shards > 1) most = std::max(most, double(g.padded())), ++gathered;
  const int buffers = through_buffers ? std::min(2, gathered) : 0;
  for (int k = 0; k < buffers; ++k) {
    step.push_back(plan_alloc(MemTag::comm_buffers, per.params * most));
    step.push_back(plan_fresh(per.params * most));
  }
  for (const ShardGroup& g : groups)
    if (g.shards > 1)
      step.push_back(plan_comm(CommOp::all_gather, per.params * double(g.padded()), at.axis_of(g)));
  for (int k = 0; k < buffers; ++k)
    step.push_back(plan_free(MemTag::comm_buffers, per.params * most));
}

}  // namespace

// Shards::update(): zero1's reduce-scatters (allreduce's all-reduces), the sequence-parallel
// partial gradients over tp, the norm (over the shards, tp and pp), AdamW of this rank's shards
// (on the host with offload), zero1/2's all-gathers of the updated shards; each waited for at once.
void plan_shards_update(const PredictInput& in, const EngineConfig& c,
                        const std::vector<Partition>& parts, const RankShards& shards,
                        std::vector<PlanAction>& step) {
  const Placement& at = shards.at;
  const int n = at.shards;
  const std::vector<ShardGroup>& groups = shards.groups;
  const StateBytes per = state_bytes_per_param(in.train.precision);
  auto valid = [&](const ShardGroup& g) { return double(g.valid(at.index_of(g))); };
  // Expert parallelism: dp=allreduce of all but the routed experts, theirs over their replicas;
  // zero1's groups (the experts' over ep_dp) below.
  const bool ep = parts[0].ep_size > 1;
  if (ep && c.replicate) {
    std::vector<std::vector<LocalTensor>> tensors;
    for (const Partition& part : parts)
      tensors.push_back(StageModel::local_tensors(in.model, part));
    auto all_reduce = [&](bool experts, Axis over) {
      for (const ShardSlice& s : owned_slices(tensors, groups, at, [&](const LocalTensor& t) {
             return (t.shard == ShardKind::experts) == experts;
           }))
        step.push_back(plan_comm(CommOp::all_reduce, per.grads * double(s.count), over));
    };
    if (at.replicas > 1) all_reduce(false, at.replica_axis);
    if (in.mesh.dp * in.mesh.cp > in.mesh.ep) all_reduce(true, Axis::ep_dp);  // ep_dp > 1
  } else if (!c.shard_grads)
    for (const ShardGroup& g : groups) {
      if (g.shards > 1)
        step.push_back(
            plan_comm(CommOp::reduce_scatter, per.grads * double(g.padded()), at.axis_of(g)));
      if (at.replicas > 1)
        step.push_back(plan_comm(CommOp::all_reduce, per.grads * valid(g), at.replica_axis));
    }
  if (const double partial = partial_count(in.model, parts, groups, at); partial > 0)
    step.push_back(plan_comm(CommOp::all_reduce, per.grads * partial, Axis::tp));
  if (in.train.grad_clip > 0) {
    if (n > 1) step.push_back(plan_comm(CommOp::all_reduce, 8, at.shard_axis));
    if (in.mesh.tp > 1) step.push_back(plan_comm(CommOp::all_reduce, 8, Axis::tp));
    if (in.mesh.pp > 1) step.push_back(plan_comm(CommOp::all_reduce, 8, Axis::pp));
    if (ep && c.replicate)  // the experts' squares
      step.push_back(plan_comm(CommOp::all_reduce, 8, Axis::ep));
  }
  if (c.offload_optimizer) {
    std::vector<std::size_t> counts;
    for (const ShardGroup& g : groups) counts.push_back(std::size_t(valid(g)));
    plan_host_update(counts, in.train, step);
  } else
    for (const ShardGroup& g : groups) step.push_back(plan_update(valid(g)));
  if (n > 1 && !c.shard_params) plan_gather_updated_shards(groups, at, per, step);
}

namespace {

// What the engine holds for the run on `part`: the StageModel's one activation slot and its copy
// of the micro-batch's tokens beside the core's micro-batch, Shards' state, and under tp the bf16
// tp comm buffer.
void plan_setup(const PredictInput& in, const EngineConfig& c, const Partition& part,
                const RankShards& shards, std::vector<PlanAction>& setup) {
  const int B = in.train.micro_batch;
  plan_model_slots(in, part, 1, setup);
  setup.push_back(plan_alloc(MemTag::workspace, double(batch_workspace_bytes(in.train, in.model))));
  plan_state(in, c, {part}, shards, setup);
  setup.push_back(plan_alloc(
      MemTag::comm_buffers,
      double(StageModel::tp_comm_buffer_bytes(in.model, B, part, in.train.precision.tp_comm))));
}

std::string plan_notes(const std::vector<ShardGroup>& groups, const Placement& at,
                       const Partition& part, const EngineConfig& c, double local) {
  double padded = 0;
  for (const ShardGroup& g : groups) padded += double(g.padded());
  std::ostringstream notes;
  notes << groups.size() << " group(s) over " << at.shards << " shard(s); padding "
        << (padded - local) << " elements";
  if (part.ep_size > 1)
    notes << "; experts over ep=" << part.ep_size << ", their runs over " << at.expert_shards
          << " shard(s) of ep_dp";
  if (part.tp_size > 1)
    notes << "; tp rank " << part.tp_rank << " of " << part.tp_size
          << (part.sequence_parallel ? " with sequence parallelism" : "");
  if (c.offload_optimizer) notes << "; optimizer state in host memory (offload)";
  return notes.str();
}

}  // namespace

StepPlan plan_step(const PredictInput& in, const EngineConfig& c, const Partition& part) {
  const RankShards shards = rank_shards(in, c, {part});
  const Placement& at = shards.at;
  const std::vector<ShardGroup>& groups = shards.groups;
  const auto units = StageModel::unit_ranges(in.model, part);
  const StateBytes per = state_bytes_per_param(in.train.precision);
  StepPlan plan;
  plan_setup(in, c, part, shards, plan.setup);
  plan.sequence_parallel = part.sequence_parallel && part.tp_size > 1;
  plan.expert_parallel = part.ep_size;
  plan.context_parallel = part.cp_size;
  plan.context_attention = part.cp_attention;
  plan.micro_batch = micro_batch_plan(groups, int(units.size()), c, in.model.tied(), per, at);
  plan.micro_batches = in.train.micro_steps(in.mesh);
  plan_shards_update(in, c, {part}, shards, plan.step);
  double local = 0;
  for (const auto& u : units) local += double(u.second);
  plan.notes = plan_notes(groups, at, part, c, local);
  return plan;
}

}  // namespace strata::sharded
