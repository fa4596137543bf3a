# Sourced by scripts/quickstart.sh and scripts/test.sh: makes sure the build dependencies are present
# (installing them through apt when running as root, otherwise printing the one line to run), then
# configures and builds attnplan into $ATTNPLAN_BUILD_DIR (default: build/).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${ATTNPLAN_BUILD_DIR:-$ROOT/build}"
DEBIAN_PACKAGES=(cmake ninja-build g++ libfmt-dev nlohmann-json3-dev catch2)
# shellcheck source=lib.sh
source "$ROOT/scripts/lib.sh"

configure_and_build() {
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCUDAToolkit_ROOT="$CUDA_ROOT" -DATTNPLAN_WERROR="${ATTNPLAN_WERROR:-OFF}" >/dev/null
  cmake --build "$BUILD_DIR" -j "$(nproc)"
}

ensure_debian_packages "${DEBIAN_PACKAGES[@]}"
find_cuda
configure_and_build
