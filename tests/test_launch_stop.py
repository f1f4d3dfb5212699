"""launch.py stop: the plan's server and everything start left are gone, and only those."""

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import _pgid, another_process_holding, calls, host_plan


def test_stop_keeps_the_state_while_the_runtime_cannot_remove_the_container(script, inputs, rt, tmp_path):
    """With the runtime unreachable, stop said `stopped: false` and removed the state and the key files a
    still-running container reads: nothing named the container any more."""
    from conftest import container_plan

    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    no_runtime = tmp_path / "no-runtime"
    no_runtime.mkdir()
    r = script("launch.py", "stop", "--plan", str(plan_file), env={"PATH": str(no_runtime)})
    assert r.code == 1 and "did not say whether" in r.doc["error"] and "stop again" in r.doc["fix"], r.doc
    assert (tmp_path / "st" / "state.json").exists()
    (d / "rm_fails").touch()  # the runtime answers, and cannot remove it
    r = script("launch.py", "stop", "--plan", str(plan_file), env=env)
    assert r.code == 1 and "could not remove" in r.doc["error"] and "stop again" in r.doc["fix"], r.doc
    assert (tmp_path / "st" / "state.json").exists()
    (d / "rm_fails").unlink()
    r = script("launch.py", "stop", "--plan", str(plan_file), env=env)
    assert r.code == 0 and r.doc["stopped"] is True and not (tmp_path / "st" / "state.json").exists()


def test_stop_stops_a_server_whose_state_file_has_another_name(script, tmp_path, inputs, live_tune):
    """F3 (a regression of the twelfth's fix): a hard link refused on every read made a state.json with a
    second name read as "no state": stop said "not running" and left the server up."""
    import psutil

    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    start = script("launch.py", "start", "--plan", str(plan_file), "--confirm")
    assert start.code == 0, start.doc
    try:
        os.link(plan["state_file"], tmp_path / "kept-state.json")
        r = script("launch.py", "stop", "--plan", str(plan_file))
        assert r.code == 0 and r.doc["stopped"] is True, r.doc
        assert not [p for p in psutil.process_iter() if _pgid(p.pid) == start.doc["pgid"]]
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))


def test_a_plan_with_the_default_state_dir_is_stopped_from_another_shell(script, inputs, rt, tmp_path):
    """F6: the default state dir was derived again by every verb from $XDG_CACHE_HOME / $HOME: stop from a
    terminal with another one said the plan differs, and the server stayed up."""
    from conftest import calls, plan_args

    here = {**rt[1], "XDG_CACHE_HOME": str(tmp_path / "xdg1")}
    r = script("launch.py", *plan_args(inputs), env=here)
    assert r.code == 0 and r.doc["state_dir"].startswith(str(tmp_path / "xdg1")), r.doc
    assert r.doc["options"]["state_dir"] == r.doc["state_dir"]
    (tmp_path / "plan.json").write_text(r.stdout)
    assert script("launch.py", "start", "--plan", str(tmp_path / "plan.json"), "--confirm", env=here).code == 0
    there = {**rt[1], "XDG_CACHE_HOME": str(tmp_path / "xdg2")}
    s = script("launch.py", "stop", "--plan", str(tmp_path / "plan.json"), env=there)
    assert s.code == 0 and s.doc["stopped"], s.doc
    assert calls(rt[0])[-1]["argv"] == ["rm", "-f", "f" * 64]  # the container its state records, by id
    assert not Path(r.doc["state_file"]).exists()


def test_stop_waits_for_a_start_in_progress_instead_of_saying_not_running(script, inputs, live_tune, tmp_path):
    """A note of the twenty-third audit: stop took no lock, so while a start held the state dir (a container
    pull and run can take minutes) stop found no state, said "not running", and the server came up after.
    Here another process holds the lock exactly as start does."""
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    Path(plan["state_dir"]).mkdir(parents=True, exist_ok=True)
    with another_process_holding(str(Path(plan["state_dir"]) / ".lock")):
        r = script("launch.py", "stop", "--plan", str(plan_file))
        assert r.code == 1 and "a start (or another stop) for" in r.doc["error"] and "in progress" in r.doc["error"], (
            r.doc
        )
        assert "wait for start" in r.doc["fix"] and r.doc["phase"] == "stop"
    r = script("launch.py", "stop", "--plan", str(plan_file))
    assert r.code == 0 and r.doc["stopped"] is False, r.doc


def test_stop_never_kills_a_process_group_a_forged_state_names(script, tmp_path, inputs, live_tune):
    import psutil

    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        st = Path(plan["state_dir"])
        st.mkdir(parents=True, exist_ok=True)
        from epyc.deployments.serve_state import plan_identity

        forged = {
            "path": "host",
            "port": plan["port"],
            "plan_id": plan_identity(plan),
            "pid": victim.pid,
            "pgid": victim.pid,
            "marker": "f" * 32,
            "create_time": psutil.Process(victim.pid).create_time(),
        }
        (st / "state.json").write_text(json.dumps(forged))
        r = script("launch.py", "stop", "--plan", str(plan_file))
        assert r.code == 0 and r.doc["stopped"] is False and victim.poll() is None
    finally:
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()


