#include "driver/context.hpp"

#include <fmt/format.h>

#include <utility>

#include "core/error.hpp"
#include "driver/cuda_api.hpp"
#include "driver/device.hpp"

namespace attnplan::driver {

Context::Context(int ordinal) : ordinal_(ordinal) {
  const CudaApi& cuda = initialized_api();
  const int count = device_count();
  if (ordinal < 0 || ordinal >= count) {
    throw Error(Stage::driver, fmt::format("CUDA device {} does not exist: the driver reports {} device(s)",
                                           ordinal, count));
  }
  check(cuda.cuDeviceGet(&device_, ordinal), "cuDeviceGet");
  check(cuda.cuDevicePrimaryCtxRetain(&context_, device_),
        fmt::format("cuDevicePrimaryCtxRetain(device {})", ordinal));
}

Context::Context(Context&& other) noexcept
    : ordinal_(std::exchange(other.ordinal_, -1)),
      device_(std::exchange(other.device_, 0)),
      context_(std::exchange(other.context_, nullptr)) {}

Context& Context::operator=(Context&& other) noexcept {
  if (this != &other) {
    release();
    ordinal_ = std::exchange(other.ordinal_, -1);
    device_ = std::exchange(other.device_, 0);
    context_ = std::exchange(other.context_, nullptr);
  }
  return *this;
}

Context::~Context() {
  release();
}

void Context::release() noexcept {
  if (context_ == nullptr) return;
  // Ignored on purpose: at process exit the driver may already be deinitialized, and a destructor has
  // no one to report to.
  (void)api().cuDevicePrimaryCtxRelease(device_);
  context_ = nullptr;
}

void Context::make_current() const {
  if (context_ == nullptr) throw Error(Stage::internal, "make_current() on a moved-from driver::Context");
  check(api().cuCtxSetCurrent(context_), "cuCtxSetCurrent");
}

void Context::synchronize() const {
  make_current();
  check(api().cuCtxSynchronize(), "cuCtxSynchronize");
}

CUcontext require_current_context(std::string_view needed_by) {
  CUcontext context = nullptr;
  check(initialized_api().cuCtxGetCurrent(&context), "cuCtxGetCurrent");
  if (context == nullptr) {
    throw Error(Stage::driver, fmt::format("{} needs a current CUDA context on this thread: call "
                                           "driver::Context::make_current() first",
                                           needed_by));
  }
  return context;
}

ScopedCurrentContext::ScopedCurrentContext(CUcontext context) noexcept {
  if (context == nullptr) return;
  // A non-null context came from a loaded driver, so api() returns without throwing here.
  const CudaApi& cuda = api();
  if (cuda.cuCtxGetCurrent(&previous_) != CUDA_SUCCESS) return;
  if (previous_ == context) return;
  switched_ = cuda.cuCtxSetCurrent(context) == CUDA_SUCCESS;
}

ScopedCurrentContext::~ScopedCurrentContext() {
  if (switched_) (void)api().cuCtxSetCurrent(previous_);
}

}  // namespace attnplan::driver
