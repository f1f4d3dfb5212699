#!/usr/bin/env python3
"""Which architectures a given vLLM serves, and as what: text / multimodal / pooling / unsupported.

    python3 scripts/vllm_registry.py --python /path/to/venv/bin/python   # probe a live install
    python3 scripts/vllm_registry.py --image IMAGE --runtime docker     # probe a local image
    ... --write                                                         # save data/vllm_registry/<version>.json

check_model.py uses the same probe on the runtime that will serve, and the saved snapshots when
no runtime can be probed. Exit 0 with the registry; exit 1 with {"error", "fix"}.
"""

import json
import os
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the epyc package beside it, under python -I too

from epyc import cli, errors
from epyc.argtypes import normalize_version
from epyc.errors import ScriptError
from epyc.facts import runtimes
from epyc.facts.architectures import SNAPSHOT_DIR, add_probe_args, probe_argv, probe_live


def main(argv: list[str] | None = None):
    p = cli.JsonArgumentParser(prog="scripts/vllm_registry.py", description=__doc__.split("\n")[0])
    add_probe_args(p, p.add_mutually_exclusive_group(required=True))
    p.add_argument("--write", action="store_true", help="save as data/vllm_registry/<version>.json")
    args = p.parse_args(argv)
    engine = runtimes.shell_docker_engine() if args.image and args.runtime == "docker" else None
    reg = probe_live(*probe_argv(args.python, args.image, args.runtime, engine))
    version = normalize_version(reg["vllm_version"])
    if args.write:
        if not version:
            raise ScriptError(
                "the registry has no vLLM version to name the snapshot",
                "probe an install whose vllm.__version__ is set",
            )
        if not reg["architectures"]:
            raise ScriptError(
                f"{reg['source']} lists no architectures: not written over the snapshot",
                "probe a vLLM install that has its model registry",
            )
        SNAPSHOT_DIR.mkdir(parents=True, exist_ok=True)
        snap = {k: reg[k] for k in ("architectures", "own_code") if k in reg}
        snap.update(vllm_version=version, generated_from=reg["source"].split(":", 1)[0])
        target = SNAPSHOT_DIR / f"{version}.json"
        scratch = target.with_name(f".{target.name}.tmp")
        try:  # whole or not at all: a full disk must not leave the bundle's snapshot cut short
            scratch.write_text(json.dumps(snap, indent=1, sort_keys=True) + "\n")
            os.replace(scratch, target)
        except OSError as exc:
            scratch.unlink(missing_ok=True)
            raise errors.os_error(exc, f"cannot write {target} (the snapshot there is unchanged)")
        errors.log(f"wrote data/vllm_registry/{version}.json ({len(reg['architectures'])} architectures)")
    return {**reg, "counts": dict(Counter(reg["architectures"].values()))}, errors.EXIT_OK


if __name__ == "__main__":
    sys.exit(cli.run_main(main))
