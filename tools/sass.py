#!/usr/bin/env python3
"""The SASS of a cubin on a machine without a matching toolkit disassembler, and a summary of its loops.

The development machines have CUDA 13.0's nvcc and ptxas but no cuobjdump or nvdisasm; the only nvdisasm a
distribution offers here (Debian's non-free nvidia-cuda-toolkit, CUDA 11.8; scripts/get_nvdisasm.sh fetches
it) does not read CUDA 13's cubins ("does not contain Cuda architecture information"). It does read their
machine code: this tool takes each kernel's `.text.<name>` section out of the cubin's ELF and disassembles
it raw (`nvdisasm -b SM90`), the arch from the ELF header. A toolkit that reads the cubin itself is used as
it is (`nvdisasm -c`). Branch targets are then offsets into the kernel's own text, as cuobjdump's are.

    tools/sass.py K.cubin                       # every kernel's SASS
    tools/sass.py K.cubin --loops               # each loop (a backward branch): instructions, HGMMAs, ...
    tools/sass.py --key 5d0c2a81 [--cache-dir D] --loops   # a cache entry, by key prefix (via attnplan)
    tools/sass.py A.cubin B.cubin --loops       # two builds of a kernel, loop by loop

--loops lists, for every backward branch, the span from its target to it (a loop body with every path of
its branches: the static lines, not the executed ones), with its HGMMA, MUFU.EX2, BRA, BAR and SYNCS counts,
in program order (an outer loop before those it holds), those under --min-lines lines (the barrier waits'
retry loops) left out. Session 60 compared the attention kernel's tile loop in three template variants
this way (docs/attention-notes.md "Session 60"). The disassembler: $NVDISASM, else `nvdisasm` on PATH, in
$CUDA_HOME/bin or /usr/local/cuda/bin, else where scripts/get_nvdisasm.sh puts it.

Exit status: 0, 1 when a cubin cannot be read or disassembled, 2 on a usage error.
"""
import argparse
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from collections import namedtuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where scripts/get_nvdisasm.sh extracts Debian's nvdisasm (kept out of the repository by .gitignore).
FETCHED = os.path.join(ROOT, ".tools", "nvdisasm", "usr", "bin", "nvdisasm")

Kernel = namedtuple("Kernel", "name code")
Instruction = namedtuple("Instruction", "offset text")
Loop = namedtuple("Loop", "start end lines counts")

_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_TARGET = re.compile(r"\bBRA\b[^;]*?0x([0-9a-f]+)")
COUNTED = ("HGMMA", "MUFU.EX2", "BRA", "BAR", "SYNCS")


class SassError(Exception):
    pass


def elf_kernels(data):
    """(sm, [Kernel]) of a cubin's bytes: the arch from the ELF header's flags and each `.text.<name>`
    section's machine code. Raises SassError for what is not a 64-bit little-endian ELF."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise SassError("not a 64-bit little-endian ELF file (a cubin)")
    abi_version = data[8]
    flags = struct.unpack_from("<I", data, 0x30)[0]
    # The arch field moved from the low byte (older ELF ABI versions) to the second one (version 8 on,
    # CUDA 12.x and later); sm_90a's flags 0x...5a.. read 90 there.
    sm = (flags >> 8) & 0xFF if abi_version >= 8 else flags & 0xFF
    section_offset = struct.unpack_from("<Q", data, 0x28)[0]
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, section_offset + i * entry_size) for i in range(count)]
    if names_index >= len(sections):
        raise SassError("no section-name table")
    names_at = sections[names_index][4]

    def name(offset):
        end = data.index(b"\0", names_at + offset)
        return data[names_at + offset:end].decode()

    kernels = []
    for section in sections:
        section_name = name(section[0])
        if section_name.startswith(".text."):
            offset, size = section[4], section[5]
            kernels.append(Kernel(section_name[len(".text."):], data[offset:offset + size]))
    return sm, kernels


def find_disassembler():
    """The nvdisasm to run, or None."""
    candidates = [os.environ.get("NVDISASM"), shutil.which("nvdisasm")]
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            candidates.append(os.path.join(root, "bin", "nvdisasm"))
    candidates.append(FETCHED)
    return first_executable(candidates)


def first_executable(candidates):
    """The first of `candidates` (None entries skipped) that is an executable file, or None."""
    return next((path for path in candidates if path and os.access(path, os.X_OK)), None)


def disassemble(path, nvdisasm):
    """[(kernel name, SASS text)] of the cubin at `path`: the cubin read by nvdisasm itself where it can,
    else each kernel's text section raw."""
    with open(path, "rb") as handle:
        data = handle.read()
    sm, kernels = elf_kernels(data)
    if not kernels:
        raise SassError(f"{path}: no .text section (no kernel)")
    whole = subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True)
    if whole.returncode == 0 and whole.stdout.strip():
        return split_functions(whole.stdout, [kernel.name for kernel in kernels])
    listings = []
    with tempfile.TemporaryDirectory() as work:
        for kernel in kernels:
            raw = os.path.join(work, "text.bin")
            with open(raw, "wb") as handle:
                handle.write(kernel.code)
            result = subprocess.run([nvdisasm, "-b", f"SM{sm}", raw], capture_output=True, text=True)
            if result.returncode != 0:
                raise SassError(f"{path}: nvdisasm -b SM{sm} failed on {kernel.name}: "
                                f"{result.stderr.strip() or result.stdout.strip()}")
            listings.append((kernel.name, result.stdout))
    return listings


