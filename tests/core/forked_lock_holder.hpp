// A child process that takes an flock and holds it until it is killed: stands in for another
// attnplan process (alive, or dead after kill_hard) in the file-lock and cache tests.
// Fork only while this process holds no lock itself: a child shares its parent's open locks.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <stdexcept>

#include "core/files.hpp"

namespace attnplan::testing {

class ForkedLockHolder {
 public:
  explicit ForkedLockHolder(const std::filesystem::path& lock_file) {
    int ready[2];
    if (::pipe(ready) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::close(ready[0]);
      char status = '0';
      try {
        auto lock = core::FileLock::acquire(lock_file, std::chrono::seconds(10));
        if (lock) {
          status = '1';
          (void)!::write(ready[1], &status, 1);
          for (;;) ::pause();  // held until SIGKILL
        }
      } catch (...) {
      }
      (void)!::write(ready[1], &status, 1);
      ::_exit(1);  // never return into the test runner
    }
    ::close(ready[1]);
    char status = '0';
    const bool got = ::read(ready[0], &status, 1) == 1;
    ::close(ready[0]);
    if (!got || status != '1') {
      kill_hard();
      throw std::runtime_error("the child could not take the lock " + lock_file.string());
    }
  }
  ~ForkedLockHolder() { kill_hard(); }
  ForkedLockHolder(const ForkedLockHolder&) = delete;
  ForkedLockHolder& operator=(const ForkedLockHolder&) = delete;

  // SIGKILL: no destructor, no unlock; only the kernel can release the lock now.
  void kill_hard() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

}  // namespace attnplan::testing
