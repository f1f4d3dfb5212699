"""Every script's contract: one JSON document on stdout, exit 0/1 with error + fix, never a traceback."""

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import CASES, ROOT, _pids, container_plan, load_docs, plan_from
from epyc import bundle, cli, errors, jsonio
from epyc.errors import ScriptError
from model_fixtures import FIXTURES


def test_the_env_format_to_a_full_disk_is_exit_1_without_a_traceback():
    import subprocess
    import sys

    from epyc import bundle

    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, str(bundle.ROOT / "scripts" / "cpu_tune.py"), "--format", "env"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr


# ---- F6: '-' and a folder in the plan's state dir as an output folder
@pytest.mark.parametrize(
    "tool,args",
    [
        ("detect.py", ["--spec", "9654", "--ram-gb-per-socket", "384", "--save-sysroot", "-"]),
        ("bench.py", ["--plan", "PLAN", "--out", "-"]),
    ],
)
def test_an_output_folder_named_dash_is_refused(script, inputs, rt, tmp_path, tool, args):
    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    here = tmp_path / "cwd"
    here.mkdir()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / tool), *[str(plan_file) if a == "PLAN" else a for a in args]],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=here,
        env={**os.environ, **env},
    )
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and "'-'" in doc["error"] and doc["fix"], doc
    assert not list(here.iterdir())


def test_progress_that_cannot_be_written_does_not_fail_the_run(monkeypatch):
    """stderr to /dev/full: `up` said "No space left on device: free space on that disk" and exited 1 at its
    first progress line. Progress is best effort; the document on stdout is the result."""
    from epyc import errors

    full = open("/dev/full", "w")
    try:
        monkeypatch.setattr(sys, "stderr", full)
        errors.log("up: detect")  # (up's first line) raised OSError ENOSPC
    finally:
        try:
            full.close()  # (its buffer still holds the line: the close's flush is refused too)
        except OSError:
            pass


# ---- F3: a document naming a program or a library to run
@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda d: d["cpu_tune"].update(host_pin_argv=["sh", "-c", "touch /tmp/PWNED"]), "host_pin_argv"),
        (
            lambda d: d["cpu_tune"].update(host_pin_argv=["numactl", "--cpunodebind=0", "--membind=0;id"]),
            "host_pin_argv",
        ),
        (lambda d: d["cpu_tune"].update(container_cpuset_argv=["--privileged", "--cpuset-mems=0"]), "container_cpuset"),
        (lambda d: d["validate"].update(path="host", runtime="host", image=None, python="-x/python"), "absolute"),
        (lambda d: d["validate"].update(path="host", runtime="host", image=None, python="python"), "absolute"),
        (
            lambda d: d["validate"].update(
                path="host",
                runtime="host",
                image=None,
                python=sys.executable,
                ld_preload={"value": "/tmp/x/libtcmalloc_minimal.so.4", "note": None},
            ),
            "LD_PRELOAD",
        ),
        (
            lambda d: d["validate"].update(
                path="host",
                runtime="host",
                image=None,
                python=sys.executable,
                ld_preload={"value": "/usr/lib/../../tmp/libtcmalloc_minimal.so.4", "note": None},
            ),
            "LD_PRELOAD",
        ),
    ],
)
def test_a_document_never_names_a_program_or_library_that_runs(inputs, edit, needle):
    docs = load_docs(inputs)
    edit(docs)
    with pytest.raises(ScriptError, match=needle):
        plan_from(docs)


def test_emit_never_prints_invalid_json(capsys):
    cli.emit({"ok": True, "x": float("nan")})
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and "NaN" in doc["error"] and doc["fix"]


def test_a_document_emit_cannot_print_exits_1(capsys):
    code = cli.run_main(lambda argv: ({"figure": float("inf")}, errors.EXIT_OK), [])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["ok"] is False and "Infinity" in doc["error"]


def test_a_document_past_its_own_schema_is_refused_when_printed(capsys, monkeypatch, tmp_path):
    """run_main checks a success document against data/schemas/<script>.json before it is printed."""
    code = compile("def main(argv):\n    return {'chosen_socket': 10 ** 9}, 0\n", "/x/cpu_tune.py", "exec")
    ns: dict = {}
    exec(code, ns)
    assert cli.run_main(ns["main"], []) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["error"].startswith("cpu_tune.py read facts it cannot describe") and doc["fix"]


# ---- lesser: digits that are not ASCII
@pytest.mark.parametrize(
    "args",
    [
        ["check_model.py", "--model", "Qwen/Qwen3-0.6B", "--vllm-version", "\u0660.\u0663\u0662.\u0660"],
        ["detect.py", "--host", "box:\u0662\u0662"],
    ],
)
def test_digits_of_other_scripts_are_not_numbers(script, args):
    r = script(*args)
    assert r.code == 1 and r.doc["error"], r.doc


