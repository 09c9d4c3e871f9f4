// The model-parallel engine's step as a plan (strata/step_plan.hpp): what the rank holds for the
// run, the pipeline schedule's actions with their receives and sends, then what Engine::train_step
// does after the schedule.
#include <sstream>
#include <tuple>
#include <utility>

#include "rank_plan.hpp"
#include "strata/data_parallel.hpp"
#include "strata/engines/model_parallel.hpp"

namespace strata::mp {
namespace {

// Tags pairing a send with its recv: chunk k's input activation and its output gradient of one
// micro-batch, and the tied embedding's gradient.
int activation_tag(int micro, int k, int K) { return 2 * (micro * K + k); }
int gradient_tag(int micro, int k, int K) { return 2 * (micro * K + k) + 1; }
constexpr int kTiedTag = -1;

// The schedule of stage me.pp (the rank's plan): a forward receives its input from the previous
// chunk's stage and sends its output on; a backward receives its output's gradient and sends its
// input's back (none of it where the neighbour chunk is the rank's own: zb-v's turn). Around each
// unit pass, the data-parallel axis's actions (dp_schedule_of); `end` collects the ones after the
// schedule and the tied exchange.
void schedule_plan(const PredictInput& in, const MpConfig& cfg, const MeshCoord& me,
                   const Plan& rank, const sharded::RankShards& shards,
                   const std::vector<std::pair<int, int>>& units, bool sp,
                   std::vector<PlanAction>& out, std::vector<PlanAction>& end) {
  const int K = rank.K;
  // Every boundary carries one micro-batch's [B, T, C] residual stream or its gradient (sp: this
  // rank's token rows of it; cp: its slice of each sequence) in the tp comm dtype.
  Partition second{units[1].first, units[1].second, in.mesh.tp, me.tp, sp};
  second.cp_size = context_parallel_size(cfg, in.mesh);  // seq / cp tokens of each sequence
  const double bytes = double(StageModel::boundary_count(in.model, in.train.micro_batch, second)) *
                       double(dtype_size(in.train.precision.tp_comm));
  const Mesh mesh(in.mesh);
  auto stage_of = [&](int k) { return mesh.rank_of(me, rank.holder(k)); };
  const sharded::Placement& at = shards.at;
  const std::vector<sharded::ShardGroup>& groups = shards.groups;
  const StateBytes per = state_bytes_per_param(in.train.precision);
  const std::vector<pp::PipeAction>& actions = rank.actions;
  const DpSchedule dp = dp_schedule_of(rank, sharded::bucket_groups(groups), cfg, in.model);
  // Room for about every action at once (a pass's dp actions take up to four plan actions each):
  // a 175B stage's plan holds thousands, which growing by doubling copied over and over.
  std::size_t bound = out.size() + 2 * actions.size();
  for (const UnitPassActions& around : dp.unit_passes)
    bound += 1 + 4 * (around.before.size() + around.after.size());
  out.reserve(bound);
  auto pass = [&](const UnitPassActions& around, const PlanAction& compute) {
    for (const sharded::Action& x : around.before) sharded::plan_action(x, groups, per, at, out);
    out.push_back(compute);
    for (const sharded::Action& x : around.after) sharded::plan_action(x, groups, per, at, out);
  };
  for (std::size_t i = 0; i < actions.size(); ++i) {
    const pp::PipeAction& a = actions[i];
    const int k = rank.global[std::size_t(a.chunk)];
    const auto [first, last] = units[std::size_t(k)];
    if (a.forward()) {
      if (rank.remote(k, -1))
        out.push_back(plan_recv(stage_of(k - 1), activation_tag(a.micro, k, K), bytes));
      for (int u = first; u <= last; ++u)
        pass(dp.passes(i)[std::size_t(u - first)], plan_forward(u));
      if (rank.remote(k, +1))
        out.push_back(plan_send(stage_of(k + 1), activation_tag(a.micro, k + 1, K), bytes));
    } else if (a.pass == pp::PipePass::weight) {  // no transfer: nobody waits for it
      for (int u = last; u >= first; --u) pass(dp.passes(i)[std::size_t(last - u)], plan_weight(u));
    } else {
      if (rank.remote(k, +1))
        out.push_back(plan_recv(stage_of(k + 1), gradient_tag(a.micro, k, K), bytes));
      for (int u = last; u >= first; --u)
        pass(dp.passes(i)[std::size_t(last - u)], plan_backward(u));
      if (rank.remote(k, -1))
        out.push_back(plan_send(stage_of(k - 1), gradient_tag(a.micro, k - 1, K), bytes));
    }
  }
  for (const sharded::Action& x : dp.end) sharded::plan_action(x, groups, per, at, end);
}

// What the rank holds for the run: per chunk a StageModel whose pool keeps as many activation
// slots (each with its copy of the tokens) as the schedule has micro-batches in flight through
// it, its tp comm buffer and, where a boundary tensor is cast (boundary_casts), a send buffer per
// slot (BoundaryBuffers) and the one receive buffer; beside them the core's micro-batch, Shards'
// state and the tied embedding's gradient on its way between the first and the last stage.
void plan_setup(const PredictInput& in, const MpConfig& cfg, const Plan& plan,
                const sharded::RankShards& shards, std::vector<PlanAction>& setup) {
  const int B = in.train.micro_batch;
  const DType tp_comm = in.train.precision.tp_comm;
  setup.push_back(plan_alloc(MemTag::workspace, double(batch_workspace_bytes(in.train, in.model))));
  auto boundary = [&](const Partition& part) {
    return double(StageModel::boundary_count(in.model, B, part)) * double(dtype_size(tp_comm));
  };
  for (int c = 0; c < plan.v; ++c) {
    const Partition& part = plan.parts[std::size_t(c)];
    const int in_flight = pp::max_in_flight(plan.actions, c);
    plan_model_slots(in, part, in_flight, setup, pp::splits_backward(cfg.schedule));
    setup.push_back(plan_alloc(MemTag::comm_buffers, double(StageModel::tp_comm_buffer_bytes(
                                                         in.model, B, part, tp_comm))));
    if (plan.K > 1 && boundary_casts(plan, c, in.train.precision).send)
      setup.push_back(plan_alloc(MemTag::comm_buffers, in_flight * boundary(part)));
  }
  if (receives_cast(plan, in.train.precision))
    setup.push_back(plan_alloc(MemTag::comm_buffers, boundary(plan.parts[0])));
  sharded::plan_state(in, dp_axis_config(cfg), plan.parts, shards, setup);
  if (plan.tied_exchange() && !plan.tied_local())
    setup.push_back(
        plan_alloc(MemTag::comm_buffers, double(in.model.vocab / in.mesh.tp) * in.model.hidden *
                                             state_bytes_per_param(in.train.precision).grads));
}

// The rank's stage and units, micro-batches, tp and what dp shards.
std::string plan_notes(const Plan& plan, const PredictInput& in, const MpConfig& cfg) {
  std::ostringstream notes;
  notes << cfg.strategy << ": stage " << plan.stage << " of " << plan.P << " holds ";
  for (std::size_t c = 0; c < plan.parts.size(); ++c)
    notes << (c ? " | " : "") << "units " << plan.parts[c].first_unit << "-"
          << plan.parts[c].last_unit;
  notes << "; " << plan.m << " micro-batches; tp=" << in.mesh.tp
        << (cfg.sequence_parallel && in.mesh.tp > 1 ? " with sequence parallelism" : "")
        << (in.mesh.cp > 1 ? "; each sequence over cp=" + std::to_string(in.mesh.cp) +
                                 (cfg.context_attention == ContextAttention::ring
                                      ? " (ring attention: key-value blocks passed around cp)"
                                      : " (Ulysses all-to-alls around the attention)")
                           : std::string())
        << (cfg.dp != DpMode::allreduce && in.mesh.replicas() > 1
                ? std::string("; ") + dp_mode_name(cfg.dp) + " over dp" +
                      (in.mesh.cp > 1 ? " x cp" : "") +
                      (cfg.dp == DpMode::zero1 ? "" : ", reduced once per step")
                : std::string())
        << (cfg.expert_parallel && in.mesh.ep > 1
                ? "; experts over ep=" + std::to_string(in.mesh.ep) + ": " +
                      std::to_string(in.model.experts / in.mesh.ep) + " of each block's " +
                      std::to_string(in.model.experts) + " here" +
                      (in.mesh.dp > in.mesh.ep
                           ? ", replicated over " + std::to_string(in.mesh.dp / in.mesh.ep) +
                                 " ep groups"
                           : std::string()) +
                      (in.mesh.cp > 1 ? ", their gradients reduced over cp too" : "")
                : std::string())
        << "; recompute " << recompute_name(in.train.recompute);
  return notes.str();
}

// The schedule's bubble with equal stages and free transfers: (p - 1) / (m + p - 1) (/ v
// interleaved) whatever the pass costs; a split backward's depends on the weight passes' share,
// the model's (f : b = 1 : 2, w that share of b), the simulation's mean idle time. Every stage's
// plan carries it and a prediction plans the stages in a row, so the last simulation is kept (the
// advisor simulated each p-stage pipeline p times, half its time on GPT-3 175B's meshes).
double ideal_bubble_fraction(const MpConfig& cfg, const ModelSpec& model, const Plan& rank) {
  if (!pp::splits_backward(cfg.schedule))
    return pp::predicted_bubble_fraction(cfg.schedule, rank.P, rank.m, rank.v);
  using Key = std::tuple<pp::PipeSchedule, int, int, int, double>;
  thread_local std::pair<Key, double> last{Key{cfg.schedule, 0, 0, 0, 0.0}, 0.0};
  const Key key{cfg.schedule, rank.P, rank.m, rank.v, model.block_weight_grad_share()};
  if (last.first != key)
    last = {key, pp::simulate_pipeline(cfg.schedule, rank.P, rank.m, rank.v,
                                       {1.0, 2.0, 2.0 * std::get<4>(key)})
                     .bubble_fraction()};
  return last.second;
}

}  // namespace

StepPlan plan_step(const PredictInput& in, const MpConfig& cfg) {
  StepPlan plan;
  const MeshCoord me = mesh_coord(in.mesh, in.rank);
  plan.sequence_parallel = cfg.sequence_parallel && in.mesh.tp > 1;
  plan.expert_parallel = cfg.expert_parallel ? in.mesh.ep : 1;
  plan.context_parallel = context_parallel_size(cfg, in.mesh);
  plan.context_attention = cfg.context_attention;
  if (on_sharded_engine(cfg, in.mesh)) {  // the sharded engine on the tp (and cp) partition
    plan =
        sharded::plan_step(in, dp_axis_config(cfg), sharded_partition(in.mesh, me, in.model, cfg));
    plan.notes =
        cfg.strategy + ": dp=" + dp_mode_name(cfg.dp) + " on the sharded engine; " + plan.notes;
    return plan;
  }
  const Plan rank = make_plan(in.mesh, me, in.model, in.train, cfg);
  const sharded::RankShards shards = sharded::rank_shards(in, dp_axis_config(cfg), rank.parts);
  plan_setup(in, cfg, rank, shards, plan.setup);
  plan.notes = plan_notes(rank, in, cfg);
  if (cfg.pipeline) plan.bubble_fraction = ideal_bubble_fraction(cfg, in.model, rank);
  const auto units = chunk_units(in.model, rank.K, cfg.stage_layers);
  std::vector<PlanAction>& step = plan.step;
  std::vector<PlanAction> end;  // the data-parallel axis's after the tied exchange
  const bool reduces_in_schedule = cfg.dp == DpMode::zero2 || cfg.dp == DpMode::fsdp;
  if (rank.P > 1 || reduces_in_schedule) {
    schedule_plan(in, cfg, me, rank, shards, units, plan.sequence_parallel, step, end);
    plan.split_backward = pp::splits_backward(cfg.schedule);  // its weight actions are there
  } else {  // tp alone (or one stage): every micro-batch through the whole model
    plan_forward_backward(ParamLayout::of(in.model)->num_units(), plan.micro_batch);
    plan.micro_batches = in.train.micro_steps(in.mesh);
  }
  // After the schedule (Engine::train_step): the tied embedding's gradient between the first and
  // the last stage, then the data-parallel axis's update over the rank's chunks. Room for them
  // first: a 175B stage's schedule fills `step` to its reserve, and growing it copied it whole.
  std::vector<PlanAction> update;
  sharded::plan_shards_update(in, dp_axis_config(cfg), rank.parts, shards, update);
  step.reserve(step.size() + 2 + end.size() + update.size());
  if (rank.tied_exchange() && !rank.tied_local()) {  // in a V a local sum
    const int peer = Mesh(in.mesh).rank_of(me, rank.tied_peer());
    const double wte = double(in.model.vocab / in.mesh.tp) * in.model.hidden *
                       state_bytes_per_param(in.train.precision).grads;
    step.push_back(plan_send(peer, kTiedTag, wte));
    step.push_back(plan_recv(peer, kTiedTag, wte));
  }
  step.insert(step.end(), end.begin(), end.end());
  step.insert(step.end(), update.begin(), update.end());
  return plan;
}

}  // namespace strata::mp
