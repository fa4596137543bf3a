#!/usr/bin/env python3
"""Regenerates the hand-made seeds of corpus/safetensors and corpus/cache (the config seeds are copies
of plans/*.json plus a few broken documents). Each seed is small and aims at one branch of the reader:
valid files so the fuzzer starts from deep inside the format, and one of each kind of refusal.
Crash reproducers that fuzzing finds are added beside these by hand (named regression-*), not by this."""
import hashlib
import json
import pathlib
import struct

HERE = pathlib.Path(__file__).resolve().parent
# The key cache_fuzz.cpp files every input under: SHA-256 of "attnplan fuzz".
CACHE_KEY = hashlib.sha256(b"attnplan fuzz").hexdigest()


def safetensors(header, data=b"", pad=True):
    text = json.dumps(header, separators=(",", ":")).encode() if not isinstance(header, bytes) else header
    if pad:
        text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + data


def write_safetensors():
    out = HERE / "corpus" / "safetensors"
    out.mkdir(parents=True, exist_ok=True)
    seeds = {
        "valid-two-tensors": safetensors(
            {"__metadata__": {"format": "pt"},
             "q": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
             "k": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}},
            bytes(range(16))),
        "valid-scalar-and-empty": safetensors(
            {"s": {"dtype": "I64", "shape": [], "data_offsets": [0, 8]},
             "e": {"dtype": "F16", "shape": [0, 4], "data_offsets": [8, 8]}},
            bytes(8)),
        "valid-gap-and-trailing": safetensors(
            {"a": {"dtype": "U8", "shape": [3], "data_offsets": [4, 7]}}, bytes(12)),
        "valid-empty-header": safetensors({}),
        "invalid-terabyte-claim": safetensors(
            {"w": {"dtype": "F32", "shape": [1 << 20, 1 << 20, 256], "data_offsets": [0, 1 << 40]}}, bytes(8)),
        "invalid-shape-overflow": safetensors(
            {"w": {"dtype": "F64", "shape": [1 << 62, 1 << 62], "data_offsets": [0, 0]}}),
        "invalid-overlap": safetensors(
            {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
             "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}, bytes(8)),
        "invalid-offsets-past-end": safetensors(
            {"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}, bytes(4)),
        "invalid-bad-dtype": safetensors({"a": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}}, b"x"),
        "invalid-negative-shape": safetensors(
            {"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}),
        "invalid-deep-nesting": safetensors(b"{\"a\":" + b"[" * 40 + b"]" * 40 + b"}"),
        "invalid-header-length-past-end": struct.pack("<Q", 1 << 40) + b"{}",
        "invalid-short-file": b"\x02\x00\x00",
        "invalid-not-object": safetensors(b"[1,2]"),
    }
    for name, content in seeds.items():
        (out / f"{name}.safetensors").write_bytes(content)


def cache_input(manifest, cubin=None, ptx=None):
    text = manifest if isinstance(manifest, bytes) else json.dumps(manifest, indent=2).encode()
    if cubin is None:
        return text
    text += b"\0CUBIN\0" + cubin
    if ptx is not None:
        text += b"\0PTX\0" + ptx
    return text


def manifest_for(cubin, ptx=None, **overrides):
    manifest = {"format_version": 1, "key": CACHE_KEY, "name": "rmsnorm",
                "spec": {"head_dim": 128, "dtype": "bf16"},
                "cubin_sha256": hashlib.sha256(cubin).hexdigest(), "cubin_bytes": len(cubin),
                "created": "2026-01-31T12:34:56Z"}
    if ptx is not None:
        manifest["ptx_sha256"] = hashlib.sha256(ptx).hexdigest()
        manifest["ptx_bytes"] = len(ptx)
    manifest.update(overrides)
    return manifest


def write_cache():
    out = HERE / "corpus" / "cache"
    out.mkdir(parents=True, exist_ok=True)
    cubin = b"\x7fELF" + bytes(range(60))
    ptx = b".version 8.0\n.target sm_90a\n"
    seeds = {
        "valid": cache_input(manifest_for(cubin), cubin),
        "valid-with-ptx": cache_input(manifest_for(cubin, ptx), cubin, ptx),
        "invalid-ptx-mismatch": cache_input(manifest_for(cubin, ptx), cubin, ptx + b"//"),
        "invalid-sha-mismatch": cache_input(manifest_for(cubin, cubin_sha256="0" * 64), cubin),
        "invalid-size-mismatch": cache_input(manifest_for(cubin), cubin[:-1]),
        "invalid-wrong-key": cache_input(manifest_for(cubin, key="f" * 64), cubin),
        "invalid-format-version": cache_input(manifest_for(cubin, format_version=2), cubin),
        "invalid-bytes-negative": cache_input(manifest_for(cubin, cubin_bytes=-1), cubin),
        "invalid-bytes-string": cache_input(manifest_for(cubin, cubin_bytes="64"), cubin),
        "invalid-ptx-bytes-missing": cache_input(
            {k: v for k, v in manifest_for(cubin, ptx).items() if k != "ptx_bytes"}, cubin, ptx),
        "invalid-no-cubin": cache_input(manifest_for(cubin)),
        "invalid-not-object": cache_input(b"[1, 2, 3]", cubin),
        "invalid-syntax": cache_input(b"{\"format_version\": 1,", cubin),
    }
    for name, content in seeds.items():
        (out / f"{name}.bin").write_bytes(content)


if __name__ == "__main__":
    write_safetensors()
    write_cache()
