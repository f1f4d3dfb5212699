"""Regressions from the thirty-fourth round (2026-12-04): the items the thirty-third left open, and what a
fresh audit of them found. Classes: tests/BAD_INPUT.md."""
import json

import pytest

from test_launch import host_plan, inputs, live_tune, rt  # noqa: F401


def test_a_refused_bench_takes_back_the_out_folder_it_made(script, tmp_path, inputs, live_tune):  # noqa: F811
    """bench --out NEW made NEW (and its missing parents) before it found no server of this plan's own, and
    left them: an empty folder that passes for a result, and whose next --out use worked only because it
    was empty. A refusal now removes what it made; a folder the user made beforehand stays."""
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    new = tmp_path / "results" / "run1"
    args = ["--repeats", "1", "--input-lens", "16", "--concurrency", "1", "--output-len", "4", "--no-bandwidth"]
    r = script("bench.py", "--plan", str(plan_file), "--out", str(new), *args)
    assert r.code == 1 and r.doc["error"] == "no server from this plan is running (no state file)", r.doc
    assert not (tmp_path / "results").exists()  # run1 and the parent it made
    mine = tmp_path / "mine"
    mine.mkdir()
    r = script("bench.py", "--plan", str(plan_file), "--out", str(mine), *args)
    assert r.code == 1 and mine.is_dir()  # the user's own (empty) folder is not bench's to remove


def test_an_exposed_handoff_says_it_listens_on_every_address(inputs, monkeypatch):  # noqa: F811
    """The handoff of an --expose'd server gave only http://127.0.0.1:PORT/v1: true on this machine, but the
    user exposed it to reach it from another one, and nothing said the server listens on every address or
    that those clients need the key. The Base URL row says both; a loopback plan's row is unchanged."""
    import serve_plan
    from common import load_epyc
    from test_launch import facts_for, load_docs
    monkeypatch.setenv("MY_KEY", "sk-test")
    docs = load_docs(inputs)
    exposed = serve_plan.build_plan(docs, {"expose": True, "api_key_env": "MY_KEY"}, load_epyc(),
                                       facts_for(docs, api_key_set=True))
    row = next(line for line in serve_plan.handoff_doc(exposed)["table_markdown"].splitlines() if "Base URL" in line)
    assert f"listens on every address (0.0.0.0:{exposed['port']})" in row and "$MY_KEY" in row, row
    local = serve_plan.build_plan(docs, {}, load_epyc(), facts_for(docs))
    assert f"| Base URL | http://127.0.0.1:{local['port']}/v1 (the trailing /v1 matters) |" in \
        serve_plan.handoff_doc(local)["table_markdown"]


def test_a_showing_holds_every_yes_after_it_and_says_which_request_it_was(inputs, tmp_path, monkeypatch):  # noqa: F811
    """The 33rd left an old showing in the shared default up folder saying "the plan changed since up showed
    it" to an unrelated `up --model OTHER --yes`. Binding a showing to its request (34th round) let any other
    spelling of the same request (the folder typed relative, a default given explicitly) launch a plan
    nobody saw (the 34th audit's F1). A showing holds every --yes after it whose plan differs; the request it
    records only names the flags that differ, so the message is true."""
    import launch
    from common import ScriptError, load_epyc
    from test_audit33_regressions import up_with_no_terminal
    from test_launch import load_docs
    docs = load_docs(inputs)
    run_dir = tmp_path / "up"
    a, launched = up_with_no_terminal(monkeypatch, docs, run_dir, 18611)
    with pytest.raises(ScriptError, match="no terminal"):
        launch.up(a, load_epyc())  # shown, left in the folder
    assert json.loads((run_dir / "shown-plan.json").read_text())["request"]["port"] == 18611
    a.yes, a.port = True, 18612  # another request: its plan was never shown -> shown now, not run
    with pytest.raises(ScriptError, match=r"up last showed a plan for another request \(--port differ\), not this "
                                          r"one; it now runs: .*--port 18612") as held:
        launch.up(a, load_epyc())
    assert held.value.extra["started"] is False and not launched
    launch.up(a, load_epyc())  # this request's plan is the one shown now: the yes runs it
    assert [p["port"] for p in launched] == [18612] and not (run_dir / "shown-plan.json").exists()
    a.yes, a.max_model_len = False, None
    with pytest.raises(ScriptError, match="no terminal"):
        launch.up(a, load_epyc())  # shown again
    a.yes, a.max_model_len = True, docs["estimate_memory"]["fit"]["max_model_len"]  # the default, typed out:
    launch.up(a, load_epyc())  # another request, the same plan: what runs is what was shown, so it runs
    assert len(launched) == 2


