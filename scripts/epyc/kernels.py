"""Proof that zentorch kernels ran: count matmuls per op and kernel in a server log."""

from __future__ import annotations

import argparse
import io
import os
import re
import shlex
import subprocess
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from . import bundle, jsonio, masking, runtimes, subproc
from .errors import ScriptError
from .masking import mask_server_text
from .planfile import read_plan
from .serve_procs import foreign_state, inspect_container, started_here
from .serve_start import runtime_silent
from .serve_state import known_secrets, open_own_file, read_state

# zendnnl's own record of a matmul (ZENDNNL_API_LOG_LEVEL=4), written by its logger at the start of a line:
# "[API    ][info   ][0.023305]:LOWOHA matmul_direct: M=…, plugin_op=…, kernel=…". Only that counts: the text
# after it is what any client can put in the log (a request for /plugin_op=…,kernel=… is written there by the
# access log, a model name in an error line by vLLM's own logger, whose lines start with its own prefix)
ZEN_LINE = re.compile(
    r"(?:\([^)\n]{0,80}\)\s*)?\[[A-Z]+\s*\]\[[a-z]+\s*\]\[[^\]\n]{0,40}\]:?\s*"
    r"LOWOHA matmul_direct: M=\d+.*?plugin_op=(?P<op>[^,\s]+).*?kernel=(?P<kernel>[^,\s]+)"
)
# an HTTP access record (uvicorn's: `"GET /path HTTP/1.1" 404`): a client's words, never a kernel's
ACCESS_LINE = re.compile(r'"[A-Z]{3,8} \S* HTTP/[0-9.]{1,3}" [0-9]{3}')
ONEDNN_EXEC = re.compile(r"onednn_verbose,(?:[^,]*,)*?exec,cpu,(?P<prim>[^,]+),(?P<impl>[^,]+),")
FALLBACK = re.compile(r"fall(?:ing)?\s*back|fallback", re.I)
# A kernel log line is a few hundred characters; the patterns scan on from each `plugin_op=`, so a line is
# matched on its head alone and only that much of it is held (line_heads drops a longer line's rest).
LINE_MATCH_CHARS = 4096
LINE_READ_CHARS = 1 << 16
# A real log names a dozen ops and kernels. A log of a million distinct names would carry each into the
# JSON: past MAX_NAMES a new name counts under OTHER, and a name is shown on its first NAME_CHARS.
MAX_NAMES = 200
NAME_CHARS = 200
SHOWN_LINE_CHARS = 300
OTHER = "(other)"
LOGS_TIMEOUT_S = 120


def _tally(counter: Counter, name: str) -> None:
    counter[name if name in counter or len(counter) < MAX_NAMES else OTHER] += 1


def shown_names(counts: dict) -> dict:
    """A tally as printed: each name cut to NAME_CHARS (two names equal after it add up). The names come
    from lines line_heads masked whole, so a cut here cannot leave part of a secret."""
    out: Counter = Counter()
    for name, n in counts.items():
        out[name[:NAME_CHARS]] += n
    return dict(out.most_common())


def line_heads(stream: IO[str], secrets: list[str]) -> Iterator[str]:
    """Each line of a text stream with its secrets masked, at most LINE_READ_CHARS long. A longer line's rest
    is dropped (a piece could start inside a secret), and its kept head loses as many characters as the
    longest secret has, after it is masked."""
    forms = masking.secret_forms(secrets)  # once, not per line
    reach = max(map(len, forms), default=0)
    while piece := stream.readline(LINE_READ_CHARS):
        if len(piece) < LINE_READ_CHARS or piece.endswith("\n"):
            yield mask_server_text(piece, forms)
            continue
        while (rest := stream.readline(LINE_READ_CHARS)) and not rest.endswith("\n"):
            pass
        masked = mask_server_text(piece, forms)
        yield masked[: max(0, len(masked) - reach)] + "\n"


