#include "run/trainer.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>

#include "backends/backend.hpp"
#include "backends/cpu/gemm_bf16.hpp"
#include "backends/cpu/layers.hpp"
#include "comm/idle_clock.hpp"
#include "comm/intervals.hpp"
#include "comm/mpi_transport.hpp"
#include "model/moe_dispatch.hpp"
#include "provenance/node_peak.hpp"
#include "provenance/provenance.hpp"
#include "provenance/topology.hpp"
#include "results/run_claim.hpp"
#include "results/temporary_file.hpp"
#include "run/calibrate.hpp"
#include "run/core_context.hpp"
#include "run/process_memory.hpp"
#include "run/profiler_ranges.hpp"
#include "run/summary.hpp"
#include "run/trace_timeline.hpp"
#include "run/watchdog.hpp"
#include "util/format.hpp"

namespace strata {
namespace {

// Per-step comm figures of one rank from the ledger records of that step.
void comm_of_step(const std::vector<CommRecord>& records, const Intervals& waits, StepRow& row) {
  Intervals busy;
  for (const CommRecord& r : records) {
    const int op = static_cast<int>(r.op);
    row.calls[op] += 1;
    row.bytes[op] += double(r.bytes);
    row.time_s[op] += r.seconds();
    row.bus_bytes[op] += double(r.bytes) * bus_factor(r.op, r.group_size);
    busy.emplace_back(r.t0, r.t1);
  }
  row.metric[kCommS] = union_length(busy);
  row.metric[kExposedCommS] = intersection_length(busy, waits);
}

// What a run holds from setup to the end of its steps, on every rank.
struct Run {
  const RunConfig& config;
  std::shared_ptr<Strategy> strategy;
  CommLedger& ledger;
  CoreContext& ctx;
  double t_base = 0;          // the ranks' common time origin for --trace
  std::vector<double> trace;  // this rank's --trace events (trace_timeline.hpp)
};

// No two ranks of a node on one GPU (each would measure half of it): their GPUs' UUIDs differ.
// Collective; rank 0 throws, which ends the job with the run file saying which ranks.
void check_one_gpu_per_rank(const DeviceBackend& gpu) {
  const std::vector<std::string> where =
      mpi::control_gather_strings(mpi::processor_name() + " " + gpu.device_uuid());
  for (std::size_t a = 0; a < where.size(); ++a)
    for (std::size_t b = a + 1; b < where.size(); ++b)
      if (where[a] == where[b])
        throw ConfigError("--device cuda: ranks " + std::to_string(a) + " and " +
                              std::to_string(b) + " share one GPU (" + where[a] +
                              "): one GPU per rank",
                          "give each task its own GPU (srun --gpus-per-task=1, or "
                          "CUDA_VISIBLE_DEVICES), or run fewer ranks per node");
}

void announce(const Run& run, const PeakFlops& peak) {
  const RunConfig& c = run.config;
  const TrainSpec& t = c.train;
  std::printf(
      "strata: %s on %d rank(s) (%d node(s) x %d), mesh %s, model %s "
      "(%s), %d x %d seq/step (micro-batch %d, %d micro-step(s)), %s\n",
      c.plugin.c_str(), mpi::world_size(), c.mesh.nodes, c.mesh.ranks_per_node,
      mesh_text(c.mesh).c_str(), c.model.preset.c_str(), params_text(c.model).c_str(),
      t.global_batch, c.model.seq, t.micro_batch, t.micro_steps(c.mesh),
      run.ctx.data().describe().c_str());
  if (const DeviceBackend* gpu = opened_backend(c.device_kind()))
    std::printf("strata: GPU %d of rank 0: %s, peak %.1f TFLOP/s (%s: %s)\n", gpu->ordinal(),
                gpu->device_name().c_str(), peak.per_rank / 1e12, peak.source.c_str(),
                peak.detail.c_str());
  else
    std::printf("strata: peak %.1f GFLOP/s per rank (%s: %s)\n", peak.per_rank / 1e9,
                peak.source.c_str(), peak.detail.c_str());
  std::fflush(stdout);
}

// Rank 0: where the MFU peak came from, in /provenance (replacing an earlier entry).
void record_peak(const PeakFlops& peak, RunState& state) {
  std::lock_guard lock(state.mu);
  auto& p = state.record.provenance;
  std::erase_if(p, [](const auto& kv) {
    return kv.first == "peak_flops_source" || kv.first == "peak_flops_detail";
  });
  p.emplace_back("peak_flops_source", peak.source);
  p.emplace_back("peak_flops_detail", peak.detail);
}

// Collective, after the steps: a node peak (measured or cached) below what training reached, i.e.
// an MFU above 1 on some rank, was measured while something else ran on the node. The node is
// measured again before any MFU is reported (the summary warns if it is still above 1).
void recheck_peak(const RunConfig& c, const std::vector<double>& step_max, PeakFlops& peak,
                  RunState& state) {
  if (peak.source != "cache" && peak.source != "measured") return;  // the same on every rank
  const std::size_t warmup = std::min<std::size_t>(std::size_t(c.train.warmup), step_max.size());
  const double p50 = percentile({step_max.begin() + warmup, step_max.end()}, 0.5);
  const double flops_per_rank =
      model_flops_per_rank(double(c.train.global_batch) * c.model.seq / p50,
                           c.model.flops_per_token(), mpi::world_size());
  double mfu_max = model_flops_utilization(flops_per_rank, peak.per_rank);
  if (!std::isfinite(mfu_max)) mfu_max = 0;
  mpi::control_allreduce_max(&mfu_max, 1);
  if (mfu_max <= 1) return;
  {
    const OutsideProcessPeak outside_peak;  // its matrices are measurement, not training
    peak = remeasure_node_peak(c, peak, mfu_max);
  }
  if (mpi::world_rank() != 0) return;
  std::printf(
      "strata: MFU %.1f%% above 100%% against the node's peak: peak now %.1f GFLOP/s per rank "
      "(%s: %s)\n",
      100 * mfu_max, peak.per_rank / 1e9, peak.source.c_str(), peak.detail.c_str());
  std::fflush(stdout);
  record_peak(peak, state);
}

// One optimizer step on this rank: its timings, comm and (this rank's share of the) loss.
StepRow run_step(Run& run, int step) {
  CoreContext& ctx = run.ctx;
  run.ledger.set_step(step);
  ctx.begin_step();
  const double t0 = now();
  {
    const ProfilerRange range("step", std::to_string(step));
    run.strategy->train_step(ctx, step);
    ctx.synchronize_streams();
    ctx.close_micro_batch_range();
  }
  if (run.config.train.cuda_graphs && step == 0 && ctx.graphed_calls() == 0)
    throw Error("--cuda-graphs: " + run.config.plugin +
                    " ran its micro-batches outside Context::run_graphed(): nothing to capture",
                "run without --cuda-graphs; a plugin that allows capture runs its passes "
                "through forward_backward() or Context::run_graphed()");
  const double t1 = now();
  resolve_idle_waits();  // the compute stream has passed every mark of the step
  ctx.resolve_device_phases();
  run.ledger.set_step(-1);

  StepRow row;
  row.metric[kStepS] = t1 - t0;
  row.metric[kForwardS] = ctx.phase_s(Phase::forward);
  row.metric[kBackwardS] = ctx.phase_s(Phase::backward);
  row.metric[kOptimizerS] = ctx.phase_s(Phase::optimizer);
  row.metric[kBubbleS] = ctx.phase_s(Phase::bubble);
  row.metric[kTokens] = ctx.loss_tokens();
  std::vector<CommRecord> records;
  Intervals waits;
  run.ledger.drain(&records, &waits);  // streams are synchronised: all of this step, nothing else
  comm_of_step(records, waits, row);
  if (run.config.trace) {
    for (const CommRecord& r : records)
      add_trace(run.trace, r.stream, op_name(r.op), r.group, r.t0 - run.t_base, r.t1 - run.t_base,
                double(r.bytes));
    for (const CoreContext::Interval& i : ctx.take_intervals())
      add_trace(run.trace, "compute", phase_name(i.phase), "", i.t0 - run.t_base, i.t1 - run.t_base,
                0);
  }
  return row;
}

// "4.2s", "3:07", "1:02:03": a duration as a progress line shows it.
std::string clock_text(double seconds) {
  char text[32];
  const long s = std::lround(std::max(0.0, seconds));
  if (seconds < 60)
    std::snprintf(text, sizeof text, "%.1fs", std::max(0.0, seconds));
  else if (s < 3600)
    std::snprintf(text, sizeof text, "%ld:%02ld", s / 60, s % 60);
  else
    std::snprintf(text, sizeof text, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  return text;
}

// Rank 0, every --log-interval steps and at the last: the steps since the previous line (Megatron's
// log interval): their mean loss and slowest-rank step time, throughput, and the run's elapsed time
// and ETA at its pace so far.
void print_progress(const RunConfig& c, int step, bool last, double elapsed_s,
                    const std::vector<double>& global_loss, const std::vector<double>& step_max) {
  const int done = step + 1;
  if (c.quiet || (done % c.log_interval != 0 && !last)) return;
  const int first = std::max(0, done - c.log_interval);
  double loss = 0, seconds = 0;
  for (int s = first; s < done; ++s) loss += global_loss[s], seconds += step_max[s];
  const double steps = done - first, mean_s = seconds / steps;
  const double tokens_per_s = double(c.train.global_batch) * c.model.seq / mean_s;
  const double tflops_per_rank =
      model_flops_per_rank(tokens_per_s, c.model.flops_per_token(), mpi::world_size()) / 1e12;
  std::printf(
      "step %4d/%d | elapsed %s | ETA %s | loss %.4f | %8.1f ms/step | %10.0f tok/s | %.3f "
      "TFLOP/s/rank\n",
      done, c.train.steps, clock_text(elapsed_s).c_str(),
      clock_text(last ? 0.0 : elapsed_s / done * (c.train.steps - done)).c_str(), loss / steps,
      mean_s * 1e3, tokens_per_s, tflops_per_rank);
  std::fflush(stdout);
}

// --target-ci: whether the timed steps so far pin their median down, its 95% interval within
// +-target of it (from 6 timed steps, step_noise's smallest). Every rank holds the same step_max
// (reduced over the ranks), so every rank stops after the same step.
bool median_settled(const RunConfig& c, const std::vector<double>& step_max) {
  if (c.target_ci <= 0 || int(step_max.size()) <= c.train.warmup) return false;
  const std::vector<double> timed(step_max.begin() + c.train.warmup, step_max.end());
  const StepNoise noise = step_noise(timed);
  if (std::isnan(noise.median_low)) return false;
  const double p50 = percentile(timed, 0.5);
  return std::max(p50 - noise.median_low, noise.median_high - p50) <= c.target_ci * p50;
}

// Every step, up to --steps (fewer when --target-ci is met); each step's global loss and slowest
// rank's time are reduced over the ranks, and rank 0 keeps its rows in `state` for a failure file.
void run_steps(Run& run, RunState& state, RankReport& report, std::vector<double>& global_loss,
               std::vector<double>& step_max) {
  const RunConfig& c = run.config;
  const bool root = mpi::world_rank() == 0;
  const double t_start = now();
  for (int step = 0; step < c.train.steps; ++step) {
    const double aux_before = moe_routing_counts().aux_loss;
    StepRow row = run_step(run, step);
    double sums[3] = {run.ctx.loss_sum(), run.ctx.loss_tokens(),
                      moe_routing_counts().aux_loss - aux_before};
    mpi::control_allreduce_sum(sums, 3);
    row.metric[kMoeAuxLoss] = sums[2] / c.train.global_batch;  // as the objective averages it
    double smax = row.metric[kStepS];
    mpi::control_allreduce_max(&smax, 1);
    const double loss = sums[1] > 0 ? sums[0] / sums[1] : std::numeric_limits<double>::quiet_NaN();
    row.metric[kLoss] = loss;
    report.steps.push_back(row);
    global_loss.push_back(loss);
    step_max.push_back(smax);
    const bool last = step + 1 == c.train.steps || median_settled(c, step_max);
    if (root) {
      std::lock_guard lock(state.mu);
      state.root_steps.push_back(row);
    }
    if (root) print_progress(c, step, last, now() - t_start, global_loss, step_max);
    if (last) break;
  }
  if (root && c.train.cuda_graphs)
    std::printf("strata: CUDA graphs: %d captured, %llu launches on rank 0\n",
                run.ctx.graphs_captured(), (unsigned long long)run.ctx.graph_launches());
}

// The steps run, where --target-ci stopped before --steps: /config steps is what ran (the width
// of /steps), steps_requested the bound.
void record_steps_run(RunRecord& record, int steps) {
  for (auto& [key, value] : record.config)
    if (key == "steps") value = std::to_string(steps);
}

// This rank's memory, predictions and peak, after its steps.
void finish_report(const Run& run, double peak_flops, std::uint64_t baseline_bytes,
                   double* predicted_bubble, RankReport& report) {
  const RunConfig& c = run.config;
  const PredictInput in{c.mesh, c.model, c.train, mpi::world_rank()};
  const Prediction pred = predict(*run.strategy, in);
  report.predicted_comm_bytes =
      plan_comm_bytes(run.strategy->plan_step(in), c.model, c.train, c.mesh.tp);
  const MemoryLedger& memory = run.ctx.memory();
  for (int tag = 0; tag < kNumMemTags; ++tag) {
    report.peak_bytes[tag] = double(memory.peak(static_cast<MemTag>(tag)));
    report.predicted_bytes[tag] = pred.memory_bytes[tag];
  }
  report.process_peak_bytes = double(peak_rss_bytes());
  report.peak_flops = peak_flops;
  report.baseline_bytes = double(baseline_bytes);
  report.tracked_peak_bytes = double(memory.total_peak());
  if (DeviceBackend* gpu = opened_backend(memory.device()))
    report.device_peak_bytes = double(gpu->peak_device_bytes());
  *predicted_bubble = pred.bubble_fraction;
}

// Rank 0: the run file (and the --trace timeline beside it), then the summary lines. The timeline
// is written under a hidden name and put in place only once its run file is: a failed run never
// leaves a truncated JSON, or one that no longer matches its .h5.
void write_results(const RunConfig& config, RunState& state,
                   const std::vector<std::vector<double>>& traces) {
  RunRecord& rec = state.record;
  const std::string json = trace_json_path(state.path);
  std::optional<TemporaryFile> json_tmp;  // removed, should the run file fail, when it goes
  if (config.trace) {
    json_tmp.emplace(json);
    collect_trace(traces, rec, json_tmp->path());
  }
  write_run_file(rec, state.path);
  state.written = true;
  release_run_file_claim(state.path);
  if (config.trace) {
    json_tmp->commit(true);
    std::printf("strata: trace of %zu intervals in /trace and %s\n", rec.trace.size(),
                json.c_str());
  } else {
    std::filesystem::remove(json);  // an earlier run's, under the same id
  }
  print_summary(config, rec, state.path);
}

}  // namespace

void begin_record(const RunConfig& config, RunState& state) {
  {
    std::lock_guard lock(state.mu);
    RunRecord& r = state.record;
    r.created_utc = utc_timestamp();
    r.command_line = config.command_line;
    r.config = config.resolved(&r.config_types);
    r.provenance = collect_provenance();
    r.provenance.emplace_back("flops_per_token_formula",
                              "6*N + 12*L*h*s; N = non-embedding params + the LM head (V*h)");
    r.ranks = mpi::world_size();
    r.run_id = config.run_id;
    fill_partial_steps({}, r);  // [ranks x 0] until the first step ends
    state.path = run_file_path(config);
  }
}

void gather_record_hosts(RunState& state) {
  std::vector<std::string> hosts = mpi::control_gather_strings(mpi::processor_name());
  std::vector<NodeTopology> nodes = gather_node_topologies();  // one per distinct host
  if (mpi::world_rank() != 0) return;
  std::lock_guard lock(state.mu);
  state.record.hostnames = hosts;
  state.record.provenance.emplace_back("topology_summary", topology_summary(nodes));
  state.record.topology = std::move(nodes);
}

namespace {

// --calibrate-comm before the first step: printed by rank 0 and kept for the run file.
void record_calibration(Context& ctx, CommLedger& ledger, const RunConfig& config,
                        RunState& state) {
  std::vector<CalibrationPoint> calibration =
      calibrate_comm(ctx, ledger, default_calibration_sizes(), kCalibrationIterations);
  if (mpi::world_rank() == 0) print_calibration(calibration, config.transport);
  std::lock_guard lock(state.mu);  // rank 0's watchdog may be writing a failure file from it
  state.record.calibration = std::move(calibration);
}

// What the steps gave rank 0 beside the ranks' reports.
struct StepsOutcome {
  const std::vector<double>& global_loss;
  const std::vector<double>& step_max;
  double predicted_bubble;
  double moe_dropped_fraction;  // NaN without a mixture of experts
};

// --arch moe: the routing choices the steps dropped over capacity, over all ranks (each counts
// its blocks' choices of its micro-batches).
double moe_dropped_fraction(const RunConfig& config, MoeRoutingCounts before) {
  if (config.model.arch != Arch::moe) return std::numeric_limits<double>::quiet_NaN();
  const MoeRoutingCounts after = moe_routing_counts();
  double counts[2] = {double(after.choices - before.choices),
                      double(after.dropped - before.dropped)};
  mpi::control_allreduce_sum(counts, 2);
  return counts[0] > 0 ? counts[1] / counts[0] : 0.0;
}

// Rank 0: the ranks' gathered reports into the record, its summary, and the run file.
void record_run(const RunConfig& config, RunState& state, const std::vector<double>& gathered,
                const StepsOutcome& steps, const PeakFlops& peak,
                const std::vector<std::vector<double>>& traces) {
  std::lock_guard lock(state.mu);
  // The watchdog wrote a failure file while the gathers were in flight (a signal, a timeout):
  // that file stands, and the watchdog ends the process.
  if (state.written) return;
  const int steps_run = int(steps.global_loss.size());
  record_steps_run(state.record, steps_run);
  const std::vector<RankReport> reports = RankReport::unpack_all(gathered, steps_run);
  fill_record(reports, state.record);
  std::vector<double> peaks;
  for (const RankReport& r : reports) peaks.push_back(r.peak_flops);
  summarize(config, state.record, steps.step_max, steps.global_loss, peaks, steps.predicted_bubble);
  if (!std::isnan(steps.moe_dropped_fraction))
    state.record.summary.push_back({"moe_dropped_fraction", steps.moe_dropped_fraction, "1"});
  // An MFU above 1 means the peak was too low (measured while the node was busy): the next run
  // measures the node again instead of reusing it.
  if (summary_value(state.record, "mfu_rank_max") > 1 &&
      (peak.source == "cache" || peak.source == "measured"))
    forget_node_peak(config);
  write_results(config, state, traces);
}

}  // namespace

void train(const RunConfig& config, const PluginRegistry& registry, RunState& state,
           Watchdog& watchdog) {
  const bool root = mpi::world_rank() == 0;
  const StrategySpec* spec = nullptr;
  registry.find(config.plugin, &spec);
  Options options = validate_options(*spec, config.plugin_opts);
  std::shared_ptr<Strategy> strategy = registry.create(config.plugin, options);

  // A GPU run: this rank's GPU (one per local rank), before anything is allocated on it.
  if (config.device_kind() != Device::cpu) {
    const mpi::LocalRank local = mpi::local_rank();
    check_one_gpu_per_rank(
        open_backend(config.device_kind(), {local.rank, local.size, config.attention_kernel()}));
  }
  PeakFlops peak = resolve_peak_flops(config);  // collective: the node's, shared
  if (root) record_peak(peak, state);

  CommLedger ledger;
  watchdog.attach(&ledger);
  struct Detach {
    Watchdog& w;
    ~Detach() { w.attach(nullptr); }
  } detach{watchdog};
  // bf16: predict() sizes the GEMM scratchpads by asking oneDNN, which JIT-compiles every GEMM
  // this rank will issue. Compiled before the baseline, that code is runtime memory (like BLAS's
  // warmed-up buffers) and the first step compiles nothing.
  if (config.train.precision.mixed() && config.device_kind() == Device::cpu)
    predict(*strategy, PredictInput{config.mesh, config.model, config.train, mpi::world_rank()});
  CoreContext ctx(config, ledger);
  // The strategy's buffers go back to the context's ledger (and, on a GPU, to the backend's pool)
  // before the context itself goes.
  struct ReleaseStrategy {
    std::shared_ptr<Strategy>& strategy;
    ~ReleaseStrategy() { strategy.reset(); }
  } release_strategy{strategy};
  const std::uint64_t baseline_bytes = mark_runtime_baseline(ctx.memory());  // process_memory.hpp
  Run run{config, strategy, ledger, ctx, 0.0, {}};
  run.strategy->setup(ctx);
  if (root) announce(run, peak);

  if (config.calibrate_comm) record_calibration(ctx, ledger, config, state);

  if (config.trace) mpi::control_barrier();  // every rank's clock at the same moment
  run.t_base = now();
  RankReport report;
  std::vector<double> global_loss, step_max;
  const MoeRoutingCounts routing = moe_routing_counts();
  run_steps(run, state, report, global_loss, step_max);
  const double dropped = moe_dropped_fraction(config, routing);
  recheck_peak(config, step_max, peak, state);
  double predicted_bubble = 0;
  finish_report(run, peak.per_rank, baseline_bytes, &predicted_bubble, report);

  const std::vector<double> gathered = mpi::control_gather(report.pack());
  std::vector<std::vector<double>> traces;
  if (config.trace) traces = mpi::control_gather_varying(run.trace);
  if (root)
    record_run(config, state, gathered, {global_loss, step_max, predicted_bubble, dropped}, peak,
               traces);
}

}  // namespace strata
