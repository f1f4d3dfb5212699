"""The bundle's own venv (.venv): its dependencies, made by bootstrap.py and re-entered by every script."""

from __future__ import annotations

import sys
from pathlib import Path

from epyc import errors, masking, subproc
from epyc.bundle import BUNDLE_DEPS as BUNDLE_DEPS
from epyc.bundle import BUNDLE_VENV as BUNDLE_VENV
from epyc.bundle import ROOT
from epyc.errors import ScriptError

# The bundle's own dependencies (their import names are their distribution names) and the venv for them.
PIP_TIMEOUT_S = 900
# each distribution's version into `out`, None where it has none (a %-template: the tuple of names)
VERSIONS_CODE = r"""
import json, importlib.metadata as md
out = {}
for dist in %r:
    try:
        out[dist] = md.version(dist)
    except md.PackageNotFoundError:
        out[dist] = None
"""


def installed_versions(python: str, dists: list[str]) -> dict:
    """Each distribution's version in `python`, None where it has none. Checked by hand, not by schema: this
    runs before jsonschema is installed (bootstrap on a bare python3)."""
    code = VERSIONS_CODE % (dists,) + 'print("@@DEPS@@" + json.dumps(out))\n'
    found, why = subproc.run_probe([python], code, "@@DEPS@@", timeout=60)
    if found is not None and not (
        set(found) == set(dists) and all(isinstance(found[d], (str, type(None))) for d in dists)
    ):
        found, why = None, "its answer is not a version per distribution"
    if found is None:
        raise ScriptError(f"cannot query {python}: {why}", f"delete {BUNDLE_VENV} and run bootstrap.py again")
    return found


def make_venv(path: Path, by: str, fix: str) -> None:
    """`python -m venv PATH` with this interpreter; `by` names the script in the progress line."""
    errors.log(f"{by}: creating {path}")
    res = subproc.run([sys.executable, "-m", "venv", str(path)], timeout=300, env=subproc.no_python_settings())
    if not res.ok:
        why = masking.clip(res.stderr.strip(), 300, tail=True) or res.failure
        raise ScriptError(f"cannot create a venv at {path}: {why}", fix)


def pip(python: Path, args: list[str], timeout: float, label: str | None = None) -> subproc.RunResult:
    """`python -m pip ARGS`, bounded; `label`: a progress line on stderr, repeated while pip runs."""
    if label:
        errors.log(label)
    progress = label and label.split(" (")[0]
    argv = [str(python), "-m", "pip", *args]
    return subproc.run(argv, timeout=timeout, progress=progress, env=subproc.no_python_settings())


def pip_failed(res: subproc.RunResult) -> str:
    return f"pip install failed: {masking.clip(res.stderr.strip(), 400, tail=True) or res.failure}"


def ensure_venv(python: Path, test: bool) -> list[str]:
    """Create the bundle venv if needed and pip-install the bundle (its dependencies) into it."""
    actions = []
    if not python.exists():
        make_venv(
            BUNDLE_VENV, "bootstrap", "install python3-venv (apt-get install python3-venv), then run bootstrap.py again"
        )
        actions.append(f"created {BUNDLE_VENV}")
    target = f"{ROOT}[test]" if test else str(ROOT)
    res = pip(python, ["install", "-q", "-e", target], PIP_TIMEOUT_S, f"bootstrap: pip install -e {target}")
    if not res.ok:
        raise ScriptError(
            pip_failed(res), "check access to the package index (pip config), then run bootstrap.py again"
        )
    actions.append("installed the bundle's dependencies" + (" and the test extra" if test else ""))
    return actions
