#include "run/summary.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "provenance/node_peak.hpp"
#include "provenance/topology.hpp"
#include "run/calibrate.hpp"
#include "strata/memory.hpp"
#include "util/format.hpp"

namespace strata {

void print_calibration(const std::vector<CalibrationPoint>& points, const std::string& transport) {
  std::vector<double> sizes;
  for (const CalibrationPoint& p : points)
    if (std::find(sizes.begin(), sizes.end(), p.bytes) == sizes.end()) sizes.push_back(p.bytes);
  std::printf("strata: comm calibration over %s (busbw GB/s; slowest rank, median of %d)\n",
              transport.c_str(), kCalibrationIterations);
  if (points.empty()) {
    std::printf("  no mesh group has more than one rank: nothing to calibrate\n");
    return;
  }
  std::printf("  %-14s %5s %-15s", "group", "ranks", "op");
  for (double s : sizes) std::printf(" %10s", human_bytes(s).c_str());
  std::printf("\n");
  for (std::size_t i = 0; i < points.size(); i += sizes.size()) {
    std::printf("  %-14s %5.0f %-15s", points[i].group.c_str(), points[i].ranks,
                points[i].op.c_str());
    for (std::size_t j = i; j < i + sizes.size() && j < points.size(); ++j)
      std::printf(" %10.3f", points[j].busbw / 1e9);
    std::printf("\n");
  }
  std::fflush(stdout);
}

double summary_value(const RunRecord& record, const std::string& name) {
  for (const Measure& m : record.summary)
    if (m.name == name) return m.value;
  return std::numeric_limits<double>::quiet_NaN();
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  double pos = q * double(v.size() - 1);
  std::size_t lo = std::size_t(pos);
  std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - double(lo)) * (v[hi] - v[lo]);
}

StepNoise step_noise(std::vector<double> v) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  StepNoise noise{nan, nan, nan};
  const std::size_t n = v.size();
  if (n < 2) return noise;
  double mean = 0, ss = 0;
  for (double x : v) mean += x;
  mean /= double(n);
  for (double x : v) ss += (x - mean) * (x - mean);
  noise.cv = mean > 0 ? std::sqrt(ss / double(n - 1)) / mean : nan;
  // P(B < k) summed in log space (n may be large); k grows while the tail stays within 2.5%.
  std::size_t k = 0;
  double tail = 0;
  const double log_total = std::lgamma(double(n) + 1) - double(n) * std::log(2.0);
  while (k < n / 2) {
    const double pk =
        std::exp(log_total - std::lgamma(double(k) + 1) - std::lgamma(double(n - k) + 1));
    if (tail + pk > 0.025) break;
    tail += pk, ++k;
  }
  if (k == 0) return noise;
  std::sort(v.begin(), v.end());
  noise.median_low = v[k - 1], noise.median_high = v[n - k];
  return noise;
}

