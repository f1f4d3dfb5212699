"""The life of one server: start it (a host process group or a container), judge it alive, verify it
over HTTP, and stop exactly what was started. All the I/O of launch.py's verbs lives here; the
decisions come from serve_plan.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

import common
from common import ScriptError
from serve_plan import (MARKER_ENV, SECRET_VALUE, STOP_GRACE_S, in_system_tree, judge_smoke, redact,
                        runtime_stop_pair, secret_unsendable, server_env, smoke_request)

PULL_TIMEOUT_S = 3600
RUN_TIMEOUT_S = 300
LOG_TAIL = 50
LOG_TAIL_BYTES = 256 * 1024
NO_RETRY_FIX = "report this phase and the log lines to the user and stop: do not retry, do not debug"
PLAN_FIX = "pass the unmodified output of launch.py plan (plan again if you need changes)"


def open_own_file(path: str | Path, flags: int, mode: int = 0o600, phase: str = "start",
                  one_name: bool | None = None, dir_fd: int | None = None) -> int:
    """Open a file of the state dir as a regular file of its own: not through a symbolic link (a link
    planted there must not make start write, truncate or show a file elsewhere), and not a FIFO, device or
    folder of that name (a FIFO would block start forever, after the server was launched). With one_name
    (the default for a write) a file with other names (a hard link) is refused too: writing would change a
    file elsewhere, and reading the server log would pass another file's lines off as the server's. A
    state.json read is not refused for it: the process it names is checked anyway, and a refusal there
    would make stop say "not running" and leave the server up. A file found and written must be this
    user's, and gets `mode`: one another user made (0666, readable by them) would keep its owner and mode,
    and the secret or log written into it with them. A file made here is ours whoever the file system says
    owns it (root-squash NFS). With O_EXCL in `flags`, only a file made here."""
    import errno
    import stat
    truncate = bool(flags & os.O_TRUNC)  # only once the file is known to be ours alone
    # with dir_fd (a folder held open), the name in that folder: never a path looked up again
    name = path if dir_fd is None else os.path.basename(path)
    base = (flags & ~os.O_TRUNC) | os.O_NOFOLLOW | os.O_NONBLOCK
    made = False
    try:
        if flags & os.O_CREAT:  # made new here if it can be (O_EXCL never follows a link: a link is EEXIST)
            try:
                fd, made = os.open(name, base | os.O_EXCL, mode, dir_fd=dir_fd), True
            except FileExistsError:
                if flags & os.O_EXCL:
                    raise
                fd = os.open(name, base & ~os.O_CREAT, mode, dir_fd=dir_fd)
        else:
            fd = os.open(name, base, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ScriptError(f"{path} is a symbolic link: {phase} reads and writes only its own files, never "
                              "through a link",
                              "remove the link, or use a fresh folder", phase=phase)
        raise ScriptError(f"cannot open {path}: {exc.strerror or exc}",
                          "remove it, or use a fresh folder", phase=phase)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ScriptError(f"{path} is not a regular file (a pipe, device or folder of that name)",
                          "remove it, or use a fresh folder", phase=phase)
    if one_name is None:
        one_name = bool(flags & (os.O_WRONLY | os.O_RDWR))
    if one_name and st.st_nlink > 1:  # a hard link planted there: its other name is a file elsewhere
        os.close(fd)
        raise ScriptError(f"{path} has other names (a hard link): {phase} reads and writes only its own files",
                          "remove it, or use a fresh folder", phase=phase)
    if flags & (os.O_WRONLY | os.O_RDWR) and not made:
        if st.st_uid != os.geteuid():
            os.close(fd)
            raise ScriptError(f"{path} belongs to another user (uid {st.st_uid}): {phase} writes only files of its "
                              "own", "remove it, or use a fresh folder of your own", phase=phase)
        try:
            os.fchmod(fd, mode)
        except OSError as exc:  # a file system without modes (vfat, some CIFS): the file stays as it was
            os.close(fd)
            raise ScriptError(f"cannot make {path} mode {mode:o}: {exc.strerror or exc}", "use a state dir on a "
                              "file system with Unix permissions (not vfat or CIFS)", phase=phase) from None
    if truncate:
        os.ftruncate(fd, 0)
    os.set_blocking(fd, True)
    return fd


def write_own_file(path: str | Path, text: str, dir_fd: int | None = None, new: bool = False) -> None:
    """Write (or overwrite) a file of the state dir, 0600, through open_own_file: never a link's target.
    `new`: only a file made now (a name taken meanwhile is an error)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_EXCL if new else 0)
    try:
        with os.fdopen(open_own_file(path, flags, dir_fd=dir_fd), "w") as f:
            f.write(text)
    except OSError as exc:  # a full disk: opened, and the write (or its flush at close) refused
        raise common.os_error(exc, f"cannot write {path}")


def host_facts(opt: dict, inputs: dict, list_cache: bool = True) -> dict:
    """What a plan depends on besides its five documents, read from this shell and this disk: at plan
    time and again at start (the HF cache a container mounts is looked at again then, as it is now).
    `list_cache=False` where the caller takes the cache from the plan: it is not read at all then."""
    import validate
    chk, val = inputs["check_model"], inputs["validate"]
    model = opt.get("model") or chk.get("model") or ""
    folder = common.user_path(model, "the model") if model else None
    key_env = opt.get("api_key_env")
    return {"hf_token_set": bool(os.environ.get("HF_TOKEN")),
            "hf_offline": os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"),
            "api_key_set": bool(key_env and os.environ.get(key_env)),
            "api_key_length": len(os.environ.get(key_env, "").strip()) if key_env else None,
            # a value no header carries is refused here, as start would refuse it, not after the human confirmed
            "unsendable_secrets": [name for name in ("HF_TOKEN", key_env) if name and os.environ.get(name)
                                   and not SECRET_VALUE.fullmatch(os.environ[name])],
            "model_dir": os.path.realpath(folder) if folder is not None and folder.is_dir() else None,
            "hf_cache": validate.cache_listing(val["hf_cache"]["path"])
            if list_cache and val.get("path") == "container" and not val.get("deferred") else None}


INPUT_SCRIPTS = ("detect", "validate", "check_model", "estimate_memory", "cpu_tune")


def check_inputs(inputs: dict, where: str, fix: str) -> None:
    """The five documents a plan is rendered from, each against its script's output schema: a plan and
    its re-rendering read them by the same rule (an edited input is refused before it is used)."""
    for name in INPUT_SCRIPTS:
        common.check_schema(inputs.get(name), name, f"{where}: {name} is not {name}.py's output", fix)


def refuse_an_older_plan_elsewhere(phase: str) -> None:
    """A container plan of an older bundle recorded no engine: it ran on the daemon its shell named then.
    Its calls now go to the default socket; when this shell names another daemon, the container may be
    there, and a stop on the default socket would find nothing, say "not running" and drop the state."""
    shell = common.shell_docker_engine()
    if shell is not None:
        raise ScriptError(f"this plan is from an older version that did not record its docker engine, and this "
                          f"shell names {common.clip(shell, 120)}: its container may be on either daemon",
                          f"if its container runs on the default socket (docker ps), run {phase} again from a "
                          "shell that names no daemon (unset DOCKER_HOST; docker context use default); if it runs "
                          f"on {common.clip(shell, 120)} (docker --host={common.clip(shell, 120)} ps), stop it there "
                          "with docker itself (docker stop NAME; docker rm NAME); then plan again", phase=phase)


