// libFuzzer harness for config::parse_text: arbitrary bytes as a config document.
// Expected outcomes: a valid AttentionConfig, or Error(config). A crash, a sanitizer report or any other
// exception is a bug. A config that parses must also survive the round trip parse.hpp promises
// (to_json, then parse again, gives an equal config): a break there means to_json writes something the
// validator rejects or loses a field.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "config/parse.hpp"
#include "core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace attnplan;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  config::AttentionConfig parsed;
  try {
    parsed = config::parse_text(text, "fuzz input");
  } catch (const Error&) {
    return 0;  // refused: the normal outcome for almost every input
  }
  config::AttentionConfig reparsed;
  try {
    reparsed = config::parse(config::to_json(parsed), "fuzz round trip");
  } catch (const Error&) {
    __builtin_trap();  // to_json produced a document parse() rejects
  }
  if (!(reparsed == parsed)) __builtin_trap();  // the round trip changed the config
  return 0;
}
