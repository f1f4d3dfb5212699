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
import detect  # noqa: E402
import hf_model  # noqa: E402
import quantization  # noqa: E402
from common import GIB, ScriptError  # noqa: E402

from kv_cache import (KV_BYTES_BY_DTYPE, kv_bytes_for, kv_dtype_for, kv_layout, page_block, ssm_state_dtype,  # noqa: E402
                      text_config)

# ---------------------------------------------------------------- pure decisions


def fit(weight_bytes: int, layout: dict, max_model_len: int, num_prompts: int, ram_gb: float,
        os_reserve_gb: float, block: int, model_max: int | None, batched_tokens: int) -> dict:
    """Weights + KV(max_model_len) x num_prompts + reserve <= RAM? If not, the longest context that
    fits (a multiple of the block size), or say that no context fits."""
    kv = kv_bytes_for(layout, max_model_len, block, batched_tokens) * num_prompts
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
        if kv_bytes_for(layout, mid * block, block, batched_tokens) * num_prompts <= budget:
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

def weight_floor(cfg: dict) -> int:
    """The fewest bytes a checkpoint of this config can hold: its token embedding (vocab x hidden) at 4 bits,
    the narrowest a checkpoint stores it in. A 1-byte .bin or a total_size of 1 sized as "fits" otherwise."""
    vocab, hidden = cfg.get("vocab_size"), cfg.get("hidden_size") or cfg.get("d_model") or cfg.get("n_embd")
    ints = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (vocab, hidden))
    return vocab * hidden // 2 if ints else 1


