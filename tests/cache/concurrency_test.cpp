// Several writers of one key: other processes (alive, killed, or racing) and threads of this process.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cache/cubin_cache.hpp"
#include "cache_test_support.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "core/forked_lock_holder.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

using namespace attnplan;
using namespace attnplan::testing;
using namespace std::chrono_literals;
using cache::CubinCache;
using cache::Lookup;

namespace {

// Runs `body` in a child process and returns its pid; the child exits with body's result (99 if it
// threw) and never returns into the test runner.
pid_t run_in_child(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    int code = 99;
    try {
      code = body();
    } catch (...) {
    }
    ::_exit(code);
  }
  return pid;
}

// The child's exit code, or -1 if a signal ended it.
int wait_child(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

int count_lines(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) return 0;
  const std::string text = core::read_text_file(path);
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

}  // namespace

TEST_CASE("a lock left by a killed process does not block the next writer", "[cache][lock]") {
  TempDir dir;
  CubinCache cache(options_for(dir.path()), {});
  const std::string key = key_for("stale");
  std::filesystem::create_directories(cache.lock_path(key).parent_path());
  ForkedLockHolder holder(cache.lock_path(key));
  holder.kill_hard();

  int builds = 0;
  const auto start = std::chrono::steady_clock::now();
  cache::Fetched fetched = cache.get_or_build(key, [&] {
    ++builds;
    return fake_built(key);
  });
  CHECK(elapsed_ms(start) < 2000);  // the lock timeout is 20 s: this must not have waited for it
  CHECK(fetched.lookup == Lookup::miss);
  CHECK(builds == 1);
  CHECK(std::filesystem::exists(cache.lock_path(key)));  // the file stays; only its flock matters
}

TEST_CASE("a lock held by a live process past the timeout is Error(cache) naming the lock", "[cache][lock]") {
  TempDir dir;
  cache::CacheOptions options = options_for(dir.path());
  options.lock_timeout = 200ms;
  CubinCache cache(options, {});
  const std::string key = key_for("held");
  std::filesystem::create_directories(cache.lock_path(key).parent_path());
  ForkedLockHolder holder(cache.lock_path(key));

  bool built = false;
  auto build = [&] {
    built = true;
    return fake_built(key);
  };
  const auto start = std::chrono::steady_clock::now();
  try {
    cache.get_or_build(key, build);
    FAIL("expected Error(cache)");
  } catch (const Error& error) {
    CHECK(error.stage() == Stage::cache);
    CHECK(contains(error.message(), cache.lock_path(key).string()));
    CHECK(contains(error.message(), "timed out after 200 ms"));
  }
  CHECK(elapsed_ms(start) >= 190);
  CHECK_FALSE(built);

  // Once the holder is gone the same cache object works (the key is not stuck "in flight").
  holder.kill_hard();
  CHECK(cache.get_or_build(key, build).lookup == Lookup::miss);
  CHECK(built);
}

TEST_CASE("after waiting for the lock, an entry another process published is a hit, not a rebuild",
          "[cache][lock]") {
  TempDir dir;
  const auto root = dir / "cache";
  const auto staging = dir / "staging";
  const std::string key = key_for("published meanwhile");
  CubinCache staged(options_for(staging), {});
  staged.get_or_build(key, [&] { return fake_built(key); });
  CubinCache cache(options_for(root), {});
  std::filesystem::create_directories(cache.lock_path(key).parent_path());

  // The child plays another attnplan process: it holds the key's lock while it "publishes" (moves the
  // staged files in, cubin first), then exits, releasing the lock.
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = run_in_child([&] {
    ::close(ready[0]);
    auto lock = core::FileLock::acquire(cache.lock_path(key), 5s);
    if (!lock) return 1;
    (void)!::write(ready[1], "1", 1);
    std::this_thread::sleep_for(300ms);
    std::filesystem::rename(staged.cubin_path(key), cache.cubin_path(key));
    std::filesystem::rename(staged.manifest_path(key), cache.manifest_path(key));
    return 0;
  });
  ::close(ready[1]);
  char byte = 0;
  REQUIRE(::read(ready[0], &byte, 1) == 1);
  ::close(ready[0]);

  bool built = false;
  cache::Fetched fetched = cache.get_or_build(key, [&] {
    built = true;
    return fake_built(key);
  });
  CHECK(wait_child(child) == 0);
  CHECK(fetched.lookup == Lookup::hit);
  CHECK_FALSE(built);
  CHECK(fetched.entry->cubin == fake_cubin(key));
}