void summarize(const RunConfig& config, RunRecord& rec, const std::vector<double>& step_max,
               const std::vector<double>& loss, const std::vector<double>& peaks,
               double predicted_bubble) {
  const int world = rec.ranks, steps = rec.steps;
  const double global_tokens = double(config.train.global_batch) * config.model.seq;
  // Over the timed steps (after warm-up). A step's time is the slowest rank's.
  std::vector<double> timed;
  double comm_total = 0, exposed_total = 0, step_total = 0, bubble_total = 0;
  for (int s = config.train.warmup; s < steps; ++s) {
    timed.push_back(step_max[s]);
    for (int r = 0; r < world; ++r) {
      std::size_t i = std::size_t(r) * steps + s;
      comm_total += rec.step_values["comm_s"][i];
      exposed_total += rec.step_values["exposed_comm_s"][i];
      step_total += rec.step_values["step_s"][i];
      bubble_total += rec.step_values["bubble_s"][i];
    }
  }
  const double p50 = percentile(timed, 0.5);
  const StepNoise noise = step_noise(timed);
  const double tokens_per_s = global_tokens / p50;
  const double flops_per_token = config.model.flops_per_token();
  const double flops_per_rank = model_flops_per_rank(tokens_per_s, flops_per_token, world);
  const double peak = percentile(peaks, 0.5);
  // The highest rank's MFU against its own peak (ranks on fuller nodes have smaller shares).
  double mfu_rank_max = std::numeric_limits<double>::quiet_NaN();
  for (double p : peaks)
    if (const double mfu = model_flops_utilization(flops_per_rank, p); !std::isnan(mfu))
      mfu_rank_max = std::isnan(mfu_rank_max) ? mfu : std::max(mfu_rank_max, mfu);
  double peak_tracked = 0;  // largest per-rank sum of the device tags' peaks
  for (int r = 0; r < world; ++r) {
    double sum = 0;
    for (int tag = 0; tag < kNumMemTags; ++tag)
      if (!is_host_tag(MemTag(tag))) sum += rec.peak_bytes[std::size_t(r) * kNumMemTags + tag];
    peak_tracked = std::max(peak_tracked, sum);
  }
  rec.summary = {
      {"tokens_per_s", tokens_per_s, "tokens/s"},
      {"step_s_p50", p50, "s"},
      {"step_s_p95", percentile(timed, 0.95), "s"},
      {"step_s_p5", percentile(timed, 0.05), "s"},
      // --max-cv: a run whose steps vary more than this is marked unstable (not a failure).
      {"unstable", noise.cv > config.max_cv ? 1.0 : 0.0, "1"},
      {"tflops_per_rank", flops_per_rank / 1e12, "TFLOP/s"},
      // No peak (a GPU not in the table, without --peak-tflops): no MFU.
      {"mfu", model_flops_utilization(flops_per_rank, peak), "1"},
      {"mfu_rank_max", mfu_rank_max, "1"},
      {"peak_flops_per_rank", peak, "FLOP/s"},
      {"flops_per_token", flops_per_token, "FLOP"},
      {"global_tokens_per_step", global_tokens, "tokens"},
      {"peak_bytes_max", peak_tracked, "bytes"},
      {"comm_fraction", step_total > 0 ? comm_total / step_total : 0, "1"},
      {"exposed_comm_fraction", step_total > 0 ? exposed_total / step_total : 0, "1"},
      // Idle time of pipeline stages over all ranks' step time (0 without a pipeline).
      {"bubble_fraction", step_total > 0 ? bubble_total / step_total : 0, "1"},
      {"loss_first", loss.front(), "nats"},
      {"loss_last", loss.back(), "nats"},
      {"timed_steps", double(timed.size()), "count"},
  };
  // Undefined figures are left out rather than stored as NaN (which the archive tools flag):
  // the CV below 2 timed steps, the median's interval below 6.
  if (!std::isnan(noise.cv)) rec.summary.push_back({"step_s_cv", noise.cv, "1"});
  if (!std::isnan(noise.median_low)) {
    rec.summary.push_back({"step_s_p50_ci_low", noise.median_low, "s"});
    rec.summary.push_back({"step_s_p50_ci_high", noise.median_high, "s"});
  }
  if (predicted_bubble >= 0)
    rec.summary.push_back({"bubble_fraction_predicted", predicted_bubble, "1"});
  // --profile: the step time predicted before the run (predict/predictor.hpp) beside p50, and
  // the relative error (predicted - measured) / measured; a pipeline's bubble as the profile's
  // replay of its step plan has it (measured pass costs and transfers, where the schedule's
  // bubble_fraction_predicted has equal passes and free transfers).
  if (config.predicted_step_s > 0) {
    rec.summary.push_back({"step_s_predicted", config.predicted_step_s, "s"});
    rec.summary.push_back({"step_s_predicted_error", config.predicted_step_s / p50 - 1, "1"});
    if (predicted_bubble >= 0)
      rec.summary.push_back(
          {"bubble_fraction_replayed", config.predicted_bubble_s / config.predicted_step_s, "1"});
  }
  rec.status = "ok";
}

