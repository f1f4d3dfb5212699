"""Stopping a plan's server and removing what start left."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from epyc import masking, subproc
from epyc.decisions.command import STOP_GRACE_S, runtime_stop_pair
from epyc.deployments import serve_procs, serve_state
from epyc.deployments.process import end_group, group_members, orphaned_workers
from epyc.errors import ScriptError
from epyc.facts import runtimes


def remove_state(plan: dict) -> str | None:
    """state.json removed, when this plan's, once the server is gone; a refusal is returned for the document."""
    state = serve_state.read_state(plan)
    # another plan's (stale) state: not this stop's
    if state is not None and not serve_procs.foreign_state(plan, state):
        try:
            Path(plan["state_file"]).unlink(missing_ok=True)
        except OSError as exc:
            return (
                f"the server is stopped, but {plan['state_file']} could not be removed ({exc.strerror or exc}); "
                "it names a server that no longer runs: remove it when the folder is writable"
            )
    return None


def stopped(plan: dict, state: dict | None, doc: dict, *problems: str) -> dict:
    """stop's document once the server is gone: key files, state and shared memory removed, or said."""
    said = [p for p in (*problems, serve_state.remove_secret_files(plan), remove_state(plan)) if p]
    freed = free_segments(state)
    return {**doc, **({"freed_segments": freed} if freed else {}), **({"warnings": said} if said else {})}


def stop(plan: dict) -> dict:
    with serve_state.holding_the_start_lock(plan):
        return _stop_locked(plan)


def _stop_locked(plan: dict) -> dict:
    state = serve_procs.own_state(plan, "stop")
    return stop_host(plan, state) if plan["path"] == "host" else stop_container(plan, state)


def stop_container(plan: dict, state: dict | None) -> dict:
    """The plan's container, by the id the runtime showed is this start's; its key files and state after."""
    rt = runtimes.runtime_of(plan)
    found = serve_procs.inspect_container(rt, plan["container_name"])
    if found is None:  # stop and rm go by name: never on a container the runtime has not shown is ours
        raise serve_procs.runtime_silent(plan, "stop", "nothing was stopped or removed")
    if found and state is None:  # the name is one per port: another state dir's plan on this port started it
        raise ScriptError(
            f"a container named {plan['container_name']} exists ({'running' if found['running'] else 'exited'}, "
            f"id {found['id'][:12]}) that the state dir {plan['state_dir']} has no record of: "
            "another plan's on the same port (its own state dir), or one whose state was lost",
            "stop it with the plan that started it; if it is this plan's, remove it by hand: "
            + runtime_stop_pair(rt, plan["container_name"]),
            phase="stop",
        )
    gone = {"stopped": False, "reason": "not running", "container_name": plan["container_name"]}
    if not found:  # gone already: nothing is sent by name, which another start may take meanwhile
        return stopped(plan, state, gone)
    if not serve_procs.started_here(state, found):  # ours is gone; the name is another start's now
        said = f"(id {found['id'][:12]}, not {str(state.get('container_id'))[:12]}): left alone"
        return stopped(plan, state, gone, f"the container named {plan['container_name']} now is another start's {said}")
    # by the id judged above: the name may pass to another start's container meanwhile
    graceful = subproc.run([*rt, "stop", "-t", str(STOP_GRACE_S), found["id"]], timeout=STOP_GRACE_S + 60)
    res = subproc.run([*rt, "rm", "-f", found["id"]], timeout=120)
    if not serve_procs.container_gone(res):  # it may still run: its state and the key files it reads stay
        raise ScriptError(
            f"{plan['runtime']} could not remove {plan['container_name']}: "
            f"{masking.clip((res.stderr or res.failure or '').strip(), 300, tail=True)}",
            f"check the runtime ({plan['runtime']} info), then run stop again; the state and "
            "secret files are kept until the container is gone",
            phase="stop",
        )
    if not graceful.ok and "no such container" in (graceful.stderr or "").lower():  # never started, or gone
        return stopped(plan, state, gone)
    detail = masking.clip((res.stdout or res.stderr).strip(), 200)
    doc = {"stopped": True, "container_name": plan["container_name"], "graceful": graceful.ok, "detail": detail}
    return stopped(plan, state, doc)


def stop_host(plan: dict, state: dict | None) -> dict:
    """The recorded process group (proven this run's by its marker), SIGTERM then SIGKILL; its state after."""
    group = group_members(state) if state else []
    if not group:
        left = orphaned_workers(state) if state else []  # not killed, and the only state naming them is kept
        if left:
            raise ScriptError(
                f"the server's leader is gone, and {len(left)} process(es) of its group "
                f"{state['pgid']} remain that cannot be proven this run's (pids {[p.pid for p in left][:10]})",
                f"look at them (ps -o pid,args -g {state['pgid']}); if they are the server's, "
                f"kill -- -{state['pgid']}, then run stop again (the state file is kept)",
                phase="stop",
            )
        return stopped(plan, state, {"stopped": False, "reason": "not running"})
    left, late = end_group(state, group)
    counts = {"processes": len(group) + len(late), "killed_after_timeout": len(left) + len(late)}
    return stopped(plan, state, {"stopped": True, "pid": state.get("pid"), **counts})


def free_segments(state: dict | None) -> list[str]:
    """The shared memory verify saw this server map (a killed engine never unlinks it), this user's, once unheld."""
    names = serve_procs.recorded_segments(state)
    held = serve_procs.segments_in_use() if names else set()  # every process is read: only when there is a name to free
    freed = []
    for name in names:
        seg = Path("/dev/shm") / name
        with contextlib.suppress(OSError):
            if name not in held and seg.lstat().st_uid == os.getuid():
                seg.unlink()
                freed.append(name)
    return freed
