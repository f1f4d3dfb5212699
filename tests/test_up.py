"""The up flow's decisions (epyc.verbs.up): what is shown, what a --yes may launch."""

import json
from pathlib import Path

import pytest
from conftest import load_epyc_doc, up_with_no_terminal
from epyc.errors import ScriptError


def test_an_interrupt_held_by_start_ends_up_and_compare(monkeypatch, tmp_path):
    """F4: start turns a Ctrl-C held while it launched into an error that says the server runs; bench
    --compare logged it as a failed sizing and started the next one, up left the server up."""
    from epyc.errors import ScriptError
    from epyc.verbs import up

    calls = []
    monkeypatch.setattr(
        up,
        "start",
        lambda plan, confirm: (_ for _ in ()).throw(
            ScriptError("interrupted, after the server was launched and recorded: it is running", "f", interrupted=True)
        ),
    )
    monkeypatch.setattr(up, "stop", lambda plan: calls.append("stop") or {"stopped": True})
    with pytest.raises(ScriptError, match="up stopped the server"):
        up.start_or_stop({"x": 1}, tmp_path / "plan.json")
    assert calls == ["stop"]


def test_an_interrupt_during_a_container_run_ends_up_with_a_stop(monkeypatch, tmp_path):
    """F4: a Ctrl-C during `docker run` (the engine may have started it) went past up's stop."""
    from epyc.errors import ScriptError
    from epyc.verbs import up

    calls = []
    monkeypatch.setattr(up, "start", lambda plan, confirm: (_ for _ in ()).throw(KeyboardInterrupt()))
    monkeypatch.setattr(up, "stop", lambda plan: calls.append("stop") or {"stopped": True})
    with pytest.raises(ScriptError, match="up stopped the server"):
        up.start_or_stop({"x": 1}, tmp_path / "plan.json")
    assert calls == ["stop"]


