// predict_step_time (predictor.hpp): per-strategy replays of one step with calibrated durations.
#include "predict/predictor.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "predict/costs.hpp"
#include "strata/data_parallel.hpp"
#include "strata/engines/model_parallel.hpp"
#include "strata/engines/pipe_schedule.hpp"
#include "strata/engines/sharded.hpp"
#include "strata/stage_model.hpp"

namespace strata {
namespace time_model {

void add_tensor_parallel(Costs& c, bool measured);

Costs make_costs(const MachineProfile& profile, const StepQuery& q) {
  Costs c{profile, q, {}, {}, {}, {}, 0, 0, 0, 1, 0, {}};
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
  if (q.mesh.tp > 1) add_tensor_parallel(c, e->tp == q.mesh.tp);
  return c;
}

// Tensor parallelism (Megatron, as StageModel splits the units; sp off): every GEMM of a block and
// the vocab-parallel LM head run on 1/tp of their columns or rows, so those passes take 1/tp of the
// profile's time (the same achieved rate on smaller GEMMs: optimistic for narrow shards); the
// embedding's lookup is not split. Then the tp group's all-reduces of one [B*T, C] fp32 activation
// (add_tensor_parallel_bytes), on the compute thread, not overlapped: a block's attention and MLP
// outputs in forward (2) and their input gradients in backward (2, and the attention's again when
// a full recompute repeats the forward), the embedding's output, the head's input gradient and
// the cross-entropy's row max and (sum of exp, target) pairs. `measured`: the profile has the tp
// ranks' own passes (--calibrate on a tp mesh), all-reduces included: they stand as they are, and
// the all-reduces' calibrated times only say how much of them is comm.
void add_tensor_parallel(Costs& c, bool measured) {
  const StepQuery& q = c.q;
  const double tp = q.mesh.tp, tokens = double(q.train.micro_batch) * q.model.seq;
  const double E = tokens * q.model.hidden * sizeof(float);
  const double ar = c.comm("all_reduce", E, Axis::tp);
  const std::size_t head = c.fwd.size() - 1;
  c.tp_fwd.assign(c.fwd.size(), 0), c.tp_bwd.assign(c.bwd.size(), 0);
  if (!measured)
    for (std::size_t u = 1; u <= head; ++u) c.fwd[u] /= tp, c.bwd[u] /= tp;
  c.tp_fwd[0] = ar;
  for (std::size_t u = 1; u < head; ++u)
    c.tp_fwd[u] = 2 * ar, c.tp_bwd[u] = (q.train.recompute == Recompute::full ? 3 : 2) * ar;
  c.tp_fwd[head] = c.comm("all_reduce", tokens * sizeof(float), Axis::tp) +
                   c.comm("all_reduce", 2 * tokens * sizeof(float), Axis::tp);
  c.tp_bwd[head] = ar;
  if (measured) {  // the calibrated tp passes hold their all-reduces already
    c.note("tp: the profile's tp " + std::to_string(q.mesh.tp) +
           " passes (their all-reduces included), local parameters ~ 1/" +
           std::to_string(q.mesh.tp));
    return;
  }
  for (std::size_t u = 0; u <= head; ++u) c.fwd[u] += c.tp_fwd[u], c.bwd[u] += c.tp_bwd[u];
  c.note("tp: GEMM passes at 1/" + std::to_string(q.mesh.tp) +
         " of the profile's time, local parameters ~ 1/" + std::to_string(q.mesh.tp));
}

double grad_bytes(const TrainSpec& t) { return state_bytes_per_param(t.precision).grads; }

// dp: micro-batches, then reduce to rank 0, its update, broadcast; nothing overlaps.
StepTime dp_step(Costs& c) {
  const StepQuery& q = c.q;
  const double n = double(q.model.total_params()), m = q.train.micro_steps(q.mesh);
  StepTime t;
  t.compute_s = m * (sum(c.fwd) + sum(c.bwd)) + c.opt_per_param * n;
  if (q.mesh.dp > 1)
    t.comm_s = c.comm("reduce", grad_bytes(q.train) * n, Axis::dp) +
               c.comm("broadcast", state_bytes_per_param(q.train.precision).params * n, Axis::dp);
  t.step_s = t.compute_s + t.comm_s;
  return t;
}

// allreduce (the template plugin): micro-batches, one all-reduce of every gradient, the update;
// nothing overlaps.
StepTime allreduce_step(Costs& c) {
  const StepQuery& q = c.q;
  const double n = double(q.model.total_params()), m = q.train.micro_steps(q.mesh);
  StepTime t;
  t.compute_s = m * (sum(c.fwd) + sum(c.bwd)) + c.opt_per_param * n;
  if (q.mesh.dp > 1) t.comm_s = c.comm("all_reduce", grad_bytes(q.train) * n, Axis::dp);
  t.step_s = t.compute_s + t.comm_s;
  return t;
}

// ddp: the plugin's buckets (from the end of the flat buffer, ready when backward has passed the
// unit holding their first element) all-reduced on one comm stream during the last backward.
StepTime ddp_step(Costs& c) {
  const StepQuery& q = c.q;
  const ParamLayout layout(q.model);
  const double m = q.train.micro_steps(q.mesh), F = sum(c.fwd), B = sum(c.bwd);
  StepTime t;
  t.compute_s = m * (F + B) + c.opt_per_param * double(layout.total());
  double exposed = 0;
  if (q.mesh.dp > 1) {
    const double gb = grad_bytes(q.train);
    const std::size_t per_bucket =
        std::max<std::size_t>(1, std::size_t(q.options.get_real("bucket_mb") * 1024 * 1024 / gb));
    std::vector<std::pair<int, double>> buckets;  // ready unit, bytes
    for (std::size_t end = layout.total(); end > 0;) {
      const std::size_t begin = end > per_bucket ? end - per_bucket : 0;
      buckets.emplace_back(layout.tensor_at(begin).unit, gb * double(end - begin));
      end = begin;
    }
    double clock = 0, stream = 0;
    std::size_t next = 0;
    for (int u = layout.num_units() - 1; u >= 0; --u) {
      clock += c.bwd[std::size_t(u)];
      for (; next < buckets.size() && buckets[next].first >= u; ++next) {
        const double d = c.comm("all_reduce", buckets[next].second, Axis::dp);
        stream = std::max(stream, clock) + d;
        t.comm_s += d;
      }
    }
    exposed = std::max(0.0, stream - clock);
  }
  t.compute_s += c.slowed_by(t.comm_s - exposed);
  t.step_s = t.compute_s + exposed;
  return t;
}

sharded::EngineConfig engine_config(const StepQuery& q) {
  const Options& o = q.options;
  return q.strategy.rfind("zero", 0) == 0 ? sharded::zero_engine_config(q.strategy, o)
                                          : sharded::fsdp_engine_config(q.strategy, o);
}

// The update of this rank's shard. Offloaded (ZeRO-Offload, Engine::step_offloaded): every group's
// gradient shard (and fp32 parameters) copied to the host on one copy stream at once, in group
// order; the host's AdamW of group g once its copy is in; its parameters copied back on the same
// stream behind the copies still going down. The copies the host's AdamW hides still slow it on
// CPU ranks (a thread of the same cores does them).
double update_time(Costs& c, const std::vector<sharded::ShardGroup>& groups, bool offload) {
  const StepQuery& q = c.q;
  double shard = 0;
  for (const sharded::ShardGroup& g : groups) shard += double(g.valid(0));
  if (!offload) return c.opt_per_param * shard;
  if (c.copy_per_byte <= 0) throw NoTimeModel{"the profile has no copy rate for offload's copies"};
  c.note("offload: copies on one stream, the host's AdamW per group as its copy arrives");
  const StateBytes per = state_bytes_per_param(q.train.precision);
  const bool params_down = !q.train.precision.mixed();
  std::vector<double> down(groups.size());
  double stream = 0, clock = 0, copies = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const double d =
        c.copy_per_byte * double(groups[g].valid(0)) * (per.grads + (params_down ? per.params : 0));
    down[g] = stream += d, copies += d;
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    clock = std::max(clock, down[g]) + c.opt_per_param * double(groups[g].valid(0));
    const double up = c.copy_per_byte * double(groups[g].valid(0)) * per.params;
    stream = std::max(stream, clock) + up, copies += up;
  }
  const double end = std::max(clock, stream);
  return end + c.slowed_by(copies - (end - c.opt_per_param * shard));
}

// The sharded engine: its micro-batch action list replayed on a compute clock and one comm stream
// (the engine issues gathers and reductions on comm stream 0), then its update.
StepTime sharded_step(Costs& c) {
  const StepQuery& q = c.q;
  const sharded::EngineConfig cfg = engine_config(q);
  const Axis shard_axis = cfg.hybrid ? Axis::dp_intra_node : Axis::dp;
  const int n = c.shape(shard_axis).first, replicas = q.mesh.dp / n;
  const ParamLayout layout(q.model);
  const auto groups = sharded::make_groups(layout, n, cfg);
  const auto actions = sharded::micro_batch_schedule(groups, layout.num_units(), cfg);
  const StateBytes per = state_bytes_per_param(q.train.precision);
  std::vector<double> gathered(groups.size()), reduced(groups.size());
  double clock = 0, stream = 0, busy = 0, comm = 0;
  // The engine's per-group buffers are new allocations, zeroed or written once: page faults and
  // memory bandwidth on the compute thread (large freed buffers go back to the system at once).
  auto fresh = [&](double bytes) {
    clock += c.fresh_per_byte * bytes, busy += c.fresh_per_byte * bytes;
  };
  auto on_stream = [&](double d) {
    return stream = std::max(stream, clock) + d, comm += d, stream;
  };
  for (const sharded::Action& a : actions) {
    const std::size_t g = std::size_t(a.index);
    switch (a.act) {
      case sharded::Act::gather:  // a new buffer for the group, on the compute thread
        fresh(per.params * double(groups[g].padded()));
        gathered[g] = n > 1 ? on_stream(c.comm("all_gather",
                                               per.params * double(groups[g].padded()), shard_axis))
                            : clock;
        break;
      case sharded::Act::wait_gather:
        clock = std::max(clock, gathered[g]);
        break;
      case sharded::Act::forward:
        clock += c.fwd[g], busy += c.fwd[g];
        break;
      case sharded::Act::backward:
        clock += c.bwd[g], busy += c.bwd[g];
        break;
      case sharded::Act::alloc_grads:
        fresh(per.grads * double(groups[g].padded()));
        break;
      case sharded::Act::reduce_grads: {
        fresh(per.grads * double(groups[g].chunk));
        double d =
            n > 1 ? c.comm("reduce_scatter", per.grads * double(groups[g].padded()), shard_axis)
                  : 0;
        if (replicas > 1)
          d += c.comm("all_reduce", per.grads * double(groups[g].chunk), Axis::dp_inter_node);
        reduced[g] = d > 0 ? on_stream(d) : clock;
        break;
      }
      case sharded::Act::finish_grads:
        clock = std::max(clock, reduced[g]);
        break;
      default:
        break;
    }
  }
  const double m = q.train.micro_steps(q.mesh);
  StepTime t;
  double update_comm = 0;
  for (const sharded::ShardGroup& g : groups) {
    if (n < 2) continue;
    if (!cfg.shard_grads)
      update_comm += c.comm("reduce_scatter", per.grads * double(g.padded()), shard_axis);
    if (!cfg.shard_params)
      update_comm += c.comm("all_gather", per.params * double(g.padded()), shard_axis);
  }
  if (n > 1 && q.train.grad_clip > 0) update_comm += c.comm("all_reduce", 8, shard_axis);
  // The schedule's comm that compute hid (its comm time less the compute thread's waits) slows
  // the compute on CPU ranks.
  const double slowed = c.slowed_by(m * std::max(0.0, comm - (clock - busy)));
  const double update = update_time(c, groups, cfg.offload_optimizer);
  t.compute_s = m * busy + update + slowed;
  t.comm_s = m * comm + update_comm;
  t.step_s = m * clock + update_comm + update + slowed;
  return t;
}

std::vector<std::string> unmodelled_reasons(const StepQuery& q) {
  std::vector<std::string> r;
  if (q.mesh.dp > 1 && q.options.values().count("dp") && q.options.get("dp") != "allreduce" &&
      q.options.get("dp") != "zero1")
    r.push_back("dp=" + q.options.get("dp") + " with tp or a pipeline is not modelled yet");
  if (q.options.values().count("sp") && q.options.get("sp") == "on")
    r.push_back("sequence parallelism is not modelled yet");
  return r;
}

}  // namespace time_model

