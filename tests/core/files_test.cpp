// File primitives: whole-file reads, crash-safe publish (temp + fsync + rename) and flock locks,
// including locks held by other processes, alive or killed.
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/files.hpp"
#include "core/forked_lock_holder.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

using attnplan::Error;
using attnplan::Stage;
using attnplan::core::FileLock;
using attnplan::core::read_binary_file;
using attnplan::core::read_text_file;
using attnplan::core::write_file_atomic;
using attnplan::testing::ForkedLockHolder;
using attnplan::testing::TempDir;
using namespace std::chrono_literals;

namespace {

std::vector<std::string> names_in(const std::filesystem::path& directory) {
  std::vector<std::string> names;
  for (const auto& item : std::filesystem::directory_iterator(directory)) {
    names.push_back(item.path().filename().string());
  }
  return names;
}

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

TEST_CASE("write_file_atomic and read_binary_file round-trip any bytes", "[core][files]") {
  TempDir dir;
  std::vector<std::uint8_t> bytes(1 << 20 | 77);  // larger than one read chunk, not a multiple of it
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>((i * 131) >> 3);
  bytes[0] = 0;  // embedded zeros must survive
  write_file_atomic(dir / "blob.bin", bytes.data(), bytes.size());
  CHECK(read_binary_file(dir / "blob.bin") == bytes);

  write_file_atomic(dir / "text.txt", std::string_view("line one\nline two\n"));
  CHECK(read_text_file(dir / "text.txt") == "line one\nline two\n");

  write_file_atomic(dir / "empty", std::string_view());
  CHECK(std::filesystem::file_size(dir / "empty") == 0);
  CHECK(read_binary_file(dir / "empty").empty());
}

TEST_CASE("write_file_atomic replaces the whole file and leaves no temp file", "[core][files]") {
  TempDir dir;
  write_file_atomic(dir / "target", std::string(10000, 'x'));
  write_file_atomic(dir / "target", std::string_view("short"));
  CHECK(read_text_file(dir / "target") == "short");
  CHECK(names_in(dir.path()) == std::vector<std::string>{"target"});
}

TEST_CASE("write_file_atomic gives new files the umask's permissions", "[core][files]") {
  TempDir dir;
  const mode_t mask = ::umask(022);
  ::umask(mask);
  write_file_atomic(dir / "shared", std::string_view("x"));
  const auto perms = std::filesystem::status(dir / "shared").permissions();
  CHECK(static_cast<mode_t>(perms) == (0666 & ~mask));
}

TEST_CASE("write_file_atomic failures throw Error(cache) and clean up", "[core][files]") {
  TempDir dir;
  SECTION("missing directory") {
    try {
      write_file_atomic(dir / "missing" / "file", std::string_view("x"));
      FAIL("expected an Error");
    } catch (const Error& error) {
      CHECK(error.stage() == Stage::cache);
      CHECK(error.message().find((dir / "missing" / "file").string()) != std::string::npos);
    }
    CHECK(names_in(dir.path()).empty());
  }
  SECTION("the target is a directory: the rename fails after the temp file was written") {
    std::filesystem::create_directories(dir / "target" / "inside");
    REQUIRE_THROWS_AS(write_file_atomic(dir / "target", std::string(5000, 'y')), Error);
    CHECK(names_in(dir.path()) == std::vector<std::string>{"target"});
  }
}

TEST_CASE("read_binary_file names the path and the OS error", "[core][files]") {
  TempDir dir;
  try {
    read_binary_file(dir / "absent.cubin");
    FAIL("expected an Error");
  } catch (const Error& error) {
    CHECK(error.stage() == Stage::input);
    CHECK(error.message().find("absent.cubin") != std::string::npos);
    CHECK(error.message().find("No such file") != std::string::npos);
  }
  REQUIRE_THROWS_AS(read_text_file(dir.path()), Error);  // a directory is not readable as a file
}

TEST_CASE("FileLock excludes a second holder until released", "[core][files][lock]") {
  TempDir dir;
  const auto path = dir / "key.lock";
  auto first = FileLock::acquire(path, 0ms);
  REQUIRE(first.has_value());
  CHECK(std::filesystem::exists(path));

  // Another open file description in the same process conflicts too (flock semantics), which is what
  // lets threads of one process and other processes serialize on the same file.
  auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(FileLock::acquire(path, 150ms).has_value());
  CHECK(elapsed_ms(start) >= 140);
  CHECK(elapsed_ms(start) < 5000);
  CHECK_FALSE(FileLock::acquire(path, 0ms).has_value());

  first.reset();
  CHECK(FileLock::acquire(path, 0ms).has_value());
}

TEST_CASE("FileLock moves keep the lock; move assignment releases the old one", "[core][files][lock]") {
  TempDir dir;
  auto original = FileLock::acquire(dir / "a.lock", 0ms);
  REQUIRE(original);
  {
    FileLock moved(std::move(*original));
    original.reset();  // destroying the moved-from object must not release
    CHECK_FALSE(FileLock::acquire(dir / "a.lock", 0ms).has_value());

    auto other = FileLock::acquire(dir / "b.lock", 0ms);
    REQUIRE(other);
    moved = std::move(*other);  // releases a.lock, now holds b.lock
    CHECK(FileLock::acquire(dir / "a.lock", 0ms).has_value());
    CHECK_FALSE(FileLock::acquire(dir / "b.lock", 0ms).has_value());
  }
  CHECK(FileLock::acquire(dir / "b.lock", 0ms).has_value());
}

TEST_CASE("FileLock in a missing directory throws Error(cache)", "[core][files][lock]") {
  TempDir dir;
  try {
    FileLock::acquire(dir / "missing" / "key.lock", 10ms);
    FAIL("expected an Error");
  } catch (const Error& error) {
    CHECK(error.stage() == Stage::cache);
    CHECK(error.message().find("key.lock") != std::string::npos);
  }
}

TEST_CASE("FileLock held by a live process times out; a killed holder leaves no stale lock",
          "[core][files][lock]") {
  TempDir dir;
  const auto path = dir / "key.lock";
  ForkedLockHolder holder(path);

  auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(FileLock::acquire(path, 200ms).has_value());
  CHECK(elapsed_ms(start) >= 190);

  holder.kill_hard();
  start = std::chrono::steady_clock::now();
  auto lock = FileLock::acquire(path, 10s);
  CHECK(lock.has_value());
  CHECK(elapsed_ms(start) < 1000);  // at once, not after the timeout
}
