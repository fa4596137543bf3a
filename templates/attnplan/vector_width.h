// The bf16 access width rule, one definition for the host heuristics (plan/heuristics.cpp, launch
// shapes in plan/prefill_plan.cpp) and the kernel traits (rmsnorm.cuh, kv_store.cuh): the host sizes
// grids and thread counts from the same vector count the kernel derives, so the two must never differ.
// Plain C++ like params.h: no toolkit headers, so NVRTC and the host compiler both parse it.
#pragma once

#include "attnplan/params.h"  // ATTNPLAN_HOST_DEVICE

namespace attnplan {

// The largest vector width in {8, 4, 2, 1} bf16 elements that divides `extent`: 8 means 16-byte accesses.
ATTNPLAN_HOST_DEVICE constexpr int vector_width_for(int extent) {
  return extent % 8 == 0 ? 8 : extent % 4 == 0 ? 4 : extent % 2 == 0 ? 2 : 1;
}

}  // namespace attnplan
