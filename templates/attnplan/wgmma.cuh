// Hopper (sm_90a) device primitives: shared-memory matrix descriptors, wgmma.mma_async, the async-proxy
// fences, mbarriers, TMA tile loads and setmaxnreg. Thin, documented wrappers over PTX (PTX ISA 8.x,
// "Asynchronous Warpgroup Level Matrix Multiply-Accumulate" and "Tensor Copy"); kernels build their
// pipelines from them (gemm_sm90.cuh, the sm_90a attention kernel).
//
// Everything here needs the architecture-specific target sm_90a (`__CUDA_ARCH_FEAT_SM90_ALL`): wgmma and
// setmaxnreg do not exist on plain sm_90, nor on sm_80/sm_89. The header still compiles for every target
// (so one translation unit can include every template); on other targets the bodies are empty and a
// kernel that calls them must never be instantiated there — kernels guard their bodies with
// ATTNPLAN_SM90A_ENABLED and trap otherwise.
#pragma once

#include "attnplan/params.h"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ATTNPLAN_SM90A_ENABLED 1
#else
#define ATTNPLAN_SM90A_ENABLED 0
#endif

namespace attnplan::kernels::sm90 {

// ---------------------------------------------------------------------------------------------------
// Addresses

// The 32-bit shared-state-space address of a pointer into shared memory (what PTX's [addr] operands take).
__device__ __forceinline__ unsigned smem_address(const void* pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

// ---------------------------------------------------------------------------------------------------
// Shared-memory matrix descriptors (PTX ISA "Matrix Descriptor Format"), 64 bits:
//   bits  0-13  start address >> 4
//   bits 16-29  leading-dimension byte offset (LBO) >> 4
//   bits 32-45  stride-dimension byte offset (SBO) >> 4
//   bits 49-51  base offset (0: the swizzle pattern starts at a 1024-byte-aligned address)
//   bits 62-63  swizzle: 0 none, 1 128-byte, 2 64-byte, 3 32-byte
//
// 128-byte swizzle, the layout a TMA load with CU_TENSOR_MAP_SWIZZLE_128B writes: rows of exactly 128
// bytes (64 bf16), grouped in atoms of 8 rows = 1024 bytes; inside an atom the 16-byte chunk c of row r is
// stored at chunk c ^ r. The tile must start 1024-byte aligned (base offset 0).
inline constexpr int kSwizzle128Bytes = 128;       // bytes of one swizzled row
inline constexpr int kSwizzle128AtomBytes = 1024;  // 8 rows x 128 bytes: one repeat of the XOR pattern

__device__ __forceinline__ unsigned long long make_descriptor(unsigned smem_byte_address,
                                                              unsigned leading_bytes, unsigned stride_bytes) {
  unsigned long long descriptor = 0;
  descriptor |= static_cast<unsigned long long>((smem_byte_address & 0x3ffff) >> 4);
  descriptor |= static_cast<unsigned long long>((leading_bytes & 0x3ffff) >> 4) << 16;
  descriptor |= static_cast<unsigned long long>((stride_bytes & 0x3ffff) >> 4) << 32;
  descriptor |= 1ull << 62;  // 128-byte swizzle
  return descriptor;
}

// K-major operand (A [M, K] or W [N, K] with K contiguous), bf16, 128-byte swizzle: each row of the tile
// holds 64 K elements (128 bytes), consecutive rows 128 bytes apart, 8-row atoms 1024 bytes apart (SBO).
// LBO is unused for swizzled K-major layouts (one k16 step, 32 bytes, never crosses a 128-byte row; PTX
// says "assumed 1"). `smem_byte_address` points at row 0, K element 16 * k_step of the tile: advancing K by
// 16 inside the 128-byte row is +32 bytes on the start address; the hardware applies the XOR swizzle to
// the final addresses, so the start address stays un-swizzled. The tile base must be 1024-byte aligned.
__device__ __forceinline__ unsigned long long kmajor_descriptor(unsigned smem_byte_address) {
  return make_descriptor(smem_byte_address, 16, kSwizzle128AtomBytes);
}

// MN-major operand (the transposed form: B stored [K, N] with N contiguous, e.g. V [keys, Dv] as the B
// of P·V), bf16, 128-byte swizzle, as TMA writes a box of [rows = K, 64 N elements]: each K row holds 64
// N elements (128 bytes), 8 K rows form a 1024-byte atom. SBO = bytes between consecutive 8-row groups
// along K (1024 when one box's K rows are contiguous); LBO = bytes between consecutive 64-wide groups
// along N (the distance between two such boxes, e.g. 64 * rows * 2 for boxes stacked one after the
// other). Use with the wgmma's transpose-B immediate set (kTransposeB below). 1024-byte aligned base.
__device__ __forceinline__ unsigned long long mnmajor_descriptor(
    unsigned smem_byte_address, unsigned n_group_bytes, unsigned k_group_bytes = kSwizzle128AtomBytes) {
  return make_descriptor(smem_byte_address, n_group_bytes, k_group_bytes);
}

// ---------------------------------------------------------------------------------------------------
// Fences and wgmma group control. All are warpgroup-wide (.sync.aligned): every thread of the 4 warps
// of a warpgroup (threads 128 g .. 128 g + 127) must execute them together, with no divergence.

// Before the first wgmma that reads registers (accumulators, register A) written by ordinary
// instructions, and before a wgmma whose accumulators were touched since the last wgmma.
__device__ __forceinline__ void wgmma_fence() {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

// Closes the wgmma operations issued so far into one group.
__device__ __forceinline__ void wgmma_commit_group() {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// Waits until at most kPending committed groups are in flight; only then may their accumulators be
// read, or the shared memory they read be overwritten.
template <int kPending>
__device__ __forceinline__ void wgmma_wait_group() {
  static_assert(kPending >= 0 && kPending <= 7, "wgmma.wait_group takes 0..7");
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Keeps the compiler from moving accesses of an accumulator register across a wgmma fence / wait: the
// asynchronous wgmma writes the registers behind the compiler's back. The unsigned form is for register A
// fragments: fenced after wgmma_wait_group, they stay live (and so unreused by the compiler) until the
// wgmmas that read them have completed.
__device__ __forceinline__ void fence_register(float& value) {
  asm volatile("" : "+f"(value)::"memory");
}
__device__ __forceinline__ void fence_register(unsigned& value) {
  asm volatile("" : "+r"(value)::"memory");
}
template <class Register, int kCount>
__device__ __forceinline__ void fence_registers(Register (&values)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) fence_register(values[i]);
}

// Orders this thread's generic-proxy shared-memory writes (ordinary st.shared) before later async-proxy
// accesses (wgmma operand reads, TMA stores) of the same memory. Follow it with a barrier that the
// async-proxy issuer waits on.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// ---------------------------------------------------------------------------------------------------
// wgmma.mma_async m64nNk16, bf16 x bf16 -> fp32, for one warpgroup.
//
// D [64, N] fp32: each thread holds N / 2 floats. Thread t = 32 w + l (w: warp of the warpgroup) holds
// d[j] at row 16 w + l / 4 + 8 * ((j / 2) % 2), column 8 * (j / 4) + 2 * (l % 4) + j % 2 — the mma.sync
// m16n8 accumulator layout, repeated for each 8-column block.
// `accumulate` false: D = A·B (the accumulators' old values are ignored); true: D += A·B.
// Descriptors: kmajor_descriptor / mnmajor_descriptor, whose tiles must stay unmodified until the
// group's wgmma_wait_group. Issue between wgmma_fence() and wgmma_commit_group().
//
// The register lists for N / 2 = 32, 48, 64, 80, 96, 128 accumulators are spelled out once below; each
// variant is then one macro use (the asm operand lists cannot be generated by templates).

#define ATTNPLAN_WG_R10(t) \
  "%" #t "0, %" #t "1, %" #t "2, %" #t "3, %" #t "4, %" #t "5, %" #t "6, %" #t "7, %" #t "8, %" #t "9"
#define ATTNPLAN_WG_R0 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9"
#define ATTNPLAN_WG_REGS_32 ATTNPLAN_WG_R0 ", " ATTNPLAN_WG_R10(1) ", " ATTNPLAN_WG_R10(2) ", %30, %31"
#define ATTNPLAN_WG_REGS_48                                                            \
  ATTNPLAN_WG_R0 ", " ATTNPLAN_WG_R10(1) ", " ATTNPLAN_WG_R10(2) ", " ATTNPLAN_WG_R10( \
      3) ", %40, %41, %42, %43, %44, %45, %46, %47"
#define ATTNPLAN_WG_REGS_64                                                            \
  ATTNPLAN_WG_R0 ", " ATTNPLAN_WG_R10(1) ", " ATTNPLAN_WG_R10(2) ", " ATTNPLAN_WG_R10( \
      3) ", " ATTNPLAN_WG_R10(4) ", " ATTNPLAN_WG_R10(5) ", %60, %61, %62, %63"
#define ATTNPLAN_WG_REGS_80                                                            \
  ATTNPLAN_WG_R0 ", " ATTNPLAN_WG_R10(1) ", " ATTNPLAN_WG_R10(2) ", " ATTNPLAN_WG_R10( \
      3) ", " ATTNPLAN_WG_R10(4) ", " ATTNPLAN_WG_R10(5) ", " ATTNPLAN_WG_R10(6) ", " ATTNPLAN_WG_R10(7)
#define ATTNPLAN_WG_REGS_96 \
  ATTNPLAN_WG_R0 ", " ATTNPLAN_WG_R10(1) ", " ATTNPLAN_WG_R10(2) ", " ATTNPLAN_WG_R10(3) ", " ATTNPLAN_WG_R10( \
      4) ", " ATTNPLAN_WG_R10(5) ", " ATTNPLAN_WG_R10(6) ", " ATTNPLAN_WG_R10(7) ", " ATTNPLAN_WG_R10(8)         \
      ", %90, %91, %92, %93, %94, %95"
#define ATTNPLAN_WG_REGS_128 \
  ATTNPLAN_WG_R0 ", " ATTNPLAN_WG_R10(1) ", " ATTNPLAN_WG_R10(2) ", " ATTNPLAN_WG_R10(3) ", " ATTNPLAN_WG_R10( \
      4) ", " ATTNPLAN_WG_R10(5) ", " ATTNPLAN_WG_R10(6) ", " ATTNPLAN_WG_R10(7) ", " ATTNPLAN_WG_R10(8)         \
      ", " ATTNPLAN_WG_R10(9) ", " ATTNPLAN_WG_R10(10) ", " ATTNPLAN_WG_R10(11) ", %120, %121, %122, %123, %124, %125, %126, %127"

// "+f" operands d[base .. base + 7], then groups of them.
#define ATTNPLAN_WG_D8(d, b)                                                                \
  "+f"(d[(b) + 0]), "+f"(d[(b) + 1]), "+f"(d[(b) + 2]), "+f"(d[(b) + 3]), "+f"(d[(b) + 4]), \
      "+f"(d[(b) + 5]), "+f"(d[(b) + 6]), "+f"(d[(b) + 7])
#define ATTNPLAN_WG_D16(d, b) ATTNPLAN_WG_D8(d, b), ATTNPLAN_WG_D8(d, (b) + 8)
#define ATTNPLAN_WG_D32(d, b) ATTNPLAN_WG_D16(d, b), ATTNPLAN_WG_D16(d, (b) + 16)
#define ATTNPLAN_WG_D_32(d) ATTNPLAN_WG_D32(d, 0)
#define ATTNPLAN_WG_D_48(d) ATTNPLAN_WG_D32(d, 0), ATTNPLAN_WG_D16(d, 32)
#define ATTNPLAN_WG_D_64(d) ATTNPLAN_WG_D32(d, 0), ATTNPLAN_WG_D32(d, 32)
#define ATTNPLAN_WG_D_80(d) ATTNPLAN_WG_D32(d, 0), ATTNPLAN_WG_D32(d, 32), ATTNPLAN_WG_D16(d, 64)
#define ATTNPLAN_WG_D_96(d) ATTNPLAN_WG_D32(d, 0), ATTNPLAN_WG_D32(d, 32), ATTNPLAN_WG_D32(d, 64)
#define ATTNPLAN_WG_D_128(d) \
  ATTNPLAN_WG_D32(d, 0), ATTNPLAN_WG_D32(d, 32), ATTNPLAN_WG_D32(d, 64), ATTNPLAN_WG_D32(d, 96)

// The asm statements. REGS / D_OPERANDS: the accumulator list and its "+f" operands (N / 2 of them,
// numbered from %0); the remaining operands follow with the literal numbers given.
// A and B from shared memory: %RA = a descriptor, %RB = b descriptor, %RS = accumulate flag, %RT =
// transpose-b immediate. Immediates: scale-a = scale-b = 1 (no negation), transpose-a = 0 (K-major A).
#define ATTNPLAN_WGMMA_SS_ASM(N, D_OPERANDS, REGS, RA, RB, RS, RT)                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #RS                                               \
               ", 0;\n"                                                                               \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" REGS "}, %" #RA ", %" #RB \
               ", p, 1, 1, 0, %" #RT ";\n}\n"                                                         \
               : D_OPERANDS                                                                           \
               : "l"(a_descriptor), "l"(b_descriptor), "r"(static_cast<int>(accumulate)), "n"(kTransposeB))

// e4m3 x e4m3 -> fp32, k32, both operands K-major from shared memory (fp8 wgmma has no transpose).
#define ATTNPLAN_WGMMA_SS_FP8_ASM(N, D_OPERANDS, REGS, RA, RB, RS)                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #RS                                               \
               ", 0;\n"                                                                               \
               "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 {" REGS "}, %" #RA ", %" #RB \
               ", p, 1, 1;\n}\n"                                                                      \
               : D_OPERANDS                                                                           \
               : "l"(a_descriptor), "l"(b_descriptor), "r"(static_cast<int>(accumulate)))

// A from registers, B from shared memory: %RA .. %RA3 = the four A registers, %RB = b descriptor, %RS =
// accumulate flag, %RT = transpose-b immediate.
#define ATTNPLAN_WGMMA_RS_ASM(N, D_OPERANDS, REGS, RA, RA1, RA2, RA3, RB, RS, RT)                       \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #RS                                                 \
               ", 0;\n"                                                                                 \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" REGS "}, {%" #RA ", %" #RA1 \
               ", %" #RA2 ", %" #RA3 "}, %" #RB ", p, 1, 1, %" #RT ";\n}\n"                             \
               : D_OPERANDS                                                                             \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor),                         \
                 "r"(static_cast<int>(accumulate)), "n"(kTransposeB))

