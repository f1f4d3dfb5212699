"""Container runtimes: which one, how it is called, and what it says about images."""

from __future__ import annotations

import os
import re

from epyc import masking, subproc
from epyc.errors import ScriptError

CONTAINER_RUNTIMES = {"docker": ["docker"], "podman": ["podman"], "sudo docker": ["sudo", "-n", "docker"]}
RUNTIME_TIMEOUT_S = 20
# docker --host for a daemon on this machine: printable ASCII, a unix socket by its absolute path (a relative one moves)
DOCKER_ENGINE = re.compile(r"(unix:///|tcp://)[!-~]{1,1000}", re.ASCII)
LOOPBACK_ENGINE = re.compile(r"tcp://(127\.0\.0\.1|localhost|\[::1\])(:(?P<port>[0-9]{1,5}))?/?", re.ASCII)


def docker_engine_problem(engine: object) -> str | None:
    """Why a DOCKER_HOST value cannot be a plan's engine, or None: only a daemon on this machine, as the plan is sized
    for this machine's CPUs, memory, port and cache, and verify asks 127.0.0.1."""
    if isinstance(engine, str) and engine.startswith(("ssh://", "tcp://")):
        loopback = LOOPBACK_ENGINE.fullmatch(engine)
        if not loopback:
            return "is another machine's docker: this plan is sized for this one (its CPUs, memory and port), and verify asks 127.0.0.1"
        if loopback["port"] and not 1 <= int(loopback["port"]) <= 65535:
            return "names no port (1-65535)"
    if not isinstance(engine, str) or not DOCKER_ENGINE.fullmatch(engine):
        return "is not the address of a docker daemon on this machine (unix:///ABSOLUTE/PATH, tcp://127.0.0.1:PORT)"
    return None


def runtime_argv(runtime: str, engine: str | None = None) -> list[str]:
    """The argv prefix of a known container runtime, never free text: 'sudo docker' only when the user asked,
    as `sudo -n`; `engine` (the docker daemon validate probed) named in the argv, so every verb reaches it."""
    if runtime not in CONTAINER_RUNTIMES:
        raise ScriptError(
            f"unknown container runtime {runtime!r}",
            f"use one of: {', '.join(CONTAINER_RUNTIMES)} (validate.py picks it)",
        )
    if engine is None:
        return list(CONTAINER_RUNTIMES[runtime])
    problem = docker_engine_problem(engine) if runtime == "docker" else "is named only for plain docker"
    if problem:
        shown = masking.URL_CREDENTIALS.sub(r"\1***@", engine) if isinstance(engine, str) else engine  # user:password@
        raise ScriptError(
            f"the docker engine {masking.clip(repr(shown), 120)} (DOCKER_HOST, or the current docker context) {problem}",
            "unset DOCKER_HOST and use the default context (docker context use default) for the local socket, or export this machine's daemon address; then run validate.py and plan again; to serve on another machine, run the chain on it (detect.py --host user@box plans it from here)",
        )
    return [*CONTAINER_RUNTIMES[runtime], f"--host={engine}"]


def runtime_of(doc: dict) -> list[str]:
    """The runtime argv prefix a plan (or the state its start wrote) names: its runtime, on its engine."""
    return runtime_argv(doc["runtime"], doc.get("engine"))


def shell_docker_engine() -> str | None:
    """The daemon this shell's plain `docker` reaches when not the default socket (a non-empty DOCKER_HOST, else a
    non-default context's endpoint), refused unless on this machine; `sudo -n docker` resets the environment."""
    engine = os.environ.get("DOCKER_HOST") or None
    if engine is None:
        # engine_query: the shell's own context, which every other docker call is kept from (run_env)
        shown = subproc.run(["docker", "context", "show"], timeout=RUNTIME_TIMEOUT_S, engine_query=True)
        if not shown.ok or shown.stdout.strip() in ("", "default"):
            return None  # a CLI without contexts, or the default one: the default socket
        argv = ["docker", "context", "inspect", "--format", "{{.Endpoints.docker.Host}}"]
        host = subproc.run(argv, timeout=RUNTIME_TIMEOUT_S, engine_query=True)
        engine = host.stdout.strip() if host.ok else ""
    runtime_argv("docker", engine)
    return engine


def choose_runtime(docker_ok: bool, podman_ok: bool, sudo_docker_ok: bool, host_ok: bool) -> str | None:
    """docker, then podman, then the host path ('host'); sudo docker only when it was asked for (and answers)."""
    found = (("docker", docker_ok), ("podman", podman_ok), ("sudo docker", sudo_docker_ok), ("host", host_ok))
    return next((name for name, ok in found if ok), None)


def last_words(res: subproc.RunResult) -> str:
    return masking.clip((res.stderr.strip().splitlines() or [res.failure or "failed"])[-1], 200)


def docker_answers(prefix: list[str]) -> tuple[bool, str]:
    res = subproc.run([*prefix, "info", "--format", "{{.ServerVersion}}"], timeout=RUNTIME_TIMEOUT_S)
    return res.ok, f"{' '.join(prefix)} daemon {res.stdout.strip()}" if res.ok else last_words(res)


def image_is_local(runtime: str, image: str, engine: str | None = None) -> bool:
    return subproc.run([*runtime_argv(runtime, engine), "image", "inspect", image], timeout=RUNTIME_TIMEOUT_S).ok


def probe_runtimes(want: str, engine: str | None) -> tuple[dict[str, bool], dict[str, str]]:
    """Which container runtimes answer, in the documented order, each probe with a timeout; docker on `engine`."""
    ok = dict.fromkeys(CONTAINER_RUNTIMES, False)
    detail: dict[str, str] = {}
    if want in ("auto", "docker"):
        ok["docker"], detail["docker"] = docker_answers(runtime_argv("docker", engine))
    if want in ("auto", "podman") and not ok["docker"]:
        # podman counts only if it can start a container: the host's own root as one, no image needed
        res = subproc.run(["podman", "run", "--rm", "--network=none", "--rootfs", "/", "true"], timeout=60)
        ok["podman"], detail["podman"] = res.ok, "podman runs containers" if res.ok else last_words(res)
    if want == "sudo docker":  # only when the user asked for it: validate never reaches for sudo on its own
        ok["sudo docker"], detail["sudo docker"] = docker_answers(["sudo", "-n", "docker"])
    return ok, detail


def host_runtime_ok(host_stack: dict, stock: bool) -> bool:
    """A host env counts when vLLM imports in it, with zentorch for the zentorch path."""
    return not host_stack.get("import_error") and bool(host_stack.get("zentorch") or stock)
