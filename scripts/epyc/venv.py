"""The bundle's own venv (.venv): its dependencies, made by bootstrap.py and re-entered by every script."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from . import bundle, errors, masking, subproc
from .bundle import ROOT
from .errors import ScriptError

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
    """Each distribution's version in `python`, None where it has none. Checked by hand, not by schema: this
    runs before jsonschema is installed (bootstrap on a bare python3)."""
    found, why = subproc.run_probe([python], VERSIONS_CODE % (dists,), "@@DEPS@@", timeout=60)
    if found is not None and not (
        set(found) == set(dists) and all(isinstance(found[d], (str, type(None))) for d in dists)
    ):
        found, why = None, "its answer is not a version per distribution"
    if found is None:
        raise ScriptError(f"cannot query {python}: {why}", f"delete {BUNDLE_VENV} and run bootstrap.py again")
    return found


def ensure_venv(python: Path, test: bool) -> list[str]:
    """Create the bundle venv if needed and pip-install the bundle (its dependencies) into it."""
    actions = []
    if not python.exists():
        errors.log(f"bootstrap: creating {BUNDLE_VENV}")
        res = subproc.run(
            [sys.executable, "-m", "venv", str(BUNDLE_VENV)], timeout=300, env=subproc.no_python_settings()
        )
        if not res.ok:
            raise ScriptError(
                f"cannot create {BUNDLE_VENV}: {masking.clip(res.stderr.strip(), 300, tail=True) or res.failure}",
                "install python3-venv (apt-get install python3-venv), then run bootstrap.py again",
            )
        actions.append(f"created {BUNDLE_VENV}")
    target = f"{bundle.ROOT}[test]" if test else str(bundle.ROOT)
    errors.log(f"bootstrap: pip install -e {target}")
    res = subproc.run(
        [str(python), "-m", "pip", "install", "-q", "-e", target],
        timeout=PIP_TIMEOUT_S,
        progress="bootstrap: pip install",
        env=subproc.no_python_settings(),
    )
    if not res.ok:
        raise ScriptError(
            f"pip install failed: {masking.clip(res.stderr.strip(), 400, tail=True) or res.failure}",
            "check access to the package index (pip config), then run bootstrap.py again",
        )
    actions.append("installed the bundle's dependencies" + (" and the test extra" if test else ""))
    return actions


# The bundle's own dependencies (import names) and the venv scripts/bootstrap.py makes for them.
BUNDLE_DEPS = {
    "huggingface_hub": "huggingface_hub",
    "psutil": "psutil",
    "requests": "requests",
    "jsonschema": "jsonschema",
}
BUNDLE_VENV = ROOT / ".venv"
_REEXEC_MARK = "EPYC_SKILL_BUNDLE_VENV"


def missing_deps() -> list[str]:
    """Distribution names of the bundle's dependencies this interpreter cannot import."""
    import importlib.util

    return [dist for mod, dist in BUNDLE_DEPS.items() if importlib.util.find_spec(mod) is None]


def use_bundle_venv() -> None:
    """`python3 scripts/NAME.py` works in any shell once scripts/bootstrap.py has run: when this
    interpreter lacks the dependencies and the bundle's venv has them, run the same command there."""
    venv_python = BUNDLE_VENV / "bin" / "python"
    if (
        os.environ.get(_REEXEC_MARK)
        or not venv_python.exists()
        or Path(sys.prefix).resolve() == BUNDLE_VENV.resolve()
        or Path(sys.argv[0] or ".").resolve().parent != ROOT / "scripts"
        or not missing_deps()
    ):
        return
    os.environ[_REEXEC_MARK] = "1"
    os.execv(str(venv_python), [str(venv_python), *sys.argv])