// N values a kernel may use: 64, 96, 128, 160 (wgmma_ss only), 192, 256 (d has N / 2 floats).
template <int N>
inline constexpr bool kWgmmaSupportedN = N == 64 || N == 96 || N == 128 || N == 160 || N == 192 || N == 256;

// d[64, N] (+)= A[64, 16] · B[16, N], A and B described by shared-memory descriptors. kTransposeB: 0 for
// a K-major B (W [N, K], K contiguous), 1 for an MN-major B ([K, N], N contiguous).
template <int N, int kTransposeB = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], unsigned long long a_descriptor,
                                         unsigned long long b_descriptor, bool accumulate) {
  static_assert(kWgmmaSupportedN<N>, "wgmma_ss: N must be 64, 96, 128, 160, 192 or 256");
  static_assert(kTransposeB == 0 || kTransposeB == 1, "transpose-b is 0 or 1");
#if ATTNPLAN_SM90A_ENABLED
  if constexpr (N == 64) {
    ATTNPLAN_WGMMA_SS_ASM(64, ATTNPLAN_WG_D_32(d), ATTNPLAN_WG_REGS_32, 32, 33, 34, 35);
  } else if constexpr (N == 96) {
    ATTNPLAN_WGMMA_SS_ASM(96, ATTNPLAN_WG_D_48(d), ATTNPLAN_WG_REGS_48, 48, 49, 50, 51);
  } else if constexpr (N == 128) {
    ATTNPLAN_WGMMA_SS_ASM(128, ATTNPLAN_WG_D_64(d), ATTNPLAN_WG_REGS_64, 64, 65, 66, 67);
  } else if constexpr (N == 160) {
    ATTNPLAN_WGMMA_SS_ASM(160, ATTNPLAN_WG_D_80(d), ATTNPLAN_WG_REGS_80, 80, 81, 82, 83);
  } else if constexpr (N == 192) {
    ATTNPLAN_WGMMA_SS_ASM(192, ATTNPLAN_WG_D_96(d), ATTNPLAN_WG_REGS_96, 96, 97, 98, 99);
  } else {
    ATTNPLAN_WGMMA_SS_ASM(256, ATTNPLAN_WG_D_128(d), ATTNPLAN_WG_REGS_128, 128, 129, 130, 131);
  }
#else
  (void)d, (void)a_descriptor, (void)b_descriptor, (void)accumulate;
#endif
}

