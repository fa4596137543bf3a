# Sourced by scripts/quickstart.sh and scripts/test.sh: makes sure the build dependencies are present
# (installing them through apt when running as root, otherwise printing the one line to run), then
# configures and builds attnplan into $ATTNPLAN_BUILD_DIR (default: build/).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${ATTNPLAN_BUILD_DIR:-$ROOT/build}"
DEBIAN_PACKAGES=(cmake ninja-build g++ libfmt-dev nlohmann-json3-dev catch2)

missing_packages() {
  local missing=()
  for package in "${DEBIAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
  done
  echo "${missing[@]:-}"
}

install_dependencies() {
  if ! command -v dpkg-query >/dev/null; then
    echo "attnplan: not a Debian/Ubuntu system; install cmake, ninja, a C++20 compiler, fmt, nlohmann-json and Catch2" >&2
    return 0
  fi
  local missing
  missing="$(missing_packages)"
  if [[ -n "$missing" ]]; then
    if [[ "$(id -u)" == 0 ]]; then
      echo "attnplan: installing $missing" >&2
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
    else
      echo "attnplan: missing packages; run:" >&2
      echo "  sudo apt-get install -y $missing" >&2
      exit 1
    fi
  fi
}

find_cuda() {
  # NVRTC comes with the CUDA toolkit (not a Debian package of a recent enough version).
  for root in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    if [[ -n "$root" && -f "$root/include/nvrtc.h" ]]; then
      CUDA_ROOT="$root"
      return 0
    fi
  done
  echo "attnplan: the CUDA toolkit (12.x or 13.x, with NVRTC) was not found in \$CUDA_HOME, \$CUDA_PATH or /usr/local/cuda;" >&2
  echo "  install it from NVIDIA's CUDA repository, then: export CUDA_HOME=/usr/local/cuda" >&2
  exit 1
}

configure_and_build() {
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCUDAToolkit_ROOT="$CUDA_ROOT" -DATTNPLAN_WERROR="${ATTNPLAN_WERROR:-OFF}" >/dev/null
  cmake --build "$BUILD_DIR" -j "$(nproc)"
}

install_dependencies
find_cuda
configure_and_build