TEST_CASE("six processes building one key into an empty directory agree on one entry", "[cache][lock]") {
  TempDir dir;
  const auto root = dir / "cache";  // does not exist yet: the children race to create it too
  const auto build_log = dir / "builds.log";
  const std::string key = key_for("contended");
  constexpr int kChildren = 6;

  // Every child blocks on `go` until all are forked, so they really start together.
  int go[2];
  REQUIRE(::pipe(go) == 0);
  std::vector<pid_t> children;
  for (int i = 0; i < kChildren; ++i) {
    children.push_back(run_in_child([&] {
      ::close(go[1]);
      char byte;
      if (::read(go[0], &byte, 1) != 0) return 98;
      CubinCache cache(options_for(root), [](const std::string&) { ::_exit(97); });
      cache::Fetched fetched = cache.get_or_build(key, [&] {
        const int log = ::open(build_log.c_str(), O_WRONLY | O_APPEND | O_CREAT, 0644);
        (void)!::write(log, "built\n", 6);
        ::close(log);
        std::this_thread::sleep_for(100ms);  // a compile takes a while: the others must queue behind it
        return fake_built(key);
      });
      if (fetched.entry->cubin != fake_cubin(key)) return 3;
      return fetched.lookup == Lookup::miss ? 0 : fetched.lookup == Lookup::hit ? 1 : 2;
    }));
  }
  ::close(go[0]);
  ::close(go[1]);  // end of file: go

  int misses = 0;
  int hits = 0;
  for (pid_t child : children) {
    const int code = wait_child(child);
    INFO("child exit code " << code);
    CHECK((code == 0 || code == 1));
    misses += code == 0;
    hits += code == 1;
  }
  const int builds = count_lines(build_log);
  CHECK(builds == misses);
  // The lock plus the re-check after taking it make this exactly one build.
  CHECK(builds == 1);
  CHECK(misses + hits == kChildren);

  WarningLog warnings;
  CubinCache cache(options_for(root), warnings.sink());
  const std::vector<cache::EntryInfo> entries = cache.list();
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].key == key);
  CHECK(cache.verify().clean());
  CHECK(core::read_binary_file(cache.cubin_path(key)) == fake_cubin(key));
  CHECK(temp_files_under(root).empty());
  CHECK(warnings.count() == 0);
}

TEST_CASE("threads asking for the same key build it once; different keys build in parallel",
          "[cache][threads]") {
  TempDir dir;
  CubinCache cache(options_for(dir.path()), {});
  constexpr int kThreads = 8;
  const std::vector<std::string> keys = {key_for("t0"), key_for("t1"), key_for("t2")};
  std::atomic<int> builds{0};
  std::atomic<int> concurrent{0};
  std::atomic<int> most_concurrent{0};
  std::atomic<int> misses{0};
  std::atomic<int> wrong{0};

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t k = 0; k < keys.size(); ++k) {
        const std::string& key = keys[(k + t) % keys.size()];
        cache::Fetched fetched = cache.get_or_build(key, [&] {
          ++builds;
          const int now = ++concurrent;
          int seen = most_concurrent.load();
          while (now > seen && !most_concurrent.compare_exchange_weak(seen, now)) {
          }
          std::this_thread::sleep_for(50ms);
          --concurrent;
          return fake_built(key);
        });
        if (fetched.lookup == Lookup::miss) ++misses;
        if (fetched.entry->cubin != fake_cubin(key)) ++wrong;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(builds == static_cast<int>(keys.size()));
  CHECK(misses == static_cast<int>(keys.size()));
  CHECK(wrong == 0);
  CHECK(most_concurrent > 1);  // the per-key wait does not serialize unrelated keys
  CHECK(cache.list().size() == keys.size());
  CHECK(cache.verify().clean());
}
