"""Model folders for tests: the real configs in tests/fixtures/models, plus header-only safetensors.

A header-only .safetensors file is the real format's 8-byte length and JSON header, with tensor
names, dtypes and shapes as the published checkpoint has them, and no tensor data: enough for
anything that reads headers (estimate_memory.py, huggingface_hub's safetensors metadata).
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "models"
DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I64": 8}


def decoder_tensors(
    cfg: dict, dtype: str, qk_norm: str | None, extra_norms: tuple[str, ...] = (), lm_head: bool = True
) -> dict[str, tuple[str, list[int]]]:
    """Tensor shapes of a Llama-style decoder (Qwen3 / OLMo-2 naming)."""
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // heads
    t = {"model.embed_tokens.weight": (dtype, [vocab, h]), "model.norm.weight": (dtype, [h])}
    if lm_head:
        t["lm_head.weight"] = (dtype, [vocab, h])
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        t[f"{p}.self_attn.q_proj.weight"] = (dtype, [heads * hd, h])
        t[f"{p}.self_attn.k_proj.weight"] = (dtype, [kv * hd, h])
        t[f"{p}.self_attn.v_proj.weight"] = (dtype, [kv * hd, h])
        t[f"{p}.self_attn.o_proj.weight"] = (dtype, [h, heads * hd])
        if qk_norm == "head":
            t[f"{p}.self_attn.q_norm.weight"] = (dtype, [hd])
            t[f"{p}.self_attn.k_norm.weight"] = (dtype, [hd])
        elif qk_norm == "full":
            t[f"{p}.self_attn.q_norm.weight"] = (dtype, [heads * hd])
            t[f"{p}.self_attn.k_norm.weight"] = (dtype, [kv * hd])
        for proj, shape in (("gate_proj", [inter, h]), ("up_proj", [inter, h]), ("down_proj", [h, inter])):
            t[f"{p}.mlp.{proj}.weight"] = (dtype, shape)
        for norm in extra_norms:
            t[f"{p}.{norm}.weight"] = (dtype, [h])
    return t


def write_header_only_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape) in tensors.items():
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n * DTYPE_BYTES[dtype]]}
        offset += n * DTYPE_BYTES[dtype]
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def model_folder(name: str, dest: Path) -> Path:
    """Copy a fixture folder to dest/name, adding the header-only checkpoint where the model has one."""
    out = dest / name
    shutil.copytree(FIXTURES / name, out)
    cfg = json.loads((out / "config.json").read_text())
    if name == "Qwen3-0.6B":  # published file stores lm_head too, though embeddings are tied
        write_header_only_safetensors(
            out / "model.safetensors",
            decoder_tensors(cfg, "BF16", "head", ("input_layernorm", "post_attention_layernorm")),
        )
    elif name == "OLMo-2-0425-1B":  # float32 checkpoint
        write_header_only_safetensors(
            out / "model.safetensors",
            decoder_tensors(cfg, "F32", "full", ("post_attention_layernorm", "post_feedforward_layernorm")),
        )
    return out