def split_functions(text, names):
    """nvdisasm -c's listing of a whole cubin, one part per `.text.<name>` section it names; the whole
    listing under the first name when it names none."""
    parts, current = {}, None
    for line in text.splitlines(keepends=True):
        header = re.search(r"\.text\.([\w$.]+)", line)
        if header and header.group(1) in names:
            current = header.group(1)
        parts.setdefault(current if current is not None else names[0], []).append(line)
    return [(name, "".join(lines)) for name, lines in parts.items()]


def instructions(sass):
    """[Instruction] of a listing, in order, whitespace collapsed."""
    found = []
    for line in sass.splitlines():
        match = _LINE.match(line)
        if match:
            found.append(Instruction(int(match.group(1), 16), " ".join(match.group(2).split())))
    return found


def opcode(text):
    """`@!P0 BAR.ARV 0x6, 0x100` -> BAR.ARV."""
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else ""


def loops(listing):
    """[Loop] of a listing: every backward branch's span, in program order (an outer loop before the loops
    it holds), with the counts of COUNTED (an opcode counts for every entry it starts with: BAR for
    BAR.SYNC and BAR.ARV)."""
    at = {instruction.offset: i for i, instruction in enumerate(listing)}
    # ptxas puts a barrier wait's retry out of line, after the kernel's last EXIT: the wait again, and a
    # branch back into the code it came from. That branch returns; it closes no loop.
    last_exit = max((each.offset for each in listing if opcode(each.text) == "EXIT"), default=None)
    found = []
    for i, instruction in enumerate(listing):
        match = _TARGET.search(instruction.text)
        if not match:
            continue
        target = int(match.group(1), 16)
        if target > instruction.offset or target not in at:
            continue
        if last_exit is not None and instruction.offset > last_exit and target < last_exit:
            continue
        body = listing[at[target]:i + 1]
        counts = {name: sum(opcode(each.text).startswith(name) for each in body) for name in COUNTED}
        found.append(Loop(target, instruction.offset, len(body), counts))
    return sorted(found, key=lambda loop: (loop.start, -loop.lines))


def loop_lines(listing, top, min_lines=0):
    lines = [f"{'start':>8} {'end':>8} {'lines':>6} " + " ".join(f"{name:>8}" for name in COUNTED)]
    for loop in [loop for loop in loops(listing) if loop.lines >= min_lines][:top]:
        lines.append(f"{loop.start:#8x} {loop.end:#8x} {loop.lines:>6} "
                     + " ".join(f"{loop.counts[name]:>8}" for name in COUNTED))
    return lines


def find_attnplan():
    """The attnplan CLI that --key asks for a cache entry: $ATTNPLAN, else `attnplan` on PATH, else this
    checkout's build-gpu/ or build/."""
    candidates = [os.environ.get("ATTNPLAN"), shutil.which("attnplan"),
                  os.path.join(ROOT, "build-gpu", "attnplan"), os.path.join(ROOT, "build", "attnplan")]
    return first_executable(candidates)


def cubin_for_key(prefix, cache_dir, attnplan, work):
    """The cubin of the cache entry whose key starts with `prefix`, written under `work` by `attnplan cache
    show KEY --cubin` (the cache's layout, prefix rules and hash check stay the runtime's own)."""
    if attnplan is None:
        raise SassError("--key needs the attnplan CLI ($ATTNPLAN, PATH, build-gpu/ or build/)")
    if not re.fullmatch(r"[0-9a-f]+", prefix):
        raise SassError(f"--key {prefix!r}: a cache key is lowercase hex digits")
    path = os.path.join(work, f"{prefix}.cubin")
    command = [attnplan, "cache", "show", prefix, "--cubin", path]
    if cache_dir:
        command += ["--cache-dir", cache_dir]
    shown = subprocess.run(command, capture_output=True, text=True)
    if shown.returncode != 0:
        raise SassError(f"{' '.join(command[1:4])}: {shown.stderr.strip() or f'exit {shown.returncode}'}")
    return path


def print_kernels(paths, nvdisasm, args):
    """Each cubin's kernels: the listing, or with --loops a line per loop."""
    for path in paths:
        for name, sass in disassemble(path, nvdisasm):
            if args.loops:
                print(f"== {os.path.basename(path)}: {name}")
                print("\n".join(loop_lines(instructions(sass), args.top, args.min_lines)))
            else:
                print(f"// {os.path.basename(path)}: {name}")
                print(sass, end="" if sass.endswith("\n") else "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cubin", nargs="*", help="cubin files")
    parser.add_argument("--key", help="a cache key (or a prefix of one) instead of a file")
    parser.add_argument("--cache-dir",
                        help="the cache for --key (default: attnplan's, $ATTNPLAN_CACHE_DIR else ~/.cache/attnplan)")
    parser.add_argument("--loops", action="store_true", help="a line per loop instead of the listing")
    parser.add_argument("--top", type=int, default=40, help="loops shown per kernel (default 40)")
    parser.add_argument("--min-lines", type=int, default=16,
                        help="loops shorter than this left out (default 16: the barrier waits' retry loops)")
    args = parser.parse_args(argv)
    if bool(args.cubin) == bool(args.key):
        parser.error("give cubin files or --key, not both or neither")
    nvdisasm = find_disassembler()
    if nvdisasm is None:
        print("sass.py: no nvdisasm ($NVDISASM, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin or "
              "scripts/get_nvdisasm.sh's .tools/)", file=sys.stderr)
        return 1
    try:
        with tempfile.TemporaryDirectory() as work:
            paths = [cubin_for_key(args.key, args.cache_dir, find_attnplan(), work)] if args.key else args.cubin
            print_kernels(paths, nvdisasm, args)
    except (OSError, SassError, struct.error, ValueError) as error:
        print(f"sass.py: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
