#!/usr/bin/env python3
"""Can the vLLM that will serve run this model as a generation endpoint, and through which API?

    python3 scripts/check_model.py --model Qwen/Qwen3-0.6B --vllm-version 0.32.0
    python3 scripts/check_model.py --model ./my-model --python ~/venv/bin/python   # probe that vLLM

Exit 0: vLLM serves it as chat/completions, or support cannot be determined (gated, offline, Hub unreachable, no
registry) -- proceed, the launch confirms. Exit 1: the architecture is unknown to that vLLM, it is a pooling /
embedding / reranker model, it is multimodal without a usable chat template, or the input is wrong ({"error", "fix"}).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the epyc package beside it, under python -I too

from epyc import argtypes, bundle, cli
from epyc.decisions import model_check
from epyc.decisions.model_check import pick_registry
from epyc.deployments import runs
from epyc.errors import ScriptError
from epyc.facts import architectures, remote_host, runtimes


def main(argv: list[str] | None = None):
    epyc = bundle.load_epyc()
    p = cli.JsonArgumentParser(prog="scripts/check_model.py", description=__doc__.split("\n")[0])
    model_help = f"Hub id or local folder (default: {epyc['default_model']}; needed with --config)"
    p.add_argument("--model", "--model-id", dest="model", help=model_help)
    p.add_argument("--revision", type=argtypes.revision_arg, help="branch, tag or commit (Hub ids; default main)")
    offline = "judge the model from this config.json alone, offline (no Hub, no folder)"
    p.add_argument("--config", type=argtypes.nonempty, help=offline)
    serving = f"vLLM that will serve (default: validate.json's stack.vllm, else the pinned {epyc['vllm_version']})"
    p.add_argument("--vllm-version", type=argtypes.version, help=serving)
    architectures.add_probe_args(p, p)
    runs.add_run_arg(p)
    seconds = argtypes.float_in(0, 3600, lo_open=True)
    p.add_argument("--hub-timeout", type=seconds, default=60, help="overall deadline for Hub requests, seconds")
    runs.keep_before_parsing(argv, "check_model")
    args = p.parse_args(argv)
    folder = runs.keep(args, "check_model")
    if args.config and args.model is None:
        raise ScriptError("--config judges a model that is named by --model", "add --model ORG/NAME (the model's id)")
    args.model = epyc["default_model"] if args.model is None else args.model
    validated = runs.earlier(folder, "validate") or {}
    if not (args.vllm_version or args.python or args.image):
        the_stack_validate_found(args, validated)
    where = ("container" if args.image else "host" if args.python else validated.get("path"), validated.get("backend"))
    args.vllm_version = args.vllm_version or epyc["vllm_version"]
    notes: list[str] = []
    registry = pick_registry(args, notes)
    return model_check.check(
        args.model, args.revision, args.vllm_version, registry, args.hub_timeout, epyc, notes, args.config, where
    )


def the_stack_validate_found(args, validated: dict | None) -> None:
    """The vLLM the run's validate.json names; its interpreter or image is probed only when it is on this machine."""
    if not validated:
        return
    args.vllm_version = (validated.get("stack") or {}).get("vllm")
    if remote_host.is_another_host(validated.get("target", "localhost")):
        return
    if validated.get("python"):
        args.python = validated["python"]
    elif validated.get("image") and validated.get("runtime") in runtimes.CONTAINER_RUNTIMES:
        args.image, args.runtime = validated["image"], validated["runtime"]


if __name__ == "__main__":
    sys.exit(cli.run_main(main))
