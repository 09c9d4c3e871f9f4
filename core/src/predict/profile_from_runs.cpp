// Machine profiles from finished runs (profile_from_runs.hpp).
#include "predict/profile_from_runs.hpp"

#include <algorithm>
#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "run/calibrate.hpp"
#include "run/summary.hpp"

namespace strata {
namespace {

std::map<std::string, std::string> pairs(
    const std::vector<std::pair<std::string, std::string>>& v) {
  return {v.begin(), v.end()};
}

int integer(const std::map<std::string, std::string>& m, const std::string& key, int fallback) {
  const auto it = m.find(key);
  return it == m.end() || it->second.empty() ? fallback : std::atoi(it->second.c_str());
}

DType dtype_of_name(const std::string& name) { return name == "bf16" ? DType::bf16 : DType::f32; }

// /config plugin_opts: the KEY=VALUE options joined with ','. A piece without '=' belongs to the
// value before it (stage_layers=1,3).
std::vector<std::string> split_options(const std::string& joined) {
  std::vector<std::string> out;
  for (std::size_t b = 0; b < joined.size();) {
    const std::size_t e = std::min(joined.find(',', b), joined.size());
    const std::string piece = joined.substr(b, e - b);
    if (piece.find('=') == std::string::npos && !out.empty())
      out.back() += "," + piece;
    else if (!piece.empty())
      out.push_back(piece);
    b = e + 1;
  }
  return out;
}

// Parameters the plan's optimizer updates in one step (a sharded rank: its shard).
double updated_params(const StepPlan& plan) {
  double n = 0;
  for (const PlanAction& a : plan.micro_batch)
    if (a.op == PlanOp::update) n += a.count * plan.micro_batches;
  for (const PlanAction& a : plan.step)
    if (a.op == PlanOp::update) n += a.count;
  return n;
}

// The timed steps' median of the slowest rank's `metric` (seconds).
double median_step_max(const RunRecord& run, const std::string& metric, int warmup) {
  const auto it = run.step_values.find(metric);
  if (it == run.step_values.end() || run.steps <= warmup) return -1;
  std::vector<double> per_step;
  for (int s = warmup; s < run.steps; ++s) {
    double worst = 0;
    for (int r = 0; r < run.ranks; ++r)
      worst = std::max(worst, it->second[std::size_t(r) * std::size_t(run.steps) + std::size_t(s)]);
    per_step.push_back(worst);
  }
  std::nth_element(per_step.begin(), per_step.begin() + per_step.size() / 2, per_step.end());
  return per_step[per_step.size() / 2];
}

// "BM_Coll/<transport>/<op>/<mode>/bytes:<B>[/iterations:N/manual_time]" split at '/'.
std::vector<std::string> name_parts(const std::string& name) {
  std::vector<std::string> parts;
  std::stringstream in(name);
  for (std::string p; std::getline(in, p, '/');) parts.push_back(p);
  return parts;
}

double seconds_per(const std::string& unit) {
  return unit == "ns" ? 1e-9 : unit == "us" ? 1e-6 : unit == "ms" ? 1e-3 : unit == "s" ? 1 : 0;
}

}  // namespace

std::vector<CommSample> samples_from_bench(const std::string& path, std::string* transport) {
  namespace pt = boost::property_tree;
  auto bad = [&](const std::string& what) {
    return ConfigError("--calibrate-from " + path + ": " + what);
  };
  pt::ptree root;
  try {
    pt::read_json(path, root);
  } catch (const pt::json_parser_error& e) {
    throw bad(std::string("not readable as JSON (") + e.what() + ")");
  }
  const int per_node = root.get<int>("context.ranks_per_node", 0);
  if (per_node < 1)
    throw bad("no context.ranks_per_node: not bench_comm's --benchmark_out JSON (of this version)");
  std::vector<CommSample> out;
  std::set<std::string> transports;
  const auto benchmarks = root.get_child_optional("benchmarks");
  if (!benchmarks) throw bad("no benchmarks: not bench_comm's --benchmark_out JSON");
  for (const auto& [key, b] : *benchmarks) {
    const std::vector<std::string> part = name_parts(b.get<std::string>("name", ""));
    if (part.size() < 5 || part[0] != "BM_Coll" ||
        b.get<std::string>("run_type", "") != "iteration")
      continue;
    const std::string& op = part[2];
    if (std::none_of(std::begin(kCalibratedCommOps), std::end(kCalibratedCommOps),
                     [&](CommOp o) { return op == op_name(o); }))
      continue;
    if (op == "all_gather" && part[3] != "in-place") continue;  // the engines' layout
    CommSample s{op,
                 int(b.get<double>("ranks", 0)),
                 0,
                 b.get<double>("bytes", 0),
                 b.get<double>("real_time", 0) * seconds_per(b.get<std::string>("time_unit", "")),
                 per_node};
    s.ranks_per_node = std::min(s.ranks, per_node);
    if (s.ranks < 2 || !(s.bytes > 0) || !(s.time_s > 0) || b.get<bool>("error_occurred", false))
      continue;
    transports.insert(part[1]);
    out.push_back(s);
  }
  if (out.empty())
    throw bad("no all_reduce, reduce_scatter, all_gather or all_to_all point of 2 or more ranks");
  if (transports.size() > 1)
    throw bad("points of " + std::to_string(transports.size()) +
              " transports; a profile is of one: run bench_comm with --transports=NAME");
  *transport = *transports.begin();
  return out;
}

RunQuestion question_of_run(const RunRecord& run) {
  const auto config = pairs(run.config), provenance = pairs(run.provenance);
  auto text = [&](const std::string& key) {
    const auto it = config.find(key);
    return it == config.end() ? std::string() : it->second;
  };
  RunQuestion r;
  StepQuery& q = r.query;
  q.strategy = text("plugin");
  ModelSpec& m = q.model;
  if (is_model_preset(text("model"))) m = model_preset(text("model"));
  m.preset = text("model");
  m.layers = integer(config, "layers", m.layers), m.hidden = integer(config, "hidden", m.hidden);
  m.heads = integer(config, "heads", m.heads), m.seq = integer(config, "seq", m.seq);
  m.vocab = integer(config, "vocab", m.vocab);
  if (!text("arch").empty()) parse_arch(text("arch"), &m.arch);  // runs before it: gpt2
  m.kv_heads = integer(config, "kv_heads", m.kv_heads), m.ffn = integer(config, "ffn", m.ffn);
  m.experts = integer(config, "experts", m.experts), m.top_k = integer(config, "top_k", m.top_k);
  m.shared_experts = integer(config, "shared_experts", m.shared_experts);
  if (!text("capacity_factor").empty())
    m.capacity_factor = std::atof(text("capacity_factor").c_str());
  if (!text("aux_loss_coef").empty()) m.aux_loss_coef = std::atof(text("aux_loss_coef").c_str());
  TrainSpec& t = q.train;
  t.micro_batch = integer(config, "micro_batch", t.micro_batch);
  t.global_batch = integer(config, "global_batch", t.global_batch);
  t.steps = integer(config, "steps", t.steps), t.warmup = integer(config, "warmup", t.warmup);
  t.grad_clip = text("grad_clip").empty() ? t.grad_clip : std::atof(text("grad_clip").c_str());
  parse_recompute(text("recompute"), &t.recompute);
  t.precision.param = dtype_of_name(text("precision"));
  t.precision.reduce = dtype_of_name(text("reduce_dtype"));
  // Files from before --tp-comm-dtype have no tp_comm_dtype: they moved fp32 activations.
  t.precision.tp_comm = dtype_of_name(text("tp_comm_dtype"));
  t.device = text("device") == "cuda" ? Device::cuda : Device::cpu;
  q.mesh = MeshSpec{integer(config, "dp", 1),
                    integer(config, "tp", 1),
                    integer(config, "pp", 1),
                    integer(config, "nodes", 1),
                    integer(config, "ranks_per_node", run.ranks),
                    integer(config, "ep", 1),   // files from before ep have none: 1
                    integer(config, "cp", 1)};  // nor from before cp
  q.threads = integer(provenance, "blas_threads", 1);
  r.plugin_opts = split_options(text("plugin_opts"));
  r.step_p50_s = summary_value(run, "step_s_p50");
  const double peak = summary_value(run, "peak_flops_per_rank");
  r.node_peak_flops = std::isfinite(peak) && t.device == Device::cpu ? peak * q.mesh.ranks_per_node
                      : std::isfinite(peak)                          ? peak
                                                                     : 0;
  return r;
}

std::optional<ComputeEntry> compute_from_run(const RunRecord& run, const RunQuestion& r,
                                             std::string* why) {
  const StepQuery& q = r.query;
  if (q.mesh.tp > 1 || q.mesh.pp > 1) {
    *why = "tp or pp > 1: a rank's phase timers cover part of the model";
    return std::nullopt;
  }
  for (const std::string& o : r.plugin_opts)
    if (o == "offload=optimizer") {
      *why = "its optimizer phase is the host's (offload)";
      return std::nullopt;
    }
  const double F = median_step_max(run, "forward_s", q.train.warmup);
  const double B = median_step_max(run, "backward_s", q.train.warmup);
  const double O = median_step_max(run, "optimizer_s", q.train.warmup);
  const int m = q.train.micro_steps(q.mesh);
  if (F <= 0 || B <= 0 || O < 0 || m < 1) {
    *why = "no timed steps with forward, backward and optimizer times";
    return std::nullopt;
  }
  ComputeEntry e;
  e.model = q.model, e.micro_batch = q.train.micro_batch;
  e.device = device_name(q.train.device), e.precision = profile_precision(q.train);
  e.threads = q.threads, e.ranks_per_node = q.mesh.ranks_per_node;
  // Every unit's share of a micro-batch's passes is its share of the forward FLOPs.
  split_passes_by_flops(e, q.model, F / m, B / m);
  e.block_recompute_full_s = e.block_forward_s;  // a full recompute repeats the forward
  e.block_recompute_selective_s =
      e.block_forward_s * UnitFlops(q.model).attention / UnitFlops(q.model).block;
  // The optimizer phase updates what rank 0's step plan updates (a sharded rank: its shard).
  const double updated = q.plans.empty() ? 0 : updated_params(q.plans.front());
  if (!(updated > 0)) {
    *why = "its strategy's step plan updates no parameters (or it has no plan)";
    return std::nullopt;
  }
  e.optimizer_s_per_param = O / updated;
  return e;
}

std::optional<double> fit_fresh_rate(MachineProfile profile, const StepQuery& q,
                                     double measured_s) {
  if (!(measured_s > 0)) return std::nullopt;
  auto step_at = [&](double rate) {
    for (ComputeEntry& e : profile.compute) e.fresh_memory_s_per_byte = rate;
    const StepTime t = predict_step_time(profile, q);
    return t.modelled ? t.step_s : -1.0;
  };
  const double probe = 1e-9;  // 1 GB/s
  const double t0 = step_at(0), t1 = step_at(probe);
  if (t0 < 0 || t1 <= t0) return std::nullopt;
  return std::max(0.0, (measured_s - t0) / ((t1 - t0) / probe));
}

}  // namespace strata
