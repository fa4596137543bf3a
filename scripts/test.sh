#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite. GPU tests run when a CUDA device is
# present and are reported as skipped otherwise.
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$BUILD_DIR"
ctest --output-on-failure -j "$(nproc)" "$@"
