#include "compiler/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace attnplan::compiler {

void for_each_parallel(std::size_t count, unsigned max_workers, const std::function<void(std::size_t)>& job) {
  if (count == 0) return;
  if (max_workers == 0) max_workers = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t workers = std::min<std::size_t>(count, max_workers);

  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;  // guards the two below
  std::exception_ptr first_error;
  std::size_t first_error_index = count;

  auto work = [&] {
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) return;
      const std::size_t index = next.fetch_add(1);
      if (index >= count) return;
      try {
        job(index);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (index < first_error_index) {
          first_error_index = index;
          first_error = std::current_exception();
        }
        failed.store(true, std::memory_order_relaxed);
      }
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  for (std::size_t i = 1; i < workers; ++i) {
    try {
      threads.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // out of threads: the ones running, and this one, still drain the queue
    }
  }
  work();
  for (std::thread& thread : threads) thread.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace attnplan::compiler
