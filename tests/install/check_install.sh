#!/usr/bin/env bash
# Installs the build into a fresh prefix, then configures, builds and runs docs/examples/host_engine
# against that prefix only, as a host engine would: proves that `cmake --install` plus
# find_package(attnplan) give a working attnplan::runtime (headers, libraries, dependencies).
#
#   check_install.sh SOURCE_DIR BUILD_DIR CMAKE GENERATOR CXX_COMPILER
set -euo pipefail

source_dir="$1"
build_dir="$2"
cmake="$3"
generator="$4"
cxx="$5"

scratch="$(mktemp -d "${TMPDIR:-/tmp}/attnplan-install.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT

"$cmake" --install "$build_dir" --prefix "$scratch/prefix" >"$scratch/install.log"
test -x "$scratch/prefix/bin/attnplan"
test -f "$scratch/prefix/include/attnplan/plan/runtime.hpp"
test -f "$scratch/prefix/include/attnplan/params.h"

# Only the prefix: the example must not see the source or build tree.
"$cmake" -S "$source_dir/docs/examples/host_engine" -B "$scratch/build" -G "$generator" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  >"$scratch/configure.log" || { cat "$scratch/configure.log"; exit 1; }
"$cmake" --build "$scratch/build" >"$scratch/build.log" || { cat "$scratch/build.log"; exit 1; }

# libcuda must never be a link dependency, even of a consumer.
if readelf -d "$scratch/build/host_engine" | grep -q 'libcuda\.so'; then
  echo "host_engine links libcuda" >&2
  exit 1
fi

ATTNPLAN_CACHE_DIR="$scratch/cache" "$scratch/build/host_engine" "$source_dir/plans/llama-3.1-8b.json"
