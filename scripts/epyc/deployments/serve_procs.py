"""Which processes and containers belong to a plan's server, and whether it is alive."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from epyc import masking, subproc
from epyc.deployments import serve_state
from epyc.deployments.process import group_members, orphaned_workers, process_alive
from epyc.errors import ScriptError
from epyc.facts import runtimes

LOG_TAIL = 50
LOG_TAIL_BYTES = 256 * 1024
# Python's shared memory (psm_*), and the buffers tensor-parallel ranks reduce through (vllm_dist_*)
SEGMENT = re.compile(r"psm_[A-Za-z0-9_]{1,64}|vllm_dist_[0-9a-f]{1,64}-[A-Za-z0-9:_\[\]-]{1,64}")
INSPECT_FORMAT = "{{.Id}} {{.State.Running}} {{.State.Restarting}} {{.RestartCount}}"
# INSPECT_FORMAT's answer
INSPECTED = re.compile(rf"({serve_state.CONTAINER_ID.pattern}) (true|false) (true|false) ([0-9]+)")


def recorded_segments(state: dict | None) -> list[str]:
    """The segment names verify recorded in a state (anything else there is no name of ours)."""
    names = (state or {}).get("shm_segments")
    return [n for n in names if isinstance(n, str) and SEGMENT.fullmatch(n)] if isinstance(names, list) else []


def segments_in_use(pids: list[int] | None = None) -> set[str]:
    """The /dev/shm segment names these processes (default: every one we may read) map or hold open."""
    held: set[str] = set()
    for pid in pids if pids is not None else [p.name for p in Path("/proc").glob("[0-9]*")]:
        with contextlib.suppress(OSError):
            held.update(SEGMENT.findall(Path(f"/proc/{pid}/maps").read_text()))
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    held.update(SEGMENT.findall(os.readlink(fd)))
    return held


def segments_mapped(plan: dict, state: dict) -> list[str]:
    """The segments the server's processes map or hold now, with those the state recorded, sorted."""
    return sorted(set(recorded_segments(state)) | segments_in_use(server_pids(plan, state)))


def server_pids(plan: dict, state: dict) -> list[int]:
    """The server's processes: the host path's group, or the container's first process and its descendants."""
    if plan["path"] == "host":
        return [p.pid for p in group_members(state)]
    import psutil

    cid = state.get("container_id")
    if not isinstance(cid, str) or not serve_state.CONTAINER_ID.fullmatch(cid):
        return []
    res = subproc.run([*runtimes.runtime_of(plan), "inspect", "-f", "{{.State.Pid}}", cid], timeout=30)
    try:
        first = psutil.Process(int(res.stdout.strip()))
        return [first.pid, *(c.pid for c in first.children(recursive=True))]
    except (ValueError, psutil.Error):
        return []


def state_server(state: dict) -> str | None:
    """What a state file names that still runs, in words (None: nothing), whichever plan started it."""
    if state.get("path") == "container":
        name, runtime, engine = state.get("container_name"), state.get("runtime"), state.get("engine")
        named = isinstance(name, str) and serve_state.CONTAINER_NAME.fullmatch(name)
        engine_ok = engine is None or (runtime == "docker" and not runtimes.docker_engine_problem(engine))
        if runtime not in runtimes.CONTAINER_RUNTIMES or not named or not engine_ok:
            return None  # not a state start wrote: it names nothing we could ask about
        running = alive(state, state)  # a state names its runtime and container as a plan does; the guard above holds
        if running is None:
            return f"container {name} (its runtime did not say whether it runs, so it may)"
        return f"container {name}" if running else None
    if group_members(state):
        return f"process group {state['pgid']}"
    if left := orphaned_workers(state):
        return (
            f"{len(left)} process(es) of group {state['pgid']}, whose leader is gone, that cannot be proven "
            f"its run's (pids {[p.pid for p in left][:10]})"
        )
    return None


def foreign_state(plan: dict, state: dict) -> str | None:
    """How a state in the plan's state dir shows another plan's start wrote it, or None when it is this plan's."""
    why = []
    if state.get("path") != plan["path"]:
        why.append(f"the {masking.clip(str(state.get('path')), 40)} path")
    if state.get("port") != plan["port"]:
        why.append(f"port {masking.clip(str(state.get('port')), 40)}")
    if state.get("plan_id") != serve_state.plan_identity(plan) and not why:
        why.append("another command on the same port (another served name, length or sizing)")
    if plan["path"] != "host":
        if state.get("path") == plan["path"] and state.get("container_name") != plan.get("container_name"):
            why.append(f"container {masking.clip(str(state.get('container_name')), 140)}")
        if (state.get("engine") or None) != (plan.get("engine") or None):
            why.append(f"the engine {masking.clip(str(state.get('engine') or 'the default socket'), 140)}")
    return ", ".join(why) or None