def test_stop_never_deletes_what_start_did_not_write(script, tmp_path, inputs, live_tune):
    """A hand-edited plan pointing at another folder: stop may touch only state.json it wrote and the
    secret files it names, never the folder's other files; a foreign container name is refused outright."""
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    decoy = tmp_path / "decoy"
    (decoy / "secrets").mkdir(parents=True)
    (decoy / "secrets" / "keep").write_text("precious")
    (decoy / "state.json").write_text('{"mine": "not a server state"}')
    edited = {
        **plan,
        "state_dir": str(decoy),
        "state_file": str(decoy / "state.json"),
        "log_file": str(decoy / "server.log"),
        "options": {**plan["options"], "state_dir": str(decoy)},
        "stop_command": plan["stop_command"].replace(plan["state_dir"], str(decoy)),
    }
    f = tmp_path / "edited.json"
    f.write_text(json.dumps(edited))
    r = script("launch.py", "stop", "--plan", str(f))
    assert r.code == 0 and (decoy / "secrets" / "keep").read_text() == "precious"
    assert json.loads((decoy / "state.json").read_text()) == {"mine": "not a server state"}
    # options and state_dir disagreeing, or a container that is not ours: refused before anything runs
    f.write_text(json.dumps({**edited, "options": plan["options"]}))
    r = script("launch.py", "stop", "--plan", str(f))
    assert r.code == 1 and "differs from what its own inputs render" in r.doc["error"]


@pytest.mark.parametrize(
    "edit",
    [
        lambda p: p["inputs"].update(detect="nope"),
        lambda p: p["options"].update(port="x"),
        lambda p: p.update(argv=["sh", "-c", "touch /tmp/never"]),
    ],
)
def test_stop_refuses_a_plan_its_inputs_do_not_render(script, tmp_path, inputs, live_tune, edit):
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    edited = json.loads(json.dumps(plan))
    edit(edited)
    f = tmp_path / "edited.json"
    f.write_text(json.dumps(edited))
    r = script("launch.py", "stop", "--plan", str(f))
    assert r.code == 1 and r.doc["fix"], r.doc


def test_a_plan_naming_a_container_that_is_not_ours_is_refused(script, tmp_path, inputs, live_tune):
    """stop and verify act only on containers this bundle named (vllm-epyc-PORT), never someone else's."""
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    f = tmp_path / "foreign.json"
    f.write_text(json.dumps({**plan, "path": "container", "runtime": "docker", "container_name": "someone-elses-db"}))
    r = script("launch.py", "stop", "--plan", str(f))
    assert r.code == 1 and "field container_name" in r.doc["error"]  # data/schemas/plan.json's pattern


@pytest.mark.parametrize("verb", ["start", "verify", "handoff", "stop"])
def test_a_plan_of_another_version_is_refused_with_its_stop_by_hand(script, inputs, rt, tmp_path, verb):
    """A plan carries its schema_version: one of another version (or none) is never rendered or acted on; each
    verb refuses it with the runtime's own commands that stop its server."""
    from conftest import container_plan

    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    for older in ({k: v for k, v in plan.items() if k != "schema_version"}, {**plan, "schema_version": 1}):
        plan_file.write_text(json.dumps(older))
        r = script("launch.py", verb, "--plan", str(plan_file), *(["--confirm"] if verb == "start" else []), env=env)
        name = plan["container_name"]
        assert r.code == 1 and "another version of this bundle" in r.doc["error"], r.doc
        assert f"docker stop -t 30 {name} && docker rm {name} && rm -rf " in r.doc["fix"], r.doc
        assert "plan again" in r.doc["fix"], r.doc
    assert not any(c["argv"][0] in ("stop", "rm", "run") for c in calls(d))


@pytest.mark.parametrize("older", [{"fleet_version": 1, "engines": []}, {"front_version": 1, "hosts": []}])
def test_a_fleet_or_front_plan_of_another_version_is_refused_with_one_message(script, tmp_path, older):
    """A fleet's or front's plan of the format before plan files said their kind (fleet_version, front_version)
    gets the same one message as an engine's older plan, never a reading as another kind."""
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps({"ok": True, **older}))
    for verb in ("verify", "stop"):
        r = script("launch.py", verb, "--plan", str(plan_file))
        assert r.code == 1 and "another version of this bundle" in r.doc["error"], r.doc
        assert "plan again" in r.doc["fix"] and r.doc["phase"] == verb, r.doc
