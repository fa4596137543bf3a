#include <fmt/format.h>

#include <cstring>

#include "check/device_batch.hpp"
#include "check/device_weights.hpp"
#include "check/fp8_pool.hpp"
#include "commands.hpp"
#include "config/parse.hpp"
#include "core/error.hpp"
#include "driver/context.hpp"
#include "driver/cuda_api.hpp"
#include "driver/memory.hpp"
#include "driver/stream.hpp"
#include "io/layer_weights.hpp"
#include "io/safetensors.hpp"
#include "plan/runtime.hpp"
#include "runtime_setup.hpp"

namespace attnplan::cli {

namespace {

std::vector<int> int_tensor(const io::SafetensorsFile& file, const std::string& name,
                            std::vector<std::int64_t> expected_shape) {
  const io::HostTensor tensor = io::read_tensor(file, name);
  if (tensor.dtype != io::Dtype::i32 && tensor.dtype != io::Dtype::i64) {
    throw Error(Stage::input,
                fmt::format("{}: dtype {}, expected I32 or I64", name, io::to_string(tensor.dtype)));
  }
  if (!expected_shape.empty() && tensor.shape != expected_shape) {
    throw Error(Stage::input, fmt::format("{}: shape [{}], expected [{}]", name,
                                          fmt::join(tensor.shape, ", "), fmt::join(expected_shape, ", ")));
  }
  std::vector<int> values(tensor.element_count());
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (tensor.dtype == io::Dtype::i32) {
      std::memcpy(&values[i], tensor.bytes.data() + 4 * i, 4);
    } else {
      std::int64_t wide = 0;
      std::memcpy(&wide, tensor.bytes.data() + 8 * i, 8);
      values[i] = static_cast<int>(wide);
    }
  }
  return values;
}

std::vector<std::uint8_t> as_bytes(const std::vector<std::uint16_t>& bits) {
  std::vector<std::uint8_t> bytes(bits.size() * 2);
  std::memcpy(bytes.data(), bits.data(), bytes.size());
  return bytes;
}

}  // namespace