def test_a_token_set_after_the_showing_holds_the_yes(inputs, tmp_path, monkeypatch, live_tune):  # noqa: F811
    """The 34th audit's F2: what a --yes compared was the command, env and pre-steps; on the host path a
    token set between the showing and the yes changes neither (the server reads it at start), so a server
    got HF_TOKEN that the shown Environment row never named. The secrets (by variable) are part of what runs."""
    import launch
    from common import ScriptError, load_epyc
    from test_audit33_regressions import up_with_no_terminal
    from test_launch import host_docs
    docs = host_docs(tmp_path, inputs, live_tune, None)  # the host path: the token changes no argv or env
    a, launched = up_with_no_terminal(monkeypatch, docs, tmp_path / "up", 18613)
    a.stock = True  # this runner's own detect document: any CPU takes the stock path on request
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(ScriptError, match="no terminal"):
        launch.up(a, load_epyc())
    monkeypatch.setenv("HF_TOKEN", "hf_set_after_the_showing")
    a.yes = True
    with pytest.raises(ScriptError, match=r"the plan changed since up showed it \(secrets\)"):
        launch.up(a, load_epyc())
    assert not launched


def test_an_unreadable_showing_holds_the_yes_with_a_clear_error(inputs, tmp_path, monkeypatch):  # noqa: F811
    """The 34th audit's F7: a shown-plan.json nested 200,000 deep ended as `internal error: RecursionError`."""
    import launch
    from common import ScriptError, load_epyc
    from test_audit33_regressions import up_with_no_terminal
    from test_launch import load_docs
    docs = load_docs(inputs)
    run_dir = tmp_path / "up"
    run_dir.mkdir()
    (run_dir / "shown-plan.json").write_text("[" * 200_000)
    a, launched = up_with_no_terminal(monkeypatch, docs, run_dir, 18614)
    a.yes = True
    with pytest.raises(ScriptError, match="not launched: up could not read the plan it showed last"):
        launch.up(a, load_epyc())
    assert not launched


def test_validate_gives_a_relative_python_back_absolute_and_unresolved(script, inputs):  # noqa: F811
    """validate.py --python .venv/bin/python answered with that relative path, which launch plan and up then
    refused ("pass the unmodified output of validate.py": it was unmodified). It now answers with the absolute
    path, not resolved: a venv's python is a link, and only the link's path finds the venv's packages."""
    import os
    import sys
    from conftest import ROOT
    rel = os.path.relpath(sys.executable, ROOT)  # the scripts run in the bundle's folder
    r = script("validate.py", "--detect", str(inputs["detect"]), "--python", rel, "--runtime", "host")
    want = os.path.join(str(ROOT), rel)  # (this interpreter has no vLLM: the probe names it, and no "python")
    assert r.doc["runtime_detail"]["host"].startswith(want + ": ") and os.path.isabs(want), r.doc["runtime_detail"]