namespace {

// CPU offload's copies are comm ops (counted in the comm line): the busiest rank's bytes per step.
void print_transfers(const RunRecord& rec) {
  for (const char* op : {"d2h", "h2d"}) {
    auto it = rec.comm.find(op);
    if (it == rec.comm.end() || rec.steps == 0) continue;
    double most = 0;
    for (int r = 0; r < rec.ranks; ++r) {
      double sum = 0;
      for (int s = 0; s < rec.steps; ++s) sum += it->second.bytes[std::size_t(r) * rec.steps + s];
      most = std::max(most, sum / rec.steps);
    }
    std::printf("  %-12s %s per rank per step (device<->host copies, in comm above)\n", op,
                human_bytes(most).c_str());
  }
}

// Training busbw per op next to the best the transport reached in calibration (same op).
void print_busbw(const RunRecord& rec) {
  for (const auto& [op, series] : rec.comm) {
    double best = 0, best_bytes = 0;
    std::string best_group;
    for (const CalibrationPoint& p : rec.calibration)
      if (p.op == op && p.busbw > best) best = p.busbw, best_bytes = p.bytes, best_group = p.group;
    if (best <= 0) continue;
    double sum = 0;
    int n = 0;
    for (double b : series.busbw)
      if (b > 0) sum += b, ++n;
    std::printf("  %-14s busbw %.2f GB/s in training, %.2f GB/s calibrated (%s, %s)\n", op.c_str(),
                n ? sum / n / 1e9 : 0.0, best / 1e9, best_group.c_str(),
                human_bytes(best_bytes).c_str());
  }
}

// Measured / predicted bytes per tag (largest rank), then the device's or the process's peak.
void print_memory(const RunRecord& rec) {
  std::printf("  memory (max over ranks: measured / predicted)\n");
  for (int tag = 0; tag < kNumMemTags; ++tag) {
    double m = 0;
    for (int r = 0; r < rec.ranks; ++r)
      m = std::max(m, rec.peak_bytes[std::size_t(r) * kNumMemTags + tag]);
    std::printf("    %-13s %12s / %s\n", kMemTagNames[tag], human_bytes(m).c_str(),
                human_bytes(rec.predicted_bytes[tag]).c_str());
  }
  // A GPU run: what the device held beyond the ledger (library workspaces, pool rounding), on the
  // rank with the largest device peak.
  if (rec.device_peak_bytes.size() == std::size_t(rec.ranks) &&
      rec.tracked_peak_bytes.size() == std::size_t(rec.ranks) && rec.ranks > 0) {
    const auto k =
        std::size_t(std::max_element(rec.device_peak_bytes.begin(), rec.device_peak_bytes.end()) -
                    rec.device_peak_bytes.begin());
    const double peak = rec.device_peak_bytes[k], tracked = rec.tracked_peak_bytes[k];
    std::printf("    device peak %s = tracked %s + untracked %s (rank %zu)\n",
                human_bytes(peak).c_str(), human_bytes(tracked).c_str(),
                human_bytes(std::max(0.0, peak - tracked)).c_str(), k);
    // What the process held beyond the runtime and the ledger, on the rank with the largest peak.
  } else if (rec.baseline_bytes.size() == std::size_t(rec.ranks) &&
             rec.tracked_peak_bytes.size() == std::size_t(rec.ranks) &&
             rec.process_peak_bytes.size() == std::size_t(rec.ranks) && rec.ranks > 0) {
    std::size_t k = 0;
    for (std::size_t r = 1; r < rec.process_peak_bytes.size(); ++r)
      if (rec.process_peak_bytes[r] > rec.process_peak_bytes[k]) k = r;
    const double peak = rec.process_peak_bytes[k], base = rec.baseline_bytes[k],
                 tracked = rec.tracked_peak_bytes[k], untracked = peak - base - tracked;
    std::printf("    process peak %s = runtime %s + tracked %s + untracked %s%s (rank %zu)\n",
                human_bytes(peak).c_str(), human_bytes(base).c_str(), human_bytes(tracked).c_str(),
                untracked < 0 ? "-" : "", human_bytes(std::fabs(untracked)).c_str(), k);
  }
}

// The nodes the run ran on (hwloc, /provenance/topology); a large job lists its first few.
void print_topology(const RunRecord& rec) {
  constexpr std::size_t shown = 4;
  for (std::size_t i = 0; i < rec.topology.size() && i < shown; ++i)
    std::printf("  node         %s\n", topology_line(rec.topology[i]).c_str());
  if (rec.topology.size() > shown)
    std::printf("  node         ... and %zu more in /provenance/topology\n",
                rec.topology.size() - shown);
}

// The timed steps' spread, and a warning when it is above --max-cv.
void print_noise(const RunConfig& config, const RunRecord& rec) {
  const double cv = summary_value(rec, "step_s_cv");
  if (std::isnan(cv)) return;  // a single timed step
  const double low = summary_value(rec, "step_s_p50_ci_low"),
               high = summary_value(rec, "step_s_p50_ci_high");
  std::printf("  noise        CV %.1f%% of the timed steps, p5 %.1f ms", 100 * cv,
              summary_value(rec, "step_s_p5") * 1e3);
  if (std::isnan(low))
    std::printf(", too few for a median interval\n");
  else
    std::printf(", median's 95%% interval %.1f-%.1f ms\n", low * 1e3, high * 1e3);
  if (config.target_ci > 0 && rec.steps < config.train.steps)
    std::printf("  steps        %d of --steps %d: the median's interval came within +-%g%%\n",
                rec.steps, config.train.steps, 100 * config.target_ci);
  else if (config.target_ci > 0)
    std::printf(
        "  steps        all %d: the median's interval is not within +-%g%% "
        "(--target-ci); raise --steps for a tighter median\n",
        rec.steps, 100 * config.target_ci);
  if (summary_value(rec, "unstable") > 0)
    std::printf(
        "  warning      unstable: the step time varies by CV %.1f%% > --max-cv %.1f%%; repeat the "
        "run, or run it on a quieter machine, before comparing it\n",
        100 * cv, 100 * config.max_cv);
}

}  // namespace

