"""The docker daemon a plan names: the one validate.py probed (DOCKER_HOST), written into every runtime
argv as `--host=ADDRESS`, so the human approves which engine runs the server and every later verb reaches
that one whatever its own shell exports. Only a daemon on this machine: the plan is sized for it.

The fake docker (tests/fakes/bin/docker) records the --host each call carried; the real engine is
exercised by tests/test_e2e_container.py, whose daemon is on a private socket named by DOCKER_HOST."""

import json

import pytest
from conftest import FAKE_BIN, calls, plan_args, run_script
from epyc import errors, jsonio, subproc
from epyc.facts import runtimes
from hypothesis import given
from hypothesis import strategies as st

SOCK = "unix:///run/private-engine/docker.sock"


@pytest.mark.parametrize(
    "engine", ["unix:///var/run/docker.sock", SOCK, "tcp://127.0.0.1:2375", "tcp://localhost", "tcp://[::1]:2376"]
)
def test_an_engine_on_this_machine_is_named_as_one_argv_element(engine):
    assert runtimes.docker_engine_problem(engine) is None
    assert runtimes.runtime_argv("docker", engine) == ["docker", f"--host={engine}"]
    assert runtimes.runtime_argv("docker") == ["docker"]


@pytest.mark.parametrize(
    "engine,needle",
    [
        ("tcp://10.0.0.5:2376", "another machine's docker"),
        ("ssh://me@box", "another machine's docker"),
        ("tcp://127.0.0.1.evil:1", "another machine's docker"),
        ("--config=/tmp/x", "not the address"),
        ("unix:///a b", "not the address"),
        ("", "not the address"),
        ("npipe:////./pipe/x", "not the address"),
        ("unix:///x\n--debug", "not the address"),
        ("unix://rel.sock", "not the address"),
        ("tcp://127.0.0.1:99999", "names no port"),
    ],
)
def test_an_engine_elsewhere_or_malformed_is_refused(engine, needle):
    assert needle in runtimes.docker_engine_problem(engine)
    with pytest.raises(errors.ScriptError) as err:
        runtimes.runtime_argv("docker", engine)
    assert (
        "DOCKER_HOST" in err.value.error and "unset DOCKER_HOST" in err.value.fix and "docker engine" in err.value.error
    )
    with pytest.raises(errors.ScriptError):
        runtimes.runtime_argv("sudo docker", SOCK)  # sudo resets the environment: never named for it


@given(st.text(max_size=60) | st.builds(lambda t: "unix://" + t, st.text(max_size=40)))
def test_any_engine_text_is_one_printable_argv_element_or_a_clear_error(text):
    try:
        argv = runtimes.runtime_argv("docker", text)
    except errors.ScriptError as err:
        assert err.error and err.fix
        return
    assert argv == ["docker", f"--host={text}"] and text.isprintable() and " " not in text
    assert text.startswith("unix:///") or runtimes.LOOPBACK_ENGINE.fullmatch(text)


