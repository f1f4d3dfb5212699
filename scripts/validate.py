#!/usr/bin/env python3
"""Is this host ready to serve: a runtime, a zentorch-capable CPU, a compatible stack, a cache, a port?

    python3 scripts/validate.py --detect detect.json               # the CPU as detect.py saw it
    python3 scripts/validate.py --detect detect.json --python PY   # the host path's interpreter
    python3 scripts/validate.py --detect detect.json --stock       # stock vLLM CPU, after the user's OK

Without --detect the CPU is the run folder's detect.json (--run), else read from this host. Runtime order: docker
(daemon answers) > podman (can run a container) > the host path (the stack imports in --python; default: the
setup_host_stack.py venv of the chosen backend). sudo docker only when asked for (--runtime "sudo docker", sudo -n).
Nothing here pulls, installs or escalates. Exit 0 when there is no error (`ready`); exit 1 otherwise, with the
errors and their fixes.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the epyc package beside it, under python -I too

from epyc import argtypes, bundle, cli, errors, jsonio
from epyc.argtypes import parse_bool
from epyc.deployments import runs
from epyc.errors import ScriptError
from epyc.facts import cpuid, remote_host, validation
from epyc.facts.validation import cpu_facts, default_python, deferred_gather, gather, verdict


def interpreter(flag: str | None, epyc: dict, stock: bool) -> str:
    """--python made absolute, as launch plans need it (another folder runs it later), but not resolved: a venv's
    python is a link to the base interpreter, and only the link's path finds the venv's packages."""
    if flag is None:
        return default_python(epyc, stock)
    python = os.path.abspath(jsonio.user_path(flag, "--python"))
    if not argtypes.is_executable(python):
        what = "does not exist" if not Path(python).exists() else "is not an executable file"
        fix = "pass the interpreter of the env that has the stack (python3 scripts/setup_host_stack.py creates one; --stock for stock vLLM)"
        raise ScriptError(f"--python {flag} {what}", fix)
    return python


def main(argv: list[str] | None = None):
    epyc = bundle.load_epyc()
    p = cli.JsonArgumentParser(prog="scripts/validate.py", description=__doc__.split("\n")[0])
    p.add_argument(
        "--detect", type=argtypes.nonempty, help="detect.py's JSON for this host (default: read the CPU here)"
    )
    p.add_argument(
        "--image",
        type=argtypes.image_ref,
        help="container image (default: the pinned one, or the stock image with --stock)",
    )
    generations = sorted({g["name"] for g in epyc["generations"]})
    p.add_argument(
        "--generation", choices=generations, help="override epyc_generation (default: from --detect or this host)"
    )
    p.add_argument("--avx512", type=parse_bool, help="override avx512 (default: from --detect or this host)")
    p.add_argument(
        "--python",
        type=argtypes.nonempty,
        help="interpreter of the host path (default: the setup_host_stack.py venv of the backend if it exists, else this one)",
    )
    runtimes = ["auto", "docker", "podman", "sudo docker", "host"]
    p.add_argument("--runtime", choices=runtimes, default="auto", help="force a runtime instead of the detection order")
    p.add_argument("--stock", action="store_true", help="the stock vLLM CPU path (no zentorch), user confirmed")
    p.add_argument("--port-start", type=argtypes.int_in(1, 65535), default=epyc["serve"]["default_port"])
    runs.add_run_arg(p)
    runs.keep_before_parsing(argv, "validate")
    args = p.parse_args(argv)
    folder = runs.keep(args, "validate")
    image = args.image or (epyc["stock_image"]["image"] if args.stock else epyc["container"]["image"])
    if args.detect:
        detected = jsonio.read_json_input(args.detect, "detect")
        why = f"--detect {args.detect} is not detect.py's output"
        jsonio.check_schema(detected, "detect", why, "pass the unmodified stdout of detect.py")
    else:  # the run folder's detect.json, else this host read now
        detected = runs.earlier(folder, "detect") or cpuid.report(remote_host.gather_from_args(None, None), epyc)
    cpu = cpu_facts(detected, args.generation, args.avx512)
    remote = remote_host.is_another_host(detected.get("target", "localhost"))
    python = interpreter(args.python, epyc, args.stock) if args.python or not remote else None  # None: the host's
    home = detected.get("home") or validation.SPEC_HOME
    gathered = deferred_gather(args, epyc, image, python, home) if remote else gather(args, epyc, image, python)
    doc = verdict(cpu, detected, args, epyc, gathered)
    if remote and not detected.get("home"):  # a home dropped (not a plain path) or never read is said, not silent
        doc["deferred"].append(f"home (assumed {home})")
        doc["warnings"].append(validation.issue("home", "warning", *epyc["remote_home"]))
    return doc, errors.EXIT_OK if doc["ready"] else errors.EXIT_FAIL


if __name__ == "__main__":
    sys.exit(cli.run_main(main))
