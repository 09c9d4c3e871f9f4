// The SDK's step-plan helpers (strata/step_plan.hpp).
#include "strata/step_plan.hpp"

#include <algorithm>

#include "strata/stage_model.hpp"

namespace strata {

void plan_forward_backward(int num_units, std::vector<PlanAction>& out) {
  for (int u = 0; u < num_units; ++u) out.push_back(plan_forward(u));
  for (int u = num_units - 1; u >= 0; --u) out.push_back(plan_backward(u));
}

namespace {

// One action's bytes, `times` over: its own, or the tp, ep and cp collectives inside a unit pass.
void add_action_bytes(const PlanAction& a, double times, const ModelSpec& model,
                      const TrainSpec& train, int tp, bool sp, const StepPlan& plan,
                      std::array<double, kNumCommOps>& bytes) {
  const int ep = plan.expert_parallel, cp = plan.context_parallel;
  auto add = [&](CommOp op, double b) { bytes[static_cast<int>(op)] += times * b; };
  switch (a.op) {
    case PlanOp::comm:
    case PlanOp::copy:
      add(a.collective, a.bytes);
      break;
    case PlanOp::send:
      add(CommOp::send, a.bytes);
      break;
    case PlanOp::recv:
      add(CommOp::recv, a.bytes);
      break;
    case PlanOp::forward:
    case PlanOp::backward:
      for (const PassCollective& c :
           tensor_parallel_collectives(model, train.micro_batch, a.unit, a.op == PlanOp::backward,
                                       tp, sp, cp, train.recompute, train.precision.tp_comm))
        add(c.op, c.bytes);
      for (const PassCollective& c : context_parallel_collectives(
               model, train.micro_batch, a.unit, a.op == PlanOp::backward, tp, cp,
               plan.context_attention, train.recompute, train.precision.param, train.device))
        add(c.op, c.bytes);
      for (const PassCollective& c :
           expert_parallel_collectives(model, train.micro_batch, a.unit, a.op == PlanOp::backward,
                                       ep, cp, train.recompute, train.precision.param))
        add(c.op, c.bytes);
      break;
    default:
      break;
  }
}

}  // namespace

std::array<double, kNumMemTags> plan_memory(const StepPlan& plan) {
  std::array<double, kNumMemTags> now{}, peak{};
  auto replay = [&](const std::vector<PlanAction>& actions) {
    for (const PlanAction& a : actions) {
      if (a.op != PlanOp::alloc && a.op != PlanOp::free) continue;
      const int t = static_cast<int>(a.memory);
      now[t] += a.op == PlanOp::alloc ? a.bytes : -a.bytes;
      peak[t] = std::max(peak[t], now[t]);
    }
  };
  replay(plan.setup);
  for (int m = 0; m < plan.micro_batches; ++m) replay(plan.micro_batch);
  replay(plan.step);
  return peak;
}

bool plan_allocates(const StepPlan& plan) {
  for (const std::vector<PlanAction>* actions : {&plan.setup, &plan.micro_batch, &plan.step})
    for (const PlanAction& a : *actions)
      if (a.op == PlanOp::alloc) return true;
  return false;
}

std::array<double, kNumCommOps> plan_comm_bytes(const StepPlan& plan, const ModelSpec& model,
                                                const TrainSpec& train, int tp) {
  std::array<double, kNumCommOps> bytes{};
  const bool sp = plan.sequence_parallel && tp > 1;
  for (const PlanAction& a : plan.micro_batch)
    add_action_bytes(a, plan.micro_batches, model, train, tp, sp, plan, bytes);
  for (const PlanAction& a : plan.step) add_action_bytes(a, 1, model, train, tp, sp, plan, bytes);
  return bytes;
}

}  // namespace strata