def test_the_plan_names_the_engine_validate_probed_and_every_verb_uses_it(inputs, rt, tmp_path):
    """validate in a shell with DOCKER_HOST; plan, start, handoff and stop in one without it: each docker call
    reaches the engine the human approved (the fake records the --host each call carried)."""
    d, env = rt
    val = run_script("validate.py", "--detect", str(inputs["detect"]), env={**env, "DOCKER_HOST": SOCK})
    assert val.code == 0 and val.doc["runtime"] == "docker" and val.doc["engine"] == SOCK, val.doc
    probes = [c for c in calls(d) if c["argv"][:1] == ["info"]]
    assert probes[-1]["docker_host_env"] == SOCK  # what was probed is the engine recorded
    vfile = tmp_path / "validate-engine.json"
    vfile.write_text(val.stdout)
    r = run_script("launch.py", *plan_args({**inputs, "validate": vfile}, "--state-dir", str(tmp_path / "st")), env=env)
    plan = r.doc
    assert r.code == 0 and plan["engine"] == SOCK, plan
    assert plan["argv"][:3] == ["docker", f"--host={SOCK}", "run"]
    assert plan["pre_argv"] == [
        ["docker", f"--host={SOCK}", "rm", "-f", plan["container_name"]],
        ["docker", f"--host={SOCK}", "pull", plan["image"]],
    ]
    assert f"--host={SOCK}" in plan["command"]
    assert f"on the engine at {SOCK}" in plan["summary_markdown"]
    from epyc.decisions import (
        handoff,  # the handoff names it too: `docker logs` or `exec` of that container must reach that daemon
    )

    hand = handoff.handoff_doc(plan)
    assert hand["engine"] == SOCK and f"docker / {plan['port']} (engine {SOCK})" in hand["table_markdown"]
    assert f"| Stop without the bundle | docker --host={SOCK} stop" in hand["table_markdown"]
    jsonio.check_schema(hand, "launch", "handoff", "fix")
    pfile = tmp_path / "plan.json"
    pfile.write_text(r.stdout)
    before = len(calls(d))
    started = run_script("launch.py", "start", "--plan", str(pfile), "--confirm", env=env)
    assert started.code == 0, started.doc
    assert json.loads((tmp_path / "st" / "state.json").read_text())["engine"] == SOCK
    assert (
        run_script("launch.py", "stop", "--plan", str(pfile), env={**env, "DOCKER_HOST": "unix:///elsewhere.sock"}).code
        == 0
    )
    made = calls(d)[before:]
    assert {c["argv"][0] for c in made} >= {"rm", "run", "stop"}
    assert all(c["engine"] == SOCK for c in made), [(c["argv"][:2], c["engine"]) for c in made]


def test_validate_refuses_a_docker_on_another_machine(inputs, rt):
    d, env = rt
    r = run_script("validate.py", "--detect", str(inputs["detect"]), env={**env, "DOCKER_HOST": "tcp://10.9.8.7:2376"})
    assert r.code == 1 and "another machine's docker" in r.doc["error"] and "detect.py --host" in r.doc["fix"], r.doc


def test_a_docker_context_names_the_engine_as_docker_host_would(inputs, rt, tmp_path):
    """With DOCKER_HOST unset, `docker` talks to the current context's endpoint (DOCKER_CONTEXT, or `docker
    context use`): validate records that address, and refuses a context on another machine."""
    d, env = rt
    (d / "context").write_text(f"private {SOCK}\n")
    r = run_script("validate.py", "--detect", str(inputs["detect"]), env=env)
    assert r.code == 0 and r.doc["engine"] == SOCK, r.doc
    (d / "context").write_text("prod tcp://10.1.2.3:2376\n")
    r = run_script("validate.py", "--detect", str(inputs["detect"]), env=env)
    assert r.code == 1 and "another machine's docker" in r.doc["error"] and "docker context use default" in r.doc["fix"]
    (d / "context").unlink()  # the default context: the default socket, named by nothing
    r = run_script("validate.py", "--detect", str(inputs["detect"]), env=env)
    assert r.code == 0 and r.doc["engine"] is None


def test_a_plan_on_the_default_engine_never_follows_a_later_shells_docker_host_or_context(inputs, rt, tmp_path):
    """The twenty-fifth audit, F1: a plan made for the default socket (engine null) started, and was stopped,
    on whatever daemon the later shell's DOCKER_HOST or docker context named (a remote one included): stop
    then found "no such container" there, said stopped, and dropped the state of a server still running.
    A docker call that names no engine runs with DOCKER_HOST removed and the default context forced."""
    d, env = rt
    r = run_script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st")), env=env)
    plan = r.doc
    assert r.code == 0 and plan["engine"] is None and plan["argv"][:2] == ["docker", "run"]
    pfile = tmp_path / "plan.json"
    pfile.write_text(r.stdout)
    elsewhere = {**env, "DOCKER_HOST": "ssh://root@elsewhere.example", "DOCKER_CONTEXT": "prod"}
    before = len(calls(d))
    assert run_script("launch.py", "start", "--plan", str(pfile), "--confirm", env=elsewhere).code == 0
    assert run_script("launch.py", "stop", "--plan", str(pfile), env=elsewhere).code == 0
    made = calls(d)[before:]
    assert {c["argv"][0] for c in made} >= {"rm", "run", "stop"}
    assert all(
        c["engine"] is None and c["docker_host_env"] is None and c["docker_context_env"] == "default" for c in made
    ), [(c["argv"][:2], c["docker_host_env"], c["docker_context_env"]) for c in made]


