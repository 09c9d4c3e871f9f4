// The advisor (`runner --advise`, docs/predict.md "The advisor"): for a model on N devices with a
// memory limit per device and a machine profile, every strategy given (each installed plugin, with
// each choice of its `dp` option), every mesh dp x tp x pp (tp inside a node), micro-batch size and
// recompute mode is checked in order: divisibility (the global batch, then the strategy's own
// validate()), memory (the strategy's predict(): the first and last pipeline stage at both ends
// of dp and tp), then time (predict_step_time); those that pass are ranked by predicted tokens/s.
// Only arithmetic: nothing is allocated for the model, so GPT-3 175B on 4,096 devices takes
// seconds.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "predict/predictor.hpp"

namespace strata {

struct AdviseStrategy {
  std::string name;
  const StrategySpec* spec = nullptr;  // its options: `dp` choices are enumerated
  std::function<std::shared_ptr<Strategy>(const Options&)> create;
};

struct AdviseRequest {
  ModelSpec model;
  TrainSpec train;  // precision and device as run; micro_batch, recompute, global_batch: below
  int nodes = 1, ranks_per_node = 1;
  double memory_limit = 0;         // bytes of device memory per rank
  std::vector<int> micro_batches;  // candidates
  int global_batch = 0;            // 0: micro-batch x dp for each configuration (as a run)
  int threads = 1;                 // BLAS threads per rank (CPU profiles)
};

struct Candidate {
  std::string strategy;
  Options options;
  std::string variant;  // "dp=zero1", or "" for the strategy's defaults
  MeshSpec mesh;
  int micro_batch = 1, global_batch = 0;
  Recompute recompute = Recompute::none;
  double memory_bytes = 0;  // the largest rank's device memory
  StepTime time;
  std::string label() const;  // "1f1b dp=zero1 dp16 tp8 pp8 mb1 full"
};

enum class Exclusion { divisibility, memory, no_time_model };

struct Excluded {
  Candidate candidate;
  Exclusion why;
  std::string detail;  // the strategy's or the batch's message, or the predictor's
};

struct Advice {
  std::vector<Candidate> ranked;  // best predicted tokens/s first
  std::vector<Excluded> excluded;
  std::vector<std::string> notes;  // e.g. which axes each strategy uses
};

Advice advise(const MachineProfile& profile, const AdviseRequest& request,
              const std::vector<AdviseStrategy>& strategies);

// The table of the `top` best and the exclusions grouped by reason.
std::string format_advice(const Advice& advice, const AdviseRequest& request, int top);

}  // namespace strata
