// --calibrate-comm: what the run's transport can do on this allocation, measured the nccl-tests way
// on the run's own mesh groups before the timed steps, so a study shows each strategy's comm time
// next to the bandwidth the transport reaches for the same op, group and size.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "results/run_record.hpp"
#include "strata/comm.hpp"
#include "strata/context.hpp"

namespace strata {

// The ops a machine profile fits (--calibrate-comm measures them, bench_comm's points of them
// become samples, a published profile states them); the predictor times the others by these
// (predict/costs.hpp).
inline constexpr CommOp kCalibratedCommOps[] = {CommOp::all_reduce, CommOp::reduce_scatter,
                                                CommOp::all_gather, CommOp::all_to_all};

// Timed iterations per point (after one warm-up).
inline constexpr int kCalibrationIterations = 5;

// The sizes measured by default: 64 KiB, 1 MiB and 16 MiB (a bucket-sized message and two
// around it).
std::vector<std::size_t> default_calibration_sizes();

// Collective over the world: every rank calls it with the same arguments. Measures
// kCalibratedCommOps at each size on every mesh axis whose groups have more than one rank (groups
// of one axis run concurrently, as in training), checks the reduced data, and leaves `ledger` empty
// (calibration is not training traffic). Returns the points on every rank: time_s is the median
// over iterations of the slowest rank's time (as nccl-tests reports).
std::vector<CalibrationPoint> calibrate_comm(Context& ctx, CommLedger& ledger,
                                             const std::vector<std::size_t>& sizes, int iterations);

}  // namespace strata
