// The pipelines' time model (predictor.hpp): every stage's action list from pp::pipeline_schedule
// replayed with the chunks' calibrated pass times. A forward of chunk k waits for chunk k-1's
// forward of the same micro-batch plus one transfer; a backward for chunk k+1's backward plus one
// transfer (the last chunk for its own forward). Sends never block (they run on comm streams), so
// a stage idles only waiting for its input: that idle time is the bubble. With equal chunks and
// free transfers this gives GPipe's and 1F1B's (p-1)/(m+p-1).
#include <limits>

#include "predict/costs.hpp"
#include "strata/data_parallel.hpp"
#include "strata/engines/model_parallel.hpp"
#include "strata/engines/pipe_schedule.hpp"
#include "strata/stage_model.hpp"

namespace strata::time_model {
namespace {

pp::PipeSchedule schedule_of(const std::string& strategy) {
  return strategy == "gpipe"  ? pp::PipeSchedule::gpipe
         : strategy == "1f1b" ? pp::PipeSchedule::one_f_one_b
                              : pp::PipeSchedule::interleaved;
}

struct Replay {
  std::vector<double> end, busy;  // per stage
  double makespan = 0;
};

// fwd[k], bwd[k]: chunk k's pass times; transfer: one boundary send.
Replay replay(pp::PipeSchedule schedule, int P, int v, int m, const std::vector<double>& fwd,
              const std::vector<double>& bwd, double transfer) {
  const int K = P * v;
  const double none = -1;
  std::vector<std::vector<double>> done_f(K, std::vector<double>(m, none)), done_b = done_f;
  std::vector<std::vector<pp::PipeAction>> actions;
  for (int s = 0; s < P; ++s) actions.push_back(pp::pipeline_schedule(schedule, P, s, m, v));
  Replay r{std::vector<double>(P, 0), std::vector<double>(P, 0), 0};
  std::vector<std::size_t> next(P, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < P; ++s)
      while (next[s] < actions[s].size()) {
        const pp::PipeAction& a = actions[s][next[s]];
        const int k = pp::global_chunk(P, s, a.chunk);
        double ready = 0;
        if (a.forward && k > 0) {
          if (done_f[k - 1][a.micro] < 0) break;
          ready = done_f[k - 1][a.micro] + transfer;
        } else if (!a.forward) {
          if (done_f[k][a.micro] < 0) break;
          ready = done_f[k][a.micro];
          if (k < K - 1) {
            if (done_b[k + 1][a.micro] < 0) break;
            ready = std::max(ready, done_b[k + 1][a.micro] + transfer);
          }
        }
        const double cost = a.forward ? fwd[k] : bwd[k];
        r.end[s] = std::max(r.end[s], ready) + cost;
        r.busy[s] += cost;
        (a.forward ? done_f : done_b)[k][a.micro] = r.end[s];
        ++next[s];
        progress = true;
      }
  }
  for (int s = 0; s < P; ++s) {
    if (next[s] != actions[s].size()) throw NoTimeModel{"the pipeline schedule deadlocks"};
    r.makespan = std::max(r.makespan, r.end[s]);
  }
  return r;
}

}  // namespace

StepTime pipeline_step(Costs& c) {
  const StepQuery& q = c.q;
  const int P = q.mesh.pp, m = q.train.micro_steps(q.mesh);
  const int v = q.strategy == "interleaved" ? int(q.options.get_int("virtual_stages")) : 1;
  const int K = P * v;
  const ParamLayout layout(q.model);
  const bool layers_given = q.options.values().count("stage_layers");  // tp has no pipeline
  const auto chunks = mp::chunk_units(
      q.model, K, mp::parse_stage_layers(layers_given ? q.options.get("stage_layers") : ""));
  // params: a stage's local parameters (tp: 1/tp of them, the replicated LayerNorms and biases
  // neglected); tp_comm: its tp all-reduces of one micro-batch (inside fwd, bwd).
  std::vector<double> fwd(K, 0), bwd(K, 0), params(P, 0), tp_comm(P, 0);
  for (int k = 0; k < K; ++k)
    for (int u = chunks[k].first; u <= chunks[k].second; ++u) {
      fwd[k] += c.fwd[u], bwd[k] += c.bwd[u];
      params[k % P] += double(layout.units()[u].count) / q.mesh.tp;
      if (!c.tp_fwd.empty()) tp_comm[k % P] += c.tp_fwd[u] + c.tp_bwd[u];
    }
  double transfer = 0;
  if (P > 1) {
    const Partition second{chunks[1].first, chunks[1].second, 1, 0, false};
    const double boundary =
        double(StageModel::boundary_count(q.model, q.train.micro_batch, second)) * sizeof(float);
    transfer = c.comm("send", boundary, Axis::pp);
  }
  const Replay r = replay(schedule_of(q.strategy), P, v, m, fwd, bwd, transfer);

  // After the schedule: the tied embedding's gradient between the first and last stage, the
  // gradient reduction over dp, the norm over pp (and dp with zero1), the update.
  const StateBytes per = state_bytes_per_param(q.train.precision);
  const bool zero1 = q.options.get("dp") == "zero1" && q.mesh.dp > 1;
  StepTime t;
  double post_max = 0, post_comm = 0, tp_max = 0;
  for (int s = 0; s < P; ++s) {
    double comm = 0;
    if (P > 1 && (s == 0 || s == P - 1))
      comm +=
          c.comm("send", double(q.model.vocab) * q.model.hidden / q.mesh.tp * per.grads, Axis::pp);
    if (q.mesh.dp > 1 && zero1)
      comm += c.comm("reduce_scatter", per.grads * params[s], Axis::dp) +
              c.comm("all_gather", per.params * params[s], Axis::dp) +
              c.comm("all_reduce", 8, Axis::dp);
    else if (q.mesh.dp > 1)
      comm += c.comm("all_reduce", per.grads * params[s], Axis::dp);
    if (P > 1) comm += c.comm("all_reduce", 8, Axis::pp);
    const double update = c.opt_per_param * params[s] / (zero1 ? q.mesh.dp : 1);
    if (comm + update > post_max) post_max = comm + update;
    post_comm = std::max(post_comm, comm);
    tp_max = std::max(tp_max, m * tp_comm[s]);
    const double compute = r.busy[s] - m * tp_comm[s] + update;
    t.compute_s = std::max(t.compute_s, compute);
    t.bubble_s += (r.makespan - r.busy[s]) / P;  // the stages' mean, as bubble_fraction sums them
  }
  t.step_s = r.makespan + post_max;
  // Transfers inside the schedule are waited for in the receive: bubble, as the runs measure it.
  // What follows the schedule waits on nothing else: exposed.
  // tp's all-reduces block the compute thread: exposed too.
  t.exposed_comm_s = post_comm + tp_max;
  t.comm_s = post_comm + tp_max + (P > 1 ? 2.0 * m * transfer * v : 0.0);  // a stage's sends
  return t;
}

}  // namespace strata::time_model
