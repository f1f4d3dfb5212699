"""The forecast's arithmetic (scripts/epyc/decisions/forecast.py) on the recorded dual Genoa (NPS1), dual Turin (NPS4) and
dual Milan hosts, for real model configs: bandwidth and parallelism move it the way physics says, a mixture of
experts reads its active share, a missing fact gives no forecast, and no likely range is faster than its bound."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest
import sysroots
from conftest import ROOT
from epyc import bundle
from epyc.decisions import estimate, sizing
from epyc.decisions import forecast as fc
from epyc.facts import cpuid, hostspec, remote_host

EPYC = bundle.load_epyc()
MODELS = ROOT / "tests" / "fixtures" / "models"


def detect(tmp_path, host: str) -> dict:
    """detect.py's document of a recorded host tree, in-process, and the facts cpu_tune sizes from."""
    root = sysroots.build(tmp_path / host, sysroots.HOSTS[host])
    facts = remote_host.gather_from_args(str(root), None)
    return {**cpuid.report(facts, EPYC), "_facts": facts}


def sized(model: str) -> tuple[dict, dict]:
    """(estimate_memory.py's document, the config) of a fixture model, counted from its config in bf16."""
    cfg = json.loads((MODELS / model / "config.json").read_text())
    req = estimate.Request(
        model, None, "bfloat16", 4096, 1, 2048, 2.0, 5.0, avx512_bf16=True, config=str(MODELS / model / "config.json")
    )
    return estimate.estimate(req, EPYC), cfg


def plan(det: dict, model: str, ranks: int = 1, measured_gbs=None, engines=1, **work) -> fc.Forecast:
    """The plan's forecast (forecast.plan_forecast, as launch.py plan makes it) of `model` on the host `det`: one
    engine on a socket, or `ranks` tensor-parallel ranks one a node, sized by cpu_tune's own rules; the bandwidth
    from data unless cpu_tune's probe measured `measured_gbs` on the first rank's cores."""
    est, _cfg = sized(model)
    req = sizing.SizingRequest(15, 0, 2.0, tensor_parallel=ranks, rank_table=est["tensor_parallel"])
    tune = sizing.tune(det["_facts"], EPYC, None, req)
    if measured_gbs:
        cpus = tune["ranks"][0]["cpus"]
        tune["measured"] = {"bytes_per_s": measured_gbs * 1e9, "bf16_flops_per_s": 1e12, "cpus": cpus}
    inputs = {"detect": det, "estimate_memory": est, "cpu_tune": tune}
    return fc.plan_forecast(inputs, EPYC, engines, **work)


def figures(f: fc.Forecast):
    """Every figure of a forecast with whether it is a rate (faster = larger) or a time."""
    yield f.floor_ms, False
    yield f.ceiling_tps, True
    yield from ((fig, True) for _c, fig, _limit in f.aggregate)
    yield f.ttft_ms, False
    yield f.load_s, False


def assert_sane(f: fc.Forecast):
    """No likely range is faster than its bound, none is empty, and the document is JSON."""
    for fig, rate in figures(f):
        if isinstance(fig, fc.Figure):
            assert 0 < fig.lo <= fig.hi, fig
            assert fig.hi <= fig.bound if rate else fig.bound <= fig.lo, fig
    doc = json.loads(json.dumps(f.to_json()))
    assert all(i["source"] for i in doc["inputs"]) and doc["shape"]["ranks"] == f.shape["ranks"]


def test_a_larger_bandwidth_generation_forecasts_faster(tmp_path):
    genoa, milan = detect(tmp_path, "genoa_9654_2s_smt"), detect(tmp_path, "milan_7763")
    assert (genoa["epyc_generation"], milan["epyc_generation"]) == ("Genoa", "Milan")
    g, m = plan(genoa, "falcon-40b"), plan(milan, "falcon-40b")
    assert_sane(g)
    # 12 x DDR5-4800 against 8 x DDR4-3200 a socket: 460.8 against 204.8 GB/s, the same bytes a step
    assert m.floor_ms.bound / g.floor_ms.bound == pytest.approx(460.8 / 204.8, rel=0.01)
    assert g.ceiling_tps.lo > m.ceiling_tps.lo and g.ceiling_tps.hi > m.ceiling_tps.hi
    bw = next(i for i in g.inputs if i.name == "memory_bandwidth_bytes_per_s")
    assert bw.value == 460.8e9 and "Genoa" in bw.source and "4c08d88" in bw.source
    est, _cfg = sized("falcon-40b")  # 122 GiB of weights and one sequence's KV at mid-decode, at 460.8 GB/s
    assert g.floor_ms.bound == pytest.approx((est["weight_bytes"] + est["kv_bytes_per_token"] * 576) / 460.8e6)
    # measured on the host, the forecast follows the measurement: the faster read, the faster stream
    slow, fast = plan(genoa, "falcon-40b", measured_gbs=300), plan(genoa, "falcon-40b", measured_gbs=400)
    assert fast.floor_ms.bound < slow.floor_ms.bound and fast.ceiling_tps.hi > slow.ceiling_tps.hi


