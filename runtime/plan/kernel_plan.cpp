#include "plan/kernel_plan.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.hpp"

namespace attnplan::plan {

std::string_view to_string(StageKind stage) {
  switch (stage) {
    case StageKind::input_norm:
      return "input_norm";
    case StageKind::qkv_projection:
      return "qkv_projection";
    case StageKind::qkv_postprocess:
      return "qkv_postprocess";
    case StageKind::kv_store:
      return "kv_store";
    case StageKind::attention:
      return "attention";
    case StageKind::output_quantize:
      return "output_quantize";
    case StageKind::output_projection:
      return "output_projection";
  }
  return "unknown";
}

std::string_view ProjectionKernelNames::of(ProjectionVariant variant) const {
  switch (variant) {
    case ProjectionVariant::small:
      return small;
    case ProjectionVariant::tiny:
      return tiny;
    case ProjectionVariant::dequantize:
      return dequantize;
    case ProjectionVariant::dequantized:
      return dequantized;
    case ProjectionVariant::dequantized_small:
      return dequantized_small;
    case ProjectionVariant::planned:
      break;
  }
  return planned;
}

const ProjectionKernelNames& projection_kernel_names(StageKind stage) {
  if (stage == StageKind::qkv_projection) return kQkvProjectionNames;
  if (stage == StageKind::output_projection) return kOutputProjectionNames;
  throw Error(Stage::internal, fmt::format("{} is not a projection stage", to_string(stage)));
}

ProjectionVariant projection_variant_of(const PlannedKernel& kernel) {
  for (const ProjectionKernelNames* names : {&kQkvProjectionNames, &kOutputProjectionNames}) {
    for (ProjectionVariant variant :
         {ProjectionVariant::small, ProjectionVariant::tiny, ProjectionVariant::dequantize,
          ProjectionVariant::dequantized, ProjectionVariant::dequantized_small}) {
      if (kernel.name == names->of(variant)) return variant;
    }
  }
  return ProjectionVariant::planned;
}

std::vector<std::string_view> projection_variant_kernels(StageKind stage, ProjectionVariant variant) {
  const ProjectionKernelNames& names = projection_kernel_names(stage);
  // The dequantized path's GEMMs run after its dequantize kernel.
  if (variant == ProjectionVariant::dequantized || variant == ProjectionVariant::dequantized_small)
    return {names.dequantize, names.of(variant)};
  return {names.of(variant)};
}

bool runs_dequantized(const std::optional<KernelPlan::Dequantized>& path, int num_tokens) {
  return path.has_value() && num_tokens >= path->min_tokens;
}

AttentionVariant attention_variant_named(std::string_view name) {
  const auto found = std::find(kAttentionKernelNames.begin(), kAttentionKernelNames.end(), name);
  if (found == kAttentionKernelNames.end())
    throw Error(Stage::internal,
                fmt::format("attention_variant_named: '{}' names no attention kernel", name));
  return static_cast<AttentionVariant>(found - kAttentionKernelNames.begin());
}

const AttentionSpec& attention_variant_spec(const KernelPlan& kernels, AttentionVariant variant) {
  if (variant == AttentionVariant::planned) return kernels.attention;
  const std::optional<AttentionSpec>& specialization =
      variant == AttentionVariant::short_launch ? kernels.attention_short : kernels.attention_split;
  if (!specialization) {
    throw Error(Stage::internal, fmt::format("attention_variant_spec: the plan has no {} kernel",
                                             attention_kernel_name(variant)));
  }
  return *specialization;
}

AttentionLaunch launched_attention(const KernelPlan& kernels, std::span<const int> query_starts,
                                   std::span<const int> context_lens, std::span<const int> span_offsets,
                                   std::span<const int> span_bounds, int query_heads, int multiprocessors,
                                   int partial_units) {
  AttentionLaunch launch;
  if (kernels.attention.kernel != AttentionKernel::wgmma_sm90) return launch;
  launch.order = longest_first_sequences(query_starts, context_lens, span_offsets, span_bounds);
  // A short launch on D 64's two consumer warpgroups; otherwise the last round's items split over their
  // keys where it would leave most CTAs idle.
  if (kernels.attention_short &&
      takes_short_launch(kernels.attention, query_starts, query_heads, multiprocessors)) {
    launch.variant = AttentionVariant::short_launch;
    return launch;
  }
  if (kernels.attention_split) {
    launch.split = choose_tail_split(*kernels.attention_split, query_starts, context_lens,
                                     !launch.order.empty(), query_heads, multiprocessors, partial_units);
    if (launch.split.items > 0) launch.variant = AttentionVariant::split;
  }
  return launch;
}

ProjectionVariant launched_projection_variant(const KernelPlan& kernels, StageKind stage, int num_tokens,
                                              int n, int multiprocessors) {
  const bool qkv = stage == StageKind::qkv_projection;
  if (!qkv && stage != StageKind::output_projection) {
    throw Error(Stage::internal,
                fmt::format("launched_projection_variant: {} is not a projection stage", to_string(stage)));
  }
  const std::optional<KernelPlan::Dequantized>& dequantized =
      qkv ? kernels.qkv_projection_dequantized : kernels.output_projection_dequantized;
  if (runs_dequantized(dequantized, num_tokens)) {
    const bool small =
        dequantized->gemm_small && choose_gemm_variant(num_tokens, n, dequantized->gemm.sm90,
                                                       dequantized->gemm_small->sm90, multiprocessors)
                                       .small;
    return small ? ProjectionVariant::dequantized_small : ProjectionVariant::dequantized;
  }
  if (qkv ? kernels.qkv_projection_fp8.has_value() : kernels.output_projection_fp8.has_value())
    return ProjectionVariant::planned;
  const GemmSpec& planned = qkv ? kernels.qkv_projection : kernels.output_projection;
  const std::optional<GemmSpec>& small = qkv ? kernels.qkv_projection_small : kernels.output_projection_small;
  const std::optional<GemmSpec>& tiny = qkv ? kernels.qkv_projection_tiny : kernels.output_projection_tiny;
  // The cheapest by gemm_sm90_cost, ties to the earlier (wider) tiling; choose_gemm_variant(...).small
  // says its second tiling costs less than its first.
  ProjectionVariant variant = ProjectionVariant::planned;
  const GemmSm90Tiling* chosen = &planned.sm90;
  if (small && choose_gemm_variant(num_tokens, n, planned.sm90, small->sm90, multiprocessors).small) {
    variant = ProjectionVariant::small;
    chosen = &small->sm90;
  }
  if (tiny && choose_gemm_variant(num_tokens, n, *chosen, tiny->sm90, multiprocessors).small)
    variant = ProjectionVariant::tiny;
  return variant;
}

const GemmSpec* launched_qkv_gemm(const KernelPlan& kernels, int num_tokens, int n, int multiprocessors) {
  const StageKind stage = StageKind::qkv_projection;
  switch (launched_projection_variant(kernels, stage, num_tokens, n, multiprocessors)) {
    case ProjectionVariant::dequantized:
      return &kernels.qkv_projection_dequantized->gemm;
    case ProjectionVariant::dequantized_small:
      return &*kernels.qkv_projection_dequantized->gemm_small;
    case ProjectionVariant::small:
      return &*kernels.qkv_projection_small;
    case ProjectionVariant::tiny:
      return &*kernels.qkv_projection_tiny;
    default:
      return kernels.qkv_projection_fp8 ? nullptr : &kernels.qkv_projection;
  }
}

bool qkv_postprocess_fused(const KernelPlan& kernels, int num_tokens, int n, int multiprocessors) {
  // fp8 activations: every launch runs the one fp8 GEMM.
  if (kernels.qkv_projection_fp8) return kernels.qkv_projection_fp8->postprocess.has_value();
  const GemmSpec* gemm = launched_qkv_gemm(kernels, num_tokens, n, multiprocessors);
  return gemm != nullptr && gemm->postprocess.has_value();
}

bool KernelPlan::has(StageKind stage) const {
  for (const PlannedKernel& kernel : kernels) {
    if (kernel.stage == stage) return true;
  }
  return false;
}

long long qkv_row_width(const config::AttentionConfig& config) {
  return static_cast<long long>(config.query_heads) * config.head_dim +
         static_cast<long long>(config.kv_heads) * (config.head_dim + config.value_head_dim);
}

namespace {

// Why fp8 activations cannot run on `arch` (empty: they can): the GEMMs need fp8 tensor cores.
std::string fp8_activation_gap(const config::Arch& arch) {
  if (fp8_activation_gemm_available(arch)) return {};
  return fmt::format("{} has no fp8 tensor cores (sm_89 or newer)", arch.name());
}

void require_supported(const config::AttentionConfig& config, const config::Arch& arch) {
  std::vector<std::string> problems;
  // The GEMM's weight loader policies (gemm_spec.hpp): bf16, fp8 weight-only, mxfp8, mxfp4, nvfp4,
  // packed_integer (GPTQ / AWQ), affine (MLX); fp8 activations: an e4m3 GEMM from sm_89 (gemm_fp8.hpp).
  // "not supported by the kernels yet" marks what a later kernel may lift (the GPU plan sweep skips it).
  const std::string supported =
      "(bf16, fp8 with bf16 activations, mxfp8, mxfp4, nvfp4, packed_integer with a group_size that is -1 or "
      "a multiple of 8, and affine are)";
  const auto check_projection = [&](const config::WeightEncoding& encoding, const std::string& field, int k,
                                    std::vector<int> leading_widths) {
    if (!uses_fp8_activations(encoding)) {
      if (!gemm_supports(encoding)) {
        problems.push_back(fmt::format("{}/format: {} weights are not supported by the kernels yet {}", field,
                                       config::to_string(encoding.format), supported));
      }
      return;
    }
    if (const std::string gap = fp8_activation_gap(arch); !gap.empty()) {
      problems.push_back(fmt::format(
          "{}/activation: fp8 activations are not supported by the kernels yet on {}: {} (activation "
          "\"bf16\" runs the same fp8 weights on bf16 activations)",
          field, arch.name(), gap));
      return;
    }
    // The e4m3 GEMM's tiles are 128 columns wide and never straddle two weight segments; its codes are
    // read in 16-byte rows (gemm_fp8.hpp, GemmFp8Spec::check).
    for (int width : leading_widths) {
      if (width % kGemmSm90Fp8BlockN != 0) {
        problems.push_back(fmt::format(
            "{}/activation: fp8 activations are not supported by the kernels yet for a {}-wide q or k "
            "segment on {}: every weight segment but the last must be a multiple of {} columns",
            field, width, arch.name(), kGemmSm90Fp8BlockN));
      }
    }
    if (k % 16 != 0) {
      problems.push_back(fmt::format(
          "{}/activation: fp8 activations are not supported by the kernels yet for K = {} on {}: the "
          "projection's input width must be a multiple of 16",
          field, k, arch.name()));
    }
  };
  const int q_width = config.query_heads * config.head_dim;
  const int k_width = config.kv_heads * config.head_dim;
  check_projection(config.projection.qkv, "/projection", config.hidden_size,
                   config.projection.fused_qkv ? std::vector<int>{} : std::vector<int>{q_width, k_width});
  if (config.projection.fused_qkv && config.projection.qkv.format != config::WeightFormat::bf16) {
    problems.push_back(fmt::format("/projection/fused_qkv: a fused qkv_proj is bf16 only, not {}",
                                   config::to_string(config.projection.qkv.format)));
  }
  check_projection(config.projection.output, "/projection/output", config.query_heads * config.value_head_dim,
                   {});
  if (!problems.empty()) {
    throw Error(Stage::config,
                fmt::format("{} cannot be planned yet", config.name.empty() ? "this config" : config.name),
                {}, problems);
  }
}

// bf16: the wgmma kernel where it fits. Quantized: the decoding kernel (wgmma_decode) for the formats the
// plan gives it (sm90_decode_gemm_planned), tiled for kDecodeTiledTokens (launches below
// decode_dequantized_min_tokens take it, longer ones the dequantized path); else the mixed-input wgmma_w4
// kernel for the formats it reads (switched off by sm90_w4_gemm_enabled); else the mma.sync kernel and its
// loaders.
GemmKernelChoice choose_projection_kernel(const config::WeightEncoding& weights, const config::Arch& arch,
                                          int m_hint, int n, int k, std::span<const int> segment_widths) {
  if (weights.format == config::WeightFormat::bf16)
    return choose_gemm_kernel(arch, m_hint, n, k, segment_widths);
  if (sm90_decode_gemm_planned(weights)) {
    const GemmKernelChoice decode =
        choose_decode_gemm_kernel(weights, arch, std::min(m_hint, kDecodeTiledTokens), n, k, segment_widths);
    if (decode.kernel == GemmKernel::wgmma_decode) return decode;
  }
  return choose_w4_gemm_kernel(weights, arch, m_hint, n, k, segment_widths);
}

// The projection's specialization for launches of `tokens` rows, when its kernel would tile those
// differently from the planned one and from `other` (an earlier specialization), or nullopt; none for a
// plan that launches no more than `tokens` rows (the planned tiling is already for them).
std::optional<GemmSpec> specialization(const GemmSpec& planned, const std::optional<GemmSpec>& other,
                                       int tokens, const config::AttentionConfig& config,
                                       const config::Arch& arch, int n, int k,
                                       std::span<const int> segment_widths) {
  if (config.max_tokens <= tokens) return std::nullopt;
  const GemmKernelChoice choice =
      choose_projection_kernel(planned.weights, arch, tokens, n, k, segment_widths);
  if (choice.kernel != planned.kernel || choice.sm90 == planned.sm90) return std::nullopt;
  if (other && choice.sm90 == other->sm90) return std::nullopt;
  GemmSpec spec = planned;
  spec.sm90 = choice.sm90;
  return spec;
}

// The projection's specializations for short launches (issue #6): the bf16 wgmma kernel's for
// kSmallLaunchTokens rows; the decoding kernel's for kDecodeSmallLaunchTokens and kDecodeTinyLaunchTokens.
struct ShortLaunchSpecs {
  std::optional<GemmSpec> small, tiny;
};
ShortLaunchSpecs short_launch_specializations(const GemmSpec& planned, const config::AttentionConfig& config,
                                              const config::Arch& arch, int n, int k,
                                              std::span<const int> segment_widths) {
  ShortLaunchSpecs specs;
  if (planned.kernel == GemmKernel::wgmma) {
    specs.small =
        specialization(planned, std::nullopt, kSmallLaunchTokens, config, arch, n, k, segment_widths);
  } else if (planned.kernel == GemmKernel::wgmma_decode) {
    specs.small =
        specialization(planned, std::nullopt, kDecodeSmallLaunchTokens, config, arch, n, k, segment_widths);
    specs.tiny =
        specialization(planned, specs.small, kDecodeTinyLaunchTokens, config, arch, n, k, segment_widths);
  }
  return specs;
}

// The projection's dequantized path (choose_dequantized_gemm: never with fp8 activations, which have no
// mma.sync loader to decode with and run their own e4m3 GEMM).
std::optional<KernelPlan::Dequantized> dequantized_path(const GemmSpec& planned,
                                                        const config::AttentionConfig& config,
                                                        const config::Arch& arch, int n, int k,
                                                        std::span<const int> segment_widths) {
  std::optional<GemmSpec> gemm =
      choose_dequantized_gemm(planned, arch, config.max_tokens, n, k, segment_widths);
  if (!gemm) return std::nullopt;
  KernelPlan::Dequantized path{choose_dequantize(planned.segments, planned.weights, k, segment_widths), *gemm,
                               std::nullopt, dequantized_min_tokens(planned, arch, n)};
  // The bf16 plan's short-launch tiling, which launches take where choose_gemm_variant prefers it, as the
  // bf16 plan's do: act-order GPTQ, 3-bit and 8-bit GPTQ from one token (at 1 token Llama-3.1-8B's q|k|v
  // ran 24 CTAs of 128 x 256, session 23), the other formats from their switch point (o at 513-1023
  // tokens: 80-128 tiles of 128 x 256 on 132 SMs, or 160-256 of 128 x 128).
  path.gemm_small =
      specialization(*gemm, std::nullopt, kSmallLaunchTokens, config, arch, n, k, segment_widths);
  return path;
}

// The QKV postprocess in the epilogue of every bf16 or fp8 wgmma q|k|v GEMM whose tiles it fits (issue #6:
// at 8k tokens of Llama-3.1-8B the postprocess pass took 0.057 of the layer's 2.1 ms; docs/kernels-notes.md,
// "Session 25"), with the rotation table from the input norm where it applies RoPE. The other kernels
// (mma.sync, the sm_89 fp8 GEMM, the 4-bit kernels) and tiles that split heads (160 and 192 wide at D 128)
// keep the postprocess kernel.
void fuse_qkv_postprocess(KernelPlan& plan) {
  const QkvPostprocessSpec& post = plan.qkv_postprocess;
  if (!post.has_work()) return;
  if (plan.qkv_projection_fp8) {
    GemmFp8Spec& fp8 = *plan.qkv_projection_fp8;
    if (fp8.kernel != GemmFp8Kernel::wgmma || !post.fits_gemm_epilogue(kGemmSm90Fp8BlockN)) return;
    fp8.postprocess = post;
    if (post.rotary_dim > 0) plan.input_norm.rotary_pairs = post.rotary_dim / 2;
    return;
  }
  bool fused = false;
  const auto fuse = [&](GemmSpec& spec) {
    if (spec.kernel != GemmKernel::wgmma || !post.fits_gemm_epilogue(spec.sm90.block_n)) return;
    spec.postprocess = post;
    fused = true;
  };
  fuse(plan.qkv_projection);
  if (plan.qkv_projection_small) fuse(*plan.qkv_projection_small);
  if (plan.qkv_projection_tiny) fuse(*plan.qkv_projection_tiny);
  if (plan.qkv_projection_dequantized) {
    fuse(plan.qkv_projection_dequantized->gemm);
    if (plan.qkv_projection_dequantized->gemm_small) fuse(*plan.qkv_projection_dequantized->gemm_small);
  }
  if (fused && post.rotary_dim > 0) plan.input_norm.rotary_pairs = post.rotary_dim / 2;
}

// Whether some launch runs a projection's planned GEMM (or its short-launch specializations): those run
// below the dequantized path's min_tokens, so never where the path takes launches from one token on.
bool planned_gemm_runs(const std::optional<KernelPlan::Dequantized>& dequantized) {
  return !runs_dequantized(dequantized, 1);
}

// Whether a launch may run a q|k|v GEMM without the postprocess in its epilogue while the postprocess has
// work: then the plan needs the postprocess kernel.
bool needs_qkv_postprocess_kernel(const KernelPlan& plan) {
  if (!plan.qkv_postprocess.has_work()) return false;
  const auto unfused = [](const std::optional<GemmSpec>& spec) { return spec && !spec->postprocess; };
  const std::optional<KernelPlan::Dequantized>& dequantized = plan.qkv_projection_dequantized;
  if (planned_gemm_runs(dequantized)) {
    if (plan.qkv_projection_fp8) return !plan.qkv_projection_fp8->postprocess;
    if (!plan.qkv_projection.postprocess) return true;
    if (unfused(plan.qkv_projection_small) || unfused(plan.qkv_projection_tiny)) return true;
  }
  return dequantized && (!dequantized->gemm.postprocess || unfused(dequantized->gemm_small));
}

}  // namespace

KernelPlan plan_kernels(const config::AttentionConfig& config, const config::Arch& arch,
                        const PlanOptions& options) {
  require_supported(config, arch);
  KernelPlan plan;
  const int hidden = config.hidden_size;
  const int attention_width = config.query_heads * config.value_head_dim;

  plan.input_norm.hidden_size = hidden;
  plan.input_norm.unit_offset = config.input_norm.weight_offset != 0.0;
  plan.input_norm.tiling = choose_rmsnorm_tiling(hidden);

  plan.qkv_projection.segments = config.projection.fused_qkv ? 1 : 3;
  plan.qkv_projection.has_bias = config.qkv_bias;
  plan.qkv_projection.weights = config.projection.qkv;
  plan.qkv_projection.tiling =
      choose_gemm_tiling(config.max_tokens, static_cast<int>(qkv_row_width(config)), hidden, arch);
  {
    const int q_width = config.query_heads * config.head_dim;
    const int k_width = config.kv_heads * config.head_dim;
    const int v_width = config.kv_heads * config.value_head_dim;
    const std::vector<int> widths = config.projection.fused_qkv
                                        ? std::vector<int>{q_width + k_width + v_width}
                                        : std::vector<int>{q_width, k_width, v_width};
    const GemmKernelChoice choice = choose_projection_kernel(config.projection.qkv, arch, config.max_tokens,
                                                             q_width + k_width + v_width, hidden, widths);
    plan.qkv_projection.kernel = choice.kernel;
    plan.qkv_projection.sm90 = choice.sm90;
    ShortLaunchSpecs qkv_short = short_launch_specializations(plan.qkv_projection, config, arch,
                                                              q_width + k_width + v_width, hidden, widths);
    plan.qkv_projection_small = std::move(qkv_short.small);
    plan.qkv_projection_tiny = std::move(qkv_short.tiny);
    plan.qkv_projection_dequantized =
        dequantized_path(plan.qkv_projection, config, arch, q_width + k_width + v_width, hidden, widths);
  }

  plan.qkv_postprocess = QkvPostprocessSpec::from_config(config);

  plan.kv_store.kv_heads = config.kv_heads;
  plan.kv_store.head_dim = config.head_dim;
  plan.kv_store.value_head_dim = config.value_head_dim;
  plan.kv_store.block_size = config.kv_cache.block_size;
  plan.kv_store.fp8_cache = config.kv_cache.dtype == config::KvCacheDtype::fp8_e4m3;
  plan.kv_store.tiling = choose_kv_store_tiling(config.kv_heads, config.head_dim, config.value_head_dim);

  plan.attention = AttentionSpec::from_config(config, arch);
  if (options.trace_attention) {
    if (plan.attention.kernel != AttentionKernel::wgmma_sm90) {
      throw Error(
          Stage::config,
          fmt::format("trace_attention: only the sm_90a attention kernel records a trace; this plan's "
                      "attention runs {} (arch {})",
                      to_string(plan.attention.kernel), arch.name()));
    }
    plan.attention.traces = true;
  }
  plan.attention_split = split_tail_specialization(plan.attention);  // traced with it
  plan.attention_short = short_launch_specialization(plan.attention);

  plan.output_projection.segments = 1;
  plan.output_projection.has_bias = config.output_bias;
  plan.output_projection.weights = config.projection.output;
  plan.output_projection.tiling = choose_gemm_tiling(config.max_tokens, hidden, attention_width, arch);
  const int output_widths[] = {hidden};
  const GemmKernelChoice output_choice = choose_projection_kernel(
      config.projection.output, arch, config.max_tokens, hidden, attention_width, output_widths);
  plan.output_projection.kernel = output_choice.kernel;
  plan.output_projection.sm90 = output_choice.sm90;
  ShortLaunchSpecs output_short = short_launch_specializations(plan.output_projection, config, arch, hidden,
                                                               attention_width, output_widths);
  plan.output_projection_small = std::move(output_short.small);
  plan.output_projection_tiny = std::move(output_short.tiny);
  plan.output_projection_dequantized =
      dequantized_path(plan.output_projection, config, arch, hidden, attention_width, output_widths);

  // fp8 activations (require_supported checked the arch and the shapes): an e4m3 GEMM replaces the one
  // above, fed by the quantizer.
  const auto fp8_spec = [&arch](const GemmSpec& spec) {
    GemmFp8Spec fp8 = choose_fp8_gemm(arch);  // wgmma on sm_90a, mma_sync from sm_89
    fp8.segments = spec.segments;
    fp8.has_bias = spec.has_bias;
    fp8.granularity = spec.weights.scale_granularity;
    return fp8;
  };
  if (uses_fp8_activations(config.projection.qkv)) plan.qkv_projection_fp8 = fp8_spec(plan.qkv_projection);
  if (uses_fp8_activations(config.projection.output)) {
    plan.output_projection_fp8 = fp8_spec(plan.output_projection);
    plan.activation_quantize.scales = plan.output_projection_fp8->activation_scales();
  }
  // The q|k|v projection's input is the input norm's output: the norm writes the codes itself, so no
  // quantizer reads its rows again (nor, unobserved, are they written in bf16). require_supported's
  // K % 16 rule gives the norm the 8-channel vectors the codes need (RmsNormTraits' static_assert).
  if (plan.qkv_projection_fp8) plan.input_norm.fp8_codes = plan.qkv_projection_fp8->activation_scales();
  fuse_qkv_postprocess(plan);
  // An fp8-activation projection has no small-launch specialization: its GemmSpec is never the bf16 wgmma
  // or the decoding kernel (choose_projection_kernel keeps fp8 weights off both), so
  // short_launch_specializations gave none.
  // A kernel of a spec that knows its dynamic shared memory.
  const auto add = [&](StageKind stage, std::string_view name, const auto& spec) {
    plan.kernels.push_back({stage, std::string(name), spec.source(), spec.dynamic_shared_bytes()});
  };
  // quantize_stage: the quantizer's stage before an fp8-activation GEMM (none: its input comes as codes).
  const auto add_projection = [&](std::optional<StageKind> quantize_stage, StageKind stage,
                                  const GemmSpec& spec, const std::optional<GemmFp8Spec>& fp8,
                                  const std::optional<GemmSpec>& small, const std::optional<GemmSpec>& tiny,
                                  const std::optional<KernelPlan::Dequantized>& dequantized) {
    const ProjectionKernelNames& names = projection_kernel_names(stage);
    if (!fp8) {
      // The planned GEMM and its short-launch specializations. Not where the dequantized path takes every
      // launch (planned_gemm_runs; act-order GPTQ, the formats without a decoding-kernel member): those never
      // run (for act-order GPTQ on Llama-3.1-8B two mma.sync GEMMs, ~2 s of a cold compile). Their specs
      // stay: a launch checks its weights against the planned spec first.
      if (planned_gemm_runs(dequantized)) {
        add(stage, names.planned, spec);
        if (small) add(stage, names.small, *small);
        if (tiny) add(stage, names.tiny, *tiny);
      }
      if (dequantized) {
        add(stage, names.dequantize, dequantized->dequantize);
        add(stage, names.dequantized, dequantized->gemm);
        if (dequantized->gemm_small) add(stage, names.dequantized_small, *dequantized->gemm_small);
      }
      return;
    }
    if (quantize_stage) {
      plan.kernels.push_back(
          {*quantize_stage, std::string(to_string(*quantize_stage)), plan.activation_quantize.source(), 0});
    }
    add(stage, names.planned, *fp8);
  };

  plan.kernels.push_back({StageKind::input_norm, "input_rmsnorm", plan.input_norm.source(), 0});
  add_projection(std::nullopt, StageKind::qkv_projection, plan.qkv_projection, plan.qkv_projection_fp8,
                 plan.qkv_projection_small, plan.qkv_projection_tiny, plan.qkv_projection_dequantized);
  if (needs_qkv_postprocess_kernel(plan)) {
    plan.kernels.push_back({StageKind::qkv_postprocess, "qkv_postprocess", plan.qkv_postprocess.source(), 0});
  }
  plan.kernels.push_back({StageKind::kv_store, "kv_store", plan.kv_store.source(), 0});
  add(StageKind::attention, kAttentionKernel, plan.attention);
  if (plan.attention_split) add(StageKind::attention, kAttentionSplitKernel, *plan.attention_split);
  if (plan.attention_short) add(StageKind::attention, kAttentionShortKernel, *plan.attention_short);
  add_projection(StageKind::output_quantize, StageKind::output_projection, plan.output_projection,
                 plan.output_projection_fp8, plan.output_projection_small, plan.output_projection_tiny,
                 plan.output_projection_dequantized);
  return plan;
}

}  // namespace attnplan::plan
