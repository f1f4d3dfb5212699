"""epyc.deployments.serve_procs: its decisions, tested in-process."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import TOKEN, host_plan, leaks
from epyc.decisions import command
from epyc.deployments import process, serve_procs


# ---- F3: verify's log tail, cut at 256 KiB before it was masked
def test_the_host_log_tail_drops_the_line_its_window_cuts(tmp_path, monkeypatch):
    from epyc.deployments import serve_procs

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    log = tmp_path / "server.log"
    body = "start\n" + "q" * 100 + TOKEN + " died here\n"
    log.write_text(body + "f" * (serve_procs.LOG_TAIL_BYTES - 21) + "\n")  # the window begins 20 bytes before
    plan = {"path": "host", "log_file": str(log), "secrets": {"HF_TOKEN": "HF_TOKEN"}}  # the token line's end
    tail = serve_procs.log_tail(plan)
    assert len(tail) == 1 and tail[0].startswith("fff") and not leaks(json.dumps(tail)), tail
    log.write_text(body)  # all of it in the window: the token line whole, masked
    assert serve_procs.log_tail(plan) == ["start", "q" * 100 + "*** died here"]


@pytest.mark.parametrize("failure", ["output_limit", "timeout"])
def test_the_container_log_tail_drops_the_line_its_limit_cuts(monkeypatch, failure):
    from epyc import subproc
    from epyc.deployments import serve_procs

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    cut = "INFO ready\n" + "c" * 100 + TOKEN[:10]  # the reader stopped inside the token
    asked = []
    monkeypatch.setattr(
        subproc, "run", lambda argv, **kw: asked.append(argv) or subproc.RunResult(argv, None, cut, "", failure)
    )
    plan = {
        "path": "container",
        "runtime": "docker",
        "container_name": "epyc-test",
        "secrets": {"HF_TOKEN": "HF_TOKEN"},
    }
    assert serve_procs.log_tail(plan, state={"container_id": "c" * 64}) == ["INFO ready"]
    assert asked[0][-1] == "c" * 64  # the recorded container's log, by id (the thirtieth audit's review)


def test_an_old_process_with_an_empty_environ_is_not_waited_for(monkeypatch):
    """The settling of a process inside execve is for a launch's first moments: vLLM's renamed workers read
    empty for good, and stop, with their leader gone, waited 2 s on each of them at every look."""
    import subprocess

    import psutil

    worker = subprocess.Popen(["sleep", "30"], env={})
    try:
        time.sleep(0.5)
        monkeypatch.setattr(process, "EXEC_YOUNG_S", 0.2)
        t0 = time.monotonic()
        assert process.settled_environ(psutil.Process(worker.pid)) is None
        assert time.monotonic() - t0 < 0.5
        monkeypatch.setattr(process, "EXEC_YOUNG_S", 60.0)
        t0 = time.monotonic()
        assert process.settled_environ(psutil.Process(worker.pid)) is None
        assert time.monotonic() - t0 >= process.EXEC_SETTLE_S  # young: asked again until the settle time
    finally:
        worker.kill()
        worker.wait()


def test_log_tail_never_reads_through_a_link(tmp_path, inputs, live_tune):
    _, plan = host_plan(tmp_path, inputs, live_tune)
    Path(plan["state_dir"]).mkdir(parents=True, exist_ok=True)
    private = tmp_path / "private.txt"
    private.write_text("PRIVATE_LINE\n")
    Path(plan["log_file"]).symlink_to(private)
    assert serve_procs.log_tail(plan) == []


def test_workers_whose_environ_is_unreadable_are_still_the_servers(tmp_path):
    """vLLM's engine processes rename themselves (setproctitle), which clobbers their /proc environ: the
    marked leader vouches for its group. A worker started with an empty environment stands in for them."""
    import psutil

    token = "a" * 32
    leader = subprocess.Popen(
        ["bash", "-c", "env -i sleep 300 & exec sleep 301"],
        start_new_session=True,
        env={**os.environ, command.MARKER_ENV: token},
    )
    try:
        time.sleep(0.5)
        state = {"pgid": leader.pid, "create_time": psutil.Process(leader.pid).create_time(), "marker": token}
        members = process.group_members(state)
        assert len(members) == 2 and {p.pid for p in members} >= {leader.pid}
        assert process.group_members({**state, "marker": "b" * 32}) == []  # another run's token: not ours
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
