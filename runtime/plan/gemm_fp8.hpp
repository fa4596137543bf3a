// The fp8-activation projection (projection.*.activation "fp8" with fp8 weights) on sm_89 and later: the
// typed specs of its kernels (the quantizer and the sm_90a wgmma GEMM in
// templates/attnplan/gemm_sm90_fp8.cuh, the mma.sync GEMM for every other arch from sm_89 in
// gemm_sm89_fp8.cuh), the e4m3 activation buffers it needs in the workspace, and the host checks and launch
// of both. plan_kernels plans them as a quantize stage before the projection (kernel_plan.hpp);
// PrefillPlan::execute launches them.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <optional>
#include <string_view>

#include "attnplan/gemm_sm89_fp8_params.h"
#include "attnplan/gemm_sm90_fp8_params.h"
#include "compiler/kernel_source.hpp"
#include "config/attention_config.hpp"
#include "driver/launch.hpp"
#include "plan/qkv_postprocess_spec.hpp"

namespace attnplan::plan {

// Whether `arch` has an fp8-activation GEMM: sm_89 and later (fp8 tensor cores). Before sm_89 fp8
// activations are refused at planning.
bool fp8_activation_gemm_available(const config::Arch& arch);

// Which template computes the fp8-activation GEMM.
enum class GemmFp8Kernel {
  wgmma,     // gemm_sm90_fp8.cuh: TMA + wgmma m64n128k32 e4m3, warp-specialized and persistent, sm_90a only
  mma_sync,  // gemm_sm89_fp8.cuh: cp.async + mma.sync m16n8k32 e4m3, sm_89 and later
};

std::string_view gemm_fp8_kernel_name(GemmFp8Kernel kernel);  // "wgmma", "mma_sync"

// Whether a projection of `encoding` runs on fp8 activations: fp8 weights with activation "fp8".
bool uses_fp8_activations(const config::WeightEncoding& encoding);

// The quantizer: bf16 [M, K] -> e4m3 codes + one f32 scale per token (fp8_quantize_tokens_kernel, a CTA
// per token) or per (token, 128 channels) (fp8_quantize_kernel, a half-warp per group).
struct Fp8QuantizeSpec {
  config::Fp8ActivationScales scales = config::Fp8ActivationScales::token_group;

  compiler::KernelSource source() const;
  driver::LaunchShape launch_shape(int m, int k) const;  // m, k > 0
};

// The e4m3 GEMM. Tile [128, 128] of C; W segments of e4m3 codes [rows, K] with f32 scales of
// `granularity` (tensor: [], channel: [rows], block: [ceil(rows / 128), ceil(K / 128)]).
struct GemmFp8Spec {
  int segments = 1;
  bool has_bias = false;
  // wgmma: ring slots of 32 KiB (A and W [128, 128] e4m3); mma_sync: cp.async stages of 20 KiB (A and W
  // [128, 64] in 80-byte rows), 4 fit sm_89's 99 KiB.
  int stages = 6;
  config::Fp8ScaleGranularity granularity = config::Fp8ScaleGranularity::block;
  GemmFp8Kernel kernel = GemmFp8Kernel::wgmma;
  // wgmma only: the q|k|v postprocess in the epilogue (fits_gemm_epilogue of the 128-wide tile), as
  // GemmSpec::postprocess for the bf16 kernel.
  std::optional<QkvPostprocessSpec> postprocess;

  // The activation scales its promotion and epilogue expect (config::fp8_activation_scales).
  config::Fp8ActivationScales activation_scales() const { return config::fp8_activation_scales(granularity); }
  compiler::KernelSource source() const;
  int threads() const {
    return kernel == GemmFp8Kernel::wgmma ? 3 * 128 : 256;
  }  // wgmma: producer + 2 consumers
  int dynamic_shared_bytes() const;
  // wgmma: persistent, grid [min(tiles, multiprocessors)] (132 when multiprocessors is 0); mma_sync: grid
  // [tiles]. m, n > 0.
  driver::LaunchShape launch_shape(int m, int n, int multiprocessors = 0) const;

