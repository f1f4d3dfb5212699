"""A plan's speed before it runs: decode floor, aggregate, prefill and load, each a bound and a likely range."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from epyc import bundle
from epyc.bundle import GIB
from epyc.facts import hostfacts
from epyc.facts.model_params import config_params, idle_expert_params

DDR_BYTES_PER_TRANSFER = 8  # one 64-bit DDR channel moves 8 bytes a transfer
NO_PARAMS = "its config lacks the shapes that count the parameters"


@dataclass(frozen=True)
class Fact:
    """An input, a number or a (lo, hi) range, and its source: "measured", "data:<key>", "assumption: ..."."""

    name: str
    value: float | tuple[float, float] | None
    source: str
    why: str = ""  # the value is None: why it is missing

    def to_json(self) -> dict:
        value = list(self.value) if isinstance(self.value, tuple) else self.value
        return {"name": self.name, "value": value, "source": self.source} | ({"why": self.why} if self.why else {})


@dataclass(frozen=True)
class Rank:
    """One tensor-parallel rank (or the one engine): what a decode step reads there and what its cores deliver."""

    weight_bytes: int  # the weights it reads a step: its shard, a mixture-of-experts model's active share
    kv_bytes_per_token: int  # its share of one sequence's KV cache per token of context
    bandwidth: Fact  # bytes/s its cores draw from its own node's memory
    compute: Fact  # bf16 FLOP/s its cores deliver


@dataclass(frozen=True)
class Workload:
    """The model's arithmetic (model_params) and the traffic the forecast is for."""

    layer_params: int | None  # parameters a token multiplies in the layers (a mixture-of-experts: the active ones)
    head_params: int | None  # the LM head (vocab x hidden): every generated token, a prompt's last
    prompt_tokens: int = 512
    output_tokens: int = 128
    concurrency: tuple[int, ...] = (1, 4, 8)


@dataclass(frozen=True)
class Load:
    """The bytes a start reads (and first downloads when they are not cached), at rates named as assumptions."""

    read_bytes: int
    download_bytes: int
    read_rate: Fact  # (lo, hi) bytes/s: load_rates
    download_rate: Fact


@dataclass(frozen=True)
class Figure:
    """A bound (physics at the inputs) and the likely range (the bound times the efficiency measured here)."""

    bound: float
    lo: float
    hi: float

    def to_json(self) -> dict:
        return {"bound": round(self.bound, 3), "likely": [round(self.lo, 3), round(self.hi, 3)]}


@dataclass(frozen=True)
class Missing:
    why: str  # a fact the figure needs is not known: no forecast, never a guess

    def to_json(self) -> dict:
        return {"available": False, "why": f"no forecast: {self.why}"}


@dataclass(frozen=True)
class Forecast:
    shape: dict
    floor_ms: Figure | Missing  # one stream's decode, ms per output token
    ceiling_tps: Figure | Missing  # and so its tokens/s
    aggregate: tuple[tuple[int, Figure | Missing, str], ...]  # (concurrency, output tokens/s, "memory" | "compute")
    ttft_ms: Figure | Missing
    load_s: Figure | Missing  # start to healthy, the weights on disk
    download_s: Figure | Missing | None  # the first download, when they are not
    inputs: tuple[Fact, ...]

    def to_json(self) -> dict:
        decode = {"floor_ms_per_token": self.floor_ms.to_json(), "ceiling_tokens_per_s": self.ceiling_tps.to_json()}
        rates = [{"concurrency": c, "tokens_per_s": f.to_json(), "limit": lim} for c, f, lim in self.aggregate]
        return {
            "shape": self.shape,
            "decode": decode,
            "aggregate": rates,
            "prefill": {"prompt_tokens": self.shape["prompt_tokens"], "ttft_ms": self.ttft_ms.to_json()},
            "load": {
                "seconds": self.load_s.to_json(),
                "first_download_seconds": self.download_s and self.download_s.to_json(),
            },
            "inputs": [f.to_json() for f in self.inputs],
        }


