#!/usr/bin/env bash
# Everything that needs a GPU, in one go (for a lent GPU machine or a developer's workstation): build,
# the GPU test executable, `attnplan verify` of every plan, and the HF transformers layer comparison.
# Logs go to $OUT (default: ./gpu-logs). Exit status: non-zero if any part failed.
#
#   tools/gpu_suite.sh                 # every part: build tests plans verify hf host
#   tools/gpu_suite.sh build tests     # just these parts, in this order
#
# Parts: `tests` runs test_gpu "~[.]~[plans]" (every non-hidden case but the plan sweep), or in two halves
# `tests-core` ("~[.]~[plans]~[gemm]": attention, KV store, layer, reliability, ...) and `tests-gemm`
# ("[gemm]~[.]": the projection GEMMs, which hold most of the cold-cache compile time), `plans` the sweep
# "[plans]" (every plan in plans/ through the runtime API), `verify` `attnplan verify` of every plan (1100
# tokens, 4 sequences, prefix 300: at least dequantized_min_tokens, so weight-only quantized plans run their
# dequantized path; `plans`, at 300 tokens, runs their quantized kernels), `hf` the HF transformers layers,
# `host` ctest without the GPU label, `attention` the check after a change to the attention kernels in one
# short call: test_gpu "[attention][sm90]~[.],[sass]" (every sm_90a attention case, the split tail's
# included, and the SASS checks) and `attnplan verify` of bench-config launches that split their tail and
# that do not (tools/bench_matrix.py's D 64 and D 128 configs, bidirectional: 1024, 1088 and 4096 tokens,
# and 1024 in 2 sequences after a 200-token prefix); about 2.5 minutes on an H100 with a warm build (session
# 46), 70 s more with a cold kernel cache. `tests` includes test_gpu's [sass] cases, which read kernels' SASS with
# the toolkit's cuobjdump (the lent machine's toolkit has it, CI's does not).
# On an H200 (2026-11-30): build ~40-70 s, tests ~6.5 min (8.7 min in session 9: 522 s, with the cold
# kernel cache), plans ~3 min, verify ~4 min (at 1000 tokens; 1100 estimated ~4.5), hf ~1 min. Where one
# command is limited to 10 minutes, run `build tests` and `build plans verify hf` apart (the build is
# incremental; the kernel cache in $ATTNPLAN_CACHE_DIR is shared), and leave nothing else in that call. Two parts run at once on one GPU slow
# each other down: tests and verify side by side took more than 8 minutes.
# On an H100 with a cold kernel cache (session 45) `tests` no longer fits a 10-minute call: the attention
# and bench cases took ~2.5 min, the GEMM cases before the decoding kernel's ~5.5 min, and the limit cut that
# one; the cases after it ran in ~40 s. There, run `build tests-core` and `build tests-gemm` as two calls.
# A subset of `tests` on a fresh machine pays the cold kernel cache too: in session 26 `test_gpu
# "[gemm]~[.]"` alone ran past 8 minutes (the bf16 GEMM case 44 s, the packed-integer one 138 s, and the
# decoding kernel's case, which compiles every format and tiling, unfinished after 3 minutes), so budget a call
# by these times, not by the number of cases.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/gpu-logs}"
BUILD="${ATTNPLAN_BUILD_DIR:-$ROOT/build-gpu}"
mkdir -p "$OUT"
export ATTNPLAN_CACHE_DIR="${ATTNPLAN_CACHE_DIR:-$BUILD/cache}"
parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(build tests plans verify hf host)
for part in "${parts[@]}"; do
  case "$part" in
    build | tests | tests-core | tests-gemm | plans | verify | hf | host | attention) ;;
    *) echo "unknown part '$part' (build tests tests-core tests-gemm plans verify hf host attention)" >&2; exit 2 ;;
  esac
done
status=0

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
for part in "${parts[@]}"; do
  start=$SECONDS
  case "$part" in
    build)
      if ! { cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTNPLAN_WERROR=ON &&
             ninja -C "$BUILD"; } >"$OUT/build.log" 2>&1; then
        tail -40 "$OUT/build.log"
        exit 1
      fi
      ;;
    tests | tests-core | tests-gemm)
      case "$part" in
        tests) filter="~[.]~[plans]" log="$OUT/test_gpu.log" ;;
        tests-core) filter="~[.]~[plans]~[gemm]" log="$OUT/test_gpu-core.log" ;;
        tests-gemm) filter="[gemm]~[.]" log="$OUT/test_gpu-gemm.log" ;;
      esac
      "$BUILD/tests/test_gpu" "$filter" -r compact -d yes >"$log" 2>&1 || status=1
      tail -3 "$log"
      ;;
    plans)
      "$BUILD/tests/test_gpu" "[plans]~[.]" -r compact -d yes >"$OUT/plans.log" 2>&1 || status=1
      tail -3 "$OUT/plans.log"
      ;;
    verify)
      for plan in "$ROOT"/plans/*.json; do
        "$BUILD/attnplan" verify "$plan" --tokens 1100 --seqs 4 --prefix 300 >>"$OUT/verify.log" 2>&1
        code=$?
        printf '%-32s %s\n' "$(basename "$plan")" "$([[ $code == 0 ]] && echo ok || echo "FAILED ($code)")"
        [[ $code == 0 ]] || status=1
      done
      ;;
    hf)
      python3 "$ROOT/tools/hf_layer_check.py" "$BUILD/attnplan" "$BUILD/hf" >"$OUT/hf.log" 2>&1 || status=1
      grep -E "attnplan vs|FAIL|Error|error" "$OUT/hf.log" | head -20
      ;;
    attention)
      "$BUILD/tests/test_gpu" "[attention][sm90]~[.],[sass]" -r compact -d yes >"$OUT/attention.log" 2>&1 || status=1
      tail -3 "$OUT/attention.log"
      configs="$OUT/attention-configs"
      python3 "$ROOT/tools/bench_matrix.py" rows "$configs" --full --only 'attn-d(64|128)-causal-1k-s1-b64' >/dev/null ||
        status=1
      for run in "attention-d64.json --tokens 1024 --mask bidirectional" \
                 "attention-d64.json --tokens 4096 --mask bidirectional" \
                 "attention-d128.json --tokens 1088 --mask bidirectional" \
                 "attention-d128.json --tokens 1024 --mask bidirectional" \
                 "attention-d64.json --tokens 1024 --prefix 200 --seqs 2"; do
        # shellcheck disable=SC2086  # run is a config and its options
        "$BUILD/attnplan" verify "$configs"/$run >>"$OUT/attention-verify.log" 2>&1
        code=$?
        printf '%-60s %s\n' "$run" "$([[ $code == 0 ]] && echo ok || echo "FAILED ($code)")"
        [[ $code == 0 ]] || status=1
      done
      ;;
    host)
      (cd "$BUILD" && ctest -j 16 --output-on-failure -LE gpu >"$OUT/ctest.log" 2>&1) || status=1
      tail -3 "$OUT/ctest.log"
      ;;
  esac
  echo "== $part: $((SECONDS - start)) s"
done
exit $status
