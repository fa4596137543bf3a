#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz) with clang into build-fuzz/, replays each seed corpus, then
# fuzzes each harness for SECONDS (default 60). Exits non-zero when any input crashes, trips ASan/UBSan,
# throws anything but attnplan::Error, runs past the per-input timeout or allocates past the limit.
# Reproducers land in tests/fuzz/crashes/ (gitignored); new interesting inputs in build-fuzz/corpus/.
# Replay one: build-fuzz/tests/fuzz/<name>_fuzz tests/fuzz/crashes/<file>
#
#   tools/fuzz.sh [SECONDS]     env: ATTNPLAN_FUZZ_BUILD_DIR (default build-fuzz/),
#                               ATTNPLAN_FUZZ_RUNS=N: N inputs per harness from a fixed seed instead of
#                               SECONDS of random search, so that a run (CI's) is reproducible
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_EACH="${1:-60}"
BUILD_DIR="${ATTNPLAN_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
CRASH_DIR="$ROOT/tests/fuzz/crashes"
# name:max_len. Lengths a bit over the largest seed: long enough for every structure the readers know,
# short enough that the fuzzer spends its time on structure rather than on bulk bytes.
HARNESSES=(config:16384 safetensors:4096 cache:8192)
# libFuzzer's per-process RSS cap; a single malloc above it is reported too (-malloc_limit_mb defaults to
# it), which is what makes "a header claiming a terabyte" a finding unless the reader refuses it first.
RSS_LIMIT_MB=2048
TIMEOUT_S=10  # per input; a reader that takes longer on a few KB is hanging
# clang 14 is what Debian 12 ships, with libFuzzer and the sanitizer runtimes in libclang-rt-14-dev.
DEBIAN_PACKAGES=(clang-14 libclang-rt-14-dev)
# shellcheck source=../scripts/lib.sh
source "$ROOT/scripts/lib.sh"

find_clang() {
  for candidate in clang++-14 clang++; do
    if command -v "$candidate" >/dev/null; then
      CLANGXX="$(command -v "$candidate")"
      return 0
    fi
  done
  echo "attnplan fuzz: clang++ not found" >&2
  exit 1
}

ensure_debian_packages "${DEBIAN_PACKAGES[@]}"
find_clang
find_cuda
# CMake drops every -D given along with a changed compiler; start such a tree afresh instead.
if [[ -f "$BUILD_DIR/CMakeCache.txt" ]] && ! grep -qx "CMAKE_CXX_COMPILER:[A-Z]*=$CLANGXX" "$BUILD_DIR/CMakeCache.txt"; then
  rm -rf "$BUILD_DIR/CMakeCache.txt" "$BUILD_DIR/CMakeFiles"
fi
# -O1 -g without -DNDEBUG: nlohmann_json's assertions stay on and stack traces stay readable.
cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_CXX_COMPILER="$CLANGXX" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DCUDAToolkit_ROOT="$CUDA_ROOT" -DATTNPLAN_FUZZ=ON \
  -DATTNPLAN_WERROR="${ATTNPLAN_WERROR:-OFF}" >/dev/null
targets=()
for harness in "${HARNESSES[@]}"; do targets+=("${harness%%:*}_fuzz"); done
cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${targets[@]}"

mkdir -p "$CRASH_DIR" "$BUILD_DIR/fuzz-logs"
failed=()
summary=()
for harness in "${HARNESSES[@]}"; do
  name="${harness%%:*}"
  max_len="${harness##*:}"
  binary="$BUILD_DIR/tests/fuzz/${name}_fuzz"
  seeds="$ROOT/tests/fuzz/corpus/$name"
  # New inputs go to the build tree (first directory), so the checked-in seeds change only by hand.
  work="$BUILD_DIR/corpus/$name"
  log="$BUILD_DIR/fuzz-logs/$name.log"
  mkdir -p "$work"
  options=(-max_len="$max_len" -rss_limit_mb="$RSS_LIMIT_MB" -timeout="$TIMEOUT_S"
    -artifact_prefix="$CRASH_DIR/$name-" -print_final_stats=1)

  echo "== $name: replaying $(find "$seeds" -type f | wc -l) seeds"
  if ! "$binary" "${options[@]}" -runs=0 "$seeds" >"$log" 2>&1; then
    tail -n 40 "$log"
    failed+=("$name (seed replay)")
    continue
  fi
  if [[ -n "${ATTNPLAN_FUZZ_RUNS:-}" ]]; then
    budget=(-runs="$ATTNPLAN_FUZZ_RUNS" -seed=1)
    echo "== $name: fuzzing $ATTNPLAN_FUZZ_RUNS inputs from seed 1"
  else
    budget=(-max_total_time="$SECONDS_EACH")
    echo "== $name: fuzzing for ${SECONDS_EACH}s"
  fi
  if ! "$binary" "${options[@]}" "${budget[@]}" "$work" "$seeds" >>"$log" 2>&1; then
    tail -n 60 "$log"
    failed+=("$name")
  fi
  executions="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$' || true)"
  coverage="$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$' || true)"
  summary+=("$name: ${executions:-?} executions, ${coverage:-?} coverage edges, corpus $(find "$work" -type f | wc -l) inputs")
done

echo "== fuzz summary (logs in $BUILD_DIR/fuzz-logs)"
printf '  %s\n' "${summary[@]}"
if [[ ${#failed[@]} != 0 ]]; then
  echo "attnplan fuzz: FAILED: ${failed[*]}; reproducers in $CRASH_DIR" >&2
  exit 1
fi
