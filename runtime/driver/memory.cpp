#include "driver/memory.hpp"

#include <fmt/format.h>

#include <utility>

#include "core/error.hpp"
#include "driver/context.hpp"
#include "driver/cuda_api.hpp"

namespace attnplan::driver {

DeviceBuffer::DeviceBuffer(std::size_t bytes) {
  if (bytes == 0) return;  // cuMemAlloc rejects 0 bytes; an empty tensor is legal
  context_ = require_current_context("DeviceBuffer");
  check(api().cuMemAlloc(&address_, bytes), fmt::format("cuMemAlloc({} bytes)", bytes));
  bytes_ = bytes;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : address_(std::exchange(other.address_, 0)),
      bytes_(std::exchange(other.bytes_, 0)),
      context_(std::exchange(other.context_, nullptr)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    address_ = std::exchange(other.address_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
    context_ = std::exchange(other.context_, nullptr);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  release();
}

void DeviceBuffer::release() noexcept {
  if (address_ == 0) return;
  ScopedCurrentContext in_own_context(context_);
  (void)api().cuMemFree(address_);  // nothing to report to from a destructor
  address_ = 0;
  bytes_ = 0;
}

void DeviceBuffer::require_range(std::size_t bytes, std::size_t offset, const char* operation) const {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    throw Error(Stage::input, fmt::format("{} of {} bytes at offset {} leaves a device buffer of {} bytes",
                                          operation, bytes, offset, bytes_));
  }
}

void DeviceBuffer::require_whole_elements(std::size_t element_bytes) const {
  if (bytes_ % element_bytes != 0) {
    throw Error(Stage::input, fmt::format("a device buffer of {} bytes does not hold whole {}-byte elements",
                                          bytes_, element_bytes));
  }
}

// Each copy runs in the buffer's context: the synchronous copies need a current context, and the thread
// calling them (a test, the CLI) may not have bound one.
void DeviceBuffer::upload(const void* host, std::size_t bytes, std::size_t offset) {
  require_range(bytes, offset, "upload");
  if (bytes == 0) return;
  ScopedCurrentContext in_own_context(context_);
  check(api().cuMemcpyHtoD(address_ + offset, host, bytes), "cuMemcpyHtoD");
}

void DeviceBuffer::download(void* host, std::size_t bytes, std::size_t offset) const {
  require_range(bytes, offset, "download");
  if (bytes == 0) return;
  ScopedCurrentContext in_own_context(context_);
  check(api().cuMemcpyDtoH(host, address_ + offset, bytes), "cuMemcpyDtoH");
}

void DeviceBuffer::upload_async(const void* host, std::size_t bytes, CUstream stream, std::size_t offset) {
  require_range(bytes, offset, "upload_async");
  if (bytes == 0) return;
  ScopedCurrentContext in_own_context(context_);
  check(api().cuMemcpyHtoDAsync(address_ + offset, host, bytes, stream), "cuMemcpyHtoDAsync");
}

void DeviceBuffer::download_async(void* host, std::size_t bytes, CUstream stream, std::size_t offset) const {
  require_range(bytes, offset, "download_async");
  if (bytes == 0) return;
  ScopedCurrentContext in_own_context(context_);
  check(api().cuMemcpyDtoHAsync(host, address_ + offset, bytes, stream), "cuMemcpyDtoHAsync");
}

void DeviceBuffer::fill_bytes(std::uint8_t value) {
  if (bytes_ == 0) return;
  ScopedCurrentContext in_own_context(context_);
  check(api().cuMemsetD8(address_, value, bytes_), "cuMemsetD8");
}

void DeviceBuffer::fill_bytes_async(std::uint8_t value, CUstream stream) {
  if (bytes_ == 0) return;
  ScopedCurrentContext in_own_context(context_);
  check(api().cuMemsetD8Async(address_, value, bytes_, stream), "cuMemsetD8Async");
}

}  // namespace attnplan::driver