def test_two_ranks_forecast_a_faster_single_stream_than_one_socket(tmp_path):
    genoa = detect(tmp_path, "genoa_9654_2s_smt")
    one, two = plan(genoa, "falcon-40b"), plan(genoa, "falcon-40b", ranks=2)
    assert two.shape["ranks"] == 2 and all(isinstance(f, fc.Figure) for f, _ in figures(two))
    assert 0.45 < two.floor_ms.bound / one.floor_ms.bound < 0.55  # each rank reads its half from its own socket
    assert two.ceiling_tps.lo > one.ceiling_tps.lo and two.ttft_ms.bound < one.ttft_ms.bound
    # dual Turin NPS4, measured 90 GB/s on a node: eight ranks, each on its node, against one engine whose memory
    # is its socket's first node (what cpu_tune binds), the same per-node bandwidth
    turin = detect(tmp_path, "turin_9755_2s_nps4")
    assert (turin["epyc_generation"], turin["numa_node_count"]) == ("Turin", 8)
    node, eight = plan(turin, "falcon-40b", measured_gbs=90), plan(turin, "falcon-40b", ranks=8, measured_gbs=90)
    assert eight.floor_ms.bound < node.floor_ms.bound / 6
    for f in (one, two, node, eight):
        assert_sane(f)


def test_one_engine_on_an_nps4_socket_draws_its_first_node_only(tmp_path):
    """vLLM keeps an engine's memory on its first core's node: on a Genoa socket split in four nodes, one engine
    over the whole socket is forecast at a quarter of the socket's channels, not all twelve."""
    spec = dataclasses.replace(sysroots.HOSTS["genoa_9654_2s_smt"], nodes_per_socket=4, node_mem_gib=96.0)
    facts = remote_host.gather_from_args(str(sysroots.build(tmp_path / "nps4", spec)), None)
    det = {**cpuid.report(facts, EPYC), "_facts": facts}
    bw = next(i for i in plan(det, "Llama-3.1-8B-Instruct").inputs if i.name == "memory_bandwidth_bytes_per_s")
    assert bw.value == pytest.approx(460.8e9 / 4) and "0.25 of the socket's channels" in bw.source


def test_a_mixture_of_experts_step_reads_its_active_share(tmp_path):
    genoa = detect(tmp_path, "genoa_9654_2s_smt")
    est, cfg = sized("DeepSeek-V2-Lite")
    assert est["active_weight_bytes"] < est["weight_bytes"] / 4  # 6 of 64 routed experts a token
    moe = plan(genoa, "DeepSeek-V2-Lite")
    step = moe.floor_ms.bound / 1000 * 460.8e9  # the bytes the floor reads
    assert step == pytest.approx(est["active_weight_bytes"] + est["kv_bytes_per_token"] * (512 + 64), rel=0.01)
    layer, head = fc.model_params(cfg)
    assert layer < fc.config_params(cfg)[1] / 4 and head == 102400 * 2048  # its FLOPs: the active experts too
    dense = fc.model_params(json.loads((MODELS / "Llama-3.1-8B-Instruct" / "config.json").read_text()))[0]
    assert dense == fc.config_params(json.loads((MODELS / "Llama-3.1-8B-Instruct" / "config.json").read_text()))[1]
    assert_sane(moe)