def _row(rows: list[dict], key: str, value: str | None) -> dict | None:
    return next((r for r in rows if r[key] == value), None)


def range_of(epyc: dict, name: str, table: str = "efficiency") -> tuple[float, float, str]:
    """(lo, hi, source) of an efficiency or assumption row of data/epyc.json's forecast section."""
    row = _row(epyc["forecast"][table], "name", name)
    return row["lo"], row["hi"], f"data:forecast.{table}.{name} ({row['source']})"


def memory_bandwidth(epyc: dict, generation: str | None, channel_share: float, cores: int) -> Fact:
    """Bytes/s a rank's `cores` draw, from data: channels x MT/s x 8 bytes x the share of the socket's channels its
    memory is on (1: an NPS1 socket, 1/4: an NPS4 node), and at most `cores` x the most one core drew here."""
    row = _row(epyc["forecast"]["memory"], "generation", generation)
    name, key = "memory_bandwidth_bytes_per_s", f"data:forecast.memory.{generation}"
    if row is None or not (row["channels"] and row["mt_per_s"]):
        return Fact(name, None, key, row["why"] if row else f"data/epyc.json has no memory facts for {generation!r}")
    peak = row["channels"] * row["mt_per_s"] * 1e6 * DDR_BYTES_PER_TRANSFER * channel_share
    _lo, per_core, per_core_source = range_of(epyc, "per_core_bandwidth_bytes_per_s", "assumptions")
    source = f"{key} ({row['source']}) x {channel_share:g} of the socket's channels"
    if cores * per_core < peak:
        return Fact(name, cores * per_core, f"{source}, capped at {cores} cores x {per_core_source}")
    return Fact(name, peak, source)


def bf16_compute(epyc: dict, zen_arch: str | None, cores: int, clock: Fact) -> Fact:
    """Peak bf16 FLOP/s of `cores` cores: cores x clock (GHz) x the bf16 FLOPs one core issues a cycle."""
    row = _row(epyc["forecast"]["bf16_flops_per_cycle"], "zen_arch", zen_arch)
    name, key = "bf16_flops_per_s", f"data:forecast.bf16_flops_per_cycle.{zen_arch}"
    if row is None or not row["flops"]:
        return Fact(name, None, key, row["why"] if row else f"data/epyc.json has no bf16 rate for {zen_arch!r}")
    if clock.value is None:
        return Fact(name, None, clock.source, clock.why)
    source = f"{cores} cores x {clock.value} GHz ({clock.source}) x {row['flops']} ({key}: {row['source']})"
    return Fact(name, cores * clock.value * 1e9 * row["flops"], source)


def sku_clock(sku: dict | None) -> Fact:
    """A known part's clock from its data/epyc_skus.json row (its all-core boost, else its top boost), or None."""
    key = next((k for k in ("all_core_boost_ghz", "max_boost_ghz") if sku and sku.get(k)), None)
    part = f"EPYC {sku['model']}" if sku else "a part not in the table"
    why = "" if key else f"data/epyc_skus.json gives no clock for {part}"
    return Fact("clock_ghz", float(sku[key]) if key else None, f"data:epyc_skus.{key or 'clock'}", why)


def load_rates(epyc: dict) -> tuple[Fact, Fact]:
    """The disk read and Hub download rates a load forecast assumes, (lo, hi) bytes/s, as the data names them."""
    rows = [(n, range_of(epyc, n, "assumptions")) for n in ("disk_read_bytes_per_s", "download_bytes_per_s")]
    return tuple(Fact(n, (lo, hi), source) for n, (lo, hi, source) in rows)


def model_params(cfg: dict) -> tuple[int | None, int | None]:
    """(layer parameters a token multiplies, LM head parameters) of a text config: a mixture-of-experts model's
    idle experts left out, the embedding lookup (no multiply) not counted."""
    params = config_params(cfg)
    if params is None:
        return None, None
    return params[1] - idle_expert_params(cfg), cfg["vocab_size"] * cfg["hidden_size"]


