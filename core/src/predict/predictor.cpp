// predict_step_time (predictor.hpp): the calibrated durations of a query (Costs) and the replay of
// the strategy's step plans with them.
#include "predict/predictor.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "predict/costs.hpp"
#include "provenance/node_peak.hpp"
#include "strata/stage_model.hpp"

namespace strata {
namespace time_model {

void add_tensor_parallel(Costs& c, bool measured);
void add_expert_parallel(Costs& c, int ep);
void add_context_parallel(Costs& c, int cp);
void add_weight_passes(Costs& c, const ComputeEntry& e);

Costs make_costs(const MachineProfile& profile, const StepQuery& q) {
  Costs c{profile, q, {}, {}, {}, {}, {}, {}, 0, 0, 0, 1, 0, {}, {}};
  std::string how;
  const int on_host = q.ranks_on_host > 0 ? q.ranks_on_host : q.mesh.ranks_per_node;
  const auto e = find_compute(profile, q.model, q.train.micro_batch, device_name(q.train.device),
                              profile_precision(q.train), q.threads, on_host, &how, q.mesh.tp);
  if (!e)
    throw NoTimeModel{"the profile has no compute entry for this model shape on " +
                      std::string(device_name(q.train.device)) + " " + profile_precision(q.train) +
                      " (calibrate it: runner --calibrate)"};
  c.note(how);
  const double recompute = q.train.recompute == Recompute::full ? e->block_recompute_full_s
                           : q.train.recompute == Recompute::selective
                               ? e->block_recompute_selective_s
                               : 0.0;
  c.fwd.push_back(e->embedding_forward_s), c.bwd.push_back(e->embedding_backward_s);
  for (int l = 0; l < q.model.layers; ++l)
    c.fwd.push_back(e->block_forward_s), c.bwd.push_back(e->block_backward_s + recompute);
  c.fwd.push_back(e->head_forward_s), c.bwd.push_back(e->head_backward_s);
  c.opt_per_param = e->optimizer_s_per_param;
  c.fresh_per_byte = e->fresh_memory_s_per_byte;
  c.copy_per_byte = e->copy_s_per_byte;
  c.peak_shares = q.train.device == Device::cpu ? on_host : e->ranks_per_node;
  c.contention = q.train.device == Device::cpu ? 1.0 : 0.0;
  // Context parallelism (Ulysses): every pass on seq / cp of each sequence's tokens, the
  // attention over whole sequences on 1 / cp of the heads, so 1 / cp of the profile's time (the
  // same achieved rate on fewer rows), before tp splits them; its exchanges after.
  for (double& t : c.fwd) t /= q.mesh.cp;
  for (double& t : c.bwd) t /= q.mesh.cp;
  if (q.mesh.tp > 1) add_tensor_parallel(c, e->tp == q.mesh.tp);
  if (q.mesh.cp > 1) add_context_parallel(c, q.mesh.cp);
  if (q.plans.front().expert_parallel > 1) add_expert_parallel(c, q.plans.front().expert_parallel);
  add_weight_passes(c, *e);
  return c;
}

// A block's split backward: the profile's measured input and weight passes, their sum's excess
// over the unsplit backward added to the input pass; without them the weight pass is its weight
// gradients' FLOP share (ModelSpec::block_weight_grad_share) of the backward. Over cp, and over
// tp unless the entry holds a tp rank's own passes, as the passes are (their ranks split the
// GEMMs).
void add_weight_passes(Costs& c, const ComputeEntry& e) {
  const bool measured = e.block_input_backward_s > 0 && e.block_weight_backward_s > 0;
  const double ways = c.q.mesh.cp * (e.tp == c.q.mesh.tp ? 1 : c.q.mesh.tp);
  const double weight = measured ? e.block_weight_backward_s
                                 : e.block_backward_s * c.q.model.block_weight_grad_share();
  const double excess =
      measured ? e.block_input_backward_s + e.block_weight_backward_s - e.block_backward_s : 0.0;
  c.inp = c.bwd;
  c.wgt.assign(c.bwd.size(), 0.0);
  for (int l = 1; l <= c.q.model.layers; ++l) {
    const std::size_t u = std::size_t(l);
    c.wgt[u] = weight / ways;
    c.inp[u] = c.bwd[u] - c.wgt[u] + excess / ways;
  }
}

// Context parallelism's exchanges: each block's all-to-alls (context_parallel_collectives) on the
// cp group, on the compute thread inside its passes (its compute share: make_costs).
void add_context_parallel(Costs& c, int cp) {
  const StepQuery& q = c.q;
  const ContextAttention attention = q.plans.front().context_attention;
  c.tp_fwd.resize(c.fwd.size(), 0.0), c.tp_bwd.resize(c.bwd.size(), 0.0);
  for (std::size_t u = 0; u < c.fwd.size(); ++u)
    for (const bool backward : {false, true})
      for (const PassCollective& p : context_parallel_collectives(
               q.model, q.train.micro_batch, int(u), backward, q.mesh.tp, cp, attention,
               q.train.recompute, q.train.precision.param, q.train.device)) {
        if (p.op == CommOp::recv) continue;  // a ring pass's transfer: charged once, as its send
        const double t = c.comm(p.op, p.bytes, Axis::cp);
        (backward ? c.bwd : c.fwd)[u] += t;
        (backward ? c.tp_bwd : c.tp_fwd)[u] += t;
      }
  c.note(attention == ContextAttention::ring
             ? "cp: 1 / cp of each pass, then each block's ring passes inside its passes, not "
               "overlapped with its attention (an upper bound)"
             : "cp: 1 / cp of each pass, then each block's Ulysses all-to-alls inside its passes");
}

// Expert parallelism: each moe block's exchanges (expert_parallel_collectives, at a uniform
// routing) on the ep group, on the compute thread inside its passes; the experts'
// GEMMs take the profile's time (at a uniform routing a rank's experts take as many rows as one
// rank's tokens route).
void add_expert_parallel(Costs& c, int ep) {
  const StepQuery& q = c.q;
  c.tp_fwd.resize(c.fwd.size(), 0.0), c.tp_bwd.resize(c.bwd.size(), 0.0);
  for (std::size_t u = 0; u < c.fwd.size(); ++u)
    for (const bool backward : {false, true})
      for (const PassCollective& p :
           expert_parallel_collectives(q.model, q.train.micro_batch, int(u), backward, ep,
                                       q.mesh.cp, q.train.recompute, q.train.precision.param)) {
        const double t = c.comm(p.op, p.bytes, Axis::ep);
        (backward ? c.bwd : c.fwd)[u] += t;
        (backward ? c.tp_bwd : c.tp_fwd)[u] += t;
      }
  c.note("ep: each moe block's all-to-alls at a uniform routing, inside its passes");
}

// The tp group's collectives inside each unit's passes of one micro-batch, as StageModel issues
// them (tensor_parallel_collectives, strata/stage_model.hpp), on the compute thread, not
// overlapped: sp off, all-reduces of a block's attention and MLP outputs and input gradients, the
// embedding's output, the head's input gradient; sp on (Megatron's sequence parallelism),
// all-gathers before and reduce-scatters after each tp region; both, the cross-entropy's
// statistics.
void tp_collectives(Costs& c, bool sp, std::vector<double>& fwd, std::vector<double>& bwd) {
  const StepQuery& q = c.q;
  fwd.assign(c.fwd.size(), 0), bwd.assign(c.bwd.size(), 0);
  for (std::size_t u = 0; u < c.fwd.size(); ++u)
    for (const bool backward : {false, true})
      for (const PassCollective& p :
           tensor_parallel_collectives(q.model, q.train.micro_batch, int(u), backward, q.mesh.tp,
                                       sp, q.mesh.cp, q.train.recompute, q.train.precision.tp_comm))
        (backward ? bwd : fwd)[u] += c.comm(p.op, p.bytes, Axis::tp);
}

// Tensor parallelism (Megatron, as StageModel splits the units): every GEMM of a block and the
// vocab-parallel LM head run on 1/tp of their columns or rows, so those passes take 1/tp of the
// profile's time (the same achieved rate on smaller GEMMs: optimistic for narrow shards; under sp
// the LayerNorms on 1/tp of the tokens are not counted faster); the embedding's lookup is not
// split. Then the tp collectives (tp_collectives). `measured`: the profile has the tp ranks' own
// passes (--calibrate on a tp mesh, sp off), all-reduces included: they stand as they are, and
// the all-reduces' calibrated times only say how much of them is comm; under sp those
// all-reduces are swapped for sp's collectives.
void add_tensor_parallel(Costs& c, bool measured) {
  const StepQuery& q = c.q;
  const bool sp = q.plans.front().sequence_parallel;
  const std::size_t head = c.fwd.size() - 1;
  tp_collectives(c, sp, c.tp_fwd, c.tp_bwd);
  if (sp) c.note("sp: the tp collectives as all-gathers and reduce-scatters");
  if (measured) {  // the calibrated tp passes hold their all-reduces already
    c.note("tp: the profile's tp " + std::to_string(q.mesh.tp) +
           " passes (their all-reduces included)");
    if (!sp) return;
    std::vector<double> ar_fwd, ar_bwd;
    tp_collectives(c, false, ar_fwd, ar_bwd);
    for (std::size_t u = 0; u <= head; ++u)
      c.fwd[u] += c.tp_fwd[u] - ar_fwd[u], c.bwd[u] += c.tp_bwd[u] - ar_bwd[u];
    return;
  }
  for (std::size_t u = 1; u <= head; ++u) c.fwd[u] /= q.mesh.tp, c.bwd[u] /= q.mesh.tp;
  for (std::size_t u = 0; u <= head; ++u) c.fwd[u] += c.tp_fwd[u], c.bwd[u] += c.tp_bwd[u];
  c.note("tp: GEMM passes at 1/" + std::to_string(q.mesh.tp) + " of the profile's time");
}

}  // namespace time_model

using namespace time_model;

std::string profile_precision(const TrainSpec& train) {
  return train.precision.mixed() ? "bf16" : "fp32";
}

std::vector<int> step_query_ranks(const MeshSpec& mesh) { return Mesh(mesh).group(Axis::pp, 0); }

StepQuery step_query(const std::string& name, const Strategy& strategy, const MeshSpec& mesh,
                     const ModelSpec& model, const TrainSpec& train, int threads,
                     int ranks_on_host) {
  StepQuery q{name, mesh, model, train, threads, ranks_on_host, {}};
  for (int rank : step_query_ranks(mesh))
    q.plans.push_back(strategy.plan_step(PredictInput{mesh, model, train, rank}));
  return q;
}

StepTime predict_step_time(const MachineProfile& profile, const StepQuery& q) {
  StepTime t;
  int peak_shares = q.mesh.ranks_per_node;
  try {
    if (q.plans.empty()) throw NoTimeModel{"no step plan was asked of '" + q.strategy + "'"};
    for (const StepPlan& p : q.plans)
      if (p.empty())
        throw NoTimeModel{!p.unmodelled.empty()
                              ? p.unmodelled
                              : "strategy '" + q.strategy + "' gives no step plan (plan_step)"};
    Costs c = make_costs(profile, q);
    peak_shares = c.peak_shares;
    t = replay_plans(c, q.plans, Mesh(q.mesh).group(Axis::pp, 0));
    std::ostringstream notes;
    for (std::size_t i = 0; i < c.notes.size(); ++i) notes << (i ? "; " : "") << c.notes[i];
    t.notes = notes.str();
  } catch (const NoTimeModel& e) {
    StepTime none;
    none.exposed_comm_s = 0;
    none.why = "no time model: " + e.why;
    return none;
  }
  t.modelled = true;
  const double tokens = double(q.train.global_batch) * q.model.seq;
  t.tokens_per_s = t.step_s > 0 ? tokens / t.step_s : 0;
  if (profile.node_peak_flops > 0)
    t.mfu = model_flops_utilization(
        model_flops_per_rank(t.tokens_per_s, q.model.flops_per_token(), q.mesh.world()),
        profile.node_peak_flops / peak_shares);
  return t;
}

}  // namespace strata