def rerender(plan: dict, epyc: dict, env_from_plan: bool = False, phase: str = "start",
             disk_from_plan: bool = False) -> dict:
    """The plan its own inputs and options give in this shell now (start compares it with the file).
    `env_from_plan`: take the secrets' and offline state from the plan itself, not this shell (stop must
    work where the API key is not exported; it only needs to know the plan was not edited). It implies
    `disk_from_plan`: the HF cache and the local model folder as the plan recorded them, not as the disk
    holds them now (a cache that changed, a model folder moved, under a running server must not make
    stop refuse it). Only start looks at the disk again."""
    from serve_plan import build_plan
    try:
        check_inputs(plan["inputs"], "the plan's inputs", PLAN_FIX)
        facts = host_facts(plan["options"], plan["inputs"], list_cache=not (env_from_plan or disk_from_plan))
        if env_from_plan:
            facts.update(hf_token_set="HF_TOKEN" in (plan.get("secrets") or {}),
                         api_key_set=bool(plan["options"].get("api_key_env")), api_key_length=None, unsendable_secrets=[],
                         hf_offline=(plan.get("env") or {}).get("HF_HUB_OFFLINE") == "1")
        if env_from_plan or disk_from_plan:
            facts["hf_cache"] = {"real": plan["inputs"]["validate"]["hf_cache"]["path"], "entries": None,
                                 "error": None, "from_plan": True}
            # the folder start served (its state records it): not the plan's field, which an edit could change
            # along with the argv; no state (nothing started, or an older bundle's): the disk, as before
            served = read_state(plan) or {}
            served = {} if foreign_state(plan, served) else served  # another plan's start: not what this one served
            # (a null recorded for an older plan, which has no model_dir, by bundles before served_folder: the
            # disk, as for that plan's older states)
            if "model_dir" in served and isinstance(served["model_dir"], (str, type(None))) \
                    and ("model_dir" in plan or served["model_dir"] is not None):
                facts["model_dir"] = served["model_dir"]
        # a plan of an older bundle served no --revision: the verbs that act on its server render it so (stop
        # must work), start renders it as it would run now, and refuses it (the revision checked is served)
        legacy = "revision" not in plan and (env_from_plan or disk_from_plan)
        inputs = plan["inputs"] if not legacy else {
            **plan["inputs"], "check_model": {**plan["inputs"]["check_model"], "revision": None}}
        # an older bundle's `up --dtype float32` sized the model at bfloat16 (it did not pass the dtype on):
        # plan refuses that now, start too; the verbs that act on its running server render it as it was
        served_dtype = (plan["options"].get("dtype") or epyc["precision"]["default"])
        sized_dtype = (inputs["estimate_memory"] or {}).get("dtype")
        older_dtype = (env_from_plan or disk_from_plan) and sized_dtype not in (None, served_dtype)
        if older_dtype:
            inputs = {**inputs, "estimate_memory": {**inputs["estimate_memory"], "dtype": served_dtype}}
        fresh = build_plan(inputs, plan["options"], epyc, facts)
        if legacy or older_dtype:
            if legacy:
                fresh.pop("revision", None)
            fresh["inputs"] = plan["inputs"]
        if "engine" not in plan and plan.get("path") != "host" and (env_from_plan or disk_from_plan):
            refuse_an_older_plan_elsewhere(phase)
        # an older bundle's container plan handed over the runtime's stop pair (which left the key files): the
        # verbs that act on its server read it as it was; start renders it as it would run now, and refuses it
        if (env_from_plan or disk_from_plan) and fresh["path"] == "container":
            older_stop = runtime_stop_pair(common.runtime_argv(fresh["runtime"], fresh.get("engine")),
                                           fresh["container_name"])
            if plan.get("stop_command") == older_stop:
                fresh["stop_command"] = older_stop
        if "model_dir" not in plan:  # a plan of an older bundle: compared on all it has
            fresh.pop("model_dir", None)
        if "engine" not in plan and fresh.get("engine") is None:  # older plans ran on the default engine only:
            fresh.pop("engine", None)  # a plan whose engine key was deleted still differs from its rendering
        return fresh
    except ScriptError as exc:  # e.g. the API key variable is not set in this shell
        exc.extra.setdefault("phase", phase)
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ScriptError(f"the plan's inputs cannot be rendered again ({type(exc).__name__}: {exc})", PLAN_FIX)


def load_plan(path: str) -> dict:
    """A plan is data: checked against its schema, and its state and log live in its own state dir
    (nothing else is ever written or removed)."""
    plan = common.read_json_input(path, "plan")
    common.check_schema(plan, "plan", f"{path} is not a launch plan", PLAN_FIX)
    # the key may live under any name (--api-key-env MYAPI): whatever a verb prints from here on masks it
    common.treat_as_secret(*(plan.get("secrets") or {}).values(), plan.get("api_key_env") or "")
    state_dir = Path(plan["state_dir"])
    if (Path(plan["state_file"]) != state_dir / "state.json" or Path(plan["log_file"]) != state_dir / "server.log"
            or not state_dir.is_absolute()):
        raise ScriptError(f"{path}: state_file and log_file must be state.json and server.log in the absolute "
                          "state_dir", PLAN_FIX)
    if (plan["path"] == "host") != (plan["runtime"] == "host") or \
            (plan["path"] == "container") != bool(plan["container_name"]):
        raise ScriptError(f"{path}: path, runtime and container_name disagree", PLAN_FIX)
    if not isinstance(plan.get("options"), dict) or plan["options"].get("state_dir") not in (None, plan["state_dir"]):
        raise ScriptError(f"{path}: state_dir differs from the state dir the plan's options name", PLAN_FIX)
    return plan


def read_plan(path: str, verb: str, epyc: dict) -> dict:
    """A plan as every verb but start reads it: load_plan's rules, then only as its own inputs render it
    (with the secrets and offline state the plan records, so it works where the key is not exported):
    an edited stop command, summary or command is refused before anything acts on it or shows it."""
    plan = load_plan(path)
    refuse_edited(plan, rerender(plan, epyc, env_from_plan=True, phase=verb), verb)
    return plan


def read_state(plan: dict) -> dict | None:
    try:
        with os.fdopen(open_own_file(plan["state_file"], os.O_RDONLY), "rb") as f:
            state = common.strict_json_loads(f.read(1 << 20).decode("utf-8"), unique_keys=True)
    except (common.DuplicateKey, common.NotANumber) as exc:  # edited by hand: which pid or port it names is
        # anyone's guess (start writes neither a key twice nor a NaN)
        said = "is ambiguous" if isinstance(exc, common.DuplicateKey) else "holds a number JSON does not have"
        raise ScriptError(f"{plan['state_file']} {said} ({exc}): it was edited, and what it names cannot "
                          "be trusted", "look at the server it meant (ps, docker ps) and stop it by hand; then "
                          "remove the file and start again") from None
    except (OSError, ValueError, RecursionError, ScriptError):  # none, a link, a FIFO, junk: no state of ours
        return None
    return state if written_by_start(state) else None


def written_by_start(state: object) -> bool:
    """A state one start wrote: a host server's group and start time, or a container's name. `{}` or a
    document of other fields names no server: verify had written its pass into it, handoff handed that
    off, and stop acted on the plan's container by name as if this state dir had started it. A container's
    state names its id: one with a name alone was taken "by the name" and stopped another plan's server."""
    if not isinstance(state, dict):
        return False
    # every start since the first bundle recorded the container's id (start now refuses to record none)
    return ({"path", "pgid", "create_time"} <= state.keys()
            or (state.get("path") == "container" and "container_name" in state
                and isinstance(state.get("container_id"), str) and bool(CONTAINER_ID.fullmatch(state["container_id"]))))


def write_state(plan: dict, state: dict) -> None:
    """Atomically: a reader sees the old state or the new one, never half of it. Each write has a temp file
    of its own (created, never reused): with one shared name, two writers at once (two verifies) truncated
    the file the other had just renamed into place, and a reader saw half a state."""
    import tempfile
    target = Path(plan["state_file"])
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".state.", suffix=".tmp", dir=target.parent)  # O_EXCL, 0600
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, target)  # replaces a link named state.json itself, never its target
    except BaseException as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(exc, OSError):  # a full disk, a read-only folder: named, never an internal error
            raise common.os_error(exc, f"cannot write {target}") from None
        raise


EXEC_SETTLE_S = 2.0  # how long an empty environ (a process inside execve) is asked again
EXEC_YOUNG_S = 30.0  # a process older than this is past its launch's execs: an empty environ is its own


def settled_environ(proc) -> dict | None:
    """A process's environment, or None when it cannot be read (gone, a zombie, not ours to read).

    An empty environ is a process inside execve (the pin program exec'ing vllm, vllm's #! line its
    python): /proc/PID/environ reads empty until the new image has its stack. Measured on a 2-vCPU
    guest, 14 of 30 launches read empty at least once, and a verify or stop just after start judged the
    server "exited", or not ours. It is asked again until the exec is done; still empty then, it is an
    environ nobody can judge (`env -i`), and None says so. Only a young process is waited for: vLLM's
    workers, renamed by setproctitle, read empty for good, and stop would wait on each of them."""
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
        if env:
            return env
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def group_members(state: dict) -> list:
    """The live processes of the server's process group (its session: start made the leader with
    start_new_session). Judged by the group, not the leader: workers can outlive it.

    Ours only by start's run token (MARKER_ENV) in the environment: the leader's when it lives (vLLM's
    workers rename themselves with setproctitle, which clobbers their /proc environ, so they cannot be
    asked), else at least one surviving member's. A state file naming another group matches neither."""
    import psutil
    pgid, started, token = state.get("pgid"), state.get("create_time"), state.get("marker")
    if not isinstance(pgid, int) or not isinstance(started, (int, float)) or pgid <= 1 \
            or not isinstance(token, str) or len(token) < 16:
        return []
    def marked(proc) -> bool | None:  # None: its environ cannot be read
        env = settled_environ(proc)
        return None if env is None else env.get(MARKER_ENV) == token

    leader_marked = None
    try:  # the leader's pid alive with another start time: it was reused, and the group is not ours
        leader = psutil.Process(pgid)
        if abs(leader.create_time() - started) > 0.01:
            return []
        leader_marked = marked(leader)
    except psutil.Error:
        pass  # the leader is gone (or a zombie); its workers may not be
    if leader_marked is False:
        return []
    out = group_scan(pgid, started)
    if leader_marked is None and not any(marked(p) for p in out):
        return []
    return out


def leader_gone(pgid: int) -> bool:
    """The process that led group `pgid` has exited (gone, or a zombie nobody reaped)."""
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
            if (os.getpgid(proc.pid) == pgid and proc.info["create_time"] >= started - 1
                    and proc.info["status"] != psutil.STATUS_ZOMBIE):
                out.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return out


