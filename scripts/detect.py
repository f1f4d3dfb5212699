#!/usr/bin/env python3
"""Detect the CPU: is this an AMD EPYC, which generation, can zentorch run, how big is it.

    python3 scripts/detect.py                    # this host
    python3 scripts/detect.py --sysroot DIR      # a tree (DIR/proc, DIR/sys), or a --capture FILE
    python3 scripts/detect.py --host user@box    # another host, through one ssh call

Exit 0 with the facts; exit 1 with {"error", "fix"} when the facts cannot be read.
`route` is SKILL.md's routing for this CPU (zentorch | confirm | stock_offer | stop), with the reason.
"""

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the epyc package beside it, under python -I too

from epyc import argtypes, bundle, cli, errors, jsonio
from epyc.deployments import runs
from epyc.errors import ScriptError
from epyc.facts import hostspec
from epyc.facts.cpuid import report
from epyc.facts.remote_host import gather_from_args, spec_host

SPEC_FLAGS = ("ram_gb_per_socket", "nps", "smt", "save_sysroot", "cores", "threads")  # --sockets: when not 1


def parser() -> cli.JsonArgumentParser:
    p = cli.JsonArgumentParser(prog="scripts/detect.py", description=__doc__.split("\n")[0])
    p.add_argument(
        "--sysroot",
        type=argtypes.nonempty,
        help="read DIR/proc and DIR/sys (or a --capture FILE) instead of this host's",
    )
    p.add_argument("--host", type=argtypes.nonempty, help="[user@]host[:port]: read another host through one ssh call")
    p.add_argument(
        "--capture",
        type=argtypes.nonempty,
        metavar="FILE",
        help="on the host to plan for: write the files detect and cpu_tune read to FILE",
    )
    spec = p.add_argument_group("a host you cannot reach yet (--spec)")
    spec.add_argument(
        "--spec",
        type=argtypes.nonempty,
        metavar="SKU",
        help="EPYC part number (9654), or a generation or series (Turin, 9005) with --cores",
    )
    spec.add_argument(
        "--cores",
        type=argtypes.int_in(1, 1024),
        help="cores per socket of a part the SKU table lacks (--spec names it or its generation)",
    )
    spec.add_argument("--threads", type=argtypes.int_in(1, 2048), help="with --cores: threads per socket (default 2x)")
    spec.add_argument("--sockets", type=argtypes.int_in(1, 2), default=1)
    spec.add_argument(
        "--ram-gb-per-socket",
        type=argtypes.float_in(1, 1 << 16),  # no EPYC socket has less
        help="memory installed behind each socket, in GB as sold (binary: GiB), 1 to 65536",
    )
    spec.add_argument("--nps", type=argtypes.int_in(1, 4), choices=[1, 2, 4], help="NUMA nodes per socket (default 1)")
    spec.add_argument("--smt", choices=["on", "off"], help="simultaneous multithreading (default on)")
    spec.add_argument(
        "--save-sysroot",
        type=argtypes.nonempty,
        metavar="DIR",
        help="keep the rendered files in DIR (default: RUN/host, where cpu_tune.py finds them)",
    )
    runs.add_run_arg(p)
    return p


def spec_flags(args: argparse.Namespace) -> list[str]:
    """The flags given that describe a --spec host (each means nothing without --spec, or with --capture)."""
    given = ["--sockets"] if args.sockets != 1 else []
    return given + [f"--{k.replace('_', '-')}" for k in SPEC_FLAGS if getattr(args, k)]


def capture(args: argparse.Namespace) -> dict:
    """--capture: this machine's files into one file, alone (every other flag would be ignored)."""
    others = [f"--{k}" for k in ("sysroot", "host", "spec") if getattr(args, k)] + spec_flags(args)
    if others:
        raise ScriptError(
            f"--capture writes this machine's files: {', '.join(others)} would be ignored",
            "run detect.py --capture FILE alone, on the host to plan for",
        )
    target = jsonio.output_file(args.capture, "--capture")
    try:
        return hostspec.capture(target)
    except OSError as exc:
        raise ScriptError(
            f"cannot write the capture to {args.capture!r}: {exc.strerror or exc}",
            "pass a path on a writable file system with free space",
        )


def main(argv: list[str] | None = None):
    runs.keep_before_parsing(argv, "detect")
    args = parser().parse_args(argv)
    epyc = bundle.load_epyc()
    if args.capture:  # (a receipt, not a fact for the next step: it stays out of the run folder)
        cli.keep_document(None)
        return capture(args), errors.EXIT_OK
    folder = runs.keep(args, "detect")
    spec_only = spec_flags(args)
    if spec_only and not args.spec:
        raise ScriptError(
            f"{', '.join(spec_only)} describe a host given by --spec: without --spec they would be ignored",
            "add --spec SKU, or drop them to read this host",
        )
    args.nps, args.smt = args.nps or 1, args.smt or "on"
    if args.spec:
        if args.sysroot or args.host:
            raise ScriptError("--spec describes a host: it goes without --sysroot and --host", "pass one of them")
        if args.threads and not args.cores:
            raise ScriptError("--threads goes with --cores (a part the SKU table lacks)", "add --cores N, or drop it")
        if not args.save_sysroot:  # the run folder's own rendering of the host, replaced by each spec
            shutil.rmtree(folder / "host", ignore_errors=True)
            args.save_sysroot = str(folder / "host")
        facts, described = spec_host(args, epyc)
        return {**report(facts, epyc), "spec": described}, errors.EXIT_OK
    return report(gather_from_args(args.sysroot, args.host), epyc), errors.EXIT_OK


if __name__ == "__main__":
    sys.exit(cli.run_main(main))
