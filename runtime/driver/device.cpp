#include "driver/device.hpp"

#include <fmt/format.h>

#include <array>
#include <exception>
#include <utility>

#include "core/error.hpp"
#include "driver/cuda_api.hpp"

namespace attnplan::driver {
namespace {

int attribute(CUdevice device, CUdevice_attribute which, const char* what) {
  int value = 0;
  check(api().cuDeviceGetAttribute(&value, which, device), fmt::format("cuDeviceGetAttribute({})", what));
  return value;
}

}  // namespace

std::string DeviceInfo::arch_name() const {
  // Only these two get the "a" suffix: the kernels' Hopper and Blackwell paths need the arch-specific
  // instructions, and a cubin built for sm_90a / sm_100a runs only on exactly that compute capability,
  // which is what the plan's compatibility check expects. (sm_103a, sm_120a... are left plain until a
  // kernel path needs them.)
  const bool arch_specific = (major == 9 && minor == 0) || (major == 10 && minor == 0);
  return fmt::format("sm_{}{}{}", major, minor, arch_specific ? "a" : "");
}

int device_count() {
  int count = 0;
  check(initialized_api().cuDeviceGetCount(&count), "cuDeviceGetCount");
  return count;
}

DeviceInfo query_device(int ordinal) {
  const CudaApi& cuda = initialized_api();
  const int count = device_count();
  if (ordinal < 0 || ordinal >= count) {
    throw Error(Stage::driver, fmt::format("CUDA device {} does not exist: the driver reports {} device(s)",
                                           ordinal, count));
  }
  CUdevice device = 0;
  check(cuda.cuDeviceGet(&device, ordinal), "cuDeviceGet");

  DeviceInfo info;
  info.ordinal = ordinal;
  std::array<char, 256> name{};
  check(cuda.cuDeviceGetName(name.data(), int(name.size()), device), "cuDeviceGetName");
  info.name = name.data();
  info.major = attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "compute capability major");
  info.minor = attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "compute capability minor");
  info.multiprocessors = attribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "multiprocessor count");
  info.max_shared_per_block_optin = attribute(device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                              "max shared memory per block optin");
  info.l2_bytes = attribute(device, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, "L2 cache size");
  check(cuda.cuDeviceTotalMem(&info.total_memory, device), "cuDeviceTotalMem");
  check(cuda.cuDriverGetVersion(&info.driver_version), "cuDriverGetVersion");
  return info;
}

bool device_available(std::string* reason) noexcept {
  auto unavailable = [reason](std::string why) {
    if (reason != nullptr) *reason = std::move(why);
    return false;
  };
  try {
    const CudaApi& loaded = initialized_api();
    int count = 0;
    check(loaded.cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (count <= 0) return unavailable("the CUDA driver reports no devices");
    if (reason != nullptr) reason->clear();
    return true;
  } catch (const Error& error) {
    return unavailable(error.message());
  } catch (const std::exception& error) {
    return unavailable(error.what());
  } catch (...) {
    return unavailable("unknown failure while probing the CUDA driver");
  }
}

}  // namespace attnplan::driver
