"""Sizing one model: its weights, its KV cache per sequence, and whether both fit in RAM."""

from __future__ import annotations

from dataclasses import dataclass

from epyc import bundle
from epyc.bundle import GIB
from epyc.decisions import forecast, kv_budget
from epyc.errors import ScriptError
from epyc.facts import cpuid, hf_model, kv_cache, quantization
from epyc.facts.model_params import (
    config_params,
    config_weight_bytes,
    idle_expert_params,
    replicated_params,
    weight_floor,
)

STORED_SIZES = ("safetensors_index_total_size", "weight_file_sizes")


@dataclass
class Request:
    """What estimate_memory.py was asked: the model (or an offline config.json) and the serve to size."""

    model: str
    revision: str | None
    dtype: str
    max_model_len: int
    num_prompts: int
    max_num_batched_tokens: int
    os_reserve_gb: float
    hub_timeout: float
    ram_gb: float | None = None
    weight_gb: float | None = None
    avx512_bf16: bool | None = None  # None: this machine's CPU
    config: str | None = None


@dataclass
class Model:
    """What the checkpoint says: its KV layout, its weight bytes and where they came from."""

    layout: dict
    weights: int
    source: str
    quant: dict | None
    model_dir: dict  # {"model_dir": path or None} for a model read here; {} for --config
    cfg: dict  # the text model's config


def read_model(req: Request, kv_dtype: str, ssm_dtype: str) -> Model:
    """The config and the weights, from a folder, the cache, the Hub (under the deadline) or --config."""

    def read() -> Model:
        where = {} if files.kind == "config" else {"model_dir": str(files.folder) if files.kind == "local" else None}
        cfg = files.config()
        # a config without attention shapes is an error before any weight lookup
        layout = kv_cache.kv_layout(cfg, kv_cache.KV_BYTES_BY_DTYPE[kv_dtype], kv_cache.KV_BYTES_BY_DTYPE[ssm_dtype])
        quant = quantization.describe(cfg)
        weights, source = weights_of(req, files, kv_cache.text_config(cfg), quant)
        return Model(layout, weights, source, quant, where, kv_cache.text_config(cfg))

    try:  # no Hub traffic before the deadline: a config alone, a folder, the offline cache, or an id to ask
        files = hf_model.config_only(req.config) if req.config else hf_model.resolve(req.model, req.revision)
        return hf_model.with_deadline(read, req.hub_timeout, online=files.kind == "hub")
    except hf_model.Unreadable as why:
        raise ScriptError(why.message, why.fix)


def weights_of(req: Request, files: hf_model.ModelFiles | None, text_cfg: dict, quant: dict | None) -> tuple[int, str]:
    """The weight bytes at the serving dtype, and their source: --weight-gb, the checkpoint's files, else the
    config's parameter count; never below the token embedding alone."""
    floor = weight_floor(text_cfg)
    if req.weight_gb:
        if int(req.weight_gb * GIB) < floor:  # a typo, or MB taken for GiB: it would size a model as fitting
            raise ScriptError(
                f"--weight-gb {req.weight_gb:g} is below this config's token embedding alone "
                f"({floor:,} bytes = {floor / GIB:.3g} GiB at 4 bits)",
                "pass the checkpoint's size in GiB (the model card, or the sum of its safetensors files)",
            )
        return int(req.weight_gb * GIB), "override"
    found = files.weights(req.dtype, bool(text_cfg.get("tie_word_embeddings", False))) if files else None
    if found is not None and found[1] in STORED_SIZES and not quant:
        # stored bytes, cast as vLLM casts float weights: a bf16 checkpoint served in float32 holds twice its files
        stored = hf_model.SERVE_DTYPE_BYTES.get(str(text_cfg.get("torch_dtype") or text_cfg.get("dtype")))
        scale = hf_model.SERVE_DTYPE_BYTES[req.dtype] / stored if stored else 1.0
        found = int(found[0] * scale), found[1]
    if found is None:
        counted = config_weight_bytes(text_cfg, hf_model.SERVE_DTYPE_BYTES[req.dtype], (quant or {}).get("bits"))
        if counted is None:
            raise ScriptError(
                f"{req.model}: no checkpoint metadata, and its config lacks the shapes to count the weights",
                "pass --weight-gb N (the checkpoint size in GiB)",
            )
        found = counted, "config_parameter_count"
    if not floor <= found[0] <= hf_model.MAX_WEIGHT_BYTES:
        raise ScriptError(
            f"{req.model}: its weights add up to {found[0]:,} bytes ({found[1]}), not a model of "
            f"this config (the embedding alone is {floor:,}; at most {hf_model.MAX_WEIGHT_BYTES:,})",
            "re-download the model (truncated or pointer files), or pass --weight-gb N",
        )
    return found


def layout_notes(layout: dict, ssm_dtype: str, bf16_cpu: bool, block: int, batched: int) -> list[str]:
    """What the KV figures hold for recurrent and sliding-window layers, in words."""
    notes = []
    if layout["none"] and layout["recurrent_state_bytes"]:
        notes.append(
            f"{layout['none']} {layout['recurrent_family']} layers keep a recurrent state of "
            f"{layout['recurrent_state_bytes']:,} B per sequence (SSM state in {ssm_dtype}, as vLLM keeps it "
            f"on a CPU {'with' if bf16_cpu else 'without'} AVX-512 BF16), two KV pages each (prefix "
            f"caching keeps a copy)"
            + (
                f"; attention pages grow to {kv_cache.page_block(layout, block)} tokens to hold it"
                if layout["full"] + layout["sliding"]
                else "; no attention layer: nothing grows with the length"
            )
        )
    elif layout["none"]:
        notes.append(
            f"{layout['none']} layers keep a recurrent state per sequence that this config does not size "
            "(no mamba / linear-attention state fields): it is not counted"
        )
    if layout["sliding"]:
        notes.append(
            f"{layout['sliding']} sliding-window layers hold min(window - 1 + --max-num-batched-tokens "
            f"{batched}, max_model_len) tokens per sequence, as vLLM reserves them; the plan pins that value"
        )
    return notes