def count_kernels(lines: Iterable[str]) -> dict:
    """Tally zentorch matmuls (per plugin_op, per kernel), oneDNN primitives and fallback mentions."""
    by_op: Counter = Counter()
    by_kernel: Counter = Counter()
    onednn: Counter = Counter()
    fallbacks: list[str] = []
    sample = None
    for line in lines:
        line = line[:LINE_MATCH_CHARS]
        if ACCESS_LINE.search(line):
            continue
        m = ZEN_LINE.match(line)  # at the line's start: zendnnl's logger, not a message that quotes it
        if m:
            _tally(by_op, m.group("op"))
            _tally(by_kernel, m.group("kernel"))
            sample = sample or line.strip()
            continue
        m = ONEDNN_EXEC.search(line)
        if m:
            _tally(onednn, f"{m.group('prim')}:{m.group('impl')}")
        elif FALLBACK.search(line) and len(fallbacks) < 20:
            fallbacks.append(line.strip())
    total = sum(by_op.values())
    return {
        "zentorch_matmuls": total,
        "by_plugin_op": dict(by_op.most_common()),
        "by_kernel": dict(by_kernel.most_common()),
        "onednn_primitives": dict(onednn.most_common()),
        "onednn_exec_count": sum(onednn.values()),
        "fallback_lines": fallbacks,
        "fallback_count": len(fallbacks),
        "sample": sample,
        "verdict": "zentorch kernels executed" if total else "no zentorch matmul in the log",
    }


def log_lines(args: argparse.Namespace) -> tuple[Iterable[str], str]:
    """The log's lines, masked (streamed: a kernel log runs to gigabytes), and where they came from."""
    fix = "pass the server log (launch.py writes it to the plan's log_file)"
    # without a plan the API key's variable is unknown: mask every value this shell holds under a
    # secret-looking name (…KEY, …TOKEN, …SECRET, …PASSWORD), not only the two well-known ones
    secrets = masking.secret_values()
    if args.log:  # any file the user names
        path = Path(args.log)
        jsonio.require_regular_file(path, "server log", fix)
        opener = lambda: open(path, encoding="utf-8", errors="replace")  # noqa: E731
    else:
        plan = read_plan(args.plan, "kernel_proof", bundle.load_epyc())  # as launch.py's verbs read a plan
        secrets += known_secrets(plan)
        state = read_state(plan)
        other = foreign_state(plan, state) if state else None
        if other:  # the log (and the container) there are another plan's run: no proof for this one
            raise ScriptError(
                f"the state dir {plan['state_dir']} holds the run of another plan ({other}): its "
                "log proves nothing about this plan's server",
                "run kernel_proof.py with the plan "
                "that started it, or give this plan a state dir of its own (plan --state-dir)",
            )
        if plan["path"] != "host":
            found = inspect_container(runtimes.runtime_of(plan), plan["container_name"])
            if found is None:  # nothing is read by name that the runtime has not said is this plan's
                raise runtime_silent(plan, "kernel_proof", "no log was read", keeps_files=False)
            if not found:
                raise ScriptError(
                    f"no container named {plan['container_name']}: the plan's server is not running "
                    "(never started, or stopped)",
                    f"start it first: python3 scripts/launch.py start --plan {shlex.quote(args.plan)} --confirm",
                )
            if state is None or not started_here(state, found):  # the name is one per port
                raise ScriptError(
                    f"the container named {plan['container_name']} (id {found['id'][:12]}) is not the one "
                    "this plan's start recorded (another plan's on this port, or one whose state was "
                    "lost): its log proves nothing about this plan's server",
                    "run kernel_proof.py with the plan that started it",
                )
            # by the id judged above: the name may pass to another plan's container before `logs` runs
            argv = [*runtimes.runtime_of(plan), "logs", found["id"]]
            return (
                container_log_lines(argv, secrets),
                f"{plan['runtime']} logs {found['id'][:12]} ({plan['container_name']})",
                plan.get("backend"),
            )
        # the log start wrote, never a link planted in its place: another file's lines are no proof
        path = Path(plan["log_file"])
        if not os.path.lexists(path):
            raise ScriptError(
                f"no server log at {path}: the plan's server has not been started",
                f"start it first: python3 scripts/launch.py start --plan {shlex.quote(args.plan)}",
            )

        def opener():
            return os.fdopen(open_own_file(path, os.O_RDONLY, phase="kernel_proof"), encoding="utf-8", errors="replace")

    def lines():
        try:
            with opener() as f:
                yield from line_heads(f, secrets)
        except OSError as exc:
            raise ScriptError(f"cannot read {path}: {exc.strerror or exc}", fix)

    return lines(), str(path), None if args.log else plan.get("backend")


def container_log_lines(argv: list[str], secrets: list[str]) -> Iterator[str]:
    """`docker logs NAME`, streamed line by line as the host log is read (a kernel log runs to gigabytes),
    within LOGS_TIMEOUT_S for the whole read."""
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
        env=subproc.run_env(argv, None),
    )  # the plan's engine, never the shell's
    timer = threading.Timer(LOGS_TIMEOUT_S, subproc.kill_group, args=(proc,))
    timer.daemon = True
    timer.start()
    last = ""
    try:
        with io.TextIOWrapper(proc.stdout, encoding="utf-8", errors="replace") as out:
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
