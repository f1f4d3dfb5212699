"""The bundle's own files: data/epyc.json and the units its documents use."""

from __future__ import annotations

import json
from pathlib import Path

from epyc.errors import ScriptError

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPTS = ROOT / "scripts"
DATA_DIR = ROOT / "data"
# distribution -> import name; py-cpuinfo names the CPU of a machine without /proc (a laptop planning a server)
BUNDLE_DEPS = {
    **{d: d for d in ("huggingface_hub", "psutil", "requests", "jsonschema", "cryptography")},
    "py-cpuinfo": "cpuinfo",
}
BUNDLE_VENV = ROOT / ".venv"
REEXEC_MARK = "EPYC_SKILL_BUNDLE_VENV"
EPYC_JSON = DATA_DIR / "epyc.json"

GIB = 1024**3

# the five step documents a plan is rendered from, in the order they run
INPUT_SCRIPTS = ("detect", "validate", "check_model", "estimate_memory", "cpu_tune")
EPYC_SCHEMA_VERSION = 1


def load_epyc(path: Path = EPYC_JSON) -> dict:
    fix = "restore data/epyc.json from the repository (git checkout data/epyc.json)"
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ScriptError(f"cannot read {path}: {exc}", fix)
    if not isinstance(doc, dict) or doc.get("schema_version") != EPYC_SCHEMA_VERSION:
        raise ScriptError(f"{path} is not schema_version {EPYC_SCHEMA_VERSION} of the pinned facts", fix)
    return doc


def gb(n_bytes: float, digits: int = 2) -> float:
    """GiB to `digits` places, or to 3 significant figures below that: a small model is never 0.0."""
    value = n_bytes / GIB
    return round(value, digits) if value == 0 or abs(value) >= 10**-digits else float(f"{value:.3g}")
