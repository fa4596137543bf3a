#!/usr/bin/env bash
# A/B of template trees on the bench suite's rows, in one call on a GPU machine: builds attnplan once
# (build-gpu), then runs `attnplan bench --json` on every chosen row under each variant, round after round
# (the variants interleaved, the first of each round rotating), and prints one markdown table: per row and
# stage (a layer row: each of the layer's stages, then the layer), each variant's round medians, their
# median, its minimum, and its time over the first variant's.
# A variant is NAME=DIR (ATTNPLAN_TEMPLATE_DIR=DIR: the JIT kernels come from that copy of templates/, the
# host code is the build's), NAME=BUILD (a build directory holding its own `attnplan`: host code and
# templates of another commit, for a change that is not templates alone), NAME=TREE (a source tree, a
# CMakeLists.txt at its root, e.g. `git archive BRANCH | tar -x -C TREE`: its attnplan is built first, into
# TREE/build-gpu, which then runs as a BUILD), NAME=BUILD:DIR or NAME=TREE:DIR (that build's host code with
# the templates of DIR: variants of a change whose host code differs from this checkout's, e.g. a shared-
# memory layout, each beside main as its own BUILD or TREE; no ':' in these paths) or NAME alone (the
# templates built into attnplan). This checkout's build and the trees build at once, before the rounds.
# Writes $OUT/ab.md and every run's JSON and log under $OUT/ab/NAME/. Ours only: no peers.
# --trace: after the rounds, each variant runs every attention row once more with `attnplan bench
# --trace-attention` (docs/attention-trace.md: the traced kernels, so not timed against the rounds) and
# $OUT/ab-trace.md gets tools/attention_trace.py's summary of each, variant by variant; the traces stay
# under $OUT/ab/NAME/ID.trace.json. A variant whose attnplan cannot trace (an older tree) is noted there.
# ATTNPLAN_COMMIT as for tools/bench_suite.sh.
#
#   tools/ab_bench.sh --only 'attn-d64-causal-16k-s1-b64' main new=/tmp/new/templates
#   tools/ab_bench.sh --rounds 3 --only 'attn-d128-causal-4k|fp8act-qkv-8192' main old=/tmp/old/templates
#   tools/ab_bench.sh --only 'layer' main old=/tmp/old/build   # /tmp/old: `git archive BASE`, built there
#   tools/ab_bench.sh --only 'fp8-dynamic' main branch=.session/branch   # built here first
#   tools/ab_bench.sh --only 'attn-d128' main=.session/main change=.session/change \
#       variant=.session/change:.session/variant/templates   # the change's host code, other templates
#
# A tree from another commit must match the build's kernel parameters (templates/attnplan/*_params.h) and
# launches: nothing here can tell (e.g. attention trees from before the persistent grid of 9b52ccc would run
# under the persistent launch and leave work items undone).
#
# --only (required) picks rows by id as tools/bench_suite.sh does (tools/bench_matrix.py), from the default
# subset or, with --full, from the whole matrix (the varlen and bidirectional rows at every head dim, the
# projections at every token count). Default: 2 rounds of 30 runs each. Exit status: non-zero when the
# build fails or a variant has no result for a row.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=tools/bench_common.sh
source "$ROOT/tools/bench_common.sh"  # OUT, BUILD, ATTNPLAN_CACHE_DIR
ROUNDS=2
ITERATIONS=30
ONLY=""
FULL=""
TRACE=""
variants=()
usage="usage: tools/ab_bench.sh --only REGEX [--full] [--rounds R] [--iterations I] [--trace] NAME[=TEMPLATE_DIR|BUILD[:TEMPLATE_DIR]|TREE[:TEMPLATE_DIR]]..."
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift ;;
    --iterations) ITERATIONS="$2"; shift ;;
    --only) ONLY="$2"; shift ;;
    --full) FULL="--full" ;;
    --trace) TRACE=1 ;;
    -*) echo "$usage" >&2; exit 1 ;;
    *) variants+=("$1") ;;
  esac
  shift
