#!/usr/bin/env python3
"""Benchmark a running endpoint with vLLM's own `vllm bench serve`, and summarise it.

    python3 scripts/bench.py --plan plan.json                     # the default matrix (below)
    python3 scripts/bench.py --plan plan.json --input-lens 128 --concurrency 1,4 --repeats 1 --output-len 32
    python3 scripts/bench.py --plan plan.json --compare          # serve once per sizing, same matrix, side by side

The method (the one used for published vLLM CPU serving comparisons): random prompts of each input
length x each concurrency x repeats, `--output-len` tokens with --ignore-eos, num_prompts = 10 x
concurrency, percentiles of TTFT, TPOT, ITL and E2EL. Each cell is the mean of its repeats' medians,
with the spread (max - min) beside it. Every raw per-run JSON is kept; a failed request is reported
loudly (exit 1), never averaged away. The decode bound: the bytes one decode step reads (the weights)
over the memory bandwidth measured on the server's bound cores -> the lowest TPOT at concurrency 1.
Writes summary.json, summary.md (and plot.png when matplotlib is installed) in --out; prints the
summary JSON. Exit 0, or 1 with {"error", "fix"}.

--compare starts the plan's model once per sizing (the skill's plan, vLLM's defaults, every core
bound and nothing else, unpinned, the skill's plan plus the throughput flags: serve_plan.SIZINGS) on
the plan's port, runs the same matrix on each, stops it, and prints them side by side with each
cell's output throughput as a ratio to the best. The plan itself must not be running.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the epyc package beside it, under python -I too

from epyc import (
    argtypes,
    bundle,
    cli,
    hubcache,
    jsonio,
    masking,
    planfile,
    serve_procs,
    serve_start,
    serve_state,
)
from epyc.benchmark import (
    MAX_RUNS,
    compare,
    endpoint_of,
    finish,
    int_list,
    loopback_env,
    matrix_against_the_plan,
    new_bench_dir,
    refuse_to_compare,
    require_own_host_server,
    result_dir,
    run_matrix,
    started_state,
)
from epyc.errors import ScriptError


def main(argv: Sequence[str] | None = None):
    p = cli.JsonArgumentParser(prog="scripts/bench.py", description=__doc__.split("\n")[0])
    p.add_argument(
        "--plan", required=True, type=argtypes.nonempty, help="the plan of the running endpoint (launch.py plan)"
    )
    p.add_argument("--input-lens", type=int_list, default=[128, 512])
    p.add_argument("--concurrency", type=int_list, default=[1, 4, 8])
    p.add_argument("--repeats", type=argtypes.int_in(1, 100), default=3)
    p.add_argument("--output-len", type=argtypes.int_in(1, 1 << 16), default=128)
    p.add_argument("--out", type=argtypes.nonempty, help="result folder (default: <state_dir>/bench-<time>)")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the memory-bandwidth run (no decode bound)")
    p.add_argument("--compare", action="store_true", help="serve the model once per sizing and compare them")
    p.add_argument(
        "--seed",
        type=argtypes.int_in(0, 1 << 30),
        help="first run's prompt seed, each run the next "
        "(default: drawn at random, so a second benchmark of the same server sends new prompts; "
        "summary.json records it)",
    )
    args = p.parse_args(argv)
    runs = len(args.input_lens) * len(args.concurrency) * args.repeats
    if runs > MAX_RUNS:  # each flag in range, the product days of a real server
        raise ScriptError(
            f"--input-lens x --concurrency x --repeats is {runs:,} runs of vllm bench serve, over {MAX_RUNS}",
            "benchmark fewer cells or repeats per call (the default matrix is 18 runs)",
        )
    if args.seed is None:  # not in the prefix cache from an earlier benchmark of this server
        args.seed = random.SystemRandom().randrange(1 << 30)
    pass  # REMOVED-IMPORT
    plan = planfile.load_plan(args.plan)
    # bench runs the plan's own vllm binary: only a plan its inputs still render, never an edited one. It
    # starts nothing (--compare checks again as start does), so it renders as verify does: with the secrets,
    # offline state, cache and model folder the plan records, not this shell's HF_TOKEN or a download since
    epyc = bundle.load_epyc()
    serve_start.refuse_edited(plan, planfile.rerender(plan, epyc, phase="bench", env_from_plan=True), "bench")
    settled = (
        (serve_procs.own_state(plan, "bench") or {}).get("primary_endpoint")
        if plan["primary_endpoint"] == "unknown"
        else None
    )  # the endpoint verify settled on the server
    too_long, args.warnings = matrix_against_the_plan(
        plan,
        args.input_lens,
        args.output_len,
        args.concurrency,
        epyc["serve"]["vllm_cpu_default_max_num_seqs"],
        settled,
    )
    if too_long:
        raise ScriptError(
            too_long,
            f"bench lengths within {plan['max_model_len']} tokens (input + output), or "
            "plan with a larger --max-model-len",
        )
    serve_state.require_api_key(plan, "bench")
    state = serve_procs.own_state(plan, "bench")  # another plan's server in this state dir: refused, never loaded
    if plan["path"] == "host":  # `vllm bench serve` loads the tokenizer from the Hub cache this shell names
        hubcache.refuse_a_relative_hub_cache(dict(os.environ))
    key_env = plan.get("api_key_env")
    problem = None if args.out else serve_state.state_dir_problem(Path(plan["state_dir"]))
    if problem:  # the default folder is in the state dir: only one start would write into
        raise ScriptError(
            f"the plan's state dir {plan['state_dir']} {problem}",
            "pass --out FOLDER, or plan again with a --state-dir of this bundle's own",
        )
    if args.out and jsonio.real_path(jsonio.user_path(args.out, "--out")).is_relative_to(  # start would then
        jsonio.real_path(plan["state_dir"])
    ):  # refuse the state dir (a folder not its own there)
        raise ScriptError(
            f"--out {masking.clip(repr(args.out), 200)} is inside the plan's state dir "
            f"{plan['state_dir']}: bench names its own folders there (bench-TIME), and start "
            "refuses a state dir holding anything else",
            "leave --out out (bench makes a new bench-TIME folder in the state dir), or pass a "
            "folder outside the state dir",
        )
    # every refusal comes before anything is made: a refused bench leaves no folder to pass for a result
    if args.out:
        result_dir(args.out, make=False)  # the first fix to make
    if args.compare:
        refuse_to_compare(plan, state)
    else:
        if plan["path"] == "host":
            require_own_host_server(plan, state)
        else:
            started_state(plan, state)  # (recorded_container's check, on the state read above)
        endpoint_of(plan)  # an unknown endpoint verify has not settled yet
    out = result_dir(args.out) if args.out else new_bench_dir(Path(plan["state_dir"]))
    env = loopback_env(dict(os.environ))
    if key_env:  # vllm bench serve reads the key from OPENAI_API_KEY: by value, in env only
        env["OPENAI_API_KEY"] = os.environ[key_env]
    if args.compare:
        return compare(plan, args, out, env)
    return finish(plan, args, out, run_matrix(plan, args, out, env))


if __name__ == "__main__":
    sys.exit(cli.run_main(main))