// d[64, 128] (+)= A[64, 32] · B[32, 128] in e4m3 (fp8 e4m3fn codes), both K-major with 128-byte rows of
// 128 codes: one k32 step is 32 bytes along the row, as one bf16 k16 step (the same descriptor advance).
__device__ __forceinline__ void wgmma_ss_fp8_n128(float (&d)[64], unsigned long long a_descriptor,
                                                  unsigned long long b_descriptor, bool accumulate) {
#if ATTNPLAN_SM90A_ENABLED
  ATTNPLAN_WGMMA_SS_FP8_ASM(128, ATTNPLAN_WG_D_64(d), ATTNPLAN_WG_REGS_64, 64, 65, 66);
#else
  (void)d, (void)a_descriptor, (void)b_descriptor, (void)accumulate;
#endif
}

// d[64, N] (+)= A[64, 16] · B[16, N] with A in registers: a[0..3] hold, for warp w of the warpgroup, rows
// 16 w .. 16 w + 15 in the mma.sync m16n8k16 A-fragment layout (a[0]: row l / 4, k 2 (l % 4) + {0, 1};
// a[1]: row + 8; a[2]: k + 8; a[3]: row + 8, k + 8; two bf16 per register, lower k in the low half).
// Registers written since the last wgmma need a wgmma_fence() first.
template <int N, int kTransposeB = 0>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const unsigned (&a)[4],
                                         unsigned long long b_descriptor, bool accumulate) {
  static_assert(kWgmmaSupportedN<N> && N != 160, "wgmma_rs: N must be 64, 96, 128, 192 or 256");
  static_assert(kTransposeB == 0 || kTransposeB == 1, "transpose-b is 0 or 1");
#if ATTNPLAN_SM90A_ENABLED
  if constexpr (N == 64) {
    ATTNPLAN_WGMMA_RS_ASM(64, ATTNPLAN_WG_D_32(d), ATTNPLAN_WG_REGS_32, 32, 33, 34, 35, 36, 37, 38);
  } else if constexpr (N == 96) {
    ATTNPLAN_WGMMA_RS_ASM(96, ATTNPLAN_WG_D_48(d), ATTNPLAN_WG_REGS_48, 48, 49, 50, 51, 52, 53, 54);
  } else if constexpr (N == 128) {
    ATTNPLAN_WGMMA_RS_ASM(128, ATTNPLAN_WG_D_64(d), ATTNPLAN_WG_REGS_64, 64, 65, 66, 67, 68, 69, 70);
  } else if constexpr (N == 192) {
    ATTNPLAN_WGMMA_RS_ASM(192, ATTNPLAN_WG_D_96(d), ATTNPLAN_WG_REGS_96, 96, 97, 98, 99, 100, 101, 102);
  } else {
    ATTNPLAN_WGMMA_RS_ASM(256, ATTNPLAN_WG_D_128(d), ATTNPLAN_WG_REGS_128, 128, 129, 130, 131, 132, 133, 134);
  }
#else
  (void)d, (void)a, (void)b_descriptor, (void)accumulate;
#endif
}

