// attnplan: compile attention configs into cached kernels, validate configs, inspect the cubin cache.
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli.hpp"
#include "commands.hpp"
#include "core/error.hpp"

namespace {

using namespace attnplan::cli;

void print_overview(const std::vector<Command>& commands) {
  fmt::print(
      "attnplan — a JIT kernel-compilation runtime for LLM attention prefill\n\n"
      "usage: attnplan <command> [options]\n\ncommands:\n");
  for (const Command& command : commands) fmt::print("  {}\n", command.synopsis);
  fmt::print(
      "\n'attnplan <command> --help' describes a command. Exit codes: 0 ok, 1 bad input, 2 failure.\n");
}

void print_error(const attnplan::Error& error) {
  fmt::print(stderr, "attnplan: {}\n", error.what());
  for (const std::string& detail : error.details()) fmt::print(stderr, "  {}\n", detail);
  if (!error.payload().empty()) fmt::print(stderr, "{}\n", error.payload());
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<Command> commands = {
      compile_command(), validate_command(), cache_command(),     run_command(),
      verify_command(),  bench_command(),    import_hf_command(), doctor_command(),
  };
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    print_overview(commands);
    return argc < 2 ? kExitBadInput : kExitOk;
  }
  const std::string name = argv[1];
  const Command* command = nullptr;
  for (const Command& candidate : commands) {
    if (candidate.name == name) command = &candidate;
  }
  if (command == nullptr) {
    fmt::print(stderr, "attnplan: unknown command '{}'\n", name);
    print_overview(commands);
    return kExitBadInput;
  }
  for (int i = 2; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      fmt::print("{}", usage(*command));
      return kExitOk;
    }
  }
  try {
    return command->run(Arguments(argc, argv, 2, command->options));
  } catch (const UsageError& error) {
    fmt::print(stderr, "attnplan {}: {}\n\n{}", command->name, error.message, usage(*command));
    return kExitBadInput;
  } catch (const attnplan::Error& error) {
    print_error(error);
    return error.is_user_error() ? kExitBadInput : kExitFailure;
  } catch (const std::exception& error) {
    fmt::print(stderr, "attnplan: internal error: {}\n", error.what());
    return kExitFailure;
  }
}
