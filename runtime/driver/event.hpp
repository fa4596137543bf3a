// A timing event, for benchmarks and for the GPU tests' timings.
#pragma once

#include <cuda.h>

namespace attnplan::driver {

class Event {
 public:
  // A new event in the current context, with timing enabled. Throws Error(driver).
  static Event create();

  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  void record(CUstream stream) const;
  void synchronize() const;  // waits on the host for the recorded work

  CUevent handle() const noexcept { return event_; }

 private:
  Event(CUevent event, CUcontext context) noexcept : event_(event), context_(context) {}
  void destroy() noexcept;

  CUevent event_ = nullptr;
  CUcontext context_ = nullptr;
};

// Milliseconds of device time between two recorded events; waits for `stop` first.
float elapsed_ms(const Event& start, const Event& stop);

}  // namespace attnplan::driver
