// The attnplan subcommands. Each returns its Command (synopsis, options, handler); main dispatches.
#pragma once

#include "cli.hpp"

namespace attnplan::cli {

Command compile_command();
Command validate_command();
Command cache_command();
Command verify_command();
Command run_command();
Command import_hf_command();
Command doctor_command();
Command bench_command();

}  // namespace attnplan::cli
