#!/usr/bin/env python3
"""Plan, start, verify, hand off and stop one vLLM endpoint, from the other scripts' JSON.

    python3 scripts/launch.py plan --detect d.json --validate v.json --check c.json --estimate e.json         --tune t.json > plan.json                        # the exact command + the summary to confirm
    python3 scripts/launch.py start --plan plan.json --confirm   # only after the human said go
    python3 scripts/launch.py verify --plan plan.json            # health, model listed, one real request
    python3 scripts/launch.py handoff --plan plan.json           # connection table + examples
    python3 scripts/launch.py stop --plan plan.json              # stops exactly what start started
    python3 scripts/launch.py up [--model M] [--yes]             # the engineer's one command: all of it

Every subcommand prints one JSON document. Exit 0 on success; exit 1 with {"error", "fix"}; a failed
verify also names its phase (process | health | models | smoke) and carries the last 50 log lines.
No retries: on failure, report and stop.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the epyc package beside it, under python -I too

from epyc import argtypes, bundle, cli, errors, jsonio
from epyc.decisions.planner import SERVE_OPTIONS, SIZINGS, TLS_OPTIONS, build_plan
from epyc.deployments import deployment, fleet, front, runs, serve_state
from epyc.errors import ScriptError
from epyc.facts.shell import shell_facts
from epyc.verbs.up import check_default_state_dir, state_dir_arg, up

# plan's flag -> the script whose output it takes
INPUT_FLAGS = dict(zip(("detect", "validate", "check", "estimate", "tune"), bundle.INPUT_SCRIPTS))
PLAN_OPTIONS = (*SERVE_OPTIONS, "sizing")
FRONT_FLAGS = ("port", "expose", "api_key_env", *TLS_OPTIONS)


def add_serve_options(p, epyc: dict, model_default: str) -> None:
    """What plan and up both take about the serve itself."""
    p.add_argument("--model", type=argtypes.nonempty, help=f"model to serve ({model_default})")
    p.add_argument("--port", type=argtypes.int_in(1, 65535))
    p.add_argument("--max-model-len", type=argtypes.int_in(16, 1 << 24))
    p.add_argument(
        "--served-model-name",
        type=argtypes.served_name_arg,
        help="the id clients send (default: the Hub id, or a folder's name)",
    )
    p.add_argument("--state-dir", type=argtypes.nonempty, help="where start keeps its log and state")
    p.add_argument("--dtype", choices=epyc["precision"]["supported"])
    p.add_argument("--expose", action="store_true", help="all interfaces: needs --api-key-env, and TLS or --plain-http")
    for name, metavar, what in epyc["tls"]["options"]:
        p.add_argument(f"--{name}", type=argtypes.nonempty, metavar=metavar, help=what)
    p.add_argument("--plain-http", action="store_true", help="exposed without TLS: the key and prompts in clear")
    p.add_argument(
        "--api-key-env",
        type=argtypes.api_key_env_arg,
        help="name of the env var holding the API key (its value is never shown)",
    )
    p.add_argument(
        "--throughput-flags",
        action="store_true",
        help="opt in to TORCHINDUCTOR_FREEZING=1 + VLLM_USE_AOT_COMPILE=0 (+ weight prepack)",
    )
    p.add_argument(
        "--kernel-log",
        action="store_true",
        help="log every zentorch/oneDNN kernel call, for kernel_proof.py (verbose: not for production)",
    )


def add_plan(sub, epyc: dict) -> None:
    pl = sub.add_parser("plan", help="render the exact command and the summary to confirm")
    for name in INPUT_FLAGS:
        pl.add_argument(
            f"--{name}", type=argtypes.nonempty, help=f"{name} JSON file ('-' for stdin; default: the run's)"
        )
    runs.add_run_arg(pl)
    add_serve_options(pl, epyc, "default: the one check_model.py checked")
    pl.add_argument(
        "--sizing",
        choices=sorted(SIZINGS),
        default="skill",
        help="skill (default) or a baseline for bench.py --compare: vllm-default, all-cores, unpinned, skill+throughput",
    )
    pl.add_argument(
        "--engines",
        type=fleet.engines_arg,
        help="a fleet behind vllm-router: per-socket (one engine on each socket), per-node (one per NUMA node), "
        "or N engines sharing one socket",
    )
    pl.add_argument(
        "--hosts",
        nargs="+",
        type=front.host_arg,
        metavar="RUN=ADDRESS",
        help="one router here in front of several hosts, each planned in its run folder with --expose and the key",
    )


LIFE_VERBS = {
    "start": "launch what the plan says, after the human approved it (--confirm); on a running fleet or front, "
    "start again only what failed while the rest serves",
    "verify": "health, the model listed, one real request (a fleet: each engine, then through the router)",
    "handoff": "the connection table and client examples, once verify passed",
    "stop": "stop exactly what start started, and remove what it left",
}


def timeout_arg(epyc: dict) -> dict:  # verify's and up's: seconds for the server to answer
    return {"type": argtypes.float_in(0, 86400, lo_open=True), "default": epyc["serve"]["health_timeout_s"]}


def add_life_verbs(sub, epyc: dict) -> None:
    for name, what in LIFE_VERBS.items():
        sp = sub.add_parser(name, help=what, description=what)
        sp.add_argument("--plan", type=argtypes.nonempty, help="the plan JSON file (default: the run's plan.json)")
        runs.add_run_arg(sp)
        if name == "start":
            sp.add_argument("--confirm", action="store_true", help="the human approved the plan")
            sp.add_argument("--pull", choices=["missing", "always"], default="missing", help="when to pull the image")
        if name == "verify":
            sp.add_argument("--timeout", **timeout_arg(epyc))


def add_up(sub, epyc: dict) -> None:
    u = sub.add_parser(
        "up", help="detect -> validate -> check -> estimate -> tune -> plan -> confirm -> start -> verify -> handoff"
    )
    add_serve_options(u, epyc, f"default: {epyc['default_model']}")
    u.add_argument("--num-prompts", type=argtypes.int_in(1, 65536), default=1)
    u.add_argument(
        "--python",
        type=argtypes.nonempty,
        help="serve on the host path with this interpreter (default: "
        "a container when docker answers, else the setup_host_stack.py venv)",
    )
    u.add_argument(
        "--stock",
        action="store_true",
        help="the stock vLLM CPU path (no zentorch): only on an explicit "
        "request, e.g. a pre-Zen4 EPYC, or a CPU that is not an EPYC",
    )
    u.add_argument("--yes", action="store_true", help="launch the plan up showed last: only after a human has read it")
    u.add_argument("--timeout", **timeout_arg(epyc))


def plan_from_files(a, epyc: dict) -> dict:
    """launch.py plan: the five documents read and checked, then the plan."""
    deployment.refuse_to_plan_over(runs.run_dir(a.run))  # before its plan.json is replaced
    folder = runs.keep(a, "plan")
    if a.hosts:
        others = [k for k in (*INPUT_FLAGS, *PLAN_OPTIONS, "engines") if k not in FRONT_FLAGS]
        if any(getattr(a, k) not in (None, False, "skill") for k in others):
            raise ScriptError(
                "--hosts plans only the front router: each host's engines are planned in its own run folder",
                "pass --hosts with --api-key-env, --port, --expose and the TLS options only",
            )
        return front.plan_front(a.hosts, {k: getattr(a, k) for k in FRONT_FLAGS}, epyc, folder)
    if sum(getattr(a, k) == "-" for k in INPUT_FLAGS) > 1:
        raise ScriptError("only one input can come from stdin", "save the others to files")
    inputs = {}  # keyed by script: a file given, else the run's
    for k, v in INPUT_FLAGS.items():
        given = getattr(a, k)
        inputs[v] = runs.needed(folder, v, f"--{k}") if given is None else jsonio.read_json_input(given, v)
        if given is not None:
            jsonio.check_schema(
                inputs[v], v, f"--{k} {given} is not {v}.py's output", f"pass the unmodified stdout of {v}.py"
            )
    opts = {k: getattr(a, k) for k in PLAN_OPTIONS}
    if a.engines:  # each engine's state dir is the run folder's engine-N
        return fleet.plan_from_run(inputs, {**opts, "state_dir": None}, epyc, folder, a.engines)
    if opts["state_dir"]:
        opts["state_dir"] = state_dir_arg(opts["state_dir"])
    plan = build_plan(inputs, opts, epyc, shell_facts(opts, inputs))
    if not plan["deferred"]:  # another host's state dir is there, not here
        check_default_state_dir(plan)
    return plan


def main(argv: list[str] | None = None):
    epyc = bundle.load_epyc()
    p = cli.JsonArgumentParser(prog="scripts/launch.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=cli.JsonArgumentParser)
    add_plan(sub, epyc)
    add_life_verbs(sub, epyc)
    add_up(sub, epyc)
    t = sub.add_parser("tls-selfsigned", help="make a self-signed certificate and key (cryptography) for a first try")
    t.add_argument("--out", type=argtypes.nonempty, required=True, help="the folder (yours) for cert.pem and key.pem")
    t.add_argument("--name", nargs="*", default=[], help="host names or addresses it holds (besides this host's)")
    a = p.parse_args(argv)
    if a.cmd == "tls-selfsigned":
        return serve_state.self_signed(a.out, a.name), errors.EXIT_OK
    if a.cmd == "plan":
        return plan_from_files(a, epyc), errors.EXIT_OK
    if a.cmd == "up":
        return up(a, epyc), errors.EXIT_OK
    kw = {k: getattr(a, k) for k in {"start": ("confirm", "pull"), "verify": ("timeout",)}.get(a.cmd, ())}
    return deployment.act(a.cmd, a.plan or str(runs.run_dir(a.run) / "plan.json"), epyc, **kw), errors.EXIT_OK


if __name__ == "__main__":
    sys.exit(cli.run_main(main))
