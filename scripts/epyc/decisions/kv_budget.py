"""The KV budget: what a rank needs, the cache it is granted, and the --max-num-seqs that grant holds."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from epyc import bundle
from epyc.bundle import GIB
from epyc.errors import ScriptError
from epyc.facts.kv_cache import kv_bytes_for


class DoesNotFit(ScriptError):
    """The memory a rank has cannot hold its weights, KV need and reserve: tensor parallelism may."""


@dataclass(frozen=True)
class Need:
    """What one rank holds: its weights and the KV need (GiB), and one full-length sequence's KV."""

    weight_gb: float | None = None
    kv_needed_gb: float | None = None
    kv_per_sequence_gb: float | None = None  # bounds the grant by what a running batch can use
    kv_bytes_per_sequence: int | None = None
    kv_bytes_per_token: int | None = None


@dataclass(frozen=True)
class Grant:
    """The KV cache granted (VLLM_CPU_KVCACHE_SPACE, whole GiB), why that much, and a warning when forced."""

    kv_gb: int
    basis: str
    warning: str | None = None


@dataclass(frozen=True)
class Capacity:
    """What a grant holds: tokens, full-length requests at once, and the --max-num-seqs that follows."""

    kv_tokens: int | None
    kv_full_length_requests: int | None
    max_num_seqs: int | None


