// The symbol table and the loader, on any machine: with no driver the failures must say what is
// missing; with one, the same calls must succeed.
#include <dlfcn.h>

#include <algorithm>
#include <set>
#include <string>

#include "driver/cuda_api.hpp"
#include "driver/device.hpp"
#include "support/catch.hpp"
#include "support/expect_error.hpp"

using attnplan::Stage;
namespace driver = attnplan::driver;

namespace {

// Whether this machine has a driver at all; decides which branch of the environment-dependent tests runs.
bool libcuda_present() {
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return false;
  dlclose(handle);
  return true;
}

std::string symbol_of(std::string_view api_name) {
  for (const driver::CudaSymbol& symbol : driver::cuda_symbols()) {
    if (symbol.api_name == api_name) return std::string(symbol.symbol);
  }
  return {};
}

}  // namespace

TEST_CASE("the symbol table lists every driver function once", "[driver][symbols]") {
  const auto symbols = driver::cuda_symbols();
  REQUIRE(!symbols.empty());
  std::set<std::string_view> api_names;
  std::set<std::string_view> abi_names;
  for (const driver::CudaSymbol& symbol : symbols) {
    CHECK(symbol.api_name.starts_with("cu"));
    CHECK(symbol.symbol.starts_with(symbol.api_name));  // a versioned symbol extends its API name
    api_names.insert(symbol.api_name);
    abi_names.insert(symbol.symbol);
  }
  CHECK(api_names.size() == symbols.size());
  CHECK(abi_names.size() == symbols.size());

  // What the brief's runtime needs; the table must keep all of them.
  for (const char* needed : {"cuInit",
                             "cuDriverGetVersion",
                             "cuDeviceGetCount",
                             "cuDeviceGet",
                             "cuDeviceGetName",
                             "cuDeviceGetAttribute",
                             "cuDeviceTotalMem",
                             "cuDevicePrimaryCtxRetain",
                             "cuDevicePrimaryCtxRelease",
                             "cuCtxSetCurrent",
                             "cuCtxGetCurrent",
                             "cuCtxSynchronize",
                             "cuModuleLoadData",
                             "cuModuleUnload",
                             "cuModuleGetFunction",
                             "cuFuncSetAttribute",
                             "cuFuncGetAttribute",
                             "cuLaunchKernelEx",
                             "cuStreamCreate",
                             "cuStreamDestroy",
                             "cuStreamSynchronize",
                             "cuEventCreate",
                             "cuEventDestroy",
                             "cuEventRecord",
                             "cuEventSynchronize",
                             "cuEventElapsedTime",
                             "cuMemAlloc",
                             "cuMemFree",
                             "cuMemcpyHtoD",
                             "cuMemcpyDtoH",
                             "cuMemcpyHtoDAsync",
                             "cuMemcpyDtoHAsync",
                             "cuMemsetD8",
                             "cuMemsetD8Async",
                             "cuMemGetInfo",
                             "cuGetErrorName",
                             "cuGetErrorString",
                             "cuStreamBeginCapture",
                             "cuStreamEndCapture",
                             "cuGraphInstantiateWithFlags",
                             "cuGraphLaunch",
                             "cuGraphDestroy",
                             "cuGraphExecDestroy",
                             "cuTensorMapEncodeTiled"}) {
    INFO(needed);
    CHECK(api_names.count(needed) == 1);
  }
}

TEST_CASE("table entries resolve to the ABI names cuda.h maps them to", "[driver][symbols]") {
  CHECK(symbol_of("cuInit") == "cuInit");
  CHECK(symbol_of("cuMemAlloc") == "cuMemAlloc_v2");
  CHECK(symbol_of("cuMemFree") == "cuMemFree_v2");
  CHECK(symbol_of("cuDeviceTotalMem") == "cuDeviceTotalMem_v2");
  CHECK(symbol_of("cuDevicePrimaryCtxRelease") == "cuDevicePrimaryCtxRelease_v2");
  CHECK(symbol_of("cuStreamDestroy") == "cuStreamDestroy_v2");
  CHECK(symbol_of("cuEventElapsedTime") == "cuEventElapsedTime_v2");
  CHECK(symbol_of("cuStreamBeginCapture") == "cuStreamBeginCapture_v2");
  // Per-thread default stream variants (_ptsz / _ptds) only when the build asks for them.
#if !defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
  CHECK(symbol_of("cuMemcpyHtoD") == "cuMemcpyHtoD_v2");
  CHECK(symbol_of("cuLaunchKernelEx") == "cuLaunchKernelEx");
  CHECK(symbol_of("cuStreamSynchronize") == "cuStreamSynchronize");
#endif
}

TEST_CASE("a library that cannot be opened is named in the error", "[driver][load]") {
  const attnplan::Error error =
      expect_error([] { driver::load_cuda_api("libattnplan-no-such-driver.so.1"); });
  CHECK(error.stage() == Stage::driver);
  CHECK(contains(error.message(), "libattnplan-no-such-driver.so.1 could not be loaded"));
  CHECK(contains(error.message(), "a CUDA driver is needed to run plans (compiling does not need one)"));
}

TEST_CASE("a library without the driver's symbols names the missing ones", "[driver][load]") {
  // libc opens everywhere and has none of them.
  const attnplan::Error error = expect_error([] { driver::load_cuda_api("libc.so.6"); });
  CHECK(error.stage() == Stage::driver);
  CHECK(contains(error.message(), "libc.so.6 lacks"));
  CHECK(contains(error.message(), "cuGetErrorName"));  // the first entry of the table
  CHECK(error.details().size() == driver::cuda_symbols().size());
  CHECK(std::find(error.details().begin(), error.details().end(), "cuMemAlloc_v2") != error.details().end());
}

TEST_CASE("api() loads libcuda.so.1 or says why it cannot", "[driver][load]") {
  if (libcuda_present()) {
    const driver::CudaApi& api = driver::api();
    CHECK(api.cuInit != nullptr);
    CHECK(&driver::api() == &api);  // loaded once
  } else {
    for (int attempt = 0; attempt < 2; ++attempt) {  // the failure is remembered, not retried differently
      const attnplan::Error error = expect_error([] { driver::api(); });
      CHECK(error.stage() == Stage::driver);
      CHECK(contains(error.message(), "libcuda.so.1 could not be loaded"));
      CHECK(contains(error.message(), "compiling does not need one"));
    }
  }
}

TEST_CASE("device_available never throws and gives a reason when false", "[driver][load]") {
  std::string reason = "unchanged";
  const bool available = driver::device_available(&reason);
  if (available) {
    CHECK(reason.empty());
  } else {
    CHECK(!reason.empty());
    if (!libcuda_present()) CHECK(contains(reason, "libcuda.so.1"));
  }
  CHECK(driver::device_available() == available);  // the reason is optional
}

TEST_CASE("check() passes success and names the failing call", "[driver][check]") {
  driver::check(CUDA_SUCCESS, "cuInit");
  const attnplan::Error error =
      expect_error([] { driver::check(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc(64 bytes)"); });
  CHECK(error.stage() == Stage::driver);
  CHECK(error.message().starts_with("cuMemAlloc(64 bytes) failed: "));
  REQUIRE(error.details().size() == 1);
  CHECK(error.details().front() == "CUresult 1");
  if (libcuda_present()) {
    CHECK(contains(error.message(), "CUDA_ERROR_INVALID_VALUE"));
  } else {
    CHECK(contains(error.message(), "CUresult 1"));
  }
}