// ---------------------------------------------------------------------------------------------------
// mbarriers (PTX "mbarrier"): 8-byte objects in shared memory, 8-byte aligned. A phase completes when
// `count` arrivals have happened and every expected transaction byte has landed; the barrier then flips to
// the next phase (parity 0, 1, 0, ...).

// One thread initializes; make it visible with fence_barrier_init() + __syncthreads() before any use.
__device__ __forceinline__ void mbarrier_init(unsigned barrier, unsigned arrival_count) {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(arrival_count) : "memory");
#else
  (void)barrier, (void)arrival_count;
#endif
}

// Makes barrier initializations visible to the async proxy (TMA's complete_tx) and to other threads.
__device__ __forceinline__ void fence_barrier_init() {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// One arrival (release semantics: this thread's earlier memory accesses happen before the phase ends).
__device__ __forceinline__ void mbarrier_arrive(unsigned barrier) {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(barrier) : "memory");
#else
  (void)barrier;
#endif
}

// One arrival that also announces `bytes` of asynchronous transactions (TMA loads signalling this
// barrier) for the current phase: the phase ends only when they have all landed. Issue it before or
// after the loads, in the same phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned barrier, unsigned bytes) {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes)
               : "memory");
#else
  (void)barrier, (void)bytes;
#endif
}