def test_validate_refuses_a_remote_engine_before_asking_it_anything(inputs, rt):
    """F1's cousin (C3): `docker info` went to the ssh engine (a connection, up to the probe's timeout)
    before the refusal."""
    d, env = rt
    before = len(calls(d))
    r = run_script("validate.py", "--detect", str(inputs["detect"]), env={**env, "DOCKER_HOST": "ssh://me@box"})
    assert r.code == 1 and "another machine's docker" in r.doc["error"]
    assert calls(d)[before:] == []  # not even `docker info`


def test_a_plan_whose_engine_key_was_deleted_is_refused_as_edited(inputs, rt, tmp_path):
    """F3: with `engine` deleted, the plan passed as "an older bundle's": start ran on the argv's engine and
    recorded none, and stop then asked the default daemon, said stopped, and dropped the state."""
    d, env = rt
    val = run_script("validate.py", "--detect", str(inputs["detect"]), env={**env, "DOCKER_HOST": SOCK})
    vfile = tmp_path / "validate-engine.json"
    vfile.write_text(val.stdout)
    r = run_script("launch.py", *plan_args({**inputs, "validate": vfile}, "--state-dir", str(tmp_path / "st")), env=env)
    edited = {k: v for k, v in r.doc.items() if k != "engine"}
    pfile = tmp_path / "plan.json"
    pfile.write_text(json.dumps(edited))
    before = len(calls(d))
    for verb in ("start", "stop", "verify"):
        out = run_script("launch.py", verb, "--plan", str(pfile), *(["--confirm"] if verb == "start" else []), env=env)
        assert out.code == 1 and "engine" in out.doc["error"], (verb, out.doc)
    assert not [c for c in calls(d)[before:] if c["argv"][0] in ("run", "stop", "rm")]


def test_container_stop_with_nothing_to_stop_says_not_running(inputs, rt, tmp_path):
    """C2: a second stop (or one before any start) said `stopped: true` with the daemon's "No such
    container" as its detail; the host path says "not running"."""
    d, env = rt
    r = run_script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st")), env=env)
    pfile = tmp_path / "plan.json"
    pfile.write_text(r.stdout)
    assert run_script("launch.py", "start", "--plan", str(pfile), "--confirm", env=env).code == 0
    first = run_script("launch.py", "stop", "--plan", str(pfile), env=env)
    assert first.code == 0 and first.doc["stopped"] is True
    second = run_script("launch.py", "stop", "--plan", str(pfile), env=env)
    assert second.code == 0 and second.doc["stopped"] is False and second.doc["reason"] == "not running", second.doc


def test_every_docker_call_without_an_engine_is_pinned_to_the_default_socket_even_with_its_own_env():
    """The review of the twenty-fifth's fixes: a call that passed its own env (bench's `docker exec`, the
    image probe) or bypassed common.run (kernel_proof's `docker logs` stream) still followed DOCKER_HOST."""
    pinned = subproc.run_env(["docker", "exec", "c", "vllm"], {"DOCKER_HOST": "tcp://10.0.0.5:2375", "KEEP": "1"})
    assert pinned == {"KEEP": "1", "DOCKER_CONTEXT": "default"}
    named = {"DOCKER_HOST": SOCK}
    assert subproc.run_env(["docker", f"--host={SOCK}", "ps"], named) is named  # the plan names its engine
    assert subproc.run_env(["sh"], None) is None
    assert subproc.run_env(["podman", "ps"], {**named, "CONTAINER_HOST": "ssh://x/sock"}) == named  # podman's own


