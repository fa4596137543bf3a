// A kernel inside a loaded Module: a non-owning handle, valid while its Module lives. Copyable (it is a
// name and a pointer), so a plan can keep one per stage next to the modules that own them.
#pragma once

#include <cuda.h>

#include <string>
#include <utility>

namespace attnplan::driver {

class Function {
 public:
  Function() = default;  // empty: launching it is an error
  Function(CUfunction handle, std::string name) : handle_(handle), name_(std::move(name)) {}

  CUfunction handle() const noexcept { return handle_; }
  const std::string& name() const noexcept { return name_; }  // the lowered (mangled) name
  explicit operator bool() const noexcept { return handle_ != nullptr; }

  // Allows launches with up to `bytes` of dynamic shared memory; needed above 48 KiB. Set once at load.
  void set_max_dynamic_shared_bytes(int bytes) const;

  // Any CU_FUNC_ATTRIBUTE_*; the named ones below are those the plan and `attnplan cache show` report.
  int attribute(CUfunction_attribute which) const;
  int num_regs() const { return attribute(CU_FUNC_ATTRIBUTE_NUM_REGS); }
  int max_threads_per_block() const { return attribute(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK); }
  int static_shared_bytes() const { return attribute(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES); }
  int max_dynamic_shared_bytes() const { return attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES); }
  int local_bytes() const { return attribute(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES); }  // per thread: spills
  int const_bytes() const { return attribute(CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES); }
  int binary_version() const { return attribute(CU_FUNC_ATTRIBUTE_BINARY_VERSION); }  // 90 for sm_90a

 private:
  CUfunction handle_ = nullptr;
  std::string name_;
};

}  // namespace attnplan::driver
