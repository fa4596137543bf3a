#include "plan/gemm_fp8.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.hpp"
#include "plan/gemm_common.hpp"
#include "plan/gemm_spec.hpp"
#include "plan/tensor_map.hpp"

namespace attnplan::plan {

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

void require(bool condition, const std::string& message) {
  if (!condition) throw Error(Stage::input, "gemm (fp8 activations): " + message);
}

bool aligned(const void* pointer, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

// A 2D TMA map of e4m3 codes [rows, columns] (row stride in bytes) in boxes of [128, 128].
void encode_codes_map(TensorMap& map, const void* base, int columns, int rows, long long row_stride,
                      std::string_view what) {
  encode_tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, base, columns, rows, row_stride,
                    kGemmSm90Fp8BlockK, kGemmSm90Fp8BlockN, what);
}

long long scale_ld_for(int m) {
  return (static_cast<long long>(m) + 3) / 4 * 4;
}

}  // namespace

bool fp8_activation_gemm_available(const config::Arch& arch) {
  return arch.sm() >= 89;
}

std::string_view gemm_fp8_kernel_name(GemmFp8Kernel kernel) {
  return kernel == GemmFp8Kernel::wgmma ? "wgmma" : "mma_sync";
}

GemmFp8Spec choose_fp8_gemm(const config::Arch& arch) {
  GemmFp8Spec spec;
  if (arch.sm() == 90 && arch.arch_specific) return spec;  // wgmma exists only in sm_90a
  spec.kernel = GemmFp8Kernel::mma_sync;
  spec.stages = 4;
  return spec;
}

bool uses_fp8_activations(const config::WeightEncoding& encoding) {
  return encoding.format == config::WeightFormat::fp8 && encoding.activation == config::ActivationType::fp8;
}

compiler::KernelSource Fp8QuantizeSpec::source() const {
  compiler::KernelSource source;
  source.header = "attnplan/gemm_sm90_fp8.cuh";
  if (scales == config::Fp8ActivationScales::token) {
    source.family = "fp8_quantize_tokens";
    source.traits = "attnplan::kernels::Fp8TokenQuantizeTraits";
    source.kernel = "attnplan::kernels::fp8_quantize_tokens_kernel";
    source.arguments = {{"threads", std::to_string(kFp8TokenQuantizeThreads)}};
    source.spec = {{"family", source.family},
                   {"scales", config::to_string(scales)},
                   {"threads", kFp8TokenQuantizeThreads}};
    return source;
  }
  source.family = "fp8_quantize";
  source.traits = "attnplan::kernels::Fp8QuantizeTraits";
  source.kernel = "attnplan::kernels::fp8_quantize_kernel";
  source.arguments = {{"group", std::to_string(kFp8ActivationGroup)},
                      {"warps", std::to_string(kFp8QuantizeWarps)}};
  source.spec = {{"family", source.family}, {"group", kFp8ActivationGroup}, {"warps", kFp8QuantizeWarps}};
  return source;
}

driver::LaunchShape Fp8QuantizeSpec::launch_shape(int m, int k) const {
  if (scales == config::Fp8ActivationScales::token) {  // a CTA per token
    if (m <= 0 || k <= 0) {
      throw Error(Stage::input, fmt::format("fp8 quantize: no launch shape for M = {}, K = {}", m, k));
    }
    return driver::LaunchShape{
        {static_cast<unsigned>(m), 1, 1}, {unsigned(kFp8TokenQuantizeThreads), 1, 1}, 0};
  }
  const std::int64_t items = std::int64_t(m) * ceil_div(k, kFp8ActivationGroup);
  const std::int64_t blocks = ceil_div(items, std::int64_t{kFp8QuantizeWarps} * kFp8QuantizeGroupsPerWarp);
  if (m <= 0 || k <= 0 || blocks > 0x7fffffff) {
    throw Error(Stage::input, fmt::format("fp8 quantize: no launch shape for M = {}, K = {}", m, k));
  }
  return driver::LaunchShape{{static_cast<unsigned>(blocks), 1, 1}, {32u * kFp8QuantizeWarps, 1, 1}, 0};
}

