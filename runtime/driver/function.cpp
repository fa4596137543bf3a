#include "driver/function.hpp"

#include <fmt/format.h>

#include "core/error.hpp"
#include "driver/cuda_api.hpp"

namespace attnplan::driver {
namespace {

void require_resolved(const Function& function, const char* operation) {
  if (!function) throw Error(Stage::internal, fmt::format("{} on an empty driver::Function", operation));
}

}  // namespace

void Function::set_max_dynamic_shared_bytes(int bytes) const {
  require_resolved(*this, "set_max_dynamic_shared_bytes");
  check(api().cuFuncSetAttribute(handle_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes),
        fmt::format("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES = {}) for {}", bytes, name_));
}

int Function::attribute(CUfunction_attribute which) const {
  require_resolved(*this, "attribute");
  int value = 0;
  check(api().cuFuncGetAttribute(&value, which, handle_),
        fmt::format("cuFuncGetAttribute({}) for {}", int(which), name_));
  return value;
}

}  // namespace attnplan::driver