def test_verify_with_another_key_in_the_shell_says_auth_and_names_the_variable(script, tmp_path, inputs, live_tune,
                                                                                monkeypatch):  # noqa: F811
    """A server started with one key, verified from a shell whose variable holds another: verify said
    "FAILED in phase models ... (HTTP 401)" and "do not retry, do not debug", as if the server were broken.
    It is phase auth, and the fix names the variable that must hold the server's key."""
    monkeypatch.setenv("MY_API_KEY", "sk-started-with")
    plan_file, _ = host_plan(tmp_path, inputs, live_tune, expose=True, api_key_env="MY_API_KEY")
    try:
        assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
        r = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "20",
                   env={"MY_API_KEY": "sk-another-one"})
        assert r.code == 1 and r.doc["phase"] == "auth" and "HTTP 401" in r.doc["error"], r.doc
        assert "MY_API_KEY" in r.doc["fix"] and "do not retry" not in r.doc["fix"], r.doc
        assert "sk-started-with" not in r.stdout + r.stderr and "sk-another-one" not in r.stdout + r.stderr
        assert script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "20").code == 0  # the right key
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))


def test_a_local_folder_is_never_timed_as_a_hub_request(script, tmp_path):
    """--hub-timeout bounded the reading of a local folder too: at 0.0001 s a folder on this disk was "the Hub
    did not answer". Only a Hub id is timed; a folder is read however long it takes."""
    from model_fixtures import model_folder
    folder = str(model_folder("Qwen3-0.6B", tmp_path))  # config, tokenizer, a header-only checkpoint
    r = script("check_model.py", "--model", folder, "--vllm-version", "0.32.0", "--hub-timeout", "0.0001")
    assert r.code == 0 and r.doc["kind"] == "text" and "unreadable_reason" not in r.doc, r.doc
    e = script("estimate_memory.py", "--model", folder, "--ram-gb", "64", "--hub-timeout", "0.0001")
    assert e.code == 0 and e.doc["weight_source"] == "safetensors_headers", e.doc


def test_a_hub_past_its_deadline_ends_the_script_cleanly_every_time(script, tmp_path, monkeypatch):
    """A Hub call past --hub-timeout leaves its thread inside the Hub client; the interpreter's teardown with
    that thread still in C code crashed once in a while (exit 139 after a correct document). The script now
    leaves at once when its document is out: exit 1 and one document, each of several tries."""
    from hub_server import Hub
    monkeypatch.delenv("HF_TOKEN", raising=False)
    hub = Hub().start()
    try:
        hub.hang_seconds = 30
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_ETAG_TIMEOUT": "20"}
        for _ in range(3):
            e = script("estimate_memory.py", "--model", "err/hang", "--ram-gb", "64", "--hub-timeout", "0.5", env=env)
            assert e.code == 1 and "did not answer within 0.5s" in e.doc["error"], (e.code, e.doc)
    finally:
        hub.stop()


def test_skill_step_3_runs_on_the_stock_container_path_before_the_image_is_pulled(tmp_path, inputs, rt):  # noqa: F811
    """validate is ready on the stock container path with the image not pulled, and its stack.vllm is null (the
    `latest` tag names no version): SKILL.md's Step 3 then ran check_model --vllm-version None, exit 1. Step 3
    says what VLLM is then (data/epyc.json's vllm_version, as up uses), and its container line runs as written."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    from common import load_epyc
    from conftest import ROOT, run_script
    from docs import commands
    _, env = rt  # a docker that answers, with no image pulled
    val = run_script("validate.py", "--detect", str(inputs["detect"]), "--stock", env=env)
    assert val.code == 0 and val.doc["runtime"] == "docker" and val.doc["stack"]["vllm"] is None, val.doc
    skill = (ROOT / "SKILL.md").read_text()
    assert "null when the stock image is not pulled yet" in skill and "`vllm_version` from `data/epyc.json`" in skill
    vllm = val.doc["stack"]["vllm"] or load_epyc()["vllm_version"]  # the rule SKILL.md states
    line = next(c.line for c in commands("SKILL.md") if c.script == "check_model.py" and c.tag == "container path")
    shell_env = {**os.environ, **env, "PATH": f"{Path(sys.executable).parent}:{env['PATH']}", "RUN": str(tmp_path),
                 "MODEL": str(Path(inputs["detect"]).parent / "models" / "Qwen3-0.6B"), "REV": "main", "VLLM": vllm,
                 "IMAGE": val.doc["image"], "RUNTIME": val.doc["runtime"]}
    res = subprocess.run(["bash", "-c", line], env=shell_env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    doc = json.loads((tmp_path / "check.json").read_text())
    assert res.returncode == 0 and doc["kind"] == "text" and doc["vllm_version"] == vllm, doc
    assert any("is not pulled" in n and "snapshot" in n for n in doc["notes"]), doc["notes"]


def no_runtime_until_built(docs: dict):
    """up's steps on a machine with no runtime until the host stack is built -> (step, the builds made)."""
    no_runtime = {"ok": False, "ready": False, "errors": [{"check": "runtime", "message": "no runtime", "fix": "-"}]}
    built: list[bool] = []

    def step(script, args, phase, run_dir, allow_fail=False):
        if script == "setup_host_stack.py":
            built.append(True)
            return {"python": "/usr/bin/python3"}
        return (docs["validate"] if built else no_runtime) if phase == "validate" else docs[phase]
    return step, built