def _flops(w: Workload) -> tuple[float, float] | None:
    """(FLOPs a generated token, FLOPs of one prompt's prefill): 2 a parameter multiplied."""
    if not (w.layer_params and w.head_params):
        return None
    return 2 * (w.layer_params + w.head_params), 2 * (w.layer_params * w.prompt_tokens + w.head_params)


def _time_s(ranks: tuple[Rank, ...], w: Workload, batch: int, steps: int, prefill: bool) -> tuple[float, str]:
    """`steps` decode steps of `batch` sequences (prefilled first if `prefill`): each rank reads its weights once a
    step and each sequence's KV at mid-decode, and multiplies its share; the slowest sets the pace -> (s, limit)."""
    flops, context = _flops(w), w.prompt_tokens + w.output_tokens // 2
    slowest, limit = 0.0, "memory"
    for r in ranks:
        mem = steps * (r.weight_bytes + batch * r.kv_bytes_per_token * context) / r.bandwidth.value
        work = batch * (steps * flops[0] + prefill * flops[1]) / len(ranks) if flops and r.compute.value else 0
        cmp = work / r.compute.value if work else 0.0
        if max(mem, cmp) > slowest:
            slowest, limit = max(mem, cmp), "memory" if mem >= cmp else "compute"
    return slowest, limit


def _slowed(bound: float, eff: tuple[float, float], least: tuple[float, float]) -> Figure:
    """A time's likely range: the bound over the efficiency, never under the engine's fixed cost `least` (lo, hi)."""
    return Figure(bound, max(bound / eff[1], least[0]), max(bound / eff[0], least[1]))


def _per(time: Figure, amount: float) -> Figure:
    """The rate of `amount` done in `time`: the likely fastest at the shortest time."""
    return Figure(amount / time.bound, amount / time.hi, amount / time.lo)


def _gap(facts) -> Missing | None:
    missing = next((f for f in facts if f.value is None), None)
    return Missing(f"{missing.name}: {missing.why}") if missing else None


