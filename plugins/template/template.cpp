// The template plugin: the smallest complete strategy, documented line by line. Copy this
// directory to plugins/<yours>/, rename the family and strategy, add `add_subdirectory(<yours>)` to
// plugins/CMakeLists.txt, rebuild: `runner --list-plugins` shows it.
//
// Strategy "allreduce": plain synchronous data parallelism. Every rank runs forward and backward on
// its share of the global batch, then one all-reduce sums the whole gradient (no buckets, no
// overlap), and every rank applies the same AdamW update.
#include <optional>

#include "strata/data_parallel.hpp"  // Replica, forward_backward, plan_replica, AdamW

namespace {

using namespace strata;

class SyncAllReduce final : public Strategy {
 public:
  explicit SyncAllReduce(const Options& o) : clip_(o.get_bool("clip")) {}

  // validate(): refuse configurations this strategy cannot run, with one line naming the option.
  // It runs before any rank starts.
  void validate(const MeshSpec& mesh, const TrainSpec&, const ModelSpec&) const override {
    require_data_parallel_only(mesh, "allreduce");
  }

  // plan_step(): what setup() and train_step() below allocate and issue, in order, as data. The
  // core counts the bytes it moves per op (the run file stores them beside the measured bytes,
  // and tests check that they are equal), takes its memory per tag from its allocations (the
  // same check against the ledger's peaks) and times each action from a machine profile
  // (runner --dry-run --profile, the advisor). It is the strategy's one description of its step.
  StepPlan plan_step(const PredictInput& in) const override {
    StepPlan plan;
    plan_replica(in, plan.setup);  // setup(): parameters, gradients, AdamW state, activations
    plan_forward_backward(ParamLayout::of(in.model)->num_units(),
                          plan.micro_batch);             // one micro-batch
    plan.micro_batches = in.train.micro_steps(in.mesh);  // ... this often
    const double n = double(in.model.total_params());
    const double grad_bytes = state_bytes_per_param(in.train.precision).grads;
    if (in.mesh.dp > 1)  // blocking: no stream given, so the compute thread waits for it
      plan.step.push_back(plan_comm(CommOp::all_reduce, grad_bytes * n, Axis::dp));
    plan.step.push_back(plan_update(n));
    return plan;
  }

  // setup(): allocate through the context so the memory ledger sees every byte.
  void setup(Context& ctx) override {
    replica_.emplace(ctx);  // parameters initialised from the run's seed, zeroed gradients
    optimizer_.emplace(make_adamw(ctx, 0, replica_->size()));  // run's precision, master copy
  }

  // train_step(): one optimizer step. The core times the whole call and reads the comm ledger.
  void train_step(Context& ctx, int step) override {
    Replica& r = *replica_;
    ctx.ops().fill(r.grads(), 0);
    for (int micro = 0; micro < ctx.train().micro_steps(ctx.mesh()); ++micro)
      forward_backward(ctx, r.param_ptrs(), r.grad_ptrs(), ctx.micro_batch(step, micro));

    Group& dp = ctx.group(Axis::dp);  // never the world: a plugin talks on its own axes
    if (dp.size() > 1) dp.all_reduce(r.grads());

    PhaseTimer t(ctx, Phase::optimizer);
    double norm = std::sqrt(ctx.ops().sum_of_squares(r.grads()));
    float scale = clip_ ? clip_scale(norm, ctx.train().grad_clip) : 1.0f;
    optimizer_->step(r.params(), r.grads(), step + 1, scale);
  }

 private:
  bool clip_;
  std::optional<Replica> replica_;
  std::optional<AdamW> optimizer_;
};

// The descriptor: what --list-plugins and --describe print, and what --plugin-opt is checked
// against before the run starts.
const PluginDescriptor& descriptor() {
  static const PluginDescriptor d{
      kPluginAbiVersion,
      "template",
      "a documented starting point for your own strategy",
      {{"allreduce",
        "synchronous data parallel: one all-reduce of all gradients after backward",
        {{"clip", OptionType::boolean, "true", "apply --grad-clip (global-norm clipping)", {}}}}}};
  return d;
}

std::unique_ptr<Strategy> create(const std::string&, const Options& options) {
  return std::make_unique<SyncAllReduce>(options);
}

}  // namespace

STRATA_PLUGIN(descriptor, create)
