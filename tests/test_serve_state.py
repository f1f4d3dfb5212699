"""epyc.deployments.serve_state: its decisions, tested in-process."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import (
    ROOT,
    _pgid,
    _pgid_8,
    host_plan,
    leader_killed_workers_left,
    server_mode,
)
from epyc import bundle
from epyc.deployments import process, serve_state, serve_stop


def test_an_interrupted_start_says_its_server_is_running(tmp_path, inputs, live_tune, monkeypatch):
    """Signals are held while start launches and records; one that arrived then used to end start with
    'interrupted: run the command again' while the server it had launched was up."""
    import os
    import signal

    from epyc import cli
    from epyc.deployments import planfile, serve_procs, serve_start, serve_state, serve_stop
    from epyc.errors import ScriptError

    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    real_write = serve_state.write_state

    def write_then_signal(p, state):
        real_write(p, state)
        os.kill(os.getpid(), signal.SIGTERM)  # held by signals_deferred until the block ends

    monkeypatch.setattr(process, "write_state", write_then_signal)
    previous = cli._interrupt_on_termination()
    try:
        with pytest.raises(ScriptError) as got:
            serve_start.start(planfile.load_plan(str(plan_file)), True)
        assert "it is running" in got.value.error and "stop" in got.value.fix
        monkeypatch.setattr(process, "write_state", real_write)
        state = serve_state.read_state(plan)
        assert state and serve_procs.alive(plan, state)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        serve_stop.stop(plan)


def test_stop_takes_down_a_process_the_server_forked_on_its_way_down(inputs, live_tune, tmp_path):
    """F5: stop signalled the group as it first saw it, waited for the group to empty, then removed the
    state anyway: a process forked after the SIGTERM ran on, and no state named it."""
    import psutil
    from conftest import host_plan, server_mode
    from epyc.deployments import serve_start, serve_state, serve_stop

    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    server_mode(tmp_path, "fork_on_term")
    serve_start.start(plan, confirm=True)
    pgid = serve_state.read_state(plan)["pgid"]
    try:
        time.sleep(2)  # the fake server has installed its SIGTERM handler
        out = serve_stop.stop(plan)
        assert out["stopped"] and out["processes"] == 2 and out["killed_after_timeout"] == 1, out
        assert not [
            p
            for p in psutil.process_iter(["status"])
            if _pgid(p.pid) == pgid  # a zombie waits for
            and p.info["status"] != psutil.STATUS_ZOMBIE
        ]  # this machine's init to reap it: it is gone
        assert serve_state.read_state(plan) is None
    finally:
        for p in psutil.process_iter():
            if _pgid(p.pid) == pgid:
                p.kill()


def test_a_signal_between_ups_start_and_verify_stops_the_server(inputs, live_tune, tmp_path, monkeypatch):
    """A note of the twenty-first audit: a signal landing after start_or_stop returned and before
    verify_or_stop's guard left the server up. The server is real (the fake venv's); the signal's landing
    in that gap is simulated by a verify_or_stop that raises it before doing anything (a real signal cannot
    be aimed at those bytecodes)."""
    import psutil
    from epyc.deployments import serve_state
    from epyc.verbs import up

    plan_file, plan = host_plan(tmp_path, inputs, live_tune)

    def interrupted_before_its_guard(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(up, "verify_or_stop", interrupted_before_its_guard)
    from epyc.errors import ScriptError

    with pytest.raises(ScriptError) as err:
        up.serve_verified(plan, plan_file, 30, 10)
    assert "up stopped the server it had started" in err.value.error and err.value.extra["stopped"]["stopped"]
    assert serve_state.read_state(plan) is None
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(plan["port"]) in (p.info["cmdline"] or [])]


def test_stop_keeps_the_state_of_a_group_whose_leader_died_and_whose_workers_remain(inputs, live_tune, tmp_path):
    """F5: the API server died (OOM-killed), its renamed workers lived (their environ shows no marker): stop
    said "not running" and removed the only state that named them. It keeps it now, names them, and kills
    nothing it cannot prove is this run's."""
    from epyc.deployments import serve_state, serve_stop
    from epyc.errors import ScriptError

    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    with leader_killed_workers_left(tmp_path, plan) as pgid:
        with pytest.raises(ScriptError) as err:
            serve_stop.stop(plan)
        assert "cannot be proven this run's" in err.value.error and f"kill -- -{pgid}" in err.value.fix
        assert serve_state.read_state(plan) is not None
        assert [p for p in process.group_scan(pgid, 0) if p.name() == "sleep"]  # not killed
    assert serve_stop.stop(plan) == {"stopped": False, "reason": "not running"}
    assert serve_state.read_state(plan) is None


