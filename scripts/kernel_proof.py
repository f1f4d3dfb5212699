#!/usr/bin/env python3
"""Prove zentorch kernels executed: count matmuls per plugin_op and kernel in a server log.

    python3 scripts/kernel_proof.py --plan plan.json     # the log of what launch.py started
    python3 scripts/kernel_proof.py --log server.log

The server must have run with ZENDNNL_API_LOG_LEVEL=4 (and ONEDNN_VERBOSE=1 to see oneDNN work too): `launch.py
plan --kernel-log` sets both. CPU flags only say a kernel could run; these lines say it did, e.g. `LOWOHA
matmul_direct: ... plugin_op=zentorch_linear_unary_out ... kernel=aocl_dlp_blocked`. Exit 0 when zentorch matmuls
were seen; exit 1 when none were (or the log cannot be read).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the epyc package beside it, under python -I too

from epyc import argtypes, cli, errors
from epyc.deployments import runs
from epyc.verbs.kernels import count_kernels, log_lines


def main(argv: list[str] | None = None):
    p = cli.JsonArgumentParser(prog="scripts/kernel_proof.py", description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--plan", type=argtypes.nonempty, help="launch plan JSON: read the log of what it started (default: the run's)"
    )
    src.add_argument("--log", type=argtypes.nonempty, help="a server log file")
    runs.add_run_arg(p)
    args = p.parse_args(argv)
    args.plan = args.plan or (None if args.log else str(runs.run_dir(args.run) / "plan.json"))
    lines, source, backend = log_lines(args)  # masked: a log can hold anything the server printed, a token included
    doc = {"source": source, **count_kernels(lines)}
    if backend == "stock":  # vLLM's CpuPlatform never loads zentorch: no --kernel-log can change that
        doc["error"] = "the plan serves stock vLLM, which runs no zentorch"
        if doc["zentorch_matmuls"]:
            doc["error"] += ": the lines that read as zentorch matmuls in its log are not this server's kernels"
        doc["fix"] = "plan with the zentorch backend (validate.py without --stock) on an AMD EPYC to prove zentorch"
        doc["verdict"] = "no zentorch matmul from this server (a stock plan)"
        return doc, errors.EXIT_FAIL
    if not doc["zentorch_matmuls"]:
        doc["error"] = "no zentorch matmul in the server log"
        doc["fix"] = (
            "start the server with ZENDNNL_API_LOG_LEVEL=4 (launch.py plan --kernel-log) and send a "
            "request; if it still shows none, zentorch is not active (check validate.py's stack.platform)"
        )
    return doc, errors.EXIT_OK if doc["zentorch_matmuls"] else errors.EXIT_FAIL


if __name__ == "__main__":
    sys.exit(cli.run_main(main))
