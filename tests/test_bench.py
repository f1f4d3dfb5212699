"""bench.py: the summary math on `vllm bench serve` results (recorded from a real run on this bundle's
runner, and hand-made edge cases), the exact argv it runs, and bad input."""

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    calls,
    container_plan,
    host_plan,
)
from epyc.errors import ScriptError
from epyc.verbs import bench_plan, bench_report, benchmark

RECORDED = Path(__file__).parent / "fixtures" / "bench"


def run(ttft, tpot, itl, e2el, out_tps, total_tps, completed=10, failed=0):
    return {
        "median_ttft_ms": ttft,
        "median_tpot_ms": tpot,
        "median_itl_ms": itl,
        "median_e2el_ms": e2el,
        "output_throughput": out_tps,
        "total_token_throughput": total_tps,
        "completed": completed,
        "failed": failed,
    }


def test_a_cell_is_the_mean_of_the_repeats_medians_with_the_spread():
    runs = [
        benchmark.run_metrics(run(100, 40, 38, 5000, 25, 50)),
        benchmark.run_metrics(run(120, 44, 40, 5600, 23, 46)),
        benchmark.run_metrics(run(110, 42, 39, 5300, 24, 48)),
    ]
    cell = benchmark.summarise_cell(runs)
    assert cell["median_ttft_ms"] == 110 and cell["median_ttft_ms_spread"] == 20
    assert cell["median_tpot_ms"] == 42 and cell["median_tpot_ms_spread"] == 4
    assert cell["output_throughput"] == 24 and cell["output_throughput_spread"] == 2
    assert (cell["repeats"], cell["completed"], cell["failed"]) == (3, 30, 0)


def test_failed_requests_are_summed_never_averaged_away():
    cell = benchmark.summarise_cell(
        [
            benchmark.run_metrics(run(1, 1, 1, 1, 1, 1, failed=0)),
            benchmark.run_metrics(run(1, 1, 1, 1, 1, 1, completed=8, failed=2)),
        ]
    )
    assert cell["failed"] == 2 and "**2**" in bench_report.markdown([{**cell, "input_len": 128, "concurrency": 4}])


@pytest.mark.parametrize(
    "doc,needle",
    [
        ({}, "median_ttft_ms"),
        ({**run(1, 1, 1, 1, 1, 1), "median_tpot_ms": None}, "median_tpot_ms"),
        ({**run(1, 1, 1, 1, 1, 1), "output_throughput": "fast"}, "output_throughput"),
        ([1, 2], "JSON object"),
    ],
)
def test_partial_or_bad_results_are_refused(doc, needle):
    with pytest.raises(ValueError, match=needle):
        benchmark.run_metrics(doc)


def test_recorded_results_from_a_real_run():
    """Results written by `vllm bench serve` 0.32 against this bundle's tiny test model (kept as fixtures)."""
    files = sorted(RECORDED.glob("*.json"))
    assert files, "tests/fixtures/bench holds recorded vllm bench serve results"
    for f in files:
        m = benchmark.run_metrics(json.loads(f.read_text()))
        assert m["median_tpot_ms"] > 0 and m["output_throughput"] > 0 and m["failed"] == 0


def test_decode_bound():
    # 1.11 GiB of weights read at 60 GB/s: ~19.9 ms per token at best; a measured 42 ms is 47 % of the bound
    b = benchmark.decode_bound(int(1.11 * 2**30), 60e9, 42.0)
    assert b["min_tpot_ms"] == pytest.approx(19.86, abs=0.01) and b["fraction_of_bound"] == pytest.approx(
        0.473, abs=0.001
    )
    assert b["gap_ms_per_token"] == pytest.approx(42.0 - 19.86, abs=0.01)
    assert benchmark.decode_bound(None, 60e9, 42.0) == {
        "min_tpot_ms": None,
        "fraction_of_bound": None,
        "gap_ms_per_token": None,
    }
    # a step reads the weights and its context's KV
    est = {"weight_bytes": 1000, "kv_bytes_per_token": 10}
    assert benchmark.step_bytes(est, 50) == 1500 and benchmark.step_bytes({}, 50) is None


