// Every libcuda entry point attnplan uses, in one table filled at run time with dlopen/dlsym.
// libcuda is never linked: `attnplan compile`, the cache tools and the host tests run on machines
// without a GPU or a driver, and only the first real use of the device opens the library.
//
// <cuda.h> supplies the types and the declarations the table's pointer types are taken from. cuda.h
// #defines many names to their current ABI symbol (cuMemAlloc -> cuMemAlloc_v2, cuGraphInstantiate ->
// cuGraphInstantiateWithFlags), so a member listed as X(cuMemAlloc) is really named cuMemAlloc_v2 and
// has cuMemAlloc_v2's type; `api().cuMemAlloc(...)` expands the same way at every call site, so call
// sites read like the plain driver API and always call the symbol whose signature they were compiled for.
#pragma once

#include <cuda.h>

#include <span>
#include <string_view>

namespace attnplan::driver {

// The table: one X(name) per driver function, written as the public API name (before cuda.h's macros).
// Adding a call to libcuda anywhere in attnplan means adding its name here, and nowhere else.
#define ATTNPLAN_CUDA_SYMBOLS(X) \
  /* errors, initialization */   \
  X(cuGetErrorName)              \
  X(cuGetErrorString)            \
  X(cuInit)                      \
  X(cuDriverGetVersion)          \
  /* devices */                  \
  X(cuDeviceGetCount)            \
  X(cuDeviceGet)                 \
  X(cuDeviceGetName)             \
  X(cuDeviceGetAttribute)        \
  X(cuDeviceTotalMem)            \
  /* contexts */                 \
  X(cuDevicePrimaryCtxRetain)    \
  X(cuDevicePrimaryCtxRelease)   \
  X(cuCtxSetCurrent)             \
  X(cuCtxGetCurrent)             \
  X(cuCtxSynchronize)            \
  /* modules and functions */    \
  X(cuModuleLoadData)            \
  X(cuModuleUnload)              \
  X(cuModuleGetFunction)         \
  X(cuFuncSetAttribute)          \
  X(cuFuncGetAttribute)          \
  X(cuLaunchKernelEx)            \
  /* streams and events */       \
  X(cuStreamCreate)              \
  X(cuStreamDestroy)             \
  X(cuStreamSynchronize)         \
  X(cuEventCreate)               \
  X(cuEventDestroy)              \
  X(cuEventRecord)               \
  X(cuEventSynchronize)          \
  X(cuEventElapsedTime)          \
  /* memory */                   \
  X(cuMemAlloc)                  \
  X(cuMemFree)                   \
  X(cuMemcpyHtoD)                \
  X(cuMemcpyDtoH)                \
  X(cuMemcpyHtoDAsync)           \
  X(cuMemcpyDtoHAsync)           \
  X(cuMemsetD8)                  \
  X(cuMemsetD8Async)             \
  X(cuMemGetInfo)                \
  /* TMA tensor maps */          \
  X(cuTensorMapEncodeTiled)      \
  /* graph capture */            \
  X(cuStreamBeginCapture)        \
  X(cuStreamEndCapture)          \
  X(cuGraphInstantiateWithFlags) \
  X(cuGraphLaunch)               \
  X(cuGraphDestroy)              \
  X(cuGraphExecDestroy)

// The loaded table. Members are named (and typed) after the macro-expanded names; see the top of the file.
struct CudaApi {
#define ATTNPLAN_CUDA_API_MEMBER(name) decltype(&::name) name = nullptr;
  ATTNPLAN_CUDA_SYMBOLS(ATTNPLAN_CUDA_API_MEMBER)
#undef ATTNPLAN_CUDA_API_MEMBER
};

// One table entry: the name as written in the table and the ABI symbol looked up in libcuda.
struct CudaSymbol {
  std::string_view api_name;  // "cuMemAlloc"
  std::string_view symbol;    // "cuMemAlloc_v2"
};

// Every entry of the table, in table order.
std::span<const CudaSymbol> cuda_symbols() noexcept;

// The table for libcuda.so.1, loaded on first use (thread-safe). Throws Error(driver) when the library
// cannot be opened or lacks a symbol; the failure is remembered and every later call throws it again.
const CudaApi& api();

// api() plus cuInit(0), done once per process. Everything that touches a device goes through this.
const CudaApi& initialized_api();

// Opens `library` and resolves the whole table from it. api() calls it with "libcuda.so.1"; tests call it
// with other names to see the failures. The library is never closed once the table is complete.
CudaApi load_cuda_api(const char* library);

// Throws Error(driver) "<call> failed: CUDA_ERROR_... (<description>)" unless result is CUDA_SUCCESS.
void check(CUresult result, std::string_view call);

}  // namespace attnplan::driver
