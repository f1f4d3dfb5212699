"""Starting a plan's server: a host process group or a container."""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

from epyc import bundle, cli, errors, masking, subproc
from epyc.decisions.command import bound_cpus, server_env
from epyc.deployments import serve_procs, serve_state
from epyc.deployments.process import launch, start_error, unrecorded
from epyc.deployments.serve_state import write_state
from epyc.errors import ScriptError
from epyc.facts import hostfacts, hubcache, runtimes, validation

PULL_TIMEOUT_S = 3600
PULL_FIX = "check registry access and the image name (data/epyc.json, or --image)"
RUN_TIMEOUT_S = 300
CONFIRM = (
    "start needs --confirm: the human must approve the plan first",
    "show summary_markdown from the plan, wait for a clear go, then pass --confirm",
)
# docker's and podman's words when `run` refused to create ours: the name is another container's
NAME_TAKEN = "is already in use"


def port_in_use(port: int) -> bool:
    return not validation.port_is_free(port)


def cpus_not_here(plan: dict) -> str | None:
    """The plan's OMP bind less the CPUs this process may run on (a plan sized elsewhere), or None: all are here."""
    import psutil

    bind = bound_cpus(plan["sizing"]["vllm_cpu_omp_threads_bind"])
    if bind is None:
        return plan["sizing"]["vllm_cpu_omp_threads_bind"]
    missing = set(bind) - set(psutil.Process().cpu_affinity())
    return hostfacts.format_cpulist(missing) if missing else None


def refuse_elsewhere(plan: dict) -> None:
    """A plan made for another machine (facts assumed, or CPUs this one does not let us run on) never starts here."""
    if plan.get("deferred"):
        raise start_error(
            f"this plan is for {plan.get('target')}, not this machine: {', '.join(plan['deferred'])} were assumed",
            "run the chain on that host itself (detect.py there reads it live), then plan and start there",
        )
    if plan["path"] == "host" and (foreign := cpus_not_here(plan)):
        raise start_error(
            f"the plan binds CPUs {foreign} that this machine does not let us run on: it was sized for {plan.get('target')}",
            "run the chain on the machine that serves (detect.py without --sysroot), then plan and start there",
        )


def start(plan: dict, confirm: bool, pull_policy: str = "missing") -> dict:
    """Run what the plan says, once, under the state dir's lock, refusing a running server, busy port, unset secret."""
    if not confirm:
        raise ScriptError(*CONFIRM)
    refuse_elsewhere(plan)
    # checked again here: a plan file is data anyone may have edited
    folder, fix = Path(plan["state_dir"]), serve_state.STATE_DIR_FIX
    serve_state.refuse_state_dir(folder, f"state dir {plan['state_dir']}", fix, phase="start")
    serve_state.make_own_folder(folder, fix, "start")
    if serve_state.up_in_progress(plan):
        why = f"an up in {plan['state_dir']} is running its steps: its plan.json, written next, would not name the "
        fix = "wait for that up to finish (then verify or stop with the plan.json it wrote), or plan this one with a "
        raise start_error(why + "server this start launches", fix + "state dir of its own (--state-dir)")
    with os.fdopen(serve_state.open_own_file(Path(plan["state_dir"]) / ".lock", os.O_WRONLY | os.O_CREAT), "w") as lock:
        if not serve_state.flock_within(lock.fileno(), serve_state.LOCK_WAIT_S):
            fix = "wait for it, then verify (or start again if it was a stop)"
            raise start_error(f"another start, or a stop, for {plan['state_dir']} is running", fix)
        refuse_to_start_over(plan)
        secrets, warnings = serve_state.secret_values(plan), []
        host = plan["path"] == "host"
        state = start_host(plan, secrets) if host else start_container(plan, secrets, pull_policy, warnings)
        # a copy beside the state: the plan that stops this server, whatever later happens to the one given
        serve_state.write_own_file(Path(plan["state_dir"]) / "plan.json", json.dumps(plan, indent=2) + "\n")
        return {"started": True, **{k: v for k, v in state.items() if k != "marker"}, "warnings": warnings}


