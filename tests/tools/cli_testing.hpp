// Running the attnplan binary from the CLI tests: a real process, its stdout and stderr captured in files
// under a scratch directory, its exit code.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace attnplan::cli_testing {

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Single-quoted for sh, so any path or argument passes through unchanged.
inline std::string quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// Runs `ENV... attnplan ARGS...`; each `environment` entry is NAME=value.
inline Result run_cli(const std::filesystem::path& scratch, const std::vector<std::string>& args,
                      const std::vector<std::string>& environment = {}) {
  static int counter = 0;
  const std::filesystem::path out = scratch / ("cli-out" + std::to_string(counter));
  const std::filesystem::path err = scratch / ("cli-err" + std::to_string(counter++));
  std::string command;
  for (const std::string& variable : environment) {
    const std::size_t equals = variable.find('=');
    command += variable.substr(0, equals + 1) + quote(variable.substr(equals + 1)) + " ";
  }
  command += quote(ATTNPLAN_CLI_PATH);
  // Appended piece by piece: `" " + quote(arg)` trips GCC 12's -Wrestrict (a false positive in
  // operator+(const char*, std::string&&) at -O2).
  for (const std::string& arg : args) command.append(" ").append(quote(arg));
  command.append(" >").append(quote(out.string())).append(" 2>").append(quote(err.string()));
  const int status = std::system(command.c_str());
  Result result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.out = read_all(out);
  result.err = read_all(err);
  return result;
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

inline std::string plan_path(const std::string& name) {
  return std::string(ATTNPLAN_SOURCE_DIR) + "/plans/" + name;
}

// Runs `attnplan COMMAND plans/llama-3.1-8b.json ARGS...` with its cache under `scratch`.
inline Result run_on_llama(const std::filesystem::path& scratch, const std::string& command,
                           std::vector<std::string> args) {
  args.insert(args.begin(), {command, plan_path("llama-3.1-8b.json")});
  return run_cli(scratch, args, {"ATTNPLAN_CACHE_DIR=" + (scratch / "cache").string()});
}

}  // namespace attnplan::cli_testing
