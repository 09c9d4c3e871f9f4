#include "trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>

#include "calibrate.hpp"
#include "comm/intervals.hpp"
#include "comm/mpi_transport.hpp"
#include "core_context.hpp"
#include "cpu/layers.hpp"
#include "data.hpp"
#include "format.hpp"
#include "process_memory.hpp"
#include "provenance.hpp"
#include "strata/data_parallel.hpp"
#include "summary.hpp"
#include "watchdog.hpp"

namespace strata {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The metrics of /steps, in file order, with units.
const std::vector<std::pair<std::string, std::string>> kStepMetrics = {
    {"step_s", "s"},      {"forward_s", "s"}, {"backward_s", "s"},
    {"optimizer_s", "s"}, {"comm_s", "s"},    {"exposed_comm_s", "s"},
    {"bubble_s", "s"},    {"loss", "nats"},   {"tokens", "tokens"}};

struct StepRow {  // one rank, one step
  std::map<std::string, double> metric;
  std::array<double, kNumCommOps> calls{}, bytes{}, time_s{}, bus_bytes{};
};

// Per-step comm figures of one rank from the ledger records of that step.
void comm_of_step(const std::vector<CommRecord>& records, const Intervals& waits, StepRow& row) {
  Intervals busy;
  for (const CommRecord& r : records) {
    int op = static_cast<int>(r.op);
    row.calls[op] += 1;
    row.bytes[op] += double(r.bytes);
    row.time_s[op] += r.seconds();
    row.bus_bytes[op] += double(r.bytes) * bus_factor(r.op, r.group_size);
    busy.emplace_back(r.t0, r.t1);
  }
  row.metric["comm_s"] = union_length(busy);
  row.metric["exposed_comm_s"] = intersection_length(busy, waits);
}

// --trace: events travel to rank 0 as 6 doubles each, strings as indices into fixed tables.
const std::vector<std::string> kTraceStreams = {"compute", "comm0", "comm1", "comm2", "comm3",
                                                "comm4",   "comm5", "comm6", "comm7"};
const std::vector<std::string> kTraceKinds = {
    "forward",    "backward",  "optimizer", "bubble", "all_reduce", "reduce_scatter",
    "all_gather", "broadcast", "reduce",    "send",   "recv",       "barrier"};
const std::vector<std::string> kTraceNames = {
    "", "dp", "tp", "pp", "dp_intra_node", "dp_inter_node"};
const std::array<const char*, 4> kPhaseNames = {"forward", "backward", "optimizer", "bubble"};

double index_of(const std::vector<std::string>& table, const std::string& s) {
  auto it = std::find(table.begin(), table.end(), s);
  return it == table.end() ? 0 : double(it - table.begin());
}

void add_trace(std::vector<double>& out, const std::string& stream, const std::string& kind,
               const std::string& name, double t0, double t1, double bytes) {
  const double e[6] = {index_of(kTraceStreams, stream),
                       index_of(kTraceKinds, kind),
                       index_of(kTraceNames, name),
                       t0,
                       t1,
                       bytes};
  out.insert(out.end(), e, e + 6);
}

// The gathered events on rank 0, and the timeline as Chrome trace JSON (chrome://tracing,
// ui.perfetto.dev): one process per rank, one thread per stream.
void collect_trace(const std::vector<std::vector<double>>& per_rank, RunRecord& rec,
                   const std::string& json_path) {
  for (std::size_t r = 0; r < per_rank.size(); ++r)
    for (std::size_t i = 0; i + 6 <= per_rank[r].size(); i += 6) {
      const double* e = per_rank[r].data() + i;
      rec.trace.push_back({int(r), kTraceStreams[std::size_t(e[0])], kTraceKinds[std::size_t(e[1])],
                           kTraceNames[std::size_t(e[2])], e[3], e[4], e[5]});
    }
  std::FILE* f = std::fopen(json_path.c_str(), "w");
  if (!f) throw Error("--trace: cannot write " + json_path, "check --out");
  std::fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
  for (std::size_t i = 0; i < rec.trace.size(); ++i) {
    const TraceEvent& e = rec.trace[i];
    const std::string label = e.name.empty() ? e.kind : e.kind + " " + e.name;
    std::fprintf(f,
                 "{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, "
                 "\"dur\": %.3f, \"pid\": %d, \"tid\": \"%s\", \"args\": {\"bytes\": %.0f}}%s\n",
                 label.c_str(), e.kind.c_str(), e.t0 * 1e6, (e.t1 - e.t0) * 1e6, e.rank,
                 e.stream.c_str(), e.bytes, i + 1 < rec.trace.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  if (std::fclose(f) != 0) throw Error("--trace: cannot write " + json_path, "check --out");
}

// <out>/<id>.trace.json beside <out>/<id>.h5.
std::string trace_json_path(const std::string& run_file) {
  return std::filesystem::path(run_file).replace_extension(".trace.json").string();
}

std::string hidden_temporary(const std::string& path) {
  const std::filesystem::path p(path);
  return (p.parent_path() / ("." + p.filename().string() + ".tmp-" + std::to_string(::getpid())))
      .string();
}

}  // namespace

void begin_record(const RunConfig& config, RunState& state) {
  {
    std::lock_guard lock(state.mu);
    RunRecord& r = state.record;
    r.created_utc = utc_timestamp();
    r.command_line = config.command_line;
    r.config = config.resolved();
    r.provenance = collect_provenance();
    r.provenance.emplace_back("flops_per_token_formula",
                              "6*N + 12*L*h*s; N = non-embedding params + tied LM head (V*h)");
    r.ranks = mpi::world_size();
    r.run_id = config.run_id;
    for (const auto& [name, unit] : kStepMetrics) {
      r.step_metrics.push_back(name);
      r.step_units[name] = unit;
      r.step_values[name] = {};  // [ranks x 0] until the first step ends
    }
    state.path = (std::filesystem::path(config.out_dir) / (r.run_id + ".h5")).string();
  }
  std::vector<std::string> hosts = mpi::control_gather_strings(mpi::processor_name());
  if (mpi::world_rank() != 0) return;
  std::lock_guard lock(state.mu);
  state.record.hostnames = hosts;
}

void write_failure(RunState& state, const std::string& status, const std::string& error,
                   bool replace) {
  std::lock_guard lock(state.mu);
  if (state.written || state.path.empty()) return;
  state.record.status = status;
  state.record.error = one_line(error);
  state.written = true;  // one attempt: a second would only repeat the first one's error
  try {
    write_run_file(state.record, state.path, replace);
    std::fprintf(stderr, "runner: run file %s (status %s)\n", state.path.c_str(), status.c_str());
    std::error_code ignored;  // an earlier run's timeline, under the same id, would not match
    if (replace) std::filesystem::remove(trace_json_path(state.path), ignored);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "runner: could not write the failure file: %s\n",
                 one_line(e.what()).c_str());
  }
}

void train(const RunConfig& config, const PluginRegistry& registry, RunState& state,
           Watchdog& watchdog) {
  const int rank = mpi::world_rank(), world = mpi::world_size();
  const bool root = rank == 0;
  const TrainSpec& t = config.train;
  const int steps = t.steps;
  const int micro_steps = t.micro_steps(config.mesh);
  const double global_tokens = double(t.global_batch) * config.model.seq;

  const StrategySpec* spec = nullptr;
  registry.find(config.plugin, &spec);
  Options options = validate_options(*spec, config.plugin_opts);
  std::shared_ptr<Strategy> strategy = registry.create(config.plugin, options);

  // The CPU peak for MFU: this process's best SGEMM rate on its BLAS threads, or the user's
  // figure (--peak-tflops), e.g. a data-sheet peak to compare machines.
  const double peak_flops =
      config.peak_tflops > 0 ? config.peak_tflops * 1e12 : cpu::calibrate_sgemm_flops(0.3);

  CommLedger ledger;
  watchdog.attach(&ledger);
  struct Detach {
    Watchdog& w;
    ~Detach() { w.attach(nullptr); }
  } detach{watchdog};
  CoreContext ctx(config, ledger);
  const std::uint64_t baseline_bytes = mark_runtime_baseline(ctx.memory());  // process_memory.hpp
  strategy->setup(ctx);

  if (root) {
    std::printf(
        "strata: %s on %d rank(s) (%d node(s) x %d), mesh dp=%d tp=%d pp=%d, model %s "
        "(%lld params), %d x %d seq/step (micro-batch %d, %d micro-step(s)), %s\n",
        config.plugin.c_str(), world, config.mesh.nodes, config.mesh.ranks_per_node, config.mesh.dp,
        config.mesh.tp, config.mesh.pp, config.model.preset.c_str(),
        (long long)config.model.total_params(), t.global_batch, config.model.seq, t.micro_batch,
        micro_steps, ctx.data().describe().c_str());
    std::printf("strata: %s peak %.1f GFLOP/s per rank (%d BLAS thread(s))\n",
                config.peak_tflops > 0 ? "given (--peak-tflops)" : "calibrated SGEMM",
                peak_flops / 1e9, cpu::blas_threads());
    std::fflush(stdout);
  }

  if (config.calibrate_comm) {
    std::vector<CalibrationPoint> calibration =
        calibrate_comm(ctx, ledger, default_calibration_sizes(), kCalibrationIterations);
    if (root) print_calibration(calibration, config.transport);
    std::lock_guard lock(state.mu);  // rank 0's watchdog may be writing a failure file from it
    state.record.calibration = std::move(calibration);
  }

  // A common time base for --trace: every rank's clock at the same barrier.
  if (config.trace) mpi::control_barrier();
  const double t_base = now();
  std::vector<double> trace;

  std::vector<StepRow> rows;
  std::vector<double> global_loss, step_max;
  for (int step = 0; step < steps; ++step) {
    ledger.set_step(step);
    ctx.begin_step();
    double t0 = now();
    strategy->train_step(ctx, step);
    ctx.synchronize_streams();
    double t1 = now();
    ledger.set_step(-1);

    StepRow row;
    row.metric["step_s"] = t1 - t0;
    row.metric["forward_s"] = ctx.phase_s(Phase::forward);
    row.metric["backward_s"] = ctx.phase_s(Phase::backward);
    row.metric["optimizer_s"] = ctx.phase_s(Phase::optimizer);
    row.metric["bubble_s"] = ctx.phase_s(Phase::bubble);
    row.metric["tokens"] = ctx.loss_tokens();
    std::vector<CommRecord> records;
    Intervals waits;
    ledger.drain(&records, &waits);  // streams are synchronised: all of this step, nothing else
    comm_of_step(records, waits, row);
    if (config.trace) {
      for (const CommRecord& r : records)
        add_trace(trace, r.stream, op_name(r.op), r.group, r.t0 - t_base, r.t1 - t_base,
                  double(r.bytes));
      for (const CoreContext::Interval& i : ctx.take_intervals()) {
        const char* phase = kPhaseNames[static_cast<int>(i.phase)];
        add_trace(trace, "compute", phase, "", i.t0 - t_base, i.t1 - t_base, 0);
      }
    }

    double sums[2] = {ctx.loss_sum(), ctx.loss_tokens()};
    mpi::control_allreduce_sum(sums, 2);
    double smax = t1 - t0;
    mpi::control_allreduce_max(&smax, 1);
    double loss = sums[1] > 0 ? sums[0] / sums[1] : kNaN;
    row.metric["loss"] = loss;
    rows.push_back(row);
    global_loss.push_back(loss);
    step_max.push_back(smax);
    if (root) {
      std::lock_guard lock(state.mu);  // keep the failure file current
      RunRecord& r = state.record;
      r.steps = step + 1;
      for (const auto& [name, unit] : kStepMetrics) {
        std::vector<double> m(std::size_t(world) * r.steps, kNaN);
        for (int s = 0; s <= step; ++s) m[s] = rows[s].metric[name];
        r.step_values[name] = m;
      }
    }
    if (root && !config.quiet) {
      std::printf("step %4d/%d  loss %.4f  step %8.1f ms  %10.0f tok/s\n", step + 1, steps, loss,
                  smax * 1e3, global_tokens / smax);
      std::fflush(stdout);
    }
  }

  // Gather every rank's measurements and predictions on rank 0.
  std::vector<double> local;
  for (const auto& [name, unit] : kStepMetrics)
    for (const StepRow& r : rows) local.push_back(r.metric.at(name));
  for (int op = 0; op < kNumCommOps; ++op)
    for (const StepRow& r : rows) {
      local.push_back(r.calls[op]);
      local.push_back(r.bytes[op]);
      local.push_back(r.time_s[op]);
      local.push_back(r.bus_bytes[op]);
    }
  PredictInput pin{config.mesh, config.model, t, rank};
  Prediction pred = strategy->predict(pin);
  for (int tag = 0; tag < kNumMemTags; ++tag)
    local.push_back(double(ctx.memory().peak(static_cast<MemTag>(tag))));
  for (int tag = 0; tag < kNumMemTags; ++tag) local.push_back(pred.memory_bytes[tag]);
  for (int op = 0; op < kNumCommOps; ++op) {
    auto it = pred.comm_bytes_per_step.find(op_name(static_cast<CommOp>(op)));
    local.push_back(it == pred.comm_bytes_per_step.end() ? 0.0 : it->second);
  }
  local.push_back(double(peak_rss_bytes()));
  local.push_back(peak_flops);
  local.push_back(double(baseline_bytes));             // at peak_off + 1
  local.push_back(double(ctx.memory().total_peak()));  // at peak_off + 2
  const std::size_t per_rank = local.size();
  std::vector<double> all = mpi::control_gather(local);
  std::vector<std::vector<double>> traces;
  if (config.trace) traces = mpi::control_gather_varying(trace);
  if (!root) return;

  std::lock_guard lock(state.mu);
  // The watchdog wrote a failure file while the gathers above were in flight (a signal, a
  // timeout): that file stands, and the watchdog ends the process.
  if (state.written) return;
  RunRecord& rec = state.record;
  rec.steps = steps;
  rec.step_metrics.clear();
  auto at = [&](int r, std::size_t i) { return all[std::size_t(r) * per_rank + i]; };
  std::size_t off = 0;
  for (const auto& [name, unit] : kStepMetrics) {
    rec.step_metrics.push_back(name);
    rec.step_units[name] = unit;
    std::vector<double>& m = rec.step_values[name];
    m.assign(std::size_t(world) * steps, 0);
    for (int r = 0; r < world; ++r)
      for (int s = 0; s < steps; ++s) m[std::size_t(r) * steps + s] = at(r, off + s);
    off += steps;
  }
  std::vector<double> predicted_comm(kNumCommOps, 0);
  std::size_t comm_off = off;
  off += std::size_t(kNumCommOps) * steps * 4;
  std::size_t mem_off = off, pred_off = off + kNumMemTags, pcomm_off = off + 2 * kNumMemTags;
  std::size_t rss_off = pcomm_off + kNumCommOps, peak_off = rss_off + 1;
  for (int op = 0; op < kNumCommOps; ++op) {
    double predicted = 0, used = 0;
    for (int r = 0; r < world; ++r) predicted = std::max(predicted, at(r, pcomm_off + op));
    CommSeries cs;
    cs.predicted_bytes_per_step = predicted;
    for (int r = 0; r < world; ++r) cs.predicted_bytes_per_rank.push_back(at(r, pcomm_off + op));
    for (int r = 0; r < world; ++r)
      for (int s = 0; s < steps; ++s) {
        std::size_t base = comm_off + (std::size_t(op) * steps + s) * 4;
        const double t = at(r, base + 2);
        cs.calls.push_back(at(r, base));
        cs.bytes.push_back(at(r, base + 1));
        cs.time_s.push_back(t);
        cs.algbw.push_back(t > 0 ? at(r, base + 1) / t : 0.0);
        cs.busbw.push_back(t > 0 ? at(r, base + 3) / t : 0.0);
        used += at(r, base);
      }
    if (used > 0 || predicted > 0) rec.comm[op_name(static_cast<CommOp>(op))] = std::move(cs);
  }
  rec.memory_tags.assign(kMemTagNames.begin(), kMemTagNames.end());
  rec.peak_bytes.clear();
  rec.predicted_bytes.assign(kNumMemTags, 0);
  rec.predicted_bytes_per_rank.clear();
  rec.process_peak_bytes.clear();
  rec.baseline_bytes.clear();
  rec.tracked_peak_bytes.clear();
  std::vector<double> peaks;
  for (int r = 0; r < world; ++r) {
    for (int tag = 0; tag < kNumMemTags; ++tag) {
      rec.peak_bytes.push_back(at(r, mem_off + tag));
      rec.predicted_bytes_per_rank.push_back(at(r, pred_off + tag));
      rec.predicted_bytes[tag] = std::max(rec.predicted_bytes[tag], at(r, pred_off + tag));
    }
    rec.process_peak_bytes.push_back(at(r, rss_off));
    rec.baseline_bytes.push_back(at(r, peak_off + 1));
    rec.tracked_peak_bytes.push_back(at(r, peak_off + 2));
    peaks.push_back(at(r, peak_off));
  }

  summarize(config, rec, step_max, global_loss, peaks, pred.bubble_fraction);
  // The timeline is written under a hidden name and put in place only once the run file it belongs
  // to is: a failed run never leaves a truncated JSON, or one that no longer matches its .h5.
  const std::string json = trace_json_path(state.path);
  const std::string json_tmp = hidden_temporary(json);
  try {
    if (config.trace) collect_trace(traces, rec, json_tmp);
    write_run_file(rec, state.path);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(json_tmp, ignored);
    throw;
  }
  state.written = true;
  if (config.trace) {
    std::filesystem::rename(json_tmp, json);
    std::printf("strata: trace of %zu intervals in /trace and %s\n", rec.trace.size(),
                json.c_str());
  } else {
    std::filesystem::remove(json);  // an earlier run's, under the same id
  }
  print_summary(config, rec, state.path);
}

}  // namespace strata
