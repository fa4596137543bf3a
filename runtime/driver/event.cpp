#include "driver/event.hpp"

#include <utility>

#include "core/error.hpp"
#include "driver/context.hpp"
#include "driver/cuda_api.hpp"

namespace attnplan::driver {

Event Event::create() {
  CUcontext context = require_current_context("Event::create");
  CUevent event = nullptr;
  check(api().cuEventCreate(&event, CU_EVENT_DEFAULT), "cuEventCreate");
  return Event(event, context);
}

Event::Event(Event&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)), context_(std::exchange(other.context_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    destroy();
    event_ = std::exchange(other.event_, nullptr);
    context_ = std::exchange(other.context_, nullptr);
  }
  return *this;
}

Event::~Event() {
  destroy();
}

void Event::destroy() noexcept {
  if (event_ == nullptr) return;
  ScopedCurrentContext in_own_context(context_);
  (void)api().cuEventDestroy(event_);  // nothing to report to from a destructor
  event_ = nullptr;
}

void Event::record(CUstream stream) const {
  if (event_ == nullptr) throw Error(Stage::internal, "record() on a moved-from driver::Event");
  check(api().cuEventRecord(event_, stream), "cuEventRecord");
}

void Event::synchronize() const {
  if (event_ == nullptr) throw Error(Stage::internal, "synchronize() on a moved-from driver::Event");
  check(api().cuEventSynchronize(event_), "cuEventSynchronize");
}

float elapsed_ms(const Event& start, const Event& stop) {
  stop.synchronize();
  float milliseconds = 0.0f;
  check(api().cuEventElapsedTime(&milliseconds, start.handle(), stop.handle()), "cuEventElapsedTime");
  return milliseconds;
}

}  // namespace attnplan::driver
