// --calibrate-comm (see calibrate.hpp).
#include "calibrate.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "comm/mpi_transport.hpp"
#include "process_memory.hpp"

namespace strata {

std::vector<std::size_t> default_calibration_sizes() { return {64u << 10, 1u << 20, 16u << 20}; }

namespace {

constexpr std::pair<Axis, const char*> kAxes[] = {{Axis::dp, "dp"},
                                                  {Axis::tp, "tp"},
                                                  {Axis::pp, "pp"},
                                                  {Axis::dp_intra_node, "dp_intra_node"},
                                                  {Axis::dp_inter_node, "dp_inter_node"}};
constexpr CommOp kOps[] = {CommOp::all_reduce, CommOp::reduce_scatter, CommOp::all_gather};

// One call of `op` with nccl-tests `bytes` on `g`: in holds ones, so every output element must be
// g.size() (reductions) or 1 (all_gather).
void run_op(Group& g, CommOp op, std::vector<float>& in, std::vector<float>& out) {
  const std::size_t n = in.size(), shard = n / std::size_t(g.size());
  switch (op) {
    case CommOp::all_reduce:
      g.all_reduce(view(in.data(), n));
      break;
    case CommOp::reduce_scatter:
      g.reduce_scatter(view(in.data(), n), view(out.data(), shard));
      break;
    default:
      g.all_gather(view(in.data(), shard), view(out.data(), n));
      break;
  }
}

void check_result(const Group& g, CommOp op, const std::vector<float>& in,
                  const std::vector<float>& out) {
  const std::size_t n = in.size(), shard = n / std::size_t(g.size());
  const float* got = op == CommOp::all_reduce ? in.data() : out.data();
  const std::size_t count = op == CommOp::reduce_scatter ? shard : n;
  const float want = op == CommOp::all_gather ? 1.0f : float(g.size());
  for (std::size_t i = 0; i < count; i += std::max<std::size_t>(1, count / 97))
    if (got[i] != want)
      throw Error("--calibrate-comm: " + std::string(op_name(op)) + " on group " + g.name() +
                      " returned " + std::to_string(got[i]) + " at element " + std::to_string(i) +
                      ", expected " + std::to_string(want),
                  "the transport delivered wrong data: rerun with --transport mpi to compare");
}

}  // namespace

std::vector<CalibrationPoint> calibrate_comm(Context& ctx, CommLedger& ledger,
                                             const std::vector<std::size_t>& sizes,
                                             int iterations) {
  const OutsideProcessPeak outside_peak;  // its buffers are measurement, not training
  std::vector<CalibrationPoint> points;
  std::vector<double>
      medians;  // this rank's, one per point; the max over ranks is taken at the end
  std::vector<double> factors;  // bus factor per point
  for (const auto& [axis, axis_name] : kAxes) {
    Group& g = ctx.group(axis);
    double size = g.size();
    mpi::control_allreduce_max(&size, 1);  // every rank skips the same axes
    if (size < 2) continue;
    for (CommOp op : kOps)
      for (std::size_t bytes : sizes) {
        // Whole elements, divisible by the group so the shards are equal.
        const std::size_t unit = std::size_t(g.size());
        const std::size_t n = std::max<std::size_t>(unit, bytes / sizeof(float) / unit * unit);
        std::vector<float> in(n), out(n);
        std::vector<double> times;
        for (int it = -1; it < iterations; ++it) {  // iteration -1 warms up (connections, pages)
          std::fill(in.begin(), in.end(), 1.0f);
          g.barrier();
          const double t0 = now();
          run_op(g, op, in, out);
          const double t1 = now();
          if (it >= 0) times.push_back(t1 - t0);
        }
        check_result(g, op, in, out);
        std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
        medians.push_back(times[times.size() / 2]);
        CalibrationPoint p;
        p.group = axis_name;
        p.op = op_name(op);
        p.ranks = g.size();
        p.bytes = double(n * sizeof(float));
        points.push_back(p);
        factors.push_back(bus_factor(op, g.size()));
      }
  }
  if (!medians.empty()) mpi::control_allreduce_max(medians.data(), int(medians.size()));
  for (std::size_t i = 0; i < points.size(); ++i) {
    CalibrationPoint& p = points[i];
    p.time_s = medians[i];
    p.algbw = p.time_s > 0 ? p.bytes / p.time_s : 0.0;
    p.busbw = p.algbw * factors[i];
  }
  ledger.clear();
  return points;
}

}  // namespace strata