using namespace time_model;

std::string profile_precision(const TrainSpec& train) {
  return train.precision.mixed() ? "bf16" : "fp32";
}

StepTime predict_step_time(const MachineProfile& profile, const StepQuery& q) {
  StepTime t;
  int peak_shares = q.mesh.ranks_per_node;
  try {
    const bool pipeline = q.strategy == "gpipe" || q.strategy == "1f1b" ||
                          q.strategy == "interleaved" || q.strategy == "tp";
    if (pipeline)
      for (const std::string& r : unmodelled_reasons(q)) throw NoTimeModel{r};
    Costs c = make_costs(profile, q);
    peak_shares = c.peak_shares;
    if (q.strategy == "dp")
      t = dp_step(c);
    else if (q.strategy == "ddp")
      t = ddp_step(c);
    else if (q.strategy == "allreduce")
      t = allreduce_step(c);
    else if (q.strategy.rfind("zero", 0) == 0 || q.strategy.rfind("fsdp", 0) == 0)
      t = sharded_step(c);
    else if (pipeline)
      t = pipeline_step(c);
    else
      throw NoTimeModel{"the predictor does not know strategy '" + q.strategy + "'"};
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
  if (t.exposed_comm_s < 0) t.exposed_comm_s = std::max(0.0, t.step_s - t.compute_s - t.bubble_s);
  const double tokens = double(q.train.global_batch) * q.model.seq;
  t.tokens_per_s = t.step_s > 0 ? tokens / t.step_s : 0;
  if (profile.node_peak_flops > 0) {
    const double per_rank_peak = profile.node_peak_flops / peak_shares;
    t.mfu = t.tokens_per_s * q.model.flops_per_token() / q.mesh.world() / per_rank_peak;
  }
  return t;
}

}  // namespace strata
