// --calibrate-comm: what the run's transport can do on this allocation, measured the nccl-tests way
// on the run's own mesh groups before the timed steps, so a study shows each strategy's comm time
// next to the bandwidth the transport reaches for the same op, group and size.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "strata/comm.hpp"
#include "strata/context.hpp"

namespace strata {

// One (group, op, size) point. time_s is the median over iterations of the slowest rank's time
// (as nccl-tests reports); bytes follow the nccl-tests size convention.
struct CalibrationRow {
  std::string group;  // dp, tp, pp, dp_intra_node, dp_inter_node
  std::string op;     // all_reduce, reduce_scatter, all_gather
  int ranks = 0;      // group size
  double bytes = 0;
  double time_s = 0;
  double algbw = 0;  // bytes/s = bytes / time_s
  double busbw = 0;  // bytes/s = algbw x bus_factor(op, ranks)
};

// Timed iterations per point (after one warm-up).
inline constexpr int kCalibrationIterations = 5;

// The sizes measured by default: 64 KiB, 1 MiB and 16 MiB (a bucket-sized message and two
// around it).
std::vector<std::size_t> default_calibration_sizes();

// Collective over the world: every rank calls it with the same arguments. Measures all_reduce,
// reduce_scatter and all_gather at each size on every mesh axis whose groups have more than one
// rank (groups of one axis run concurrently, as in training), checks the reduced data, and
// leaves `ledger` empty (calibration is not training traffic). Returns the rows on every rank.
std::vector<CalibrationRow> calibrate_comm(Context& ctx, CommLedger& ledger,
                                           const std::vector<std::size_t>& sizes, int iterations);

}  // namespace strata