# ---- the twenty-third audit (2026-12-02, ~290 cases on the twenty-second's fixes: 5 findings)
def test_start_refuses_while_the_kept_state_names_a_dead_leaders_workers(inputs, live_tune, tmp_path):
    """F1: stop kept the state of a dead leader's unprovable workers; the next start wrote over it, and the
    workers were named by nothing (the tool could never show them again)."""
    from conftest import server_mode
    from epyc.deployments import serve_start, serve_state, serve_stop
    from epyc.errors import ScriptError

    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    with leader_killed_workers_left(tmp_path, plan):
        with pytest.raises(ScriptError, match="cannot be proven"):
            serve_stop.stop(plan)
        kept = serve_state.read_state(plan)
        server_mode(tmp_path, "good")
        with pytest.raises(ScriptError) as err:
            serve_start.start(plan, confirm=True)
        assert "already running" in err.value.error and "whose leader is gone" in err.value.error
        assert serve_state.read_state(plan) == kept  # still names the workers
    assert serve_stop.stop(plan) == {"stopped": False, "reason": "not running"}


def test_concurrent_state_writes_never_show_a_reader_half_a_state(tmp_path):
    """F5: write_state used one temp name: two writers at once (two verifies) truncated the file the other had
    just renamed into place, and a reader (a stop) saw junk, said "not running" and left the server up."""
    import subprocess

    from epyc.deployments import serve_state

    plan = {"state_file": str(tmp_path / "state.json")}
    serve_state.write_state(
        plan, {"path": "host", "port": 1, "plan_id": "p", "pgid": 1, "create_time": 1.0, "n": 0}
    )  # a start's fields
    writer = (
        "import sys; sys.path.insert(0, sys.argv[1]); from epyc.deployments import serve_state\n"
        "for i in range(1500): serve_state.write_state({'state_file': sys.argv[2]}, "
        "{'path': 'host', 'port': 1, 'plan_id': 'p', 'pgid': 1, 'create_time': 1.0, 'pad': 'x' * 4000, 'n': i})"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", writer, str(ROOT / "scripts"), plan["state_file"]], stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    reads = torn = 0
    while any(p.poll() is None for p in procs):
        reads += 1
        torn += serve_state.read_state(plan) is None
    errors = [p.communicate()[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors  # no writer failed on the other's temp file
    assert reads > 100 and torn == 0
    assert serve_state.read_state(plan)["n"] == 1499
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]  # no temp file left behind


def test_a_stale_state_of_an_older_bundle_is_cleared_by_its_own_stop(inputs, live_tune, tmp_path):
    """The review's fourth finding: a state with neither port nor plan_id whose server has exited was
    "another plan's" (its port unreadable): stop never removed it, verify called it foreign."""
    from epyc.deployments import serve_start, serve_state, serve_stop

    _, plan = host_plan(tmp_path, inputs, live_tune)
    serve_start.start(plan, confirm=True)
    state = serve_state.read_state(plan)
    serve_state.write_state(plan, {k: v for k, v in state.items() if k not in ("port", "plan_id")})
    os.killpg(state["pgid"], signal.SIGKILL)
    time.sleep(0.5)
    assert serve_stop.stop(plan) == {"stopped": False, "reason": "not running"}
    assert serve_state.read_state(plan) is None


def test_a_state_dir_others_may_write_in_is_refused(tmp_path):
    """Every file in a state dir is ours only while no one else may write in the folder."""
    from epyc.deployments import serve_state

    st = tmp_path / "st"
    st.mkdir(mode=0o700)
    assert serve_state.state_dir_problem(st) is None
    for mode in (0o770, 0o777, 0o1777):
        st.chmod(mode)
        assert "may be written by other users" in serve_state.state_dir_problem(st)


def test_the_folders_the_bundle_makes_are_its_own_under_a_group_writable_umask(script, tmp_path, inputs, live_tune):
    """Debian and RHEL give users umask 002: a state dir made under it must still pass the own-folder rule."""
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    old = os.umask(0o002)
    try:
        for _ in range(2):  # a second start into the folder the first one made
            r = script("launch.py", "start", "--plan", str(plan_file), "--confirm")
            assert r.code == 0, r.doc
            assert script("launch.py", "stop", "--plan", str(plan_file)).code == 0
        assert os.stat(plan["state_dir"]).st_mode & 0o777 == 0o700
        r = script("detect.py", "--run", str(tmp_path / "run"))
        assert r.code == 0 and (tmp_path / "run" / "detect.json").exists(), r.doc
    finally:
        os.umask(old)


def test_a_brief_hold_of_the_lock_is_waited_out_by_verify_and_stop(tmp_path, inputs, live_tune):
    """The review of the fixes: verify's write (milliseconds under .lock) made a stop at that moment refuse,
    and a verify meeting another verify's write failed a healthy server (up then stopped it)."""
    from epyc.deployments import serve_state, serve_verify

    _, plan = host_plan(tmp_path, inputs, live_tune)
    Path(plan["state_dir"]).mkdir(parents=True)
    judged = {
        "path": "host",
        "port": plan["port"],
        "plan_id": serve_state.plan_identity(plan),
        "pid": 11,
        "pgid": 11,
        "create_time": 1.0,
        "marker": "a",
        "started_at": 5.0,
    }
    serve_state.write_state(plan, judged)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
            "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(1)",
            str(Path(plan["state_dir"]) / ".lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        serve_verify.rewrite_state_of_run(plan, judged, {**judged, "verified_at": 8.0}, time.monotonic())
    finally:
        holder.wait(timeout=10)
        holder.stdout.close()
    assert json.loads(Path(plan["state_file"]).read_text())["verified_at"] == 8.0


# ---- 7: up interrupted during verify
@pytest.mark.parametrize("mode,signals", [("never_healthy", 1), ("slow_term", 2)])
def test_an_interrupted_verify_after_up_started_stops_the_server(
    tmp_path,
    inputs,
    live_tune,
    mode,
    signals,
):
    """As up does it, in one process: start, then verify (the fake server never gets healthy), then the
    SIGTERM of an agent's tool timeout -- and (eighteenth audit) the second one GNU timeout sends to the
    group, or a double Ctrl-C, while stop still waits for a server slow to exit: it cut the stop short."""
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    server_mode(tmp_path, mode)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import json; from epyc import cli; from epyc.deployments import serve_start; from epyc.verbs import up\n"
        "plan = json.load(open(sys.argv[2]))\n"
        "def main(argv):\n"
        "    serve_start.start(plan, confirm=True)\n"
        "    return up.verify_or_stop(plan, sys.argv[2], 120, 10), 0\n"
        "sys.exit(cli.run_main(main))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(bundle.ROOT / "scripts"), str(plan_file)], stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not serve_state.read_state(plan):
            time.sleep(0.2)
        pgid = serve_state.read_state(plan)["pgid"]
        time.sleep(3)  # verify is polling /health
        proc.send_signal(signal.SIGTERM)
        for _ in range(signals - 1):
            time.sleep(1)  # stop is waiting for the server
            proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
        doc = json.loads(out)
        assert proc.returncode == 1 and "up stopped the server" in doc["error"] and doc["plan_file"]
        assert doc["stopped"]["stopped"] and not [p for p in psutil.process_iter() if _pgid_8(p) == pgid]
    finally:
        proc.kill()
        serve_stop.stop(plan)
