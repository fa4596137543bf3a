#include "driver/stream.hpp"

#include <utility>

#include "driver/context.hpp"
#include "driver/cuda_api.hpp"

namespace attnplan::driver {

Stream Stream::create() {
  CUcontext context = require_current_context("Stream::create");
  CUstream stream = nullptr;
  check(api().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  return Stream(stream, context, true);
}

Stream::Stream(Stream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)),
      context_(std::exchange(other.context_, nullptr)),
      owned_(std::exchange(other.owned_, false)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    destroy();
    stream_ = std::exchange(other.stream_, nullptr);
    context_ = std::exchange(other.context_, nullptr);
    owned_ = std::exchange(other.owned_, false);
  }
  return *this;
}

Stream::~Stream() {
  destroy();
}

void Stream::destroy() noexcept {
  if (!owned_ || stream_ == nullptr) return;
  ScopedCurrentContext in_own_context(context_);
  // cuStreamDestroy returns at once; queued work still completes. Nothing to report to from a destructor.
  (void)api().cuStreamDestroy(stream_);
  stream_ = nullptr;
  owned_ = false;
}

void Stream::synchronize() const {
  check(initialized_api().cuStreamSynchronize(stream_), "cuStreamSynchronize");
}

}  // namespace attnplan::driver
