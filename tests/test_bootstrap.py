"""scripts/bootstrap.py: its contract and its decisions."""


def test_no_script_leaves_a_file_a_pipe_or_a_detached_server_to_its_finaliser(script, tmp_path):
    """PYTHONWARNINGS=error (some CI shells) turned each unclosed probe pipe into a traceback on stderr.
    conftest runs every script with ResourceWarning as an error; this is the audit's own repro."""
    r = script("bootstrap.py", "--check", env={"PYTHONWARNINGS": "error"})
    assert r.code == 0 and "Exception ignored" not in r.stderr and "ResourceWarning" not in r.stderr


def test_a_bare_python_is_told_what_is_missing_not_that_bootstrap_needs_it(tmp_path):
    """Step 0 runs on a python3 with none of the dependencies: bootstrap's own checks use the standard library
    (it once validated pip's answer with jsonschema, the package it was about to install)."""
    import json
    import shutil
    import subprocess
    import sys

    from conftest import ROOT

    bundle = tmp_path / "bundle"  # a copy without a .venv: nothing to re-run in
    for part in ("scripts", "data", "pyproject.toml"):
        (shutil.copytree if (ROOT / part).is_dir() else shutil.copy)(ROOT / part, bundle / part)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=120)
    r = subprocess.run(
        [str(tmp_path / "bare/bin/python"), "scripts/bootstrap.py", "--check"],
        cwd=bundle,
        capture_output=True,
        text=True,
        timeout=120,
    )
    doc = json.loads(r.stdout)
    missing = [
        "huggingface_hub",
        "psutil",
        "requests",
        "jsonschema",
        "cryptography",
        "py-cpuinfo",
    ]  # distributions, as pip names them
    assert r.returncode == 1 and doc["missing"] == missing, doc
    assert doc["fix"] == "run python3 scripts/bootstrap.py without --check"