Command run_command() {
  Command command;
  command.name = "run";
  command.synopsis =
      "run CONFIG --weights W.safetensors [--layer L] --input IN.safetensors --output OUT.safetensors "
      "[--dump-stages]";
  command.description =
      "Runs one layer's prefill on the GPU. The weights are read by their HF names under --layer (e.g.\n"
      "model.layers.7.), so one layer of a real checkpoint runs as it is. IN holds hidden_states [T, "
      "hidden]\n"
      "(bf16, f16 or f32) and optionally query_starts [S + 1] and context_lens [S] (int32; default one\n"
      "sequence with no prefix), span_offsets [S + 1] and span_bounds [N, 2] (int32), and, when any\n"
      "context_len > 0, past_key [sum(context_lens), kv_heads, head_dim] and past_value [.., "
      "value_head_dim]\n"
      "with each sequence's cached tokens in order. OUT receives `output` [T, hidden] bf16 (the attention\n"
      "output after o_proj, before any residual) and, with --dump-stages, every intermediate. With an fp8\n"
      "KV cache the layer's k_scale / v_scale tensors are used (else the config's; docs/config.md).";
  command.options = {{"--weights", "W", "safetensors file with the layer's weights"},
                     {"--layer", "L", "tensor name prefix of the layer, e.g. model.layers.7. (default: none)"},
                     {"--input", "IN", "safetensors file with hidden_states (and the batch)"},
                     {"--output", "OUT", "safetensors file to write"},
                     {"--dump-stages", "", "also write normed, qkv_projection, qkv_postprocessed, attention"},
                     {"--arch", "A", "compile for A instead of the device's arch"},
                     kCacheDirOption,
                     kCachePathOption,
                     kJitOption};
  command.run = [](const Arguments& args) {
    const config::AttentionConfig config = config::load_file(args.only_positional("CONFIG"));
    auto required = [&](const char* name) {
      auto value = args.value(name);
      if (!value) throw UsageError{fmt::format("{} is required", name)};
      return *value;
    };
    const io::SafetensorsFile weights_file = io::SafetensorsFile::open(required("--weights"));
    const io::HostLayerWeights weights =
        io::load_layer_weights(weights_file, config, args.value("--layer").value_or(""));
    const io::SafetensorsFile input_file = io::SafetensorsFile::open(required("--input"));
    const std::string output_path = required("--output");

    const io::HostTensor hidden_states = io::read_tensor(input_file, "hidden_states");
    if (hidden_states.shape.size() != 2 || hidden_states.shape[1] != config.hidden_size) {
      throw Error(Stage::input, fmt::format("hidden_states: shape [{}], expected [tokens, {}]",
                                            fmt::join(hidden_states.shape, ", "), config.hidden_size));
    }
    const int tokens = static_cast<int>(hidden_states.shape[0]);
    std::vector<int> starts{0, tokens}, context{0};
    if (input_file.contains("query_starts")) starts = int_tensor(input_file, "query_starts", {});
    if (starts.size() < 2 || starts.back() != tokens) {
      // The batch's token count is query_starts' last entry: it must be the rows the input has.
      throw Error(Stage::input, fmt::format("query_starts: must have at least 2 entries and end at the {} "
                                            "rows of hidden_states",
                                            tokens));
    }
    const int seqs = static_cast<int>(starts.size()) - 1;
    if (input_file.contains("context_lens")) context = int_tensor(input_file, "context_lens", {seqs});
    if (context.size() != std::size_t(seqs)) {
      throw Error(Stage::input, fmt::format("context_lens: needed for {} sequences", seqs));
    }
    std::vector<int> span_offsets, span_bounds;
    if (input_file.contains("span_offsets")) {
      span_offsets = int_tensor(input_file, "span_offsets", {seqs + 1});
      span_bounds = int_tensor(input_file, "span_bounds", {});
    }
    if (span_bounds.size() % 2 != 0) {
      throw Error(Stage::input, fmt::format("span_bounds: {} values, expected [N, 2]", span_bounds.size()));
    }
    reference::Spans spans;
    spans.offsets = span_offsets;
    for (std::size_t i = 0; i < span_bounds.size(); i += 2)
      spans.bounds.push_back({span_bounds[i], span_bounds[i + 1]});

    // One page table over a fresh pool: each sequence gets its pages in order.
    const int block_size = config.kv_cache.block_size;
    int max_blocks = 1, cached = 0;
    for (int s = 0; s < seqs; ++s) {
      const int total = context[s] + starts[s + 1] - starts[s];
      max_blocks = std::max(max_blocks, (total + block_size - 1) / block_size);
      cached += context[s];
    }
    const int num_blocks = seqs * max_blocks;
    std::vector<int> tables(std::size_t(seqs) * max_blocks);
    for (std::size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int>(i);
    const std::size_t key_row = std::size_t(config.kv_heads) * config.head_dim;
    const std::size_t value_row = std::size_t(config.kv_heads) * config.value_head_dim;
    std::vector<std::uint16_t> key_pool(std::size_t(num_blocks) * block_size * key_row);
    std::vector<std::uint16_t> value_pool(std::size_t(num_blocks) * block_size * value_row);
    if (cached > 0) {
      const std::vector<std::uint16_t> past_key = io::to_bf16_bits(io::read_tensor(input_file, "past_key"));
      const std::vector<std::uint16_t> past_value =
          io::to_bf16_bits(io::read_tensor(input_file, "past_value"));
      if (past_key.size() != std::size_t(cached) * key_row ||
          past_value.size() != std::size_t(cached) * value_row) {
        throw Error(Stage::input, fmt::format("past_key, past_value: expected [{}, {}, {}] and [{}, {}, {}]",
                                              cached, config.kv_heads, config.head_dim, cached,
                                              config.kv_heads, config.value_head_dim));
      }
      std::size_t row = 0;
      for (int s = 0; s < seqs; ++s) {
        for (int p = 0; p < context[s]; ++p, ++row) {
          const std::size_t slot =
              std::size_t(tables[std::size_t(s) * max_blocks + p / block_size]) * block_size + p % block_size;
          std::copy_n(past_key.begin() + row * key_row, key_row, key_pool.begin() + slot * key_row);
          std::copy_n(past_value.begin() + row * value_row, value_row, value_pool.begin() + slot * value_row);
        }
      }
    }

    Runtime runtime(runtime_options(args));
    driver::Context context_handle(runtime.options().device);
    context_handle.make_current();
    const plan::PrefillPlan plan = runtime.load(runtime.compile(config));
    const check::DeviceWeights device_weights = check::upload_weights(config, weights);
    driver::DeviceBuffer input = driver::DeviceBuffer::from_host(io::to_bf16_bits(hidden_states));
    driver::DeviceBuffer output(std::size_t(tokens) * config.hidden_size * 2);
    // An fp8 cache holds the prefix as the fp8 store would have written it, with the scales the loader
    // resolved: the checkpoint's k_scale / v_scale tensors, else the config's (docs/config.md).
    const bool fp8 = config.kv_cache.dtype == config::KvCacheDtype::fp8_e4m3;
    const float k_scale = fp8 ? weights.kv_scales.value().k_scale : 1.0f;
    const float v_scale = fp8 ? weights.kv_scales.value().v_scale : 1.0f;
    driver::DeviceBuffer keys =
        fp8 ? driver::DeviceBuffer::from_host(check::quantize_kv_pool_fp8(key_pool, k_scale))
            : driver::DeviceBuffer::from_host(key_pool);
    driver::DeviceBuffer values =
        fp8 ? driver::DeviceBuffer::from_host(check::quantize_kv_pool_fp8(value_pool, v_scale))
            : driver::DeviceBuffer::from_host(value_pool);
    const check::DeviceBatch device_batch(reference::Batch{starts, context, tables, max_blocks}, spans,
                                          config.bidirectional_spans);
    driver::DeviceBuffer workspace(std::max<std::size_t>(plan.workspace_bytes(tokens), 256));

    plan::ExecuteArgs execute;
    execute.input = input.data<const void>();
    execute.output = output.data<void>();
    execute.weights = device_weights.view;
    execute.cache = {keys.data<void>(), values.data<void>(), num_blocks, k_scale, v_scale};
    execute.batch = device_batch.description();
    execute.workspace = workspace.data<void>();
    execute.workspace_bytes = workspace.size_bytes();

    io::SafetensorsWriter writer;
    const bool dump = args.flag("--dump-stages");
    driver::Stream stream = driver::Stream::create();
    driver::check(driver::api().cuCtxSynchronize(), "cuCtxSynchronize");
    const long long row = plan::qkv_row_width(config);
    plan.execute(execute, stream.handle(), [&](plan::StageKind stage, const plan::WorkspaceLayout& layout) {
      if (!dump) return;
      auto save = [&](const std::string& name, std::size_t offset, std::int64_t width) {
        std::vector<std::uint16_t> bits(std::size_t(tokens) * width);
        stream.synchronize();
        workspace.download(bits.data(), bits.size() * 2, offset);
        writer.add(name, io::Dtype::bf16, {tokens, width}, as_bytes(bits));
      };
      switch (stage) {
        case plan::StageKind::input_norm:
          save("normed", layout.normed, config.hidden_size);
          break;
        case plan::StageKind::qkv_projection:
          save("qkv_projection", layout.qkv, row);
          break;
        case plan::StageKind::qkv_postprocess:
          save("qkv_postprocessed", layout.qkv, row);
          break;
        case plan::StageKind::attention:
          save("attention", layout.attention, std::int64_t(config.query_heads) * config.value_head_dim);
          break;
        default:
          break;
      }
    });
    stream.synchronize();
    writer.add("output", io::Dtype::bf16, {tokens, config.hidden_size},
               as_bytes(output.download_all<std::uint16_t>()));
    writer.write(output_path);
    if (fp8) {
      fmt::print("fp8 KV cache scales: k_scale {} ({}), v_scale {} ({})\n", k_scale,
                 weights.kv_scales->k_source, v_scale, weights.kv_scales->v_source);
    }
    fmt::print("{}: {} tokens in {} sequences -> {}\n", config.name.empty() ? "layer" : config.name, tokens,
               seqs, output_path);
    return kExitOk;
  };
  return command;
}

}  // namespace attnplan::cli