// Announces `bytes` of asynchronous transactions for the current phase without arriving: the phase then
// also waits for them. The phase must not be able to end before this runs (an arrival it still needs comes
// from this thread afterwards); complete_tx may land before it (the count goes negative meanwhile).
__device__ __forceinline__ void mbarrier_expect_tx(unsigned barrier, unsigned bytes) {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(bytes)
               : "memory");
#else
  (void)barrier, (void)bytes;
#endif
}

// An arrival on `barrier` made by the hardware once every cp.async this thread issued before it has
// landed (PTX cp.async.mbarrier.arrive.noinc): a producer thread hands its copies to the barrier and goes
// on without waiting for them. noinc: the arrival counts against the count given at mbarrier_init.
__device__ __forceinline__ void cp_async_mbarrier_arrive(unsigned barrier) {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(barrier) : "memory");
#else
  (void)barrier;
#endif
}

// True once the phase of parity `parity` has completed (acquire semantics). A fresh barrier is in phase
// 0, so waiting for parity 1 succeeds at once: producers start waiting on "empty" barriers with parity 1.
__device__ __forceinline__ bool mbarrier_try_wait_parity(unsigned barrier, unsigned parity) {
#if ATTNPLAN_SM90A_ENABLED
  unsigned done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(barrier), "r"(parity)
      : "memory");
  return done != 0;