def refuse_to_start_over(plan: dict) -> None:
    """start never starts over a running server (whichever plan started it) or a busy port."""
    state = serve_state.read_state(plan)
    running = serve_procs.state_server(state) if state else None
    if running:  # whichever plan started it: a new state written over it would leave it named by nothing
        other = serve_procs.foreign_state(plan, state)
        if other is None:
            fix = "python3 scripts/launch.py stop --plan <plan.json> first"
            raise start_error(f"a server from this plan is already running ({running}; {plan['state_file']})", fix)
        raise start_error(
            f"a server of another plan ({other}) is already running from the state dir {plan['state_dir']} ({running})",
            "stop it with the plan that started it, or plan this one with a state dir of its own (--state-dir)",
        )
    if port_in_use(plan["port"]):
        fix = "re-run validate.py (it picks a free port) and plan again; with --network=host a busy port cannot be remapped"
        raise start_error(f"port {plan['port']} is already in use", fix)


def start_host(plan: dict, secrets: dict) -> dict:
    """The plan's argv as a process group of its own, launched and recorded in state.json as one step."""
    import secrets as tokens

    hubcache.refuse_a_relative_hub_cache(dict(os.environ))  # the server reads the Hub from start's folder
    token = tokens.token_hex(16)
    env = server_env(dict(os.environ), plan["env"], secrets, token)
    program = subproc.find_program(plan["argv"][0], env)  # the pin program (numactl / taskset) or vllm
    if program is None:
        raise start_error(
            f"{plan['argv'][0]} is not in any absolute folder of PATH (the current folder is never searched)",
            "install it (apt-get install numactl), or run start from a shell whose PATH has /usr/bin",
        )
    return launch(plan, env, program, "server", marker=token, model_dir=plan["model_dir"])


def clear_leftover(plan: dict, rm: list[str]) -> None:
    """An exited container of the plan's name removed by its id; a running one, or a runtime silent, is refused."""
    found = serve_procs.inspect_container(runtimes.runtime_of(plan), plan["container_name"])
    if found is None:  # nothing is removed by name that the runtime has not said is a leftover
        raise serve_procs.runtime_silent(plan, "start", "nothing was removed or started")
    if found and found["running"]:
        raise start_error(
            f"a container named {plan['container_name']} is running (id {found['id'][:12]}) that the state dir "
            f"{plan['state_dir']} has no record of: another plan's on this port, or one whose state was lost",
            "stop it with the plan that started it (or by hand: "
            + shlex.join([*runtimes.runtime_of(plan), "stop", plan["container_name"]])
            + "), or plan this one on another port; then start again",
        )
    if found:
        leftover = subproc.run(serve_procs.by_id(rm, found["id"]), timeout=60)
        if not serve_procs.container_gone(leftover):
            raise start_error(
                f"{plan['runtime']} could not remove the exited container {plan['container_name']} "
                f"({masking.clip((leftover.stderr or leftover.failure or '').strip(), 200, tail=True)})",
                f"check the runtime ({plan['runtime']} info), then start again",
            )


def run_container(plan: dict, rm: list[str], warnings: list[str]) -> tuple[list[str], subproc.RunResult]:
    """`run -d` of the plan's argv; rootless podman that refuses --cpuset-* runs again without them."""
    argv = plan["argv"]
    res = subproc.run(argv, timeout=RUN_TIMEOUT_S)
    if not res.ok and plan["runtime"] == "podman" and "cpuset" in res.stderr.lower():
        argv = [a for a in argv if not a.startswith(("--cpuset-cpus=", "--cpuset-mems="))]
        note = "rootless podman rejected --cpuset-cpus/--cpuset-mems (no cpuset delegation): started without them; "
        warnings.append(note + "thread binding still applies via VLLM_CPU_OMP_THREADS_BIND")
        refused = serve_procs.inspect_container(runtimes.runtime_of(plan), plan["container_name"])
        if refused is None:  # the retry would meet a container it cannot tell from another plan's
            raise serve_procs.runtime_silent(plan, "start", "after podman refused --cpuset-*, nothing was retried")
        if refused and not refused["running"]:  # podman leaves the refused run's container, created
            subproc.run(serve_procs.by_id(rm, refused["id"]), timeout=60)
        res = subproc.run(argv, timeout=RUN_TIMEOUT_S)
    if not res.ok:
        why = masking.clip(res.stderr.strip() or res.failure or "", 400, tail=True)
        raise start_error(f"{plan['runtime']} run failed: {why}", serve_state.NO_RETRY_FIX)
    return argv, res


