#include "run/rank_report.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "strata/types.hpp"

namespace strata {
namespace {

// The packed layout: every value of `r`, in order, passed to f as a (const) double&.
template <class Report, class F>
void for_each_value(Report& r, F&& f) {
  for (auto& s : r.steps) {
    for (auto& v : s.metric) f(v);
    for (auto* series : {&s.calls, &s.bytes, &s.time_s, &s.bus_bytes})
      for (auto& v : *series) f(v);
  }
  for (auto& v : r.peak_bytes) f(v);
  for (auto& v : r.predicted_bytes) f(v);
  for (auto& v : r.predicted_comm_bytes) f(v);
  for (auto* v : {&r.process_peak_bytes, &r.peak_flops, &r.baseline_bytes, &r.tracked_peak_bytes,
                  &r.device_peak_bytes})
    f(*v);
}

std::size_t packed_size(int steps) {
  RankReport shape;
  shape.steps.resize(std::size_t(steps));
  std::size_t n = 0;
  for_each_value(shape, [&](double&) { ++n; });
  return n;
}

// One collective's [ranks x steps] series over every rank.
CommSeries comm_series(const std::vector<RankReport>& reports, int op) {
  CommSeries cs;
  for (const RankReport& r : reports) {
    cs.predicted_bytes_per_rank.push_back(r.predicted_comm_bytes[op]);
    cs.predicted_bytes_per_step = std::max(cs.predicted_bytes_per_step, r.predicted_comm_bytes[op]);
    for (const StepRow& s : r.steps) {
      const double t = s.time_s[op];
      cs.calls.push_back(s.calls[op]);
      cs.bytes.push_back(s.bytes[op]);
      cs.time_s.push_back(t);
      cs.algbw.push_back(t > 0 ? s.bytes[op] / t : 0.0);
      cs.busbw.push_back(t > 0 ? s.bus_bytes[op] / t : 0.0);
    }
  }
  return cs;
}

void set_step_metric_names(RunRecord& record) {
  record.step_metrics.clear();
  for (int m = 0; m < kNumStepMetrics; ++m)
    if (step_metric_recorded(record, m)) {
      record.step_metrics.push_back(kStepMetrics[m].first);
      record.step_units[kStepMetrics[m].first] = kStepMetrics[m].second;
    }
}

}  // namespace

bool step_metric_recorded(const RunRecord& record, int m) {
  if (m != kMoeAuxLoss) return true;
  for (const auto& [key, value] : record.config)
    if (key == "arch") return value == "moe";
  return false;
}

std::vector<double> RankReport::pack() const {
  std::vector<double> out;
  out.reserve(packed_size(int(steps.size())));
  for_each_value(*this, [&](const double& v) { out.push_back(v); });
  return out;
}

std::vector<RankReport> RankReport::unpack_all(std::span<const double> gathered, int steps) {
  const std::size_t each = packed_size(steps);
  if (each == 0 || gathered.size() % each != 0)
    throw Error("internal: gathered " + std::to_string(gathered.size()) +
                " values, not a whole number of rank reports of " + std::to_string(each));
  std::vector<RankReport> reports(gathered.size() / each);
  std::size_t i = 0;
  for (RankReport& r : reports) {
    r.steps.resize(std::size_t(steps));
    for_each_value(r, [&](double& v) { v = gathered[i++]; });
  }
  return reports;
}

void fill_record(const std::vector<RankReport>& reports, RunRecord& record) {
  const int steps = reports.empty() ? 0 : int(reports.front().steps.size());
  record.steps = steps;
  set_step_metric_names(record);
  for (int m = 0; m < kNumStepMetrics; ++m) {
    if (!step_metric_recorded(record, m)) continue;
    std::vector<double>& values = record.step_values[kStepMetrics[m].first];
    values.clear();
    for (const RankReport& r : reports)
      for (const StepRow& s : r.steps) values.push_back(s.metric[m]);  // [ranks x steps]
  }
  record.comm.clear();
  for (int op = 0; op < kNumCommOps; ++op) {
    CommSeries cs = comm_series(reports, op);
    const bool used = std::any_of(cs.calls.begin(), cs.calls.end(), [](double c) { return c > 0; });
    if (used || cs.predicted_bytes_per_step > 0)  // an op nobody uses or predicts is left out
      record.comm[op_name(static_cast<CommOp>(op))] = std::move(cs);
  }
  record.memory_tags.assign(kMemTagNames.begin(), kMemTagNames.end());
  record.peak_bytes.clear(), record.predicted_bytes_per_rank.clear();
  record.predicted_bytes.assign(kNumMemTags, 0);
  record.process_peak_bytes.clear(), record.baseline_bytes.clear();
  record.tracked_peak_bytes.clear(), record.device_peak_bytes.clear();
  for (const RankReport& r : reports) {
    for (int tag = 0; tag < kNumMemTags; ++tag) {
      record.peak_bytes.push_back(r.peak_bytes[tag]);
      record.predicted_bytes_per_rank.push_back(r.predicted_bytes[tag]);
      record.predicted_bytes[tag] = std::max(record.predicted_bytes[tag], r.predicted_bytes[tag]);
    }
    record.process_peak_bytes.push_back(r.process_peak_bytes);
    record.baseline_bytes.push_back(r.baseline_bytes);
    record.tracked_peak_bytes.push_back(r.tracked_peak_bytes);
    if (r.device_peak_bytes > 0) record.device_peak_bytes.push_back(r.device_peak_bytes);
  }
  if (record.device_peak_bytes.size() != reports.size()) record.device_peak_bytes.clear();
}

void fill_partial_steps(const std::vector<StepRow>& root_steps, RunRecord& record) {
  const std::size_t ranks = std::size_t(std::max(1, record.ranks)), steps = root_steps.size();
  record.steps = int(steps);
  set_step_metric_names(record);
  for (int m = 0; m < kNumStepMetrics; ++m) {
    if (!step_metric_recorded(record, m)) continue;
    std::vector<double> values(ranks * steps, std::numeric_limits<double>::quiet_NaN());
    for (std::size_t s = 0; s < steps; ++s) values[s] = root_steps[s].metric[m];
    record.step_values[kStepMetrics[m].first] = std::move(values);
  }
}

}  // namespace strata