#else
  (void)barrier, (void)parity;
  return true;
#endif
}

// Blocks until the phase of parity `parity` has completed (try_wait suspends for a while in hardware
// between polls).
__device__ __forceinline__ void mbarrier_wait_parity(unsigned barrier, unsigned parity) {
  while (!mbarrier_try_wait_parity(barrier, parity)) {
  }
}

// ---------------------------------------------------------------------------------------------------
// TMA (PTX "cp.async.bulk.tensor"). The tensor map (CUtensorMap, 128 bytes; TMA needs it 64-byte aligned; on
// the device side attnplan/tensor_map.h's TensorMap) is encoded on the host with cuTensorMapEncodeTiled and
// must live in kernel-parameter, constant or global memory: pass it inside a `__grid_constant__ const`
// Params and give its address here.

// Asks L2 for `bytes` of global memory from `source` (both multiples of 16) and returns at once (PTX
// cp.async.bulk.prefetch.L2): a hint, which no barrier counts and nothing waits on; a later copy of the same
// bytes then starts from L2 instead of device memory.
__device__ __forceinline__ void prefetch_l2(const void* source, unsigned bytes) {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile(
      "cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(reinterpret_cast<unsigned long long>(source)),
      "r"(bytes)
      : "memory");
#else
  (void)source;
  (void)bytes;
#endif
}

