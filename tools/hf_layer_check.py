#!/usr/bin/env python3
"""One attention layer of a HF transformers model against `attnplan run`, on the GPU machine.

For each model family it builds a small model with random weights from its HF config class (no hub
access needed), saves layer 0's weights exactly as HF names them (`model.layers.0.*`), a random input,
and the layer's attention output computed by HF itself (input_layernorm -> self_attn, which ends with
o_proj). Then it runs `attnplan run` on the same files and prints the relative L2 error of attnplan's
output against HF's float32 result, beside the error of HF's own bf16 run (the floor for any bf16 code).

usage: hf_layer_check.py ATTNPLAN_BINARY WORKDIR
"""
import json
import math
import os
import subprocess
import sys

import torch
from safetensors.torch import save_file, load_file


def rel_l2(ref, got):
    ref = ref.double()
    got = got.double()
    return (torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref)).item()


def families():
    from transformers import LlamaConfig, Qwen3Config
    yield "llama3", LlamaConfig(
        hidden_size=512, intermediate_size=1024, num_hidden_layers=1, num_attention_heads=8,
        num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
        max_position_embeddings=131072, vocab_size=128), {
        "schema": "attnplan/v1", "name": "tiny llama3", "hidden_size": 512, "query_heads": 8, "kv_heads": 2,
        "head_dim": 64, "input_norm": {"epsilon": 1e-5},
        "rotary": {"theta": 500000.0, "scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0, "original_max_position": 8192}}}
    yield "qwen3", Qwen3Config(
        hidden_size=512, intermediate_size=1024, num_hidden_layers=1, num_attention_heads=8,
        num_key_value_heads=4, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
        max_position_embeddings=40960, vocab_size=128), {
        "schema": "attnplan/v1", "name": "tiny qwen3", "hidden_size": 512, "query_heads": 8, "kv_heads": 4,
        "head_dim": 128, "input_norm": {"epsilon": 1e-6}, "qkv_norm": {"query": True, "key": True},
        "rotary": {"theta": 1000000.0}}


def hf_attention_output(model, hidden):
    """input_layernorm -> self_attn (ends with o_proj), causal, positions 0..T-1."""
    inner = model.model
    layer = inner.layers[0]
    tokens = hidden.shape[1]
    positions = torch.arange(tokens, device=hidden.device)[None]
    normed = layer.input_layernorm(hidden)
    cos_sin = inner.rotary_emb(normed, positions)
    mask = torch.full((tokens, tokens), float("-inf"), device=hidden.device, dtype=hidden.dtype).triu(1)
    out = layer.self_attn(hidden_states=normed, position_embeddings=cos_sin, attention_mask=mask[None, None])
    return out[0][0]


def main():
    binary, workdir = sys.argv[1], sys.argv[2]
    os.makedirs(workdir, exist_ok=True)
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM
    failures = 0
    for name, hf_config, attnplan_config in families():
        hf_config._attn_implementation = "eager"
        model = AutoModelForCausalLM.from_config(hf_config, torch_dtype=torch.bfloat16).cuda().eval()
        with torch.no_grad():
            for p in model.parameters():  # HF init leaves norms at 1: make every weight matter
                p.add_(torch.randn_like(p) * 0.02)
        tokens = 77
        hidden = torch.randn(1, tokens, hf_config.hidden_size, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            bf16_out = hf_attention_output(model, hidden)
            reference = hf_attention_output(model.float(), hidden.float())
        weights = {k: v.to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()
                   if k.startswith("model.layers.0.") and (".self_attn." in k or "input_layernorm" in k)}
        paths = {part: os.path.join(workdir, f"{name}-{part}") for part in
                 ["config.json", "weights.safetensors", "input.safetensors", "output.safetensors"]}
        save_file(weights, paths["weights.safetensors"])
        save_file({"hidden_states": hidden[0].cpu().contiguous()}, paths["input.safetensors"])
        with open(paths["config.json"], "w") as f:
            json.dump(attnplan_config, f, indent=2)
        command = [binary, "run", paths["config.json"], "--weights", paths["weights.safetensors"],
                   "--layer", "model.layers.0.", "--input", paths["input.safetensors"],
                   "--output", paths["output.safetensors"]]
        print("$", " ".join(command), flush=True)
        result = subprocess.run(command, capture_output=True, text=True)
        print(result.stdout + result.stderr, flush=True)
        if result.returncode != 0:
            failures += 1
            continue
        ours = load_file(paths["output.safetensors"])["output"].cuda()
        error = rel_l2(reference, ours)
        floor = rel_l2(reference, bf16_out)
        ok = error < 1e-2
        failures += not ok
        print(f"{name}: attnplan vs HF fp32 {error:.2e}   HF bf16 vs HF fp32 {floor:.2e}   {'ok' if ok else 'FAIL'}",
              flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
