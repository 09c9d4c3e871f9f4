// SDK helpers: option access, the replicated-parameter helpers used by data-parallel plugins.
#include <charconv>
#include <cstdint>

#include "strata/data_parallel.hpp"

namespace strata {

const char* option_type_name(OptionType t) {
  switch (t) {
    case OptionType::integer:
      return "int";
    case OptionType::real:
      return "real";
    case OptionType::boolean:
      return "bool";
    case OptionType::string:
      return "string";
    case OptionType::choice:
      return "choice";
  }
  return "?";
}

const std::string& Options::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end())
    throw Error("plugin option '" + name + "' is not declared", "this is a bug in the plugin");
  return it->second;
}

long long Options::get_int(const std::string& name) const { return std::stoll(get(name)); }
double Options::get_real(const std::string& name) const { return std::stod(get(name)); }
bool Options::get_bool(const std::string& name) const {
  const std::string& v = get(name);
  return v == "true" || v == "on" || v == "1" || v == "yes";
}

Replica::Replica(Context& ctx)
    : params_(ctx.memory(), MemTag::params, ctx.train().precision.param,
              ctx.model_spec().total_params()),
      grads_(ctx.memory(), MemTag::grads, ctx.train().precision.reduce,
             ctx.model_spec().total_params()) {
  const ParamLayout layout(ctx.model_spec());
  init_params(layout, ctx.train().seed, 0, params_.view());
  for (const UnitInfo& u : layout.units()) {
    param_ptrs_.push_back(params_.view(u.offset, u.count));
    grad_ptrs_.push_back(grads_.view(u.offset, u.count));
  }
}

AdamW make_adamw(Context& ctx, std::size_t begin, std::size_t count, MemTag state_tag) {
  const ParamLayout layout(ctx.model_spec());
  AdamW opt(layout, begin, count, adamw_config(ctx), ctx.memory(), ctx.train().precision.param,
            state_tag);
  if (opt.master().data) init_params(layout, ctx.train().seed, begin, opt.master());
  return opt;
}

StateBytes state_bytes_per_param(const MixedPrecision& mp) {
  return {double(dtype_size(mp.param)), double(dtype_size(mp.reduce)), mp.mixed() ? 12.0 : 8.0};
}

double grad_scale(const Context& ctx) {
  return 1.0 / (double(ctx.train().global_batch) * ctx.model_spec().seq);
}

std::vector<const void*> passes_identity(const StageModel& model, int slot, bool backward,
                                         const MicroBatch& mb, const UnitPtrs& params,
                                         const UnitPtrs& grads) {
  std::vector<const void*> id = {&model, reinterpret_cast<const void*>(std::intptr_t(slot)),
                                 reinterpret_cast<const void*>(std::intptr_t(backward)), mb.inputs,
                                 mb.targets};
  for (const UnitPtrs* views : {&params, &grads})
    for (const BufferView& v : *views) id.push_back(v.data);
  return id;
}

void forward_backward(Context& ctx, StageModel& model, int slot, const UnitPtrs& params,
                      const UnitPtrs& grads, const MicroBatch& mb,
                      const std::function<void(int unit)>& on_unit_done) {
  const int first = model.partition().first_unit, last = model.partition().last_unit;
  {
    PhaseTimer t(ctx, Phase::forward);
    ctx.run_graphed(passes_identity(model, slot, false, mb, params, grads), [&] {
      for (int u = first; u <= last; ++u) model.forward(slot, u, params, mb, nullptr);
    });
  }
  ctx.report_loss(model.loss_sum(slot), double(mb.batch) * mb.seq);
  PhaseTimer t(ctx, Phase::backward);
  const float scale = float(grad_scale(ctx));
  if (on_unit_done) {  // work between the passes: nothing to capture
    for (int u = last; u >= first; --u) {
      model.backward(slot, u, params, grads, nullptr, scale);
      on_unit_done(u);
    }
    return;
  }
  ctx.run_graphed(passes_identity(model, slot, true, mb, params, grads), [&] {
    for (int u = last; u >= first; --u) model.backward(slot, u, params, grads, nullptr, scale);
  });
}