def test_with_no_terminal_up_shows_each_question_and_says_what_a_yes_does(inputs, tmp_path, monkeypatch,
                                                                          capsys):  # noqa: F811
    """With no terminal, up's host-stack question was never shown (ask failed before it wrote), and both of
    up's no-terminal errors pointed to "launch.py plan ..." with no phase or plan file: an agent was told to
    answer --yes to a question it had not read. The question now goes to stderr; each error names its phase,
    says what a --yes does, and the plan's names the up folder's plan.json."""
    import launch
    from common import ScriptError, load_epyc
    from test_audit33_regressions import up_with_no_terminal
    from test_launch import load_docs
    docs = load_docs(inputs)
    step, built = no_runtime_until_built(docs)
    a, launched = up_with_no_terminal(monkeypatch, docs, tmp_path / "up", 18621)
    monkeypatch.setattr(launch, "step", step)
    with pytest.raises(ScriptError, match="no terminal") as asked:
        launch.up(a, load_epyc())
    err = capsys.readouterr().err
    assert "Build the host venv now?" in err and "pip install" in err, err  # the question a --yes answers
    doc = asked.value.as_json()
    assert doc["phase"] == "validate" and doc["started"] is False and "--yes" in doc["fix"], doc
    assert "launch.py plan" not in doc["fix"] and not built
    a.yes = True
    with pytest.raises(ScriptError, match="up had not shown this plan"):  # built; the plan shown, held
        launch.up(a, load_epyc())
    a.yes = False
    with pytest.raises(ScriptError, match="no terminal") as asked:
        launch.up(a, load_epyc())
    doc = asked.value.as_json()
    assert doc["phase"] == "confirm" and doc["plan_file"] == str(tmp_path / "up" / "plan.json"), doc
    assert "launch.py plan" not in doc["fix"] and "--yes" in doc["fix"] and not launched
    assert capsys.readouterr().err.count("Launch this?") == 0  # the summary was logged once, not the prompt too


@pytest.mark.parametrize("out", ["new/run1", None, "a/../b/c", "afile/sub"])
def test_a_refused_container_bench_makes_nothing(script, tmp_path, inputs, rt, out):  # noqa: F811
    """The container path made --out and its raw/ before it found no container of this plan's own (and left
    them, as did the default bench-TIME folder, and `new/../x` left `new`). Every refusal now comes before
    anything is made; an --out that cannot be made is refused by name, before the server is even asked."""
    from test_launch import container_plan
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    _, env = rt
    (tmp_path / "afile").write_text("x")
    before = sorted(p.name for p in tmp_path.iterdir())
    args = ["--repeats", "1", "--input-lens", "16", "--concurrency", "1", "--output-len", "4", "--no-bandwidth"]
    where = ["--out", str(tmp_path) + "/" + out] if out else []
    r = script("bench.py", "--plan", str(plan_file), *where, *args, env=env)
    assert r.code == 1, r.doc
    if out == "a/../b/c":
        assert "'..'" in r.doc["error"], r.doc
    elif out == "afile/sub":
        assert "not a folder this user may write in" in r.doc["error"], r.doc
    else:
        assert r.doc["error"].startswith("no server from this plan is running"), r.doc
    assert sorted(p.name for p in tmp_path.iterdir()) == before and not list(tmp_path.glob("st/bench-*"))


