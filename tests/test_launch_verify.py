"""launch.py verify and handoff: alive, healthy, the model listed, one real request."""

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import (
    FAKE_SERVER,
    ROOT,
    _verify_mode,
    calls,
    free_port_plan,
    host_plan,
    server_mode,
    wait_for_port,
)


def test_verify_never_follows_a_redirect(script, tmp_path, inputs, live_tune):
    """The server is on 127.0.0.1; requests followed a 302 wherever it pointed (the audit's went off-host)."""
    r = _verify_mode(script, tmp_path, inputs, live_tune, "redirect_health")
    assert r.code == 1 and r.doc["phase"] == "health" and "last: 302" in r.doc["error"], r.doc


def test_verify_shows_a_few_of_the_models_a_server_lists(script, tmp_path, inputs, live_tune):
    r = _verify_mode(script, tmp_path, inputs, live_tune, "many_models")
    assert r.code == 0 and r.doc["models_listed"] == 40_001 and len(r.doc["models"]) == 20, r.doc["models"][:3]
    assert r.doc["models"][0] == r.doc["served_model_name"] and len(r.stdout) < 10_000


# ---- the twenty-second audit
def test_a_full_disk_during_verify_is_a_clear_error_and_up_stops_its_server(inputs, live_tune, tmp_path):
    """F4: verify's state write on a full disk was `internal error: OSError`, and up, which stops its server
    only on its own errors and interrupts, left the unverified server running. The full disk is real
    enough: RLIMIT_FSIZE 0 (ulimit -f 0) makes every write fail with EFBIG, set as verify begins."""
    import subprocess

    import psutil

    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    code = (
        "import sys, resource; sys.path.insert(0, sys.argv[1]); import json; from epyc import cli; from epyc.verbs import up\n"
        "plan = json.load(open(sys.argv[2]))\n"
        "real_verify = up.verify\n"
        "def verify_on_a_full_disk(*args):\n"
        "    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
        "    return real_verify(*args)\n"
        "up.verify = verify_on_a_full_disk\n"
        "sys.exit(cli.run_main(lambda argv: (up.serve_verified(plan, sys.argv[2], 60, 10), 0)))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "scripts"), str(plan_file)], capture_output=True, text=True, timeout=180
    )
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and "internal error" not in doc["error"], doc
    assert "cannot write" in doc["error"] and "File too large" in doc["error"] and "ulimit -f" in doc["fix"], doc
    assert doc["stopped"]["stopped"] and doc["plan_file"]  # up's rule: a failed verify stops the server
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(plan["port"]) in (p.info["cmdline"] or [])]


