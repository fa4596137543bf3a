#include "plan/compiled_plan.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace attnplan::plan {

const PlanKernel& CompiledPlan::kernel(StageKind stage) const {
  for (const PlanKernel& kernel : kernels) {
    if (kernel.stage == stage) return kernel;
  }
  throw Error(Stage::internal, fmt::format("the plan has no {} kernel", to_string(stage)));
}

}  // namespace attnplan::plan
