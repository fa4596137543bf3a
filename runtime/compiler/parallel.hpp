// Independent jobs (one NVRTC compile each) on a few threads. NVRTC is thread-safe across distinct
// programs, and a plan's kernels do not depend on one another.
#pragma once

#include <cstddef>
#include <functional>

namespace attnplan::compiler {

// Calls job(i) once for each i in [0, count), on up to `max_workers` threads (0: one per hardware
// thread), the calling thread being one of them; returns when every started job has finished. After a
// job throws, no further job starts; the exception of the failed job with the lowest index is rethrown,
// so the error reported does not depend on thread timing when one job is the culprit.
void for_each_parallel(std::size_t count, unsigned max_workers, const std::function<void(std::size_t)>& job);

}  // namespace attnplan::compiler
