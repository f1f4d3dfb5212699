"""Regressions from the thirtieth independent audit (2026-12-03, a fresh helper on 37c519b: ~150 cases, 6
findings, on the container life cycle with the fake runtime and the newest output-folder and remote-runtime
code). Classes: tests/BAD_INPUT.md."""
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT
from test_audit12_regressions import another_process_holding
from test_launch import (FAKE_SERVER, calls, container_plan, free_port, host_plan, inputs, live_tune,  # noqa: F401
                         plan_args, rt)

TOKEN = "hf_AuditThirtyToken12345"


def wait_for_port(port: int, timeout: float = 30) -> None:
    import serve_life
    deadline = time.monotonic() + timeout
    while not serve_life.port_in_use(port):
        assert time.monotonic() < deadline, f"nothing listens on {port}"
        time.sleep(0.1)
def free_port_plan(script, inputs, rt, tmp_path):  # noqa: F811
    """A container plan on a port of its own: these tests listen on it (8000 may be another test's)."""
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st"), "--port", str(free_port())),
               env=rt[1])
    assert r.code == 0, r.doc
    path = tmp_path / "plan.json"
    path.write_text(r.stdout)
    return path, r.doc


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file another owner needs root (CI runs as root)")


# ---- F1: a secret or log written into a file start did not make keeps that file's owner and mode

def test_start_writes_each_secret_into_a_new_0600_file_of_its_own(script, inputs, rt, tmp_path):  # noqa: F811
    """A secrets/HF_TOKEN made 0666 before start kept its mode (and any reader that had it open) with the
    token written into it. Each secret file is now made new, 0600, in a 0700 folder held open by start."""
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path, HF_TOKEN=TOKEN)
    secrets = Path(plan["state_dir"]) / "secrets"
    secrets.mkdir(parents=True)
    planted = secrets / "HF_TOKEN"
    planted.write_text("x")
    os.chmod(planted, 0o666)
    os.chmod(secrets, 0o777)
    with open(planted) as reader:  # opened before start: it must never see the token
        r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env={**env, "HF_TOKEN": TOKEN})
        assert r.code == 0, r.doc
        assert reader.read() == "x"
    assert stat.S_IMODE(planted.stat().st_mode) == 0o600 and stat.S_IMODE(secrets.stat().st_mode) == 0o700
    assert planted.read_text() == TOKEN and planted.stat().st_uid == os.geteuid()
    assert script("launch.py", "stop", "--plan", str(plan_file), env=env).doc["stopped"] is True


@ROOT_ONLY
@pytest.mark.parametrize("whose", ["state_dir", "secrets"])
def test_start_refuses_a_state_dir_or_secrets_folder_of_another_user(script, inputs, rt, tmp_path, whose):  # noqa: F811
    """Its owner could read the key start writes there, or swap the folder for a link between start's check
    and its write."""
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path, HF_TOKEN=TOKEN)
    secrets = Path(plan["state_dir"]) / "secrets"
    secrets.mkdir(parents=True)
    os.chown(plan["state_dir"] if whose == "state_dir" else secrets, 65534, 65534)  # nobody
    before = len(calls(d)) if (d / "calls.jsonl").exists() else 0
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env={**env, "HF_TOKEN": TOKEN})
    assert r.code == 1 and "another user (uid 65534)" in r.doc["error"], r.doc
    assert not any(c["argv"][0] == "run" for c in calls(d)[before:]) and not (secrets / "HF_TOKEN").exists()


@ROOT_ONLY
def test_no_file_of_another_user_is_written_by_a_verb(tmp_path):
    import common
    import serve_life
    theirs = tmp_path / "server.log"
    theirs.write_text("old")
    os.chown(theirs, 65534, 65534)
    with pytest.raises(common.ScriptError, match="belongs to another user"):
        serve_life.write_own_file(theirs, "new")
    assert theirs.read_text() == "old"


def test_a_log_found_in_the_state_dir_is_0600_after_start(script, tmp_path, inputs, live_tune):  # noqa: F811
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

def test_start_removes_only_an_exited_leftover_and_by_its_id(script, inputs, rt, tmp_path):  # noqa: F811
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


def test_stop_stops_and_removes_the_container_by_the_id_it_judged(script, inputs, rt, tmp_path):  # noqa: F811
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


