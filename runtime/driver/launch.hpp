// Kernel launches through cuLaunchKernelEx. The kernels take one Params struct by value (style rule 6),
// so the usual call is launch(function, shape, stream, params).
#pragma once

#include <cuda.h>

#include <type_traits>

#include "driver/function.hpp"

namespace attnplan::driver {

struct Dim3 {
  unsigned x = 1;
  unsigned y = 1;
  unsigned z = 1;
};

struct LaunchShape {
  Dim3 grid;   // blocks
  Dim3 block;  // threads per block
  unsigned dynamic_shared_bytes = 0;
  Dim3 cluster;  // blocks per thread block cluster (each grid dimension a multiple); 1 x 1 x 1: none
};

// Queues `function` on `stream`; `kernel_params` holds one pointer per kernel parameter. Does not touch
// the thread's current context (a plan binds it once per execute) and never synchronizes, so it is
// legal during stream capture. Throws Error(driver) naming the kernel and the shape.
void launch(const Function& function, const LaunchShape& shape, CUstream stream, void** kernel_params);

// Launches a kernel whose only parameter is `params`. The driver copies the bytes during the call, so
// `params` may be a temporary.
template <class Params>
requires(!std::is_pointer_v<Params> &&
         !std::is_array_v<Params>) void launch(const Function& function, const LaunchShape& shape,
                                               CUstream stream, const Params& params) {
  static_assert(std::is_trivially_copyable_v<Params>, "kernel Params must be plain data passed by value");
  void* kernel_params[] = {const_cast<Params*>(&params)};
  launch(function, shape, stream, kernel_params);
}

}  // namespace attnplan::driver