def test_a_generation_without_checked_data_gives_no_forecast_and_says_why(tmp_path):
    turin = detect(tmp_path, "turin_9755_2s_nps4")
    doc = plan(turin, "falcon-40b").to_json()  # EPYC 9005's DDR5 rate: no checked source
    assert doc["decode"]["floor_ms_per_token"] == doc["decode"]["ceiling_tokens_per_s"]
    why = doc["decode"]["floor_ms_per_token"]
    assert why["available"] is False and why["why"].startswith("no forecast: memory_bandwidth_bytes_per_s")
    assert "DDR5 rate" in why["why"] and all(a["tokens_per_s"]["available"] is False for a in doc["aggregate"])
    milan = plan(detect(tmp_path, "milan_7763"), "falcon-40b")  # no AVX-512 BF16: its rate is not in the data
    assert isinstance(milan.floor_ms, fc.Figure) and "no AVX-512 BF16" in milan.ttft_ms.why
    bergamo = detect(tmp_path, "bergamo_9754")  # Zen 4c: its datapath not checked
    assert "Zen 4c" in plan(bergamo, "falcon-40b").ttft_ms.why
    # the 9654's clock is in the SKU table (its all-core boost); a masked brand names no part: no compute, no
    # prefill, no aggregate -- the decode floor stands
    genoa = detect(tmp_path, "genoa_9654_2s_smt")
    clock = fc.sku_clock(next(r for r in json.loads(hostspec.SKUS_JSON.read_text())["skus"] if r["model"] == "9654"))
    assert clock.value == 3.55 and clock.source == "data:epyc_skus.all_core_boost_ghz"
    no_clock = plan({**genoa, "epyc_model_number": None}, "falcon-40b")
    assert isinstance(no_clock.floor_ms, fc.Figure) and "no clock for a part not in the table" in no_clock.ttft_ms.why
    assert all(isinstance(f, fc.Missing) for _c, f, _l in no_clock.aggregate)
    assert fc.memory_bandwidth(EPYC, "Bergamo/Siena", 1, 128).value is None  # masked CPUID: two platforms


def test_the_aggregate_grows_with_concurrency_until_compute_bound(tmp_path):
    genoa = detect(tmp_path, "genoa_9654_2s_smt")
    f = plan(genoa, "falcon-40b", concurrency=(1, 2, 4, 8, 16, 32, 64, 128, 256))
    rates = [fig.bound for _c, fig, _l in f.aggregate]
    limits = [lim for _c, _f, lim in f.aggregate]
    assert rates == sorted(rates) and limits[0] == "memory" and limits[-1] == "compute"
    knee = limits.index("compute")
    assert rates[1] / rates[0] > 1.9  # one weight read serves the batch: twice the requests, twice the tokens
    assert rates[-1] / rates[knee] < 1.1  # then the cores' compute is the roof
    fleet = plan(genoa, "falcon-40b", engines=2, concurrency=(8,))  # a fleet of two: the sum of the engines
    alone = plan(genoa, "falcon-40b", concurrency=(4,))
    assert fleet.aggregate[0][1].bound == pytest.approx(2 * alone.aggregate[0][1].bound)
    assert fleet.floor_ms == alone.floor_ms  # a stream is one engine's
    assert_sane(f)
    assert_sane(fleet)


# the runs the efficiencies came from (reference.md, measurements): host, model, the bandwidth and bf16 compute the
# bound used (GB/s, GFLOP/s: None = not probed, the peak of 2 cores x 4.4 GHz x 64 from data), and per input length
# the measured TPOT, TTFT (ms) and output tokens/s at C = 1, 4, 8
RUNS = [
    (
        "Genoa runner 2026-12-01",
        "Qwen3-0.6B",
        57.7,
        None,
        {128: (50.7, 416, 19.0, 62.7, 100.2), 512: (52.5, 1121, 16.7, 38.5, 42.9)},
    ),
    (
        "Turin runner 2026-12-07 07:23",
        "Qwen3-0.6B",
        42.64,
        679.1,
        {128: (39.3, 237.3, 24.7, 64.7, 104.1), 512: (50.3, 697.0, 18.5, 50.5, 71.7)},
    ),
    (
        "Turin runner 2026-12-07 07:35",
        "tiny",
        46.06,
        869.0,
        {128: (5.8, 15.3, 201.5, 1632.0, 920.2), 512: (8.6, 24.2, 139.2, 877.0, 1328.8)},
    ),
    (
        "Turin runner 2026-12-07 11:30",
        "Qwen3-0.6B",
        38.86,
        774.6,
        {128: (33.9, 211.2, 27.4, 68.5, 110.4), 512: (34.5, 681.6, 24.4, 48.1, 60.6)},
    ),
    (
        "Turin runner 2026-12-07 11:42",
        "tiny",
        39.82,
        748.9,
        {128: (4.8, 18.6, 192.3, 477.7, 1170.3), 512: (6.9, 19.5, 169.1, 449.1, 1007.0)},
    ),
]