compiler::KernelSource GemmFp8Spec::source() const {
  const bool wgmma = kernel == GemmFp8Kernel::wgmma;
  compiler::KernelSource source;
  source.family = wgmma ? "gemm_sm90_fp8" : "gemm_sm89_fp8";
  source.header = wgmma ? "attnplan/gemm_sm90_fp8.cuh" : "attnplan/gemm_sm89_fp8.cuh";
  source.traits = wgmma ? "attnplan::kernels::GemmSm90Fp8Traits" : "attnplan::kernels::GemmSm89Fp8Traits";
  source.kernel =
      wgmma ? "attnplan::kernels::gemm_sm90_fp8_kernel" : "attnplan::kernels::gemm_sm89_fp8_kernel";
  source.grid_constant = wgmma;  // the tensor maps must stay in parameter memory
  source.arguments = {{"stages", std::to_string(stages)},
                      {"segments", std::to_string(segments)},
                      {"has_bias", has_bias ? "true" : "false"},
                      {"granularity", std::to_string(static_cast<int>(granularity))}};
  source.spec = {{"family", source.family},
                 {"block_m", wgmma ? kGemmSm90Fp8BlockM : kGemmSm89Fp8BlockM},
                 {"block_n", wgmma ? kGemmSm90Fp8BlockN : kGemmSm89Fp8BlockN},
                 {"block_k", wgmma ? kGemmSm90Fp8BlockK : kGemmSm89Fp8BlockK},
                 {"stages", stages},
                 {"segments", segments},
                 {"has_bias", has_bias},
                 {"scale_granularity", config::to_string(granularity)},
                 {"activation", "fp8"},
                 {"activation_scales", config::to_string(activation_scales())},
                 {"dynamic_shared_bytes", dynamic_shared_bytes()}};
  if (!wgmma) source.spec["kernel"] = gemm_fp8_kernel_name(kernel);
  if (postprocess) {
    if (!wgmma || !postprocess->fits_gemm_epilogue(kGemmSm90Fp8BlockN)) {
      throw Error(
          Stage::input,
          fmt::format("fp8 gemm: the q|k|v postprocess needs the wgmma kernel and must fit its {}-wide "
                      "tiles (head dim {}, pairing dim {}, rotary offset {})",
                      kGemmSm90Fp8BlockN, postprocess->head_dim, postprocess->pairing_dim,
                      postprocess->rotary_offset));
    }
    source.arguments.push_back({"qkv_epilogue", postprocess->epilogue_traits()});
    source.spec["qkv_epilogue"] = postprocess->epilogue_spec();
  }
  return source;
}

int GemmFp8Spec::dynamic_shared_bytes() const {
  return kernel == GemmFp8Kernel::wgmma ? gemm_sm90_fp8_dynamic_shared_bytes(stages)
                                        : gemm_sm89_fp8_dynamic_shared_bytes(stages);
}

driver::LaunchShape GemmFp8Spec::launch_shape(int m, int n, int multiprocessors) const {
  // Both kernels' tiles are [128, 128] (static_asserts below).
  static_assert(kGemmSm89Fp8BlockM == kGemmSm90Fp8BlockM && kGemmSm89Fp8BlockN == kGemmSm90Fp8BlockN);
  std::int64_t tiles = ceil_div(m, kGemmSm90Fp8BlockM) * ceil_div(n, kGemmSm90Fp8BlockN);
  if (m <= 0 || n <= 0 || tiles > 0x7fffffff) {
    throw Error(Stage::input,
                fmt::format("gemm (fp8 activations): no launch shape for M = {}, N = {}", m, n));
  }
  if (kernel == GemmFp8Kernel::wgmma)  // persistent: one CTA per SM walks the tiles
    tiles = std::min<std::int64_t>(tiles, multiprocessors > 0 ? multiprocessors : 132);
  return driver::LaunchShape{{static_cast<unsigned>(tiles), 1, 1},
                             {static_cast<unsigned>(threads()), 1, 1},
                             static_cast<unsigned>(dynamic_shared_bytes())};
}

void GemmFp8Spec::check(const GemmParams& params) const {
  // What every projection GEMM demands (gemm_common.hpp), plus this kernel's tiles and scales.
  const auto segment_rules = [&](int s, const GemmSegment& segment) {
    require(s + 1 == segments || (segment.n_end - segment.n_begin) % kGemmSm90Fp8BlockN == 0,
            fmt::format("segments[{}] is {} wide, not a multiple of {} (a tile would straddle two segments)",
                        s, segment.n_end - segment.n_begin, kGemmSm90Fp8BlockN));
    require(segment.scales != nullptr && aligned(segment.scales, 4),
            fmt::format("segments[{}].scales: null or not 4-byte aligned (f32 weight scales)", s));
  };
  if (!check_gemm_operands(params, segments, has_bias, "gemm (fp8 activations)", segment_rules)) return;
  require(params.k > 0 && params.k % 16 == 0,
          fmt::format("K = {} must be a positive multiple of 16 (16-byte rows of e4m3 codes)", params.k));
}

std::size_t fp8_activation_bytes(int m, int k) {
  const std::size_t codes = std::size_t(std::max(m, 0)) * std::size_t(std::max(k, 0));
  const std::size_t codes_aligned = (codes + 255) / 256 * 256;
  const std::size_t scales = std::size_t(ceil_div(std::max(k, 0), kFp8ActivationGroup)) *
                             std::size_t(scale_ld_for(std::max(m, 0))) * sizeof(float);
  return codes_aligned + (scales + 255) / 256 * 256;
}

Fp8ActivationBuffers fp8_activation_buffers(void* base, int m, int k) {
  const std::size_t codes = std::size_t(std::max(m, 0)) * std::size_t(std::max(k, 0));
  Fp8ActivationBuffers buffers;
  buffers.codes = static_cast<unsigned char*>(base);
  buffers.scales = reinterpret_cast<float*>(static_cast<unsigned char*>(base) + (codes + 255) / 256 * 256);
  buffers.scale_ld = scale_ld_for(m);
  return buffers;
}

