"""epyc.verbs.benchmark: its decisions, tested in-process."""

import json
import os
from pathlib import Path

import pytest
from conftest import host_plan
from epyc import subproc
from epyc.deployments import serve_state
from epyc.errors import ScriptError
from epyc.verbs import bench_plan, benchmark


def test_bench_warns_of_the_chat_template_on_the_endpoint_verify_settled():
    """F6: a plan whose endpoint check_model could not tell (unknown) skipped the chat warning even after
    verify had settled it on chat."""
    plan = {"max_model_len": 4096, "primary_endpoint": "unknown", "argv": []}
    assert bench_plan.matrix_against_the_plan(plan, [4000], 64, [1], 128) == (None, [])
    _, warnings = bench_plan.matrix_against_the_plan(plan, [4000], 64, [1], 128, "chat_completions")
    assert [w["check"] for w in warnings] == ["length"]


def test_bench_stops_at_the_first_run_no_request_completed(tmp_path, monkeypatch):
    """F1 moved the e2e proof of this (a stopped plan's bench now refuses before it runs): an endpoint that
    goes away once bench is running (vllm bench serve writes a result of 0 completed requests) ends the matrix
    at that first run, loudly, not after every cell. The one fake here is vllm bench serve's run: a server
    dying between bench's check and its first request is a race a real test cannot hold still."""
    import types
    from pathlib import Path

    from epyc import errors
    from epyc.verbs import benchmark

    recorded = json.loads((Path(__file__).parent / "fixtures" / "bench" / "in128_c1_r1.json").read_text())
    runs = []

    def run(argv, **kw):
        runs.append(argv)
        folder, name = argv[argv.index("--result-dir") + 1], argv[argv.index("--result-filename") + 1]
        Path(folder, name).write_text(json.dumps({**recorded, "completed": 0, "failed": 10}))
        return types.SimpleNamespace(ok=True, stdout="", stderr="", failure=None, returncode=0)

    monkeypatch.setattr(subproc, "run", run)
    monkeypatch.setattr(
        benchmark, "serving_target", lambda plan, container=None: {"vllm": ["/venv/bin/vllm"], "tokenizer": "/models/m"}
    )
    plan = {
        "path": "host",
        "primary_endpoint": "completions",
        "base_url": "http://127.0.0.1:8000/v1",
        "served_model_name": "m",
    }
    args = types.SimpleNamespace(input_lens=[128, 256], concurrency=[1, 4], repeats=2, output_len=8, seed=0)
    with pytest.raises(errors.ScriptError, match=r"no request completed at input 128, concurrency 1 \(10 failed\)"):
        benchmark.run_matrix(plan, args, tmp_path / "out", {})
    assert len(runs) == 1 and [p.name for p in (tmp_path / "out" / "raw").iterdir()] == ["in128_c1_r1.json"]


def test_bench_reads_its_result_file_as_an_input(tmp_path):
    from epyc.verbs import benchmark

    raw = tmp_path / "r.json"
    os.mkfifo(raw)
    with pytest.raises(ScriptError, match="not a complete vllm bench serve result"):
        benchmark.read_result(raw, tmp_path)  # a FIFO: refused, not waited on
    raw.unlink()
    raw.symlink_to("/dev/zero")
    with pytest.raises(ScriptError, match="not a complete"):
        benchmark.read_result(raw, tmp_path)
    raw.unlink()
    raw.mkdir()
    with pytest.raises(ScriptError, match="not a complete"):
        benchmark.read_result(raw, tmp_path)


def test_a_fraction_of_a_request_is_not_a_result():
    good = {f"median_{m}_ms": 1.0 for m in benchmark.METRICS} | {
        "output_throughput": 1,
        "total_token_throughput": 1,
        "completed": 8,
        "failed": 0,
    }
    assert benchmark.run_metrics(good)["completed"] == 8
    for key, value in (("completed", 0.5), ("failed", 0.4)):
        with pytest.raises(ValueError, match="whole number of requests"):
            benchmark.run_metrics({**good, key: value})


def test_bench_loads_the_endpoint_verify_settled(tmp_path, inputs, live_tune):
    _, plan = host_plan(tmp_path, inputs, live_tune, edit=lambda d: d["check_model"].update(primary_endpoint=None))
    assert plan["primary_endpoint"] == "unknown"
    with pytest.raises(ScriptError, match="verify has not settled it"):
        bench_plan.endpoint_of(plan)
    Path(plan["state_dir"]).mkdir(parents=True, exist_ok=True)
    serve_state.write_state(
        plan,
        {
            "path": "host",
            "pgid": 1,
            "create_time": 1.0,
            "port": plan["port"],  # a start's
            "plan_id": serve_state.plan_identity(plan),
            "primary_endpoint": "chat_completions",
        },
    )
    assert bench_plan.endpoint_of(plan) == "chat_completions"
    assert bench_plan.endpoint_of({**plan, "primary_endpoint": "completions"}) == "completions"
