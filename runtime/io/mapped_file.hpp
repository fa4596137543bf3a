// A whole file mapped read-only into memory, unmapped when the object dies. Checkpoints are many GB and
// a layer reads a small part of them: mapping lets the OS page in only what is touched, and nothing is
// copied until the caller copies it.
//
// The mapping is private and read-only. Replacing the file by rename (as core::write_file_atomic does)
// leaves this mapping on the old contents; truncating the file in place while it is mapped would make
// reads past the new end fault (SIGBUS), which no reader of shared files can prevent.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>

namespace attnplan::io {

class MappedFile {
 public:
  // Throws Error(input) naming the path and the OS error: missing, unreadable or not a regular file.
  static MappedFile open(const std::filesystem::path& path);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  // The file's bytes; valid while this object (or the one it was moved into) lives. Empty file: empty span.
  std::span<const std::uint8_t> bytes() const noexcept { return {data_, size_}; }

 private:
  MappedFile(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  void unmap() noexcept;

  const std::uint8_t* data_ = nullptr;  // null for an empty file (mmap refuses length 0)
  std::size_t size_ = 0;
};

}  // namespace attnplan::io