def orphaned_workers(state: dict) -> list:
    """The processes left in a host state's group whose leader is gone and that cannot show the run's marker
    (vLLM's renamed workers read an empty environ): not provably ours, so never killed, and never forgotten
    (the state that names them is kept). A live leader without the marker is another group: none."""
    pgid, started = state.get("pgid"), state.get("create_time")
    if not isinstance(pgid, int) or pgid <= 1 or isinstance(started, bool) or not isinstance(started, (int, float)):
        return []
    return group_scan(pgid, started) if leader_gone(pgid) else []


def process_alive(state: dict) -> bool:
    return bool(group_members(state))


CONTAINER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # the engines' rule for a container name


def state_server(state: dict) -> str | None:
    """What a state file names that still runs, in words (None: nothing). Judged by the state itself, not
    by the plan at hand: the state dir is one server's, whichever plan started it, and a start that wrote
    over a running server's state left that server named by nothing."""
    if state.get("path") == "container":
        name, runtime, engine = state.get("container_name"), state.get("runtime"), state.get("engine")
        if runtime not in common.CONTAINER_RUNTIMES or not isinstance(name, str) or not CONTAINER_NAME.fullmatch(name) \
                or (engine is not None and (runtime != "docker" or common.docker_engine_problem(engine))):
            return None  # not a state start wrote: it names nothing we could ask about
        try:  # runtime_of: a podman or sudo docker that would ask another machine is not asked
            running = container_running(common.runtime_of(state), name, state)
        except ScriptError as exc:
            return f"container {name} (its runtime cannot be asked from here, so it may run: {exc.error})"
        if running is None:
            return f"container {name} (its runtime did not say whether it runs, so it may)"
        return f"container {name}" if running else None
    if group_members(state):
        return f"process group {state['pgid']}"
    left = orphaned_workers(state)
    if left:
        return (f"{len(left)} process(es) of group {state['pgid']}, whose leader is gone, that cannot be proven "
                f"its run's (pids {[p.pid for p in left][:10]})")
    return None


def plan_identity(plan: dict) -> str:
    """What tells one plan's server from another's: the command, its environment, where it runs. Two plans
    on one port and folder (another --served-model-name, --max-model-len, sizing) differ here; the same
    plan rendered again does not. start records it in the state."""
    import hashlib
    basis = {key: plan.get(key) for key in ("path", "argv", "env", "container_name", "engine")}
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:32]


def served_port(state: dict) -> int | None:
    """The --port on the command line of the run's live processes (a state of an older bundle recorded no
    port): None when nothing of the run lives, or none says."""
    import psutil
    for proc in group_members(state):
        try:
            args = proc.cmdline()
        except psutil.Error:
            continue
        for flag, value in zip(args, args[1:]):
            if flag == "--port" and value.isdigit():
                return int(value)
    return None


def foreign_state(plan: dict, state: dict) -> str | None:
    """How a state in the plan's state dir shows it was written by a start of another plan (another command,
    path, port or container), or None when it is this plan's. A state of an older bundle recorded neither
    the plan's identity nor its port: the port is then read from the run's command line, and a run whose
    port cannot be read is not this plan's (stop must not kill what it cannot tell apart)."""
    why = []
    if "path" in state and state["path"] != plan["path"]:
        why.append(f"the {common.clip(str(state.get('path')), 40)} path")
    if "port" in state:
        port = state["port"]
    elif state.get("path") == "host":
        port = served_port(state)
        if port is None and not state_server(state):  # nothing of that run lives: a stale state, ours to clear
            port = plan["port"]
    else:
        port = plan["port"]  # a container's name carries its port: compared below
    if port != plan["port"]:
        why.append(f"port {common.clip(str(port if port is not None else 'unknown'), 40)}")
    if "plan_id" in state and state["plan_id"] != plan_identity(plan) and not why:
        why.append("another command on the same port (another served name, length or sizing)")
    if plan["path"] != "host" and state.get("path") == plan["path"] \
            and state.get("container_name") != plan.get("container_name"):
        why.append(f"container {common.clip(str(state.get('container_name')), 140)}")
    if plan["path"] != "host" and (state.get("engine") or None) != (plan.get("engine") or None):
        why.append(f"the engine {common.clip(str(state.get('engine') or 'the default socket'), 140)}")
    return ", ".join(why) or None


def own_state(plan: dict, verb: str) -> dict | None:
    """The state of this plan's server, or None (nothing started). A state another plan's start wrote in the
    same state dir is refused while its server runs (verify, stop or hand off another plan's server by this
    plan's port and name would judge, kill or describe the wrong one), and is no state of ours once it is dead."""
    state = read_state(plan)
    if state is None:
        return None
    other = foreign_state(plan, state)
    if other is None:
        return state
    running = state_server(state)
    if running:
        raise ScriptError(f"the state dir {plan['state_dir']} records the running server of another plan ({other}: "
                          f"{running}), not this plan's", f"{verb} it with the plan that started it; give this plan "
                          "a state dir of its own (plan again with --state-dir)", phase=verb)
    return None


CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}")


def inspect_container(rt: list[str], name: str) -> dict | None:
    """{"id", "running"} of the container of that name, {} when there is none, None when the runtime did not
    say (down, not in PATH, an answer of another shape)."""
    res = common.run([*rt, "inspect", "-f", "{{.Id}} {{.State.Running}}", name], timeout=30)
    if not res.ok:
        return {} if "no such" in (res.stderr or "").lower() else None
    found = res.stdout.split()
    if len(found) != 2 or not CONTAINER_ID.fullmatch(found[0]) or found[1] not in ("true", "false"):
        return None
    return {"id": found[0], "running": found[1] == "true"}


def started_here(state: dict | None, found: dict) -> bool:
    """The container of the plan's name is the one the state's start launched. A name is one per port, not
    per state dir: after another plan's start on that port (another state dir) removed ours, its container
    carries the name. A state without a usable id (an older bundle's) is taken by the name, as it was."""
    recorded = (state or {}).get("container_id")
    if not isinstance(recorded, str) or not CONTAINER_ID.fullmatch(recorded):
        return state is not None
    return found.get("id", "").startswith(recorded) or recorded.startswith(found.get("id") or "-")


def container_running(rt: list[str], name: str, state: dict | None = None) -> bool | None:
    """The container runs, and (with `state`) is the one that state's start launched; None when the runtime
    did not say (a slow daemon): never read as "exited", which made verify fail a healthy server (and up
    stop it), handoff call it gone, and a start or up write over the state of a server that may run."""
    found = inspect_container(rt, name)
    if found is None:
        return None
    return bool(found) and found["running"] and (state is None or started_here(state, found))


def alive(plan: dict, state: dict) -> bool | None:
    """The plan's server runs (True), has exited (False), or its runtime did not say (None)."""
    return process_alive(state) if plan["path"] == "host" else \
        container_running(common.runtime_of(plan), plan["container_name"], state)


def log_tail(plan: dict, n: int = LOG_TAIL, state: dict | None = None) -> list[str]:
    """The server's last lines, with any secret value masked. A container's by the id its state records:
    none without one (the container of the name may be another plan's by now)."""
    # Only the end, LOG_TAIL_BYTES of it: a kernel log (ZENDNNL_API_LOG_LEVEL=4) runs to gigabytes. The line
    # that window cuts (the first after a seek, the last past the limit) is dropped, not shown: it may begin
    # or end inside a secret, and the mask, matching whole values, would not see the part it holds.
    if plan["path"] == "host":
        try:
            with os.fdopen(open_own_file(plan["log_file"], os.O_RDONLY, one_name=True), "rb") as f:  # ours alone
                start = max(0, os.fstat(f.fileno()).st_size - LOG_TAIL_BYTES)
                f.seek(start)
                lines = f.read(LOG_TAIL_BYTES).decode("utf-8", errors="replace").splitlines()
                lines = lines[1:] if start else lines
        except (OSError, ScriptError):  # none yet, or not a file of ours: nothing to show
            return []
    else:
        recorded = (state if state is not None else read_state(plan) or {}).get("container_id")
        if not isinstance(recorded, str) or not CONTAINER_ID.fullmatch(recorded):
            return []
        # bounded as the host log is: a runtime whose last lines never end fills no memory
        res = common.run([*common.runtime_of(plan), "logs", "--tail", str(n), recorded],
                         timeout=30, limit=LOG_TAIL_BYTES)
        lines = res.stdout.splitlines()[:-1 if res.failure else None]  # cut at the limit, or by the timeout
        lines += [] if res.failure == "output_limit" else res.stderr.splitlines()
    secrets = known_secrets(plan)
    return [redact(line, secrets, limit=1000) for line in lines[-n:]]


def secret_values(plan: dict) -> dict:
    """The secrets the plan names, read now from our environment. One that is unset is a refusal:
    an API-key server started without its key would enforce nothing, and what the human approved
    (a key) is what must run."""
    values, missing = {}, []
    for name, source in (plan.get("secrets") or {}).items():
        value = os.environ.get(source, "")
        if not value:
            missing.append(source)
        elif not SECRET_VALUE.fullmatch(value):  # a newline or space: no HTTP header can carry it
            raise ScriptError(secret_unsendable(source), f"export {source} again with the token alone "
                              "(printable ASCII, no spaces), then start", phase="start")
        values[name] = value
    if missing:
        raise ScriptError(f"the plan passes {', '.join(missing)} to the server, but it is not set in this shell",
                          f"export {missing[0]}=... in the shell that runs start (its value is never shown)",
                          phase="start")
    return values



