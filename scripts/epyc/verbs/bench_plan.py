"""Which plan and server bench may measure, and where its results go: every refusal before anything is made."""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

from epyc import bundle, errors, jsonio, masking
from epyc.deployments import planfile, serve_procs, serve_state, serve_verify
from epyc.errors import ScriptError
from epyc.facts import hubcache

MAX_RUNS = 600
CHAT_TEMPLATE_TOKENS = 64


def int_list(text: str) -> list[int]:
    """'128,512': ASCII digits only (int() takes '1_0' too), each value once (a repeat would overwrite its raw file)."""
    parts = text.split(",")
    if not all(re.fullmatch(r"[0-9]{1,7}", x) for x in parts) or not all(1 <= int(x) <= 1 << 20 for x in parts):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of positive whole numbers (e.g. 1,4,8; each at most {1 << 20})"
        )
    values = [int(x) for x in parts]
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text!r} repeats a value: each one runs once")
    return values


def served_max_num_seqs(plan: dict, vllm_default: int) -> int:
    """The --max-num-seqs in the plan's command, else vLLM's own default for a CPU server."""
    argv = plan["argv"]
    return int(argv[argv.index("--max-num-seqs") + 1]) if "--max-num-seqs" in argv else vllm_default


def matrix_against_the_plan(
    plan: dict,
    input_lens: list[int],
    output_len: int,
    concurrency: list[int],
    vllm_default_seqs: int,
    endpoint: str | None = None,
) -> tuple[str | None, list[dict]]:
    """(why the matrix cannot run on this server, what else its figures would measure): a request past
    --max-model-len is refused (400); a concurrency past --max-num-seqs queues. `endpoint`: the one verify settled."""
    longest = max(input_lens) + output_len
    limit = plan.get("max_model_len")
    if isinstance(limit, int) and longest > limit:
        return (
            f"--input-lens up to {max(input_lens)} + --output-len {output_len} is {longest} tokens a request, "
            f"past the plan's --max-model-len {limit}: vLLM refuses every such request"
        ), []
    warnings = []
    chat = (endpoint or plan.get("primary_endpoint")) == "chat_completions"
    if isinstance(limit, int) and chat and longest > limit - CHAT_TEMPLATE_TOKENS:
        message = (
            f"{longest} tokens a request is within {CHAT_TEMPLATE_TOKENS} of --max-model-len {limit}, and the chat "
            "template adds tokens to each prompt: vLLM may refuse those requests"
        )
        warnings.append({"check": "length", "message": message, "fix": "bench shorter lengths"})
    seqs = served_max_num_seqs(plan, vllm_default_seqs)
    if over := [c for c in concurrency if c > seqs]:
        message = (
            f"--concurrency {','.join(map(str, over))} is past the --max-num-seqs {seqs} the server runs with: it "
            f"runs {seqs} at once and queues the rest, so TTFT and E2EL include that wait"
        )
        warnings.append({"check": "concurrency", "message": message, "fix": None})
    return None, warnings


def endpoint_of(plan: dict) -> str:
    """The endpoint to load: the plan's, or when check_model could not tell, the one verify settled on the server."""
    if plan["primary_endpoint"] != "unknown":
        return plan["primary_endpoint"]
    settled = (serve_procs.own_state(plan, "bench") or {}).get("primary_endpoint")
    if settled not in ("chat_completions", "completions"):
        raise ScriptError(
            "the plan's endpoint is unknown and verify has not settled it on the running server",
            "run launch.py verify --plan PLAN first (it tries both endpoints and records the one that "
            "answers), then bench",
        )
    return settled


def started_state(plan: dict, state: dict | None) -> dict:
    """The state this plan's start recorded (own_state's): bench measures only a server of its own plan."""
    if state is None:
        raise ScriptError(
            f"no server from this plan is running ({serve_verify.no_state_said(plan)})",
            "python3 scripts/launch.py start --plan <plan.json> --confirm, then verify, then bench",
        )
    return state


def recorded_container(plan: dict) -> str:
    """The id of the container this plan's start recorded: by name, exec could land in another plan's container."""
    return started_state(plan, serve_procs.own_state(plan, "bench"))["container_id"]


def require_own_host_server(plan: dict, state: dict | None) -> None:
    """bench measures this plan's server only: the process group its start recorded, alive."""
    if serve_procs.alive(plan, started_state(plan, state)) is False:
        raise ScriptError(
            "the server this plan started has exited",
            "python3 scripts/launch.py stop --plan <plan.json>, then start, verify and bench again",
        )


