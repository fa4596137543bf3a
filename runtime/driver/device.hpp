// What attnplan needs to know about a device: its architecture (to pick and check the compile target),
// its size (for heuristics) and the driver it runs under.
#pragma once

#include <cstddef>
#include <string>

namespace attnplan::driver {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;  // "NVIDIA H200"
  int major = 0;     // compute capability
  int minor = 0;
  int multiprocessors = 0;
  std::size_t total_memory = 0;        // bytes
  int max_shared_per_block_optin = 0;  // bytes a kernel may opt in to with set_max_dynamic_shared_bytes
  int l2_bytes = 0;
  int driver_version = 0;  // as cuDriverGetVersion: 1000 * major + 10 * minor (13000 = CUDA 13.0)

  // The architecture to compile for: "sm_90a" and "sm_100a" for Hopper and Blackwell datacenter parts,
  // whose wgmma / tcgen05 instructions exist only in the architecture-specific target; "sm_XY" otherwise.
  std::string arch_name() const;
};

// Whether a CUDA device can be used: the driver loads, cuInit succeeds and at least one device exists.
// Never throws; on false, `reason` (if given) says which of those failed. GPU test executables use it to
// exit 77 (skipped), `attnplan compile` to fall back to the default arch.
bool device_available(std::string* reason = nullptr) noexcept;

// Number of devices the driver exposes. Throws Error(driver) when there is no usable driver.
int device_count();

// Throws Error(driver) when there is no usable driver or `ordinal` is not a device.
DeviceInfo query_device(int ordinal);

}  // namespace attnplan::driver
