// A machine profile from finished runs (`runner --calibrate --calibrate-from RUN.h5...`,
// docs/predict.md "Predicting step time"): nothing is measured again. Each run file gives
//   comm     the samples of its /calibration (--calibrate-comm), with its mesh's group shapes
//   compute  from its phase timers, when every rank ran the whole model (tp = pp = 1): the timed
//            steps' median of the slowest rank's forward and backward per micro-batch, split over
//            the units by their forward FLOPs; the optimizer phase per parameter the rank updates
//   memory   a sharded run (zero*, fsdp*): the rate of new buffers for which the predictor gives
//            its measured step (the time model is linear in it)
// So a profile made from some strategies' runs predicts others it never saw (the held-out check:
// scripts/heldout.sh).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "predict/predictor.hpp"
#include "predict/profile.hpp"
#include "results/run_record.hpp"

namespace strata {

// What a run file says it ran, as the predictor's question (its plans: left empty; the caller
// makes them with step_query from the run's strategy and `plugin_opts`), and its measured step p50.
struct RunQuestion {
  StepQuery query;
  std::vector<std::string> plugin_opts;  // KEY=VALUE, as given to the run
  double step_p50_s = 0;
  double node_peak_flops = 0;  // the run's peak per rank x ranks per node (0: unknown)
  ComputeEntry entry;          // compute_from_run's, where it gave one
};
RunQuestion question_of_run(const RunRecord& run);

// The compute entry of a run whose every rank ran the whole model (fresh_memory_s_per_byte 0),
// its optimizer time over the parameters q.query's plan updates; nullopt with *why otherwise.
std::optional<ComputeEntry> compute_from_run(const RunRecord& run, const RunQuestion& q,
                                             std::string* why);

// The collectives' points of bench_comm's Google Benchmark JSON (--benchmark_out=FILE): all_reduce,
// reduce_scatter and all_gather (in place, as the engines gather) over the group of every rank,
// time = the slowest rank's mean, on
// the context's ranks_per_node (all of them on the measuring host). One transport per file (its
// name in *transport). Throws ConfigError naming the file and what is wrong.
std::vector<CommSample> samples_from_bench(const std::string& path, std::string* transport);

// The new-buffer rate for which predict_step_time(profile, q) gives `measured_s`; nullopt when
// the query's plan allocates no new buffer (not a sharded strategy) or is not modelled.
std::optional<double> fit_fresh_rate(MachineProfile profile, const StepQuery& q, double measured_s);

}  // namespace strata
