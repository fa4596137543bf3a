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
  config.attrs = nullptr;  // clusters, PDL and the like arrive with the kernels that need them
  config.numAttrs = 0;
  const CUresult result = api().cuLaunchKernelEx(&config, function.handle(), kernel_params, nullptr);
  if (result != CUDA_SUCCESS) {
    // Formatted only on failure: launch is on the execute() path.
    check(result, fmt::format("cuLaunchKernelEx({}, grid {}x{}x{}, block {}x{}x{}, {} bytes dynamic shared)",
                              function.name(), shape.grid.x, shape.grid.y, shape.grid.z, shape.block.x,
                              shape.block.y, shape.block.z, shape.dynamic_shared_bytes));
  }
}

}  // namespace attnplan::driver
