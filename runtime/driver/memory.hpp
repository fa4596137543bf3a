// Device memory owned by one object, with host <-> device copies. For tests, the CLI's `run`/`verify`
// and benchmarks; a plan never allocates (the engine owns activations and the KV cache).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <ranges>
#include <type_traits>
#include <vector>

namespace attnplan::driver {

// Host ranges whose bytes can be copied as they are.
template <class Range>
concept HostByteRange = std::ranges::contiguous_range<Range> && std::ranges::sized_range<Range> &&
    std::is_trivially_copyable_v<std::ranges::range_value_t<Range>>;

class DeviceBuffer {
 public:
  DeviceBuffer() = default;  // empty: no allocation, address 0
  // Allocates `bytes` in the current context (uninitialized). 0 bytes allocates nothing. Throws
  // Error(driver).
  explicit DeviceBuffer(std::size_t bytes);
  // A buffer holding a copy of `host`.
  template <HostByteRange Range>
  static DeviceBuffer from_host(const Range& host) {
    DeviceBuffer buffer(std::ranges::size(host) * sizeof(std::ranges::range_value_t<Range>));
    buffer.upload(host);
    return buffer;
  }

  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  CUdeviceptr address() const noexcept { return address_; }
  std::size_t size_bytes() const noexcept { return bytes_; }
  // The address as a typed device pointer, for Params structs and plan arguments.
  template <class T>
  T* data() const noexcept {
    return reinterpret_cast<T*>(static_cast<std::uintptr_t>(address_));
  }

  // Byte copies at `offset` bytes into the buffer. Throw Error(input) when they would leave the buffer.
  // The synchronous forms return once the copy is complete; the async ones are ordered on `stream`, and
  // the host memory must stay valid (and unchanged, for uploads) until the stream reaches them.
  void upload(const void* host, std::size_t bytes, std::size_t offset = 0);
  void download(void* host, std::size_t bytes, std::size_t offset = 0) const;
  void upload_async(const void* host, std::size_t bytes, CUstream stream, std::size_t offset = 0);
  void download_async(void* host, std::size_t bytes, CUstream stream, std::size_t offset = 0) const;

  template <HostByteRange Range>
  void upload(const Range& host, std::size_t offset = 0) {
    upload(std::ranges::data(host), std::ranges::size(host) * sizeof(std::ranges::range_value_t<Range>),
           offset);
  }
  template <HostByteRange Range>
  void download(Range& host, std::size_t offset = 0) const {
    download(std::ranges::data(host), std::ranges::size(host) * sizeof(std::ranges::range_value_t<Range>),
             offset);
  }
  // The whole buffer read back as elements of T (size_bytes() must be a multiple of sizeof(T)).
  template <class T>
  std::vector<T> download_all() const {
    static_assert(std::is_trivially_copyable_v<T>);
    require_whole_elements(sizeof(T));
    std::vector<T> host(bytes_ / sizeof(T));
    download(host);
    return host;
  }

  // Sets every byte, e.g. 0xFF to make a cache page visibly "never written" in tests.
  void fill_bytes(std::uint8_t value);
  void fill_bytes_async(std::uint8_t value, CUstream stream);

 private:
  void require_range(std::size_t bytes, std::size_t offset, const char* operation) const;
  void require_whole_elements(std::size_t element_bytes) const;
  void release() noexcept;

  CUdeviceptr address_ = 0;
  std::size_t bytes_ = 0;
  CUcontext context_ = nullptr;  // the context it was allocated in; copies run there
};

}  // namespace attnplan::driver