void forward_backward(Context& ctx, const UnitPtrs& params, const UnitPtrs& grads,
                      const MicroBatch& mb, const std::function<void(int unit)>& on_unit_done) {
  forward_backward(ctx, ctx.model(), Context::kModelSlot, params, grads, mb, on_unit_done);
}

void require_data_parallel_only(const MeshSpec& mesh, const std::string& strategy) {
  if (mesh.tp != 1 || mesh.pp != 1)
    throw ConfigError("--mesh: " + strategy +
                      " is data parallel only; tp and pp must be 1 (got tp=" +
                      std::to_string(mesh.tp) + ", pp=" + std::to_string(mesh.pp) + ")");
}

OptionSpec bucket_mb_spec(const std::string& help) {
  return {"bucket_mb", OptionType::real, "25", help, {}};
}

double bucket_mb_option(const Options& options) {
  constexpr double kMaxBucketMiB = 1048576;  // 1 TiB
  const double mib = options.get_real("bucket_mb");
  if (!(mib > 0 && mib <= kMaxBucketMiB))
    throw ConfigError("--plugin-opt bucket_mb=" + options.get("bucket_mb") +
                      ": must be a number of MiB in (0, 1048576]");
  return mib;
}

AdamWConfig adamw_config(const Context& ctx) {
  AdamWConfig c;
  c.lr = float(ctx.train().lr);
  c.weight_decay = float(ctx.train().weight_decay);
  return c;
}

std::uint64_t batch_workspace_bytes(const TrainSpec& train, const ModelSpec& model) {
  return 2ull * sizeof(std::int32_t) * std::uint64_t(train.micro_batch) * model.seq;
}

void plan_model_slots(const PredictInput& in, const Partition& part, int slots,
                      std::vector<PlanAction>& setup, bool split_backward) {
  const int B = in.train.micro_batch;
  const ActivationBytes acts =
      predict_activations(in.model, B, part, in.train.recompute, in.train.precision.param,
                          in.train.device, split_backward);
  setup.push_back(plan_alloc(MemTag::activations, double(acts.total(slots))));
  setup.push_back(plan_alloc(
      MemTag::workspace, double(slots) * double(StageModel::slot_token_bytes(in.model, B, part))));
}

void plan_replica(const PredictInput& in, std::vector<PlanAction>& setup) {
  const double n = double(in.model.total_params());
  const StateBytes per = state_bytes_per_param(in.train.precision);
  setup.push_back(plan_alloc(MemTag::params, per.params * n));
  setup.push_back(plan_alloc(MemTag::grads, per.grads * n));
  setup.push_back(plan_alloc(MemTag::optimizer, per.optimizer * n));
  plan_model_slots(in, whole_model(in.model), 1, setup);
  setup.push_back(plan_alloc(MemTag::workspace, double(batch_workspace_bytes(in.train, in.model))));
}

Prediction replicated_prediction(const PredictInput& in) {
  StepPlan plan;
  plan_replica(in, plan.setup);
  Prediction p;
  p.memory_bytes = plan_memory(plan);
  return p;
}

// A plan that allocates describes the strategy's memory; one that does not is taken for a
// replica's.
Prediction predict(const Strategy& strategy, const PredictInput& in) {
  return predict(strategy.plan_step(in), in);
}

Prediction predict(const StepPlan& plan, const PredictInput& in) {
  Prediction p;
  p.memory_bytes =
      plan_allocates(plan) ? plan_memory(plan) : replicated_prediction(in).memory_bytes;
  p.notes = plan.notes;
  p.bubble_fraction = plan.bubble_fraction;
  return p;
}

}  // namespace strata
