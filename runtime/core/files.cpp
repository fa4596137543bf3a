#include "core/files.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <system_error>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "core/error.hpp"

namespace attnplan::core {
namespace {

std::string os_error(int error_number) {
  return std::system_category().message(error_number);
}

// Closes on scope exit unless released; keeps every early return and throw from leaking a descriptor.
class FdGuard {
 public:
  explicit FdGuard(int fd) : fd_(fd) {}
  ~FdGuard() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdGuard(const FdGuard&) = delete;
  FdGuard& operator=(const FdGuard&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// Reads until EOF rather than trusting st_size: the file may be a pipe or change size under us.
std::string read_all(const std::filesystem::path& path) {
  FdGuard fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0)
    throw Error(Stage::input, fmt::format("cannot read {}: {}", path.string(), os_error(errno)));
  std::string data;
  struct stat info {};
  if (::fstat(fd.get(), &info) == 0 && info.st_size > 0) data.reserve(static_cast<std::size_t>(info.st_size));
  char chunk[1 << 16];
  for (;;) {
    ssize_t got = ::read(fd.get(), chunk, sizeof chunk);
    if (got == 0) break;
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error(Stage::input, fmt::format("cannot read {}: {}", path.string(), os_error(errno)));
    }
    data.append(chunk, static_cast<std::size_t>(got));
  }
  return data;
}

void write_all(int fd, const void* data, std::size_t size) {
  const auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t wrote = ::write(fd, bytes, size);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::system_category());
    }
    bytes += wrote;
    size -= static_cast<std::size_t>(wrote);
  }
}

// A name no other writer uses: the pid separates processes, the counter threads and repeated calls.
// O_EXCL still guards against a collision (another host on a shared file system with the same pid).
std::atomic<std::uint64_t> temp_counter{0};

std::filesystem::path temp_path_for(const std::filesystem::path& path) {
  // A leading dot hides the temp file from the cache's entry scan; ".tmp" lets prune() recognise it.
  std::string name = fmt::format(".{}.{}.{}.tmp", path.filename().string(), ::getpid(), temp_counter++);
  return path.parent_path() / name;
}

// fsync of the directory makes the rename itself durable. Some file systems cannot sync a directory
// (EINVAL); the rename is still atomic there, so that is not a failure.
void sync_directory(const std::filesystem::path& directory) {
  FdGuard fd(::open(directory.empty() ? "." : directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throw std::system_error(errno, std::system_category());
  if (::fsync(fd.get()) != 0 && errno != EINVAL && errno != ENOTSUP) {
    throw std::system_error(errno, std::system_category());
  }
}

}  // namespace

std::vector<std::uint8_t> read_binary_file(const std::filesystem::path& path) {
  std::string data = read_all(path);
  return std::vector<std::uint8_t>(data.begin(), data.end());
}

std::string read_text_file(const std::filesystem::path& path) {
  return read_all(path);
}

void write_file_atomic(const std::filesystem::path& path, const void* data, std::size_t size) {
  std::filesystem::path temp;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    temp = temp_path_for(path);
    // 0666 and the umask: the same permissions a plain open() would give, so a shared cache stays shared.
    fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    throw Error(Stage::cache, fmt::format("cannot write {}: {}", path.string(), os_error(errno)));
  }
  FdGuard guard(fd);
  try {
    write_all(fd, data, size);
    if (::fsync(fd) != 0) throw std::system_error(errno, std::system_category());
    // close() can report a deferred write error (NFS), so it is checked rather than left to the guard.
    if (::close(guard.release()) != 0) throw std::system_error(errno, std::system_category());
    if (::rename(temp.c_str(), path.c_str()) != 0) throw std::system_error(errno, std::system_category());
  } catch (const std::system_error& error) {
    ::unlink(temp.c_str());
    throw Error(Stage::cache, fmt::format("cannot write {}: {}", path.string(), error.code().message()));
  }
  try {
    sync_directory(path.parent_path());
  } catch (const std::system_error& error) {
    // The new file is already in place; only its durability across a power loss is in doubt.
    throw Error(Stage::cache,
                fmt::format("cannot sync directory of {}: {}", path.string(), error.code().message()));
  }
}

std::optional<FileLock> FileLock::acquire(const std::filesystem::path& path,
                                          std::chrono::milliseconds timeout) {
  FdGuard fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666));
  if (fd.get() < 0) {
    throw Error(Stage::cache, fmt::format("cannot open lock file {}: {}", path.string(), os_error(errno)));
  }
  // flock has no timed wait, so poll LOCK_NB with a backoff: quick for short holds (another thread
  // finishing a publish), cheap for long ones (another process compiling for seconds).
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::chrono::milliseconds pause{1};
  for (;;) {
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) == 0) return FileLock(fd.release());
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) {
      throw Error(Stage::cache, fmt::format("cannot lock {}: {}", path.string(), os_error(errno)));
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds{50});
  }
}

FileLock::FileLock(FileLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

// Closing the descriptor releases the flock; no explicit LOCK_UN is needed.
FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace attnplan::core
