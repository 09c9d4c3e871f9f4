// What the step-time predictor is asked (StepQuery) and what it answers (StepTime), apart from
// predictor.hpp so that its internals (costs.hpp, plan_replay.cpp) need not include it.
#pragma once
#include <string>
#include <vector>

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

}  // namespace strata
