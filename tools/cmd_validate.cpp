#include <fmt/format.h>

#include "commands.hpp"
#include "config/parse.hpp"

namespace attnplan::cli {

Command validate_command() {
  Command command;
  command.name = "validate";
  command.synopsis = "validate CONFIG";
  command.description =
      "Checks an attention config against schema attnplan/v1 and every rule of docs/config.md, and lists\n"
      "all problems at once, each with its JSON path. Exits 0 when the config is valid, 1 otherwise.";
  command.run = [](const Arguments& args) {
    const std::string& path = args.only_positional("CONFIG");
    const config::AttentionConfig config = config::load_file(path);
    fmt::print("{}: valid ({}hidden {}, heads {}/{}, head_dim {})\n", path,
               config.name.empty() ? "" : config.name + ", ", config.hidden_size, config.query_heads,
               config.kv_heads, config.head_dim);
    return kExitOk;
  };
  return command;
}

}  // namespace attnplan::cli