def test_the_summary_names_the_bounds_bytes_bandwidth_and_gap_and_the_host():
    from epyc.verbs.bench_report import bound_and_host

    host = {
        "cpu_model": "AMD EPYC 9654",
        "logical_cores": 2,
        "vllm": "0.32.0",
        "backend": "zentorch",
        "date": "2026-12-05",
    }
    doc = {"host": host, "bound_bytes_per_step": 1_210_449_920, "memory_bandwidth_gbs": 31.0, "bandwidth_cpus": [0, 1]}
    doc.update(benchmark.decode_bound(1_210_449_920, 31.0e9, 68.0))
    text = bound_and_host(doc)
    assert "AMD EPYC 9654, 2 vCPUs, vLLM 0.32.0 (zentorch), 2026-12-05" in text
    assert "1.21 GB read per step (weights + KV) at 31.0 GB/s on CPUs 0,1 = 39.0 ms per token" in text
    assert "measured 68.0 ms, 29.0 ms per token above it" in text
    doc.update(benchmark.decode_bound(None, None, 68.0))  # --no-bandwidth: the host only
    assert "Decode bound" not in bound_and_host(doc) and "AMD EPYC 9654" in bound_and_host(doc)


def test_bench_argv_is_vllms_own_benchmark_with_the_method():
    argv = benchmark.bench_argv(
        ["/v/bin/vllm"],
        "http://127.0.0.1:8000/v1",
        "tiny",
        "/m/tiny",
        "chat_completions",
        128,
        128,
        4,
        "/r",
        "in128_c4_r1.json",
        seed=7,
    )
    assert argv[:3] == ["/v/bin/vllm", "bench", "serve"] and "--ignore-eos" in argv
    pairs = dict(zip(argv[3::1], argv[4::1]))
    assert pairs["--base-url"] == "http://127.0.0.1:8000" and pairs["--endpoint"] == "/v1/chat/completions"
    assert pairs["--num-prompts"] == "40" and pairs["--max-concurrency"] == "4"
    assert pairs["--percentile-metrics"] == "ttft,tpot,itl,e2el" and pairs["--backend"] == "openai-chat"
    # a seed of its own per run (no prefix-cache hits on a repeat's prompts), warm-up before measuring
    assert pairs["--seed"] == "7" and pairs["--num-warmups"] == "4"
    comp = benchmark.bench_argv(["vllm"], "http://h:1/v1", "m", "t", "completions", 512, 64, 1, "/r", "x.json", seed=1)
    assert dict(zip(comp, comp[1:]))["--endpoint"] == "/v1/completions"


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--concurrency", "0"], "positive whole numbers"),
        (["--input-lens", "x"], "positive whole numbers"),
        (["--input-lens", "8,8"], "repeats a value"),
        (["--concurrency", "1,,2"], "positive whole numbers"),
        (["--concurrency", "1_0"], "positive whole numbers"),
        (["--concurrency", "\u0661"], "positive whole numbers"),
        (["--input-lens", " 1 "], "positive whole numbers"),
        (["--seed", "-1"], "out of range"),
        (["--repeats", "0"], "out of range"),
        (["--plan", "/nonexistent.json"], "cannot read"),
    ],
)
def test_bad_arguments(script, args, needle):
    r = script("bench.py", *(["--plan", "/nonexistent.json"] if "--plan" not in args else []), *args)
    assert r.code == 1 and needle in r.doc["error"]


