// What one rank measured and predicted over a run, and how rank 0 turns every rank's report into
// the run record. The report crosses to rank 0 as one gather of doubles; pack() and unpack() share
// one description of the layout (for_each_value), so the two cannot drift apart.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "results/run_record.hpp"
#include "strata/comm.hpp"
#include "strata/memory.hpp"

namespace strata {

// The metrics of /steps, in file order.
enum StepMetric {
  kStepS,
  kForwardS,
  kBackwardS,
  kOptimizerS,
  kCommS,
  kExposedCommS,
  kBubbleS,
  kLoss,
  kTokens,
  kMoeAuxLoss,  // --arch moe only (step_metric_recorded)
  kNumStepMetrics
};
// {name, unit} of each StepMetric.
inline constexpr std::array<std::pair<const char*, const char*>, kNumStepMetrics> kStepMetrics = {
    {{"step_s", "s"},
     {"forward_s", "s"},
     {"backward_s", "s"},
     {"optimizer_s", "s"},
     {"comm_s", "s"},
     {"exposed_comm_s", "s"},
     {"bubble_s", "s"},
     {"loss", "nats"},
     {"tokens", "tokens"},
     {"moe_aux_loss", "1"}}};
// Whether `record` has metric m: moe_aux_loss (the load-balancing term the objective adds to the
// loss, coefficient included, averaged over the step's sequences) only for --arch moe.
bool step_metric_recorded(const RunRecord& record, int m);

// One rank, one step.
struct StepRow {
  std::array<double, kNumStepMetrics> metric{};
  // Per collective: calls, bytes (nccl-tests size convention), seconds, bytes x bus factor.
  std::array<double, kNumCommOps> calls{}, bytes{}, time_s{}, bus_bytes{};
};

struct RankReport {
  std::vector<StepRow> steps;
  std::array<double, kNumMemTags> peak_bytes{};            // the ledger's peak per tag
  std::array<double, kNumMemTags> predicted_bytes{};       // predict() per tag
  std::array<double, kNumCommOps> predicted_comm_bytes{};  // predict() per step, per op
  double process_peak_bytes = 0;                           // VmHWM from the runtime baseline on
  double peak_flops = 0;                                   // the MFU denominator of this rank
  double baseline_bytes = 0;      // resident memory of the runtime before the strategy's setup
  double tracked_peak_bytes = 0;  // the ledger's peak of all tags at once
  double device_peak_bytes = 0;   // a GPU run: the most device memory held at once; else 0

  std::vector<double> pack() const;
  // The reports of every rank from a gather of pack()ed reports of `steps` steps each.
  static std::vector<RankReport> unpack_all(std::span<const double> gathered, int steps);
};

// Fill /steps, /comm and /memory of `record` from every rank's report (index = rank).
void fill_record(const std::vector<RankReport>& reports, RunRecord& record);

// /steps of a failure file from rank 0's steps so far; the other ranks' rows are NaN.
void fill_partial_steps(const std::vector<StepRow>& root_steps, RunRecord& record);

}  // namespace strata