def test_a_terminated_script_takes_its_children_with_it(tmp_path):
    """An agent's tool timeout sends SIGTERM: the probe validate.py started (in a session of its own, so a
    timeout can kill its group) used to live on; now it goes, and the JSON says interrupted."""
    import subprocess

    marker = f"audit7-{os.getpid()}"
    slow = tmp_path / "python"
    slow.write_text(f"#!/bin/bash\nexec -a {marker} sleep 300\n")
    slow.chmod(0o755)
    proc = subprocess.Popen(
        [sys.executable, str(bundle.ROOT / "scripts" / "validate.py"), "--python", str(slow)],
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _pids(marker):
        time.sleep(0.2)
    assert _pids(marker), "the probe never started"
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1 and json.loads(out)["error"] == "interrupted"
    gone_by = time.monotonic() + 15  # killed on the way out; reaped by init a moment later on a busy machine
    while _pids(marker) and time.monotonic() < gone_by:
        time.sleep(0.1)
    assert not _pids(marker)


def test_stdout_that_cannot_be_written_is_exit_1_without_a_traceback():
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, str(bundle.ROOT / "scripts" / "detect.py")],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert r.returncode == 1 and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "name,args,kind", CASES, ids=[f"{n}:{a[-1]}{a[0] if len(a) > 1 else ''}:{k}" for n, a, k in CASES]
)
def test_an_input_that_is_not_a_document_is_a_clear_error(script, bad_files, name, args, kind):
    r = script(name, *args, bad_files[kind], timeout=30)  # a FIFO read would hang: 30 s is the proof it did not
    assert r.code == 1 and r.doc["fix"], r.doc
    assert any(
        w in r.doc["error"]
        for w in ("not a regular file", "a directory", "not UTF-8", "refuse", "is not", "cannot read")
    ), r.doc["error"]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["detect.py", "--nps", "4"], "without --spec"),
        (["detect.py", "--smt", "off"], "without --spec"),
        (["check_model.py", "--vllm-version", "0.32.0;id"], "not a version number"),
        (["check_model.py", "--vllm-version", "../../../etc/passwd"], "not a version number"),
        (["check_model.py", "--python", "/nonexistent/python"], "not an executable file"),
        (["check_model.py", "--revision", "../../x"], "argument --revision"),
        (["check_model.py", "--model", "x" * 5000], "File name too long"),
        (["estimate_memory.py", "--model", "x" * 5000], "File name too long"),
        (["validate.py", "--generation", "$(id)"], "invalid choice"),
    ],
)
def test_bad_values_that_used_to_pass_or_crash(script, args, needle):
    extra = ["--model", str(FIXTURES / "Qwen3-0.6B")] if args[0] == "check_model.py" and "--model" not in args else []
    r = script(*args, *extra)
    assert r.code == 1 and needle in r.doc["error"], r.doc


def test_read_json_input_rejects_error_documents(tmp_path):
    f = tmp_path / "x.json"
    f.write_text(json.dumps({"error": "boom", "fix": "do it"}))
    with pytest.raises(errors.ScriptError) as e:
        jsonio.read_json_input(str(f), "detect")
    assert "boom" in e.value.error and e.value.fix == "do it"
    f.write_text("[1]")
    with pytest.raises(errors.ScriptError):
        jsonio.read_json_input(str(f), "detect")
    with pytest.raises(errors.ScriptError):
        jsonio.read_json_input(str(tmp_path / "missing.json"), "detect")


def test_epyc_json_matches_its_schema():
    import jsonschema
    from conftest import SCHEMAS

    jsonschema.validate(bundle.load_epyc(), json.loads((SCHEMAS / "epyc.json").read_text()))


def test_missing_dependency_is_a_json_error_with_the_install_fix(tmp_path):
    """A user running the scripts with a python3 that lacks the dependencies gets told how to fix it."""
    import subprocess
    import sys

    from conftest import SCRIPTS

    shadow = tmp_path / "psutil.py"  # an import of psutil that fails like a missing package
    shadow.write_text("raise ModuleNotFoundError(\"No module named 'psutil'\", name='psutil')\n")
    res = subprocess.run(
        [sys.executable, str(SCRIPTS / "detect.py")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and "psutil" in doc["error"] and "scripts/bootstrap.py" in doc["fix"]


@pytest.mark.parametrize("how", ["write-only", "closed"])
def test_stdin_that_cannot_be_read_is_an_error(tmp_path, how):
    """`--plan -` with stdin closed or opened for writing: a clear error, not an internal one."""
    import subprocess
    import sys

    argv = [sys.executable, str(ROOT / "scripts" / "bench.py"), "--plan", "-"]
    if how == "write-only":
        with open(tmp_path / "w", "wb") as w:
            res = subprocess.run(argv, stdin=w, capture_output=True, text=True, timeout=60)
    else:
        res = subprocess.run(["bash", "-c", 'exec "$@" <&-', "bash", *argv], capture_output=True, text=True, timeout=60)
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and "stdin cannot be read" in doc["error"] and doc["fix"], res.stdout + res.stderr


@pytest.mark.parametrize("script", sorted(p.name for p in (bundle.ROOT / "scripts").glob("*.py")))
def test_every_script_starts_from_an_interpreter_without_the_bundles_dependencies(script):
    """`python3 scripts/X.py` from a python3 that has none of psutil, requests, ... moves into the bundle's
    venv before it needs them: nothing a script imports at its top may need them."""
    import subprocess

    bare = getattr(sys, "_base_executable", sys.executable)
    probe = subprocess.run([bare, "-c", "import psutil"], capture_output=True, timeout=60)
    if probe.returncode == 0:
        pytest.skip(f"{bare} has psutil: not a bare interpreter")
    res = subprocess.run(
        [bare, "-I", str(bundle.ROOT / "scripts" / script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
