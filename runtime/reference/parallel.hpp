// Splits independent work over the host's cores. The reference runs at GPU-test sizes (thousands of
// tokens, dozens of heads) in double precision, so one thread would make those tests slow; every index
// writes its own outputs with the same sequential code, so results do not depend on the thread count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace attnplan::reference::detail {

// Calls body(i) for every i in [0, count), in contiguous ranges, one per thread. The first exception a
// body throws is rethrown here after every thread has joined (callers validate before, so this only
// carries a broken invariant out instead of terminating).
template <class Body>
void parallel_for(std::int64_t count, const Body& body) {
  // Below this much work per thread, starting threads costs more than it saves.
  constexpr std::int64_t kMinPerThread = 4;
  const std::int64_t hardware = std::max<std::int64_t>(1, std::thread::hardware_concurrency());
  const std::int64_t threads = std::clamp<std::int64_t>(count / kMinPerThread, 1, hardware);
  if (threads == 1) {
    for (std::int64_t i = 0; i < count; ++i) body(i);
    return;
  }

  std::exception_ptr first_error;
  std::mutex error_mutex;
  auto run_range = [&](std::int64_t begin, std::int64_t end) {
    try {
      for (std::int64_t i = begin; i < end; ++i) body(i);
    } catch (...) {
      const std::lock_guard lock(error_mutex);
      if (!first_error) first_error = std::current_exception();
    }
  };
  std::vector<std::thread> workers;
  workers.reserve(static_cast<std::size_t>(threads - 1));
  const std::int64_t per_thread = (count + threads - 1) / threads;
  for (std::int64_t t = 1; t < threads; ++t) {
    const std::int64_t begin = std::min(count, t * per_thread);
    const std::int64_t end = std::min(count, begin + per_thread);
    try {
      workers.emplace_back(run_range, begin, end);
    } catch (const std::system_error&) {
      run_range(begin, end);  // no thread to be had: the work still gets done, just serially
    }
  }
  run_range(0, std::min(count, per_thread));  // the calling thread takes the first range
  for (std::thread& worker : workers) worker.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace attnplan::reference::detail
