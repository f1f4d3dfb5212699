"""epyc.subproc: its decisions, tested in-process."""

import time

from epyc import subproc


def test_a_probe_is_judged_without_the_shells_python_settings(tmp_path, monkeypatch):
    """PYTHONWARNINGS=error in the shell made the real stack's probe fail on torch's import-time
    DeprecationWarning: a good venv reported as broken. The server never gets PYTHON* variables; the probe
    neither."""
    import sys

    from epyc import subproc

    site = tmp_path / "site" / "oldlib"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("import warnings\nwarnings.warn('old API', DeprecationWarning)\n")
    py = tmp_path / "python"
    py.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "site"} exec {sys.executable} "$@"\n')
    py.chmod(0o755)
    code = "import json, oldlib\nprint('@@T@@' + json.dumps({'imported': True}))"
    monkeypatch.setenv("PYTHONWARNINGS", "error")
    assert subproc.run_probe([str(py)], code, "@@T@@", timeout=60) == ({"imported": True}, "")


def test_sudo_docker_calls_never_follow_a_docker_host_sudo_keeps():
    """Twenty-seventh audit, note: a sudoers `env_keep += DOCKER_HOST` let `sudo -n docker` reach the daemon
    the shell named; a plan for sudo docker names no engine (sudo resets the environment otherwise)."""
    from epyc import subproc

    pinned = subproc.run_env(["sudo", "-n", "docker", "run", "x"], {"DOCKER_HOST": "tcp://10.9.9.9:2375", "K": "1"})
    assert pinned == {"K": "1", "DOCKER_CONTEXT": "default"}
    assert subproc.run_env(["sudo", "-n", "true"], {"DOCKER_HOST": "x"}) == {"DOCKER_HOST": "x"}


def test_tool_output_that_is_not_utf8_or_never_ends_is_bounded_text():
    r = subproc.run(["sh", "-c", "printf 'a\\377b'; printf 'c\\376' >&2; exit 3"], timeout=30)
    assert (r.returncode, r.stdout, r.stderr) == (3, "a\ufffdb", "c\ufffd")
    r = subproc.run(["sh", "-c", "printf 'a\\377b'"], timeout=30, limit=100)
    assert (r.returncode, r.stdout, r.failure) == (0, "a\ufffdb", None)
    t0 = time.monotonic()
    r = subproc.run(["yes", "flood"], timeout=30, limit=1 << 20)
    assert r.failure == "output_limit" and len(r.stdout) == 1 << 20 and "more than 1,048,576" in r.stderr
    assert time.monotonic() - t0 < 10


def test_run_never_raises_on_missing_binary_or_timeout():
    r = subproc.run(["definitely-not-a-binary-xyz"], timeout=5)
    assert r.failure == "not_found" and not r.ok
    r = subproc.run(["sleep", "5"], timeout=0.3)
    assert r.failure == "timeout" and r.returncode is None


def test_a_timeout_takes_the_whole_process_group_and_returns():
    """A child that forked a grandchild holding our pipe (a shell, sudo, ssh): the kill takes the group,
    so reading the pipe after it does not wait for the grandchild's 617 s."""
    import os
    import time

    import psutil

    naptime = f"617.{os.getpid()}"  # this run's own: a grandchild another run left behind is not ours
    t0 = time.monotonic()
    r = subproc.run(["bash", "-c", f"echo started; sleep {naptime} & wait"], timeout=1)
    assert r.failure == "timeout" and time.monotonic() - t0 < 15
    time.sleep(0.2)
    left = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", naptime]]
    assert not left, left


def test_run_probe_reads_the_marked_json_line_or_says_why_not():
    import sys

    doc, why = subproc.run_probe([sys.executable], "print('noise'); print('@@X@@{\"a\": 1}')", "@@X@@", 30)
    assert (doc, why) == ({"a": 1}, "")
    doc, why = subproc.run_probe([sys.executable], "import sys; sys.exit('boom')", "@@X@@", 30)
    assert doc is None and why == "boom"
    doc, why = subproc.run_probe([sys.executable], "print('@@X@@{oops')", "@@X@@", 30)
    assert doc is None and "malformed" in why
    doc, why = subproc.run_probe(["/no/such/python"], "pass", "@@X@@", 30)
    assert doc is None and "not found" in why
