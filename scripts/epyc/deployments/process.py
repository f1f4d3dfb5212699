"""A host process group of the bundle's (an engine, a router): launched and recorded as one step, proven ours, ended."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import TYPE_CHECKING

from epyc import cli, masking, subproc
from epyc.deployments.serve_state import plan_identity, write_state
from epyc.errors import ScriptError
from epyc.jsonio import open_own_file

if TYPE_CHECKING:  # psutil is imported where it is used (the scripts start without it)
    import psutil

EXEC_SETTLE_S = 2.0
EXEC_YOUNG_S = 30.0


def start_error(error: str, fix: str, **extra) -> ScriptError:
    return ScriptError(error, fix, phase="start", **extra)


def unrecorded(spec: dict, exc: BaseException, what: str, undone: str) -> ScriptError:
    """start launched something no state names (interrupted, or its state not written) and `undone` it: why."""
    if isinstance(exc, KeyboardInterrupt):
        return start_error(
            f"interrupted before the {what} was recorded: start {undone} it", "run start again", interrupted=True
        )
    reason = exc.error if isinstance(exc, ScriptError) else f"{type(exc).__name__}: {exc}"
    if isinstance(exc, OSError):
        reason = f"{exc.strerror or exc}"
    return start_error(
        f"the {what} was launched, but its state could not be written to {spec['state_file']} "
        f"({masking.clip(reason, 300)}): start {undone} it",
        "free the state dir (disk space, permissions), or plan with a fresh --state-dir; then start again",
    )


def launch(spec: dict, env: dict, program: str, what: str, fresh_log: bool = True, **recorded) -> dict:
    """spec's argv as a process group of its own, logged to its log_file, recorded in its state_file as one step."""
    import psutil

    proc, saved = None, False
    log_flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if fresh_log else os.O_APPEND)
    try:
        with cli.signals_deferred():  # launched and recorded as one step
            with os.fdopen(open_own_file(spec["log_file"], log_flags), "wb") as log:
                proc = subprocess.Popen(
                    spec["argv"],
                    executable=program,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                )
            state = {
                "path": "host",
                "port": spec["port"],
                "plan_id": plan_identity(spec),
                "pid": proc.pid,
                "pgid": proc.pid,
                "create_time": psutil.Process(proc.pid).create_time(),
                "log_file": spec["log_file"],
                "started_at": time.time(),
                **recorded,
            }
            write_state(spec, state)
            saved = True
        return state
    except BaseException as exc:
        if proc is None:
            raise
        if not saved:
            with cli.signals_deferred():  # a second signal must not skip the kill
                subproc.kill_group(proc)
            raise unrecorded(spec, exc, f"{what} (pid {proc.pid})", "stopped") from None
        if isinstance(exc, KeyboardInterrupt):  # held until both were done: it runs and its state names it
            raise start_error(
                f"interrupted, after the {what} was launched and recorded: it is running",
                "python3 scripts/launch.py verify --plan <plan.json> to use it, or "
                "python3 scripts/launch.py stop --plan <plan.json>",
                pid=proc.pid,
                interrupted=True,
            )
        raise
    finally:
        if proc is not None:  # handed over: it outlives this script, and its state is how we know it now
            proc.returncode = 0


def settled_environ(proc: psutil.Process) -> dict | None:
    """A process's environment, or None when unreadable (a young one reading empty is asked for EXEC_SETTLE_S)."""
    import psutil

    try:
        young = time.time() - proc.create_time() < EXEC_YOUNG_S
    except psutil.Error:
        return None
    deadline = time.monotonic() + (EXEC_SETTLE_S if young else 0.0)
    while True:
        try:
            env = proc.environ()
        except psutil.Error:
            return None
        if env or time.monotonic() >= deadline:
            return env or None
        time.sleep(0.02)


def group_members(state: dict) -> list:
    """The recorded group's live processes, proven ours by the leader's start time and the run token (MARKER_ENV)
    in its or a surviving member's environ; with no token (vllm-router rewrites its environ), by the leader alive."""
    import psutil

    pgid, started, token = state.get("pgid"), state.get("create_time"), state.get("marker")
    if not isinstance(pgid, int) or isinstance(started, bool) or not isinstance(started, (int, float)) or pgid <= 1:
        return []
    if token is not None and (not isinstance(token, str) or len(token) < 16):
        return []

    def marked(proc) -> bool | None:  # None: its environ cannot be read
        env = settled_environ(proc)
        return None if env is None else env.get(subproc.MARKER_ENV) == token

    leader_marked = None
    with contextlib.suppress(psutil.Error):  # the leader is gone (or a zombie); an engine's workers may not be
        leader = psutil.Process(pgid)
        if abs(leader.create_time() - started) > 0.01:  # its pid reused: the group is not ours
            return []
        leader_marked = marked(leader) if token else not leader_gone(pgid)
    if leader_marked is False or (token is None and not leader_marked):
        return []
    out = group_scan(pgid, started)
    if leader_marked is None and not any(marked(p) for p in out):
        return []
    return out


def leader_gone(pgid: int) -> bool:
    """The process that led group `pgid` has exited (gone, or a zombie)."""
    import psutil

    try:
        return psutil.Process(pgid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def group_scan(pgid: int, started: float) -> list:
    """The live processes in process group `pgid` started since `started`: the candidates, unproven."""
    import psutil

    out = []
    for proc in psutil.process_iter(["pid", "create_time", "status"]):
        try:
            if (
                os.getpgid(proc.pid) == pgid
                and proc.info["create_time"] >= started - 1
                and proc.info["status"] != psutil.STATUS_ZOMBIE
            ):
                out.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return out


def orphaned_workers(state: dict) -> list:
    """The processes left in a group whose leader is gone, that cannot show the run's marker (never killed)."""
    pgid, started = state.get("pgid"), state.get("create_time")
    if not isinstance(pgid, int) or pgid <= 1 or isinstance(started, bool) or not isinstance(started, (int, float)):
        return []
    return group_scan(pgid, started) if leader_gone(pgid) else []


def process_alive(state: dict) -> bool:
    return bool(group_members(state))


def end_group(state: dict, group: list) -> tuple[list, set[int]]:
    """SIGTERM, SIGKILL after the grace, until the group is empty. -> (killed after the grace, pids that came late)."""
    import psutil

    for proc in group:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
    _, left = psutil.wait_procs(group, timeout=subproc.STOP_GRACE_S)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(left, timeout=10)
    late: set[int] = set()
    for _ in range(50):
        members = group_members(state)
        if not members:
            return left, late
        late |= {m.pid for m in members} - {m.pid for m in group}
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(state["pgid"], signal.SIGKILL)  # ours: group_members proved it
        time.sleep(0.2)
    if stuck := [p.pid for p in group_members(state)]:  # still there after 10 s of SIGKILL: stuck in the kernel
        raise ScriptError(
            f"the process group {state['pgid']} still has {len(stuck)} process(es) "
            f"after SIGKILL (pids {stuck[:10]}; stuck in the kernel)",
            "look at them (ps -o pid,stat,wchan -p PID), then run stop again; the state file is kept until they are gone",
            phase="stop",
        )
    return left, late