def test_kernel_proofs_log_stream_reads_the_plans_engine_not_the_shells(inputs, rt, tmp_path):
    d, env = rt
    r = run_script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st"), "--kernel-log"), env=env)
    pfile = tmp_path / "plan.json"
    pfile.write_text(r.stdout)
    assert run_script("launch.py", "start", "--plan", str(pfile), "--confirm", env=env).code == 0
    before = len(calls(d))
    proof = run_script("kernel_proof.py", "--plan", str(pfile), env={**env, "DOCKER_HOST": "unix:///elsewhere.sock"})
    # read (the fake's log), of the container start recorded, by its id
    assert proof.doc["source"] == f"docker logs {'f' * 12} ({r.doc['container_name']})", proof.doc
    logs = [c for c in calls(d)[before:] if c["argv"][0] == "logs"]
    assert logs and all(c["docker_host_env"] is None and c["docker_context_env"] == "default" for c in logs)
    run_script("launch.py", "stop", "--plan", str(pfile), env=env)


def test_podman_runs_on_this_machine_whatever_container_host_a_shell_exports(inputs, rt, tmp_path):
    """podman's remote client follows CONTAINER_HOST / CONTAINER_CONNECTION: a plan names no podman engine,
    so every podman call (validate's probes, start, stop) runs on this machine's, never where a shell points.
    (Podman cannot start containers in this sandbox: the fake records each call's environment.)"""
    d, env = rt
    (d / "daemon_down").touch()
    (d / "podman_can_run").touch()
    remote = {"CONTAINER_HOST": "ssh://core@10.0.0.9/run/podman/podman.sock", "CONTAINER_CONNECTION": "box"}
    val = run_script("validate.py", "--detect", str(inputs["detect"]), env={**env, **remote})
    assert val.code == 0 and val.doc["runtime"] == "podman", val.doc
    vfile = tmp_path / "validate-podman.json"
    vfile.write_text(val.stdout)
    r = run_script("launch.py", *plan_args({**inputs, "validate": vfile}, "--state-dir", str(tmp_path / "st")), env=env)
    assert r.code == 0 and r.doc["argv"][0] == "podman", r.doc
    pfile = tmp_path / "plan.json"
    pfile.write_text(r.stdout)
    assert run_script("launch.py", "start", "--plan", str(pfile), "--confirm", env={**env, **remote}).code == 0
    assert run_script("launch.py", "stop", "--plan", str(pfile), env={**env, **remote}).code == 0
    made = [c for c in calls(d) if c["runtime"] == "podman"]
    assert {c["argv"][0] for c in made} >= {"run", "stop", "rm", "image"}  # validate probes with run --rootfs
    assert all(c["container_host_env"] is None and c["container_connection_env"] is None for c in made), made


def plan_on(runtime, inputs, env, tmp_path):
    """validate.py as this environment answers it, asserting it picked `runtime`; then the plan made from it."""
    asked = ["--runtime", runtime] if runtime == "sudo docker" else []  # sudo only when the user asks for it
    val = run_script("validate.py", "--detect", str(inputs["detect"]), *asked, env=env)
    assert val.code == 0 and val.doc["runtime"] == runtime, val.doc
    vfile = tmp_path / f"validate-{runtime.replace(' ', '-')}.json"
    vfile.write_text(val.stdout)
    r = run_script("launch.py", *plan_args({**inputs, "validate": vfile}, "--state-dir", str(tmp_path / "st")), env=env)
    assert r.code == 0, r.doc
    pfile = tmp_path / "plan.json"
    pfile.write_text(r.stdout)
    return pfile, r.doc


def test_sudo_docker_runs_only_when_asked_for_and_never_prompts(inputs, rt, tmp_path):
    """validate never reaches for sudo on its own; asked for it, the plan runs `sudo -n docker` (a password
    prompt is a failure, never a wait). (FAKE sudo and docker: there is no sudo here.)"""
    d, env = rt
    env = {**env, "PATH": f"{FAKE_BIN.parent / 'sudo_bin'}:{env['PATH']}"}
    (d / "user_denied").touch()
    auto = run_script("validate.py", "--detect", str(inputs["detect"]), env=env)
    assert auto.doc["runtime"] != "sudo docker" and "sudo docker" not in auto.doc["runtime_detail"], auto.doc
    pfile, plan = plan_on("sudo docker", inputs, env, tmp_path)
    assert plan["argv"][:3] == ["sudo", "-n", "docker"], plan
    assert run_script("launch.py", "start", "--plan", str(pfile), "--confirm", env=env).code == 0
    assert run_script("launch.py", "stop", "--plan", str(pfile), env=env).doc["stopped"] is True
