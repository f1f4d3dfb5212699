"""Regressions from the third independent bad-input audit (F1-F15) and its re-audit of the fixes (N1-N14) (~1,084 cases, 2026-12-01, a helper session with its
own harness and a fake vllm): each finding, run the way the audit ran it. Classes: tests/BAD_INPUT.md."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import common
import serve_life
import serve_plan
from common import ScriptError, load_epyc
from model_fixtures import model_folder
from test_launch import (NO_FACTS, facts_for, host_plan, inputs, live_tune, load_docs, plan_args, rt,  # noqa: F401  (fixtures)
                         server_mode, verify_keyed_server)


def plan_from(docs, opts=None, facts=None):
    return serve_plan.build_plan(docs, opts or {}, load_epyc(), facts or facts_for(docs))


# ---- F1, F10: text that vLLM or a runtime would read as an option

def test_a_model_or_served_name_that_reads_as_an_option_is_refused(script, inputs, rt):  # noqa: F811
    docs = load_docs(inputs)
    for name in ("--trust-remote-code", "-x"):
        with pytest.raises(ScriptError, match="read as an option"):
            plan_from({**docs, "check_model": {**docs["check_model"], "model": name},
                       "estimate_memory": {**docs["estimate_memory"], "model": name}})
    for bad in ("--trust-remote-code", "-x", "a b", "x\ny", "n" * 201):
        r = script("launch.py", *plan_args(inputs, f"--served-model-name={bad}"), env=rt[1])
        assert r.code == 1 and "served-model-name" in r.doc["error"], (bad, r.doc)
    with pytest.raises(ScriptError, match="served model name"):
        plan_from(docs, {"served_model_name": "--trust-remote-code"})


def test_a_local_folder_is_served_by_its_absolute_path(inputs, tmp_path):  # noqa: F811
    """A relative folder (even one named like an option) means the same command from any directory."""
    docs = load_docs(inputs)
    docs["validate"].update(path="host", runtime="host", image=None, python=sys.executable,
                            ld_preload={"value": None, "note": None})
    real = os.path.realpath(inputs["model"])
    plan = plan_from(docs, {}, facts_for(docs, model_dir=real))
    assert plan["argv"][plan["argv"].index("serve") + 1] == real


@pytest.mark.parametrize("field,value", [("image", "--privileged"), ("port", 0), ("port", 70000)])
def test_plan_shows_only_what_start_would_run(inputs, field, value):  # noqa: F811
    """A hand-made validate.json with an image that reads as an option or a port out of range: refused
    at plan time, before the human is asked to approve it."""
    docs = load_docs(inputs)
    docs["validate"][field] = value
    with pytest.raises(ScriptError, match="not one start would run"):
        plan_from(docs)


# ---- F3: a document naming a program or a library to run

@pytest.mark.parametrize("edit,needle", [
    (lambda d: d["cpu_tune"].update(host_pin_argv=["sh", "-c", "touch /tmp/PWNED"]), "host_pin_argv"),
    (lambda d: d["cpu_tune"].update(host_pin_argv=["numactl", "--cpunodebind=0", "--membind=0;id"]), "host_pin_argv"),
    (lambda d: d["cpu_tune"].update(container_cpuset_argv=["--privileged", "--cpuset-mems=0"]), "container_cpuset"),
    (lambda d: d["validate"].update(path="host", runtime="host", image=None, python="-x/python"), "absolute"),
    (lambda d: d["validate"].update(path="host", runtime="host", image=None, python="python"), "absolute"),
    (lambda d: d["validate"].update(path="host", runtime="host", image=None, python=sys.executable,
                                    ld_preload={"value": "/tmp/x/libtcmalloc_minimal.so.4", "note": None}),
     "LD_PRELOAD"),
    (lambda d: d["validate"].update(path="host", runtime="host", image=None, python=sys.executable,
                                    ld_preload={"value": "/usr/lib/../../tmp/libtcmalloc_minimal.so.4", "note": None}),
     "LD_PRELOAD"),
])
def test_a_document_never_names_a_program_or_library_that_runs(inputs, edit, needle):  # noqa: F811
    docs = load_docs(inputs)
    edit(docs)
    with pytest.raises(ScriptError, match=needle):
        plan_from(docs)


def test_the_pin_shapes_cpu_tune_makes_are_accepted():
    assert serve_plan.pin_prefix_problem(["numactl", "--cpunodebind=0,1", "--membind=0,1"], []) is None
    assert serve_plan.pin_prefix_problem(["taskset", "-c", "0-3,8"], ["--cpuset-cpus=0-3,8", "--cpuset-mems=0"]) is None
    assert serve_plan.pin_prefix_problem([], []) is None
    assert serve_plan.preload_value("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
                                    load_epyc()["host_stack"]["ld_preload_libs"])


# ---- F2, F13: secrets

def test_kernel_proof_without_a_plan_masks_every_secret_looking_value(script, tmp_path):
    log = tmp_path / "server.log"
    log.write_text("key AKSECRET_987zyx fallback to the reference path\n")
    r = script("kernel_proof.py", "--log", str(log), env={"AUDIT_KEY": "AKSECRET_987zyx"})
    assert r.doc["fallback_count"] == 1 and "AKSECRET" not in r.stdout + r.stderr
    r = script("kernel_proof.py", "--log", "")
    assert r.code == 1 and "--log" in r.doc["error"]


# ---- F4, F5: numbers that are not JSON, upstream errors that are not text

@pytest.mark.parametrize("body", ['{"ram_gb": NaN}', '{"ram_gb": Infinity}', '{"ram_gb": -Infinity}',
                                  '{"ram_gb": 1e400}'])
def test_a_non_finite_number_in_an_input_document_is_refused(script, tmp_path, body):
    doc = tmp_path / "detect.json"
    doc.write_text(body)
    r = script("validate.py", "--detect", str(doc), "--python", sys.executable)
    assert r.code == 1 and "refuse" in r.doc["error"]
    json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"{c} in the output"))  # strict JSON out


def test_emit_never_prints_invalid_json(capsys):
    common.emit({"ok": True, "x": float("nan")})
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and "NaN" in doc["error"] and doc["fix"]


@pytest.mark.parametrize("upstream", [{"error": "boom", "fix": 123}, {"error": {"a": 1}, "fix": ["x"]},
                                      {"error": "boom", "fix": ""}])
def test_an_upstream_error_reaches_the_user_as_text(script, inputs, tmp_path, upstream):  # noqa: F811
    bad = tmp_path / "check.json"
    bad.write_text(json.dumps(upstream))
    r = script("launch.py", "plan", *[f"--{k}={inputs[k] if k != 'check' else bad}"
                                      for k in ("detect", "validate", "check", "estimate", "tune")])
    assert r.code == 1 and isinstance(r.doc["error"], str) and isinstance(r.doc["fix"], str) and r.doc["fix"]


# ---- F6: hangs

def test_a_fifo_in_a_sysroot_or_as_the_capture_does_not_hang(script, make_sysroot, tmp_path):
    root = make_sysroot("runner")
    (root / "proc" / "cpuinfo").unlink()
    os.mkfifo(root / "proc" / "cpuinfo")
    for name in ("detect.py", "cpu_tune.py"):
        r = script(name, "--sysroot", str(root), timeout=30)
        assert r.code == 1 and "proc/cpuinfo" in r.doc["error"]
    os.mkfifo(tmp_path / "capture")
    r = script("detect.py", "--capture", str(tmp_path / "capture"), timeout=30)
    assert r.code == 1 and "not a regular file" in r.doc["error"]


# ---- F7, F8: the state dir and what stop may kill

def test_links_planted_in_the_state_dir_are_never_followed(script, tmp_path, inputs, live_tune):  # noqa: F811
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    st = Path(plan["state_dir"])
    st.mkdir(parents=True, exist_ok=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (st / "server.log").symlink_to(victim)
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm")
    try:
        assert r.code == 1 and "link" in r.doc["error"] and victim.read_text() == "keep me"
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))
    (st / "server.log").unlink()
    (st / ".lock").unlink(missing_ok=True)
    (st / ".lock").symlink_to(victim)
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm")
    assert r.code == 1 and "link" in r.doc["error"] and victim.read_text() == "keep me"
    # stop never deletes through a secrets link
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "HF_TOKEN").write_text("not ours")
    (st / "secrets").symlink_to(elsewhere)
    serve_life.remove_secret_files(plan)
    assert (elsewhere / "HF_TOKEN").read_text() == "not ours"


def test_stop_never_kills_a_process_group_a_forged_state_names(script, tmp_path, inputs, live_tune):  # noqa: F811
    import psutil
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        st = Path(plan["state_dir"])
        st.mkdir(parents=True, exist_ok=True)
        forged = {"path": "host", "pid": victim.pid, "pgid": victim.pid, "marker": "f" * 32,
                  "create_time": psutil.Process(victim.pid).create_time()}
        (st / "state.json").write_text(json.dumps(forged))
        r = script("launch.py", "stop", "--plan", str(plan_file))
        assert r.code == 0 and r.doc["stopped"] is False and victim.poll() is None
    finally:
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()


def test_save_sysroot_writes_only_into_a_new_or_empty_folder(script, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "proc").symlink_to(tmp_path)
    r = script("detect.py", "--spec", "9654", "--ram-gb-per-socket", "384", "--save-sysroot", str(tmp_path / "full"))
    assert r.code == 1 and "not empty" in r.doc["error"]


# ---- F9: the server's environment is the plan's, not the whole shell's

def test_the_host_server_gets_the_plans_env_and_only_named_shell_variables():
    shell = {"PATH": "/usr/bin", "HOME": "/root", "LC_ALL": "C", "HF_HOME": "/hf", "LD_LIBRARY_PATH": "/tmp/evil",
             "VLLM_ATTENTION_BACKEND": "X", "PYTHONPATH": "/tmp/evil", "MY_API_KEY": "sk"}
    env = serve_plan.server_env(shell, {"VLLM_CPU_KVCACHE_SPACE": "2"}, {"VLLM_API_KEY": "sk"}, "t" * 32)
    assert env == {"PATH": "/usr/bin", "HOME": "/root", "LC_ALL": "C", "HF_HOME": "/hf", "VLLM_CPU_KVCACHE_SPACE": "2",
                   "VLLM_API_KEY": "sk", serve_plan.MARKER_ENV: "t" * 32}


def test_the_summary_says_what_a_host_server_takes_from_the_shell(inputs):  # noqa: F811
    docs = load_docs(inputs)
    docs["validate"].update(path="host", runtime="host", image=None, python=sys.executable,
                            ld_preload={"value": None, "note": None})
    plan = plan_from(docs)
    env_row = dict(plan["summary"])["Environment"]
    assert "PYTHONUNBUFFERED=1" in env_row and plan["env"]["PYTHONUNBUFFERED"] == "1"
    assert env_row.endswith("; from this shell only PATH, HOME, USER, LOGNAME, LANG, LANGUAGE, TZ, TMPDIR, HF_HOME, "
                            "HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, XDG_CACHE_HOME, HF_ENDPOINT, HF_HUB_ETAG_TIMEOUT, HF_HUB_DOWNLOAD_TIMEOUT, "
                            "SSL_CERT_FILE, SSL_CERT_DIR, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, LC_* and the proxy "
                            "variables")


# ---- F11, F12, F15: flags that would be ignored, numbers that overflow, dubious values

@pytest.mark.parametrize("args", [["--host", "box.example"], ["--sysroot", "/tmp"], ["--spec", "9654"],
                                  ["--nps", "4"]])
def test_capture_takes_no_other_target(script, tmp_path, args):
    r = script("detect.py", "--capture", str(tmp_path / "c.tar.gz"), *args)
    assert r.code == 1 and "would be ignored" in r.doc["error"] and not (tmp_path / "c.tar.gz").exists()


def test_an_empty_value_after_an_equals_sign_is_not_this_host(script):
    r = script("detect.py", "--host=--")
    assert r.code == 1 and "expected one value" in r.doc["error"]


def test_a_corrupt_or_overflowing_safetensors_header_is_an_error_not_a_tiny_model(script, tmp_path):
    import struct
    folder = model_folder("Qwen3-0.6B", tmp_path)
    for f in folder.glob("*.safetensors.index.json"):
        f.unlink()
    header = json.dumps({"w": {"dtype": "BF16", "shape": [2 ** 39] * 30, "data_offsets": [0, 0]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    r = script("estimate_memory.py", "--model", str(folder), "--ram-gb", "64")
    assert r.code == 1 and "safetensors headers cannot be read" in r.doc["error"] and "--weight-gb" in r.doc["fix"]
    (folder / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\n")
    r = script("estimate_memory.py", "--model", str(folder), "--ram-gb", "64")
    assert r.code == 1 and "safetensors headers cannot be read" in r.doc["error"]


def test_state_dir_and_key_variable_that_would_do_harm_are_refused(script, inputs, rt, tmp_path):  # noqa: F811
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".bashrc").write_text("x")
    for bad in ("/", str(tmp_path / "home")):
        r = script("launch.py", *plan_args(inputs, "--state-dir", bad), env=rt[1])
        assert r.code == 1 and "other files" in r.doc["error"], (bad, r.doc)
    for name in ("HF_TOKEN", "PATH", "LD_PRELOAD"):
        r = script("launch.py", *plan_args(inputs, "--expose", "--api-key-env", name), env=rt[1])
        assert r.code == 1 and "holds something else" in r.doc["error"]


def test_odd_quantization_and_usage_values_are_not_taken_at_face_value():
    import quantization
    assert quantization.describe({"quantization_config": {"quant_method": ["awq"], "bits": "four"}})["method"] == \
        "unknown"
    body = json.dumps({"choices": [{"message": {"content": "x"}}], "usage": {"completion_tokens": True}})
    assert serve_plan.judge_smoke(200, body, "chat_completions")[0] is False


def test_a_state_dir_this_bundle_filled_is_accepted_again(tmp_path):
    """up keeps one JSON per step and start its log and state: planning again into that folder is fine."""
    import launch
    st = tmp_path / "st"
    st.mkdir()
    for name in ("plan.json", "server.log", "state.json", "detect.json", "validate.json", "setup_host_stack.json",
                 "check_model.json", "estimate_memory.json", "cpu_tune.json"):
        (st / name).write_text("{}")
    (st / "bench-20261201-120000").mkdir()  # bench's result folder (a file or link of that name is foreign)
    assert launch.state_dir_arg(str(st)) == str(st.resolve())
    (st / "notes.txt").write_text("mine")
    with pytest.raises(ScriptError, match="notes.txt"):
        launch.state_dir_arg(str(st))


# ---- the re-audit of the fixes (N1-N13)

@pytest.mark.parametrize("name,kind", [("state.json", "fifo"), (".lock", "fifo"), ("server.log", "fifo"),
                                       (".state.json.tmp", "fifo"), ("server.log", "dir"), ("state.json", "dir")])
def test_a_fifo_or_folder_under_a_state_file_name_is_refused_not_waited_on(script, tmp_path, inputs, live_tune,  # noqa: F811
                                                                            name, kind):
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    st = Path(plan["state_dir"])
    st.mkdir(parents=True, exist_ok=True)
    os.mkfifo(st / name) if kind == "fifo" else (st / name).mkdir()
    try:
        for verb in ("start", "verify", "handoff", "stop"):
            r = script("launch.py", verb, "--plan", str(plan_file), *(["--confirm"] if verb == "start" else []),
                       *(["--timeout", "2"] if verb == "verify" else []), timeout=60)
            assert r.code in (0, 1) and "internal error" not in json.dumps(r.doc), (verb, r.doc)
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))
    import psutil  # refused before anything ran: no server was left behind unseen
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]


def test_up_writes_its_step_documents_only_as_its_own_files(tmp_path):
    import launch
    victim = tmp_path / "victim.json"
    victim.write_text("keep me")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "detect.json").symlink_to(victim)
    with pytest.raises(ScriptError, match="symbolic link"):
        launch.step("detect.py", [], "detect", tmp_path / "run")
    assert victim.read_text() == "keep me"


def test_log_tail_never_reads_through_a_link(tmp_path, inputs, live_tune):  # noqa: F811
    _, plan = host_plan(tmp_path, inputs, live_tune)
    Path(plan["state_dir"]).mkdir(parents=True, exist_ok=True)
    private = tmp_path / "private.txt"
    private.write_text("PRIVATE_LINE\n")
    Path(plan["log_file"]).symlink_to(private)
    assert serve_life.log_tail(plan) == []


def test_a_key_listed_beside_the_model_is_masked_in_verifys_document(script, tmp_path, inputs, live_tune,  # noqa: F811
                                                                     monkeypatch):
    plan, r = verify_keyed_server(script, tmp_path, inputs, live_tune, monkeypatch, "models_reflect_also",
                                  "sk-listed-beside-88")
    assert r.code == 0 and r.doc["models"] == [plan["served_model_name"], "Bearer ***"], r.doc
    assert "sk-listed-beside-88" not in r.stdout + r.stderr


def test_a_final_newline_or_a_huge_length_does_not_slip_through(inputs, script, rt):  # noqa: F811
    docs = load_docs(inputs)
    assert not serve_plan.is_served_name("tiny\n") and serve_plan.is_served_name("tiny")
    assert serve_plan.pin_prefix_problem(["numactl", "--cpunodebind=0\n", "--membind=0"], [])
    assert serve_plan.pin_prefix_problem(["taskset", "-c", "0-1\n"], [])
    assert not common.is_env_name("KEY\n") and common.parse_host("box") and pytest.raises(ScriptError, common.parse_host,
                                                                                           "box\n")
    docs["estimate_memory"]["fit"]["max_model_len"] = int("9" * 400)
    with pytest.raises(ScriptError, match="not one start would run"):
        plan_from(docs)
    r = script("launch.py", *plan_args(inputs, "--state-dir", "/tmp/" + "a" * 5000), env=rt[1])
    assert r.code == 1 and "too long" in r.doc["error"]
    r = script("detect.py", "--capture", "/tmp/" + "c" * 5000)
    assert r.code == 1 and "too long" in r.doc["error"]


def test_a_captured_tree_never_reads_a_file_outside_itself(make_sysroot, script):
    root = make_sysroot("runner")
    (root / "proc" / "meminfo").unlink()
    (root / "proc" / "meminfo").symlink_to("/proc/meminfo")  # this host's file, not the captured one
    assert common.Sysroot(root).read("proc/meminfo") is None
    assert common.Sysroot("/").read("proc/meminfo")  # the live host reads its own /proc as always


def test_the_server_reaches_the_hub_the_user_configured():
    env = serve_plan.server_env({"HF_ENDPOINT": "http://mirror:8080", "REQUESTS_CA_BUNDLE": "/etc/ca.pem"}, {}, {},
                                "t" * 32)
    assert env["HF_ENDPOINT"] == "http://mirror:8080" and env["REQUESTS_CA_BUNDLE"] == "/etc/ca.pem"


def test_a_header_longer_than_its_file_is_an_error(script, tmp_path):
    import struct
    folder = model_folder("Qwen3-0.6B", tmp_path)
    for f in folder.glob("*.safetensors.index.json"):
        f.unlink()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 0x03200000) + b"{}")
    r = script("estimate_memory.py", "--model", str(folder), "--ram-gb", "16")
    assert r.code == 1 and "safetensors headers cannot be read" in r.doc["error"]


def test_workers_whose_environ_is_unreadable_are_still_the_servers(tmp_path):
    """vLLM's engine processes rename themselves (setproctitle), which clobbers their /proc environ: the
    marked leader vouches for its group. A worker started with an empty environment stands in for them."""
    import psutil
    token = "a" * 32
    leader = subprocess.Popen(["bash", "-c", "env -i sleep 300 & exec sleep 301"], start_new_session=True,
                              env={**os.environ, serve_plan.MARKER_ENV: token})
    try:
        time.sleep(0.5)
        state = {"pgid": leader.pid, "create_time": psutil.Process(leader.pid).create_time(), "marker": token}
        members = serve_life.group_members(state)
        assert len(members) == 2 and {p.pid for p in members} >= {leader.pid}
        assert serve_life.group_members({**state, "marker": "b" * 32}) == []  # another run's token: not ours
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def test_a_server_inside_execve_is_still_alive_and_ours():
    """start's server execs twice (the pin program, then vllm's #! python); while a process is inside
    execve its /proc environ reads empty. verify or stop asking then judged it "exited" or not ours:
    seen by the suite as a verify failing with an empty server log. Each read here is one group_members
    would make; without the settling, about half of these launches read empty at least once."""
    import psutil
    token = "c" * 32
    chain = ("import os, sys; os.execv(sys.executable, [sys.executable, '-c', "
             "'import os, sys; os.execv(\"/bin/sleep\", [\"sleep\", \"30\"])'])")
    for _ in range(10):
        leader = subprocess.Popen([sys.executable, "-c", chain], start_new_session=True,
                                  env={**os.environ, serve_plan.MARKER_ENV: token})
        try:
            proc = psutil.Process(leader.pid)
            deadline = time.monotonic() + 0.6  # both execs happen in this window; read as often as we can
            while time.monotonic() < deadline:
                env = serve_life.settled_environ(proc)
                assert env and env.get(serve_plan.MARKER_ENV) == token, "a launching server read as not ours"
            state = {"pgid": leader.pid, "create_time": proc.create_time(), "marker": token}
            assert serve_life.process_alive(state)
        finally:
            os.killpg(leader.pid, signal.SIGKILL)
            leader.wait()