def tiny_config(tmp_path) -> str:
    """The e2e tests' tiny Qwen3 (tests/tools/build_test_model.py's shape) as a config file."""
    spec = importlib.util.spec_from_file_location("build_test_model", ROOT / "tests" / "tools" / "build_test_model.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    cfg = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg | builder.SHAPES["tiny"]))
    return str(tmp_path / "config.json")


@pytest.mark.parametrize("host, model, gbs, gflops, measured", RUNS, ids=[f"{r[0]} {r[1]}" for r in RUNS])
def test_the_runs_the_efficiencies_came_from_fall_in_their_likely_ranges(tmp_path, host, model, gbs, gflops, measured):
    """Each run's measured figures are in the forecast's likely range, at the bandwidth and compute it ran with."""
    path = tiny_config(tmp_path) if model == "tiny" else str(MODELS / model / "config.json")
    req = estimate.Request(model, None, "bfloat16", 4096, 1, 2048, 2.0, 5.0, avx512_bf16=True, config=path)
    est, cfg = estimate.estimate(req, EPYC), json.loads(open(path).read())
    where = "measured: the probe" if gflops else "data: the peak"
    compute = fc.Fact("bf16_flops_per_s", (gflops or 2 * 4.4 * 64) * 1e9, where)
    rank = fc.Rank(est["weight_bytes"], est["kv_bytes_per_token"], fc.Fact("bw", gbs * 1e9, "measured"), compute)
    read, download = fc.load_rates(EPYC)
    for prompt, (tpot, ttft, *rates) in measured.items():
        w = fc.Workload(*fc.model_params(cfg), prompt_tokens=prompt)
        f = fc.forecast(EPYC, (rank,), w, fc.Load(est["weight_bytes"], 0, read, download))
        assert f.floor_ms.bound < f.floor_ms.lo <= tpot <= f.floor_ms.hi, (prompt, f.floor_ms)
        assert f.ttft_ms.lo <= ttft <= f.ttft_ms.hi, (prompt, f.ttft_ms)
        for r, (c, fig, _l) in zip(rates, f.aggregate):
            assert fig.lo <= r <= fig.hi, (prompt, c, r, fig)
        # bench's verdict on the same figures (forecast.against): within, the ratio to the likely middle
        cell = {"concurrency": 1, "median_tpot_ms": tpot, "median_ttft_ms": ttft, "output_throughput": rates[0]}
        held = fc.against(f, cell)
        assert all(h["within"] for h in held.values()) and len(held) == 3
        assert held["median_tpot_ms"]["ratio"] == round(tpot * 2 / (f.floor_ms.lo + f.floor_ms.hi), 3)
        assert_sane(f)


def test_the_pinned_efficiencies_are_ranges_of_fractions_with_their_sources():
    for row in EPYC["forecast"]["efficiency"] + EPYC["forecast"]["assumptions"]:
        assert 0 < row["lo"] <= row["hi"], row
        assert row["name"].endswith(("_s", "_ms")) or "bytes_per_s" in row["name"] or row["hi"] <= 1, row
    for row in EPYC["forecast"]["memory"] + EPYC["forecast"]["bf16_flops_per_cycle"]:
        figures_ = [row.get(k) for k in ("channels", "mt_per_s", "flops") if k in row]
        assert all(figures_) or row["why"], row  # a null is a fact not checked, and says why
    zen4 = fc.Fact("clock_ghz", 1.0, "assumption: 1 GHz")
    assert fc.bf16_compute(EPYC, "Zen4", 1, zen4).value == 64e9  # VDPBF16PS: one 512-bit op a cycle, 64 FLOPs
    assert fc.bf16_compute(EPYC, "Zen5", 1, zen4).value == 128e9