# ---- the review of the fixes above

def test_a_failed_launch_keeps_the_showing_so_the_retry_is_held_to_it(inputs, tmp_path, monkeypatch):  # noqa: F811
    """The showing was used up before the serve: a start that failed (its port taken, the case the showing
    guards against) left nothing to hold the next --yes to, and validate's next free port launched unseen.
    Only a serve that went through uses it up."""
    import launch
    from common import ScriptError, load_epyc
    from test_audit33_regressions import up_with_no_terminal
    from test_launch import load_docs
    docs = load_docs(inputs)
    a, launched = up_with_no_terminal(monkeypatch, docs, tmp_path / "up", None)
    with pytest.raises(ScriptError, match="no terminal"):
        launch.up(a, load_epyc())
    shown_port = docs["validate"]["port"]

    def port_busy(plan, plan_file, *rest):
        launched.append(plan)
        raise ScriptError("FAILED in phase start: port busy", "-", phase="start")
    monkeypatch.setattr(launch, "serve_verified", port_busy)
    a.yes = True
    with pytest.raises(ScriptError, match="port busy"):
        launch.up(a, load_epyc())  # what was shown: launched (and failed)
    docs["validate"] = {**docs["validate"], "port": shown_port + 1}  # validate's next free port
    with pytest.raises(ScriptError, match=r"the plan changed since up showed it \(pre_argv, command\)"):
        launch.up(a, load_epyc())
    assert [p["port"] for p in launched] == [shown_port]


def test_a_yes_after_a_plan_was_shown_does_not_build_the_host_stack_unasked(inputs, tmp_path, monkeypatch,
                                                                            capsys):  # noqa: F811
    """A plan shown (a runtime then), the runtime gone before the --yes: the yes built the host stack (a
    90-130 s install) that no question had shown. It answers the plan only: the build's question is shown and
    held, and the --yes after it builds."""
    import launch
    from common import ScriptError, load_epyc
    from test_audit33_regressions import up_with_no_terminal
    from test_launch import load_docs
    docs = load_docs(inputs)
    a, launched = up_with_no_terminal(monkeypatch, docs, tmp_path / "up", 18631)
    with pytest.raises(ScriptError, match="no terminal"):
        launch.up(a, load_epyc())  # a plan shown
    step, built = no_runtime_until_built(docs)
    monkeypatch.setattr(launch, "step", step)
    a.yes = True
    capsys.readouterr()
    with pytest.raises(ScriptError, match="not built: what up showed last was not this question") as held:
        launch.up(a, load_epyc())
    assert held.value.extra["phase"] == "validate" and not built and not launched
    assert "Build the host venv now?" in capsys.readouterr().err
    with pytest.raises(ScriptError, match="up had not shown this plan"):
        launch.up(a, load_epyc())  # the question shown: this yes builds, then shows the plan
    assert built and not launched


def test_what_a_held_showing_says_is_true():
    """A showing up could not read was called "the host stack's question"; one an older bundle wrote (no
    `secrets`) was "changed (secrets)" though nothing changed; a request with a key this bundle does not
    record named no flag ("(-- differ)")."""
    from launch import showing_differs, up_request
    import argparse
    now = {"pre_argv": [], "command": "vllm serve m --port 1", "env": {}, "secrets": []}
    req = up_request(argparse.Namespace(**{k: None for k in __import__("launch").UP_REQUEST_FLAGS}), "m")
    assert showing_differs(None, now, req).startswith("up could not read the plan it showed last")
    assert showing_differs({"x": 1}, now, req).startswith("up could not read the plan it showed last")
    assert "host stack" in showing_differs({"question": "Build the host venv now?"}, now, req)
    old = {k: v for k, v in now.items() if k != "secrets"}
    assert showing_differs(old, now, req) == "up's last showing does not record the plan's secrets (an older bundle wrote it)"
    other = {**now, "command": "vllm serve m --port 2", "request": {**req, "old_flag": 1}}
    assert showing_differs(other, now, req) == "the plan changed since up showed it (command)"
    assert showing_differs({**now, "request": {**req, "old_flag": 1}}, now, req) is None


