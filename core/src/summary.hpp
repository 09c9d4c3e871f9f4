// The /summary of a run (DESIGN "Measures") and the lines rank 0 prints at the end.
#pragma once
#include <string>
#include <vector>

#include "config.hpp"
#include "results/run_record.hpp"

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

}  // namespace strata
