#!/usr/bin/env python3
"""Does the model fit in RAM? Weights + KV cache + a reserve, without downloading weights.

    python3 scripts/estimate_memory.py --model Qwen/Qwen3-0.6B --ram-gb 24 --max-model-len 4096 --num-prompts 1

On CPU, RAM is the ceiling: weights and the KV cache both live there. Sizes are GiB (2^30 bytes),
as vLLM reports them. Exit 0: fits (or no --ram-gb verdict asked); exit 1: does not fit, or an
error ({"error", "fix"}).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import hf_model  # noqa: E402
from common import GIB, ScriptError  # noqa: E402

KV_BYTES_BY_DTYPE = {"bfloat16": 2, "float16": 2, "float32": 4}  # no fp8 KV on this CPU path
KV_DTYPE_BYTES = KV_BYTES_BY_DTYPE["bfloat16"]
SLIDING_TYPES = {"sliding_attention", "chunked_attention", "local_attention"}
FULL_TYPES = {"full_attention", "attention", "global_attention"}

# ---------------------------------------------------------------- pure decisions


def kv_dtype_for(serve_dtype: str, default: str = "bfloat16") -> str:
    """vLLM's KV cache dtype "auto" follows the model's serving dtype: float32 serving keeps a float32
    KV cache (twice the bytes of bf16); there is no fp8 KV on this CPU path."""
    return serve_dtype if serve_dtype in KV_BYTES_BY_DTYPE else default


def text_config(cfg: dict) -> dict:
    """Multimodal configs keep the language model under a sub-key; older ones keep it at the top."""
    for key in ("text_config", "llm_config", "language_config"):
        sub = cfg.get(key)
        if isinstance(sub, dict) and sub.get("num_hidden_layers"):
            return {**cfg, **sub}
    return cfg


def _req_int(cfg: dict, *keys: str) -> int:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    raise ScriptError(f"config.json lacks {keys[0]} (a positive integer)",
                      "pass a complete transformers config, or --weight-gb plus a model with attention shapes")


def layer_split(cfg: dict, layers: int) -> tuple[int, int, int]:
    """(full-attention layers, sliding-window layers, layers with no per-token KV).

    Read from the config the way vLLM does: an explicit layer_types list first; then the hybrid
    patterns (NemotronH's hybrid_override_pattern, Jamba's attention period, Qwen3-Next's
    full_attention_interval); then Gemma-2 (alternating) and Gemma-3 (every Nth layer global);
    then a model-wide sliding_window (Mistral), unless use_sliding_window is false (Qwen2)."""
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        full = sum(t in FULL_TYPES for t in types)
        sliding = sum(t in SLIDING_TYPES for t in types)
        return full, sliding, len(types) - full - sliding
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        attn = pattern.count("*")
        return attn, 0, pattern.count("M")
    period, offset = cfg.get("attn_layer_period"), cfg.get("attn_layer_offset")
    if isinstance(period, int) and period > 0 and isinstance(offset, int):
        attn = sum(1 for i in range(layers) if i % period == offset)
        return attn, 0, layers - attn
    interval = cfg.get("full_attention_interval")
    if isinstance(interval, int) and interval > 0:
        attn = layers // interval
        return attn, 0, layers - attn
    window = cfg.get("sliding_window")
    if not window or cfg.get("use_sliding_window") is False:
        return layers, 0, 0
    if cfg.get("model_type") in ("gemma2",):
        sliding = (layers + 1) // 2  # even-indexed layers are local
        return layers - sliding, sliding, 0
    every = cfg.get("sliding_window_pattern")
    if isinstance(every, int) and every > 0:
        full = layers // every
        return full, layers - full, 0
    return 0, layers, 0


def kv_layout(cfg: dict, kv_dtype_bytes: int = KV_DTYPE_BYTES) -> dict:
    """Bytes of KV cache per token per attention layer, and how many layers hold it.

    MHA/GQA: K and V, kv_heads x head_dim each. MLA (DeepSeek): one compressed latent of
    kv_lora_rank + qk_rope_head_dim per layer, no separate K and V."""
    tc = text_config(cfg)
    layers = _req_int(tc, "num_hidden_layers", "n_layer", "num_layers")
    if tc.get("kv_lora_rank"):
        per_layer = (int(tc["kv_lora_rank"]) + int(tc.get("qk_rope_head_dim") or 0)) * kv_dtype_bytes
        attention = "mla"
    else:
        heads = _req_int(tc, "num_attention_heads", "n_head", "num_heads")
        kv_heads = tc.get("num_key_value_heads") or (1 if tc.get("multi_query") else heads)
        head_dim = tc.get("head_dim") or (_req_int(tc, "hidden_size", "n_embd", "d_model") // heads)
        per_layer = 2 * int(kv_heads) * int(head_dim) * kv_dtype_bytes
        attention = "gqa" if kv_heads < heads else "mha"
    full, sliding, none = layer_split(tc, layers)
    return {"attention": attention, "bytes_per_token_per_layer": per_layer, "full": full, "sliding": sliding,
            "none": none, "sliding_window": tc.get("sliding_window") if sliding else None,
            "bytes_per_token": per_layer * (full + sliding),
            "max_position_embeddings": tc.get("max_position_embeddings")}


def kv_bytes_for(layout: dict, seq_len: int, block: int) -> int:
    """KV bytes one sequence of seq_len tokens takes, in whole blocks; a sliding layer holds at most
    its window (plus the block being filled)."""
    blocks = math.ceil(seq_len / block)
    full_tokens = blocks * block
    sliding_tokens = full_tokens
    if layout["sliding"] and layout["sliding_window"]:
        sliding_tokens = min(full_tokens, (math.ceil(layout["sliding_window"] / block) + 1) * block)
    per = layout["bytes_per_token_per_layer"]
    return per * (layout["full"] * full_tokens + layout["sliding"] * sliding_tokens)


def fit(weight_bytes: int, layout: dict, max_model_len: int, num_prompts: int, ram_gb: float,
        os_reserve_gb: float, block: int, model_max: int | None) -> dict:
    """Weights + KV(max_model_len) x num_prompts + reserve <= RAM? If not, the longest context that
    fits (a multiple of the block size), or say that no context fits."""
    kv = kv_bytes_for(layout, max_model_len, block) * num_prompts
    required = weight_bytes + kv + os_reserve_gb * GIB
    ram = ram_gb * GIB
    out = {"max_model_len": max_model_len, "num_prompts": num_prompts, "weight_gb": common.gb(weight_bytes),
           "kv_needed_gb": common.gb(kv), "os_reserve_gb": os_reserve_gb, "required_gb": common.gb(required),
           "ram_gb": ram_gb, "fits": required <= ram}
    if out["fits"]:
        return out
    budget = ram - weight_bytes - os_reserve_gb * GIB
    ceiling = (model_max or max_model_len) // block
    lo, hi = 0, min(ceiling, max_model_len // block)
    while lo < hi:  # largest number of blocks whose KV fits the budget
        mid = (lo + hi + 1) // 2
        if kv_bytes_for(layout, mid * block, block) * num_prompts <= budget:
            lo = mid
        else:
            hi = mid - 1
    if lo == 0:
        out["suggested_max_model_len"] = None
        out["action"] = ("weights alone exceed RAM -- use a smaller model" if budget <= 0 else
                         f"not even {block} tokens of KV fit at {num_prompts} concurrent prompts -- "
                         "lower --num-prompts or use a smaller model")
    else:
        out["suggested_max_model_len"] = lo * block
        out["action"] = f"lower --max-model-len to {lo * block} (or lower --num-prompts), or use a smaller model"
    return out


# ---------------------------------------------------------------- main

def main(argv: Sequence[str] | None = None):
    epyc = common.load_epyc()
    p = common.JsonArgumentParser(prog="scripts/estimate_memory.py", description=__doc__.split("\n")[0])
    p.add_argument("--model", "--model-id", dest="model", default=epyc["default_model"],
                   help="Hub id or local folder; --model-id is the old name, kept for one release")
    p.add_argument("--revision", default=None)
    p.add_argument("--ram-gb", type=common.float_in(0, 1 << 20, lo_open=True), help="RAM to fit in: ram_gb from detect.py or "
                   "socket_ram_gb from cpu_tune.py; without it no verdict is given")
    p.add_argument("--max-model-len", type=common.int_in(16, 1 << 24), default=epyc["serve"]["default_max_model_len"])
    p.add_argument("--num-prompts", type=common.int_in(1, 65536), default=1, help="concurrent sequences at full length")
    p.add_argument("--weight-gb", type=common.float_in(0, 65536, lo_open=True), help="override the weight size (GiB)")
    p.add_argument("--os-reserve-gb", type=common.float_in(0, 65536), default=epyc["memory"]["os_reserve_gb"],
                   help="RAM kept for the OS and vLLM's own process (default %(default)s)")
    p.add_argument("--dtype", choices=epyc["precision"]["supported"], default=epyc["precision"]["default"])
    p.add_argument("--hub-timeout", type=common.float_in(0, 3600, lo_open=True), default=60, help="overall deadline for Hub requests, seconds")
    p.add_argument("--config", type=common.nonempty, help="a config.json to size from, offline (no Hub, no folder); "
                   "needs --weight-gb")
    args = p.parse_args(argv)
    if args.config and not args.weight_gb:
        raise ScriptError("--config sizes the KV cache from a config.json alone: the weights are unknown",
                          "add --weight-gb N (the checkpoint size in GiB, e.g. from the model card)")

    notes: list[str] = []
    kv_dtype = kv_dtype_for(args.dtype, epyc["precision"]["kv_cache_dtype"])

    def read() -> tuple[dict, int, str]:
        if args.config:  # planning for a model this machine cannot download: its config.json is enough
            cfg = common.read_json_input(args.config, "config.json")
            common.check_schema(cfg, "model_config", f"{args.config} has a value of the wrong type or range",
                                "pass the model's unmodified config.json")
        else:
            files = hf_model.resolve(args.model, args.revision)
            cfg = files.config()
        # a config without attention shapes is an error before any weight lookup
        layout = kv_layout(cfg, KV_BYTES_BY_DTYPE[kv_dtype])
        tied = bool(text_config(cfg).get("tie_word_embeddings", False))
        if args.weight_gb:
            return layout, int(args.weight_gb * GIB), "override"
        found = files.weights(args.dtype, tied)
        if found is None:
            raise ScriptError(f"{args.model}: no safetensors metadata or weight files to size the weights",
                              "pass --weight-gb N (the checkpoint size in GiB)")
        return layout, *found

    try:
        layout, weights, source = hf_model.with_deadline(read, args.hub_timeout)
    except hf_model.Unreadable as why:
        raise ScriptError(why.message, why.fix)
    if source == "safetensors_index_total_size":
        notes.append("weights from the index's total_size: stored dtype, not cast to --dtype")
    notes.append(epyc["precision"]["kv_note"])

    model_max = layout["max_position_embeddings"]
    max_len = args.max_model_len
    if model_max and max_len > model_max:
        notes.append(f"--max-model-len {max_len} exceeds the model's max_position_embeddings {model_max}; "
                     f"capped to {model_max}")
        max_len = model_max
    if layout["none"]:
        notes.append(f"{layout['none']} layers keep a fixed recurrent state per sequence (linear attention / "
                     "mamba), not per-token KV; it is small and not counted here")
    block = epyc["serve"]["kv_block_size_mla"] if layout["attention"] == "mla" else epyc["serve"]["kv_block_size"]
    per_sequence = kv_bytes_for(layout, max_len, block)
    doc = {
        "model": args.model,
        "dtype": args.dtype,
        "weight_gb": common.gb(weights),
        "weight_bytes": weights,
        "weight_source": source,
        "kv_dtype": kv_dtype,
        "kv_attention": layout["attention"],
        "kv_bytes_per_token": layout["bytes_per_token"],
        "kv_layers": {"full": layout["full"], "sliding": layout["sliding"], "none": layout["none"],
                      "sliding_window": layout["sliding_window"]},
        "kv_block_size": block,
        "model_max_seq_len": model_max,
        "kv_needed_gb_per_sequence": common.gb(per_sequence, 3),
        "kv_bytes_per_sequence": per_sequence,
        "notes": notes,
    }
    if args.ram_gb is None:
        return doc, common.EXIT_OK
    verdict = fit(weights, layout, max_len, args.num_prompts, args.ram_gb, args.os_reserve_gb, block, model_max)
    doc["fit"] = verdict
    if not verdict["fits"]:
        doc.update(error=f"does not fit: {verdict['required_gb']} GiB required vs {verdict['ram_gb']} GiB of RAM",
                   fix=verdict["action"])
    return doc, common.EXIT_OK if verdict["fits"] else common.EXIT_FAIL


if __name__ == "__main__":
    sys.exit(common.run_main(main))
