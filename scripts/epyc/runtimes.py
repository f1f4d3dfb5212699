"""Container runtimes: which one, how it is called, and what it says about images."""

from __future__ import annotations

import os
import re

from . import masking, subproc
from .errors import ScriptError
from .masking import URL_CREDENTIALS, clip
from .subproc import run

CONTAINER_RUNTIMES = {"docker": ["docker"], "podman": ["podman"], "sudo docker": ["sudo", "-n", "docker"]}


# an address docker's --host takes for a daemon on this machine: printable ASCII without spaces; a unix
# socket by its absolute path (unix://rel.sock is resolved against the folder each command runs in)
DOCKER_ENGINE = re.compile(r"(unix:///|tcp://)[!-~]{1,1000}", re.ASCII)
LOOPBACK_ENGINE = re.compile(r"tcp://(127\.0\.0\.1|localhost|\[::1\])(:(?P<port>[0-9]{1,5}))?/?", re.ASCII)


def docker_engine_problem(engine: object) -> str | None:
    """Why a DOCKER_HOST value cannot be the engine of a plan, or None. Only a daemon on this machine: the
    plan's CPUs, memory node, port and cache are this machine's (detect.py read them here), and verify
    asks 127.0.0.1; a remote engine would run the server elsewhere, sized for the wrong host."""
    if isinstance(engine, str) and engine.startswith(("ssh://", "tcp://")):
        loopback = LOOPBACK_ENGINE.fullmatch(engine)
        if not loopback:
            return (
                "is another machine's docker: this plan is sized for this one (its CPUs, memory and port), "
                "and verify asks 127.0.0.1"
            )
        if loopback["port"] and not 1 <= int(loopback["port"]) <= 65535:
            return "names no port (1-65535)"
    if not isinstance(engine, str) or not DOCKER_ENGINE.fullmatch(engine):
        return "is not the address of a docker daemon on this machine (unix:///ABSOLUTE/PATH, tcp://127.0.0.1:PORT)"
    return None


def runtime_argv(runtime: str, engine: str | None = None) -> list[str]:
    """The argv prefix of a container runtime: one of the known engines, never free text run as a
    program. 'sudo docker' runs only when the user asked for it (validate.py --runtime "sudo docker"),
    and always as `sudo -n`: it never waits at a password prompt. `engine` is the docker daemon validate.py probed
    (this shell's DOCKER_HOST): named in the argv itself, so the command the human approves says which
    machine runs the server, and every later verb reaches that one whatever its own shell exports."""
    if runtime not in CONTAINER_RUNTIMES:
        raise ScriptError(
            f"unknown container runtime {runtime!r}",
            f"use one of: {', '.join(CONTAINER_RUNTIMES)} (validate.py picks it)",
        )
    if engine is None:
        return list(CONTAINER_RUNTIMES[runtime])
    problem = docker_engine_problem(engine) if runtime == "docker" else "is named only for plain docker"
    if problem:
        shown = URL_CREDENTIALS.sub(r"\1***@", engine) if isinstance(engine, str) else engine  # user:password@
        raise ScriptError(
            f"the docker engine {clip(repr(shown), 120)} (DOCKER_HOST, or the current docker context) {problem}",
            "unset DOCKER_HOST and use the default context (docker context use "
            "default) for the local socket, or export this machine's daemon address; then run "
            "validate.py and plan again; to serve on another machine, run the chain on it "
            "(detect.py --host user@box plans it from here)",
        )
    return [*CONTAINER_RUNTIMES[runtime], f"--host={engine}"]


def podman_remote_problem(timeout: float = 20) -> str | None:
    """Why this machine's `podman` would run a container elsewhere, or None. Its environment is cleared of
    CONTAINER_HOST/CONTAINER_CONNECTION (run_env), but a containers.conf with `[engine] remote = true` (or
    a podman-remote build, or a podman machine VM) still makes every call a remote one, which no flag
    overrides: podman itself says so as Host.ServiceIsRemote. A podman that does not answer is left to the
    call that follows (its own error says why)."""
    res = run(["podman", "info", "--format", "{{.Host.ServiceIsRemote}}"], timeout=timeout)
    if res.ok and res.stdout.strip().lower() == "true":
        return (
            "podman here is a remote client (containers.conf `[engine] remote = true`, podman-remote, or a "
            "podman machine VM): its containers run on another machine, not on the CPUs and memory this plan "
            "is sized for"
        )
    return None


