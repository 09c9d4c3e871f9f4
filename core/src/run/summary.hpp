// The /summary of a run (DESIGN "Measures") and the lines rank 0 prints at the end.
#pragma once
#include <string>
#include <vector>

#include "results/run_record.hpp"
#include "runner/run_config.hpp"

namespace strata {

// Fill record.summary from the gathered per-step values. step_max: the slowest rank's step time
// per step; loss: the global loss per step; peaks: each rank's peak FLOP/s (node_peak.hpp).
void summarize(const RunConfig& config, RunRecord& record, const std::vector<double>& step_max,
               const std::vector<double>& loss, const std::vector<double>& peaks,
               double predicted_bubble);

void print_summary(const RunConfig& config, const RunRecord& record, const std::string& path);

// The --calibrate-comm table: busbw per group and op (rows) and size (columns).
void print_calibration(const std::vector<CalibrationPoint>& points, const std::string& transport);

// The /summary value `name` of `record`, NaN when it has none.
double summary_value(const RunRecord& record, const std::string& name);

double percentile(std::vector<double> v, double q);  // linear interpolation, q in [0, 1]

// The spread of a run's timed step times: the coefficient of variation (sample standard deviation
// / mean; NaN below 2 steps) and a distribution-free 95% confidence interval of the median, the
// order statistics x(k) and x(n+1-k) with k the largest rank whose binomial tail P(B(n, 1/2) < k)
// is at most 2.5% (coverage at least 95%; NaN bounds below 6 steps, where no k exists).
struct StepNoise {
  double cv, median_low, median_high;
};
StepNoise step_noise(std::vector<double> times);

}  // namespace strata