// Asks for the 128-byte line of global memory holding `address` in the SM's L1 (PTX prefetch.global.L1): a
// hint that holds no register past its issue; a later load of the line (ld.global.nc included) then hits L1.
__device__ __forceinline__ void prefetch_l1(const void* address) {
  asm volatile("prefetch.global.L1 [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(address)) : "memory");
}

// Fetches the tensor map into the TMA unit's cache ahead of the first load (one thread).
__device__ __forceinline__ void prefetch_tensor_map(const void* map) {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
#else
  (void)map;
#endif
}

// Loads the box at element coordinates (x = innermost dimension, y = rows) of `map` into shared memory
// at `destination` (128-byte aligned; 1024-byte aligned for 128-byte swizzle so wgmma descriptors can use
// base offset 0), then completes the box's full byte count on `barrier` — out-of-bounds elements are
// written as zeros and still counted. Issued by one thread.
__device__ __forceinline__ void tma_load_2d(unsigned destination, const void* map, unsigned barrier, int x,
                                            int y) {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], "
      "[%2];\n" ::"r"(destination),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(barrier), "r"(x), "r"(y)
      : "memory");
#else
  (void)destination, (void)map, (void)barrier, (void)x, (void)y;
#endif
}

// Stores `source` (shared memory: the box, 1024-byte aligned for 128-byte swizzle) to the box of `map` at
// element coordinates (x, y), clipping elements past the tensor's bounds, as one bulk async group member:
// follow it with bulk_commit_group, and do not overwrite `source` before bulk_wait_group_read says the
// group has read it. Issued by one thread, after the writers' fence_proxy_async_shared and a barrier.
__device__ __forceinline__ void tma_store_2d(const void* map, unsigned source, int x, int y) {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                   reinterpret_cast<unsigned long long>(map)),
               "r"(source), "r"(x), "r"(y)
               : "memory");
#else
  (void)map, (void)source, (void)x, (void)y;
#endif
}

// Closes this thread's bulk async group of TMA stores issued since the last commit.
__device__ __forceinline__ void bulk_commit_group() {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most kPending of this thread's committed bulk groups are still reading their shared
// memory sources (their global writes may still be in flight).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Waits until at most kPending of this thread's committed bulk groups are incomplete (writes done).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group() {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Stores four 8x8 b16 matrices to shared memory: register i of every thread holds its pair of matrix i
// (row lane / 4, columns 2 (lane % 4) + {0, 1}: the mma / wgmma accumulator layout), and lane l gives the
// address of row l % 8 of matrix l / 8 (16 bytes).
__device__ __forceinline__ void stmatrix_x4(unsigned address, unsigned r0, unsigned r1, unsigned r2,
                                            unsigned r3) {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
#else
  (void)address, (void)r0, (void)r1, (void)r2, (void)r3;
#endif
}

// stmatrix_x4, each 8x8 matrix stored transposed: register i of lane l still holds row l / 4, columns
// 2 (l % 4) + {0, 1} of matrix i, which lands as column l / 4 of rows 2 (l % 4) + {0, 1}; lane l gives the
// address of stored row l % 8 of matrix l / 8.
__device__ __forceinline__ void stmatrix_x4_trans(unsigned address, unsigned r0, unsigned r1, unsigned r2,
                                                  unsigned r3) {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
#else
  (void)address, (void)r0, (void)r1, (void)r2, (void)r3;
#endif
}

// bar.sync on named barrier `id` (1..15; 0 is __syncthreads) for the 128 threads of one warpgroup.
__device__ __forceinline__ void warpgroup_barrier(int id) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory");
}

