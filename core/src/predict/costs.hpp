// Internal to the predictor: calibrated durations of one query (predictor.cpp), which the replay
// of the strategy's step plans (plan_replay.cpp) charges.
#pragma once
#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "predict/profile.hpp"
#include "predict/step_query.hpp"
#include "strata/comm.hpp"
#include "strata/mesh.hpp"

namespace strata::time_model {

struct NoTimeModel {
  std::string why;
};

// Calibrated durations for one query: unit passes, the optimizer, comm on the mesh's groups.
struct Costs {
  const MachineProfile& profile;
  const StepQuery& q;
  std::vector<double> fwd, bwd;  // per unit of the whole model, one micro-batch
  // A split backward's two passes (StepPlan::split_backward): the input's gradients (inp) and the
  // deferred weight gradients (wgt; 0 for the embedding and the head), as --calibrate measured a
  // block's, or of bwd the weight GEMMs' FLOP share and the rest (add_weight_passes).
  std::vector<double> inp, wgt;
  // tp > 1: the tp all-reduces inside each unit's passes (included in fwd, bwd), and with expert
  // parallelism the moe blocks' exchanges; empty at tp 1 and ep 1.
  std::vector<double> tp_fwd, tp_bwd;
  double opt_per_param = 0;
  double fresh_per_byte = 0;  // a new buffer allocated and written (the sharded engine's)
  double copy_per_byte = 0;   // a copy between buffers that stay (offload's transfers); 0: unknown
  // How many ranks share the node's peak for MFU: the query's ranks per node on a CPU (they split
  // its cores); on a GPU each rank has its own device, one of the entry's ranks per node.
  int peak_shares = 1;
  // Compute seconds lost per second of comm overlapping it. CPU ranks: 1. The comm stream's
  // thread spins inside a blocking collective, and the compute threads already fill the cores
  // (auto BLAS threads = cores / ranks), so the two share a core while it runs. GPU ranks: 0
  // (the collectives run on the device's own engines).
  double contention = 0;
  std::vector<std::string> notes;
  std::map<std::tuple<CommOp, double, Axis>, double> comm_memo;  // comm(): plans repeat ops

  void note(const std::string& n) {
    if (!n.empty() && std::find(notes.begin(), notes.end(), n) == notes.end()) notes.push_back(n);
  }
  // The compute time that `overlapped` seconds of comm beside it cost (contention above).
  double slowed_by(double overlapped) {
    if (contention <= 0 || overlapped <= 0) return 0;
    note("compute slowed by the comm it overlaps (CPU ranks: they share the cores)");
    return contention * overlapped;
  }
  // (ranks, ranks per node) of rank 0's group on `axis`.
  std::pair<int, int> shape(Axis axis) const {
    const Mesh mesh(q.mesh);
    const std::vector<int> g = mesh.group(axis, 0);
    int same_node = 0;
    for (int r : g) same_node += mesh.node_of(r) == mesh.node_of(g.front());
    return {int(g.size()), same_node};
  }
  // Seconds of `op` moving nccl-tests `bytes` on rank 0's `axis` group. Ops the calibration does
  // not measure borrow a measured op's fit: reduce that of all_reduce, broadcast that of
  // all_gather, a send of b bytes a 2-rank all_gather of 2b (each rank sends b); all_to_all that
  // of all_gather (the same bus bytes) in a profile made before it was measured.
  double comm(CommOp op, double bytes, Axis axis) {
    const auto key = std::make_tuple(op, bytes, axis);
    if (const auto it = comm_memo.find(key); it != comm_memo.end()) return it->second;
    return comm_memo[key] = comm_uncached(op, bytes, axis);
  }
  double comm_uncached(CommOp op, double bytes, Axis axis) {
    auto [ranks, per_node] = shape(axis);
    std::string use = op_name(op), how;
    if (op == CommOp::send || op == CommOp::recv) {
      use = "all_gather", bytes *= 2;
      per_node = per_node >= 2 ? 2 : 1, ranks = 2;
      note("p2p timed as a 2-rank all_gather");
    } else if (op == CommOp::reduce) {
      use = "all_reduce", note("reduce timed as all_reduce");
    } else if (op == CommOp::broadcast) {
      use = "all_gather", note("broadcast timed as all_gather");
    }
    const int host = q.ranks_on_host > 0 ? q.ranks_on_host : q.mesh.ranks_per_node;
    double t = comm_time(profile, use, bytes, ranks, per_node, &how, host);
    if (t < 0 && op == CommOp::all_to_all) {
      use = "all_gather", note("all_to_all timed as all_gather (a profile without its fit)");
      t = comm_time(profile, use, bytes, ranks, per_node, &how, host);
    }
    if (t < 0) throw NoTimeModel{"the profile has no " + use + " fit"};
    note(how);
    return t;
  }
};

Costs make_costs(const MachineProfile& profile, const StepQuery& q);

inline double sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

// The plans of `ranks` (rank 0's pp group, one per stage) replayed with c's durations.
StepTime replay_plans(Costs& c, const std::vector<StepPlan>& plans, const std::vector<int>& ranks);

}  // namespace strata::time_model