def _fleet(ranks, w: Workload, engines: int, eff: dict) -> tuple[tuple[int, Figure | Missing, str], ...]:
    """Output tokens/s at each concurrency, the requests dealt round-robin over the engines and their rates summed."""
    gap = _gap(
        [*(r.bandwidth for r in ranks), *(r.compute for r in ranks), Fact("model_flops", _flops(w), "", NO_PARAMS)]
    )
    if gap:
        return tuple((c, gap, "") for c in w.concurrency)
    rows, least = [], tuple(w.output_tokens * ms / 1000 for ms in eff["step_ms"])
    for c in w.concurrency:
        batches = [c // engines + (i < c % engines) for i in range(min(c, engines))]
        times = [_time_s(ranks, w, b, w.output_tokens, prefill=True) for b in batches]
        rates = [_per(_slowed(t, eff["aggregate"], least), b * w.output_tokens) for b, (t, _) in zip(batches, times)]
        rows.append((c, Figure(*(sum(v) for v in zip(*((r.bound, r.lo, r.hi) for r in rates)))), times[0][1]))
    return tuple(rows)


def _prefill(ranks, w: Workload, eff: tuple[float, float], least: tuple[float, float]) -> Figure | Missing:
    """Time to first token of one prompt: its prefill FLOPs over the compute of the slowest rank (its share)."""
    gap = _gap([*(r.compute for r in ranks), Fact("model_flops", _flops(w), "", NO_PARAMS)])
    return gap or _slowed(max(_flops(w)[1] / len(ranks) / r.compute.value for r in ranks) * 1000, eff, least)


def _at_rates(nbytes: int, rate: Fact) -> Figure | Missing:
    """Seconds to move `nbytes` at a (lo, hi) rate: bound and likely fastest at hi, likely slowest at lo."""
    return _gap([rate]) or Figure(nbytes / rate.value[1], nbytes / rate.value[1], nbytes / rate.value[0])


def _load(load: Load, startup: tuple[float, float]) -> tuple[Figure | Missing, Figure | Missing | None]:
    """(start to healthy: the read at the assumed rates plus the start-up beyond it; the first download or None)."""
    read = _at_rates(load.read_bytes, load.read_rate)
    if isinstance(read, Figure):
        read = Figure(read.bound, read.lo + startup[0], read.hi + startup[1])
    return read, _at_rates(load.download_bytes, load.download_rate) if load.download_bytes else None


def forecast(epyc: dict, ranks: tuple[Rank, ...], w: Workload, load: Load, engines: int = 1) -> Forecast:
    """The forecast of `engines` engines alike, each over `ranks` (tensor parallel: a Rank each, on its own node)."""
    eff = {n: range_of(epyc, n) for n in ("decode_c1", "aggregate", "prefill", "startup_s", "step_ms", "request_ms")}
    facts = [f for r in ranks for f in (r.bandwidth, r.compute)] + [load.read_rate, load.download_rate]
    facts += [Fact(f"efficiency.{n}", (lo, hi), source) for n, (lo, hi, source) in eff.items()]
    lohi = {n: (lo, hi) for n, (lo, hi, _) in eff.items()}
    for kind, figures in (("memory", ("decode_c1", "aggregate")), ("compute", ("prefill",))):
        if all(getattr(r, "bandwidth" if kind == "memory" else "compute").source.startswith("measured") for r in ranks):
            continue  # data's peak, not a probe: the cores sustain a share of it
        s_lo, s_hi, source = range_of(epyc, f"sustained_{kind}_fraction", "assumptions")
        facts.append(Fact(f"sustained_{kind}_fraction", (s_lo, s_hi), source))
        lohi |= {n: (lohi[n][0] * s_lo, lohi[n][1] * s_hi) for n in figures}
    floor = ceiling = _gap(r.bandwidth for r in ranks)
    if not floor:
        floor = _slowed(_time_s(ranks, w, 1, 1, prefill=False)[0] * 1000, lohi["decode_c1"], lohi["step_ms"])
        ceiling = _per(floor, 1000)
    shape = dict(engines=engines, ranks=len(ranks), prompt_tokens=w.prompt_tokens, output_tokens=w.output_tokens)
    ttft, (load_s, fetch_s) = _prefill(ranks, w, lohi["prefill"], lohi["request_ms"]), _load(load, lohi["startup_s"])
    shape |= {"read_bytes": load.read_bytes, "download_bytes": load.download_bytes}
    aggregate = _fleet(ranks, w, engines, lohi)
    return Forecast(shape, floor, ceiling, aggregate, ttft, load_s, fetch_s, tuple(dict.fromkeys(facts)))


def _rank_facts(epyc: dict, det: dict, tune: dict, rank: dict) -> tuple[Fact, Fact]:
    """(bandwidth, compute) of one rank's cores: cpu_tune's probe scaled to them, else from data at their share."""
    cores, probe = len(hostfacts.parse_cpulist(rank["cpus"])), tune.get("measured") or {}
    if probe.get("bytes_per_s"):
        n, where = len(hostfacts.parse_cpulist(probe["cpus"])), f"measured: cpu_tune's probe on CPUs {probe['cpus']}"
        scale = f"{where} x {cores}/{n} cores" if cores != n else where
        names = ("memory_bandwidth_bytes_per_s", "bf16_flops_per_s")
        return tuple(Fact(k, probe[f] * cores / n, scale) for k, f in zip(names, ("bytes_per_s", "bf16_flops_per_s")))
    socket = next((s for s in tune["sockets"] if s["socket"] == rank["socket"]), tune["sockets"][0])
    # vLLM keeps an engine's memory on its first core's node: an NPS2/4 socket's engine has that node's channels
    share = min(cores / socket["physical_cores"], 1 / max(1, len(socket["numa_nodes"])))
    skus = json.loads((bundle.DATA_DIR / "epyc_skus.json").read_text())["skus"]
    clock = sku_clock(next((r for r in skus if r["model"] == det.get("epyc_model_number")), None))
    facts = (
        memory_bandwidth(epyc, det.get("epyc_generation"), share, cores),
        bf16_compute(epyc, det.get("zen_arch"), cores, clock),
    )
    why = f"{probe['why']}; " if probe.get("why") else ""  # this machine's probe failed: the data, and why
    return tuple(replace(f, source=why + f.source) for f in facts)


def plan_forecast(inp: dict, epyc: dict, engines: int = 1, **work) -> Forecast:
    """A plan's forecast from its documents (detect, estimate_memory, cpu_tune), `engines` alike behind a router."""
    det, est, tune = inp["detect"], inp["estimate_memory"], inp["cpu_tune"]
    n = len(tune["ranks"])
    row = next((r for r in est["tensor_parallel"] if r["ranks"] == n), None) if n > 1 else None
    share = row["weight_gb"] * GIB / est["weight_bytes"] if row else 1.0
    kv = row["kv_bytes_per_token"] if row else est["kv_bytes_per_token"]
    ranks = tuple(
        Rank(int(est["active_weight_bytes"] * share), kv, *_rank_facts(epyc, det, tune, r)) for r in tune["ranks"]
    )
    read, download = load_rates(epyc)
    fetch = 0 if est.get("model_dir") else est["weight_bytes"]  # a Hub id: the first start downloads it
    params = est.get("flop_params") or {}
    workload = Workload(params.get("layers"), params.get("lm_head"), **work)
    return forecast(epyc, ranks, workload, Load(est["weight_bytes"], fetch, read, download), engines)


def _num(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def _likely(fig: dict, unit: str, scale: float = 1.0) -> str:
    if "likely" not in fig:
        return fig["why"]
    return "-".join(_num(v * scale) for v in fig["likely"]) + f" {unit}"


def summary_text(doc: dict) -> str:
    """The plan's Forecast row, from its `forecast` document: likely ranges, the bound, where the inputs came from."""
    floor, ceiling = doc["decode"]["floor_ms_per_token"], doc["decode"]["ceiling_tokens_per_s"]
    if "likely" not in floor:
        return floor["why"]
    parts = [
        f"one stream {_likely(floor, 'ms/token')} = {_likely(ceiling, 'tokens/s')} (bound {_num(floor['bound'])} ms)"
    ]
    parts += [f"{a['concurrency']} streams {_likely(a['tokens_per_s'], 'tokens/s')}" for a in doc["aggregate"][-1:]]
    ttft, load = doc["prefill"]["ttft_ms"], doc["load"]
    ttft = _likely(ttft, "s", 1e-3) if ttft.get("likely", [0, 0])[1] >= 1000 else _likely(ttft, "ms")
    parts += [f"first token of a {doc['shape']['prompt_tokens']}-token prompt {ttft}"]
    parts += [f"start {_likely(load['seconds'], 's')} reading {doc['shape']['read_bytes'] / 1e9:.3g} GB"]
    if load["first_download_seconds"]:
        parts.append(f"first download {_likely(load['first_download_seconds'], 's')} unless cached")
    bw = next(i for i in doc["inputs"] if i["name"] == "memory_bandwidth_bytes_per_s")
    parts.append(f"bandwidth {bw['value'] / 1e9:.3g} GB/s a rank ({bw['source'].split(' (')[0]})")
    return "; ".join(parts) + "; likely = the bound over the efficiency measured on the runners (reference.md)"


def against(f: Forecast, cell: dict) -> dict:
    """A bench cell's figures beside the forecast (TPOT, TTFT at C=1): likely range, ratio to its middle, within."""
    c = cell["concurrency"]
    figs = {"output_throughput": next(fig for n, fig, _ in f.aggregate if n == c)}
    figs |= {"median_tpot_ms": f.floor_ms, "median_ttft_ms": f.ttft_ms} if c == 1 else {}
    out = {}
    for key, fig in figs.items():
        out[key], m = fig.to_json(), cell[key]
        if isinstance(fig, Figure):
            out[key] |= {"measured": m, "ratio": round(m * 2 / (fig.lo + fig.hi), 3), "within": fig.lo <= m <= fig.hi}
    return out
