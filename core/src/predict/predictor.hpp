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
#include "predict/step_query.hpp"
#include "strata/plugin.hpp"

namespace strata {

// The ranks whose plans a StepQuery holds: rank 0's pp group, one per stage.
std::vector<int> step_query_ranks(const MeshSpec& mesh);

// The question for `strategy` on this configuration, its plans asked of step_query_ranks().
StepQuery step_query(const std::string& name, const Strategy& strategy, const MeshSpec& mesh,
                     const ModelSpec& model, const TrainSpec& train, int threads,
                     int ranks_on_host = 0);

StepTime predict_step_time(const MachineProfile& profile, const StepQuery& query);

// The device string and precision name the profile's compute entries use for a run.
std::string profile_precision(const TrainSpec& train);

}  // namespace strata
