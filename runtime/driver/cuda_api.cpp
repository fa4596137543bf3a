#include "driver/cuda_api.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstring>
#include <iterator>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace attnplan::driver {
namespace {

// Why dlsym with the header's own ABI names rather than cuGetProcAddress: the pointer type of each member
// is decltype of the cuda.h declaration, and the symbol we look up is the name that same declaration was
// macro-expanded to, so type and symbol cannot disagree. cuGetProcAddress(name, CUDA_VERSION) returns the
// newest variant the installed driver has, whose signature can differ from the header's (cuCtxCreate_v2 vs
// _v4), and would hide an older driver instead of naming what it lacks.
#define ATTNPLAN_STRINGIZE_RAW(text) #text
#define ATTNPLAN_STRINGIZE_EXPANDED(text) ATTNPLAN_STRINGIZE_RAW(text)
#define ATTNPLAN_CUDA_SYMBOL_ENTRY(name) CudaSymbol{#name, ATTNPLAN_STRINGIZE_EXPANDED(name)},
constexpr CudaSymbol kSymbols[] = {ATTNPLAN_CUDA_SYMBOLS(ATTNPLAN_CUDA_SYMBOL_ENTRY)};
#undef ATTNPLAN_CUDA_SYMBOL_ENTRY

// dlsym returns an object pointer; copying its bytes into the function pointer avoids the conditionally
// supported object-to-function pointer cast.
template <class FunctionPointer>
void resolve(void* library, const char* symbol, FunctionPointer& slot, std::vector<std::string>& missing) {
  static_assert(sizeof(FunctionPointer) == sizeof(void*));
  void* address = dlsym(library, symbol);
  if (address == nullptr) {
    missing.emplace_back(symbol);
    return;
  }
  std::memcpy(&slot, &address, sizeof(slot));
}

std::string describe_version(int version) {
  return fmt::format("{}.{}", version / 1000, version % 1000 / 10);
}

struct LoadState {
  std::once_flag once;
  std::optional<CudaApi> api;
  std::optional<Error> failure;
};

LoadState& load_state() {
  static LoadState state;
  return state;
}

struct InitState {
  std::once_flag once;
  CUresult result = CUDA_SUCCESS;
};

}  // namespace

std::span<const CudaSymbol> cuda_symbols() noexcept {
  return kSymbols;
}

CudaApi load_cuda_api(const char* library) {
  // RTLD_LOCAL: the driver's symbols stay out of the global namespace, where they could satisfy (or clash
  // with) another component's own references to libcuda.
  void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* reason = dlerror();
    throw Error(Stage::driver, fmt::format("{} could not be loaded: {}; a CUDA driver is needed to run plans "
                                           "(compiling does not need one)",
                                           library, reason != nullptr ? reason : "unknown dlopen error"));
  }

  CudaApi api;
  std::vector<std::string> missing;
#define ATTNPLAN_CUDA_RESOLVE(name) resolve(handle, ATTNPLAN_STRINGIZE_EXPANDED(name), api.name, missing);
  ATTNPLAN_CUDA_SYMBOLS(ATTNPLAN_CUDA_RESOLVE)
#undef ATTNPLAN_CUDA_RESOLVE

  if (!missing.empty()) {
    // A missing versioned symbol almost always means a driver older than the headers attnplan was built
    // with, so say which driver this is when it can tell.
    std::string driver = "its version is unknown";
    int version = 0;
    if (api.cuDriverGetVersion != nullptr && api.cuDriverGetVersion(&version) == CUDA_SUCCESS) {
      driver = fmt::format("it is CUDA {}", describe_version(version));
    }
    std::string message = fmt::format(
        "{} lacks {} of the {} driver functions attnplan uses, first {} ({}); attnplan was built against "
        "CUDA {} headers and needs a driver at least that recent",
        library, missing.size(), std::size(kSymbols), missing.front(), driver,
        describe_version(CUDA_VERSION));
    dlclose(handle);
    throw Error(Stage::driver, std::move(message), {}, std::move(missing));
  }
  // The handle is deliberately never closed: contexts, modules and buffers may be released by static
  // destructors at exit, and they need the driver still mapped.
  return api;
}

const CudaApi& api() {
  LoadState& state = load_state();
  std::call_once(state.once, [&state] {
    try {
      state.api = load_cuda_api("libcuda.so.1");
    } catch (const Error& error) {
      state.failure = error;
    }
  });
  if (state.failure) throw *state.failure;
  return *state.api;
}

const CudaApi& initialized_api() {
  const CudaApi& loaded = api();
  static InitState init;
  std::call_once(init.once, [&] { init.result = loaded.cuInit(0); });
  check(init.result, "cuInit");
  return loaded;
}

void check(CUresult result, std::string_view call) {
  if (result == CUDA_SUCCESS) return;
  const char* name = nullptr;
  const char* description = nullptr;
  // A CUresult normally comes from a loaded driver; without one, the number alone still describes it.
  try {
    const CudaApi& loaded = api();
    if (loaded.cuGetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
    if (loaded.cuGetErrorString(result, &description) != CUDA_SUCCESS) description = nullptr;
  } catch (const Error&) {
  }
  std::string message = fmt::format(
      "{} failed: {}", call, name != nullptr ? std::string(name) : fmt::format("CUresult {}", int(result)));
  if (description != nullptr) message += fmt::format(" ({})", description);
  throw Error(Stage::driver, std::move(message), {}, {fmt::format("CUresult {}", int(result))});
}

}  // namespace attnplan::driver
