// Predicted step time (README "Predicting step time"): a machine profile's calibrated unit passes
// and comm fits replayed through each strategy's own schedule, beside the strategy's exact
// predict() (bytes, memory, bubble).
//
// Time models, by strategy name (core-side in this first landing: a plugin the predictor does not
// know is reported as "no time model"):
//   dp           every micro-batch's passes, then reduce + broadcast + the update, all exposed
//   ddp          ddp's own buckets replayed: each all-reduce starts when backward of the last
//                micro-batch fills its bucket, on one comm stream; what outlasts backward is
//                exposed; then the update of every parameter
//   zero1/2/3,   the sharded engine's action list (sharded::micro_batch_schedule) replayed with a
//   fsdp*        compute clock and one comm stream (gathers and reduce-scatters in issue order),
//                then the update of this rank's shard, with zero1's reduce-scatter and zero1/2's
//                all-gather exposed
//   gpipe, 1f1b, the pipeline schedule (pp::pipeline_schedule) of every stage replayed with the
//   interleaved  chunks' pass times and point-to-point transfer times (sends never block), then
//                the tied-embedding exchange, the dp gradient reduction and the update
//   tp > 1       (tp, and the pipelines' tp x pp) the GEMM passes at 1/tp of the profile's time
//                and the tp all-reduces of Megatron's split (2 per block forward, 2 backward)
//                on the compute thread, exposed
// Not modelled yet: sp=on, offload copies, dp=zero2|fsdp on tp x pp meshes.
#pragma once
#include <string>
#include <vector>

#include "predict/profile.hpp"
#include "strata/plugin.hpp"

namespace strata {

struct StepQuery {
  std::string strategy;  // a strategy name (ddp, zero3, 1f1b, ...)
  Options options;       // its validated options (defaults filled in)
  MeshSpec mesh;
  ModelSpec model;
  TrainSpec train;
  int threads = 1;  // BLAS threads per rank
  // Ranks computing on this rank's host, when not mesh.ranks_per_node: virtual nodes (--nodes on
  // one machine) put every rank on it. Picks the compute entry and the ranks sharing the peak.
  int ranks_on_host = 0;
  // The strategy's predict() for every rank of the mesh: bytes per op, bubble. May be empty for
  // the strategies whose time model does not need it.
  std::vector<Prediction> ranks;
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

StepTime predict_step_time(const MachineProfile& profile, const StepQuery& query);

// The device string and precision name the profile's compute entries use for a run.
std::string profile_precision(const TrainSpec& train);

}  // namespace strata
