#include "driver/module.hpp"

#include <fmt/format.h>

#include <utility>

#include "core/error.hpp"
#include "driver/context.hpp"
#include "driver/cuda_api.hpp"

namespace attnplan::driver {

Module Module::load(std::span<const std::uint8_t> cubin) {
  if (cubin.empty()) throw Error(Stage::driver, "cannot load an empty cubin");
  CUcontext context = require_current_context("Module::load");
  CUmodule module = nullptr;
  check(api().cuModuleLoadData(&module, cubin.data()),
        fmt::format("cuModuleLoadData({} bytes)", cubin.size()));
  return Module(module, context);
}

Module::Module(Module&& other) noexcept
    : module_(std::exchange(other.module_, nullptr)), context_(std::exchange(other.context_, nullptr)) {}

Module& Module::operator=(Module&& other) noexcept {
  if (this != &other) {
    unload();
    module_ = std::exchange(other.module_, nullptr);
    context_ = std::exchange(other.context_, nullptr);
  }
  return *this;
}

Module::~Module() {
  unload();
}

void Module::unload() noexcept {
  if (module_ == nullptr) return;
  // The driver documents cuModuleUnload as acting on the current context, which on this thread may be
  // another one or none (the 580 driver accepts either, but that is not promised).
  ScopedCurrentContext in_own_context(context_);
  (void)api().cuModuleUnload(module_);  // nothing to do about a failure in a destructor
  module_ = nullptr;
}

Function Module::function(const std::string& lowered_name) const {
  if (module_ == nullptr) throw Error(Stage::internal, "function() on a moved-from driver::Module");
  CUfunction function = nullptr;
  const CUresult result = api().cuModuleGetFunction(&function, module_, lowered_name.c_str());
  if (result == CUDA_ERROR_NOT_FOUND) {
    throw Error(Stage::driver, fmt::format("kernel {} is not in the loaded cubin", lowered_name));
  }
  check(result, fmt::format("cuModuleGetFunction({})", lowered_name));
  return Function(function, lowered_name);
}

}  // namespace attnplan::driver
