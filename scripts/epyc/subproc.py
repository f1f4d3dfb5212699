"""Subprocesses: argv lists with a timeout and bounded output, never a shell."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from epyc.errors import ScriptError, log
from epyc.jsonio import parse_json_object, schema_problem

STOP_GRACE_S = 30  # how long a server has to stop before it is killed
MARKER_ENV = "SERVING_LLMS_ON_EPYC_RUN"  # the run token in the environment of every server the bundle starts
PROGRESS_EVERY_S = 15.0
PROBE_OUTPUT_LIMIT = 16 << 20


@dataclass
class RunResult:
    argv: list[str]
    returncode: int | None  # None: could not start or timed out
    stdout: str
    stderr: str
    failure: str | None = None  # "not_found" | "timeout" | "os_error"

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def find_program(name: str, env: dict | None = None) -> str | None:
    """The file a bare program name runs, from PATH's absolute folders only (as Go's exec.LookPath): a
    `docker` in the current folder must not run instead of the approved one. -> None when there is none."""
    if "/" in name:
        return name
    for folder in (env if env is not None else os.environ).get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(folder, name)
        if os.path.isabs(folder) and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def run(
    argv: Sequence[str],
    timeout: float,
    env: dict | None = None,
    progress: str | None = None,
    stderr_through: bool = False,
    limit: int | None = None,
    engine_query: bool = False,
) -> RunResult:
    """Run argv (never through a shell) with a hard timeout; never raises for the usual failures. `progress`:
    a line on stderr every PROGRESS_EVERY_S; `limit`: bytes kept of each stream, the child stopped past it."""
    argv = [str(a) for a in argv]
    env = env if engine_query else run_env(argv, env)  # engine_query: which daemon does this shell name?
    program = find_program(argv[0], env)
    try:
        if program is None:
            raise FileNotFoundError(argv[0])
        # a session of its own: on timeout the whole group goes, not just argv[0] -- a grandchild that
        # kept our pipe open would otherwise make the read after the kill wait forever
        proc = subprocess.Popen(
            argv,
            executable=program,
            stdout=subprocess.PIPE,
            stderr=None if stderr_through else subprocess.PIPE,
            text=limit is None,
            errors="replace" if limit is None else None,
            env=env,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        return RunResult(argv, None, "", f"{argv[0]}: not found", "not_found")
    except OSError as exc:
        return RunResult(argv, None, "", str(exc), "os_error")
    if limit is not None:
        return _run_bounded(proc, argv, timeout, limit)
    t0 = time.monotonic()
    try:
        while True:
            left = timeout - (time.monotonic() - t0)
            try:
                out, err = proc.communicate(timeout=max(min(left, PROGRESS_EVERY_S) if progress else left, 0.01))
                return RunResult(argv, proc.returncode, out, err or "")
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - t0
                if elapsed >= timeout:
                    kill_group(proc)
                    out = ""
                    with contextlib.suppress(subprocess.TimeoutExpired):  # one that left our group holds the pipe
                        out, _ = proc.communicate(timeout=10)
                    return RunResult(argv, None, out or "", f"timed out after {timeout:g}s", "timeout")
                if progress:
                    log(f"{progress}: {elapsed:.0f}s elapsed")
    except BaseException:  # Ctrl-C no longer reaches a child in its own session: take it down with us
        kill_group(proc)
        raise


def _run_bounded(proc: subprocess.Popen, argv: list[str], timeout: float, limit: int) -> RunResult:
    """run() with `limit`: each pipe drained in chunks by a thread that stops keeping bytes past the limit."""
    kept: dict[str, bytearray] = {"out": bytearray(), "err": bytearray()}
    over = threading.Event()

    def drain(name: str, stream) -> None:
        while chunk := stream.read1(65536):
            kept[name] += chunk
            if len(kept[name]) > limit:
                over.set()
                return

    streams = {n: s for n, s in (("out", proc.stdout), ("err", proc.stderr)) if s is not None}
    readers = [threading.Thread(target=drain, args=(n, s), daemon=True) for n, s in streams.items()]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + timeout
    try:
        while any(r.is_alive() for r in readers) and not over.is_set() and time.monotonic() < deadline:
            time.sleep(0.02)
        failure = "output_limit" if over.is_set() else "timeout" if any(r.is_alive() for r in readers) else None
        if failure:
            kill_group(proc)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            failure = failure or "timeout"
    except BaseException:
        kill_group(proc)
        raise
    finally:  # close what the readers are done with (an unclosed pipe warns); a reader still blocked keeps its own
        for reader, stream in zip(readers, streams.values()):
            reader.join(timeout=1)
            if not reader.is_alive():
                stream.close()
    text = {n: bytes(b[:limit]).decode("utf-8", errors="replace") for n, b in kept.items()}
    why = {"output_limit": f"printed more than {limit:,} bytes", "timeout": f"timed out after {timeout:g}s"}
    return RunResult(argv, None if failure else proc.returncode, text["out"], why.get(failure, text["err"]), failure)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group `proc` leads (it was started with start_new_session) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def no_python_settings() -> dict:
    """This environment without PYTHON* variables, for another interpreter: a shell's PYTHONWARNINGS=error
    would fail it for a warning in its own code."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def run_probe(
    prefix: Sequence[str], code: str, marker: str, timeout: float, shape: dict | None = None
) -> tuple[dict | None, str]:
    """Run `python -c code` through prefix and read the JSON object it prints after `marker`, checked against
    `shape`. -> (doc, "") or (None, why)."""
    # the probe sees what the server will see (start passes no PYTHON* variable on)
    res = run([*prefix, "-c", code], timeout=timeout, limit=PROBE_OUTPUT_LIMIT, env=no_python_settings())
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith(marker)), None)
    if line is None:
        tail = (res.stderr or res.failure or "").strip().splitlines()[-1:]
        return None, tail[0] if tail else "no output"
    try:
        doc = parse_json_object(line[len(marker) :], "probe output", "")
    except ScriptError as exc:
        return None, f"malformed probe output ({exc.error[:120]}): {line[:200]}"
    problem = schema_problem(shape, doc, 200) if shape else None
    return (None, f"probe output {problem}") if problem else (doc, "")


def run_env(argv: list[str], env: dict | None) -> dict | None:
    """The environment of a command: a docker call that names no engine runs on the default socket, and
    podman on this machine's, whatever this shell exports."""
    source = os.environ if env is None else env
    if argv[:1] == ["podman"]:
        return {k: v for k, v in source.items() if k not in ("CONTAINER_HOST", "CONTAINER_CONNECTION")}
    docker_at = 2 if argv[:3] == ["sudo", "-n", "docker"] else 0  # sudo may keep DOCKER_HOST (env_keep)
    named = len(argv) > docker_at + 1 and argv[docker_at + 1].startswith("--host=")
    if argv[docker_at : docker_at + 1] != ["docker"] or named:
        return env
    return {**{k: v for k, v in source.items() if k != "DOCKER_HOST"}, "DOCKER_CONTEXT": "default"}
