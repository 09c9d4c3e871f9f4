// --calibrate-comm (see calibrate.hpp).
#include "run/calibrate.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "comm/mpi_transport.hpp"
#include "run/process_memory.hpp"

namespace strata {

std::vector<std::size_t> default_calibration_sizes() { return {64u << 10, 1u << 20, 16u << 20}; }

namespace {

// One call of `op` on `g` over `n` elements of `in` (all_gather: its shard) into `out`.
void run_op(Group& g, CommOp op, BufferView in, BufferView out) {
  const std::size_t n = in.count, shard = n / std::size_t(g.size());
  switch (op) {
    case CommOp::all_reduce:
      g.all_reduce(in);
      break;
    case CommOp::reduce_scatter:
      g.reduce_scatter(in, slice(out, 0, shard));
      break;
    case CommOp::all_to_all:
      g.all_to_all(in, out);
      break;
    default:
      g.all_gather(slice(in, 0, shard), out);
      break;
  }
}

// `in` held ones, so every output element must be g.size() (reductions) or 1 (all_gather,
// all_to_all);
// sampled elements, copied to the host first (the buffers are on the run's device).
void check_result(const Group& g, CommOp op, BufferView in, BufferView out) {
  const std::size_t n = in.count, shard = n / std::size_t(g.size());
  const std::size_t count = op == CommOp::reduce_scatter ? shard : n;
  std::vector<float> got(count);
  copy_across(view(got.data(), count), slice(op == CommOp::all_reduce ? in : out, 0, count));
  const bool moved = op == CommOp::all_gather || op == CommOp::all_to_all;
  const float want = moved ? 1.0f : float(g.size());
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
  // On the run's device (NCCL moves device memory), in a ledger of their own: not the run's.
  MemoryLedger scratch(ctx.memory().device());
  std::vector<CalibrationPoint> points;
  std::vector<double>
      medians;  // this rank's, one per point; the max over ranks is taken at the end
  std::vector<double> factors;  // bus factor per point
  for (const auto& [axis, axis_name] : kAxes) {
    Group& g = ctx.group(axis);
    double size = g.size();
    mpi::control_allreduce_max(&size, 1);  // every rank skips the same axes
    if (size < 2) continue;
    // ep's and cp's groups where they are groups of their own: at ep = 1 ep_dp is dp, at ep = dp
    // ep is, and at dp = 1 cp is dp.
    const MeshSpec& m = ctx.mesh();
    if ((axis == Axis::ep && m.ep == m.dp) || (axis == Axis::ep_dp && m.ep == 1)) continue;
    if (axis == Axis::cp && m.dp == 1) continue;  // then the dp group is the cp group
    for (CommOp op : kCalibratedCommOps)
      for (std::size_t bytes : sizes) {
        // Whole elements, divisible by the group so the shards are equal.
        const std::size_t unit = std::size_t(g.size());
        const std::size_t n = std::max<std::size_t>(unit, bytes / sizeof(float) / unit * unit);
        DeviceBuffer in(scratch, MemTag::workspace, DType::f32, n),
            out(scratch, MemTag::workspace, DType::f32, n);
        std::vector<double> times;
        for (int it = -1; it < iterations; ++it) {  // iteration -1 warms up (connections, pages)
          ctx.ops().fill(in.view(), 1.0);
          ctx.compute_event().wait();  // a GPU's fill done before the clock starts
          g.barrier();
          const double t0 = now();
          run_op(g, op, in.view(), out.view());
          const double t1 = now();
          if (it >= 0) times.push_back(t1 - t0);
        }
        check_result(g, op, in.view(), out.view());
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
