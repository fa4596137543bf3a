#!/usr/bin/env bash
# Fetches a SASS disassembler for a development machine whose CUDA toolkit has none (nvcc and ptxas, no
# cuobjdump or nvdisasm): Debian's non-free nvidia-cuda-toolkit package (CUDA 11.8) is downloaded, not
# installed (its dependencies are gigabytes), and its nvdisasm and cuobjdump are extracted under .tools/
# (ignored by git). CUDA 11.8's nvdisasm cannot read CUDA 13's cubins, but reads their machine code:
# tools/sass.py feeds it each kernel's text section (`nvdisasm -b SM90`) and finds it there.
#
#   scripts/get_nvdisasm.sh && tools/sass.py K.cubin --loops
#
# Debian keeps the package in the non-free component. Run as root where the apt sources list only main,
# the script adds a sources file for bookworm's contrib and non-free (/etc/apt/sources.list.d/
# attnplan-non-free.sources) and says so; otherwise it prints what to do. Nothing is installed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/.tools/nvdisasm"
if [[ -x "$DEST/usr/bin/nvdisasm" ]]; then
  echo "attnplan: $DEST/usr/bin/nvdisasm is there"
  exit 0
fi
if ! apt-cache policy nvidia-cuda-toolkit 2>/dev/null | grep -q "Candidate: [0-9]"; then
  if [[ "$(id -u)" != 0 ]]; then
    echo "attnplan: apt does not know nvidia-cuda-toolkit (Debian's non-free component); enable non-free in" >&2
    echo "  the apt sources, run apt-get update, then run this again" >&2
    exit 1
  fi
  codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")"
  list=/etc/apt/sources.list.d/attnplan-non-free.sources
  echo "attnplan: adding Debian's contrib and non-free components for $codename ($list)" >&2
  printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: contrib non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$codename" > "$list"
  apt-get update -qq
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
chown _apt "$work" 2>/dev/null || chmod 777 "$work"  # apt downloads as its own user where it can
(cd "$work" && apt-get download -qq nvidia-cuda-toolkit)
mkdir -p "$DEST"
dpkg-deb --fsys-tarfile "$work"/nvidia-cuda-toolkit_*.deb |
  tar -x -C "$DEST" ./usr/bin/nvdisasm ./usr/bin/cuobjdump
"$DEST/usr/bin/nvdisasm" --version | tail -1
echo "attnplan: nvdisasm in $DEST/usr/bin (tools/sass.py finds it there)"