def write_secret_files(directory: Path, values: dict) -> None:
    """One 0600 file per secret in a 0700 folder of the state dir, mounted read-only; stop removes it."""
    if directory.is_symlink() or (os.path.lexists(directory) and not directory.is_dir()):
        raise ScriptError(f"{directory} is not a folder start made (a link, file or pipe): secrets are written "
                          "only into the state dir itself", "remove it, or plan with a fresh --state-dir",
                          phase="start")
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        # held open from here: a link swapped in for the folder after this check cannot take the writes
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ScriptError(f"cannot make {directory}: {exc.strerror or exc}", "plan with a fresh --state-dir",
                          phase="start")
    try:
        owner = os.fstat(fd).st_uid
        if owner != os.geteuid():  # its owner could read the keys, or swap the files under us
            raise ScriptError(f"{directory} belongs to another user (uid {owner}): secrets are written only into a "
                              "folder of your own", "remove it, or plan with a fresh --state-dir", phase="start")
        os.fchmod(fd, 0o700)
        for name, value in values.items():
            # made new: a file found there may be open in another process already, which would read the key
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)
            write_own_file(directory / name, value, dir_fd=fd, new=True)
    except OSError as exc:
        raise common.os_error(exc, f"cannot write the secret files in {directory}") from None
    finally:
        os.close(fd)


STATE_DIR_FIX = "plan again with a new or empty --state-dir, e.g. ~/.cache/serving-llms-on-epyc/run/NAME"
SECRET_NAMES = ("HF_TOKEN", "VLLM_API_KEY")  # the only files start ever writes into secrets/
# what start and up keep in a state dir (up: one JSON per step, named by its phase; bench: bench-* folders)
OWN_FILES = {"server.log", "state.json", ".state.json.tmp", ".lock", ".up.lock", "secrets", "plan.json", "shown-plan.json",
             *(f"{phase}.json" for phase in ("detect", "validate", "setup_host_stack", "check_model",
                                             "estimate_memory", "cpu_tune"))}
STATE_TEMP = re.compile(r"\.state\.[A-Za-z0-9_]{1,16}\.tmp")  # write_state's own temp file (a killed writer's stays)


def state_dir_problem(state_dir: Path) -> str | None:
    """Why start may not write into this folder, or None. start truncates server.log and writes state.json
    there, stop removes them: so it is an absolute folder other than '/', new, or holding only this
    bundle's files, and its secrets/ (when there) is a real folder of the secret files start writes."""
    try:
        if not state_dir.is_absolute():
            return "is not an absolute path"
        if state_dir == Path("/"):
            return "already holds other files (it is /)"
        if not str(state_dir).isprintable():  # an XDG_CACHE_HOME with a newline: the summary would lie
            return "holds characters that are not printable"
        for where in {str(state_dir), os.path.realpath(state_dir)}:  # as written, and through any link
            if in_system_tree(where):
                return f"is inside a system tree (/proc, /sys, /dev, /etc, /run...): {where}"
        try:
            os.lstat(state_dir)
        except FileNotFoundError:  # new: start makes it
            return None
        if not state_dir.is_dir():
            return "exists and is not a folder"
        owner = state_dir.stat().st_uid
        if owner != os.geteuid():  # its owner can rename what start checked there, and read what it writes
            return f"belongs to another user (uid {owner})"
        foreign = sorted(p.name for p in state_dir.iterdir()  # bench's folders are folders, never links
                         if p.name not in OWN_FILES and not STATE_TEMP.fullmatch(p.name)
                         and not (p.name.startswith("bench-") and p.is_dir()
                                                              and not p.is_symlink()))
        if foreign:
            return f"already holds other files ({', '.join(foreign[:5])})"
        secrets = state_dir / "secrets"
        if os.path.lexists(secrets):
            if secrets.is_symlink() or not secrets.is_dir():
                return "holds a secrets entry that is not a folder (a link, file or pipe)"
            owner = secrets.stat().st_uid
            if owner != os.geteuid():
                return f"holds a secrets folder of another user (uid {owner})"
            odd = sorted(p.name for p in secrets.iterdir()
                         if p.name not in SECRET_NAMES or p.is_symlink() or not p.is_file())
            if odd:
                return f"holds secrets/{odd[0]}, not a secret file start writes"
    except OSError as exc:  # a name too long, a loop of links, no permission
        return f"cannot be read ({exc.strerror or exc})"
    return None


def remove_secret_files(plan: dict) -> str | None:
    """Remove what start wrote, by name, and the folder if that leaves it empty: never a whole tree a
    plan file happens to point at, never a folder or a link's target. It never fails (stop must go on);
    a key file it could not remove is said (a secret left on disk), a foreign entry left is not."""
    directory = Path(plan["state_dir"]) / "secrets"
    try:
        if directory.is_symlink() or not directory.is_dir():  # not a folder start made: not ours to touch
            return None
        for name in SECRET_NAMES:
            entry = directory / name
            if entry.is_symlink() or entry.is_file():
                entry.unlink(missing_ok=True)
    except OSError as exc:  # a read-only state dir: the key files stay, and the user must know
        return f"could not remove the key files in {directory} ({exc.strerror or exc}): delete them by hand"
    with contextlib.suppress(OSError):  # a folder under a secret's name, a foreign file: left where it is
        directory.rmdir()
    return None


def remove_state(plan: dict) -> str | None:
    """state.json goes only when it is one start wrote (a dict with our fields), not any file of that name.
    Called once the server is gone: a state dir that refuses the removal (read-only, its disk gone) does
    not undo that, so the problem is returned for stop's document, never raised."""
    state = read_state(plan)  # only a state a start wrote
    if state is not None and not foreign_state(plan, state):  # another plan's (stale) state: not this stop's
        try:
            Path(plan["state_file"]).unlink(missing_ok=True)
        except OSError as exc:
            return (f"the server is stopped, but {plan['state_file']} could not be removed ({exc.strerror or exc}); "
                    "it names a server that no longer runs: remove it when the folder is writable")
    return None


def stopped(doc: dict, *problems: str | None) -> dict:
    """stop's document, with what it could not tidy up after the server was gone."""
    said = [p for p in problems if p]
    return {**doc, "warnings": said} if said else doc


def known_secrets(plan: dict) -> list[str]:
    """The values a server's answer must never echo into our output."""
    return [os.environ.get(src, "") for src in (plan.get("secrets") or {}).values()]


def require_api_key(plan: dict, verb: str) -> None:
    """A server started with an API key refuses every request without it: a shell that lacks the variable
    is named before anything is sent (verify would judge a healthy server failed, and clear its pass)."""
    key_env = plan.get("api_key_env")
    if key_env and not os.environ.get(key_env):
        raise ScriptError(f"the plan's server wants its API key, and {key_env} is not set in this shell",
                          f"export {key_env}=<key> (the one the server was started with), then {verb} again",
                          phase=verb)
    if key_env and not SECRET_VALUE.fullmatch(os.environ[key_env]):  # no header carries it: every request
        # would fail before it is sent, and verify would wait out its timeout calling a healthy server dead
        raise ScriptError(secret_unsendable(key_env), f"export {key_env} again with the key alone (the one the "
                          f"server was started with), then {verb} again", phase=verb)


def auth_headers(plan: dict) -> dict:
    key = os.environ.get(plan["api_key_env"]) if plan.get("api_key_env") else None
    return {"Authorization": f"Bearer {key}"} if key else {}


def port_in_use(port: int) -> bool:
    import validate
    return not validate.port_is_free(port)


def refuse_edited(plan: dict, fresh: dict, phase: str) -> None:
    """A plan runs only as its own inputs render it: an edited argv, env or binary is never executed."""
    from serve_plan import plan_differences
    diff = plan_differences(plan, fresh)
    if diff:
        raise ScriptError(f"the plan differs from what its own inputs render now ({', '.join(diff)}): it was "
                          "edited, or the environment changed since it was planned (HF_TOKEN, HF_HUB_OFFLINE, "
                          "the API key variable, the model folder)", "plan again in this shell and confirm "
                          "that plan: what the human approves is exactly what runs", phase=phase)


def cpus_not_here(plan: dict) -> str | None:
    """The plan's OMP bind, less the CPUs this process may run on: a plan made from another host's tree
    (a sysroot or a hand-unpacked capture) names CPUs this machine does not have. None when all are here."""
    import psutil
    try:
        bind = set(common.parse_cpulist(plan["sizing"]["vllm_cpu_omp_threads_bind"]))
    except ValueError:
        return plan["sizing"]["vllm_cpu_omp_threads_bind"]
    missing = bind - set(psutil.Process().cpu_affinity())
    return common.format_cpulist(missing) if missing else None