def fit(
    weight_bytes: int,
    layout: dict,
    max_model_len: int,
    num_prompts: int,
    ram_gb: float,
    os_reserve_gb: float,
    block: int,
    model_max: int | None,
    batched_tokens: int,
) -> dict:
    """Weights + KV(max_model_len) x num_prompts + reserve <= RAM? If not, the longest context that
    fits (a multiple of the block size), or say that no context fits."""
    kv = kv_bytes_for(layout, max_model_len, block, batched_tokens) * num_prompts
    required, ram = weight_bytes + kv + os_reserve_gb * GIB, ram_gb * GIB
    out = {
        "max_model_len": max_model_len,
        "num_prompts": num_prompts,
        "weight_gb": bundle.gb(weight_bytes),
        "kv_needed_gb": bundle.gb(kv),
        "os_reserve_gb": os_reserve_gb,
        "required_gb": bundle.gb(required),
        "ram_gb": ram_gb,
        "fits": required <= ram,
    }
    if out["fits"]:
        return out
    budget = ram - weight_bytes - os_reserve_gb * GIB
    blocks = range(1, min(model_max or max_model_len, max_model_len) // block + 1)
    # the most blocks whose KV fits the budget: the KV grows with the length
    lo = bisect.bisect_right(
        blocks, budget, key=lambda n: kv_bytes_for(layout, n * block, block, batched_tokens) * num_prompts
    )
    out["suggested_max_model_len"] = lo * block or None
    if lo:
        out["action"] = f"lower --max-model-len to {lo * block} (or lower --num-prompts), or use a smaller model"
    elif budget <= 0:
        out["action"] = "weights alone exceed RAM -- use a smaller model"
    else:
        out["action"] = (
            f"not even {block} tokens of KV fit at {num_prompts} concurrent prompts -- "
            "lower --num-prompts or use a smaller model"
        )
    return out


def need_of(est: dict, ranks: int = 1) -> Need | None:
    """What one of `ranks` tensor-parallel ranks holds by estimate_memory's document: the estimate itself (the
    need its fit sized) for one, else its row for that many ranks (None when it has none)."""
    if ranks == 1:
        return _need(est, (est.get("fit") or {}).get("kv_needed_gb"))
    return rank_need(est.get("tensor_parallel"), ranks)


def rank_need(rows: object, ranks: int) -> Need | None:
    """What one rank holds by estimate_memory's per-rank row for `ranks` ranks (None when it has none)."""
    row = next((r for r in rows or [] if isinstance(r, dict) and r.get("ranks") == ranks), None)
    return None if row is None else _need(row, row.get("kv_needed_gb"))


def _need(row: dict, kv_needed_gb: float | None) -> Need:
    per_seq = row.get("kv_bytes_per_sequence")
    return Need(
        row.get("weight_gb"), kv_needed_gb, per_seq / GIB if per_seq else None, per_seq, row.get("kv_bytes_per_token")
    )


def short_of(grant_gb: float, need_gb: float | None) -> bool:
    """A grant below the need: the one rule the grant refuses by and the plan re-checks documents by."""
    return need_gb is not None and grant_gb < need_gb


def disagreements(tune: dict, est: dict) -> list[str]:
    """Where cpu_tune's document is not the budget estimate_memory's document gives (a set assembled from different
    runs, or edited): no row for its ranks, other weights or need, a grant below the need or past its memory."""
    ranks, out = tune.get("tensor_parallel_size") or 1, []
    sized = need_of(est, ranks)
    if sized is None:
        out.append(f"cpu_tune.py split the model {ranks} ways, estimate_memory.py has no row for {ranks} ranks")
        sized = Need()
    if tune.get("weight_gb") is not None and tune["weight_gb"] != sized.weight_gb:
        out.append(
            f"cpu_tune.py sized for {tune['weight_gb']} GiB of weights{f' per rank ({ranks})' if ranks > 1 else ''}, "
            f"estimate_memory.py says {sized.weight_gb}"
        )
    need, granted, ram = sized.kv_needed_gb, tune.get("kv_granted_gb"), tune.get("socket_ram_gb")
    if tune.get("kv_needed_gb") is not None and need is not None and tune["kv_needed_gb"] != need:
        out.append(f"cpu_tune.py sized for a {tune['kv_needed_gb']} GiB KV need, estimate_memory.py says {need}")
    if granted is not None and short_of(granted, need):
        out.append(f"cpu_tune.py grants {granted} GiB of KV cache, below the {need} GiB needed")
    if granted is not None and ram is not None and granted > ram:
        out.append(f"cpu_tune.py grants {granted} GiB of KV cache on a socket of {ram} GiB")
    return out


def grant(epyc: dict, ram_gb: float, reserve_gb: float, need: Need, where: str = "socket") -> Grant:
    """The KV cache to grant one rank in whole GiB: a share of what is left after weights and the OS, at most what
    the largest batch (+ prefix cache) can use since vLLM reserves it all at start, at least the need x headroom."""
    mem, per_seq = epyc["memory"], need.kv_per_sequence_gb
    headroom, fraction, prefix = mem["kv_headroom_factor"], mem["kv_default_fraction"], mem["kv_prefix_cache_share"]
    batch_gb = per_seq * epyc["serve"]["max_num_seqs_cap"] if per_seq else None
    left, kv_needed = ram_gb - reserve_gb - (need.weight_gb or 0.0), need.kv_needed_gb
    if short_of(math.floor(left), kv_needed):  # vLLM takes whole GiB: the most it could be granted is too little
        raise DoesNotFit(
            f"{where} RAM {ram_gb:g} GiB cannot hold weights {need.weight_gb or 0:g} GiB + "
            f"KV {kv_needed:g} GiB + OS reserve {reserve_gb:g} GiB",
            "lower --max-model-len or the concurrency in estimate_memory.py, or use a smaller "
            "model (or another socket with --socket)",
        )
    floor_gb = max(1, math.ceil(kv_needed * headroom)) if kv_needed is not None else 0
    share = math.floor(left * fraction)
    usable = math.ceil(batch_gb * (1 + prefix)) if batch_gb is not None else None
    wanted = max(floor_gb, share if usable is None else min(share, usable))
    kv = min(wanted, math.floor(left))
    if kv < wanted:
        basis = f"all the {where} RAM left after OS reserve and weights ({left:.1f} GiB)"
    elif floor_gb and kv == floor_gb:
        basis = f"model need {kv_needed:g} GiB x {headroom:g} headroom (more than the share below)"
    elif usable is not None and usable < share:
        basis = (
            f"what the largest running batch can use ({batch_gb:g} GiB) + {prefix:.0%} for the prefix "
            "cache; estimate_memory.py --num-prompts N sizes it for N full-length requests"
        )
    elif kv_needed is None:
        basis = f"{fraction:g} of {where} RAM left after OS reserve and weights (no model need given)"
    else:
        basis = (
            f"{fraction:g} of the {where} RAM left after OS reserve and weights ({left:.1f} GiB); "
            f"at least the need, at most what the {where} has left"
        )
    if kv >= 1:
        return Grant(int(kv), basis)
    minimum = f"only {left:.1f} GiB left on the socket after weights and OS reserve; KV cache set to the 1 GiB minimum"
    return Grant(1, basis, minimum)


def capacity(granted_gb: int, need: Need, cap: int, batched_tokens: int | None = None) -> Capacity:
    """What the grant holds: --max-num-seqs follows it, so vLLM never schedules more sequences than the cache keeps
    (at most `cap`, never above the tokens one step takes: vLLM refuses that)."""
    granted, per_token, per_seq = granted_gb * GIB, need.kv_bytes_per_token, need.kv_bytes_per_sequence
    requests = granted // per_seq if per_seq else None
    seqs = max(1, min(cap, batched_tokens or cap, requests)) if requests is not None else None
    return Capacity(granted // per_token if per_token else None, requests, seqs)
