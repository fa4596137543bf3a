#!/usr/bin/env bash
# Installs what is missing, builds, and compiles the example plan (Llama-3.1-8B) into the cubin cache.
# Needs no GPU. Run it twice: the second run is all cache hits.
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
"$BUILD_DIR/attnplan" compile "$ROOT/plans/llama-3.1-8b.json" "$@"
