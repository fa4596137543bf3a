#!/usr/bin/env python3
"""Host tests of tools/sass.py (no GPU): the cubin's ELF read for its arch and kernel text sections (a
hand-built ELF), the loops of a listing (nested, a retry stub after the last EXIT, predicated barriers),
the cache-key lookup (through a stand-in attnplan CLI); and, where an nvdisasm and ptxas are present, a
real kernel with one loop through the raw-text path.

  python3 tests/tools/sass_test.py
"""
import contextlib
import io
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import sass  # noqa: E402


def elf(sections, flags, abi_version):
    """A minimal 64-bit little-endian ELF: a null section, the section-name table, then `sections`
    [(name, bytes)]."""
    names = b"\0.shstrtab\0" + b"".join(name.encode() + b"\0" for name, _ in sections)
    header_size, entry_size = 64, 64
    body = names
    placed = []  # (name offset, data offset, size)
    name_offset = len(b"\0.shstrtab\0")
    for name, data in sections:
        placed.append((name_offset, header_size + len(body), len(data)))
        body += data
        name_offset += len(name) + 1
    section_offset = header_size + len(body)
    header = bytearray(header_size)
    header[0:4] = b"\x7fELF"
    header[4], header[5], header[6], header[7], header[8] = 2, 1, 1, 0x41, abi_version
    struct.pack_into("<Q", header, 0x28, section_offset)
    struct.pack_into("<I", header, 0x30, flags)
    struct.pack_into("<HHH", header, 0x3A, entry_size, 2 + len(sections), 1)
    table = bytearray(entry_size)  # the null section
    table += struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, header_size, len(names), 0, 0, 1, 0)
    for name_at, data_at, size in placed:
        table += struct.pack("<IIQQQQIIQQ", name_at, 1, 6, 0, data_at, size, 0, 0, 128, 0)
    return bytes(header) + body + bytes(table)


LISTING = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;
        /*0020*/              @!P0 BRA 0x300 ;
        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc [UR20], RZ, !UPT ;
        /*0040*/                   MUFU.EX2 R24, R24 ;
        /*0050*/              @!P1 BAR.ARV 0x6, 0x100 ;
        /*0060*/              @P2 BRA 0x30 ;
        /*0070*/                   BAR.SYNC.DEFER_BLOCKING 0x7, 0x100 ;
        /*0080*/              @P3 BRA 0x10 ;
        /*0090*/                   EXIT ;
        /*0300*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;
        /*0310*/              @!P0 BRA 0x300 ;
        /*0320*/                   BRA 0x30 ;