def rank_rows(m: Model, req: Request, max_len: int, block: int, sizes: list[int]) -> list[dict]:
    """One row per tensor-parallel size vLLM can split this model into: what each rank holds (its shard of the
    weights plus what every rank keeps whole, its share of the KV cache)."""
    whole = replicated_params(m.cfg) * hf_model.SERVE_DTYPE_BYTES[req.dtype]
    rows = []
    for n in sizes:
        layout = kv_cache.rank_layout(m.layout, n)
        if layout is None:
            continue
        per_seq = kv_cache.kv_bytes_for(layout, max_len, block, req.max_num_batched_tokens)
        rows.append(
            {
                "ranks": n,
                "weight_gb": bundle.gb((m.weights - whole) // n + whole),
                "kv_bytes_per_token": layout["bytes_per_token"],
                "kv_bytes_per_sequence": per_seq,
                "kv_needed_gb": bundle.gb(per_seq * req.num_prompts),
            }
        )
    return rows


def model_notes(m: Model, req: Request, epyc: dict, model_max: int | None) -> list[str]:
    """What the weights figure rests on, the KV cache's dtype, a quantized checkpoint's bytes, a length capped."""
    notes = []
    if m.source in STORED_SIZES:
        notes.append(f"weights from the checkpoint's stored size ({m.source}), scaled to --dtype {req.dtype}")
    elif m.source == "config_parameter_count":
        notes.append("weights counted from the config's shapes (no checkpoint read): within a few % of the files")
    notes.append(epyc["precision"]["kv_note"])
    if m.quant and m.source != "override":
        notes.append(
            f"{m.quant['method']} {m.quant['bits'] or '?'}-bit checkpoint: integer tensors count "
            "as stored (packed), float ones (scales, embeddings, norms) at the serving dtype -- the bytes a "
            "decode step reads"
        )
    if model_max and req.max_model_len > model_max:
        notes.append(
            f"--max-model-len {req.max_model_len} exceeds the model's maximum length {model_max} (vLLM would "
            f"refuse it); capped to {model_max}"
        )
    return notes


def estimate(req: Request, epyc: dict) -> dict:
    """estimate_memory.py's document: the model's sizes, and the fit when RAM is given (error and fix if none)."""
    kv_dtype = kv_cache.kv_dtype_for(req.dtype, epyc["precision"]["kv_cache_dtype"])
    bf16_cpu = req.avx512_bf16 if req.avx512_bf16 is not None else cpuid.this_cpu_has("avx512_bf16")
    ssm_dtype = kv_cache.ssm_state_dtype(bf16_cpu, kv_dtype)
    m = read_model(req, kv_dtype, ssm_dtype)
    layout, model_max = m.layout, m.layout["max_position_embeddings"]
    max_len = min(req.max_model_len, model_max or req.max_model_len)  # vLLM would refuse a longer one
    block = epyc["serve"]["kv_block_size_mla"] if layout["attention"] == "mla" else epyc["serve"]["kv_block_size"]
    batched = req.max_num_batched_tokens
    notes = model_notes(m, req, epyc, model_max) + layout_notes(layout, ssm_dtype, bf16_cpu, block, batched)
    per_sequence = kv_cache.kv_bytes_for(layout, max_len, block, batched)
    # a decode step reads all a dense model's weights, a mixture-of-experts' less its skipped experts' share
    params, idle = config_params(m.cfg), idle_expert_params(m.cfg)
    active = max(weight_floor(m.cfg), int(m.weights * (1 - idle / sum(params)))) if params and idle else m.weights
    doc = {
        "model": req.model,
        **m.model_dir,
        "revision": req.revision,
        "dtype": req.dtype,
        "weight_gb": bundle.gb(m.weights),
        "weight_bytes": m.weights,
        "weight_source": m.source,
        "active_weight_bytes": active,
        "flop_params": dict(zip(("layers", "lm_head"), forecast.model_params(m.cfg))) if params else None,
        "quantization": m.quant,
        "kv_dtype": kv_dtype,
        "kv_attention": layout["attention"],
        "kv_bytes_per_token": layout["bytes_per_token"],
        "kv_layers": {
            **{k: layout[k] for k in ("full", "sliding", "none", "sliding_window", "recurrent_family")},
            "recurrent_state_bytes": layout["recurrent_state_bytes"],
            "ssm_state_dtype": ssm_dtype if layout["recurrent_state_bytes"] else None,
        },
        "avx512_bf16": bf16_cpu,
        "kv_block_size": kv_cache.page_block(layout, block),
        "max_num_batched_tokens": batched,
        "model_max_seq_len": model_max,
        "kv_needed_gb_per_sequence": bundle.gb(per_sequence, 3),
        "kv_bytes_per_sequence": per_sequence,
        "tensor_parallel": rank_rows(m, req, max_len, block, epyc["serve"]["tensor_parallel_sizes"]),
        "notes": notes,
    }
    if req.ram_gb is not None:
        doc["fit"] = kv_budget.fit(
            m.weights, layout, max_len, req.num_prompts, req.ram_gb, req.os_reserve_gb, block, model_max, batched
        )
        if not doc["fit"]["fits"]:
            doc.update(
                error=f"does not fit: {doc['fit']['required_gb']} GiB required vs {doc['fit']['ram_gb']} GiB of RAM",
                fix=doc["fit"]["action"],
            )
    return doc
