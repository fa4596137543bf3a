#include "io/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "core/error.hpp"

namespace attnplan::io {
namespace {

[[noreturn]] void throw_os_error(const std::filesystem::path& path, std::string_view what, int error_number) {
  throw Error(Stage::input, fmt::format("cannot {} {}: {}", what, path.string(),
                                        std::system_category().message(error_number)));
}

}  // namespace

MappedFile MappedFile::open(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_os_error(path, "open", errno);
  // The mapping keeps the file's pages reachable on its own, so the descriptor is closed on every path.
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};

  struct stat status {};
  if (::fstat(fd, &status) != 0) throw_os_error(path, "stat", errno);
  // A directory opens fine but cannot be mapped, and a pipe has no size: say so rather than "No such device".
  if (!S_ISREG(status.st_mode)) {
    throw Error(Stage::input, fmt::format("cannot read {}: not a regular file", path.string()));
  }
  const auto size = static_cast<std::size_t>(status.st_size);
  if (size == 0) return MappedFile(nullptr, 0);
  void* address = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (address == MAP_FAILED) throw_os_error(path, "map", errno);
  return MappedFile(static_cast<const std::uint8_t*>(address), size);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    unmap();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  unmap();
}

void MappedFile::unmap() noexcept {
  // munmap can only fail for an invalid range, which this class never holds; nothing to report then.
  if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace attnplan::io
