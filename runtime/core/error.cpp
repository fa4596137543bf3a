#include "core/error.hpp"

#include <utility>

namespace attnplan {

std::string_view to_string(Stage stage) {
  switch (stage) {
    case Stage::config:
      return "config";
    case Stage::input:
      return "input";
    case Stage::cache:
      return "cache";
    case Stage::compile:
      return "compile";
    case Stage::driver:
      return "driver";
    case Stage::internal:
      return "internal";
  }
  return "unknown";
}

static std::string compose_what(Stage stage, const std::string& message) {
  std::string what(to_string(stage));
  what += " error: ";
  what += message;
  return what;
}

Error::Error(Stage stage, std::string message, std::string payload, std::vector<std::string> details)
    : std::runtime_error(compose_what(stage, message)),
      stage_(stage),
      message_(std::move(message)),
      payload_(std::move(payload)),
      details_(std::move(details)) {}

}  // namespace attnplan
