#!/usr/bin/env python3
"""Step 0: make the bundle's own Python dependencies available, and check them.

    python3 scripts/bootstrap.py            # this interpreter if it has them, else the bundle's .venv
    python3 scripts/bootstrap.py --test     # also the test extra (pytest, hypothesis, ...) for tests/run.sh
    python3 scripts/bootstrap.py --check    # only report; install nothing

Uses only the standard library, so it runs on a bare python3 >= 3.10. The dependencies are the ones
pyproject.toml declares (huggingface_hub, psutil, py-cpuinfo, requests, jsonschema), installed with pip into
<bundle>/.venv; after that every `python3 scripts/NAME.py` re-runs itself in that venv when the
interpreter it was started with lacks them, so no activation is needed.
Exit 0 with the interpreter and versions; exit 1 with {"error", "fix"}.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import ScriptError  # noqa: E402

PIP_TIMEOUT_S = 900
VERSIONS_CODE = r"""
import json, importlib.metadata as md
out = {}
for dist in %r:
    try:
        out[dist] = md.version(dist)
    except md.PackageNotFoundError:
        out[dist] = None
print("@@DEPS@@" + json.dumps(out))
"""


def installed_versions(python: str, dists: list[str]) -> dict:
    found, why = common.run_probe([python], VERSIONS_CODE % (dists,), "@@DEPS@@", timeout=60,
                                  shape={"type": "object", "additionalProperties": {"type": ["string", "null"]}})
    if found is None:
        raise ScriptError(f"cannot query {python}: {why}", f"delete {common.BUNDLE_VENV} and run bootstrap.py again")
    return found


def ensure_venv(python: Path, test: bool) -> list[str]:
    """Create the bundle venv if needed and pip-install the bundle (its dependencies) into it."""
    actions = []
    if not python.exists():
        common.log(f"bootstrap: creating {common.BUNDLE_VENV}")
        res = common.run([sys.executable, "-m", "venv", str(common.BUNDLE_VENV)], timeout=300)
        if not res.ok:
            raise ScriptError(f"cannot create {common.BUNDLE_VENV}: {common.clip(res.stderr.strip(), 300, tail=True) or res.failure}",
                              "install python3-venv (apt-get install python3-venv), then run bootstrap.py again")
        actions.append(f"created {common.BUNDLE_VENV}")
    target = f"{common.ROOT}[test]" if test else str(common.ROOT)
    common.log(f"bootstrap: pip install -e {target}")
    res = common.run([str(python), "-m", "pip", "install", "-q", "-e", target], timeout=PIP_TIMEOUT_S,
                     progress="bootstrap: pip install")
    if not res.ok:
        raise ScriptError(f"pip install failed: {common.clip(res.stderr.strip(), 400, tail=True) or res.failure}",
                          "check access to the package index (pip config), then run bootstrap.py again")
    actions.append("installed the bundle's dependencies" + (" and the test extra" if test else ""))
    return actions


def main(argv: Sequence[str] | None = None):
    p = common.JsonArgumentParser(prog="scripts/bootstrap.py", description=__doc__.split("\n")[0])
    p.add_argument("--test", action="store_true", help="also install the test extra (pytest, hypothesis, ...)")
    p.add_argument("--check", action="store_true", help="only report; install nothing")
    args = p.parse_args(argv)
    dists = list(common.BUNDLE_DEPS.values()) + (["pytest", "hypothesis", "openai", "skills-ref"]
                                                 if args.test else [])
    venv_python = common.BUNDLE_VENV / "bin" / "python"
    here = installed_versions(sys.executable, dists)
    actions: list[str] = []
    if all(here.values()) and not args.test:
        python, versions = sys.executable, here
    else:
        if not args.check:
            actions = ensure_venv(venv_python, args.test)
        python = str(venv_python)
        versions = installed_versions(python, dists) if venv_python.exists() else {d: None for d in dists}
    missing = [d for d, v in versions.items() if not v]
    in_venv = common.real_path(Path(python).parent.parent) == common.real_path(common.BUNDLE_VENV)
    doc = {"ready": not missing, "python": python, "venv": str(common.BUNDLE_VENV) if in_venv else None, "packages": versions, "missing": missing, "actions": actions}
    if missing:
        raise ScriptError(f"missing: {', '.join(missing)}", "run python3 scripts/bootstrap.py without --check"
                          if args.check else "check pip's output above and the package index", **doc)
    return doc, common.EXIT_OK


if __name__ == "__main__":
    sys.exit(common.run_main(main))