def own_state(plan: dict, verb: str) -> dict | None:
    """The state of this plan's server, or None; another plan's is refused while its server runs, None once dead."""
    state = serve_state.read_state(plan)
    other = foreign_state(plan, state) if state is not None else None
    if other is None:
        return state
    if running := state_server(state):
        raise ScriptError(
            f"the state dir {plan['state_dir']} records the running server of another plan ({other}: "
            f"{running}), not this plan's",
            f"{verb} it with the plan that started it; give this plan "
            "a state dir of its own (plan again with --state-dir)",
            phase=verb,
        )
    return None


def inspect_container(rt: list[str], name: str) -> dict | None:
    """{"id", "running" (or restarting), "restarts"} of the container of that name, {} if none, None if not said."""
    res = subproc.run([*rt, "inspect", "-f", INSPECT_FORMAT, name], timeout=30)
    if not res.ok:
        return {} if "no such" in (res.stderr or "").lower() else None
    found = INSPECTED.fullmatch(" ".join(res.stdout.split()))
    return found and {"id": found[1], "running": "true" in found.group(2, 3), "restarts": int(found[4])}


def started_here(state: dict | None, found: dict) -> bool:
    """The container of the plan's name is the one the state's start launched (the name may be another's now)."""
    recorded = (state or {}).get("container_id")
    if not isinstance(recorded, str) or not serve_state.CONTAINER_ID.fullmatch(recorded):
        return False
    return found.get("id", "").startswith(recorded) or recorded.startswith(found.get("id") or "-")


def restarted(plan: dict, state: dict) -> int:
    """How often the runtime's restart policy has brought this start's container back (0 on the host path)."""
    if plan["path"] == "host":
        return 0
    found = inspect_container(runtimes.runtime_of(plan), plan["container_name"])
    return found["restarts"] if found and started_here(state, found) else 0


def alive(plan: dict, state: dict) -> bool | None:
    """The plan's server runs (True), has exited (False), or its runtime did not say (None, never "exited")."""
    if plan["path"] == "host":
        return process_alive(state)
    found = inspect_container(runtimes.runtime_of(plan), plan["container_name"])
    return None if found is None else (bool(found) and found["running"] and started_here(state, found))


def log_tail(plan: dict, n: int = LOG_TAIL, state: dict | None = None) -> list[str]:
    """The server's last lines (of its last LOG_TAIL_BYTES), any secret masked; a container's by its recorded id."""
    if plan["path"] == "host":
        try:
            with os.fdopen(serve_state.open_own_file(plan["log_file"], os.O_RDONLY), "rb") as f:
                start = max(0, os.fstat(f.fileno()).st_size - LOG_TAIL_BYTES)
                f.seek(start)
                lines = f.read(LOG_TAIL_BYTES).decode("utf-8", errors="replace").splitlines()
                lines = lines[1:] if start else lines  # a line the window cuts may hold part of a secret
        except (OSError, ScriptError):  # none yet, or not a file of ours: nothing to show
            return []
    else:
        recorded = (state if state is not None else serve_state.read_state(plan) or {}).get("container_id")
        if not isinstance(recorded, str) or not serve_state.CONTAINER_ID.fullmatch(recorded):
            return []
        # bounded as the host log is: a runtime whose last lines never end fills no memory
        res = subproc.run(
            [*runtimes.runtime_of(plan), "logs", "--tail", str(n), recorded], timeout=30, limit=LOG_TAIL_BYTES
        )
        lines = res.stdout.splitlines()[: -1 if res.failure else None]  # cut at the limit, or by the timeout
        lines += [] if res.failure == "output_limit" else res.stderr.splitlines()
    secrets = serve_state.known_secrets(plan)
    return [masking.redact(line, secrets, limit=1000) for line in lines[-n:]]


def runtime_silent(plan: dict, verb: str, undone: str, keeps_files: bool = True) -> ScriptError:
    """The runtime did not say whether a container of the plan's name exists: nothing is done by that name."""
    return ScriptError(
        f"{plan['runtime']} did not say whether a container named {plan['container_name']} exists "
        f"(inspect failed): {undone}",
        f"check the runtime ({plan['runtime']} info), then run {verb} "
        "again" + ("; the state and secret files are kept" if keeps_files else ""),
        phase=verb,
    )


def by_id(rm: list[str], container_id: str) -> list[str]:
    """The plan's `RT rm -f NAME`, narrowed to the container the runtime named (the name may pass on meanwhile)."""
    return [*rm[:-1], container_id]


def container_gone(removal: subproc.RunResult) -> bool:
    """`RT rm -f NAME` removed it, or there was none: a runtime that did not answer leaves it maybe running."""
    return removal.ok or "no such container" in (removal.stderr or "").lower()
