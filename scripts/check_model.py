#!/usr/bin/env python3
"""Can the vLLM that will serve run this model as a generation endpoint, and through which API?

    python3 scripts/check_model.py --model Qwen/Qwen3-0.6B --vllm-version 0.32.0
    python3 scripts/check_model.py --model ./my-model --python ~/venv/bin/python   # probe that vLLM

Exit 0: vLLM serves it as chat/completions, or support cannot be determined (gated, offline,
Hub unreachable, no registry) -- proceed, the launch confirms. Exit 1: the architecture is unknown
to that vLLM, it is a pooling / embedding / reranker model, it is multimodal without a usable chat
template, or the input is wrong ({"error", "fix"}).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the epyc package beside it, under python -I too

from epyc import architectures, argtypes, bundle, cli, errors, hf_model, runtimes
from epyc.model_check import (
    REFUSAL_FIX,
    _auto_map,
    classify_kind,
    classify_template,
    endpoints_for,
    pick_registry,
    quantization_report,
    read_model,
    remote_code_needed,
    verdict,
)


def main(argv: Sequence[str] | None = None):
    epyc = bundle.load_epyc()
    p = cli.JsonArgumentParser(prog="scripts/check_model.py", description=__doc__.split("\n")[0])
    p.add_argument(
        "--model",
        "--model-id",
        dest="model",
        default=epyc["default_model"],
        help="Hub id or local folder (default: %(default)s); --model-id is the old name, kept for one release",
    )
    p.add_argument(
        "--revision", type=argtypes.revision_arg, default=None, help="branch, tag or commit (Hub ids; default main)"
    )
    p.add_argument(
        "--vllm-version",
        type=argtypes.version,
        default=epyc["vllm_version"],
        help="vLLM that will serve: stack.vllm from validate.py (default: the pinned %(default)s)",
    )
    p.add_argument(
        "--python", type=argtypes.executable, help="probe the registry of the vLLM installed for this interpreter"
    )
    p.add_argument("--image", type=argtypes.image_ref, help="probe the registry inside this local container image")
    p.add_argument(
        "--runtime",
        default="docker",
        choices=sorted(runtimes.CONTAINER_RUNTIMES),
        help="container runtime for --image (default docker)",
    )
    p.add_argument(
        "--hub-timeout",
        type=argtypes.float_in(0, 3600, lo_open=True),
        default=60,
        help="overall deadline for Hub requests, seconds",
    )
    args = p.parse_args(argv)

    notes: list[str] = []
    registry = pick_registry(args, notes)
    version = (registry or {}).get("vllm_version") or args.vllm_version
    if (
        registry
        and architectures.normalize_version(version) != architectures.normalize_version(args.vllm_version)
        and registry["source"].startswith("probe")
    ):
        notes.append(f"probed vLLM is {version}, not the --vllm-version {args.vllm_version} given")

    base = {"model": args.model, "revision": args.revision}
    try:
        files = hf_model.resolve(args.model, args.revision)
        model = hf_model.with_deadline(lambda: read_model(files), args.hub_timeout, online=files.kind == "hub")
    except hf_model.Unreadable as why:
        tmpl = classify_template(None, None, None, readable=False)
        eps = endpoints_for("undetermined", tmpl["status"], epyc["model_support_policy"])
        return {
            **base,
            "source": "hub",
            "model_dir": None,
            "architectures": [],
            "kind": "undetermined",
            "supported": None,
            "registry_source": (registry or {}).get("source"),
            "vllm_version": version,
            "chat_template": tmpl,
            **eps,
            "message": f"{why.message}; support could not be determined -- proceed, the launch confirms",
            "fix": why.fix,
            "unreadable_reason": why.reason,
            "notes": notes,
        }, errors.EXIT_OK

    tmpl = classify_template(model["jinja"], model["tokenizer_config"], model["template_json"])
    kind, arch = classify_kind(model["architectures"], registry)
    eps = endpoints_for(kind, tmpl["status"], epyc["model_support_policy"])
    code, message = verdict(kind, arch, model["architectures"], tmpl, eps["launchable"], version)
    doc = {
        **base,
        "source": files.kind,
        "model_dir": str(files.folder) if files.kind == "local" else None,
        "architectures": model["architectures"],
        "kind": kind,
        "supported": None if kind == "undetermined" else code == 0,
        "registry_source": (registry or {}).get("source"),
        "vllm_version": version,
        "chat_template": tmpl,
        **eps,
        "message": message,
        "notes": notes,
        "quantization": quantization_report(model["quantization"], epyc),
    }
    if kind in epyc["model_support_policy"]["refuse_kinds"]:
        code = 1
    own = (registry or {}).get("own_code")
    remote = None if code else remote_code_needed(model["config"], model["tokenizer_config"], own)
    if not own and (_auto_map(model["config"], "AutoConfig") or (model["tokenizer_config"] or {}).get("auto_map")):
        notes.append(
            f"the repository ships code of its own (auto_map): whether vLLM {version} needs "
            "--trust-remote-code for it (never passed here) was not judged, as its registry "
            f"({(registry or {}).get('source')}) does not list what it loads by itself"
        )
    if remote:  # vLLM refuses it at load without --trust-remote-code, which this bundle never passes
        code = 1
        doc.update(
            supported=False,
            launchable=False,
            supported_endpoints=[],
            primary_endpoint=None,
            remote_code=remote,
            message=f"{arch} is in vLLM {version}'s registry, but {remote}: vLLM loads "
            "it only with --trust-remote-code, which this bundle does not pass (it would run the "
            "repository's Python)",
        )
        doc.update(
            error=doc["message"],
            fix="choose a model vLLM loads with its own code (the same model "
            "converted to a transformers architecture, or another), or serve it by hand, having read "
            "its code, with vllm serve --trust-remote-code",
        )
        return doc, code
    if code:  # the one contract: exit 1 carries error and fix
        doc.update(error=message, fix=REFUSAL_FIX.get(kind, REFUSAL_FIX["unsupported"]))
    return doc, code


if __name__ == "__main__":
    sys.exit(cli.run_main(main))