def start_container(plan: dict, secrets: dict, pull_policy: str, warnings: list[str]) -> dict:
    """The plan's container, pulled if needed and run with the key files; removed again if no state names it."""
    rm, pull = plan["pre_argv"]
    clear_leftover(plan, rm)
    built, step = pull[-3:-1] == ["image", "inspect"], f"{pull[-2]} {plan['image']}"  # built here: never pulled
    if built or pull_policy == "always" or not runtimes.image_is_local(*map(plan.get, ("runtime", "image", "engine"))):
        errors.log(f"start: {step}")
        res = subproc.run(pull, timeout=PULL_TIMEOUT_S, progress=f"start: {step}")
        if not res.ok:  # a locally built image's fix is the line that builds it
            rows = bundle.load_epyc()["stacks"].values()
            fix = next((r["setup"] for r in rows if built and r.get("image") == plan["image"]), PULL_FIX)
            why = masking.clip(res.stderr.strip() or res.failure or "", 300, tail=True)
            raise ScriptError(f"{step} failed: {why}", fix, phase="pull")
    launched, printed = False, ""
    try:
        if secrets:
            serve_state.write_secret_files(Path(plan["state_dir"]) / "secrets", secrets)
        argv, res = run_container(plan, rm, warnings)
        launched = True
        printed = (res.stdout.strip().splitlines() or [""])[-1].strip()  # `run -d` prints the new id last
        if not serve_state.CONTAINER_ID.fullmatch(printed):  # a runtime that printed something else: ask for the id
            found = serve_procs.inspect_container(runtimes.runtime_of(plan), plan["container_name"])
            printed = (found or {}).get("id", "")
        # a state without it names no server: not left running unnamed
        if not serve_state.CONTAINER_ID.fullmatch(printed):
            raise start_error(
                f"{plan['runtime']} run printed no container id, and inspect named none: start removed the container",
                "check the runtime (" + plan["runtime"] + " info), then start again",
                own_words=True,
            )
        state = {k: plan.get(k) for k in ("path", "port", "runtime", "engine", "container_name", "model_dir")}
        state.update(
            plan_id=serve_state.plan_identity(plan), container_id=printed[:64], started_at=time.time(), argv=argv
        )
        write_state(plan, state)
        return state
    except BaseException as exc:
        if not launched and isinstance(exc, ScriptError):  # `run` refused
            printed = refused_run_leftover(plan, exc)
        remove_unrecorded(plan, rm, printed, exc, launched)
        raise  # remove_unrecorded always raises; this line is never reached


def refused_run_leftover(plan: dict, exc: ScriptError) -> str:
    """After `run` refused: the id of the exited container it left, to remove; raises when none is ours to remove."""
    taken = NAME_TAKEN in exc.error.lower()
    # docker may refuse before it takes the name: only a container of that name not running can be our run's
    left = None if taken else serve_procs.inspect_container(runtimes.runtime_of(plan), plan["container_name"])
    if left and not left["running"]:
        return left["id"]
    serve_state.remove_secret_files(plan)
    if taken:  # another plan's container took the name since clear_leftover: ours was never created
        raise start_error(
            f"{plan['runtime']} run failed: another container took the name {plan['container_name']} while this "
            "start ran (another plan's start on this port)",
            "stop it with the plan that started it, or plan this one on another port; then start again",
        ) from None
    if left == {}:  # the refused run made nothing: nothing to remove
        raise exc
    said = (
        f"a running container named {plan['container_name']} (id {left['id'][:12]}) is not this start's: left alone"
        if left
        else f"{plan['runtime']} did not say whether a container of its name exists: nothing was removed"
    )
    raise start_error(f"{exc.error}; {said}", exc.fix) from None


def remove_unrecorded(plan: dict, rm: list[str], printed: str, exc: BaseException, launched: bool) -> None:
    """No state names the container: it is removed (by id where known) with the key files, and start says why."""
    if serve_state.CONTAINER_ID.fullmatch(printed):
        rm = serve_procs.by_id(rm, printed)
    with cli.signals_deferred():
        removed = subproc.run(rm, timeout=60)
        serve_state.remove_secret_files(plan)
    if not serve_procs.container_gone(removed):  # it may run, and no state names it: say so, and how to take it down
        raise start_error(
            f"start launched {plan['container_name']} and could not record it, nor remove it "
            f"({masking.clip((removed.stderr or removed.failure or '').strip(), 200, tail=True)}): it may be running",
            f"{shlex.join(rm)} once the runtime answers ({plan['runtime']} info)",
            interrupted=isinstance(exc, KeyboardInterrupt),
        ) from None
    if isinstance(exc, ScriptError) and (not launched or exc.extra.pop("own_words", False)):  # its own words
        raise exc
    raise unrecorded(plan, exc, f"container {plan['container_name']}", "removed") from None
