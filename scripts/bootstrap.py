#!/usr/bin/env python3
"""Step 0: make the bundle's own Python dependencies available, and check them.

    python3 scripts/bootstrap.py            # this interpreter if it has them, else the bundle's .venv
    python3 scripts/bootstrap.py --test     # also the test extra (pytest, hypothesis, ...) for tests/run.sh
    python3 scripts/bootstrap.py --check    # only report; install nothing

Uses only the standard library, so it runs on a bare python3 >= 3.10. The dependencies are the ones pyproject.toml
declares (huggingface_hub, psutil, requests, jsonschema, py-cpuinfo, cryptography), installed with pip into <bundle>/.venv; after
that every `python3 scripts/NAME.py` re-runs itself in that venv when the interpreter it was started with lacks them,
so no activation is needed. Exit 0 with the interpreter and versions; exit 1 with {"error", "fix"}.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the epyc package beside it, under python -I too

from epyc import cli, errors, jsonio
from epyc.errors import ScriptError
from epyc.facts import venv
from epyc.facts.venv import ensure_venv, installed_versions


def main(argv: list[str] | None = None):
    p = cli.JsonArgumentParser(prog="scripts/bootstrap.py", description=__doc__.split("\n")[0])
    p.add_argument("--test", action="store_true", help="also install the test extra (pytest, hypothesis, ...)")
    p.add_argument("--check", action="store_true", help="only report; install nothing")
    args = p.parse_args(argv)
    dists = list(venv.BUNDLE_DEPS) + (["pytest", "hypothesis", "openai", "skills-ref"] if args.test else [])
    venv_python = venv.BUNDLE_VENV / "bin" / "python"
    here = installed_versions(sys.executable, dists)
    if all(here.values()) and not args.test:
        python, versions, actions = sys.executable, here, []
    else:
        actions = [] if args.check else ensure_venv(venv_python, args.test)
        python = str(venv_python)
        versions = installed_versions(python, dists) if venv_python.exists() else dict.fromkeys(dists)
    missing = [d for d, v in versions.items() if not v]
    in_venv = jsonio.real_path(Path(python).parent.parent) == jsonio.real_path(venv.BUNDLE_VENV)
    doc = {
        "ready": not missing,
        "python": python,
        "venv": str(venv.BUNDLE_VENV) if in_venv else None,
        "packages": versions,
        "missing": missing,
        "actions": actions,
    }
    if missing:
        fix = (
            "run python3 scripts/bootstrap.py without --check"
            if args.check
            else "check pip's output above and the package index"
        )
        raise ScriptError(f"missing: {', '.join(missing)}", fix, **doc)
    return doc, errors.EXIT_OK


if __name__ == "__main__":
    sys.exit(cli.run_main(main))
