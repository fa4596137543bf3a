#!/usr/bin/env bash
# The GPU test suite under compute-sanitizer: memcheck, racecheck, initcheck and synccheck.
#
#   tools/sanitize.sh                      # all four tools
#   tools/sanitize.sh racecheck initcheck  # just these
#
# Builds test_gpu in $ATTNPLAN_BUILD_DIR (default build-gpu; configured if needed), runs each tool over a
# Catch2 selection of test cases, writes <tool>.log to $OUT (default ./sanitize-logs) and prints one line per
# tool: cases run, cases failed, sanitizer errors. Exit status 1 if any tool reported an error or a case failed.
#
# Selections (override with ATTNPLAN_SANITIZE_<TOOL>, a Catch2 test spec): memcheck runs every non-benchmark
# case except the every-plan sweep (11 plans at 300 tokens, which the plain suite covers); racecheck and
# initcheck are 10-100x slower per launch, so they run small cases that still launch every kernel of the
# plan (the 60-token reliability cases, the CUDA-graph and chunk cases) plus the single-kernel tests.
# memcheck alone takes about 7 minutes on an H200 (31 cases, 2026-11-30), so where one command is limited to
# 10 minutes, run `tools/sanitize.sh memcheck` and `tools/sanitize.sh racecheck initcheck synccheck` apart.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/sanitize-logs}"
BUILD="${ATTNPLAN_BUILD_DIR:-$ROOT/build-gpu}"
SANITIZER="${COMPUTE_SANITIZER:-compute-sanitizer}"
# One kernel cache for every tool (and tools/gpu_suite.sh): test_gpu uses ATTNPLAN_CACHE_DIR when set,
# so only the first run compiles.
export ATTNPLAN_CACHE_DIR="${ATTNPLAN_CACHE_DIR:-$BUILD/cache}"
mkdir -p "$OUT"

# Every term carries ~[.]: Catch2 runs a hidden case (benchmarks, [.gemm_speed], the 32k-token test) whenever a
# positive tag of the spec names it, and under a sanitizer those cases take minutes each.
declare -A FILTER=(
  [memcheck]="${ATTNPLAN_SANITIZE_MEMCHECK:-~[plans]~[.]}"
  [racecheck]="${ATTNPLAN_SANITIZE_RACECHECK:-[reliability][streams]~[.],[layer][chunks]~[.],[layer][graph]~[.],[rmsnorm]~[.],[kv_store]~[.],[qkv_postprocess]~[.],[attention][sm90]~[.]}"
  [initcheck]="${ATTNPLAN_SANITIZE_INITCHECK:-[reliability]~[.],[layer][chunks]~[.],[rmsnorm]~[.],[kv_store]~[.],[qkv_postprocess]~[.],[gemm]~[.]}"
  [synccheck]="${ATTNPLAN_SANITIZE_SYNCCHECK:-[layer]~[plans]~[.],[reliability]~[.],[attention]~[.],[gemm]~[.]}"
)
# Per tool: leak checking where allocations are the question (memcheck); racecheck reports hazards, not
# just warnings, as errors.
declare -A EXTRA=(
  [memcheck]="--leak-check full"
  [racecheck]="--racecheck-report hazard"
  [initcheck]=""
  [synccheck]=""
)

tools=("$@")
[[ ${#tools[@]} -gt 0 ]] || tools=(memcheck racecheck initcheck synccheck)
for tool in "${tools[@]}"; do
  [[ -n "${FILTER[$tool]+set}" ]] || { echo "unknown tool '$tool' (memcheck racecheck initcheck synccheck)" >&2; exit 2; }
done

command -v "$SANITIZER" >/dev/null || { echo "$SANITIZER not found (set COMPUTE_SANITIZER)" >&2; exit 2; }
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTNPLAN_WERROR=ON \
    >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
fi
ninja -C "$BUILD" test_gpu >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }

status=0
for tool in "${tools[@]}"; do
  log="$OUT/$tool.log"
  start=$SECONDS
  # --error-exitcode tells sanitizer errors apart from failed test cases (Catch2 exits with the count).
  # shellcheck disable=SC2086
  "$SANITIZER" --tool "$tool" ${EXTRA[$tool]} --error-exitcode 99 --print-limit 100 \
    "$BUILD/tests/test_gpu" "${FILTER[$tool]}" >"$log" 2>&1
  code=$?
  # Catch2's console reporter (v2 and v3) ends with "All tests passed (A assertions in N test cases)" or
  # "test cases: N | P passed | F failed".
  cases=$(grep -oE '(in [0-9]+ test case|test cases: *[0-9]+)' "$log" | grep -oE '[0-9]+' | tail -1)
  failed=$(grep -oE 'test cases:.*\| *[0-9]+ failed' "$log" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+' | tail -1)
  # memcheck, initcheck, synccheck: "ERROR SUMMARY: N errors"; racecheck: "RACECHECK SUMMARY: H hazards
  # displayed (N errors, W warnings)".
  errors=$(grep -oE '(ERROR SUMMARY: [0-9]+|RACECHECK SUMMARY: .*\(([0-9]+) errors)' "$log" |
    grep -oE '[0-9]+( errors)?$' | grep -oE '^[0-9]+' | tail -1)
  verdict=ok
  if [[ $code == 77 ]]; then
    verdict="skipped (no GPU)"
  elif [[ $code != 0 || "${errors:-0}" != 0 || "${failed:-0}" != 0 ]]; then
    verdict="FAILED (exit $code)"
    status=1
  fi
  printf '%-10s cases %-4s failed %-3s sanitizer errors %-4s %4ss  %s  [%s]\n' "$tool" "${cases:-?}" \
    "${failed:-0}" "${errors:-?}" "$((SECONDS - start))" "$verdict" "${FILTER[$tool]}" | tee -a "$OUT/summary.txt"
done
exit $status