def test_bench_refuses_an_unsettled_endpoint_before_it_makes_the_out_folder(tmp_path, inputs, live_tune,
                                                                             monkeypatch):  # noqa: F811
    """An unknown endpoint that verify has not settled was refused inside the runs, after --out/raw was made."""
    import bench
    from common import ScriptError
    plan_file, _ = host_plan(tmp_path, inputs, live_tune, edit=lambda d: d["check_model"].update(primary_endpoint=None))
    monkeypatch.setattr(bench, "require_own_host_server", lambda plan, state: None)  # (a server of its own: stood in)
    out = tmp_path / "newout"
    with pytest.raises(ScriptError, match="the plan's endpoint is unknown and verify has not settled it"):
        bench.main(["--plan", str(plan_file), "--out", str(out), "--repeats", "1", "--input-lens", "16",
                    "--concurrency", "1", "--output-len", "4", "--no-bandwidth"])
    assert not out.exists()


def test_the_exit_after_an_abandoned_hub_call_happens_even_with_stderr_closed(monkeypatch, capsys):
    """A Hub call past its deadline leaves its thread: run_main must then leave by os._exit once the document
    is out (a thread in C code at teardown crashed the interpreter now and then), with the document's exit
    code, and a closed stderr (`2>&-`, sys.stderr None) neither skips that nor turns a success into exit 1."""
    import os
    import sys
    import time
    import common
    import hf_model
    exits = []
    monkeypatch.setattr(os, "_exit", exits.append)
    monkeypatch.setattr(common, "_ABANDONED", [])

    def main(argv):
        try:
            hf_model.with_deadline(lambda: time.sleep(2), 0.05)
        except hf_model.Unreadable as why:
            return {"said": why.message}, common.EXIT_OK
        return {"said": "no deadline"}, common.EXIT_FAIL
    monkeypatch.setattr(sys, "stderr", None)
    common.run_main(main, [])
    doc = json.loads(capsys.readouterr().out)
    assert exits == [0] and doc["ok"] is True and "did not answer within 0.05s" in doc["said"], (exits, doc)


def test_validate_expands_a_tilde_in_python(script, inputs, tmp_path):  # noqa: F811
    """`--python=~/venv/bin/python` (bash leaves that ~ alone) passed the existence check, which expands it,
    and came back as CWD/~/venv/bin/python."""
    import sys
    (tmp_path / "py").symlink_to(sys.executable)
    r = script("validate.py", "--detect", str(inputs["detect"]), "--python=~/py", "--runtime", "host",
               env={"HOME": str(tmp_path)})
    assert r.doc["runtime_detail"]["host"].startswith(f"{tmp_path}/py: "), r.doc["runtime_detail"]


def test_a_showing_that_is_no_object_holds_the_build_with_a_clear_error(inputs, tmp_path, monkeypatch):  # noqa: F811
    """Found re-reading the change: a shown-plan.json holding a JSON list made `up --yes` with no runtime end
    as `internal error: AttributeError` (the build's check read it as an object). It is no showing: held."""
    import launch
    from common import ScriptError, load_epyc
    from test_audit33_regressions import up_with_no_terminal
    from test_launch import load_docs
    docs = load_docs(inputs)
    run_dir = tmp_path / "up"
    run_dir.mkdir()
    (run_dir / "shown-plan.json").write_text("[1]")
    a, launched = up_with_no_terminal(monkeypatch, docs, run_dir, 18641)
    step, built = no_runtime_until_built(docs)
    monkeypatch.setattr(launch, "step", step)
    a.yes = True
    with pytest.raises(ScriptError, match="not built: what up showed last was not this question"):
        launch.up(a, load_epyc())
    assert not built and not launched