void print_summary(const RunConfig& config, const RunRecord& rec, const std::string& path) {
  auto get = [&](const char* name) { return summary_value(rec, name); };
  std::string source = "unknown", detail;
  for (const auto& [key, value] : rec.provenance) {
    if (key == "peak_flops_source") source = value;
    if (key == "peak_flops_detail") detail = value;
  }
  std::printf("\nsummary  %s, %d rank(s), %d timed step(s)\n", config.plugin.c_str(), rec.ranks,
              int(get("timed_steps")));
  std::printf("  throughput   %.0f tokens/s  (step p50 %.1f ms, p95 %.1f ms)\n",
              get("tokens_per_s"), get("step_s_p50") * 1e3, get("step_s_p95") * 1e3);
  if (std::isnan(get("mfu")))
    std::printf(
        "  compute      %.4f TFLOP/s per rank, no MFU (no peak for this device: give "
        "--peak-tflops)\n",
        get("tflops_per_rank"));
  else
    std::printf("  compute      %.4f TFLOP/s per rank, MFU %.1f%% of %.1f GFLOP/s (peak %s: %s)\n",
                get("tflops_per_rank"), 100 * get("mfu"), get("peak_flops_per_rank") / 1e9,
                source.c_str(), detail.c_str());
  print_noise(config, rec);
  if (config.predicted_step_s > 0)
    std::printf("  predicted    step %.1f ms from --profile (%+.1f%% of the measured p50)\n",
                config.predicted_step_s * 1e3, 100 * get("step_s_predicted_error"));
  if (get("mfu_rank_max") > 1)
    std::printf(
        "  warning      MFU %.1f%% on a rank is above 100%%: its peak (%s) is below what "
        "training reached; %s\n",
        100 * get("mfu_rank_max"), source.c_str(),
        source == "cache" || source == "measured"
            ? "the node's cached peak is dropped and the next run measures it again"
            : "check --peak-tflops");
  std::printf("  loss         %.4f -> %.4f\n", get("loss_first"), get("loss_last"));
  std::printf("  comm         %.1f%% of step time, exposed %.1f%%\n", 100 * get("comm_fraction"),
              100 * get("exposed_comm_fraction"));
  print_transfers(rec);
  if (!std::isnan(get("bubble_fraction_predicted"))) {
    std::printf("  bubble       %.1f%% of stage time idle (predicted %.1f%%",
                100 * get("bubble_fraction"), 100 * get("bubble_fraction_predicted"));
    if (!std::isnan(get("bubble_fraction_replayed")))
      std::printf("; %.1f%% replayed from --profile", 100 * get("bubble_fraction_replayed"));
    std::printf(")\n");
  }
  if (!std::isnan(get("moe_dropped_fraction")))
    std::printf("  routing      %.2f%% of the experts' routing choices dropped over capacity\n",
                100 * get("moe_dropped_fraction"));
  print_busbw(rec);
  print_memory(rec);
  print_topology(rec);
  std::printf("  run file     %s\n", path.c_str());
  std::fflush(stdout);
}

}  // namespace strata