def main(argv: Sequence[str] | None = None):
    epyc = common.load_epyc()
    p = common.JsonArgumentParser(prog="scripts/estimate_memory.py", description=__doc__.split("\n")[0])
    p.add_argument("--model", "--model-id", dest="model", default=epyc["default_model"],
                   help="Hub id or local folder; --model-id is the old name, kept for one release")
    p.add_argument("--revision", type=hf_model.revision_arg, default=None, help="branch, tag or commit (Hub ids; default main): the one "
                   "check_model.py checked, which plan serves")
    p.add_argument("--ram-gb", type=common.float_in(0, 1 << 20, lo_open=True), help="RAM to fit in: ram_gb from detect.py or "
                   "socket_ram_gb from cpu_tune.py; without it no verdict is given")
    p.add_argument("--max-model-len", type=common.int_in(16, 1 << 24), default=epyc["serve"]["default_max_model_len"])
    p.add_argument("--num-prompts", type=common.int_in(1, 65536), default=1, help="concurrent sequences at full length")
    p.add_argument("--weight-gb", type=common.float_in(0, 65536, lo_open=True), help="override the weight size (GiB)")
    p.add_argument("--os-reserve-gb", type=common.float_in(0, 65536), default=epyc["memory"]["os_reserve_gb"],
                   help="RAM kept for the OS and vLLM's own process (default %(default)s)")
    p.add_argument("--max-num-batched-tokens", type=common.int_in(16, 1 << 24),
                   default=epyc["serve"]["max_num_batched_tokens"], help="tokens one scheduler step may take; "
                   "sliding-window layers keep that many beyond their window (default: vLLM's CPU server default, "
                   "%(default)s; the plan pins it)")
    p.add_argument("--dtype", choices=epyc["precision"]["supported"], default=epyc["precision"]["default"])
    p.add_argument("--hub-timeout", type=common.float_in(0, 3600, lo_open=True), default=60, help="overall deadline for Hub requests, seconds")
    p.add_argument("--avx512-bf16", choices=("yes", "no"), help="does the serving CPU have AVX-512 BF16 "
                   "(avx512_bf16 from detect.py)? vLLM keeps a recurrent layer's SSM state in float32 there, in the "
                   "serving dtype elsewhere (default: this machine's CPU)")
    p.add_argument("--config", type=common.nonempty, help="a config.json to size from, offline (no Hub, no folder); "
                   "needs --weight-gb")
    args = p.parse_args(argv)
    if args.config and not args.weight_gb:
        raise ScriptError("--config sizes the KV cache from a config.json alone: the weights are unknown",
                          "add --weight-gb N (the checkpoint size in GiB, e.g. from the model card)")

    notes: list[str] = []
    quant: dict = {}
    kv_dtype = kv_dtype_for(args.dtype, epyc["precision"]["kv_cache_dtype"])
    bf16_cpu = args.avx512_bf16 == "yes" if args.avx512_bf16 else detect.this_cpu_has("avx512_bf16")
    ssm_dtype = ssm_state_dtype(bf16_cpu, kv_dtype)

    resolved: dict = {}  # the folder the model named (plan checks it serves the same one); none with --config

    try:  # (no Hub traffic: a folder, the offline cache, or an id to ask the Hub about under the deadline)
        files = None if args.config else hf_model.resolve(args.model, args.revision)
    except hf_model.Unreadable as why:
        raise ScriptError(why.message, why.fix)

    def read() -> tuple[dict, int, str]:
        if files is None:  # planning for a model this machine cannot download: its config.json is enough
            cfg = common.read_json_input(args.config, "config.json")
            common.check_schema(cfg, "model_config", f"{args.config} has a value of the wrong type or range",
                                "pass the model's unmodified config.json")
        else:
            resolved["model_dir"] = str(files.folder) if files.kind == "local" else None
            cfg = files.config()
        # a config without attention shapes is an error before any weight lookup
        layout = kv_layout(cfg, KV_BYTES_BY_DTYPE[kv_dtype], KV_BYTES_BY_DTYPE[ssm_dtype])
        quant.update(desc=quantization.describe(cfg))
        tied = bool(text_config(cfg).get("tie_word_embeddings", False))
        floor = weight_floor(text_config(cfg))
        if args.weight_gb:
            if int(args.weight_gb * GIB) < floor:  # an override no checkpoint of this config can be: a typo, or
                # MB taken for GiB -- it would size the model as fitting where it does not
                raise ScriptError(f"--weight-gb {args.weight_gb:g} is below this config's token embedding alone "
                                  f"({floor:,} bytes = {floor / GIB:.3g} GiB at 4 bits)",
                                  "pass the checkpoint's size in GiB (the model card, or the sum of its "
                                  "safetensors files)")
            return layout, int(args.weight_gb * GIB), "override"
        found = files.weights(args.dtype, tied)
        if found is None:
            raise ScriptError(f"{args.model}: no safetensors metadata or weight files to size the weights",
                              "pass --weight-gb N (the checkpoint size in GiB)")
        if not floor <= found[0] <= hf_model.MAX_WEIGHT_BYTES:
            raise ScriptError(f"{args.model}: its weights add up to {found[0]:,} bytes ({found[1]}), not a model of "
                              f"this config (the embedding alone is {floor:,}; at most {hf_model.MAX_WEIGHT_BYTES:,})",
                              "re-download the model (truncated or pointer files), or pass --weight-gb N")
        return layout, *found

    try:
        layout, weights, source = hf_model.with_deadline(read, args.hub_timeout, online=files is not None and files.kind == "hub")
    except hf_model.Unreadable as why:
        raise ScriptError(why.message, why.fix)
    if source == "safetensors_index_total_size":
        notes.append("weights from the index's total_size: stored dtype, not cast to --dtype")
    notes.append(epyc["precision"]["kv_note"])
    if quant.get("desc") and source != "override":
        notes.append(f"{quant['desc']['method']} {quant['desc']['bits'] or '?'}-bit checkpoint: integer tensors count "
                     "as stored (packed), float ones (scales, embeddings, norms) at the serving dtype -- the bytes a "
                     "decode step reads")

    model_max = layout["max_position_embeddings"]
    max_len = args.max_model_len
    if model_max and max_len > model_max:
        notes.append(f"--max-model-len {max_len} exceeds the model's maximum length {model_max} (vLLM would "
                     f"refuse it); capped to {model_max}")
        max_len = model_max
    block = epyc["serve"]["kv_block_size_mla"] if layout["attention"] == "mla" else epyc["serve"]["kv_block_size"]
    batched = args.max_num_batched_tokens
    if layout["none"] and layout["recurrent_state_bytes"]:
        notes.append(f"{layout['none']} {layout['recurrent_family']} layers keep a recurrent state of "
                     f"{layout['recurrent_state_bytes']:,} B per sequence (SSM state in {ssm_dtype}, as vLLM keeps it "
                     f"on a CPU {'with' if bf16_cpu else 'without'} AVX-512 BF16), two KV pages each (prefix "
                     f"caching keeps a copy)" + (f"; attention pages grow to {page_block(layout, block)} tokens to "
                                                   "hold it" if layout["full"] + layout["sliding"] else
                                                   "; no attention layer: nothing grows with the length"))
    elif layout["none"]:
        notes.append(f"{layout['none']} layers keep a recurrent state per sequence that this config does not size "
                     "(no mamba / linear-attention state fields): it is not counted")
    if layout["sliding"]:
        notes.append(f"{layout['sliding']} sliding-window layers hold min(window - 1 + --max-num-batched-tokens "
                     f"{batched}, max_model_len) tokens per sequence, as vLLM reserves them; the plan pins that value")
    per_sequence = kv_bytes_for(layout, max_len, block, batched)
    doc = {
        "model": args.model,
        **resolved,
        "revision": args.revision,
        "dtype": args.dtype,
        "weight_gb": common.gb(weights),
        "weight_bytes": weights,
        "weight_source": source,
        "quantization": quant.get("desc"),
        "kv_dtype": kv_dtype,
        "kv_attention": layout["attention"],
        "kv_bytes_per_token": layout["bytes_per_token"],
        "kv_layers": {"full": layout["full"], "sliding": layout["sliding"], "none": layout["none"],
                      "sliding_window": layout["sliding_window"], "recurrent_family": layout["recurrent_family"],
                      "recurrent_state_bytes": layout["recurrent_state_bytes"],
                      "ssm_state_dtype": ssm_dtype if layout["recurrent_state_bytes"] else None},
        "avx512_bf16": bf16_cpu,
        "kv_block_size": page_block(layout, block),
        "max_num_batched_tokens": batched,
        "model_max_seq_len": model_max,
        "kv_needed_gb_per_sequence": common.gb(per_sequence, 3),
        "kv_bytes_per_sequence": per_sequence,
        "notes": notes,
    }
    if args.ram_gb is None:
        return doc, common.EXIT_OK
    verdict = fit(weights, layout, max_len, args.num_prompts, args.ram_gb, args.os_reserve_gb, block, model_max,
                  batched)
    doc["fit"] = verdict
    if not verdict["fits"]:
        doc.update(error=f"does not fit: {verdict['required_gb']} GiB required vs {verdict['ram_gb']} GiB of RAM",
                   fix=verdict["action"])
    return doc, common.EXIT_OK if verdict["fits"] else common.EXIT_FAIL


if __name__ == "__main__":
    sys.exit(common.run_main(main))
