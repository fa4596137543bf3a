// Runs a callable that must throw attnplan::Error and returns the error, so a test can check its stage
// and message the same way with Catch2 v2 and v3.
#pragma once

#include <stdexcept>
#include <string>

#include "core/error.hpp"
#include "support/catch.hpp"

template <class Callable>
attnplan::Error expect_error(Callable&& callable) {
  try {
    callable();
  } catch (const attnplan::Error& error) {
    return error;
  }
  FAIL("expected an attnplan::Error");
  throw std::logic_error("unreachable");  // FAIL throws; this keeps every path returning
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}
