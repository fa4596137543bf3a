// Test main for Catch2 2.x and 3.x. GPU test executables (ATTNPLAN_GPU_TESTS) are linked with a
// separate hook that exits 77 before any test runs when no CUDA device is usable.
#if defined(ATTNPLAN_CATCH3)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

// Defined by GPU test executables; returns false (and says why) when no device is usable.
bool attnplan_tests_device_available() __attribute__((weak));

int main(int argc, char* argv[]) {
  if (attnplan_tests_device_available && !attnplan_tests_device_available()) return 77;
  return Catch::Session().run(argc, argv);
}
