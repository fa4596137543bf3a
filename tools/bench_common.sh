# shellcheck shell=bash
# Sourced by tools/bench_suite.sh and tools/ab_bench.sh (not run on its own): their output, build and
# kernel-cache directories, building attnplan for a benchmark, and the lines that say where and on what a
# benchmark ran.

# OUT: where results go (default gpu-logs); BUILD: the build (ATTNPLAN_BUILD_DIR, default build-gpu); the
# JIT kernel cache in the build unless ATTNPLAN_CACHE_DIR says otherwise (tools/gpu_suite.sh's too).
BENCH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$BENCH_ROOT/gpu-logs}"
BUILD="${ATTNPLAN_BUILD_DIR:-$BENCH_ROOT/build-gpu}"
export ATTNPLAN_CACHE_DIR="${ATTNPLAN_CACHE_DIR:-$BUILD/cache}"

# build_attnplan BUILD LOG: attnplan in BUILD (configured there first when an incremental ninja cannot do
# it); the build's output goes to LOG and, on failure, its last 40 lines to stdout. Non-zero on failure.
build_attnplan() {
  local build="$1" log="$2"
  if [[ -x "$build/attnplan" ]] && ninja -C "$build" attnplan >"$log" 2>&1; then
    return 0
  fi
  if ! { cmake -S "$BENCH_ROOT" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTNPLAN_WERROR=ON &&
         ninja -C "$build" attnplan; } >"$log" 2>&1; then
    tail -40 "$log"
    return 1
  fi
}

# machine_lines: "GPU: NAME, driver V" and "date: ..., commit: C". ATTNPLAN_COMMIT (env), when set, is the
# commit (a tree copied to a GPU machine may carry a stale .git); otherwise git's HEAD, marked when the tree
# has uncommitted changes.
machine_lines() {
  local commit
  echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
  if [[ -n ${ATTNPLAN_COMMIT:-} ]]; then
    commit="$ATTNPLAN_COMMIT (given by ATTNPLAN_COMMIT)"
  else
    commit="$(git -C "$BENCH_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    [[ $commit != unknown ]] && ! git -C "$BENCH_ROOT" diff --quiet HEAD 2>/dev/null && commit="$commit (plus uncommitted changes)"
  fi
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit: $commit"
}
