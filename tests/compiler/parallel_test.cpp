#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "compiler/parallel.hpp"
#include "support/catch.hpp"
#include "test_kernels.hpp"

using attnplan::compiler::for_each_parallel;

TEST_CASE("every job runs exactly once", "[parallel]") {
  for (const unsigned workers : {0u, 1u, 3u, 64u}) {
    std::vector<std::atomic<int>> runs(100);
    for_each_parallel(runs.size(), workers, [&](std::size_t i) { runs[i].fetch_add(1); });
    for (const auto& count : runs) CHECK(count.load() == 1);
  }
  bool called = false;
  for_each_parallel(0, 4, [&](std::size_t) { called = true; });
  CHECK_FALSE(called);
}

TEST_CASE("jobs run on several threads at once", "[parallel]") {
  std::atomic<int> running{0};
  std::atomic<int> most{0};
  for_each_parallel(8, 4, [&](std::size_t) {
    const int now = running.fetch_add(1) + 1;
    for (int seen = most.load(); now > seen && !most.compare_exchange_weak(seen, now);) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    running.fetch_sub(1);
  });
  CHECK(most.load() > 1);
  CHECK(most.load() <= 4);
}

TEST_CASE("the failure of the lowest job index is rethrown after the others finish", "[parallel]") {
  std::atomic<int> finished{0};
  try {
    for_each_parallel(2, 2, [&](std::size_t i) {
      if (i == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // fails last, but has the lower index
        throw std::runtime_error("job 0");
      }
      finished.fetch_add(1);
      throw std::runtime_error("job 1");
    });
    FAIL("expected an exception");
  } catch (const std::runtime_error& error) {
    CHECK(std::string(error.what()) == "job 0");
  }
  CHECK(finished.load() == 1);

  // With one worker the jobs run in order and stop at the first failure.
  std::vector<std::size_t> ran;
  CHECK_THROWS_AS(for_each_parallel(5, 1,
                                    [&](std::size_t i) {
                                      ran.push_back(i);
                                      if (i == 2) throw std::logic_error("stop");
                                    }),
                  std::logic_error);
  CHECK(ran == std::vector<std::size_t>{0, 1, 2});
}

TEST_CASE("parallel NVRTC compiles match serial ones", "[parallel][nvrtc]") {
  using attnplan::compiler::CompiledKernel;
  using attnplan::compiler::CompileOptions;
  const std::vector<attnplan::compiler::KernelSource> sources{
      attnplan::testing::rmsnorm_source(4096, 256, false), attnplan::testing::rmsnorm_source(2880, 128, true),
      attnplan::testing::kv_store_source(8, 128, 128, 16, 256, 4),
      attnplan::testing::kv_store_source(1, 80, 64, 32, 128, 1)};
  const auto& compiler = attnplan::testing::test_compiler();
  std::vector<CompiledKernel> parallel(sources.size());
  for_each_parallel(sources.size(), 4, [&](std::size_t i) {
    parallel[i] = compiler.compile(sources[i], CompileOptions{attnplan::testing::kSm90a});
  });
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const CompiledKernel serial = compiler.compile(sources[i], CompileOptions{attnplan::testing::kSm90a});
    CHECK(parallel[i].cubin == serial.cubin);
    CHECK(parallel[i].lowered_name == serial.lowered_name);
  }
}