def test_any_failure_of_verify_stops_ups_server(monkeypatch, tmp_path):
    """F4: only ScriptError and KeyboardInterrupt stopped the server; any other failure left it running.
    The failing verify and the stop are stand-ins here: the real chain is the test above."""
    import errno

    from epyc.verbs import up

    stops = []

    def verify_fails(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(up, "verify", verify_fails)
    monkeypatch.setattr(up, "stop", lambda plan: stops.append(plan) or {"stopped": True})
    from epyc.errors import ScriptError

    with pytest.raises(ScriptError) as err:
        up.verify_or_stop({"port": 1}, tmp_path / "plan.json", 5, 5)
    assert stops and "No space left on device: up stopped the server it had started" in err.value.error
    assert "free space" in err.value.fix and err.value.extra["phase"] == "verify"


def test_up_sizes_the_dtype_it_serves(inputs, tmp_path, monkeypatch):
    """F3, up's half: its estimate_memory step sized bfloat16 whatever --dtype up served. The steps before it
    are the fixtures' real documents (detect of a Genoa tree, validate, check_model); up stops at the estimate."""
    import argparse

    from conftest import load_docs
    from epyc.errors import ScriptError
    from epyc.verbs import up

    docs = load_docs(inputs)
    seen = {}

    def step(script, args, phase, run_dir, allow_fail=False):
        seen[phase] = args
        if phase == "estimate_memory":
            raise ScriptError("the test stops here", "-")
        return docs[phase]

    monkeypatch.setattr(up, "step", step)
    a = argparse.Namespace(
        model=docs["check_model"]["model"],
        state_dir=str(tmp_path / "up"),
        stock=False,
        python=None,
        yes=True,
        max_model_len=None,
        num_prompts=4,
        port=None,
        expose=False,
        tls_cert=None,
        tls_key=None,
        tls_ca=None,
        tls_name=None,
        plain_http=False,
        served_model_name="m",
        api_key_env=None,
        throughput_flags=False,
        kernel_log=False,
        timeout=30,
        dtype="float32",
    )
    with pytest.raises(ScriptError, match="the test stops here"):
        up.up(a, load_epyc_doc())
    assert seen["estimate_memory"][-2:] == ["--dtype", "float32"]
    a.dtype = None  # the default: the estimate's own default, the same as plan's
    with pytest.raises(ScriptError, match="the test stops here"):
        up.up(a, load_epyc_doc())
    assert "--dtype" not in seen["estimate_memory"]


def test_ups_own_start_is_not_refused_by_the_folder_it_holds(inputs, live_tune, tmp_path, monkeypatch):
    """The other side of F1's fix: up holds .up.lock through its start, in the same process; that start is
    up's own and runs. The steps here return the host-path documents host_plan uses (a fake venv's server)."""
    import argparse

    from conftest import free_port, host_docs
    from epyc.deployments import serve_stop
    from epyc.verbs import up

    docs = host_docs(tmp_path, inputs, live_tune)
    monkeypatch.setattr(up, "step", lambda script, args, phase, run_dir, allow_fail=False: docs[phase])
    a = argparse.Namespace(
        model=docs["check_model"]["model"],
        state_dir=str(tmp_path / "up"),
        stock=True,
        python=None,
        yes=True,
        max_model_len=None,
        num_prompts=1,
        port=free_port(),
        expose=False,
        tls_cert=None,
        tls_key=None,
        tls_ca=None,
        tls_name=None,
        plain_http=False,
        served_model_name="m",
        api_key_env=None,
        throughput_flags=False,
        kernel_log=False,
        timeout=30,
        dtype=None,
    )
    done = up.up(a, load_epyc_doc())
    try:
        assert done["ok"] and done["started"]["started"] and done["verify"]["ok"], done
    finally:
        plan = json.loads(Path(done["plan_file"]).read_text())
        from epyc.deployments import serve_stop

        assert serve_stop.stop(plan)["stopped"] is True


def test_up_yes_launches_only_the_plan_it_showed(inputs, tmp_path, monkeypatch):
    """F5: `up` with no terminal shows its plan and stops ("re-run with --yes"); the --yes run planned again and
    launched whatever that said (the port taken in between: 8000 shown, 8001 run). What a --yes launches
    after a showing is held to what was shown; a changed plan is shown again, not run. The steps before the
    plan are the fixtures' real documents (a Genoa tree); the launch itself is recorded, not run."""
    from conftest import load_docs
    from epyc.bundle import load_epyc
    from epyc.errors import ScriptError
    from epyc.verbs import up

    docs = load_docs(inputs)
    run_dir = tmp_path / "up"
    docs["validate"]["port"] = 18601  # no --port: the first free port validate found
    a, launched = up_with_no_terminal(monkeypatch, docs, run_dir, None)
    with pytest.raises(ScriptError, match="no terminal"):
        up.up(a, load_epyc())
    shown = json.loads((run_dir / "shown-plan.json").read_text())
    assert "--port 18601" in shown["command"] and not launched
    a.yes, docs["validate"]["port"] = True, 18602  # 18601 taken in between: the second run plans another port
    with pytest.raises(
        ScriptError, match=r"the plan differs from the one up showed last \(pre_argv, command\)"
    ) as changed:
        up.up(a, load_epyc())
    assert "--port 18602" in changed.value.error and changed.value.extra["started"] is False and not launched
    up.up(a, load_epyc())  # the changed plan was shown (stderr, plan.json): a yes now runs exactly it
    assert len(launched) == 1 and launched[0]["port"] == 18602 and not (run_dir / "shown-plan.json").exists()
    a.state_dir = str(tmp_path / "fresh")  # --yes up front, nothing shown before: as it always was
    up.up(a, load_epyc())
    assert len(launched) == 2


def test_a_showing_holds_every_yes_after_it_whose_plan_differs(inputs, tmp_path, monkeypatch):
    """A showing holds every --yes after it whose plan differs, however the request was spelled (the folder
    typed relative, a default given explicitly, another model): only what runs counts."""
    from conftest import load_docs, up_with_no_terminal
    from epyc.bundle import load_epyc
    from epyc.errors import ScriptError
    from epyc.verbs import up

    docs = load_docs(inputs)
    run_dir = tmp_path / "up"
    a, launched = up_with_no_terminal(monkeypatch, docs, run_dir, 18611)
    with pytest.raises(ScriptError, match="no terminal"):
        up.up(a, load_epyc())  # shown, left in the folder
    assert "--port 18611" in json.loads((run_dir / "shown-plan.json").read_text())["command"]
    a.yes, a.port = True, 18612  # another request: its plan was never shown -> shown now, not run
    with pytest.raises(
        ScriptError, match=r"differs from the one up showed last .*; it now runs: .*--port 18612"
    ) as held:
        up.up(a, load_epyc())
    assert held.value.extra["started"] is False and not launched
    up.up(a, load_epyc())  # this request's plan is the one shown now: the yes runs it
    assert [p["port"] for p in launched] == [18612] and not (run_dir / "shown-plan.json").exists()
    a.yes, a.max_model_len = False, None
    with pytest.raises(ScriptError, match="no terminal"):
        up.up(a, load_epyc())  # shown again
    a.yes, a.max_model_len = True, docs["estimate_memory"]["fit"]["max_model_len"]  # the default, typed out:
    up.up(a, load_epyc())  # another request, the same plan: what runs is what was shown, so it runs
    assert len(launched) == 2


def test_an_unreadable_showing_holds_the_yes_with_a_clear_error(inputs, tmp_path, monkeypatch):
    """The 34th audit's F7: a shown-plan.json nested 200,000 deep ended as `internal error: RecursionError`."""
    from conftest import load_docs, up_with_no_terminal
    from epyc.bundle import load_epyc
    from epyc.errors import ScriptError
    from epyc.verbs import up

    docs = load_docs(inputs)
    run_dir = tmp_path / "up"
    run_dir.mkdir()
    (run_dir / "shown-plan.json").write_text("[" * 200_000)
    a, launched = up_with_no_terminal(monkeypatch, docs, run_dir, 18614)
    a.yes = True
    with pytest.raises(ScriptError, match="not launched: up could not read the plan it showed last"):
        up.up(a, load_epyc())
    assert not launched


def test_with_no_terminal_up_shows_the_plan_and_says_what_a_yes_does(inputs, tmp_path, monkeypatch, capsys):
    """With no terminal, up's error names its phase, says what a --yes does, and names the up folder's plan."""
    from conftest import load_docs, up_with_no_terminal
    from epyc.bundle import load_epyc
    from epyc.errors import ScriptError
    from epyc.verbs import up

    docs = load_docs(inputs)
    a, launched = up_with_no_terminal(monkeypatch, docs, tmp_path / "up", 18621)
    with pytest.raises(ScriptError, match="no terminal") as asked:
        up.up(a, load_epyc())
    doc = asked.value.as_json()
    assert doc["phase"] == "confirm" and doc["plan_file"] == str(tmp_path / "up" / "plan.json"), doc
    assert "launch.py plan" not in doc["fix"] and "--yes" in doc["fix"] and not launched
    assert capsys.readouterr().err.count("Launch this?") == 0  # the summary was logged once, not the prompt too


def test_with_no_runtime_up_stops_at_validate_with_the_one_time_fix(inputs, tmp_path, monkeypatch):
    """No container runtime and no host stack: up reports validate's one-time fix and stops; it installs
    nothing itself, --yes or not."""
    from conftest import load_docs, up_with_no_terminal
    from epyc.bundle import load_epyc
    from epyc.errors import ScriptError
    from epyc.verbs import up

    docs = load_docs(inputs)
    ran = []
    no_runtime = {"ok": False, "ready": False, "errors": [{"check": "runtime", "message": "no usable runtime",
                  "fix": "one-time setup: ... python3 scripts/setup_host_stack.py"}]}  # fmt: skip
    a, launched = up_with_no_terminal(monkeypatch, docs, tmp_path / "up", 18622)
    monkeypatch.setattr(up, "step", lambda script, args, phase, *r, **k: ran.append(script) or (
        no_runtime if phase == "validate" else docs[phase]))  # fmt: skip
    for yes in (False, True):
        a.yes = yes
        with pytest.raises(ScriptError, match="FAILED in phase validate: no usable runtime") as failed:
            up.up(a, load_epyc())
        assert "setup_host_stack.py" in failed.value.fix
    assert ran == ["detect.py", "validate.py"] * 2 and not launched


# ---- the review of the fixes above
def test_a_failed_launch_keeps_the_showing_so_the_retry_is_held_to_it(inputs, tmp_path, monkeypatch):
    """The showing was used up before the serve: a start that failed (its port taken, the case the showing
    guards against) left nothing to hold the next --yes to, and validate's next free port launched unseen.
    Only a serve that went through uses it up."""
    from conftest import load_docs, up_with_no_terminal
    from epyc.bundle import load_epyc
    from epyc.errors import ScriptError
    from epyc.verbs import up

    docs = load_docs(inputs)
    a, launched = up_with_no_terminal(monkeypatch, docs, tmp_path / "up", None)
    with pytest.raises(ScriptError, match="no terminal"):
        up.up(a, load_epyc())
    shown_port = docs["validate"]["port"]

    def port_busy(plan, plan_file, *rest):
        launched.append(plan)
        raise ScriptError("FAILED in phase start: port busy", "-", phase="start")

    monkeypatch.setattr(up, "serve_verified", port_busy)
    a.yes = True
    with pytest.raises(ScriptError, match="port busy"):
        up.up(a, load_epyc())  # what was shown: launched (and failed)
    docs["validate"] = {**docs["validate"], "port": shown_port + 1}  # validate's next free port
    with pytest.raises(ScriptError, match=r"the plan differs from the one up showed last \(pre_argv, command\)"):
        up.up(a, load_epyc())
    assert [p["port"] for p in launched] == [shown_port]


def test_what_a_held_showing_says_is_true():
    """A showing that is not this bundle's (not JSON, another version's fields) is said so, never "changed"."""
    from epyc.verbs.showing import showing_differs

    now = {"pre_argv": [], "command": "vllm serve m --port 1", "env": {}, "secrets": []}
    assert showing_differs(None, now).startswith("up could not read the plan it showed last")
    assert showing_differs({"x": 1}, now).startswith("up could not read the plan it showed last")
    old = {k: v for k, v in now.items() if k != "secrets"}
    assert showing_differs(old, now).startswith("up could not read the plan it showed last")
    assert showing_differs({**now, "command": "x"}, now) == "the plan differs from the one up showed last (command)"
    assert showing_differs({**now, "extra": 1}, now) is None


def test_a_state_dir_this_bundle_filled_is_accepted_again(tmp_path):
    """up keeps one JSON per step and start its log and state: planning again into that folder is fine."""
    from epyc.verbs import up

    st = tmp_path / "st"
    st.mkdir()
    for name in (
        "plan.json",
        "server.log",
        "state.json",
        "detect.json",
        "validate.json",
        "setup_host_stack.json",
        "check_model.json",
        "estimate_memory.json",
        "cpu_tune.json",
    ):
        (st / name).write_text("{}")
    (st / "bench-20261201-120000").mkdir()  # bench's result folder (a file or link of that name is foreign)
    assert up.state_dir_arg(str(st)) == str(st.resolve())
    (st / "notes.txt").write_text("mine")
    with pytest.raises(ScriptError, match="notes.txt"):
        up.state_dir_arg(str(st))


def test_a_step_document_is_never_written_through_a_link(tmp_path):
    from epyc.verbs import up

    victim = tmp_path / "victim.json"
    victim.write_text("keep me")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "detect.json").symlink_to(victim)
    up.step("detect.py", [], "detect", tmp_path / "run")  # the link is removed before the step, never followed
    assert victim.read_text() == "keep me"
    assert (
        not (tmp_path / "run" / "detect.json").is_symlink()
        and "cpu_model" in (tmp_path / "run" / "detect.json").read_text()
    )


def test_ups_steps_keep_their_documents_in_its_folder_only(tmp_path, monkeypatch):
    """Each step runs with --run of up's folder: it keeps its document there, and no other run folder
    ($EPYC_RUN, or the default one) is read or written."""
    from epyc.verbs import up

    monkeypatch.setenv("EPYC_RUN", str(tmp_path / "elsewhere"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    doc = up.step("detect.py", [], "detect", run_dir)
    assert json.loads((run_dir / "detect.json").read_text())["cpu_model"] == doc["cpu_model"]
    assert not (tmp_path / "elsewhere").exists()
