# Shell functions shared by scripts/setup.sh and tools/fuzz.sh. Source it; it runs nothing by itself.

# ensure_debian_packages PACKAGE...: installs the missing ones through apt when running as root,
# otherwise prints the one line to run and exits 1. Where dpkg is absent (not Debian/Ubuntu) it only says
# what must be there.
ensure_debian_packages() {
  if ! command -v dpkg-query >/dev/null; then
    echo "attnplan: not a Debian/Ubuntu system; make sure the equivalents of these are installed: $*" >&2
    return 0
  fi
  local missing=()
  for package in "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
  done
  [[ ${#missing[@]} == 0 ]] && return 0
  if [[ "$(id -u)" == 0 ]]; then
    echo "attnplan: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "attnplan: missing packages; run:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
}

# find_cuda: sets CUDA_ROOT to the first of $CUDA_HOME, $CUDA_PATH, /usr/local/cuda holding NVRTC's
# header, or exits 1 saying how to install it. NVRTC comes with the CUDA toolkit (Debian's
# nvidia-cuda-toolkit is too old), and the project configures only with it present.
find_cuda() {
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