def start(plan: dict, confirm: bool, pull_policy: str = "missing", fresh: dict | None = None) -> dict:
    """Run what the plan says, once: under a lock in the state dir, refusing a plan whose command differs
    from a fresh rendering of its own inputs (`fresh`), a running server, a busy port, a missing secret."""
    if not confirm:
        raise ScriptError("start needs --confirm: the human must approve the plan first",
                          "show summary_markdown from the plan, wait for a clear go, then pass --confirm")
    if plan.get("deferred"):
        raise ScriptError(f"this plan is for {plan.get('target')}, not this machine: {', '.join(plan['deferred'])} "
                          "were assumed", "run the chain on that host itself (detect.py there reads it live), then "
                          "plan and start there", phase="start")
    if plan["path"] == "host":
        foreign = cpus_not_here(plan)
        if foreign:
            raise ScriptError(f"the plan binds CPUs {foreign} that this machine does not let us run on: it was sized "
                              f"for {plan.get('target')}", "run the chain on the machine that serves (detect.py "
                              "without --sysroot), then plan and start there", phase="start")
    if fresh is not None:
        refuse_edited(plan, fresh, "start")
    # the folder is checked again here: a plan names it, and a plan file is data anyone may have edited
    problem = state_dir_problem(Path(plan["state_dir"]))
    if problem:
        raise ScriptError(f"state dir {plan['state_dir']} {problem}: start writes its log and state there and "
                          "stop removes them", STATE_DIR_FIX, phase="start")
    try:
        Path(plan["state_dir"]).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ScriptError(f"cannot make the state dir {plan['state_dir']}: {exc.strerror or exc}", STATE_DIR_FIX,
                          phase="start")
    if up_in_progress(plan):
        raise ScriptError(f"an up in {plan['state_dir']} is running its steps: its plan.json, written next, "
                          "would not name the server this start launches", "wait for that up to finish (then "
                          "verify or stop with the plan.json it wrote), or plan this one with a state dir of its "
                          "own (--state-dir)", phase="start")
    with os.fdopen(open_own_file(Path(plan["state_dir"]) / ".lock", os.O_WRONLY | os.O_CREAT), "w") as lock:
        if not flock_within(lock.fileno(), LOCK_WAIT_S):
            raise ScriptError(f"another start, or a stop, for {plan['state_dir']} is running", "wait for it, then "
                              "verify (or start again if it was a stop)", phase="start")
        return _start_locked(plan, pull_policy)


# docker: 'Conflict. The container name "/N" is already in use by container "ID"'; podman: 'the container
# name "N" is already in use by ID': `run` refused to create ours
NAME_TAKEN = "is already in use"


def runtime_silent(plan: dict, verb: str, undone: str, keeps_files: bool = True) -> ScriptError:
    """The runtime did not say whether a container of the plan's name exists (down, slow, an answer of
    another shape): nothing is done by name then, since the name is one per port and may be another plan's."""
    return ScriptError(f"{plan['runtime']} did not say whether a container named {plan['container_name']} exists "
                       f"(inspect failed): {undone}", f"check the runtime ({plan['runtime']} info), then run {verb} "
                       "again" + ("; the state and secret files are kept" if keeps_files else ""), phase=verb)


def by_id(rm: list[str], container_id: str) -> list[str]:
    """The plan's `RT rm -f NAME`, narrowed to the one container the runtime named: by the time a removal by
    name runs, another plan's start on this port may have made the container of that name (a slow daemon
    held our `rm` while theirs ran), and `rm -f` would end their server."""
    return [*rm[:-1], container_id]


def container_gone(removal: common.RunResult) -> bool:
    """`RT rm -f NAME` removed it, or there was none: a runtime that did not answer leaves it maybe running."""
    return removal.ok or "no such container" in (removal.stderr or "").lower()


def unrecorded(plan: dict, exc: BaseException, what: str, undone: str) -> ScriptError:
    """start launched a server and no state names it (interrupted, or state.json could not be written):
    start has taken it down again, and says why in words a user acts on (not an internal error)."""
    if isinstance(exc, KeyboardInterrupt):
        return ScriptError(f"interrupted before the {what} was recorded: start {undone} it", "run start again",
                           phase="start", interrupted=True)
    reason = exc.error if isinstance(exc, ScriptError) else (
        f"{exc.strerror or exc}" if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}")
    return ScriptError(f"the {what} was launched, but its state could not be written to {plan['state_file']} "
                       f"({common.clip(reason, 300)}): start {undone} it", "free the state dir (disk space, "
                       "permissions, a file with other names), or plan with a fresh --state-dir; then start again",
                       phase="start")


def served_folder(plan: dict) -> dict:
    """What a state records of the local model folder served: the plan's, which start checked against the
    disk. A plan of an older bundle has no such field: then nothing is recorded, and the verbs render it
    with the folder on disk as before (a `null` recorded for it would read as "a Hub id" and make every
    verb refuse the plan, stop included)."""
    return {"model_dir": plan["model_dir"]} if "model_dir" in plan else {}


