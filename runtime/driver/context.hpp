// The primary context of a device, and the calling thread's current context.
//
// attnplan uses primary contexts only: they are the ones the CUDA runtime (and so PyTorch, vLLM, ...)
// uses, so pointers and streams from an embedding engine are valid in ours. Resources (modules, streams,
// events, buffers) are created in the thread's current context, like the driver API itself, and remember
// it so that they can release themselves from any thread.
#pragma once

#include <cuda.h>

#include <string_view>

namespace attnplan::driver {

class Context {
 public:
  // Retains device `ordinal`'s primary context (creating it on first retain). Throws Error(driver).
  explicit Context(int ordinal);
  Context(Context&& other) noexcept;
  Context& operator=(Context&& other) noexcept;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ~Context();  // releases the retain; the context lives on while others (the runtime, modules) hold it

  // Binds the context to the calling thread; resources created afterwards on this thread live in it.
  void make_current() const;
  // make_current(), then waits for all work in the context.
  void synchronize() const;

  int ordinal() const noexcept { return ordinal_; }
  CUdevice device() const noexcept { return device_; }
  CUcontext handle() const noexcept { return context_; }

 private:
  void release() noexcept;

  int ordinal_ = -1;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
};

// The calling thread's current context; throws Error(driver) naming `needed_by` when there is none.
CUcontext require_current_context(std::string_view needed_by);

// Makes `context` current for a scope and restores the previous one after. For destructors and helpers
// that must act in a resource's own context whatever the thread has bound; never throws (a failure
// leaves the thread's context as it was and lets the guarded call report its own error).
class ScopedCurrentContext {
 public:
  explicit ScopedCurrentContext(CUcontext context) noexcept;
  ScopedCurrentContext(const ScopedCurrentContext&) = delete;
  ScopedCurrentContext& operator=(const ScopedCurrentContext&) = delete;
  ~ScopedCurrentContext();

 private:
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

}  // namespace attnplan::driver