done
if [[ -z $ONLY || ${#variants[@]} -lt 2 ]]; then
  echo "$usage (at least two variants)" >&2
  exit 1
fi
names=()
for variant in "${variants[@]}"; do
  name="${variant%%=*}"
  if [[ ! $name =~ ^[A-Za-z0-9_.-]+$ ]]; then
    echo "variant name '$name': letters, digits, '.', '_' and '-' only" >&2
    exit 1
  fi
  if [[ $variant == *=* ]]; then
    location="${variant#*=}"
    for directory in "${location%%:*}" "${location#*:}"; do
      if [[ ! -d $directory ]]; then
        echo "variant $name: directory '$directory' does not exist" >&2
        exit 1
      fi
    done
    if [[ $location == *:* && ! -f ${location%%:*}/CMakeLists.txt && ! -x ${location%%:*}/attnplan ]]; then
      echo "variant $name: '${location%%:*}' before ':' must be a build (holding attnplan) or a source tree" >&2
      exit 1
    fi
  fi
  names+=("$name")
done

WORK="$OUT/ab"
mkdir -p "$WORK"
# This checkout's build and the source trees (NAME=TREE[:DIR]) at once: each tree is built into
# TREE/build-gpu and from then on runs as a NAME=BUILD[:DIR] variant. Each build's log is its own.
builds=("$BUILD") logs=("$WORK/build.log") sources=("$BENCH_ROOT")
for i in "${!variants[@]}"; do
  name="${variants[$i]%%=*}"
  location="${variants[$i]#*=}"
  tree="${location%%:*}"
  if [[ ${variants[$i]} == *=* && -f $tree/CMakeLists.txt ]]; then
    # A tree that two variants name (TREE and TREE:DIR) builds once.
    [[ " ${builds[*]} " == *" $tree/build-gpu "* ]] ||
      { builds+=("$tree/build-gpu") logs+=("$WORK/build-$name.log") sources+=("$tree"); }
    variants[i]="$name=$tree/build-gpu${location:${#tree}}"
  fi
done
pids=()
for i in "${!builds[@]}"; do
  echo "== building ${builds[$i]} from ${sources[$i]}"
  build_attnplan "${builds[$i]}" "${logs[$i]}" "${sources[$i]}" &
  pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[[ $failed == 0 ]] || exit 1
python3 "$ROOT/tools/bench_matrix.py" rows "$WORK" ${FULL:+"$FULL"} --only "$ONLY" >"$WORK/runs.txt" || exit 1
echo "== $(wc -l <"$WORK/runs.txt") runs x ${#variants[@]} variants x $ROUNDS rounds"

# Sets `name`, `binary` and `environment` (the command prefix) for variant $1.
resolve_variant() {
  local variant="$1" location
  name="${variant%%=*}"
  binary="$BUILD/attnplan"
  environment=(env -u ATTNPLAN_TEMPLATE_DIR)
  if [[ $variant == *=* ]]; then
    location="${variant#*=}"
    if [[ $location == *:* ]]; then
      binary="${location%%:*}/attnplan"  # another build's host code with these templates
      environment=(env "ATTNPLAN_TEMPLATE_DIR=${location#*:}")
    elif [[ -f $location/attnplan && -x $location/attnplan ]]; then
      binary="$location/attnplan"  # another build: its own host code and embedded templates
    else
      environment=(env "ATTNPLAN_TEMPLATE_DIR=$location")
    fi
  fi
}

start_clock_log "$WORK/clocks.csv"
trap stop_clock_log EXIT
start=$SECONDS
for ((round = 1; round <= ROUNDS; ++round)); do
  for ((i = 0; i < ${#variants[@]}; ++i)); do
    resolve_variant "${variants[$(((i + round - 1) % ${#variants[@]}))]}"
    mkdir -p "$WORK/$name"
    while read -r id config rest; do
      # shellcheck disable=SC2086  # rest is the run's own argument list
      if ! "${environment[@]}" "$binary" bench "$config" $rest --iterations "$ITERATIONS" --json \
             >"$WORK/$name/$id.r$round.json" 2>"$WORK/$name/$id.r$round.log"; then
        printf 'round %d %-10s %-40s FAILED: %s\n' "$round" "$name" "$id" \
          "$(tail -1 "$WORK/$name/$id.r$round.log")"
        rm -f "$WORK/$name/$id.r$round.json"
      fi
    done <"$WORK/runs.txt"
  done
  echo "round $round done ($((SECONDS - start)) s)"
done

if [[ -n $TRACE ]]; then
  : >"$OUT/ab-trace.md"
  for variant in "${variants[@]}"; do
    resolve_variant "$variant"
    while read -r id config rest; do
      [[ $id == attn-* ]] || continue
      trace="$WORK/$name/$id.trace.json"
      echo "== $name $id" >>"$OUT/ab-trace.md"
      # shellcheck disable=SC2086  # rest is the run's own argument list
      if "${environment[@]}" "$binary" bench "$config" $rest --iterations 5 --trace-attention "$trace" \
           >/dev/null 2>"$WORK/$name/$id.trace.log"; then
        python3 "$ROOT/tools/attention_trace.py" "$trace" >>"$OUT/ab-trace.md" 2>&1
      else
        echo "no trace: $(tail -1 "$WORK/$name/$id.trace.log")" >>"$OUT/ab-trace.md"
      fi
    done <"$WORK/runs.txt"
  done
  echo "== traces: $OUT/ab-trace.md"
fi

stop_clock_log
{
  machine_lines
  clock_summary "$WORK/clocks.csv"
  echo "variants: ${variants[*]}; $ROUNDS rounds of $ITERATIONS runs (attnplan bench medians)"
  echo
  python3 "$ROOT/tools/bench_matrix.py" ab "$WORK" "${names[@]}"
} >"$OUT/ab.md"
cat "$OUT/ab.md"
! grep -q "no result" "$OUT/ab.md"
