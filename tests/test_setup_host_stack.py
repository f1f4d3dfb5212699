"""scripts/setup_host_stack.py: its contract and its decisions."""

import json
import sys
from pathlib import Path

from conftest import ROOT
from epyc import bundle


def test_setup_host_stack_installs_only_into_a_folder_it_made(script, tmp_path):
    """--venv /usr/local, a conda prefix or the bundle's own .venv: pip install, uninstall and a dist-info
    went into any folder holding bin/python. The recording interpreter shows nothing ran but the probe."""
    prefix = tmp_path / "someone-elses"
    (prefix / "bin").mkdir(parents=True)
    calls = tmp_path / "calls.log"
    (prefix / "bin" / "python").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexit 1\n')
    (prefix / "bin" / "python").chmod(0o755)
    r = script("setup_host_stack.py", "--stock", "--venv", str(prefix))  # a prefix such as /usr/local
    assert r.code == 1 and "it is not a venv" in r.doc["error"] and "--check" in r.doc["fix"], r.doc
    (prefix / "pyvenv.cfg").write_text("home = /usr/bin\n")  # a venv, someone else's
    r = script("setup_host_stack.py", "--stock", "--venv", str(prefix))
    assert r.code == 1 and "did not create" in r.doc["error"] and "--check" in r.doc["fix"], r.doc
    assert "pip" not in calls.read_text() and not list(prefix.rglob("*.dist-info"))
    checked = script("setup_host_stack.py", "--stock", "--check", "--venv", str(prefix))
    assert checked.code == 1 and "not ready" in checked.doc["error"]  # --check inspects any interpreter
    # and its fix never advises the install that would be refused there
    assert "run without --check" not in checked.doc["fix"] and "did not create" in checked.doc["fix"], checked.doc
    own = script("setup_host_stack.py", "--stock", "--check", "--venv", str(Path(__file__).parents[1] / ".venv"))
    assert own.code == 1 and "the bundle's own .venv" in own.doc["fix"] and "new folder" in own.doc["fix"], own.doc


def test_no_script_puts_its_venv_or_run_folder_under_the_current_folder(script, tmp_path):
    # --stock: the venv's name is the point here, not whether zentorch would run on this runner's CPU
    r = script("setup_host_stack.py", "--stock", "--check", env={"XDG_CACHE_HOME": "rel-cache", "HOME": str(tmp_path)})
    assert r.code == 1 and f"{tmp_path}/.cache/serving-llms-on-epyc/venv-vllm-" in r.doc["error"], r.doc
    r = script("launch.py", "up", "--model", "Qwen/Qwen3-0.6B", "--yes", env={"XDG_CACHE_HOME": "", "HOME": "rel-home"})
    assert r.code == 1 and "HOME 'rel-home' is not an absolute path" in r.doc["error"], r.doc
    assert not (ROOT / "rel-cache").exists() and not (ROOT / "serving-llms-on-epyc").exists()


# ---- F5: whose interpreter a marked venv holds is settled before pip runs with it
def test_a_marked_venv_wrapping_another_interpreter_is_refused_before_pip(script, tmp_path):
    from epyc.facts import hoststack

    venv = tmp_path / "marked"
    (venv / "bin").mkdir(parents=True)
    (venv / hoststack.OWNER_FILE).write_text("x")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    calls = tmp_path / "calls.log"
    # a wrapper reads no pyvenv.cfg: it is the suite's interpreter, whose purelib is outside the venv. Should
    # the check regress, pip is recorded and refused here: it must never install into the suite's own venv
    (venv / "bin" / "python").write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n[ "$1 $2" = "-m pip" ] && exit 1\nexec {sys.executable} "$@"\n'
    )
    (venv / "bin" / "python").chmod(0o755)
    r = script("setup_host_stack.py", "--stock", "--venv", str(venv), timeout=300)
    assert r.code == 1 and "outside the venv" in r.doc["error"], r.doc
    assert "-m pip" not in calls.read_text() and not list(venv.rglob("*.dist-info"))


def test_a_relative_venv_is_made_absolute_never_an_option(tmp_path):
    """F3: `--venv=--help` reached `python -m venv --help` as its option (help printed, exit 0, "created")."""
    import json
    import subprocess
    import sys

    from conftest import ROOT

    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "setup_host_stack.py"), "--stock", "--venv=--help", "--check"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and doc["venv"] == str(tmp_path / "--help") and doc["python"].startswith(str(tmp_path))
    assert not (tmp_path / "--help").exists()


def test_a_bare_python3_runs_the_scripts_through_the_bundle_venv(tmp_path):
    """SKILL.md's step 0 made .venv; a python3 without the dependencies (a fresh venv here) then runs
    `python3 scripts/detect.py` as written: the script re-runs itself in the bundle venv."""
    import subprocess
    import sys

    from conftest import ROOT, SCRIPTS

    assert (ROOT / ".venv" / "bin" / "python").exists(), "tests/run.sh runs scripts/bootstrap.py first"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=120)
    bare = tmp_path / "bare" / "bin" / "python3"
    assert subprocess.run([str(bare), "-c", "import psutil"], capture_output=True, timeout=60).returncode != 0
    res = subprocess.run([str(bare), str(SCRIPTS / "detect.py")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout)["logical_cores"] >= 1
    boot = subprocess.run(
        [str(bare), str(SCRIPTS / "bootstrap.py"), "--check"], capture_output=True, text=True, timeout=60
    )
    doc = json.loads(boot.stdout)
    assert boot.returncode == 0 and doc["ready"] and doc["venv"] == str(ROOT / ".venv") and not doc["missing"]


def test_image_check_reports_an_image_not_built_with_the_step_that_builds_it(script, tmp_path):
    """--image --check builds nothing: without the image on the engine (here: no engine answers) it is not ready,
    and the fix is the same command without --check."""
    env = {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    r = script("setup_host_stack.py", "--image", "--check", env=env)
    image = bundle.load_epyc()["stacks"]["local_image"]["image"]
    assert r.code == 1 and r.doc["ready"] is False and r.doc["image"] == image and r.doc["actions"] == [], r.doc
    assert r.doc["error"] == f"the image {image} is not ready: not built"
    assert r.doc["fix"] == "run without --check (it builds the image)"
