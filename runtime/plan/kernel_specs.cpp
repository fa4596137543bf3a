#include "plan/kernel_specs.hpp"

#include <string>

#include "config/attention_config.hpp"

namespace attnplan::plan {

namespace {
std::string cxx_bool(bool value) {
  return value ? "true" : "false";
}
}  // namespace

compiler::KernelSource RmsNormSpec::source() const {
  compiler::KernelSource source;
  source.family = "rmsnorm";
  source.header = "attnplan/rmsnorm.cuh";
  source.traits = "attnplan::kernels::RmsNormTraits";
  source.kernel = "attnplan::kernels::rmsnorm_kernel";
  source.arguments = {
      {"hidden_size", std::to_string(hidden_size)},
      {"threads", std::to_string(tiling.threads)},
      {"unit_offset", cxx_bool(unit_offset)},
  };
  source.spec = {{"family", source.family},    {"hidden_size", hidden_size},
                 {"unit_offset", unit_offset}, {"threads", tiling.threads},
                 {"vector", tiling.vector},    {"vectors_per_thread", tiling.vectors_per_thread}};
  // Only when on, so the stubs and cache keys of the plain norms stay what they were (and, with codes,
  // of the per-128-channel scales, which came first: no fp8_token_scales argument or fp8_scales field).
  const bool token_scales = fp8_codes == config::Fp8ActivationScales::token;
  if (fp8_codes || rotary_pairs > 0) {
    source.arguments.push_back({"fp8_codes", cxx_bool(fp8_codes.has_value())});
    source.spec["fp8_codes"] = fp8_codes.has_value();
  }
  if (rotary_pairs > 0 || token_scales) {
    source.arguments.push_back({"rotary_pairs", std::to_string(rotary_pairs)});
    if (rotary_pairs > 0) source.spec["rotary_pairs"] = rotary_pairs;
  }
  if (token_scales) {
    source.arguments.push_back({"fp8_token_scales", "true"});
    source.spec["fp8_scales"] = config::to_string(*fp8_codes);
  }
  return source;
}

compiler::KernelSource KvStoreSpec::source() const {
  compiler::KernelSource source;
  source.family = "kv_store";
  source.header = "attnplan/kv_store.cuh";
  source.traits = "attnplan::kernels::KvStoreTraits";
  source.kernel = "attnplan::kernels::kv_store_kernel";
  source.arguments = {
      {"kv_heads", std::to_string(kv_heads)},
      {"head_dim", std::to_string(head_dim)},
      {"value_head_dim", std::to_string(value_head_dim)},
      {"block_size", std::to_string(block_size)},
      {"threads", std::to_string(tiling.threads)},
      {"tokens_per_block", std::to_string(tiling.tokens_per_block)},
      {"fp8_cache", cxx_bool(fp8_cache)},
  };
  source.spec = {{"family", source.family},
                 {"kv_heads", kv_heads},
                 {"head_dim", head_dim},
                 {"value_head_dim", value_head_dim},
                 {"block_size", block_size},
                 {"threads", tiling.threads},
                 {"tokens_per_block", tiling.tokens_per_block},
                 {"fp8_cache", fp8_cache}};
  return source;
}

}  // namespace attnplan::plan
