// ddp: distributed data parallel with gradient buckets, the PyTorch DDP algorithm. The flat
// gradient buffer is cut, from its end, into buckets of bucket_mb; backward runs units in reverse,
// so a bucket is complete as soon as the unit holding its first element has finished backward, and
// its all-reduce starts right then on the comm stream while backward continues. Buckets are views
// into the gradient buffer (PyTorch's gradient_as_bucket_view), so no copies and no comm buffers.
// With gradient accumulation only the last micro-batch all-reduces (PyTorch's no_sync()).
#include <optional>

#include "strata/data_parallel.hpp"

namespace {

using namespace strata;

struct Bucket {
  std::size_t begin, end;  // flat gradient range
  int ready_unit;          // backward of this unit completes the bucket
};

class BucketedDdp final : public Strategy {
 public:
  explicit BucketedDdp(const Options& o) : bucket_mb_(bucket_mb_option(o)) {}

  void validate(const MeshSpec& mesh, const TrainSpec&, const ModelSpec&) const override {
    require_data_parallel_only(mesh, "ddp");
  }

  // A replica; the micro-batches before the last as they are; in the last, each bucket's all-reduce
  // issued on the comm stream as soon as backward has passed its ready unit; then the wait and the
  // update.
  StepPlan plan_step(const PredictInput& in) const override {
    const std::shared_ptr<const ParamLayout> layout = ParamLayout::of(in.model);
    const int units = layout->num_units(), m = in.train.micro_steps(in.mesh);
    StepPlan plan;
    plan_replica(in, plan.setup);
    plan.notes = "buckets are views of the flat gradient buffer: no comm_buffers";
    plan_forward_backward(units, plan.micro_batch);
    plan.micro_batches = m - 1;
    const double grad_bytes = state_bytes_per_param(in.train.precision).grads;
    const std::vector<Bucket> buckets = make_buckets(*layout, grad_bytes);
    std::size_t next = 0;
    for (int u = 0; u < units; ++u) plan.step.push_back(plan_forward(u));
    for (int u = units - 1; u >= 0; --u) {
      plan.step.push_back(plan_backward(u));
      for (; in.mesh.dp > 1 && next < buckets.size() && buckets[next].ready_unit >= u; ++next)
        plan.step.push_back(plan_comm(CommOp::all_reduce,
                                      grad_bytes * double(buckets[next].end - buckets[next].begin),
                                      Axis::dp, 0));
    }
    plan.step.push_back(plan_wait());
    plan.step.push_back(plan_update(double(layout->total())));
    return plan;
  }

  void setup(Context& ctx) override {
    replica_.emplace(ctx);
    optimizer_.emplace(make_adamw(ctx, 0, replica_->size()));
    buckets_ =
        make_buckets(ParamLayout(ctx.model_spec()), double(dtype_size(replica_->grads().dtype)));
  }

  void train_step(Context& ctx, int step) override {
    Replica& r = *replica_;
    ctx.ops().fill(r.grads(), 0);
    Group& dp = ctx.group(Axis::dp);
    CommStream& stream = ctx.comm_stream();
    std::vector<Event> pending;
    std::size_t next_bucket = 0;
    auto launch_ready = [&](int unit) {
      // Buckets are ordered from the end of the buffer, as backward fills them.
      while (next_bucket < buckets_.size() && buckets_[next_bucket].ready_unit >= unit) {
        const Bucket& b = buckets_[next_bucket++];
        pending.push_back(
            stream.all_reduce(dp, slice(r.grads(), b.begin, b.end - b.begin), ctx.compute_event()));
      }
    };
    const int micro_steps = ctx.train().micro_steps(ctx.mesh());
    for (int micro = 0; micro < micro_steps; ++micro) {
      bool last = micro == micro_steps - 1;
      forward_backward(ctx, r.param_ptrs(), r.grad_ptrs(), ctx.micro_batch(step, micro),
                       last && dp.size() > 1 ? launch_ready : std::function<void(int)>{});
    }
    for (const Event& e : pending) e.wait();

    PhaseTimer t(ctx, Phase::optimizer);
    double norm = std::sqrt(ctx.ops().sum_of_squares(r.grads()));  // replicated: no reduction
    optimizer_->step(r.params(), r.grads(), step + 1, clip_scale(norm, ctx.train().grad_clip));
  }

 private:
  // The flat gradient buffer cut from its end into buckets of bucket_mb.
  std::vector<Bucket> make_buckets(const ParamLayout& layout, double grad_bytes) const {
    const std::size_t per_bucket =
        std::max<std::size_t>(1, std::size_t(bucket_mb_ * 1024 * 1024 / grad_bytes));
    std::vector<Bucket> buckets;
    for (std::size_t end = layout.total(); end > 0;) {
      const std::size_t begin = end > per_bucket ? end - per_bucket : 0;
      buckets.push_back({begin, end, layout.tensor_at(begin).unit});
      end = begin;
    }
    return buckets;
  }

  double bucket_mb_;
  std::optional<Replica> replica_;
  std::optional<AdamW> optimizer_;
  std::vector<Bucket> buckets_;
};

const PluginDescriptor& descriptor() {
  static const PluginDescriptor d{
      kPluginAbiVersion,
      "ddp",
      "distributed data parallel with bucketed, overlapped gradient all-reduce",
      {{"ddp",
        "gradient buckets all-reduced on a comm stream as backward fills them (PyTorch DDP)",
        {bucket_mb_spec("bucket size in MiB; each bucket's all-reduce starts when backward has "
                        "filled it")}}}};
  return d;
}

std::unique_ptr<Strategy> create(const std::string&, const Options& options) {
  return std::make_unique<BucketedDdp>(options);
}

}  // namespace

STRATA_PLUGIN(descriptor, create)
