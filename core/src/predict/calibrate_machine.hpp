// `runner --calibrate --profile FILE`: measure this allocation into a machine profile
// (profile.hpp) and merge it into FILE (created if missing). Every rank measures at once, as in
// training (ranks sharing a node share its cores and memory bandwidth):
//   compute  each unit pass of the run's model and micro-batch (forward, backward; backward again
//            under --recompute full and selective for the recompute cost), the median of
//            kComputeIterations after a warm-up, the slowest rank's; AdamW per parameter
//   comm     --calibrate-comm's measurement (calibrate.hpp) at 4 KiB .. 16 MiB on every mesh
//            group of more than one rank, fitted per op and group shape
// Compute and comm are measured in kCalibrationRounds rounds, one after the other; the median of
// the rounds is kept, and the compute entry's pass_spread says how far apart they lay.
// A few seconds on the small model. CPU only in this first landing.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runner/run_config.hpp"
#include "strata/plugin.hpp"

namespace strata {

inline constexpr int kComputeIterations = 3;
inline constexpr int kCalibrationRounds = 3;

// Collective over the world (after MPI init). Rank 0 writes the merged profile and prints it.
void calibrate_machine(const RunConfig& config, int threads_per_rank);

// --calibrate --calibrate-from RUN.h5...: no measurement, no MPI: each run file's comm samples
// and compute entry (profile_from_runs.hpp) merged into --profile, refitted. strategy_of makes a
// run's strategy from its options (validated against the plugin's spec, defaults filled in).
using StrategyOf = std::function<std::shared_ptr<Strategy>(
    const std::string& strategy, const std::vector<std::string>& options)>;
void calibrate_from_runs(const RunConfig& config, const StrategyOf& strategy_of);

}  // namespace strata