def result_dir(spec: str, make: bool = True) -> Path:
    """--out: a folder bench makes, or an empty one (nothing planted there takes a write elsewhere; never `--out /`)."""
    return jsonio.empty_output_dir(
        spec,
        "--out",
        "pass --out a new or empty folder: bench writes summary.json, summary.md, plot.png and raw/ (with "
        "--compare, one folder per sizing) there, and nothing else may be in it",
        make=make,
    )


def new_bench_dir(state_dir: Path) -> Path:
    """bench-TIME in the state dir, made new here: never an entry someone planted under the next second's name."""
    out = state_dir / time.strftime("bench-%Y%m%d-%H%M%S")
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.mkdir(out, 0o755)
    except FileExistsError:
        raise ScriptError(f"{out} exists already", "run bench again in a second, or pass --out FOLDER")
    except OSError as exc:
        raise ScriptError(f"cannot make a bench folder in {state_dir}: {exc.strerror or exc}", "pass --out FOLDER")
    return out


def write_out(path: Path, text: str) -> None:
    """A file of bench's own in its result folder, never written through a link planted there."""
    try:
        fd = jsonio.open_own_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, "bench")
        with os.fdopen(fd, "w") as f:
            f.write(text)
    except OSError as exc:  # a full disk: opened, and the write (or its flush at close) refused
        raise errors.os_error(exc, f"cannot write {path}")


def refuse_to_compare(plan: dict, state: dict | None) -> None:
    """--compare starts its own servers on the plan's port: not while the plan's runs, nor from an edited plan."""
    if state and serve_procs.alive(plan, state) is not False:  # running, or its runtime did not say
        raise ScriptError(
            "the plan's server is running: --compare starts its own servers on the same port",
            "python3 scripts/launch.py stop --plan <plan.json>, then run --compare",
        )
    planfile.refuse_edited(plan, planfile.rerender(plan, bundle.load_epyc(), phase="bench"), "bench")


def refuse_an_out_folder(out: str | None, plan: dict) -> None:
    """The default folder goes in the state dir (one only a start would write into); a given one never there."""
    if not out and (problem := serve_state.state_dir_problem(Path(plan["state_dir"]))):
        raise ScriptError(
            f"the plan's state dir {plan['state_dir']} {problem}",
            "pass --out FOLDER, or plan again with a --state-dir of this bundle's own",
        )
    if out and jsonio.real_path(jsonio.user_path(out, "--out")).is_relative_to(jsonio.real_path(plan["state_dir"])):
        raise ScriptError(  # start would then refuse the state dir (a folder not its own there)
            f"--out {masking.clip(repr(out), 200)} is inside the plan's state dir {plan['state_dir']}: bench names "
            "its own folders there (bench-TIME), and start refuses a state dir holding anything else",
            "leave --out out (bench makes a new bench-TIME folder in the state dir), or pass a folder outside the "
            "state dir",
        )
    if out:
        result_dir(out, make=False)  # the first fix to make


def checked_plan(args: argparse.Namespace, epyc: dict) -> tuple[dict, dict | None]:
    """The plan bench may measure and its server's state: every refusal before anything is made."""
    runs = len(args.input_lens) * len(args.concurrency) * args.repeats
    if runs > MAX_RUNS:  # each flag in range, the product days of a real server
        raise ScriptError(
            f"--input-lens x --concurrency x --repeats is {runs:,} runs of vllm bench serve, over {MAX_RUNS}",
            "benchmark fewer cells or repeats per call (the default matrix is 18 runs)",
        )
    plan = planfile.load_plan(args.plan)
    # bench runs the plan's own vllm binary: never an edited plan; rendered as verify does (it starts nothing)
    planfile.refuse_edited(plan, planfile.rerender(plan, epyc, phase="bench", env_from_plan=True), "bench")
    settled = None  # the endpoint verify settled on the server
    if plan["primary_endpoint"] == "unknown":
        settled = (serve_procs.own_state(plan, "bench") or {}).get("primary_endpoint")
    seqs = epyc["serve"]["vllm_cpu_default_max_num_seqs"]
    too_long, args.warnings = matrix_against_the_plan(
        plan, args.input_lens, args.output_len, args.concurrency, seqs, settled
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
    refuse_an_out_folder(args.out, plan)
    if args.compare:
        refuse_to_compare(plan, state)
    elif plan["path"] == "host":
        require_own_host_server(plan, state)
    else:
        started_state(plan, state)  # (recorded_container's check, on the state read above)
    if not args.compare:
        endpoint_of(plan)  # an unknown endpoint verify has not settled yet
    return plan, state