def sudo_docker_context_problem(timeout: float = 20) -> str | None:
    """Why `sudo -n docker` would reach a daemon on another machine, or None. sudo resets the environment
    (and run_env drops DOCKER_HOST besides), but root's docker follows root's own current context (its
    ~/.docker/config.json), and a DOCKER_HOST that root's login environment sets (pam_env) shows as the
    default context's endpoint: the endpoint is judged as a plan's engine is. A plan names no engine for
    sudo docker, so every verb asks again. A CLI without contexts answers nothing here and uses the
    default socket."""
    shown = run(["sudo", "-n", "docker", "context", "show"], timeout=timeout)
    if not shown.ok:
        return None
    name = shown.stdout.strip()
    host = run(
        ["sudo", "-n", "docker", "context", "inspect", "--format", "{{.Endpoints.docker.Host}}"], timeout=timeout
    )
    endpoint = host.stdout.strip() if host.ok else ""
    problem = (
        docker_engine_problem(endpoint)
        if endpoint
        else None
        if name in ("", "default")
        else "could not be read (context inspect failed)"
    )
    if problem:
        said = URL_CREDENTIALS.sub(r"\1***@", endpoint)  # user:password@ in an address
        return (
            f"root's current docker context is {clip(repr(name), 80)}, whose daemon {clip(repr(said), 120)} "
            f"{problem}: `sudo docker` would run the server there, not on this machine"
        )
    return None


SUDO_DOCKER_CONTEXT_FIX = (
    "run `sudo docker context use default` (and drop any DOCKER_HOST from root's login "
    "environment), or use docker or the host path (validate.py --runtime)"
)


PODMAN_REMOTE_FIX = (
    "set `remote = false` under [engine] in containers.conf (or unset CONTAINERS_CONF), or use "
    "docker or the host path (validate.py --runtime docker|host); to serve on another machine, "
    "run the chain on it"
)


def remote_runtime_problem(runtime: str, timeout: float = 20) -> tuple[str, str] | None:
    """(why, fix) when this podman or sudo docker would run containers on another machine now, else None
    (plain docker names its engine in the argv; these two cannot)."""
    check, fix = {
        "podman": (podman_remote_problem, PODMAN_REMOTE_FIX),
        "sudo docker": (sudo_docker_context_problem, SUDO_DOCKER_CONTEXT_FIX),
    }.get(runtime, (None, ""))
    problem = check(timeout) if check else None
    return (problem, fix) if problem else None


_SEEN_LOCAL: set[str] = set()


def runtime_of(doc: dict) -> list[str]:
    """The runtime argv prefix a plan (or the state its start wrote) names: its runtime, on its engine. A
    podman or sudo docker that would reach another machine now (containers.conf, root's docker context:
    no flag in the argv overrides them) is refused for every verb, as a later shell's DOCKER_HOST is: a
    stop there would find nothing, say "not running" and drop the state of the server running here."""
    argv = runtime_argv(doc["runtime"], doc.get("engine"))
    if doc["runtime"] not in _SEEN_LOCAL:
        remote = remote_runtime_problem(doc["runtime"])
        if remote:
            raise ScriptError(
                remote[0],
                f"{remote[1]}; then run this command again (a plan made while it was "
                "remote: validate.py and plan again)",
            )
        _SEEN_LOCAL.add(doc["runtime"])
    return argv


def docker_engine(env: dict) -> str | None:
    """The docker daemon this shell's `docker` talks to when it is not the default: DOCKER_HOST, checked
    (an empty one is docker's default too). `sudo -n docker` drops the variable (sudo resets the
    environment), so it is asked only for plain docker."""
    value = env.get("DOCKER_HOST") or None
    if value is not None:
        runtime_argv("docker", value)  # refuses what cannot be named
    return value


