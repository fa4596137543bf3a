// A CUstream that is either owned (created here, destroyed with this object) or borrowed (the caller's,
// e.g. an inference engine's stream, never destroyed by us).
#pragma once

#include <cuda.h>

namespace attnplan::driver {

class Stream {
 public:
  // A new non-blocking stream in the current context: it does not serialize with the legacy default
  // stream, so an engine's work on stream 0 cannot stall ours. Throws Error(driver).
  static Stream create();
  // Wraps `stream` without taking ownership (0 is the legacy default stream).
  static Stream borrow(CUstream stream) noexcept { return Stream(stream, nullptr, false); }

  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  // Waits on the host until all work queued so far has finished.
  void synchronize() const;

  CUstream handle() const noexcept { return stream_; }
  bool owned() const noexcept { return owned_; }

 private:
  Stream(CUstream stream, CUcontext context, bool owned) noexcept
      : stream_(stream), context_(context), owned_(owned) {}
  void destroy() noexcept;

  CUstream stream_ = nullptr;
  CUcontext context_ = nullptr;  // set for owned streams: destroyed in their own context
  bool owned_ = false;
};

}  // namespace attnplan::driver
