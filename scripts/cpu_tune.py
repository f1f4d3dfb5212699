#!/usr/bin/env python3
"""Size vLLM's CPU runtime: which socket (or NUMA nodes, one rank each), which cores, how much KV cache, how to pin.

    python3 scripts/cpu_tune.py                        # JSON: the plan and the facts behind it
    eval "$(python3 scripts/cpu_tune.py --format env)" # exports VLLM_CPU_OMP_THREADS_BIND, VLLM_CPU_KVCACHE_SPACE

One engine runs on one socket and that socket's memory; a model that does not fit one socket is split over
the NUMA nodes by tensor parallelism (one rank each, its memory on its node), as --tensor-parallel N asks too.
Exit 0 with the plan; exit 1 with {"error", "fix"} (in env format: the JSON on stderr, `false`).
"""

import argparse
import dataclasses
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the epyc package beside it, under python -I too

from epyc import argtypes, bundle, cli, errors
from epyc.decisions import kv_budget
from epyc.decisions.sizing import SizingRequest, env_lines, sample_busy, tune
from epyc.deployments import runs
from epyc.facts import probe, remote_host


def main(argv: list[str] | None = None):
    epyc = bundle.load_epyc()
    cfg = epyc["cpu"]
    p = cli.JsonArgumentParser(prog="scripts/cpu_tune.py", description=__doc__.split("\n")[0])
    p.add_argument("--format", choices=["json", "env"], default="json")
    p.add_argument("--socket", type=argtypes.int_in(0, 4095), help="force this socket")
    p.add_argument(
        "--busy-threshold",
        type=argtypes.float_in(0, 100, lo_open=True),
        default=cfg["busy_threshold_pct"],
        help="a socket at or above this busy %% counts as busy (default %(default)s)",
    )
    p.add_argument(
        "--reserve-cores",
        type=argtypes.int_in(0, 4096),
        default=cfg["default_reserved_cores"],
        help="physical cores to leave unbound (default %(default)s: bind all)",
    )
    p.add_argument("--weight-gb", type=argtypes.float_in(0, 65536), help="model weights, from estimate_memory.py")
    p.add_argument(
        "--kv-needed-gb", type=argtypes.float_in(0, 65536), help="KV cache the model needs, from estimate_memory.py"
    )
    p.add_argument(
        "--kv-per-sequence-gb",
        type=argtypes.float_in(0, 65536),
        help="KV one full-length sequence needs, from estimate_memory.py: bounds the grant by what a batch uses",
    )
    p.add_argument(
        "--tensor-parallel",
        type=argtypes.int_in(1, 1024),
        help="ranks of one engine, spread evenly over the NUMA nodes (default: 1, or one per node when the model "
        "does not fit one socket)",
    )
    p.add_argument("--os-reserve-gb", type=argtypes.float_in(0, 65536), default=epyc["memory"]["os_reserve_gb"])
    p.add_argument("--sysroot", type=argtypes.nonempty, help="plan for a captured host tree (load is then unknown)")
    p.add_argument(
        "--host", type=argtypes.nonempty, help="[user@]host[:port]: plan for another host over ssh (load unknown)"
    )
    runs.add_run_arg(p)
    runs.keep_before_parsing(argv, "cpu_tune")
    args = p.parse_args(argv)
    folder = runs.keep(args, "cpu_tune")
    req = sizing_request(args, folder)
    if not (args.sysroot or args.host):  # the host the run's detect.json read: its tree, or its ssh target
        args.sysroot, args.host = runs.host_source(runs.earlier(folder, "detect") or {})
    facts = remote_host.gather_from_args(args.sysroot, args.host)
    busy = None
    if not (args.sysroot or args.host):  # a short sample under --socket, where it is only reported
        busy = sample_busy(facts.topology, facts.allowed_cpus, cfg["sample_seconds"] if args.socket is None else 0.1)
    doc = tune(facts, epyc, busy, req)
    if not (args.sysroot or args.host):  # what the engine's cores deliver, for the plan's forecast
        doc["measured"] = probe.for_engine(runs.earlier(folder, "validate"), doc)
    return doc, errors.EXIT_OK


def sizing_request(args: argparse.Namespace, folder: Path) -> SizingRequest:
    """The flags, else the weights, KV need and per-rank rows of the run's estimate_memory.json."""
    flagged = args.weight_gb is not None or args.kv_needed_gb is not None
    est = {} if flagged else (runs.earlier(folder, "estimate_memory") or {})
    need = kv_budget.need_of(est) if "fit" in est else kv_budget.Need(args.weight_gb, args.kv_needed_gb)
    if args.kv_per_sequence_gb is not None:
        need = dataclasses.replace(need, kv_per_sequence_gb=args.kv_per_sequence_gb)
    flags = ("busy_threshold", "reserve_cores", "os_reserve_gb", "socket", "tensor_parallel")
    return SizingRequest(**{k: getattr(args, k) for k in flags}, need=need, rank_table=est.get("tensor_parallel"))


def render_env(doc: dict, ok: bool) -> str:
    """--format env stays eval-safe even on failure: the JSON error goes to stderr, then `false`."""
    return env_lines(doc) if ok else f"printf '%s\\n' {shlex.quote(json.dumps(doc))} >&2; false"


def entry(argv: list[str] | None = None) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--format")
    fmt = pre.parse_known_args(argv)[0].format
    return cli.run_main(main, argv, render=render_env if fmt == "env" else None)


if __name__ == "__main__":
    sys.exit(entry())
