"""bench.py: the summary math on `vllm bench serve` results (recorded from a real run on this bundle's
runner, and hand-made edge cases), the exact argv it runs, and bad input."""
import json
import sys
from pathlib import Path

import pytest

import bench

RECORDED = Path(__file__).parent / "fixtures" / "bench"


def run(ttft, tpot, itl, e2el, out_tps, total_tps, completed=10, failed=0):
    return {"median_ttft_ms": ttft, "median_tpot_ms": tpot, "median_itl_ms": itl, "median_e2el_ms": e2el,
            "output_throughput": out_tps, "total_token_throughput": total_tps, "completed": completed,
            "failed": failed}


def test_a_cell_is_the_mean_of_the_repeats_medians_with_the_spread():
    runs = [bench.run_metrics(run(100, 40, 38, 5000, 25, 50)), bench.run_metrics(run(120, 44, 40, 5600, 23, 46)),
            bench.run_metrics(run(110, 42, 39, 5300, 24, 48))]
    cell = bench.summarise_cell(runs)
    assert cell["median_ttft_ms"] == 110 and cell["median_ttft_ms_spread"] == 20
    assert cell["median_tpot_ms"] == 42 and cell["median_tpot_ms_spread"] == 4
    assert cell["output_throughput"] == 24 and cell["output_throughput_spread"] == 2
    assert (cell["repeats"], cell["completed"], cell["failed"]) == (3, 30, 0)


def test_failed_requests_are_summed_never_averaged_away():
    cell = bench.summarise_cell([bench.run_metrics(run(1, 1, 1, 1, 1, 1, failed=0)),
                                 bench.run_metrics(run(1, 1, 1, 1, 1, 1, completed=8, failed=2))])
    assert cell["failed"] == 2 and "**2**" in bench.markdown([{**cell, "input_len": 128, "concurrency": 4}])


@pytest.mark.parametrize("doc,needle", [
    ({}, "median_ttft_ms"),
    ({**run(1, 1, 1, 1, 1, 1), "median_tpot_ms": None}, "median_tpot_ms"),
    ({**run(1, 1, 1, 1, 1, 1), "output_throughput": "fast"}, "output_throughput"),
    ([1, 2], "JSON object"),
])
def test_partial_or_bad_results_are_refused(doc, needle):
    with pytest.raises(ValueError, match=needle):
        bench.run_metrics(doc)


def test_recorded_results_from_a_real_run():
    """Results written by `vllm bench serve` 0.32 against this bundle's tiny test model (kept as fixtures)."""
    files = sorted(RECORDED.glob("*.json"))
    assert files, "tests/fixtures/bench holds recorded vllm bench serve results"
    for f in files:
        m = bench.run_metrics(json.loads(f.read_text()))
        assert m["median_tpot_ms"] > 0 and m["output_throughput"] > 0 and m["failed"] == 0


def test_decode_bound():
    # 1.11 GiB of weights read at 60 GB/s: ~19.9 ms per token at best; a measured 42 ms is 47 % of the bound
    b = bench.decode_bound(int(1.11 * 2**30), 60e9, 42.0)
    assert b["min_tpot_ms"] == pytest.approx(19.86, abs=0.01) and b["fraction_of_bound"] == pytest.approx(0.473, abs=0.001)
    assert bench.decode_bound(None, 60e9, 42.0) == {"min_tpot_ms": None, "fraction_of_bound": None}


def test_bench_argv_is_vllms_own_benchmark_with_the_method():
    argv = bench.bench_argv(["/v/bin/vllm"], "http://127.0.0.1:8000/v1", "tiny", "/m/tiny", "chat_completions",
                            128, 128, 4, "/r", "in128_c4_r1.json", seed=7)
    assert argv[:3] == ["/v/bin/vllm", "bench", "serve"] and "--ignore-eos" in argv
    pairs = dict(zip(argv[3::1], argv[4::1]))
    assert pairs["--base-url"] == "http://127.0.0.1:8000" and pairs["--endpoint"] == "/v1/chat/completions"
    assert pairs["--num-prompts"] == "40" and pairs["--max-concurrency"] == "4"
    assert pairs["--percentile-metrics"] == "ttft,tpot,itl,e2el" and pairs["--backend"] == "openai-chat"
    # a seed of its own per run (no prefix-cache hits on a repeat's prompts), warm-up before measuring
    assert pairs["--seed"] == "7" and pairs["--num-warmups"] == "4"
    comp = bench.bench_argv(["vllm"], "http://h:1/v1", "m", "t", "completions", 512, 64, 1, "/r", "x.json", seed=1)
    assert dict(zip(comp, comp[1:]))["--endpoint"] == "/v1/completions"