def shell_docker_engine(timeout: float = 20) -> str | None:
    """The daemon this shell's `docker` reaches when it is not the default socket: DOCKER_HOST, else the
    endpoint of the current docker context when that is not `default` (DOCKER_CONTEXT, or `docker context
    use`). Read before anything is asked of docker (a remote one is refused unasked), and recorded: the
    plan names it as --host=, and a call that names none runs on the default socket (run_env)."""
    engine = docker_engine(dict(os.environ))
    if engine is not None:
        return engine
    shown = run(["docker", "context", "show"], timeout=timeout, engine_query=True)  # the shell's own context
    if not shown.ok or shown.stdout.strip() in ("", "default"):
        return None  # a CLI without contexts, or the default one: the default socket
    host = run(
        ["docker", "context", "inspect", "--format", "{{.Endpoints.docker.Host}}"], timeout=timeout, engine_query=True
    )
    address = host.stdout.strip() if host.ok else ""
    runtime_argv("docker", address)  # refused unless a daemon on this machine, named as DOCKER_HOST is
    return address


RUNTIME_TIMEOUT_S = 20


def choose_runtime(docker_ok: bool, podman_ok: bool, sudo_docker_ok: bool, host_ok: bool) -> str | None:
    """docker, then podman, then the host path ('host'); sudo docker only when it was asked for (and answers)."""
    for name, ok in (("docker", docker_ok), ("podman", podman_ok), ("sudo docker", sudo_docker_ok), ("host", host_ok)):
        if ok:
            return name
    return None


# ---------------------------------------------------------------- gathering (I/O)


def docker_answers(prefix: list[str]) -> tuple[bool, str]:
    res = subproc.run([*prefix, "info", "--format", "{{.ServerVersion}}"], timeout=RUNTIME_TIMEOUT_S)
    if res.ok:
        return True, f"{' '.join(prefix)} daemon {res.stdout.strip()}"
    return False, masking.clip((res.stderr.strip().splitlines() or [res.failure or "failed"])[-1], 200)


def podman_can_run() -> tuple[bool, str]:
    """podman counts only if it can start a container: run the host's own root as one, no image needed."""
    remote = remote_runtime_problem("podman", timeout=RUNTIME_TIMEOUT_S)
    if remote:
        return False, "; ".join(remote)
    res = subproc.run(["podman", "run", "--rm", "--network=none", "--rootfs", "/", "true"], timeout=60)
    if res.ok:
        return True, "podman runs containers"
    return False, masking.clip((res.stderr.strip().splitlines() or [res.failure or "failed"])[-1], 200)


def image_is_local(runtime: str, image: str, engine: str | None = None) -> bool:
    return subproc.run([*runtime_argv(runtime, engine), "image", "inspect", image], timeout=RUNTIME_TIMEOUT_S).ok


def probe_runtimes(want: str, engine: str | None) -> tuple[dict[str, bool], dict[str, str]]:
    """Which container runtimes answer, in the documented order; each probe has a timeout. docker is
    asked on the engine this shell names (read first: a remote one is refused before it is reached)."""
    ok = {"docker": False, "podman": False, "sudo docker": False}
    detail: dict[str, str] = {}
    if want in ("auto", "docker"):
        ok["docker"], detail["docker"] = docker_answers(runtime_argv("docker", engine))
    if want in ("auto", "podman") and not ok["docker"]:
        ok["podman"], detail["podman"] = podman_can_run()
    if want == "sudo docker":  # only when the user asked for it: validate never reaches for sudo on its own
        remote = remote_runtime_problem("sudo docker", timeout=RUNTIME_TIMEOUT_S)
        ok["sudo docker"], detail["sudo docker"] = (
            (False, "; ".join(remote)) if remote else docker_answers(["sudo", "-n", "docker"])
        )
    return ok, detail


def host_runtime_ok(host_stack: dict, stock: bool) -> bool:
    """A host env counts when vLLM imports in it, with zentorch for the zentorch path."""
    return not host_stack.get("import_error") and bool(host_stack.get("zentorch") or stock)
