// Predicted step time (docs/predict.md "Predicting step time"): a machine profile's calibrated unit
// passes and comm fits charged to the strategy's own step plan (Strategy::plan_step,
// strata/step_plan.hpp), replayed per pipeline stage with a compute clock and the comm streams'
// overlap, beside the strategy's exact predict() (bytes, memory, bubble). The core knows no
// strategy by name: a plugin whose plan_step() gives no plan (or says why not) is reported as "no
// time model".
//
// What the core charges, whatever the plugin: a unit's forward or backward as this mesh's
// StageModel runs it (tp > 1: the profile's tp passes when it has them, else the GEMM passes at
// 1/tp of its time plus the tp all-reduces of Megatron's split on the compute thread), the
// optimizer per parameter, a new buffer per byte, a host copy per byte, each collective by its fit
// for the group's shape, and on CPU ranks the compute the hidden comm takes (Costs::contention).
#pragma once
#include <string>
#include <vector>

#include "predict/profile.hpp"
#include "strata/plugin.hpp"

namespace strata {

struct StepQuery {
  std::string strategy;  // a strategy name (ddp, zero3, 1f1b, ...), for messages
  MeshSpec mesh;
  ModelSpec model;
  TrainSpec train;
  int threads = 1;  // BLAS threads per rank
  // Ranks computing on this rank's host, when not mesh.ranks_per_node: virtual nodes (--nodes on
  // one machine) put every rank on it. Picks the compute entry and the ranks sharing the peak.
  int ranks_on_host = 0;
  // plan_step() of rank 0's pp group, one per stage (step_query below).
  std::vector<StepPlan> plans;
};

// The question for `strategy` on this configuration, its plans asked of rank 0's pp group.
StepQuery step_query(const std::string& name, const Strategy& strategy, const MeshSpec& mesh,
                     const ModelSpec& model, const TrainSpec& train, int threads,
                     int ranks_on_host = 0);

struct StepTime {
  bool modelled = false;
  std::string why;  // when not modelled: "no time model: ..."
  double step_s = 0;
  double compute_s = 0;  // the slowest rank's forward + backward + optimizer
  double comm_s = 0;     // that rank's comm stream busy time
  // Comm no compute hides: step - compute on that rank for the data-parallel models; for
  // pipelines the comm after the schedule (transfers inside it are waited for as bubble).
  double exposed_comm_s = -1;
  double bubble_s = 0;  // pipelines: the stages' mean idle time inside the schedule
  double tokens_per_s = 0;
  double mfu = -1;    // -1: the profile has no node peak
  std::string notes;  // approximations made (scaled entries, substituted fits)
};

StepTime predict_step_time(const MachineProfile& profile, const StepQuery& query);

// The device string and precision name the profile's compute entries use for a run.
std::string profile_precision(const TrainSpec& train);

}  // namespace strata