@pytest.mark.parametrize("args,needle", [
    (["--concurrency", "0"], "positive whole numbers"), (["--input-lens", "x"], "positive whole numbers"),
    (["--input-lens", "8,8"], "repeats a value"), (["--concurrency", "1,,2"], "positive whole numbers"),
    (["--concurrency", "1_0"], "positive whole numbers"), (["--concurrency", "\u0661"], "positive whole numbers"),
    (["--input-lens", " 1 "], "positive whole numbers"), (["--seed", "-1"], "out of range"),
    (["--repeats", "0"], "out of range"), (["--plan", "/nonexistent.json"], "cannot read"),
])
def test_bad_arguments(script, args, needle):
    r = script("bench.py", *(["--plan", "/nonexistent.json"] if "--plan" not in args else []), *args)
    assert r.code == 1 and needle in r.doc["error"]


def test_side_by_side_gives_each_sizing_its_ratio_to_the_best():
    def cell(tps, conc=1):
        return {"input_len": 128, "concurrency": conc, "output_throughput": tps, "output_throughput_spread": 1.0,
                "median_tpot_ms": 1000 / tps, "failed": 0}
    cmp = bench.side_by_side({"skill": [cell(20.0), cell(70.0, 4)], "vllm-default": [cell(13.5), cell(37.0, 4)],
                              "unpinned": [cell(10.0), cell(80.0, 4)]})
    assert cmp["sizings"] == ["skill", "vllm-default", "unpinned"]
    c1, c4 = cmp["table"]
    assert c1["sizings"]["skill"]["ratio_to_best"] == 1.0 and c1["sizings"]["vllm-default"]["ratio_to_best"] == 0.675
    assert c4["sizings"]["unpinned"]["ratio_to_best"] == 1.0 and c4["sizings"]["skill"]["ratio_to_best"] == 0.875
    md = bench.compare_markdown(cmp)
    assert "| 128 | 1 | 20.0 ±1.0 (1.00) | 13.5 ±1.0 (0.68) | 10.0 ±1.0 (0.50) |" in md


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e308, 1e9 + 1, -1.0])
def test_a_figure_no_run_could_measure_is_refused(bad):
    """json.loads takes NaN / Infinity; a summary built on one would not be JSON, and two repeats of 1e308
    overflow the mean (the fourth audit): every figure is a number in [0, 1e9]."""
    doc = {f"median_{m}_ms": 1.0 for m in bench.METRICS} | {"output_throughput": 1.0, "total_token_throughput": 2.0,
                                                          "completed": 10, "failed": 0}
    for key in ("median_ttft_ms", "median_e2el_ms", "output_throughput", "completed", "failed"):
        with pytest.raises(ValueError, match=key):
            bench.run_metrics({**doc, key: bad})
    edge = bench.run_metrics({**doc, "median_ttft_ms": 1e9, "failed": 0})
    assert edge["median_ttft_ms"] == 1e9 and bench.summarise_cell([edge, edge])["median_ttft_ms"] == 1e9


def test_the_plot_is_a_png_of_the_cells_and_optional(tmp_path, monkeypatch):
    """plot.png: throughput and TPOT against concurrency per input length, from the summary's cells."""
    cells = [{"input_len": n, "concurrency": c, "output_throughput": 10.0 * c, "median_tpot_ms": 40.0 + c}
             for n in (128, 512) for c in (1, 4, 8)]
    out = bench.plot(cells, tmp_path / "plot.png")
    assert out == str(tmp_path / "plot.png")
    data = (tmp_path / "plot.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed: no plot, no error
    assert bench.plot(cells, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()

