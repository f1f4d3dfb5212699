#!/usr/bin/env python3
"""Prove zentorch kernels executed: count matmuls per plugin_op and kernel in a server log.

    python3 scripts/kernel_proof.py --plan plan.json     # the log of what launch.py started
    python3 scripts/kernel_proof.py --log server.log

The server must have run with ZENDNNL_API_LOG_LEVEL=4 (and ONEDNN_VERBOSE=1 to see oneDNN work
too): `launch.py plan --kernel-log` sets both. CPU flags only say a kernel could run; these lines
say it did, e.g. `LOWOHA matmul_direct: ... plugin_op=zentorch_linear_unary_out ... kernel=aocl_dlp_blocked`.
Exit 0 when zentorch matmuls were seen; exit 1 when none were (or the log cannot be read).
"""
from __future__ import annotations

import io
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import ScriptError  # noqa: E402
from serve_life import known_secrets, read_plan  # noqa: E402
from serve_plan import redact  # noqa: E402


ZEN_LINE = re.compile(r"plugin_op=(?P<op>[^,\s]+).*?kernel=(?P<kernel>[^,\s]+)")
ONEDNN_EXEC = re.compile(r"onednn_verbose,(?:[^,]*,)*?exec,cpu,(?P<prim>[^,]+),(?P<impl>[^,]+),")
FALLBACK = re.compile(r"fall(?:ing)?\s*back|fallback", re.I)
# A kernel log line is a few hundred characters. The patterns above are tried at each `plugin_op=` /
# `onednn_verbose,` of a line and scan on from there, so a line of 64,000 of them took minutes: each
# line is matched on its first LINE_MATCH_CHARS only, and read in pieces of at most LINE_READ_CHARS.
LINE_MATCH_CHARS = 4096
LINE_READ_CHARS = 1 << 16
# A real log names a dozen ops and kernels. A log of a million distinct names would carry each into the
# JSON: past MAX_NAMES a new name counts under OTHER, and a name is shown on its first NAME_CHARS (cut
# in main, after its secrets are masked: a cut first could leave part of one that no mask then sees).
MAX_NAMES = 200
NAME_CHARS = 200
SHOWN_LINE_CHARS = 300
OTHER = "(other)"
LOGS_TIMEOUT_S = 120


def _tally(counter: Counter, name: str) -> None:
    counter[name if name in counter or len(counter) < MAX_NAMES else OTHER] += 1


def shown_names(counts: dict, secrets: list[str]) -> dict:
    """A tally as printed: each name masked, then cut to NAME_CHARS (two names equal after it add up)."""
    out: Counter = Counter()
    for name, n in counts.items():
        out[redact(name, secrets, LINE_MATCH_CHARS)[:NAME_CHARS]] += n
    return dict(out.most_common())


def count_kernels(lines: Iterable[str]) -> dict:
    """Tally zentorch matmuls (per plugin_op, per kernel), oneDNN primitives and fallback mentions."""
    by_op: Counter = Counter()
    by_kernel: Counter = Counter()
    onednn: Counter = Counter()
    fallbacks: list[str] = []
    sample = None
    for line in lines:
        line = line[:LINE_MATCH_CHARS]
        m = ZEN_LINE.search(line)
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
    return {"zentorch_matmuls": total, "by_plugin_op": dict(by_op.most_common()),
            "by_kernel": dict(by_kernel.most_common()), "onednn_primitives": dict(onednn.most_common()),
            "onednn_exec_count": sum(onednn.values()), "fallback_lines": fallbacks,
            "fallback_count": len(fallbacks), "sample": sample,
            "verdict": "zentorch kernels executed" if total else "no zentorch matmul in the log"}


def log_lines(args) -> tuple[Iterable[str], str, list[str]]:
    """The log's lines (streamed: a kernel log runs to gigabytes), where they came from, and the secret
    values no line may carry into our output."""
    fix = "pass the server log (launch.py writes it to the plan's log_file)"
    # without a plan the API key's variable is unknown: mask every value this shell holds under a
    # secret-looking name (…KEY, …TOKEN, …SECRET, …PASSWORD), not only the two well-known ones
    secrets = common.secret_values()
    if args.log:
        path = Path(args.log)
    else:
        plan = read_plan(args.plan, "kernel_proof", common.load_epyc())  # as launch.py's verbs read a plan
        secrets += known_secrets(plan)
        if plan["path"] != "host":
            return (container_log_lines([*common.runtime_argv(plan["runtime"]), "logs", plan["container_name"]]),
                    f"{plan['runtime']} logs {plan['container_name']}", secrets)
        path = Path(plan["log_file"])
    common.require_regular_file(path, "server log", fix)

    def lines():
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                while piece := f.readline(LINE_READ_CHARS):  # a line without end is never held whole
                    yield piece
        except OSError as exc:
            raise ScriptError(f"cannot read {path}: {exc.strerror or exc}", fix)
    return lines(), str(path), secrets


def container_log_lines(argv: list[str]) -> Iterator[str]:
    """`docker logs NAME`, streamed line by line as the host log is read (a kernel log runs to gigabytes;
    read whole it was held twice in memory), within LOGS_TIMEOUT_S for the whole read."""
    fix = "is the container still there? (launch.py stop removes it)"
    program = common.find_program(argv[0])
    if program is None:
        raise ScriptError(f"cannot read the container's log: {argv[0]} is not in PATH", fix)
    proc = subprocess.Popen(argv, executable=program, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    timer = threading.Timer(LOGS_TIMEOUT_S, common.kill_group, args=(proc,))
    timer.daemon = True
    timer.start()
    last = ""
    try:
        with io.TextIOWrapper(proc.stdout, encoding="utf-8", errors="replace") as out:
            while piece := out.readline(LINE_READ_CHARS):
                last = piece
                yield piece
        try:
            code = proc.wait(timeout=10)
            failure = f"exited {code}" if code else None
        except subprocess.TimeoutExpired:  # its output ended, the process did not: killed below
            failure = "did not exit after its output ended"
    finally:
        timer.cancel()
        common.kill_group(proc)
    if failure:
        raise ScriptError(f"cannot read the container's log ({argv[0]} logs {failure}): "
                          f"{common.clip(last.strip(), 200, tail=True)}", fix)


def main(argv: Sequence[str] | None = None):
    p = common.JsonArgumentParser(prog="scripts/kernel_proof.py", description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--plan", type=common.nonempty, help="launch plan JSON: read the log of what it started")
    src.add_argument("--log", type=common.nonempty, help="a server log file")
    args = p.parse_args(argv)
    lines, source, secrets = log_lines(args)
    doc = {"source": source, **count_kernels(lines)}
    # a log can hold anything the server printed, a token included: what we echo is redacted
    doc["fallback_lines"] = [redact(line, secrets, SHOWN_LINE_CHARS) for line in doc["fallback_lines"]]
    doc["sample"] = redact(doc["sample"], secrets, SHOWN_LINE_CHARS) if doc["sample"] else None
    for key in ("by_plugin_op", "by_kernel", "onednn_primitives"):
        doc[key] = shown_names(doc[key], secrets)
    if not doc["zentorch_matmuls"]:
        doc["error"] = "no zentorch matmul in the server log"
        doc["fix"] = ("start the server with ZENDNNL_API_LOG_LEVEL=4 (launch.py plan --kernel-log) and send a "
                      "request; if it still shows none, zentorch is not active (check validate.py's stack.platform)")
    return doc, common.EXIT_OK if doc["zentorch_matmuls"] else common.EXIT_FAIL


if __name__ == "__main__":
    sys.exit(common.run_main(main))