// The multicast form of tma_load_2d for a CTA of a cluster: the box lands at `destination` in every CTA of
// `cta_mask` (bit r: cluster rank r) and completes its byte count on the barrier at `barrier`'s offset in
// each of them. `destination` and `barrier` are this CTA's shared addresses; the other CTAs' slots must be
// free (their consumers' release is what the issuing thread waited on).
__device__ __forceinline__ void tma_load_2d_multicast(unsigned destination, const void* map, unsigned barrier,
                                                      int x, int y, unsigned short cta_mask) {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
      "[%1, {%4, %5}], [%2], %3;\n" ::"r"(destination),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(barrier), "h"(cta_mask), "r"(x), "r"(y)
      : "memory");
#else
  (void)destination, (void)map, (void)barrier, (void)x, (void)y, (void)cta_mask;
#endif
}

// `bytes` (a multiple of 16) of this CTA's shared memory at `source` to the same offset in cluster rank
// `cta`'s shared memory, by the bulk-copy (TMA) engine: the issuing thread goes on at once, and the bytes
// complete on the barrier at `barrier`'s offset in that CTA (PTX cp.async.bulk.shared::cluster.shared::cta).
// The source must be visible to the async proxy (its writers' fence_proxy_async_shared, then a barrier
// with the issuing thread) and stay unchanged until the copy is done; the destination must be free.
__device__ __forceinline__ void bulk_copy_to_cluster(unsigned source, unsigned bytes, unsigned barrier,
                                                     unsigned cta) {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile(
      "{\n.reg .b32 destination, remote_barrier;\nmapa.shared::cluster.u32 destination, %0, %3;\n"
      "mapa.shared::cluster.u32 remote_barrier, %2, %3;\n"
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [destination], [%0], %1, "
      "[remote_barrier];\n}\n" ::"r"(source),
      "r"(bytes), "r"(barrier), "r"(cta)
      : "memory");
#else
  (void)source, (void)bytes, (void)barrier, (void)cta;
#endif
}

// ---------------------------------------------------------------------------------------------------
// Thread block clusters (launched with a cluster dimension; CTAs of a cluster run at once on one GPC and
// can reach each other's shared memory).

// This CTA's rank in its cluster (0 .. cluster size - 1).
__device__ __forceinline__ unsigned cluster_rank() {
#if ATTNPLAN_SM90A_ENABLED
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
#else
  return 0;
#endif
}

// Every thread of every CTA of the cluster: waits until all have arrived (release / acquire at cluster
// scope). Before the first remote access, it makes the other CTAs' barrier initializations visible; at the
// end, it keeps a CTA's shared memory alive until no other CTA will write to it.
__device__ __forceinline__ void cluster_sync() {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
#endif
}

// One arrival on the mbarrier at `barrier`'s offset in the shared memory of cluster rank `cta` (this CTA
// included). The default CTA-scope release: a ring slot's release only says that this warp's wgmmas have
// finished reading it (wait_group returned), which needs no cluster-scope fence; a .release.cluster
// arrival cost the clustered GEMM ~1000 cycles per slot on the H200.
__device__ __forceinline__ void mbarrier_arrive_cluster(unsigned barrier, unsigned cta) {
#if ATTNPLAN_SM90A_ENABLED
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(barrier),
      "r"(cta)
      : "memory");
#else
  (void)barrier, (void)cta;
#endif
}

// ---------------------------------------------------------------------------------------------------
// setmaxnreg: moves registers between the warpgroups of a warp-specialized CTA. Warpgroup-wide (all 128
// threads, convergent); kRegisters per thread is a multiple of 8 in [24, 256]. Decrease in producer
// warpgroups first, so the consumers' increase can be satisfied from the freed pool; the kernel's total
// (launch bounds) must cover the sum.
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_increase() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg: 24..256, step 8");
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
#endif
}

template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_decrease() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg: 24..256, step 8");
#if ATTNPLAN_SM90A_ENABLED
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
#endif
}

}  // namespace attnplan::kernels::sm90