def test_side_by_side_gives_each_sizing_its_ratio_to_the_best():
    def cell(tps, conc=1):
        return {
            "input_len": 128,
            "concurrency": conc,
            "output_throughput": tps,
            "output_throughput_spread": 1.0,
            "median_tpot_ms": 1000 / tps,
            "failed": 0,
        }

    cmp = bench_report.side_by_side(
        {
            "skill": [cell(20.0), cell(70.0, 4)],
            "vllm-default": [cell(13.5), cell(37.0, 4)],
            "unpinned": [cell(10.0), cell(80.0, 4)],
        }
    )
    assert cmp["sizings"] == ["skill", "vllm-default", "unpinned"]
    c1, c4 = cmp["table"]
    assert c1["sizings"]["skill"]["ratio_to_best"] == 1.0 and c1["sizings"]["vllm-default"]["ratio_to_best"] == 0.675
    assert c4["sizings"]["unpinned"]["ratio_to_best"] == 1.0 and c4["sizings"]["skill"]["ratio_to_best"] == 0.875
    md = bench_report.compare_markdown(cmp)
    assert "| 128 | 1 | 20.0 ±1.0 (1.00) | 13.5 ±1.0 (0.68) | 10.0 ±1.0 (0.50) |" in md


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e308, 1e9 + 1, -1.0])
def test_a_figure_no_run_could_measure_is_refused(bad):
    """json.loads takes NaN / Infinity; a summary built on one would not be JSON, and two repeats of 1e308
    overflow the mean (the fourth audit): every figure is a number in [0, 1e9]."""
    doc = {f"median_{m}_ms": 1.0 for m in benchmark.METRICS} | {
        "output_throughput": 1.0,
        "total_token_throughput": 2.0,
        "completed": 10,
        "failed": 0,
    }
    for key in ("median_ttft_ms", "median_e2el_ms", "output_throughput", "completed", "failed"):
        with pytest.raises(ValueError, match=key):
            benchmark.run_metrics({**doc, key: bad})
    edge = benchmark.run_metrics({**doc, "median_ttft_ms": 1e9, "failed": 0})
    assert edge["median_ttft_ms"] == 1e9 and benchmark.summarise_cell([edge, edge])["median_ttft_ms"] == 1e9


