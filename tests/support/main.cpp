// Test main for Catch2 2.x and 3.x. GPU test executables (ATTNPLAN_GPU_TESTS) are linked with a
// separate hook that exits 77 before any test runs when no CUDA device is usable.
#include <string_view>

#if defined(ATTNPLAN_CATCH3)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

// Defined by GPU test executables; returns false (and says why) when no device is usable.
bool attnplan_tests_device_available() __attribute__((weak));

namespace {
// Listing test cases (--list-tests, --list-tags, ...) needs no device: a selection can be checked anywhere.
bool only_lists(int argc, char* argv[]) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]).starts_with("--list")) return true;
  }
  return false;
}
}  // namespace

int main(int argc, char* argv[]) {
  if (attnplan_tests_device_available && !only_lists(argc, argv) && !attnplan_tests_device_available()) {
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
