// Cache faults not covered elsewhere (corruption_test: damaged entries; unwritable_test: read-only
// directories; concurrency_test: stale and live locks): a full disk, and two NVRTC versions sharing one
// directory. Outcome each time: the right kernel, a warning that says what happened, and no debris.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cache/cubin_cache.hpp"
#include "cache_test_support.hpp"
#include "compiler/cache_key.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

using namespace attnplan;
using namespace attnplan::testing;
using cache::CubinCache;
using cache::Lookup;

namespace {

struct ChildResult {
  int exit_code = -1;
  std::string report;  // what the child wrote: its warnings, or why it failed
};

// Runs `body` in a forked child whose file-size limit is `limit_bytes` (RLIMIT_FSIZE: every write past
// it fails with EFBIG, as on a full disk, without mounting anything). SIGXFSZ is ignored so that the
// write reports the error instead of killing the process. `body` returns the exit code and fills the report.
template <typename Body>
ChildResult run_with_file_size_limit(rlim_t limit_bytes, Body body) {
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    int code = 90;
    std::string report;
    try {
      ::signal(SIGXFSZ, SIG_IGN);
      const rlimit limit{limit_bytes, limit_bytes};
      if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) {
        report = "setrlimit failed";
      } else {
        code = body(report);
      }
    } catch (const std::exception& error) {
      report = std::string("exception: ") + error.what();
      code = 91;
    }
    (void)!::write(pipe_fds[1], report.data(), report.size());
    ::close(pipe_fds[1]);
    ::_exit(code);  // never return into the test runner
  }
  ::close(pipe_fds[1]);
  ChildResult result;
  char buffer[4096];
  for (ssize_t got; (got = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0;)
    result.report.append(buffer, got);
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

}  // namespace

TEST_CASE("a full disk: the kernel is kept in memory with one warning and nothing is left half-written",
          "[cache][faults][full-disk]") {
  TempDir dir;
  const std::string first = key_for("full disk first");
  const std::string second = key_for("full disk second");

  // The limit lets the probe ("probe\n") through but not a 4 KiB cubin: the disk fills mid-publish.
  const ChildResult mid_publish = run_with_file_size_limit(1024, [&](std::string& report) {
    WarningLog warnings;
    CubinCache cache(options_for(dir.path()), warnings.sink());
    if (!cache.writable()) {
      report = "the probe failed: " + warnings.all();
      return 2;
    }
    for (const std::string& key : {first, second}) {
      cache::Fetched fetched = cache.get_or_build(key, [&] { return fake_built(key, 4096, "ptx text"); });
      if (fetched.lookup != Lookup::miss || fetched.entry->cubin != fake_cubin(key)) {
        report = "wrong kernel for " + key;
        return 3;
      }
    }
    report = warnings.all();
    return warnings.count() == 1 ? 0 : 4;  // one warning, not one per kernel
  });
  INFO(mid_publish.report);
  REQUIRE(mid_publish.exit_code == 0);
  CHECK(contains(mid_publish.report, "cannot write to cache directory"));
  CHECK(contains(mid_publish.report, "File too large"));
  CHECK(contains(mid_publish.report, "keeping compiled kernels in memory only"));
  // No temp file, no partial entry (cubin without manifest), no lock of a key that was never published.
  for (const std::filesystem::path& left : regular_files_under(dir.path()))
    FAIL_CHECK("left behind: " << left);

  // A limit below even the probe: the cache says at once that it cannot write and compiles in memory.
  const ChildResult from_start = run_with_file_size_limit(0, [&](std::string& report) {
    WarningLog warnings;
    CubinCache cache(options_for(dir.path()), warnings.sink());
    cache::Fetched fetched = cache.get_or_build(first, [&] { return fake_built(first); });
    report = warnings.all();
    if (cache.writable()) return 2;
    return fetched.entry->cubin == fake_cubin(first) && warnings.count() == 1 ? 0 : 3;
  });
  INFO(from_start.report);
  REQUIRE(from_start.exit_code == 0);
  CHECK(contains(from_start.report, "is not writable"));
  CHECK(contains(from_start.report, "compiling in memory only"));
  for (const std::filesystem::path& left : regular_files_under(dir.path()))
    FAIL_CHECK("left behind: " << left);

  // With space again, the same directory works as if nothing had happened.
  WarningLog warnings;
  CubinCache cache(options_for(dir.path()), warnings.sink());
  CHECK(cache.get_or_build(first, [&] { return fake_built(first); }).lookup == Lookup::miss);
  CHECK(cache.verify().clean());
  CHECK(cache.verify().checked == 1);
  CHECK(warnings.count() == 0);
}

