#!/usr/bin/env python3
"""Benchmark a running endpoint with vLLM's own `vllm bench serve`, and summarise it.

    python3 scripts/bench.py --plan plan.json                     # the default matrix (below)
    python3 scripts/bench.py --plan plan.json --input-lens 128 --concurrency 1,4 --repeats 1 --output-len 32
    python3 scripts/bench.py --plan plan.json --compare          # serve once per sizing, same matrix, side by side

Random prompts of each input length x each concurrency x repeats, `--output-len` tokens with --ignore-eos,
num_prompts = 10 x concurrency. A cell is the mean of its repeats' medians of TTFT, TPOT, ITL and E2EL, with the
spread (max - min) beside it; each run's raw JSON is kept, and a failed request fails the run (exit 1), never averaged
away. The decode bound (the lowest TPOT at concurrency 1): the bytes a decode step reads over the bound cores' memory
bandwidth. Writes summary.json, summary.md (and plot.png with matplotlib) in --out; prints the summary JSON, or
{"error", "fix"} with exit 1. --compare serves the model once per sizing (planner.SIZINGS) on the plan's port, which
the plan's own server must not hold, and prints the matrix side by side, each cell's throughput a ratio to the best.
"""

import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the epyc package beside it, under python -I too

from epyc import argtypes, bundle, cli
from epyc.deployments import deployment, fleet, runs
from epyc.errors import ScriptError
from epyc.verbs import bench_plan
from epyc.verbs.benchmark import compare, finish, loopback_env, run_matrix


def main(argv: list[str] | None = None):
    p = cli.JsonArgumentParser(prog="scripts/bench.py", description=__doc__.split("\n")[0])
    p.add_argument(
        "--plan", type=argtypes.nonempty, help="the plan of the running endpoint (default: the run's plan.json)"
    )
    runs.add_run_arg(p)
    p.add_argument("--input-lens", type=bench_plan.int_list, default=[128, 512])
    p.add_argument("--concurrency", type=bench_plan.int_list, default=[1, 4, 8])
    p.add_argument("--repeats", type=argtypes.int_in(1, 100), default=3)
    p.add_argument("--output-len", type=argtypes.int_in(1, 1 << 16), default=128)
    p.add_argument("--out", type=argtypes.nonempty, help="result folder (default: <state_dir>/bench-<time>)")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the memory-bandwidth run (no decode bound)")
    p.add_argument("--compare", action="store_true", help="serve the model once per sizing and compare them")
    p.add_argument(
        "--seed",
        type=argtypes.int_in(0, 1 << 30),
        help="first run's prompt seed, each run the next (default: drawn at random, so that a second benchmark "
        "of the same server sends new prompts; summary.json records it)",
    )
    args = p.parse_args(argv)
    args.plan = args.plan or str(runs.run_dir(args.run) / "plan.json")
    if args.seed is None:  # not in the prefix cache from an earlier benchmark of this server
        args.seed = random.SystemRandom().randrange(1 << 30)
    epyc = bundle.load_epyc()
    kind = deployment.kind_of(args.plan)
    if kind == "front":
        raise ScriptError(
            f"{args.plan} is a front router over several hosts: bench measures one host's plan or fleet",
            "run bench on each host, with that host's plan",
        )
    the_fleet = deployment.open_deployment(args.plan, "bench", epyc) if kind == "fleet" else None
    if the_fleet:  # the router's endpoint, measured as one engine's plan with every engine's cores
        args.plan = the_fleet.doc["engines"][0]
    plan, state = bench_plan.checked_plan(args, epyc)
    if the_fleet:
        if args.compare:
            raise ScriptError("--compare serves one engine's sizings, not a fleet", "bench the fleet without it")
        plan = fleet.as_one_endpoint(the_fleet.doc, the_fleet.engines)
    out = bench_plan.result_dir(args.out) if args.out else bench_plan.new_bench_dir(Path(plan["state_dir"]))
    env = loopback_env(dict(os.environ))
    if plan.get("api_key_env"):  # vllm bench serve reads the key from OPENAI_API_KEY: by value, in env only
        env["OPENAI_API_KEY"] = os.environ[plan["api_key_env"]]
    if args.compare:
        return compare(plan, args, out, env)
    return finish(plan, args, out, run_matrix(plan, args, out, env))


if __name__ == "__main__":
    sys.exit(cli.run_main(main))
