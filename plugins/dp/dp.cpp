// dp: single-master data parallelism, the torch.nn.DataParallel analogue. Every rank computes
// gradients on its share of the batch; they are summed onto rank 0, which alone holds the optimizer
// state and updates; rank 0 then broadcasts the new parameters. Simple, and its costs are visible:
// rank 0 carries all optimizer memory and the reduce/broadcast root traffic.
#include <optional>

#include "strata/data_parallel.hpp"

namespace {

using namespace strata;

class SingleMaster final : public Strategy {
 public:
  void validate(const MeshSpec& mesh, const TrainSpec&, const ModelSpec&) const override {
    require_data_parallel_only(mesh, "dp");
  }

  // A replica, with the optimizer state on dp rank 0 only; every micro-batch's passes, then the
  // reduce, rank 0's update and the broadcast, one after the other on the compute thread.
  StepPlan plan_step(const PredictInput& in) const override {
    StepPlan plan;
    const bool root = mesh_coord(in.mesh, in.rank).dp == 0;
    plan_replica(in, plan.setup);
    if (!root)
      std::erase_if(plan.setup, [](const PlanAction& a) { return a.memory == MemTag::optimizer; });
    plan.notes = "optimizer state on dp rank 0 only; reduce + broadcast of all parameters per step";
    plan_forward_backward(ParamLayout::of(in.model)->num_units(), plan.micro_batch);
    plan.micro_batches = in.train.micro_steps(in.mesh);
    const StateBytes per = state_bytes_per_param(in.train.precision);
    const double n = double(in.model.total_params());
    if (in.mesh.dp > 1) plan.step.push_back(plan_comm(CommOp::reduce, per.grads * n, Axis::dp));
    if (root) plan.step.push_back(plan_update(n));
    if (in.mesh.dp > 1) plan.step.push_back(plan_comm(CommOp::broadcast, per.params * n, Axis::dp));
    return plan;
  }

  void setup(Context& ctx) override {
    replica_.emplace(ctx);
    if (ctx.coord().dp == 0) optimizer_.emplace(make_adamw(ctx, 0, replica_->size()));
  }

  void train_step(Context& ctx, int step) override {
    Replica& r = *replica_;
    ctx.ops().fill(r.grads(), 0);
    for (int micro = 0; micro < ctx.train().micro_steps(ctx.mesh()); ++micro)
      forward_backward(ctx, r.param_ptrs(), r.grad_ptrs(), ctx.micro_batch(step, micro));

    Group& dp = ctx.group(Axis::dp);
    if (dp.size() > 1) dp.reduce(r.grads(), 0);
    if (optimizer_) {
      PhaseTimer t(ctx, Phase::optimizer);
      double norm = std::sqrt(ctx.ops().sum_of_squares(r.grads()));
      optimizer_->step(r.params(), r.grads(), step + 1, clip_scale(norm, ctx.train().grad_clip));
    }
    if (dp.size() > 1) dp.broadcast(r.params(), 0);
  }

 private:
  std::optional<Replica> replica_;
  std::optional<AdamW> optimizer_;
};

const PluginDescriptor& descriptor() {
  static const PluginDescriptor d{
      kPluginAbiVersion,
      "dp",
      "single-master data parallel (DataParallel analogue)",
      {{"dp",
        "gradients reduced to rank 0, update there, parameters broadcast back; no overlap",
        {}}}};
  return d;
}

std::unique_ptr<Strategy> create(const std::string&, const Options&) {
  return std::make_unique<SingleMaster>();
}

}  // namespace

STRATA_PLUGIN(descriptor, create)
