// One Runtime compiling overlapping plans from 8 threads into an empty cache (no GPU): every thread
// succeeds, each kernel is built once, and every cubin is byte-identical to a serial compile. And keying
// a plan (no NVRTC run) from several threads, which reads the template library's stored header hashes.
#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "config/parse.hpp"
#include "core/sha256.hpp"
#include "plan/runtime.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

using namespace attnplan;

namespace {

void quiet(const std::string&) {}

RuntimeOptions options_for(const std::filesystem::path& cache_dir) {
  RuntimeOptions options;
  options.cache_dir = cache_dir;
  options.arch = config::parse_arch("sm_90a");
  options.compile_workers = 2;  // 8 threads x 2 workers is plenty of NVRTC at once on a small machine
  return options;
}

config::AttentionConfig llama() {
  return config::load_file(std::filesystem::path(ATTNPLAN_SOURCE_DIR) / "plans" / "llama-3.1-8b.json");
}

std::vector<std::string> keys_of(const std::vector<PlannedKey>& planned) {
  std::vector<std::string> keys;
  for (const PlannedKey& kernel : planned) keys.push_back(kernel.key);
  return keys;
}

}  // namespace

// Hidden from the module run (about a minute of NVRTC on 2 cores); CTest runs it as plan_concurrency.
TEST_CASE("8 threads compiling overlapping plans through one Runtime agree with a serial compile",
          "[.][plan][concurrency][nvrtc]") {
  constexpr int kThreads = 8;
  testing::TempDir dir;
  std::vector<config::AttentionConfig> configs;
  for (const char* name : {"llama-3.1-8b.json", "mistral-7b.json", "qwen3-8b.json"})
    configs.push_back(config::load_file(std::filesystem::path(ATTNPLAN_SOURCE_DIR) / "plans" / name));

  // Thread t compiles configs t % 3 and (t + 1) % 3: each config from several threads at once.
  Runtime shared(options_for(dir / "shared"), quiet);
  std::vector<std::vector<plan::CompiledPlan>> compiled(kThreads);
  std::vector<std::string> failures(kThreads);  // what each thread threw, if anything
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int c : {t % 3, (t + 1) % 3}) compiled[t].push_back(shared.compile(configs[c]));
      } catch (const std::exception& error) {
        failures[t] = error.what();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();

  std::map<std::string, int> builds;  // key -> times a thread reported it as built now (a miss)
  std::map<std::string, std::vector<std::uint8_t>> concurrent;
  for (int t = 0; t < kThreads; ++t) {
    INFO("thread " << t);
    CHECK(failures[t] == "");  // shows the message if not
    REQUIRE(compiled[t].size() == 2);
    for (const plan::CompiledPlan& plan : compiled[t]) {
      for (const plan::PlanKernel& kernel : plan.kernels) {
        if (kernel.lookup == cache::Lookup::miss) ++builds[kernel.key];
        auto [it, inserted] = concurrent.emplace(kernel.key, kernel.entry->cubin);
        if (!inserted) CHECK(it->second == kernel.entry->cubin);  // every thread saw the same entry
      }
    }
  }
  for (const auto& [key, count] : builds) {
    INFO(key);
    CHECK(count == 1);  // threads of one process wait for the first builder of a key
  }
  CHECK(builds.size() == concurrent.size());
  const cache::VerifyReport report = shared.cache().verify();
  CHECK(report.clean());
  CHECK(report.checked == static_cast<int>(concurrent.size()));
  for (const auto& item : std::filesystem::recursive_directory_iterator(dir / "shared")) {
    INFO(item.path().string());
    CHECK_FALSE(item.path().filename().string().starts_with("."));  // no temp file left
  }

  // The serial reference, in a cache of its own.
  Runtime serial(options_for(dir / "serial"), quiet);
  std::map<std::string, std::vector<std::uint8_t>> reference;
  for (const config::AttentionConfig& config : configs) {
    for (const plan::PlanKernel& kernel : serial.compile(config).kernels)
      reference[kernel.key] = kernel.entry->cubin;
  }
  CHECK(concurrent == reference);
}

TEST_CASE("plan keys from several threads equal a serial call, headers hashed as stored",
          "[plan][runtime][keys]") {
  testing::TempDir dir;
  Runtime runtime(options_for(dir.path()), quiet);
  const config::AttentionConfig config = llama();
  const std::vector<PlannedKey> serial = runtime.plan_keys(config);
  REQUIRE_FALSE(serial.empty());
  for (const PlannedKey& kernel : serial) {
    for (const auto& [name, sha256] : kernel.inputs.headers) {
      INFO(kernel.name << " " << name);
      CHECK(sha256 == core::sha256_hex(runtime.compiler().templates().headers().at(name)));
    }
  }

  constexpr int kThreads = 4;
  std::vector<std::vector<std::string>> concurrent(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] { concurrent[t] = keys_of(runtime.plan_keys(config)); });
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) CHECK(concurrent[t] == keys_of(serial));
}

// A measurement, not a check (hidden): the warm keying cost of one plan, and what hashing every
// closure header again per call (the cost before the memo) adds to it.
TEST_CASE("warm plan_keys timing", "[.][plan][runtime][timing]") {
  testing::TempDir dir;
  Runtime runtime(options_for(dir.path()), quiet);
  const config::AttentionConfig config = llama();
  runtime.plan_keys(config);  // locates the toolkit, hashes the library once
  constexpr int kCalls = 200;
  using Clock = std::chrono::steady_clock;
  std::size_t hashed = 0;
  auto start = Clock::now();
  for (int call = 0; call < kCalls; ++call) hashed += runtime.plan_keys(config).size();
  const double memo_us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / kCalls;
  start = Clock::now();
  for (int call = 0; call < kCalls; ++call) {
    for (const PlannedKey& kernel : runtime.plan_keys(config))
      for (const auto& header : kernel.inputs.headers)
        hashed += core::sha256_hex(runtime.compiler().templates().headers().at(header.first)).size();
  }
  const double rehash_us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / kCalls;
  WARN("plan_keys (memoized): " << memo_us << " us/call; with every closure header re-hashed: " << rehash_us
                                << " us/call (" << hashed << ")");
}