GemmSm89Fp8Params make_gemm_sm89_fp8_params(const GemmParams& params,
                                            const Fp8ActivationBuffers& activations) {
  GemmSm89Fp8Params sm89{};
  sm89.gemm = params;
  sm89.a_codes = activations.codes;
  sm89.ld_codes = params.k;  // the quantizer writes rows of K codes
  sm89.a_scales = activations.scales;
  sm89.a_scale_ld = activations.scale_ld;
  return sm89;
}

GemmSm90Fp8Params make_gemm_sm90_fp8_params(const GemmFp8Spec& spec, const GemmParams& params,
                                            const Fp8ActivationBuffers& activations,
                                            const GemmQkvEpilogueParams* qkv_epilogue) {
  GemmSm90Fp8Params fp8{};
  fp8.gemm = params;
  if (spec.postprocess) fp8.qkv_epilogue = checked_qkv_epilogue(*spec.postprocess, qkv_epilogue);
  fp8.a_scales = activations.scales;
  fp8.a_scale_ld = activations.scale_ld;
  encode_codes_map(fp8.a_map, activations.codes, params.k, params.m, params.k, "fp8 gemm activation codes");
  for (int s = 0; s < spec.segments; ++s) {
    const GemmSegment& segment = params.segments[s];
    encode_codes_map(fp8.w_maps[s], segment.weight, params.k, segment.n_end - segment.n_begin, params.k,
                     fmt::format("fp8 gemm segments[{}].weight", s));
  }
  encode_gemm_c_map(fp8.c_map, params);
  return fp8;
}

void check_fp8_activation_buffers(const GemmParams& params, const Fp8ActivationBuffers& activations) {
  require(activations.codes != nullptr && aligned(activations.codes, 16),
          "activation codes: null or not 16-byte aligned");
  require(
      activations.scales != nullptr && aligned(activations.scales, 16) && activations.scale_ld >= params.m,
      "activation scales: null, not 16-byte aligned, or scale_ld < M");
  // The sm_90a GEMM steps through the scales with one 32-bit element offset (gemm_sm90_fp8.cuh,
  // Fp8FactorStream): the scales must span fewer than 2^31 floats.
  const long long groups = ceil_div(std::max(params.k, 0), kFp8ActivationGroup);
  require(
      activations.scale_ld * groups < (1ll << 31),
      fmt::format("activation scales: scale_ld {} x {} groups of 128 channels is 2^31 floats or more (the "
                  "GEMM's 32-bit scale offsets)",
                  activations.scale_ld, groups));
}

void launch_fp8_quantize(const driver::Function& quantize, const Fp8QuantizeSpec& spec,
                         const GemmParams& params, const Fp8ActivationBuffers& activations, CUstream stream) {
  require(params.m >= 0 && params.k >= 0, fmt::format("negative size (M = {}, K = {})", params.m, params.k));
  if (params.m == 0 || params.n == 0) return;
  require(params.a != nullptr && aligned(params.a, 16) && params.lda >= params.k && params.lda % 8 == 0,
          fmt::format("a: null or not 16-byte aligned, or lda = {} not >= K = {} and a multiple of 8",
                      params.lda, params.k));
  check_fp8_activation_buffers(params, activations);
  Fp8QuantizeParams quantize_params{};
  quantize_params.input = params.a;
  quantize_params.codes = activations.codes;
  quantize_params.scales = activations.scales;
  quantize_params.ld_input = params.lda;
  quantize_params.ld_codes = params.k;
  quantize_params.scale_ld = activations.scale_ld;
  quantize_params.m = params.m;
  quantize_params.k = params.k;
  driver::launch(quantize, spec.launch_shape(params.m, params.k), stream, quantize_params);
}

void launch_gemm_fp8_codes(const driver::Function& gemm, const GemmFp8Spec& spec, const GemmParams& params,
                           const Fp8ActivationBuffers& activations, CUstream stream, int multiprocessors,
                           const GemmQkvEpilogueParams* qkv_epilogue) {
  spec.check(params);
  if (params.m == 0 || params.n == 0) return;
  check_fp8_activation_buffers(params, activations);
  const driver::LaunchShape shape = spec.launch_shape(params.m, params.n, multiprocessors);
  if (spec.kernel == GemmFp8Kernel::mma_sync) {
    driver::launch(gemm, shape, stream, make_gemm_sm89_fp8_params(params, activations));
  } else {
    driver::launch(gemm, shape, stream, make_gemm_sm90_fp8_params(spec, params, activations, qkv_epilogue));
  }
}

void launch_gemm_fp8(const driver::Function& quantize, const driver::Function& gemm, const GemmFp8Spec& spec,
                     const GemmParams& params, const Fp8ActivationBuffers& activations, CUstream stream,
                     int multiprocessors) {
  spec.check(params);
  if (params.m == 0 || params.n == 0) return;
  check_fp8_activation_buffers(params, activations);
  launch_fp8_quantize(quantize, Fp8QuantizeSpec{spec.activation_scales()}, params, activations, stream);
  launch_gemm_fp8_codes(gemm, spec, params, activations, stream, multiprocessors);
}

}  // namespace attnplan::plan
