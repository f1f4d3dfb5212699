"""Proof that zentorch kernels ran: count matmuls per op and kernel in a server log."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from epyc import bundle, jsonio, masking, subproc
from epyc.deployments import planfile, serve_procs, serve_state
from epyc.errors import ScriptError
from epyc.facts import runtimes

# zendnnl's own record of a matmul (ZENDNNL_API_LOG_LEVEL=4) at the start of a line, "[API    ][info   ][0.02]:LOWOHA
# matmul_direct: M=…, plugin_op=…, kernel=…": only that counts, as a client can put any text in other loggers' lines
ZEN_LINE = re.compile(
    r"(?:\([^)\n]{0,80}\)\s*)?\[[A-Z]+\s*\]\[[a-z]+\s*\]\[[^\]\n]{0,40}\]:?\s*"
    r"LOWOHA matmul_direct: M=\d+.*?plugin_op=(?P<op>[^,\s]+).*?kernel=(?P<kernel>[^,\s]+)"
)
# an HTTP access record (uvicorn's: `"GET /path HTTP/1.1" 404`): a client's words, never a kernel's
ACCESS_LINE = re.compile(r'"[A-Z]{3,8} \S* HTTP/[0-9.]{1,3}" [0-9]{3}')
ONEDNN_EXEC = re.compile(r"onednn_verbose,(?:[^,]*,)*?exec,cpu,(?P<prim>[^,]+),(?P<impl>[^,]+),")
FALLBACK = re.compile(r"fall(?:ing)?\s*back|fallback", re.I)
# a kernel line is a few hundred characters: its head is all the patterns scan, and all that is held
LINE_MATCH_CHARS = 4096
LINE_READ_CHARS = 1 << 16
# past MAX_NAMES distinct names (a real log has a dozen) a new one counts under OTHER; each is shown on NAME_CHARS
MAX_NAMES = 200
NAME_CHARS = 200
SHOWN_LINE_CHARS = 300
OTHER = "(other)"
LOGS_TIMEOUT_S = 120
LOG_FIX = "pass the server log (launch.py writes it to the plan's log_file)"


def _tally(counter: Counter, name: str) -> None:
    counter[name if name in counter or len(counter) < MAX_NAMES else OTHER] += 1


def shown_names(counts: Counter) -> dict:
    """A tally as printed: each name cut to NAME_CHARS (names equal after it add up; masked whole before)."""
    out: Counter = Counter()
    for name, n in counts.most_common():
        out[name[:NAME_CHARS]] += n
    return dict(out.most_common())


def line_heads(stream: IO[str], secrets: list[str]) -> Iterator[str]:
    """Each line of a text stream with its secrets masked, at most LINE_READ_CHARS long. A longer line's rest is
    dropped and its masked head loses as many characters as the longest secret has (a cut may end inside one)."""
    forms = masking.secret_forms(secrets)  # once, not per line
    reach = max(map(len, forms), default=0)
    while piece := stream.readline(LINE_READ_CHARS):
        if len(piece) < LINE_READ_CHARS or piece.endswith("\n"):
            yield masking.mask_server_text(piece, forms)
            continue
        while (rest := stream.readline(LINE_READ_CHARS)) and not rest.endswith("\n"):
            pass
        masked = masking.mask_server_text(piece, forms)
        yield masked[: max(0, len(masked) - reach)] + "\n"


def count_kernels(lines: Iterable[str]) -> dict:
    """Tally zentorch matmuls (per plugin_op, per kernel), oneDNN primitives and fallback mentions, as shown."""
    by_op, by_kernel, onednn = Counter(), Counter(), Counter()
    fallbacks: list[str] = []
    sample = None
    for line in lines:
        line = line[:LINE_MATCH_CHARS]
        if ACCESS_LINE.search(line):
            continue
        if m := ZEN_LINE.match(line):  # at the line's start: zendnnl's logger, not a message that quotes it
            _tally(by_op, m.group("op"))
            _tally(by_kernel, m.group("kernel"))
            sample = sample or line.strip()[:SHOWN_LINE_CHARS]
        elif m := ONEDNN_EXEC.search(line):
            _tally(onednn, f"{m.group('prim')}:{m.group('impl')}")
        elif FALLBACK.search(line) and len(fallbacks) < 20:
            fallbacks.append(line.strip()[:SHOWN_LINE_CHARS])
    total = sum(by_op.values())
    return {
        "zentorch_matmuls": total,
        "by_plugin_op": shown_names(by_op),
        "by_kernel": shown_names(by_kernel),
        "onednn_primitives": shown_names(onednn),
        "onednn_exec_count": sum(onednn.values()),
        "fallback_lines": fallbacks,
        "fallback_count": len(fallbacks),
        "sample": sample,
        "verdict": "zentorch kernels executed" if total else "no zentorch matmul in the log",
    }


def log_lines(args: argparse.Namespace) -> tuple[Iterable[str], str, str | None]:
    """The log's lines, masked and streamed (a log runs to gigabytes), where they came from, the plan's backend."""
    # without a plan the API key's variable is unknown: every value under a secret-looking name is masked
    secrets = masking.secret_values()
    if args.log:  # any file the user names
        path = Path(args.log)
        jsonio.require_regular_file(path, "server log", LOG_FIX)
        return file_lines(path, secrets, own=False), str(path), None
    plan = planfile.read_plan(args.plan, "kernel_proof", bundle.load_epyc())  # as launch.py's verbs read a plan
    secrets += serve_state.known_secrets(plan)
    state = serve_state.read_state(plan)
    # another plan's log (and container): no proof for this one
    if state and (other := serve_procs.foreign_state(plan, state)):
        raise ScriptError(
            f"the state dir {plan['state_dir']} holds the run of another plan ({other}): its log proves nothing "
            "about this plan's server",
            "run kernel_proof.py with the plan that started it, or give this plan a state dir of its own "
            "(plan --state-dir)",
        )
    if plan["path"] != "host":
        return (*container_log(plan, state, args.plan, secrets), plan.get("backend"))
    path = Path(plan["log_file"])
    if not os.path.lexists(path):
        raise ScriptError(
            f"no server log at {path}: the plan's server has not been started",
            f"start it first: python3 scripts/launch.py start --plan {shlex.quote(args.plan)}",
        )
    return file_lines(path, secrets, own=True), str(path), plan.get("backend")


def file_lines(path: Path, secrets: list[str], own: bool) -> Iterator[str]:
    """A log file's lines, masked; the plan's own log (`own`) never read through a link planted in its place."""
    try:
        source = jsonio.open_own_file(path, os.O_RDONLY, phase="kernel_proof") if own else path
        with open(source, encoding="utf-8", errors="replace") as f:
            yield from line_heads(f, secrets)
    except OSError as exc:
        raise ScriptError(f"cannot read {path}: {exc.strerror or exc}", LOG_FIX)


def container_log(plan: dict, state: dict | None, plan_file: str, secrets: list[str]) -> tuple[Iterator[str], str]:
    """The lines of the container this plan's start recorded, and where they came from."""
    found = serve_procs.inspect_container(runtimes.runtime_of(plan), plan["container_name"])
    if found is None:  # nothing is read by name that the runtime has not said is this plan's
        raise serve_procs.runtime_silent(plan, "kernel_proof", "no log was read", keeps_files=False)
    if not found:
        raise ScriptError(
            f"no container named {plan['container_name']}: the plan's server is not running "
            "(never started, or stopped)",
            f"start it first: python3 scripts/launch.py start --plan {shlex.quote(plan_file)} --confirm",
        )
    if state is None or not serve_procs.started_here(state, found):  # the name is one per port
        raise ScriptError(
            f"the container named {plan['container_name']} (id {found['id'][:12]}) is not the one this plan's start "
            "recorded (another plan's on this port, or one whose state was lost): its log proves nothing about this "
            "plan's server",
            "run kernel_proof.py with the plan that started it",
        )
    # by the id judged above: the name may pass to another plan's container before `logs` runs
    argv = [*runtimes.runtime_of(plan), "logs", found["id"]]
    return container_log_lines(argv, secrets), f"{plan['runtime']} logs {found['id'][:12]} ({plan['container_name']})"


