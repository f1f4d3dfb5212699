"""Shared test helpers: run a script as a user would, check its one JSON document against its schema."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
SCHEMAS = ROOT / "data" / "schemas"
sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import sysroots  # noqa: E402


@dataclass
class Result:
    code: int
    doc: object
    stdout: str
    stderr: str


def schema_for(script: str, doc) -> dict | None:
    if isinstance(doc, dict) and "error" in doc:
        name = "error"
    else:
        name = Path(script).stem
    path = SCHEMAS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def validate(script: str, doc) -> None:
    import jsonschema
    schema = schema_for(script, doc)
    if schema is not None:
        jsonschema.validate(doc, schema)


def run_script(script: str, *args: str, env: dict | None = None, timeout: float = 120,
               stdin: str | None = None, check_schema: bool = True) -> Result:
    """Run `python3 scripts/NAME.py ARGS` and parse its stdout, which must be exactly one JSON document."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, str(SCRIPTS / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, input=stdin, cwd=ROOT)
    # our scripts never crash with a traceback (a quoted server log inside the JSON is fine)
    assert "Traceback (most recent call last)" not in proc.stderr, proc.stderr[-3000:]
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"{script} stdout is not one JSON document:\n{proc.stdout}\n--stderr--\n{proc.stderr}")
    if check_schema:
        validate(script, doc)
    if isinstance(doc, dict) and "error" in doc:
        assert doc.get("fix"), f"error without a fix: {doc}"
        assert proc.returncode != 0, f"error document with exit 0: {doc}"
    return Result(proc.returncode, doc, proc.stdout, proc.stderr)


@pytest.fixture
def script():
    return run_script


@pytest.fixture
def make_sysroot(tmp_path):
    def _make(name: str, **overrides) -> Path:
        spec = sysroots.HOSTS[name]
        if overrides:
            from dataclasses import replace
            spec = replace(spec, **overrides)
        return sysroots.build(tmp_path / name, spec)
    return _make


def detect_file(tmp_path: Path, host: str = "genoa_9654_2s_smt") -> Path:
    """detect.py's JSON for a fixture host, saved to a file: what validate.py --detect reads, so a test of
    runtimes and stacks does not depend on the CPU this session drew (Genoa, Turin or a Xeon)."""
    root = sysroots.build(tmp_path / f"sysroot-{host}", sysroots.HOSTS[host])
    r = run_script("detect.py", "--sysroot", str(root))
    assert r.code == 0, r.doc
    out = tmp_path / f"detect-{host}.json"
    out.write_text(r.stdout)
    return out
