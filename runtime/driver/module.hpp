// A cubin loaded into a context. Owns the CUmodule; the Functions it hands out are valid while it lives.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <span>
#include <string>

#include "driver/function.hpp"

namespace attnplan::driver {

class Module {
 public:
  // Loads `cubin` into the calling thread's current context (Context::make_current() first).
  // Throws Error(driver): no current context, an empty image, or the driver's own refusal (e.g.
  // CUDA_ERROR_NO_BINARY_FOR_GPU for a cubin of another architecture).
  static Module load(std::span<const std::uint8_t> cubin);

  Module(Module&& other) noexcept;
  Module& operator=(Module&& other) noexcept;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  // Unloads in the module's own context. Destroy modules before the last Context of their device.
  ~Module();

  // The kernel named `lowered_name` (as NVRTC lowered it). Throws Error(driver) naming it if absent.
  Function function(const std::string& lowered_name) const;

  CUmodule handle() const noexcept { return module_; }

 private:
  Module(CUmodule module, CUcontext context) : module_(module), context_(context) {}
  void unload() noexcept;

  CUmodule module_ = nullptr;
  CUcontext context_ = nullptr;  // the context it was loaded into
};

}  // namespace attnplan::driver