def _start_locked(plan: dict, pull_policy: str) -> dict:
    import stat
    for own in (plan["state_file"], plan["log_file"]):
        if os.path.lexists(own) and not stat.S_ISREG(os.lstat(own).st_mode):  # checked before anything runs
            raise ScriptError(f"{own} is not a regular file (a link, pipe, device or folder of that name)",
                              "remove it, or plan with a fresh --state-dir", phase="start")
        if os.path.lexists(own) and os.lstat(own).st_nlink > 1:  # writing it would change the other names' file
            raise ScriptError(f"{own} has other names (a hard link)", "remove it, or plan with a fresh --state-dir",
                              phase="start")
    state = read_state(plan)
    running = state_server(state) if state else None
    if running:  # whichever plan started it: a new state written over it would leave it named by nothing
        other = foreign_state(plan, state)
        if other is None:
            raise ScriptError(f"a server from this plan is already running ({running}; {plan['state_file']})",
                              "python3 scripts/launch.py stop --plan <plan.json> first", phase="start")
        raise ScriptError(f"a server of another plan ({other}) is already running from the state dir "
                          f"{plan['state_dir']} ({running})", "stop it with the plan that started it, or plan "
                          "this one with a state dir of its own (--state-dir)", phase="start")
    if port_in_use(plan["port"]):
        raise ScriptError(f"port {plan['port']} is already in use", "re-run validate.py (it picks a free port) "
                          "and plan again; with --network=host a busy port cannot be remapped", phase="start")
    secrets = secret_values(plan)
    warnings: list[str] = []
    if plan["path"] == "host":
        common.refuse_a_relative_hub_cache(dict(os.environ))  # the server reads the Hub from start's folder
        # unbuffered: the log tail a failed verify shows is the server's last words, not a stale buffer
        import secrets as tokens
        token = tokens.token_hex(16)
        env = server_env(dict(os.environ), plan["env"], secrets, token)
        program = common.find_program(plan["argv"][0], env)  # the pin program (numactl / taskset) or vllm
        if program is None:
            raise ScriptError(f"{plan['argv'][0]} is not in any absolute folder of PATH (the current folder is "
                              "never searched)", "install it (apt-get install numactl), or run start from a "
                              "shell whose PATH has /usr/bin", phase="start")
        import psutil
        proc, recorded = None, False
        try:
            with common.signals_deferred():  # launched and recorded as one step: no server without a state
                # a new log per start (an old run's lines prove nothing), never through a link
                with os.fdopen(open_own_file(plan["log_file"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as log:
                    proc = subprocess.Popen(plan["argv"], executable=program, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)
                state = {"path": "host", "port": plan["port"], "plan_id": plan_identity(plan),
                         "pid": proc.pid, "pgid": proc.pid,
                         "create_time": psutil.Process(proc.pid).create_time(), "marker": token,
                         "log_file": plan["log_file"], "started_at": time.time(), **served_folder(plan)}
                write_state(plan, state)
                recorded = True
        except BaseException as exc:
            if proc is None:
                if isinstance(exc, OSError):  # found and executable, yet not runnable (no #!, a bad interpreter)
                    raise ScriptError(f"cannot run {plan['argv'][0]} ({program}): {exc.strerror or exc}",
                                      "check that program (reinstall it), then start again", phase="start")
                raise
            if not recorded:  # launched, and no state names it (a full disk, a hard-linked file): not left running
                with common.signals_deferred():  # a second signal must not skip the kill
                    common.kill_group(proc)
                raise unrecorded(plan, exc, f"server (pid {proc.pid})", "stopped") from None
            if isinstance(exc, KeyboardInterrupt):  # held until both were done: it runs and its state names it
                raise ScriptError("interrupted, after the server was launched and recorded: it is running",
                                  "python3 scripts/launch.py verify --plan <plan.json> to use it, or "
                                  "python3 scripts/launch.py stop --plan <plan.json>", phase="start", pid=proc.pid,
                                  interrupted=True)
            raise
        finally:
            # handed over: the server outlives this script on purpose, and the state file is how we know it
            # now. Popen's finaliser would warn that its child still runs (a ResourceWarning, a traceback under
            # PYTHONWARNINGS=error); a returncode set here says it is not ours to wait for (a dead leader is
            # judged by its group, zombies included)
            if proc is not None:
                proc.returncode = 0
    else:
        rm, pull = plan["pre_argv"]
        found = inspect_container(common.runtime_of(plan), plan["container_name"])
        if found is None:  # nothing is removed by name that the runtime has not said is a leftover
            raise runtime_silent(plan, "start", "nothing was removed or started")
        if found and found["running"]:  # no state of ours names it (checked above): the name is one per port,
            # and another plan's container (its own state dir) may not have bound the port yet
            raise ScriptError(f"a container named {plan['container_name']} is running (id {found['id'][:12]}) that "
                              f"the state dir {plan['state_dir']} has no record of: another plan's on this port, or "
                              "one whose state was lost", "stop it with the plan that started it (or by hand: "
                              + shlex.join([*common.runtime_of(plan), "stop", plan["container_name"]])
                              + "), or plan this one on another port; then start again", phase="start")
        if found:  # an exited leftover of the name would block `run`, and then read as another plan's
            leftover = common.run(by_id(rm, found["id"]), timeout=60)
            if not container_gone(leftover):
                raise ScriptError(f"{plan['runtime']} could not remove the exited container {plan['container_name']} "
                                  f"({common.clip((leftover.stderr or leftover.failure or '').strip(), 200, tail=True)})",
                                  f"check the runtime ({plan['runtime']} info), then start again", phase="start")
        import validate
        if pull_policy == "always" or not validate.image_is_local(plan["runtime"], plan["image"], plan.get("engine")):
            common.log(f"start: pulling {plan['image']}")
            res = common.run(pull, timeout=PULL_TIMEOUT_S, progress=f"start: pulling {plan['image']}")
            if not res.ok:
                raise ScriptError(f"pull failed: {common.clip(res.stderr.strip() or res.failure or '', 300, tail=True)}",
                                  "check registry access and the image name (data/epyc.json, or --image)",
                                  phase="pull")
        launched, printed = False, ""
        try:
            if secrets:
                write_secret_files(Path(plan["state_dir"]) / "secrets", secrets)
            argv = plan["argv"]
            res = common.run(argv, timeout=RUN_TIMEOUT_S)
            if not res.ok and plan["runtime"] == "podman" and "cpuset" in res.stderr.lower():
                argv = [a for a in argv if not a.startswith(("--cpuset-cpus=", "--cpuset-mems="))]
                warnings.append("rootless podman rejected --cpuset-cpus/--cpuset-mems (no cpuset delegation): "
                                "started without them; thread binding still applies via VLLM_CPU_OMP_THREADS_BIND")
                refused = inspect_container(common.runtime_of(plan), plan["container_name"])
                if refused is None:  # the retry would meet a container it cannot tell from another plan's
                    raise runtime_silent(plan, "start", "after podman refused --cpuset-*, nothing was retried")
                if refused and not refused["running"]:  # podman leaves the refused run's container, created
                    common.run(by_id(rm, refused["id"]), timeout=60)
                res = common.run(argv, timeout=RUN_TIMEOUT_S)
            if not res.ok:
                raise ScriptError(f"{plan['runtime']} run failed: "
                                  f"{common.clip(res.stderr.strip() or res.failure or '', 400, tail=True)}",
                                  NO_RETRY_FIX, phase="start")
            launched = True
            printed = (res.stdout.strip().splitlines() or [""])[-1].strip()  # `run -d` prints the new id last
            if not CONTAINER_ID.fullmatch(printed):  # a runtime that printed something else: ask for the id
                printed = (inspect_container(common.runtime_of(plan), plan["container_name"]) or {}).get("id", "")
            if not CONTAINER_ID.fullmatch(printed):  # a state without it names no server: not left running unnamed
                raise ScriptError(f"{plan['runtime']} run printed no container id, and inspect named none: start "
                                  "removed the container", "check the runtime (" + plan["runtime"] + " info), then "
                                  "start again", phase="start", own_words=True)
            state = {"path": plan["path"], "port": plan["port"], "plan_id": plan_identity(plan), "runtime": plan["runtime"],
                     "engine": plan.get("engine"), "container_name": plan["container_name"],
                     "container_id": printed[:64], "started_at": time.time(), "argv": argv,
                     **served_folder(plan)}
            write_state(plan, state)
        except BaseException as exc:
            if not launched and isinstance(exc, ScriptError):  # `run` refused
                if NAME_TAKEN in exc.error.lower():
                    # another plan's container took the name since the check above (its start ran during our
                    # pull): ours was never created, and removing it by name would end their server
                    remove_secret_files(plan)
                    raise ScriptError(f"{plan['runtime']} run failed: another container took the name "
                                      f"{plan['container_name']} while this start ran (another plan's start on this "
                                      "port)", "stop it with the plan that started it, or plan this one on another "
                                      "port; then start again", phase="start") from None
                # a bad mount, cpuset or image: docker checks some of those before it takes the name, so a container
                # now of that name may be another plan's (made during our pull); only one that is not running can
                # be what our refused run left
                left = inspect_container(common.runtime_of(plan), plan["container_name"])
                if left is None or (left and left["running"]):
                    remove_secret_files(plan)
                    raise ScriptError(exc.error + (f"; a running container named {plan['container_name']} (id "
                                                   f"{left['id'][:12]}) is not this start's: left alone" if left else
                                                   f"; {plan['runtime']} did not say whether a container of its name "
                                                   "exists: nothing was removed"), exc.fix, phase="start") from None
                if not left:  # the refused run made nothing: nothing to remove (a late rm by name could end
                    remove_secret_files(plan)  # the server another plan's start makes meanwhile)
                    raise
                printed = left["id"]  # an exited one: what the refused run left, removed by its id below
            # no state names the container (`run` failed, was interrupted -- the engine may have started it
            # anyway -- or its state could not be written): removed by the id it was given, by name where
            # none is known (an interrupted `run`), with the key files it would read
            if CONTAINER_ID.fullmatch(printed):
                rm = by_id(rm, printed)
            with common.signals_deferred():
                removed = common.run(rm, timeout=60)
                remove_secret_files(plan)
            if not container_gone(removed):
                # it may run, and no state names it: say so, and how to take it down, never "removed"
                raise ScriptError(f"start launched {plan['container_name']} and could not record it, nor remove "
                                  f"it ({common.clip((removed.stderr or removed.failure or '').strip(), 200, tail=True)}"
                                  f"): it may be running", f"{shlex.join(rm)} once the runtime answers "
                                  f"({plan['runtime']} info)", phase="start",
                                  interrupted=isinstance(exc, KeyboardInterrupt)) from None
            if isinstance(exc, ScriptError) and (not launched or exc.extra.pop("own_words", False)):  # its own words
                raise
            raise unrecorded(plan, exc, f"container {plan['container_name']}", "removed") from None
    return {"started": True, **{k: v for k, v in state.items() if k != "marker"}, "warnings": warnings}


MODELS_SHOWN = 20
HTTP_BODY_LIMIT = 1 << 20  # an answer verify reads: a completion of 16 tokens, a model list, a health line


def http(method: str, url: str, timeout: float, headers: dict | None = None, body: dict | None = None):
    """(status, text) or (None, reason). `timeout` bounds the whole exchange: requests' own timeout is
    per read, so a server trickling its body a byte at a time would outlast any of them. The exchange
    runs in a daemon thread we stop waiting for; it goes when the script exits."""
    import requests
    box: dict = {}
    deadline_missed = f"no complete answer within {timeout:g}s"

    def exchange() -> None:
        try:
            session = requests.Session()
            # the server is on this machine: never through the shell's HTTP proxy (it would see the key,
            # and NO_PROXY=localhost does not cover 127.0.0.1), never with ~/.netrc credentials
            session.trust_env = False
            # and never where a redirect points: the server is on 127.0.0.1, its answer is what is judged
            with session.request(method, url, json=body, headers=headers or {}, timeout=timeout, stream=True,
                                 allow_redirects=False) as r:
                data = bytearray()
                for chunk in r.iter_content(65536):
                    data += chunk
                    if len(data) > HTTP_BODY_LIMIT:
                        box["result"] = (None, f"the answer is over {HTTP_BODY_LIMIT:,} bytes")
                        return
                box["result"] = (r.status_code, data.decode(r.encoding or "utf-8", errors="replace"))
        except requests.Timeout:  # requests' per-read timeout can beat the join below by a hair: one wording
            box["result"] = (None, deadline_missed)
        except requests.ConnectionError as exc:
            from urllib3.exceptions import ReadTimeoutError
            # a read timeout while the body streams reaches us as a ConnectionError wrapping urllib3's
            # ReadTimeoutError (iter_content re-raises it so): the same deadline, the same words
            late = bool(exc.args) and isinstance(exc.args[0], ReadTimeoutError)
            box["result"] = (None, deadline_missed if late else f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 -- a thread's exception would print a traceback; it is the answer here
            # whole: its caller masks and then shortens it (a cut made here could end inside the key a
            # server reflected in its status line, where no mask would know it any more)
            box["result"] = (None, f"{type(exc).__name__}: {exc}")

    worker = threading.Thread(target=exchange, daemon=True)
    worker.start()
    worker.join(timeout)
    return box.get("result", (None, deadline_missed))


def failed(plan: dict, phase: str, reason: str, t0: float, fix: str = NO_RETRY_FIX,
           state: dict | None = None) -> ScriptError:
    """A verify failure. Its reason may quote the server (ids, a status line): masked like any server text,
    since a server that reflects the Authorization header would otherwise get the key printed. `fix`: where
    the verdict is not the server's (the runtime or the state dir stood in the way), what to do instead of
    stopping there. `state`: the run judged, whose container's log is shown (not the name's)."""
    reason = redact(reason, known_secrets(plan), limit=2000)
    return ScriptError(f"FAILED in phase {phase}: {reason}", fix, ok=False, phase=phase,
                       elapsed_s=round(time.monotonic() - t0, 1), log_tail=log_tail(plan, state=state))


def time_since_start(state: dict) -> float | None:
    """Seconds from the server's launch (the state's wall clock, written by another process) to now. It is
    the server's start-up time when verify saw it turn healthy, and only a bound when it was healthy at
    verify's first look; a clock set back never makes it negative. None for a state without a usable time."""
    started = state.get("started_at")
    if isinstance(started, bool) or not isinstance(started, (int, float)) or not math.isfinite(started):
        return None
    return round(max(0.0, time.time() - started), 1)


def no_state_said(plan: dict) -> str:
    """Why own_state found nothing, in words: no state file, or one of another plan's run that has ended."""
    state = read_state(plan)
    other = foreign_state(plan, state) if state else None
    if other:
        return f"the state there is of another plan's ended run: {other}"
    # a state.json that no start wrote (edited, junk, a link) is there, and names no server
    return "its state.json names no server a start recorded" if os.path.lexists(plan["state_file"]) else "no state file"


ALIVE_ASKS = 3  # how often verify's last look asks a runtime that did not answer whether the container runs
VERIFY_LOCK_WAIT_S = 15.0  # a start or stop holding .lock longer is changing the server verify judged
LOCK_WAIT_S = 2.0  # start and stop: long enough for another verb's brief hold (verify writing its verdict)
RUN_KEYS = ("path", "pid", "pgid", "create_time", "marker", "container_id", "started_at")


def same_run(a: dict, b: dict) -> bool:
    """Two states record one launch of the server (its process group or container, and when)."""
    return all(a.get(k) == b.get(k) for k in RUN_KEYS)


def rewrite_state_of_run(plan: dict, judged: dict, new: dict, t0: float) -> None:
    """verify's writes of the state: under start's .lock, and only while state.json still records the run
    verify judged. A stop and a start while verify waited on the server would otherwise get their new state
    overwritten by the old one: the new server named by nothing (stop then leaves it running, and every start
    after refuses its port), or a stopped server recorded as verified."""
    def busy() -> ScriptError:
        return failed(plan, "process", f"a start or stop held the state dir for {VERIFY_LOCK_WAIT_S:g}s as verify "
                                       "went to record its verdict: the server it judged may be going", t0,
                      fix="run verify again once that start or stop is done", state=judged)
    with holding_the_start_lock(plan, busy=busy, wait_s=VERIFY_LOCK_WAIT_S):
        now = read_state(plan)
        if now is None or not same_run(now, judged):
            raise failed(plan, "process", "the server was stopped or started again while verify ran: this verdict "
                                          "is of a run state.json no longer records", t0,
                         fix="run verify again: it judges the server the state dir records now", state=judged)
        write_state(plan, new)


VERIFY_STOP_WAIT_S = 90.0  # a stop's graceful wait (STOP_GRACE_S) and its removal, with room


def ended_by_a_stop(plan: dict, judged: dict) -> bool:
    """The server verify watched went down because a stop (or a start) of this state dir took it down, not by
    itself: once whoever holds .lock is done, state.json records no run or another. A crash holds no lock,
    so it is told at once. Without this, a deliberate stop read as "exited before healthy: do not retry"."""
    def busy() -> ScriptError:
        return ScriptError("busy", "")
    try:
        with holding_the_start_lock(plan, busy=busy, wait_s=VERIFY_STOP_WAIT_S):
            now = read_state(plan)
    except ScriptError:  # a stop still going after the wait, or a state that cannot be read: not told apart
        return False
    return now is None or not same_run(now, judged)


def verify(plan: dict, timeout: float, smoke_timeout: float) -> dict:
    state = own_state(plan, "verify")
    t0 = time.monotonic()
    if state is None:
        raise failed(plan, "process", f"nothing was started from this plan ({no_state_said(plan)})", t0)
    require_api_key(plan, "verify")
    if "verified_at" in state:  # an earlier pass says nothing once this verify runs: handoff waits for its verdict
        state = {k: v for k, v in state.items() if k != "verified_at"}
        rewrite_state_of_run(plan, state, state, t0)
    base = f"http://127.0.0.1:{plan['port']}"
    headers = auth_headers(plan)
    last_note = 0.0
    healthy_after, polls = None, 0
    while healthy_after is None:
        elapsed = time.monotonic() - t0
        if alive(plan, state) is False:  # None (the runtime did not answer this poll): asked again on the next
            if ended_by_a_stop(plan, state):
                raise failed(plan, "process", "the server was stopped (or started again) while verify waited: "
                                              "state.json no longer records the run verify watched", t0,
                             fix="if you stopped it, nothing is wrong; else run verify again: it judges the server "
                                 "the state dir records now", state=state)
            raise failed(plan, "process", "the server process exited before it became healthy", t0)
        status, _ = http("GET", base + "/health", 5, headers)
        if status == 200:
            healthy_after = time_since_start(state)
            first_poll = polls == 0
            break
        polls += 1
        if elapsed > timeout:
            raise failed(plan, "health", f"not healthy after {timeout:g}s (last: {status or 'no answer'})", t0)
        if elapsed - last_note >= 10:
            common.log(f"verify: health: waiting ({elapsed:.0f}s elapsed, last {status or 'no answer'})")
            last_note = elapsed
        time.sleep(2)
    common.log(f"verify: healthy {healthy_after}s after start" + (" (already, at the first poll)" if first_poll else ""))
    status, text = http("GET", base + "/v1/models", 30, headers)
    try:
        ids = [m["id"] for m in json.loads(text)["data"]] if status == 200 else []
    except (ValueError, KeyError, TypeError, RecursionError):
        ids = []
    # what the server lists is its text: a server echoing the Authorization header gets it masked here too
    ids = [m if m == plan["served_model_name"] else redact(str(m), known_secrets(plan), 200) for m in ids]
    if status in (401, 403) and plan.get("api_key_env"):  # the server's key is not the one in this shell
        raise failed(plan, "auth", f"/v1/models with the key in ${plan['api_key_env']} answered HTTP {status}: "
                                   "the server was started with another key", t0,
                     fix=f"set {plan['api_key_env']} to the key the server was started with, then run verify again "
                         "(or stop it and start it with this key): the server itself may be fine")
    if plan["served_model_name"] not in ids:
        raise failed(plan, "models", f"/v1/models does not list {plan['served_model_name']!r} "
                                     f"(HTTP {status}, ids {ids})", t0)
    if plan.get("api_key_env"):  # a key was planned: a request without it must be refused
        status, _ = http("GET", base + "/v1/models", 30)
        if status != 401:
            raise failed(plan, "auth", f"/v1/models without the API key answered HTTP {status}, not 401: "
                                       "the server does not enforce its key", t0)
    # an endpoint the plan could not know (template unreadable) is settled here: chat first, then completions
    tried = []
    for endpoint in (("chat_completions", "completions") if plan["primary_endpoint"] == "unknown"
                     else (plan["primary_endpoint"],)):
        path, body = smoke_request(endpoint, plan["served_model_name"])
        s0 = time.monotonic()
        status, text = http("POST", base + path, smoke_timeout, headers, body)
        smoke_s = round(time.monotonic() - s0, 2)
        ok, detail = judge_smoke(status, text, endpoint, known_secrets(plan)) if status \
            else (False, redact(text, known_secrets(plan)))
        tried.append(f"{path}: {detail}")
        if ok:
            break
    if not ok:
        raise failed(plan, "smoke", "; ".join(tried), t0)
    if plan["primary_endpoint"] == "unknown":
        common.log(f"verify: the endpoint is {path} ({'; '.join(tried[:-1]) or 'first try'})")
    time.sleep(1)  # a server can answer and then die on that same request
    running = alive(plan, state)
    for _ in range(ALIVE_ASKS - 1):  # a pass needs the runtime's yes: whatever answers on the port is not proof
        if running is not None:
            break
        time.sleep(1)
        running = alive(plan, state)
    if running is None:
        raise failed(plan, "process", f"{plan['runtime']} did not say whether the container runs (inspect failed "
                                      f"{ALIVE_ASKS} times): verify passes only a server it saw running", t0,
                     fix=f"check the runtime ({plan['runtime']} info), then run verify again: the server may be fine",
                     state=state)
    if not running or http("GET", base + "/health", 5, headers)[0] != 200:
        raise failed(plan, "smoke", "the server died after its first request", t0)
    # handoff and bench read what verify settled and that it passed, on this run of the server
    rewrite_state_of_run(plan, state, {**state, "primary_endpoint": endpoint, "verified_at": time.time()}, t0)
    # a server may list thousands of ids (one listed 40,001): the served one and a few beside it say enough
    shown = [plan["served_model_name"], *[m for m in ids if m != plan["served_model_name"]][:MODELS_SHOWN - 1]]
    return {"ok": True, "phase": "done", "served_model_name": plan["served_model_name"], "models": shown,
            "models_listed": len(ids),
            "time_to_healthy_s": healthy_after, "healthy_at_first_poll": first_poll, "primary_endpoint": endpoint,
            "smoke": {"endpoint_path": path, "output": detail, "seconds": smoke_s},
            "base_url": plan["base_url"]}


def verified_state(plan: dict) -> dict:
    """The state of a server from this plan that is running and passed its last verify: the only one
    there is something true to hand off about (an endpoint that failed verify is not given to a user)."""
    state = own_state(plan, "handoff")
    fix = "python3 scripts/launch.py verify --plan <plan.json>; hand off after it passes"
    if state is None:
        raise ScriptError(f"no server from this plan is running ({no_state_said(plan)}: not started yet, or "
                          "stopped)",
                          "python3 scripts/launch.py start --plan <plan.json> --confirm, then verify")
    running = alive(plan, state)
    if running is None:
        raise runtime_silent(plan, "handoff", "nothing is handed off")
    if not running:
        raise ScriptError("the server from this plan is not running (it exited)",
                          "read its log (the plan's log_file), start it again (launch.py start), then verify")
    passed = state.get("verified_at")
    # verify writes a time: `true`, a negative number or one past this moment is not one it wrote
    if isinstance(passed, bool) or not isinstance(passed, (int, float)) or not 0 < passed <= time.time() + 60:
        raise ScriptError("the server from this plan has not passed verify (not run yet, running, or failed)", fix)
    # a pass is of the server as it was: its engine can have died since (vLLM's API process then lives on and
    # answers /health 503), and a verify that could not write its state could not clear the pass it found
    # without the key: vLLM's /health is outside its API key (only /v1 needs it), and a key this shell holds
    # wrongly (a newline in it) must not read as a server that is down
    status, text = http("GET", f"http://127.0.0.1:{plan['port']}/health", 5)
    if status != 200:
        said = f"HTTP {status}" if status else redact(text, known_secrets(plan), 200)
        raise ScriptError(f"the server from this plan passed verify but is not healthy now (/health: {said})",
                          "read its log (the plan's log_file); stop it, start it again, then verify")
    return state


def lock_held(path: Path) -> bool:
    """Another process holds that lock file (flock). Read-only and never created here (a check makes no
    files); no lock file, no such process ever ran here."""
    import fcntl
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def flock_within(fd: int, seconds: float) -> bool:
    """Take the exclusive lock on that open file, asking again for up to `seconds`: another verb's brief
    hold (verify writing its verdict) is waited out, a start's or stop's whole run is not."""
    import fcntl
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


def start_in_progress(plan: dict) -> bool:
    """A start holds the state dir's .lock from its checks until its state is written (and, on the container
    path, through a pull and `run`): a stop then would find no state and say "not running" while the
    server comes up, or remove a container that start is about to record."""
    return lock_held(Path(plan["state_dir"]) / ".lock")


UP_HOLDS: set[str] = set()  # the run dirs whose .up.lock this process holds: its own start is up's


def up_in_progress(plan: dict) -> bool:
    """Another process's `up` holds the folder (.up.lock) through its steps, start and verify: a start of
    another plan there would launch a server that up's plan.json, written next, no longer names."""
    return plan["state_dir"] not in UP_HOLDS and lock_held(Path(plan["state_dir"]) / ".up.lock")


@contextlib.contextmanager
def holding_the_start_lock(plan: dict, busy=None, wait_s: float = LOCK_WAIT_S):
    """stop holds .lock as start does, for its whole run: a start that came in while the server went down
    would write its state, and stop would then remove it (its server named by nothing). stop makes the lock
    file where none is yet (a first start could begin while it runs); on a read-only folder it makes none,
    and no start can write there either. No state dir at all: nothing to hold. `busy()` is the error when
    another holds it past `wait_s` (stop's own words by default)."""
    lock = Path(plan["state_dir"]) / ".lock"
    fd = None
    for flags in (os.O_RDONLY | os.O_CREAT, os.O_RDONLY):
        try:
            fd = os.open(lock, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
            break
        except OSError:
            continue
    try:
        if fd is not None:
            if not flock_within(fd, wait_s):
                if busy is not None:
                    raise busy() from None
                raise ScriptError(f"a start (or another stop) for {plan['state_dir']} is in progress: its server "
                                  "is not recorded yet", "wait for start to finish (or interrupt it: it takes down "
                                  "what it launched), then run stop again", phase="stop") from None
        yield
    finally:
        if fd is not None:
            os.close(fd)


def stop(plan: dict) -> dict:
    with holding_the_start_lock(plan):
        return _stop_locked(plan)


def _stop_locked(plan: dict) -> dict:
    state = own_state(plan, "stop")
    if plan["path"] != "host":
        rt = common.runtime_of(plan)
        found = inspect_container(rt, plan["container_name"])
        if found is None:  # stop and rm go by name: never on a container the runtime has not shown is ours
            raise runtime_silent(plan, "stop", "nothing was stopped or removed")
        if found and state is None:  # the name is one per port: another state dir's plan on this port started it
            raise ScriptError(f"a container named {plan['container_name']} exists ({'running' if found['running'] else 'exited'}, "
                              f"id {found['id'][:12]}) that the state dir {plan['state_dir']} has no record of: "
                              "another plan's on the same port (its own state dir), or one whose state was lost",
                              "stop it with the plan that started it; if it is this plan's, remove it by hand: "
                              + shlex.join([*rt, "stop", "-t", str(STOP_GRACE_S), plan["container_name"]]) + " && "
                              + shlex.join([*rt, "rm", plan["container_name"]]), phase="stop")
        if found and not started_here(state, found):  # ours is gone; the name is another start's now
            return stopped({"stopped": False, "reason": "not running", "container_name": plan["container_name"]},
                           f"the container named {plan['container_name']} now is another start's (id "
                           f"{found['id'][:12]}, not {str(state.get('container_id'))[:12]}): left alone",
                           remove_secret_files(plan), remove_state(plan))
        if not found:  # gone already: nothing is sent by name, which another start may take meanwhile
            return stopped({"stopped": False, "reason": "not running", "container_name": plan["container_name"]},
                           remove_secret_files(plan), remove_state(plan))
        # by the id judged above: the name may pass to another start's container meanwhile (ours exited, and
        # its start removed the leftover)
        graceful = common.run([*rt, "stop", "-t", str(STOP_GRACE_S), found["id"]], timeout=STOP_GRACE_S + 60)
        res = common.run([*rt, "rm", "-f", found["id"]], timeout=120)
        if not container_gone(res):  # the runtime is unreachable (daemon down, not in PATH): the container may
            # still run, so the state and the key files it reads stay until it is gone
            raise ScriptError(f"{plan['runtime']} could not remove {plan['container_name']}: "
                              f"{common.clip((res.stderr or res.failure or '').strip(), 300, tail=True)}",
                              f"check the runtime ({plan['runtime']} info), then run stop again; the state and "
                              "secret files are kept until the container is gone", phase="stop")
        if not graceful.ok and "no such container" in (graceful.stderr or "").lower():  # nothing to stop: never
            # started, or gone (`rm -f` of a missing container is quiet on a recent engine, `stop` is not)
            return stopped({"stopped": False, "reason": "not running", "container_name": plan["container_name"]},
                           remove_secret_files(plan), remove_state(plan))
        return stopped({"stopped": True, "container_name": plan["container_name"], "graceful": graceful.ok,
                        "detail": common.clip((res.stdout or res.stderr).strip(), 200)},
                       remove_secret_files(plan), remove_state(plan))
    group = group_members(state) if state else []
    if not group:
        left = orphaned_workers(state) if state else []  # not killed, and the only state naming them is kept
        if left:
            pids = [p.pid for p in left][:10]
            raise ScriptError(f"the server's leader is gone, and {len(left)} process(es) of its group "
                              f"{state['pgid']} remain that cannot be proven this run's (pids {pids})",
                              f"look at them (ps -o pid,args -g {state['pgid']}); if they are the server's, "
                              f"kill -- -{state['pgid']}, then run stop again (the state file is kept)", phase="stop")
        return stopped({"stopped": False, "reason": "not running"}, remove_state(plan))
    import psutil
    for proc in group:  # SIGTERM to our own group only (checked by pgid and start time), then wait
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, left = psutil.wait_procs(group, timeout=STOP_GRACE_S)
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=10)
    late: set[int] = set()
    for _ in range(50):  # the group is gone, not just the processes we knew of: one forked since the
        members = group_members(state)  # SIGTERM (a worker respawned on the way down) has had its grace
        if not members:
            break
        late |= {m.pid for m in members} - {m.pid for m in group}
        try:
            os.killpg(state["pgid"], signal.SIGKILL)  # ours: group_members found the run's marker in it
        except (ProcessLookupError, PermissionError):
            pass
        time.sleep(0.2)
    else:  # still there after 10 s of SIGKILL (a process stuck in the kernel, state D): not stopped
        stuck = [p.pid for p in group_members(state)]
        if stuck:
            raise ScriptError(f"the server's process group {state['pgid']} still has {len(stuck)} process(es) "
                              f"after SIGKILL (pids {stuck[:10]}; stuck in the kernel)", "look at them (ps -o "
                              "pid,stat,wchan -p PID), then run stop again; the state file is kept until they are "
                              "gone", phase="stop")
    return stopped({"stopped": True, "pid": state.get("pid"), "processes": len(group) + len(late),
                    "killed_after_timeout": len(left) + len(late)}, remove_state(plan))