TEST_CASE("two NVRTC versions sharing one directory never read each other's entries",
          "[cache][faults][nvrtc-version]") {
  TempDir dir;
  // The same kernel for two compilers: only the NVRTC version differs among the key inputs.
  compiler::KeyInputs inputs;
  inputs.format_version = cache::kFormatVersion;
  inputs.toolkit_headers = "13.0";
  inputs.arch = "sm_90a";
  inputs.options = {"-arch=sm_90a", "-I<cuda>/include"};
  inputs.stub = "template __global__ void rmsnorm</*hidden=*/4096>(Params);";
  inputs.headers = {{"attnplan/rmsnorm.cuh", key_for("header")}};
  compiler::KeyInputs older = inputs;
  older.nvrtc_version = "12.8";
  compiler::KeyInputs newer = inputs;
  newer.nvrtc_version = "13.0";
  const std::string older_key = compiler::cache_key(older);
  const std::string newer_key = compiler::cache_key(newer);
  REQUIRE(older_key != newer_key);

  // Each "compiler" builds a cubin of its own (different bytes), as two NVRTC releases would.
  auto build_for = [](const compiler::KeyInputs& key_inputs, const std::string& key) {
    CubinCache::Built built = fake_built(key + key_inputs.nvrtc_version);
    built.manifest["nvrtc_version"] = key_inputs.nvrtc_version;
    built.manifest["key_inputs"] = key_inputs.to_json();
    return built;
  };
  int builds = 0;
  auto fetch = [&](CubinCache& cache, const compiler::KeyInputs& key_inputs) {
    const std::string key = compiler::cache_key(key_inputs);
    return cache.get_or_build(key, [&] {
      ++builds;
      return build_for(key_inputs, key);
    });
  };

  WarningLog warnings;
  {
    // Interleaved, as two processes of two installs would run: each builds its own entry once.
    CubinCache process_a(options_for(dir.path()), warnings.sink());
    CubinCache process_b(options_for(dir.path()), warnings.sink());
    CHECK(fetch(process_a, older).lookup == Lookup::miss);
    CHECK(fetch(process_b, newer).lookup == Lookup::miss);
    CHECK(builds == 2);
  }
  // Fresh processes: each finds exactly its own entry on disk, with its own bytes and manifest.
  CubinCache process_a(options_for(dir.path()), warnings.sink());
  CubinCache process_b(options_for(dir.path()), warnings.sink());
  const cache::Fetched a = fetch(process_a, older);
  const cache::Fetched b = fetch(process_b, newer);
  CHECK(builds == 2);
  CHECK(a.lookup == Lookup::hit);
  CHECK(b.lookup == Lookup::hit);
  CHECK(a.entry->cubin == fake_cubin(older_key + "12.8"));
  CHECK(b.entry->cubin == fake_cubin(newer_key + "13.0"));
  CHECK(a.entry->manifest.at("nvrtc_version") == "12.8");
  CHECK(b.entry->manifest.at("nvrtc_version") == "13.0");
  CHECK(compiler::KeyInputs::from_json(a.entry->manifest.at("key_inputs")) == older);
  const std::vector<std::string> differences = compiler::key_differences(older, newer);
  REQUIRE(differences.size() == 1);
  CHECK(contains(differences.front(), "NVRTC version"));
  CHECK(process_a.verify().clean());
  CHECK(process_a.verify().checked == 2);
  CHECK(warnings.count() == 0);  // two versions side by side is normal, not a fault
  CHECK(temp_files_under(dir.path()).empty());
}