def container_log_lines(argv: list[str], secrets: list[str]) -> Iterator[str]:
    """`docker logs ID`, streamed line by line as the host log is read, within LOGS_TIMEOUT_S for the whole read."""
    fix = "is the container still there? (launch.py stop removes it)"
    program = subproc.find_program(argv[0])
    if program is None:
        raise ScriptError(f"cannot read the container's log: {argv[0]} is not in PATH", fix)
    proc = subprocess.Popen(
        argv,
        executable=program,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        encoding="utf-8",
        errors="replace",
        env=subproc.run_env(argv, None),  # the plan's engine, never the shell's
    )
    timer = threading.Timer(LOGS_TIMEOUT_S, subproc.kill_group, args=(proc,))
    timer.daemon = True
    timer.start()
    last = ""
    try:
        with proc.stdout as out:
            for line in line_heads(out, secrets):
                last = line
                yield line
        try:
            code = proc.wait(timeout=10)
            failure = f"exited {code}" if code else None
        except subprocess.TimeoutExpired:  # its output ended, the process did not: killed below
            failure = "did not exit after its output ended"
    finally:
        timer.cancel()
        subproc.kill_group(proc)
    if failure:
        raise ScriptError(
            f"cannot read the container's log ({argv[0]} logs {failure}): {masking.clip(last.strip(), 200)}", fix
        )
