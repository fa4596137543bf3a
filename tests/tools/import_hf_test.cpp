// `attnplan import-hf` end to end: a real process on a temporary HF config.json, its output checked
// by `attnplan validate`, and a refused config exiting 1 with the HF path of the problem.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_testing.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using namespace attnplan::cli_testing;

Result run(const fs::path& scratch, const std::vector<std::string>& args) {
  return run_cli(scratch, args);
}

// gpt-oss-20b's attention fields (its quantization_config left out).
constexpr const char* kGptOss = R"({
  "architectures": ["GptOssForCausalLM"], "attention_bias": true, "head_dim": 64, "hidden_size": 2880,
  "layer_types": ["sliding_attention", "full_attention"], "max_position_embeddings": 131072,
  "model_type": "gpt_oss", "num_attention_heads": 64, "num_hidden_layers": 2, "num_key_value_heads": 8,
  "num_local_experts": 32, "rms_norm_eps": 1e-05,
  "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                   "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
  "rope_theta": 150000, "sliding_window": 128, "vocab_size": 201088
})";

}  // namespace

TEST_CASE("import-hf writes a config that validate accepts, and refuses what it cannot express",
          "[tools][import_hf]") {
  attnplan::testing::TempDir scratch;
  const fs::path hf = scratch / "config.json";
  std::ofstream(hf) << kGptOss;

  const fs::path output = scratch / "full.json";
  const Result imported =
      run(scratch.path(), {"import-hf", hf.string(), "--layer", "1", "--output", output.string()});
  INFO(imported.err);
  REQUIRE(imported.exit_code == 0);
  const Result valid = run(scratch.path(), {"validate", output.string()});
  CHECK(valid.exit_code == 0);
  CHECK(contains(valid.out, "valid"));
  const nlohmann::json full = nlohmann::json::parse(read_all(output));
  CHECK(full["schema"] == "attnplan/v1");
  CHECK(full["sliding_window"].is_null());
  CHECK(full["sinks"] == true);
  CHECK(full["rotary"]["scaling"]["type"] == "yarn");

  // Without --output the config goes to stdout; layer 0 is a sliding one.
  const Result sliding = run(scratch.path(), {"import-hf", hf.string()});
  REQUIRE(sliding.exit_code == 0);
  CHECK(nlohmann::json::parse(sliding.out)["sliding_window"] == 128);

  const Result help = run(scratch.path(), {"import-hf", "--help"});
  CHECK(help.exit_code == 0);
  CHECK(contains(help.out, "usage: attnplan import-hf"));

  const fs::path longrope = scratch / "longrope.json";
  nlohmann::json refused = nlohmann::json::parse(kGptOss);
  refused["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 2.0}};
  std::ofstream(longrope) << refused.dump();
  const Result bad = run(scratch.path(), {"import-hf", longrope.string()});
  CHECK(bad.exit_code == 1);
  CHECK(contains(bad.err, "/rope_scaling/rope_type: longrope is not expressible in attnplan/v1"));
  CHECK(bad.out.empty());

  CHECK(run(scratch.path(), {"import-hf", hf.string(), "--layer", "2"}).exit_code == 1);  // 2 layers
  CHECK(run(scratch.path(), {"import-hf", hf.string(), "--layer", "x"}).exit_code == 1);
  CHECK(run(scratch.path(), {"import-hf", (scratch / "missing.json").string()}).exit_code == 1);
}
