// The one exception type of attnplan. Every failure carries the stage that raised it, a one-line
// message a user can act on, and a payload with the details (the NVRTC log, the failing options,
// the kernel spec, every config problem...). Library code never calls exit(); the CLI maps the
// stage to an exit code (1 for bad input, 2 for everything else).
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace attnplan {

enum class Stage {
  config,    // the attention config: JSON syntax, schema, validation rules
  input,     // user-supplied data other than the config: files, command-line values, execute() args
  cache,     // the on-disk cubin cache
  compile,   // NVRTC and the toolkit headers
  driver,    // libcuda: loading, contexts, modules, launches
  internal,  // a broken invariant inside attnplan
};

std::string_view to_string(Stage stage);

class Error : public std::runtime_error {
 public:
  Error(Stage stage, std::string message, std::string payload = {}, std::vector<std::string> details = {});

  Stage stage() const noexcept { return stage_; }
  // The message alone, without the "stage: " prefix that what() carries.
  const std::string& message() const noexcept { return message_; }
  // Free-form detail: a compiler log, the rendered stub, a JSON dump of a spec.
  const std::string& payload() const noexcept { return payload_; }
  // Itemized problems, e.g. one line per config rule broken, each starting with its JSON path.
  const std::vector<std::string>& details() const noexcept { return details_; }

  // True for errors caused by what the user handed in (config or input), as opposed to the
  // environment or attnplan itself. The CLI exits 1 for these and 2 otherwise.
  bool is_user_error() const noexcept { return stage_ == Stage::config || stage_ == Stage::input; }

 private:
  Stage stage_;
  std::string message_;
  std::string payload_;
  std::vector<std::string> details_;
};

}  // namespace attnplan