  // Throws Error(input) naming the field: what GemmSpec::check demands of sizes, strides, C, the bf16 A
  // (`a`, quantized first) and the segments, plus K a multiple of 16, every segment but the last a
  // multiple of 128 wide (no tile straddles two segments), scales non-null and 4-byte aligned.
  void check(const GemmParams& params) const;
};

// Where the quantized activations go: codes [M, K] (row stride K bytes), then scales [groups, scale_ld]
// with scale_ld = M rounded up to 4 (16-byte aligned rows of scales): groups = ceil(K / 128), or 1 with
// one scale per token (the buffers are sized for the former either way).
struct Fp8ActivationBuffers {
  unsigned char* codes = nullptr;
  float* scales = nullptr;
  long long scale_ld = 0;
};

// The fp8-activation GEMM for `arch` (fp8_activation_gemm_available): wgmma with 6 stages on sm_90a,
// mma_sync with 4 stages elsewhere. Pure; segments, bias and granularity are the caller's.
GemmFp8Spec choose_fp8_gemm(const config::Arch& arch);

// Bytes of the buffers for M tokens of K channels (a multiple of 256, so what follows stays aligned).
std::size_t fp8_activation_bytes(int m, int k);
// The buffers inside `base` (256-byte aligned, at least fp8_activation_bytes(m, k) bytes).
Fp8ActivationBuffers fp8_activation_buffers(void* base, int m, int k);

// The mma_sync kernel's Params: `params` (checked), the A codes and the activation scales.
GemmSm89Fp8Params make_gemm_sm89_fp8_params(const GemmParams& params,
                                            const Fp8ActivationBuffers& activations);

// The wgmma kernel's Params: `params` (checked), the A codes' and each segment's tensor map (e4m3 bytes,
// 128-byte swizzle, zero fill), and the activation scales.
// With spec.postprocess, `qkv_epilogue` carries its run-time values (checked_qkv_epilogue).
GemmSm90Fp8Params make_gemm_sm90_fp8_params(const GemmFp8Spec& spec, const GemmParams& params,
                                            const Fp8ActivationBuffers& activations,
                                            const GemmQkvEpilogueParams* qkv_epilogue = nullptr);

// Throws Error(input) unless `activations` can hold params.m x params.k codes: codes 16-byte aligned,
// scales 16-byte aligned with scale_ld >= M.
void check_fp8_activation_buffers(const GemmParams& params, const Fp8ActivationBuffers& activations);

// The two halves of launch_gemm_fp8, for callers that observe each kernel (PrefillPlan::execute's stages):
// the quantizer (params.a [M, K], row stride lda -> activations) and the GEMM over the codes it wrote.
// Each checks what it reads, then queues its kernel on `stream`; nothing is launched when M or N is 0.
void launch_fp8_quantize(const driver::Function& quantize, const Fp8QuantizeSpec& spec,
                         const GemmParams& params, const Fp8ActivationBuffers& activations, CUstream stream);
void launch_gemm_fp8_codes(const driver::Function& gemm, const GemmFp8Spec& spec, const GemmParams& params,
                           const Fp8ActivationBuffers& activations, CUstream stream, int multiprocessors,
                           const GemmQkvEpilogueParams* qkv_epilogue = nullptr);

// Checks, then queues the quantizer (params.a -> activations; `quantize` compiled from
// Fp8QuantizeSpec{spec.activation_scales()}) and the GEMM on `stream`. Nothing is launched when M or N is 0.
void launch_gemm_fp8(const driver::Function& quantize, const driver::Function& gemm, const GemmFp8Spec& spec,
                     const GemmParams& params, const Fp8ActivationBuffers& activations, CUstream stream,
                     int multiprocessors);

}  // namespace attnplan::plan