def test_a_refused_run_that_made_nothing_removes_nothing(script, inputs, rt, tmp_path):  # noqa: F811
    """The review of the fixes: after a `run` refused on a cpuset or a mount (docker creates nothing), the
    clean-up still ran `rm -f NAME`: the same late removal by name the audit found before `run`."""
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path, HF_TOKEN=TOKEN)
    (d / "cpuset_rejected").touch()
    before = len(calls(d))
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env={**env, "HF_TOKEN": TOKEN})
    assert r.code == 1 and "cgroup controller `cpuset`" in r.doc["error"], r.doc
    made = [c["argv"][0] for c in calls(d)[before:]]
    assert "rm" not in made, made
    assert not (Path(plan["state_dir"]) / "secrets" / "HF_TOKEN").exists()  # the key file goes with it


# ---- F3: verify's read-modify-write of state.json overwrote a newer start's state

def test_verify_never_writes_over_the_state_of_another_run(tmp_path, inputs, live_tune, monkeypatch):  # noqa: F811
    """A stop and a start while verify waited on the server: verify's final write put the old run back, and
    the new server was named by nothing (stop left it running; every start after refused its port)."""
    import common
    import serve_life
    monkeypatch.setattr(serve_life, "VERIFY_LOCK_WAIT_S", 0.5)
    _, plan = host_plan(tmp_path, inputs, live_tune)
    Path(plan["state_dir"]).mkdir(parents=True)
    judged = {"path": "host", "port": plan["port"], "pid": 11, "pgid": 11, "create_time": 1.0, "marker": "a",
              "started_at": 5.0}
    newer = {**judged, "pid": 22, "pgid": 22, "create_time": 2.0, "marker": "b", "started_at": 6.0}
    serve_life.write_state(plan, newer)
    with pytest.raises(common.ScriptError, match="stopped or started again while verify ran"):
        serve_life.rewrite_state_of_run(plan, judged, {**judged, "verified_at": time.time()}, time.monotonic())
    assert json.loads(Path(plan["state_file"]).read_text()) == newer
    serve_life.write_state(plan, judged)
    with another_process_holding(str(Path(plan["state_dir"]) / ".lock")):  # a start or stop at work
        with pytest.raises(common.ScriptError, match="a start or stop held the state dir for 0.5s") as held:
            serve_life.rewrite_state_of_run(plan, judged, {**judged, "verified_at": 1.0}, time.monotonic())
    assert held.value.fix == "run verify again once that start or stop is done"
    serve_life.rewrite_state_of_run(plan, judged, {**judged, "verified_at": 7.0}, time.monotonic())
    assert json.loads(Path(plan["state_file"]).read_text())["verified_at"] == 7.0


def test_a_brief_hold_of_the_lock_is_waited_out_by_verify_and_stop(tmp_path, inputs, live_tune):  # noqa: F811
    """The review of the fixes: verify's write (milliseconds under .lock) made a stop at that moment refuse,
    and a verify meeting another verify's write failed a healthy server (up then stopped it)."""
    import serve_life
    _, plan = host_plan(tmp_path, inputs, live_tune)
    Path(plan["state_dir"]).mkdir(parents=True)
    judged = {"path": "host", "port": plan["port"], "pid": 11, "pgid": 11, "create_time": 1.0, "marker": "a",
              "started_at": 5.0}
    serve_life.write_state(plan, judged)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(1)",
                               str(Path(plan["state_dir"]) / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        serve_life.rewrite_state_of_run(plan, judged, {**judged, "verified_at": 8.0}, time.monotonic())
    finally:
        holder.wait(timeout=10)
        holder.stdout.close()
    assert json.loads(Path(plan["state_file"]).read_text())["verified_at"] == 8.0


def test_verify_refuses_to_record_a_pass_over_a_state_that_changed_while_it_ran(script, inputs, rt, tmp_path):  # noqa: F811
    """verify itself, not only its helper: the state is rewritten (another start's) while verify polls."""
    import serve_life
    d, env = rt
    plan_file, plan = free_port_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    full_env = {**os.environ, **env, "PYTHONWARNINGS": "error::ResourceWarning"}
    verify = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "launch.py"), "verify", "--plan",
                               str(plan_file), "--timeout", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=full_env)
    server = None
    try:
        time.sleep(3)  # verify is polling /health: nothing listens yet
        newer = {**serve_life.read_state(plan), "started_at": time.time()}  # another start's run of the container
        serve_life.write_state(plan, newer)
        server = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--port", str(plan["port"]), "--delay", "0",
                                   "--served-model-name", plan["served_model_name"]],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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