def test_handoff_hands_off_only_a_server_healthy_now(script, inputs, live_tune, tmp_path):
    """The twenty-fourth's F5: a verify that could not write its state (read-only folder, `ulimit -f 0`) could
    not clear the pass it found, so handoff gave out a server whose engine had died since. handoff now asks
    /health itself: vLLM's API process outlives a dead engine and answers 503 (the fake does so on SIGUSR1)."""
    from epyc.deployments import serve_start, serve_state, serve_stop

    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    serve_start.start(plan, confirm=True)
    try:
        assert script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "20").code == 0
        assert script("launch.py", "handoff", "--plan", str(plan_file)).code == 0
        # a key this shell holds wrongly is no server down: /health is asked without it (twenty-seventh, F2)
        assert (
            script("launch.py", "handoff", "--plan", str(plan_file), env={"MY_API_KEY": "ABCDEFGHIJ\nKLMNOPQ"}).code
            == 0
        )
        os.kill(serve_state.read_state(plan)["pid"], signal.SIGUSR1)
        # verify with no room to write (as root a read-only folder would not stop it) cannot clear the pass...
        again = subprocess.run(
            [
                "bash",
                "-c",
                'ulimit -f 0; exec "$0" "$@"',
                sys.executable,
                str(ROOT / "scripts" / "launch.py"),
                "verify",
                "--plan",
                str(plan_file),
                "--timeout",
                "5",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert again.returncode == 1 and json.loads(again.stdout)["error"], again.stdout
        assert "verified_at" in serve_state.read_state(plan)
        state = serve_state.read_state(plan)
        for forged_pass in (True, -1, 1e308, "1"):  # forged passes are none (twenty-sixth and -seventh, notes)
            serve_state.write_state(plan, {**state, "verified_at": forged_pass})
            forged = script("launch.py", "handoff", "--plan", str(plan_file))
            assert forged.code == 1 and "has not passed verify" in forged.doc["error"], (forged_pass, forged.doc)
        serve_state.write_state(plan, state)
        hand = script("launch.py", "handoff", "--plan", str(plan_file))  # ...and handoff does not trust it
        assert hand.code == 1 and "not healthy now (/health: HTTP 503)" in hand.doc["error"], hand.doc
        assert "stop it, start it again, then verify" in hand.doc["fix"] and "base_url" not in hand.doc
    finally:
        serve_stop.stop(plan)


def test_verify_passes_only_a_container_the_runtime_said_runs(script, inputs, rt, tmp_path):
    """Whatever answered on the port passed verify while every inspect failed (and up would hand it off)."""
    d, env = rt
    plan_file, plan = free_port_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    server = subprocess.Popen(
        [
            sys.executable,
            str(FAKE_SERVER),
            "--port",
            str(plan["port"]),
            "--delay",
            "0",
            "--served-model-name",
            plan["served_model_name"],
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(plan["port"])
        (d / "inspect_fails").touch()
        v = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "30", env=env)
        assert (
            v.code == 1
            and v.doc["phase"] == "process"
            and "did not say whether the container runs" in v.doc["error"]
            and "then run verify again" in v.doc["fix"]
        ), v.doc
        tails = [c["argv"] for c in calls(d) if c["argv"][0] == "logs"]
        assert tails[-1] == ["logs", "--tail", "50", "f" * 64], tails  # the recorded container's, by id
        (d / "inspect_fails").unlink()
        v = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "30", env=env)
        assert v.code == 0 and v.doc["ok"], v.doc
    finally:
        server.kill()
        server.wait(timeout=10)
    assert script("launch.py", "stop", "--plan", str(plan_file), env=env).doc["stopped"] is True


@pytest.mark.parametrize("mode,settled", [("good", "/v1/chat/completions"), ("no_chat_template", "/v1/completions")])
def test_an_unknown_endpoint_is_settled_by_verify_on_the_running_server(
    script, tmp_path, inputs, live_tune, mode, settled
):
    """The chat template could not be read: the plan says so instead of guessing, handoff waits for verify,
    and verify tries chat, then completions, and hands off the one that answered."""

    def unreadable_template(docs):  # what check_model.py says when it cannot read the template
        docs["check_model"].update(
            primary_endpoint="unknown",
            supported_endpoints=[],
            chat_template={"status": "unknown", "source": None, "selected_name": None, "names": []},
        )

    plan_file, plan = host_plan(tmp_path, inputs, live_tune, edit=unreadable_template)
    assert plan["primary_endpoint"] == "unknown" and plan["supported_endpoints"] == []
    assert "unknown until verify settles it" in plan["summary_markdown"]
    early = script("launch.py", "handoff", "--plan", str(plan_file))
    assert early.code == 1 and "verify" in early.doc["fix"]
    server_mode(tmp_path, mode)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
    try:
        r = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "20")
        assert r.code == 0 and r.doc["smoke"]["endpoint_path"] == settled, r.doc
        h = script("launch.py", "handoff", "--plan", str(plan_file)).doc
        assert h["endpoint_path"] == settled and h["why"].startswith("settled by verify")
        curl = subprocess.run(["bash", "-c", h["curl_example"]], capture_output=True, text=True, timeout=30)
        assert json.loads(curl.stdout)["choices"][0]  # the handed-off example answers
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))


def test_the_host_handoff_carries_a_systemd_unit_its_verifier_passes(script, inputs, live_tune, tmp_path):
    """What keeps a host server up across a crash or a reboot: a unit rendered from the plan (the same argv and
    pin, its environment from a file, secrets from a file the user writes, restart on failure), passed by
    systemd-analyze verify. What that cannot check here (systemd is not PID 1): that it starts; the argv is
    the one start ran, which verify has just passed."""
    import shutil
    from pathlib import Path

    from epyc.deployments import serve_start

    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    serve_start.start(plan, confirm=True)
    try:
        assert script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "20").code == 0
        h = script("launch.py", "handoff", "--plan", str(plan_file))
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))
    svc = h.doc["service"]
    unit = Path(svc["unit_file"]).read_text()
    assert "\nRestart=on-failure\n" in unit and f"EnvironmentFile={svc['env_file']}\n" in unit
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert exec_start.split()[0][len("ExecStart=") :].startswith("/") and plan["argv"][-1] in exec_start
    assert "VLLM_CPU_OMP_THREADS_BIND=" in Path(svc["env_file"]).read_text()
    assert svc["install"][0] == plan["stop_command"] and "systemctl enable --now" in svc["install"][2]
    res = subprocess.run(["systemd-analyze", "verify", svc["unit_file"]], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
