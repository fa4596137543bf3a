#!/usr/bin/env bash
# The benchmark table of docs/performance.md in one call on a GPU machine: builds attnplan (build-gpu), runs
# `attnplan bench --json` on every row of tools/bench_matrix.py and tools/bench_peers.py (PyTorch SDPA cuDNN /
# flash, torch.matmul, torch._scaled_mm, an eager PyTorch layer) on the same shapes, and prints ONE markdown
# table with ours/peer per row, headed by GPU, driver, date and commit. Writes $OUT/bench.md and
# $OUT/bench.json (and each run's JSON and log under $OUT/bench/).
#
#   tools/bench_suite.sh [--full] [--only REGEX] [--iterations I]
#
# Default: a representative subset (estimated 3-5 minutes on an H200, not yet timed there); --full: every row of
# the matrix (GQA 32/8 x D 64/128/256 x causal/bidirectional x 1k/4k/16k x 1/4 sequences x block 16/64/
# contiguous, and every projection shape at 512/2k/8k/16k tokens: estimated 12-15 minutes, so split it over calls
# with --only, e.g. --only attn-d64, --only attn-d128, --only 'attn-d256|proj|layer'; each call writes its own
# table). --only keeps the rows whose id matches the extended regex. Exit status: non-zero when the build fails
# or any row did not run.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/gpu-logs}"
BUILD="${ATTNPLAN_BUILD_DIR:-$ROOT/build-gpu}"
export ATTNPLAN_CACHE_DIR="${ATTNPLAN_CACHE_DIR:-$BUILD/cache}"
FULL=""
ITERATIONS=30
ONLY=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --full) FULL="--full" ;;
    --iterations) ITERATIONS="$2"; shift ;;
    --only) ONLY="$2"; shift ;;
    *) echo "usage: tools/bench_suite.sh [--full] [--only REGEX] [--iterations I]" >&2; exit 1 ;;
  esac
  shift
done
WORK="$OUT/bench"
mkdir -p "$WORK/ours"
status=0

if [[ ! -x "$BUILD/attnplan" ]] || ! ninja -C "$BUILD" attnplan >"$WORK/build.log" 2>&1; then
  if ! { cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTNPLAN_WERROR=ON &&
         ninja -C "$BUILD" attnplan; } >"$WORK/build.log" 2>&1; then
    tail -40 "$WORK/build.log"
    exit 1
  fi
fi

{
  echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
  commit="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  [[ $commit != unknown ]] && ! git -C "$ROOT" diff --quiet HEAD 2>/dev/null && commit="$commit (plus uncommitted changes)"
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit: $commit"
  echo "torch: $(python3 -c 'import torch; print(torch.__version__, "cuDNN", torch.backends.cudnn.version())' 2>/dev/null || echo 'not importable')"
  echo "attnplan bench: median of $ITERATIONS runs after 5 warm-up, inputs rotated over > 2x L2"
} >"$WORK/header.txt"
cat "$WORK/header.txt"

python3 "$ROOT/tools/bench_matrix.py" rows "$WORK" $FULL ${ONLY:+--only "$ONLY"} >"$WORK/runs.txt" || exit 1
echo "== attnplan bench: $(wc -l <"$WORK/runs.txt") runs"
start=$SECONDS
while read -r id config rest; do
  # shellcheck disable=SC2086  # rest is the run's own argument list
  if "$BUILD/attnplan" bench "$config" $rest --iterations "$ITERATIONS" --json \
       >"$WORK/ours/$id.json" 2>"$WORK/ours/$id.log"; then
    printf '%-44s ok   (%d s)\n' "$id" $((SECONDS - start))
  else
    printf '%-44s FAILED: %s\n' "$id" "$(tail -1 "$WORK/ours/$id.log")"
    rm -f "$WORK/ours/$id.json"
    status=1
  fi
done <"$WORK/runs.txt"

echo "== peers (PyTorch)"
python3 "$ROOT/tools/bench_peers.py" "$WORK/rows.json" "$WORK/peers.json" --iterations "$ITERATIONS" \
  2>"$WORK/peers.log" || { tail -20 "$WORK/peers.log"; status=1; }
echo "   $((SECONDS - start)) s so far"

python3 "$ROOT/tools/bench_matrix.py" table "$WORK" "$WORK/header.txt" || status=1
cp "$WORK/bench.md" "$WORK/bench.json" "$OUT/" 2>/dev/null || status=1
exit $status