# ---- F4 and F5: an inspect that did not answer let kernel_proof read another plan's log, and verify pass

def test_kernel_proof_reads_no_log_the_runtime_has_not_named_this_plans(script, inputs, rt, tmp_path):  # noqa: F811
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    r = script("kernel_proof.py", "--plan", str(plan_file), env=env)
    assert r.code == 1 and "no container named" in r.doc["error"] and "start" in r.doc["fix"], r.doc
    (d / f"created-{plan['container_name']}").write_text("a" * 64)  # another state dir's, on this port
    (d / "logs_lines").write_text("10000")
    (d / "inspect_fails").touch()
    before = len(calls(d))
    r = script("kernel_proof.py", "--plan", str(plan_file), env=env)
    assert r.code == 1 and "did not say whether a container named" in r.doc["error"], r.doc
    assert not any(c["argv"][0] == "logs" for c in calls(d)[before:])
    (d / "inspect_fails").unlink()
    (d / f"created-{plan['container_name']}").unlink()
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    before = len(calls(d))
    r = script("kernel_proof.py", "--plan", str(plan_file), env=env)
    assert r.code == 0 and r.doc["zentorch_matmuls"] == 10000, r.doc
    assert [c["argv"] for c in calls(d)[before:] if c["argv"][0] == "logs"] == [["logs", "f" * 64]]


def test_verify_passes_only_a_container_the_runtime_said_runs(script, inputs, rt, tmp_path):  # noqa: F811
    """Whatever answered on the port passed verify while every inspect failed (and up would hand it off)."""
    d, env = rt
    plan_file, plan = free_port_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    server = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--port", str(plan["port"]), "--delay", "0",
                               "--served-model-name", plan["served_model_name"]],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(plan["port"])
        (d / "inspect_fails").touch()
        v = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "30", env=env)
        assert v.code == 1 and v.doc["phase"] == "process" and "did not say whether the container runs" \
            in v.doc["error"] and "then run verify again" in v.doc["fix"], v.doc
        tails = [c["argv"] for c in calls(d) if c["argv"][0] == "logs"]
        assert tails[-1] == ["logs", "--tail", "50", "f" * 64], tails  # the recorded container's, by id
        (d / "inspect_fails").unlink()
        v = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "30", env=env)
        assert v.code == 0 and v.doc["ok"], v.doc
    finally:
        server.kill()
        server.wait(timeout=10)
    assert script("launch.py", "stop", "--plan", str(plan_file), env=env).doc["stopped"] is True


# ---- F6: '-' and a folder in the plan's state dir as an output folder

@pytest.mark.parametrize("tool,args", [("detect.py", ["--spec", "9654", "--ram-gb-per-socket", "384", "--save-sysroot", "-"]),
                                       ("bench.py", ["--plan", "PLAN", "--out", "-"])])
def test_an_output_folder_named_dash_is_refused(script, inputs, rt, tmp_path, tool, args):  # noqa: F811
    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    here = tmp_path / "cwd"
    here.mkdir()
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / tool),
                           *[str(plan_file) if a == "PLAN" else a for a in args]],
                          capture_output=True, text=True, timeout=120, cwd=here, env={**os.environ, **env})
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and "'-'" in doc["error"] and doc["fix"], doc
    assert not list(here.iterdir())


def test_bench_refuses_an_out_folder_inside_the_plans_state_dir(script, inputs, rt, tmp_path):  # noqa: F811
    """start then refused the state dir ("already holds other files (mine)")."""
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    Path(plan["state_dir"]).mkdir(parents=True)
    r = script("bench.py", "--plan", str(plan_file), "--out", str(Path(plan["state_dir"]) / "mine"), env=env)
    assert r.code == 1 and "inside the plan's state dir" in r.doc["error"] and "--out" in r.doc["fix"], r.doc
    assert not (Path(plan["state_dir"]) / "mine").exists()
