"""Regressions from the thirty-fifth round (2026-12-04, AMD EPYC Genoa, family 0x19 model 0x11): a fresh audit
of the original breadth (~1,720 runs over every script and launch verb) found no internal error, no silent
accept, no unsafe action and no secret printed; these are the messages it found untrue or unhelpful, and the
one tightening it suggested. Classes: tests/BAD_INPUT.md."""
import json
import os
import sys

from test_launch import host_plan, inputs, live_tune, plan_args, rt  # noqa: F401


def test_progress_that_cannot_be_written_does_not_fail_the_run(monkeypatch):
    """stderr to /dev/full: `up` said "No space left on device: free space on that disk" and exited 1 at its
    first progress line. Progress is best effort; the document on stdout is the result."""
    import common
    full = open("/dev/full", "w")
    try:
        monkeypatch.setattr(sys, "stderr", full)
        common.log("up: detect")  # (up's first line) raised OSError ENOSPC
    finally:
        try:
            full.close()  # (its buffer still holds the line: the close's flush is refused too)
        except OSError:
            pass


def test_an_edited_plan_is_called_edited_not_a_missing_variable(script, tmp_path, inputs, live_tune,
                                                                 monkeypatch):  # noqa: F811
    """A plan edited to expose its server (options.expose, options.api_key_env) was refused by verify, stop and
    handoff with "--api-key-env MYKEY: that variable is not set" while MYKEY was set; start said the truth."""
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    plan["options"].update(expose=True, api_key_env="MYKEY")
    plan_file.write_text(json.dumps(plan))
    for verb in ("verify", "stop", "handoff"):
        r = script("launch.py", verb, "--plan", str(plan_file), env={"MYKEY": "sk-audit35-key"})
        assert r.code == 1 and "differs" in r.doc["error"] and "not set" not in r.doc["error"], (verb, r.doc)
        assert "sk-audit35-key" not in r.stdout + r.stderr


def test_plan_names_an_empty_input_path_as_empty(script, inputs):  # noqa: F811
    """`plan --detect ''` said "detect JSON '.' is a directory"; the other file flags say it is empty."""
    args = [a if not a.startswith("--detect=") else "--detect=" for a in plan_args(inputs)]
    r = script("launch.py", *args)
    assert r.code == 1 and "--detect: is empty (an unset shell variable?)" in r.doc["error"], r.doc


def test_an_input_path_expands_a_tilde_as_output_paths_do(script, inputs, tmp_path):  # noqa: F811
    """`--detect=~/d.json` (bash leaves that ~ alone) was "No such file '~/d.json'", though --state-dir, --venv
    and --capture expand it."""
    (tmp_path / "d.json").write_text(inputs["detect"].read_text())
    args = [a if not a.startswith("--detect=") else "--detect=~/d.json" for a in plan_args(inputs)]
    r = script("launch.py", *args, env={"HOME": str(tmp_path)})
    assert r.code == 0 and r.doc["ok"] is True, r.doc


def test_a_sysroot_file_that_is_no_capture_says_so(script, tmp_path):
    """`detect.py --sysroot some.json` answered with tarfile's list of the compressions it tried."""
    (tmp_path / "some.json").write_text("{}")
    r = script("detect.py", "--sysroot", str(tmp_path / "some.json"))
    assert r.code == 1 and "is neither a folder nor a capture archive" in r.doc["error"], r.doc
    assert "\n" not in r.doc["error"] and "detect.py --capture" in r.doc["fix"]


def test_a_state_dir_through_a_dangling_link_is_refused_before_anything_is_made(script, tmp_path, inputs):  # noqa: F811
    """`--state-dir LINK` to a folder that does not exist made the link's target, with its whole parent chain
    (a new top-level folder). The user named the link, not that chain: it is refused, nothing is made."""
    target = tmp_path / "nowhere" / "deeper" / "x"
    (tmp_path / "link").symlink_to(target)
    for where in ("link", "link/sub"):
        r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / where)))
        assert r.code == 1 and "is a link to nothing" in r.doc["error"], r.doc
        assert not (tmp_path / "nowhere").exists()
    (tmp_path / "real").mkdir()
    (tmp_path / "ok").symlink_to(tmp_path / "real")  # a link to a folder that is there: followed, as before
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "ok" / "st")))
    assert r.code == 0 and r.doc["state_dir"] == str((tmp_path / "real" / "st").resolve()), r.doc
