// The SDK's step-plan helpers (strata/step_plan.hpp).
#include "strata/step_plan.hpp"

namespace strata {

void plan_forward_backward(int num_units, std::vector<PlanAction>& out) {
  for (int u = 0; u < num_units; ++u) out.push_back(plan_forward(u));
  for (int u = num_units - 1; u >= 0; --u) out.push_back(plan_backward(u));
}

}  // namespace strata
