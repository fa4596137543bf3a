#include "driver/launch.hpp"

#include <fmt/format.h>

#include "core/error.hpp"
#include "driver/cuda_api.hpp"

namespace attnplan::driver {

void launch(const Function& function, const LaunchShape& shape, CUstream stream, void** kernel_params) {
  if (!function) throw Error(Stage::internal, "launch of an empty driver::Function");
  CUlaunchConfig config{};
  config.gridDimX = shape.grid.x;
  config.gridDimY = shape.grid.y;
  config.gridDimZ = shape.grid.z;
  config.blockDimX = shape.block.x;
  config.blockDimY = shape.block.y;
  config.blockDimZ = shape.block.z;
  config.sharedMemBytes = shape.dynamic_shared_bytes;
  config.hStream = stream;
  CUlaunchAttribute cluster{};
  config.attrs = nullptr;
  config.numAttrs = 0;
  if (shape.cluster.x * shape.cluster.y * shape.cluster.z > 1) {
    cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    cluster.value.clusterDim.x = shape.cluster.x;
    cluster.value.clusterDim.y = shape.cluster.y;
    cluster.value.clusterDim.z = shape.cluster.z;
    config.attrs = &cluster;
    config.numAttrs = 1;
  }
  const CUresult result = api().cuLaunchKernelEx(&config, function.handle(), kernel_params, nullptr);
  if (result != CUDA_SUCCESS) {
    // Formatted only on failure: launch is on the execute() path.
    check(result, fmt::format("cuLaunchKernelEx({}, grid {}x{}x{}, block {}x{}x{}, {} bytes dynamic shared, "
                              "cluster {}x{}x{})",
                              function.name(), shape.grid.x, shape.grid.y, shape.grid.z, shape.block.x,
                              shape.block.y, shape.block.z, shape.dynamic_shared_bytes, shape.cluster.x,
                              shape.cluster.y, shape.cluster.z));
  }
}

}  // namespace attnplan::driver
