// strata SDK: helpers that make a data-parallel strategy short (dp, ddp; ZeRO/FSDP reuse parts).
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>

#include "strata/export.hpp"
#include "strata/optimizer.hpp"
#include "strata/plugin.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

// The whole model's parameters (MemTag::params, in the run's param dtype, initialised from the
// run's seed) and gradients (MemTag::grads, in its reduce dtype), each one flat buffer, with
// per-unit views into them.
class Replica {
 public:
  explicit Replica(Context& ctx);
  BufferView params() { return params_.view(); }
  BufferView grads() { return grads_.view(); }
  std::size_t size() const { return params_.size(); }
  const UnitPtrs& param_ptrs() const { return param_ptrs_; }
  const UnitPtrs& grad_ptrs() const { return grad_ptrs_; }

 private:
  DeviceBuffer params_, grads_;
  UnitPtrs param_ptrs_, grad_ptrs_;
};

// AdamW over flat elements [begin, begin + count) with the run's settings and precision; with
// bf16 parameters its fp32 master copy is initialised from the run's seed (exact fp32 values).
// MemTag::offload as `state_tag`: the state lives in host memory (AdamW's note).
AdamW make_adamw(Context& ctx, std::size_t begin, std::size_t count,
                 MemTag state_tag = MemTag::optimizer);

// d(step loss)/d(per-token loss): the step loss is the mean over the global batch's tokens, so
// summing every rank's gradients gives the exact gradient.
double grad_scale(const Context& ctx);

// Forward of every unit, then backward in reverse, for one micro-batch of the whole model
// (Context::model()); times both phases and reports the loss. After unit u's backward its
// gradients are complete for this micro-batch and on_unit_done(u) runs (ddp launches the
// all-reduce of filled buckets there). Without on_unit_done the forward and the backward each
// run through Context::run_graphed() (--cuda-graphs: one CUDA graph each, so the phases keep
// their event timing and the loss is read between them).
void forward_backward(Context& ctx, const UnitPtrs& params, const UnitPtrs& grads,
                      const MicroBatch& mb, const std::function<void(int unit)>& on_unit_done = {});
// The same for every unit of `model`, a whole-model partition at tp 1 a strategy built, in `slot`.
void forward_backward(Context& ctx, StageModel& model, int slot, const UnitPtrs& params,
                      const UnitPtrs& grads, const MicroBatch& mb,
                      const std::function<void(int unit)>& on_unit_done = {});

// For strategies that are data parallel only: throws ConfigError unless tp == pp == 1.
void require_data_parallel_only(const MeshSpec& mesh, const std::string& strategy);

// The `bucket_mb` option (ddp, zero1/2/3), declared and parsed here once for all of them: its
// OptionSpec (real, default 25, the strategy's help), and its value in MiB: ConfigError, quoting
// the value as given, unless it lies in (0, 1048576], so that a bucket's bytes are a size_t with
// room to spare.
OptionSpec bucket_mb_spec(const std::string& help);
double bucket_mb_option(const Options& options);

// The AdamW settings of this run.
AdamWConfig adamw_config(const Context& ctx);

// Bytes the core itself allocates on every rank: the micro-batch's tokens (MemTag::workspace).
std::uint64_t batch_workspace_bytes(const TrainSpec& train, const ModelSpec& model);

// Bytes per element of parameters, of gradients (the reduce dtype) and of optimizer state (m and
// v in fp32, plus the fp32 master copy with bf16 parameters): 4 + 4 + 8, or the ZeRO paper's
// 2 + 2 + 12 with --precision bf16 --reduce-dtype bf16 (2 + 4 + 12 reducing in fp32).
struct StateBytes {
  double params, grads, optimizer;
};
StateBytes state_bytes_per_param(const MixedPrecision& precision);

// The allocations of a full replica of parameters and gradients on every rank, as a plan's setup
// actions: state_bytes_per_param() x P of params, grads and optimizer, the whole model's
// activations of one micro-batch, the micro-batch's tokens (the core's and the model slot's,
// MemTag::workspace). A replicated strategy's plan_step() adds them to StepPlan::setup, and its
// predicted memory is the plan's (predict(), strata/plugin.hpp).
void plan_replica(const PredictInput& in, std::vector<PlanAction>& setup);

// A StageModel of `part` keeping `slots` activation slots, as setup actions: its activations
// (predict_activations: `slots` slots and the shared scratch) and each slot's copy of the
// micro-batch's tokens (MemTag::workspace). Without the core's micro-batch
// (batch_workspace_bytes), which a rank holds once whatever its models. split_backward: the
// StageModel's (its slots keep the deferred d(output)s).
void plan_model_slots(const PredictInput& in, const Partition& part, int slots,
                      std::vector<PlanAction>& setup, bool split_backward = false);

// Their memory (plan_memory of plan_replica): predict()'s answer for a plan that states no
// allocations.
Prediction replicated_prediction(const PredictInput& in);

}  // namespace strata
STRATA_EXPORT_END