"""


class SassTest(unittest.TestCase):
    def test_the_elf_gives_its_arch_and_kernels(self):
        data = elf([(".nv.info", b"\1\2"), (".text.kernel_a", b"\x10" * 32), (".text.kernel_b", b"\x20" * 16)],
                   flags=0x6005A04, abi_version=8)
        sm, kernels = sass.elf_kernels(data)
        self.assertEqual(sm, 90)
        self.assertEqual([(k.name, k.code) for k in kernels],
                         [("kernel_a", b"\x10" * 32), ("kernel_b", b"\x20" * 16)])
        # Before ELF ABI version 8 the arch is the flags' low byte.
        self.assertEqual(sass.elf_kernels(elf([(".text.k", b"\0" * 16)], 0x500550, 7))[0], 0x50)
        with self.assertRaises(sass.SassError):
            sass.elf_kernels(b"// PTX, not a cubin\n" + b"\0" * 64)

    def test_loops_nested_and_the_retry_stub_left_out(self):
        listing = sass.instructions(LISTING)
        self.assertEqual(len(listing), 13)
        self.assertEqual(listing[5], sass.Instruction(0x50, "@!P1 BAR.ARV 0x6, 0x100"))
        loops = sass.loops(listing)
        # The stub's self-loop (0x300-0x310) is a loop; its branch back to 0x30 returns and is none.
        self.assertEqual([(loop.start, loop.end, loop.lines) for loop in loops],
                         [(0x10, 0x80, 8), (0x30, 0x60, 4), (0x300, 0x310, 2)])
        outer, inner = loops[0], loops[1]
        self.assertEqual(outer.counts, {"HGMMA": 1, "MUFU.EX2": 1, "BRA": 3, "BAR": 2, "SYNCS": 1})
        self.assertEqual(inner.counts, {"HGMMA": 1, "MUFU.EX2": 1, "BRA": 1, "BAR": 1, "SYNCS": 0})
        lines = sass.loop_lines(listing, top=5, min_lines=3)
        self.assertEqual(len(lines), 3)  # the header and the two loops of 3 lines or more
        self.assertEqual(lines[1].split()[:3], ["0x10", "0x80", "8"])

    def test_a_cache_key_is_asked_of_the_attnplan_cli(self):
        with tempfile.TemporaryDirectory() as work:
            # A stand-in CLI: records its arguments, writes the --cubin file for key 5d0c2a..., else fails
            # as attnplan does for a prefix that names no entry.
            fake = os.path.join(work, "attnplan")
            with open(fake, "w") as handle:
                handle.write('#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\n'
                             'case "$3" in 5d0c2a*) printf cubin > "$5";; '
                             '*) echo "input error: no cache entry starts with $3" >&2; exit 1;; esac\n')
            os.chmod(fake, 0o755)
            path = sass.cubin_for_key("5d0c2a", "/tmp/c", fake, work)
            with open(path) as handle:
                self.assertEqual(handle.read(), "cubin")
            with open(os.path.join(work, "args")) as handle:
                self.assertEqual(handle.read().split(),
                                 ["cache", "show", "5d0c2a", "--cubin", path, "--cache-dir", "/tmp/c"])
            with self.assertRaisesRegex(sass.SassError, "no cache entry starts with 77"):
                sass.cubin_for_key("77", None, fake, work)
            with self.assertRaisesRegex(sass.SassError, "hex digits"):
                sass.cubin_for_key("../x", None, fake, work)
            with self.assertRaisesRegex(sass.SassError, "needs the attnplan CLI"):
                sass.cubin_for_key("5d0c2a", None, None, work)

    def test_split_functions(self):
        text = ".section .text.a\n  /*0000*/ NOP ;\n.section .text.b\n  /*0000*/ EXIT ;\n"
        self.assertEqual([name for name, _ in sass.split_functions(text, ["a", "b"])], ["a", "b"])

    @unittest.skipUnless(sass.find_disassembler() and shutil.which("ptxas"), "needs nvdisasm and ptxas")
    def test_a_real_kernel_through_the_raw_text(self):
        ptx = """.version 8.0
.target sm_90a
.address_size 64
.visible .entry spin(.param .u64 out, .param .u32 n) {
  .reg .pred %p; .reg .b32 %r<4>; .reg .b64 %rd<3>; .reg .f32 %f<3>;
  ld.param.u64 %rd1, [out]; ld.param.u32 %r1, [n]; mov.u32 %r2, 0; mov.f32 %f1, 0f3F800000;
LOOP:
  ex2.approx.f32 %f1, %f1; add.u32 %r2, %r2, 1; setp.lt.u32 %p, %r2, %r1; @%p bra LOOP;
  cvta.to.global.u64 %rd2, %rd1; st.global.f32 [%rd2], %f1; ret;
}
"""
        with tempfile.TemporaryDirectory() as work:
            source, cubin = os.path.join(work, "spin.ptx"), os.path.join(work, "spin.cubin")
            with open(source, "w") as handle:
                handle.write(ptx)
            subprocess.run(["ptxas", "-arch=sm_90a", source, "-o", cubin], check=True)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(sass.main([cubin, "--loops", "--min-lines", "1"]), 0)
            lines = out.getvalue().splitlines()
            self.assertEqual(lines[0], "== spin.cubin: spin")
            # The loop of exponentials (ptxas may unroll it: one MUFU.EX2 or more).
            self.assertTrue(any(int(line.split()[4]) >= 1 for line in lines[2:]), lines)


if __name__ == "__main__":
    unittest.main()