def test_the_plot_is_a_png_of_the_cells_and_optional(tmp_path, monkeypatch):
    """plot.png: throughput and TPOT against concurrency per input length, from the summary's cells."""
    cells = [
        {"input_len": n, "concurrency": c, "output_throughput": 10.0 * c, "median_tpot_ms": 40.0 + c}
        for n in (128, 512)
        for c in (1, 4, 8)
    ]
    out = bench_report.plot(cells, tmp_path / "plot.png")
    assert out == str(tmp_path / "plot.png")
    data = (tmp_path / "plot.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed: no plot, no error
    assert bench_report.plot(cells, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def test_bench_and_kernel_proof_refuse_another_plans_run_in_the_state_dir(script, inputs, live_tune, tmp_path):
    """F6: bench (with the plan's endpoint known) loaded whatever answered on its port and wrote its
    bench-* folder into the other server's state dir; kernel_proof --plan read the other run's log as
    this plan's proof."""
    from epyc.deployments import serve_start, serve_state, serve_stop

    _, a = host_plan(tmp_path, inputs, live_tune)
    c_file, c = host_plan(tmp_path, inputs, live_tune)  # the same folder, another port
    assert c["primary_endpoint"] != "unknown"
    serve_start.start(a, confirm=True)
    try:
        before = sorted(os.listdir(a["state_dir"]))
        r = script("bench.py", "--plan", str(c_file), "--repeats", "1", "--no-bandwidth")
        assert r.code == 1 and "another plan" in r.doc["error"] and f"port {a['port']}" in r.doc["error"], r.doc
        assert sorted(os.listdir(a["state_dir"])) == before
        k = script("kernel_proof.py", "--plan", str(c_file))
        assert k.code == 1 and "another plan" in k.doc["error"] and "proves nothing" in k.doc["error"], k.doc
        os.killpg(serve_state.read_state(a)["pgid"], signal.SIGKILL)  # A crashes: its state stays, stale
        time.sleep(0.5)
        v = script("launch.py", "verify", "--plan", str(c_file), "--timeout", "5")
        assert v.code == 1 and "another plan's ended run" in v.doc["error"], v.doc
    finally:
        serve_stop.stop(a)


def test_bench_writes_only_into_a_new_or_empty_out_folder(script, inputs, rt, tmp_path):
    """Twenty-eighth audit, F4: `--out` took any folder, and what was planted in it took bench's writes
    elsewhere: a link named plot.png (matplotlib's savefig follows it), raw/NAME.json (vllm bench serve
    writes it), skill/ under --compare; `--out /` filled the root with results. A non-empty --out is
    refused before anything runs, and the plot is written as bench's other files are, never via a link."""
    from epyc.errors import ScriptError
    from epyc.verbs import bench_report

    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    (out / "plot.png").symlink_to(victim)
    for args in ([], ["--compare"]):
        r = script("bench.py", "--plan", str(plan_file), "--out", str(out), *args, env=rt[1], timeout=120)
        assert r.code == 1 and "is not empty (it holds 'plot.png')" in r.doc["error"], r.doc
        assert "a new or empty folder" in r.doc["fix"] and victim.read_text() == "keep"
    with pytest.raises(ScriptError, match="symbolic link"):
        bench_report.plot(
            [{"input_len": 16, "concurrency": 1, "output_throughput": 5.0, "median_tpot_ms": 9.0}], out / "plot.png"
        )
    assert victim.read_text() == "keep"
    (out / "plot.png").unlink()
    written = bench_report.plot(
        [{"input_len": 16, "concurrency": 1, "output_throughput": 5.0, "median_tpot_ms": 9.0}], out / "plot.png"
    )
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and written == str(out / "plot.png")


def test_bench_refuses_an_out_folder_inside_the_plans_state_dir(script, inputs, rt, tmp_path):
    """start then refused the state dir ("already holds other files (mine)")."""
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    Path(plan["state_dir"]).mkdir(parents=True)
    r = script("bench.py", "--plan", str(plan_file), "--out", str(Path(plan["state_dir"]) / "mine"), env=env)
    assert r.code == 1 and "inside the plan's state dir" in r.doc["error"] and "--out" in r.doc["fix"], r.doc
    assert not (Path(plan["state_dir"]) / "mine").exists()


def test_a_bench_matrix_longer_than_the_plan_serves_is_refused_before_anything_runs(script, inputs, rt, tmp_path):
    """F5: a plan served at --max-model-len 4096 got `--random-input-len 1000000 --random-output-len 65536`;
    vLLM answers 400 to every such request and bench ended blaming the endpoint. Refused up front; a
    concurrency past --max-num-seqs is run, with a warning that its latencies include the queue."""
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    limit, seqs = plan["max_model_len"], plan["sizing"]["max_num_seqs"]
    before = len(calls(d))
    r = script(
        "bench.py",
        "--plan",
        str(plan_file),
        "--input-lens",
        str(limit),
        "--output-len",
        "1",
        "--out",
        str(tmp_path / "b"),
        env=env,
        timeout=120,
    )
    assert r.code == 1 and f"is {limit + 1} tokens a request, past the plan's --max-model-len {limit}" in r.doc["error"]
    assert f"within {limit} tokens" in r.doc["fix"] and len(calls(d)) == before  # not even asked about the server
    assert not (tmp_path / "b").exists()
    assert bench_plan.matrix_against_the_plan(
        {**plan, "primary_endpoint": "completions"}, [limit - 1], 1, [1], 128
    ) == (
        None,
        [],
    )
    seqs = bench_plan.served_max_num_seqs(plan, 128)
    assert f"--max-num-seqs {seqs}" in plan["command"]  # the skill's sizing passes the flag: that is the limit
    error, warnings = bench_plan.matrix_against_the_plan(plan, [16], 16, [1, seqs, seqs + 1, 4 * seqs], 128)
    assert error is None and warnings == [
        {
            "check": "concurrency",
            "fix": None,
            "message": f"--concurrency {seqs + 1},{4 * seqs} is past the --max-num-seqs {seqs} the server runs with: it "
            f"runs {seqs} at once and queues the rest, so TTFT and E2EL include that wait",
        }
    ]


def test_host_bench_measures_only_this_plans_own_server(script, tmp_path, inputs, live_tune):
    """F1: a host plan that started nothing benched whatever answered on its port (another plan's server, its
    own state dir) and filed the figures under this plan, costed with this plan's weights. bench now needs
    the server this plan's start recorded, as a container plan needs its recorded container."""
    import socket
    from pathlib import Path

    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    with socket.socket() as s:  # someone's server on the plan's port
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", plan["port"]))
        s.listen()
        r = script(
            "bench.py",
            "--plan",
            str(plan_file),
            "--repeats",
            "1",
            "--input-lens",
            "16",
            "--concurrency",
            "1",
            "--output-len",
            "4",
            "--no-bandwidth",
        )
    assert r.code == 1 and r.doc["error"] == "no server from this plan is running (no state file)", r.doc
    assert "launch.py start --plan <plan.json> --confirm, then verify, then bench" in r.doc["fix"]
    state_dir = Path(plan["state_dir"])
    assert not state_dir.exists() or not list(state_dir.glob("bench-*"))  # nothing measured, nothing filed


def test_a_refused_bench_takes_back_the_out_folder_it_made(script, tmp_path, inputs, live_tune):
    """bench --out NEW made NEW (and its missing parents) before it found no server of this plan's own, and
    left them: an empty folder that passes for a result, and whose next --out use worked only because it
    was empty. A refusal now removes what it made; a folder the user made beforehand stays."""
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    new = tmp_path / "results" / "run1"
    args = ["--repeats", "1", "--input-lens", "16", "--concurrency", "1", "--output-len", "4", "--no-bandwidth"]
    r = script("bench.py", "--plan", str(plan_file), "--out", str(new), *args)
    assert r.code == 1 and r.doc["error"] == "no server from this plan is running (no state file)", r.doc
    assert not (tmp_path / "results").exists()  # run1 and the parent it made
    mine = tmp_path / "mine"
    mine.mkdir()
    r = script("bench.py", "--plan", str(plan_file), "--out", str(mine), *args)
    assert r.code == 1 and mine.is_dir()  # the user's own (empty) folder is not bench's to remove


@pytest.mark.parametrize("out", ["new/run1", None, "a/../b/c", "afile/sub"])
def test_a_refused_container_bench_makes_nothing(script, tmp_path, inputs, rt, out):
    """The container path made --out and its raw/ before it found no container of this plan's own (and left
    them, as did the default bench-TIME folder, and `new/../x` left `new`). Every refusal now comes before
    anything is made; an --out that cannot be made is refused by name, before the server is even asked."""
    from conftest import container_plan

    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    _, env = rt
    (tmp_path / "afile").write_text("x")
    before = sorted(p.name for p in tmp_path.iterdir())
    args = ["--repeats", "1", "--input-lens", "16", "--concurrency", "1", "--output-len", "4", "--no-bandwidth"]
    where = ["--out", str(tmp_path) + "/" + out] if out else []
    r = script("bench.py", "--plan", str(plan_file), *where, *args, env=env)
    assert r.code == 1, r.doc
    if out == "a/../b/c":
        assert "'..'" in r.doc["error"], r.doc
    elif out == "afile/sub":
        assert "not a folder this user may write in" in r.doc["error"], r.doc
    else:
        assert r.doc["error"].startswith("no server from this plan is running"), r.doc
    assert sorted(p.name for p in tmp_path.iterdir()) == before and not list(tmp_path.glob("st/bench-*"))


def test_bench_refuses_an_unsettled_endpoint_before_it_makes_the_out_folder(tmp_path, inputs, live_tune, monkeypatch):
    """An unknown endpoint that verify has not settled was refused inside the runs, after --out/raw was made."""
    import bench
    from epyc.errors import ScriptError

    plan_file, _ = host_plan(tmp_path, inputs, live_tune, edit=lambda d: d["check_model"].update(primary_endpoint=None))
    from epyc.verbs import bench_plan

    monkeypatch.setattr(bench_plan, "require_own_host_server", lambda plan, state: None)  # (a server of its own)
    out = tmp_path / "newout"
    with pytest.raises(ScriptError, match="the plan's endpoint is unknown and verify has not settled it"):
        bench.main(
            [
                "--plan",
                str(plan_file),
                "--out",
                str(out),
                "--repeats",
                "1",
                "--input-lens",
                "16",
                "--concurrency",
                "1",
                "--output-len",
                "4",
                "--no-bandwidth",
            ]
        )
    assert not out.exists()


def test_a_bench_matrix_of_days_is_refused(script):
    r = script(
        "bench.py",
        "--plan",
        "/nonexistent",
        "--input-lens",
        "1,2,3,4,5,6,7,8,9,10",
        "--concurrency",
        "1,2,3,4,5,6,7",
        "--repeats",
        "10",
    )
    assert r.code == 1 and "700 runs" in r.doc["error"]


# ---- F12, F13: bench's folders and counts
def test_bench_writes_only_its_own_files_in_its_own_folders(script, tmp_path, inputs, live_tune):
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    plan_file, _ = host_plan(tmp_path, inputs, live_tune, state_dir=str(foreign))
    r = script("bench.py", "--plan", str(plan_file))
    assert r.code == 1 and "already holds other files (notes.txt)" in r.doc["error"] and "--out" in r.doc["fix"]
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "summary.json").symlink_to(victim)
    with pytest.raises(ScriptError, match="symbolic link: bench reads and writes only its own files"):
        bench_plan.write_out(tmp_path / "out" / "summary.json", "{}")
    assert victim.read_text() == "keep"


def test_bench_refuses_an_edited_plan(script, tmp_path, inputs, live_tune):
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    f = tmp_path / "edited.json"
    f.write_text(json.dumps({**plan, "argv": ["/bin/sh", "-c", "echo pwned"]}))
    r = script("bench.py", "--plan", str(f), "--no-bandwidth")
    assert r.code == 1 and "differs from what its own inputs render" in r.doc["error"]
    (tmp_path / "afile").write_text("x")
    r = script("bench.py", "--plan", str(plan_file), "--out", str(tmp_path / "afile"))
    assert r.code == 1 and "not a folder" in r.doc["error"]


def test_the_report_holds_each_figure_to_the_plans_forecast():
    """summary.md's forecast table: each measured figure beside its likely range and ratio; a miss in words, saying
    which way; a figure without a forecast says why."""
    held = {"bound": 28.0, "likely": [33.0, 86.0], "measured": 40.0, "ratio": 0.67, "within": True}
    missed = {"bound": 166.0, "likely": [173.0, 347.0], "measured": 400.0, "ratio": 1.53, "within": False}
    none = {"available": False, "why": "no forecast: bf16_flops_per_s: no clock"}
    cell = {"input_len": 128, "concurrency": 1, "median_tpot_ms": 40.0, "median_ttft_ms": 400.0}
    cell |= {"output_throughput": 25.0, "forecast": {"median_tpot_ms": held, "median_ttft_ms": missed}}
    text = bench_report.against_forecast([cell | {"forecast": {**cell["forecast"], "output_throughput": none}}])
    assert "| 128 | 1 | TPOT ms | 40.0 | 33.0-86.0 | 0.67 | yes |" in text
    assert "| 128 | 1 | TTFT ms | 400.0 | 173.0-347.0 | 1.53 | **no** |" in text
    assert (
        "The forecast missed: TTFT ms at input 128, concurrency 1: measured 400.0, slower than its 173.0-347.0" in text
    )
    assert "| out tok/s | 25.0 | no forecast: bf16_flops_per_s: no clock |" in text
    assert "Every figure fell within" in bench_report.against_forecast([cell | {"forecast": {"median_tpot_ms": held}}])
