// The per-rank report: what pack() writes unpack_all() reads back, field by field, and
// fill_record() lays it out as the run file's [ranks x steps] series.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "run/rank_report.hpp"
#include "strata/types.hpp"

namespace {

using strata::RankReport;
using strata::StepRow;

// A report whose every value is distinct: value = 1000 * rank + position.
RankReport numbered_report(int rank, int steps) {
  RankReport r;
  double next = 1000.0 * rank;
  auto number = [&](auto& array) {
    for (double& v : array) v = ++next;
  };
  r.steps.resize(std::size_t(steps));
  for (StepRow& s : r.steps) {
    number(s.metric), number(s.calls), number(s.bytes), number(s.time_s), number(s.bus_bytes);
  }
  number(r.peak_bytes), number(r.predicted_bytes), number(r.predicted_comm_bytes);
  r.process_peak_bytes = ++next, r.peak_flops = ++next, r.baseline_bytes = ++next;
  r.tracked_peak_bytes = ++next;
  return r;
}

void expect_same(const RankReport& a, const RankReport& b) {
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (std::size_t s = 0; s < a.steps.size(); ++s) {
    EXPECT_EQ(a.steps[s].metric, b.steps[s].metric);
    EXPECT_EQ(a.steps[s].calls, b.steps[s].calls);
    EXPECT_EQ(a.steps[s].bytes, b.steps[s].bytes);
    EXPECT_EQ(a.steps[s].time_s, b.steps[s].time_s);
    EXPECT_EQ(a.steps[s].bus_bytes, b.steps[s].bus_bytes);
  }
  EXPECT_EQ(a.peak_bytes, b.peak_bytes);
  EXPECT_EQ(a.predicted_bytes, b.predicted_bytes);
  EXPECT_EQ(a.predicted_comm_bytes, b.predicted_comm_bytes);
  EXPECT_EQ(a.process_peak_bytes, b.process_peak_bytes);
  EXPECT_EQ(a.peak_flops, b.peak_flops);
  EXPECT_EQ(a.baseline_bytes, b.baseline_bytes);
  EXPECT_EQ(a.tracked_peak_bytes, b.tracked_peak_bytes);
}

TEST(RankReport, PackedReportsOfThreeRanksUnpackFieldByField) {
  const int steps = 4;
  std::vector<double> gathered;
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<double> packed = numbered_report(rank, steps).pack();
    gathered.insert(gathered.end(), packed.begin(), packed.end());
  }
  const std::vector<RankReport> reports = RankReport::unpack_all(gathered, steps);
  ASSERT_EQ(reports.size(), 3u);
  for (int rank = 0; rank < 3; ++rank) expect_same(reports[rank], numbered_report(rank, steps));
}

TEST(RankReport, AGatherOfTheWrongSizeIsRefused) {
  std::vector<double> packed = numbered_report(0, 3).pack();
  packed.pop_back();
  EXPECT_THROW(RankReport::unpack_all(packed, 3), strata::Error);
  EXPECT_THROW(RankReport::unpack_all(numbered_report(0, 3).pack(), 2), strata::Error);
}

TEST(RankReport, FillRecordLaysOutRanksBySteps) {
  const int steps = 3;
  std::vector<RankReport> reports = {numbered_report(0, steps), numbered_report(1, steps)};
  // Rank 1 never calls all_gather and nobody predicts it: no /comm/all_gather.
  const int gather = static_cast<int>(strata::CommOp::all_gather);
  for (RankReport& r : reports) {
    r.predicted_comm_bytes[gather] = 0;
    for (StepRow& s : r.steps) s.calls[gather] = 0;
  }
  strata::RunRecord rec;
  rec.ranks = 2;
  strata::fill_record(reports, rec);
  EXPECT_EQ(rec.steps, steps);
  const std::vector<double>& loss = rec.step_values.at("loss");
  ASSERT_EQ(loss.size(), 6u);
  EXPECT_EQ(loss[1 * steps + 2], reports[1].steps[2].metric[strata::kLoss]);  // rank 1, step 2
  EXPECT_EQ(rec.comm.count("all_gather"), 0u);
  const strata::CommSeries& ar = rec.comm.at("all_reduce");
  const int op = static_cast<int>(strata::CommOp::all_reduce);
  const StepRow& s = reports[1].steps[0];
  EXPECT_EQ(ar.calls[1 * steps], s.calls[op]);
  EXPECT_DOUBLE_EQ(ar.busbw[1 * steps], s.bus_bytes[op] / s.time_s[op]);
  EXPECT_EQ(ar.predicted_bytes_per_step,
            std::max(reports[0].predicted_comm_bytes[op], reports[1].predicted_comm_bytes[op]));
  ASSERT_EQ(rec.peak_bytes.size(), 2u * strata::kNumMemTags);
  EXPECT_EQ(rec.peak_bytes[strata::kNumMemTags + 1], reports[1].peak_bytes[1]);
  EXPECT_EQ(rec.tracked_peak_bytes[1], reports[1].tracked_peak_bytes);
}

TEST(RankReport, AFailureFileHoldsRankZerosStepsAndNaNForTheOthers) {
  strata::RunRecord rec;
  rec.ranks = 3;
  const RankReport root = numbered_report(0, 2);
  strata::fill_partial_steps(root.steps, rec);
  EXPECT_EQ(rec.steps, 2);
  const std::vector<double>& step_s = rec.step_values.at("step_s");
  ASSERT_EQ(step_s.size(), 6u);
  EXPECT_EQ(step_s[1], root.steps[1].metric[strata::kStepS]);
  for (std::size_t i = 2; i < 6; ++i) EXPECT_TRUE(std::isnan(step_s[i]));
  // Every metric but a mixture of experts' load-balancing term.
  EXPECT_EQ(rec.step_metrics.size(), std::size_t(strata::kNumStepMetrics) - 1);
  EXPECT_EQ(rec.step_values.count("moe_aux_loss"), 0u);
}

// /steps/moe_aux_loss is a moe run's only, with the step's value as rank 0 reported it.
TEST(RankReport, OnlyAMixtureOfExpertsHasItsLoadBalancingTerm) {
  std::vector<RankReport> reports = {numbered_report(0, 2)};
  for (const char* arch : {"llama", "moe"}) {
    strata::RunRecord rec;
    rec.ranks = 1;
    rec.config = {{"arch", arch}};
    strata::fill_record(reports, rec);
    const bool moe = std::string(arch) == "moe";
    EXPECT_EQ(rec.step_values.count("moe_aux_loss"), moe ? 1u : 0u) << arch;
    EXPECT_EQ(rec.step_metrics.size(), std::size_t(strata::kNumStepMetrics) - (moe ? 0 : 1));
    if (moe)
      EXPECT_EQ(rec.step_values.at("moe_aux_loss")[1],
                reports[0].steps[1].metric[strata::kMoeAuxLoss]);
  }
}

}  // namespace
