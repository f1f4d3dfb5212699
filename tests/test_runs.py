"""The run folder (epyc.deployments.runs): each step keeps its document there and the next one reads it; only the
user's choices travel on the command line."""

from __future__ import annotations

import json

from model_fixtures import FIXTURES

CONFIG = FIXTURES / "Qwen3-0.6B" / "config.json"


def test_a_remote_plan_chains_through_the_run_folder_with_only_the_users_choices(script, tmp_path):
    """detect --spec, validate, check_model --config, estimate, cpu_tune, plan: no file flag, no shell variable,
    nothing probed on this machine; the plan serves one socket of the described host with its memory."""
    run = str(tmp_path / "box")
    steps = [
        ("detect.py", "--spec", "9654", "--sockets", "2", "--ram-gb-per-socket", "384", "--run", run),
        ("validate.py", "--run", run),
        ("check_model.py", "--model", "Qwen/Qwen3-0.6B", "--config", str(CONFIG), "--run", run),
        ("estimate_memory.py", "--config", str(CONFIG), "--run", run),
        ("cpu_tune.py", "--run", run),
        ("launch.py", "plan", "--run", run),
    ]
    for name, *args in steps:
        r = script(name, *args, env={"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:1"})
        assert r.code == 0, (name, r.doc)
        kept = json.loads((tmp_path / "box" / f"{name[:-3] if name != 'launch.py' else 'plan'}.json").read_text())
        assert kept == r.doc  # what was printed is what the next step reads
    chk = json.loads((tmp_path / "box" / "check_model.json").read_text())
    # a folder with configs only: the chat template in the tokenizer_config.json beside config.json is read
    assert chk["source"] == "config" and chk["kind"] == "text" and chk["primary_endpoint"] == "chat_completions"
    assert chk["chat_template"]["source"] == "tokenizer_config.json" and chk["gated"] == "unknown"
    est = json.loads((tmp_path / "box" / "estimate_memory.json").read_text())
    assert est["weight_source"] == "config_parameter_count" and est["avx512_bf16"] is True
    plan = r.doc
    assert plan["deferred"] and "--device" not in plan["argv"] and plan["primary_endpoint"] == "chat_completions"
    # planned offline, the Hub not asked: the human is told what the host needs if the model is gated
    gated = next(w for w in plan["warnings"] if w["check"] == "gated")
    assert "gated: unknown" in gated["message"] and "export HF_TOKEN=" in gated["fix"]
    assert "Qwen/Qwen3-0.6B: gated: unknown" in plan["summary_markdown"]
    assert "--cpuset-cpus=0-95,192-287" in plan["argv"] and "--cpuset-mems=0" in plan["argv"]
    assert "96 cores on socket 0 (host: 2 sockets, 192 cores)" in plan["summary_markdown"]
    # the fit against the host's RAM, and what the one serving socket holds
    assert "vs 768.0 GiB RAM; the serving socket holds 384.0 GiB |" in plan["summary_markdown"]
    start = script("launch.py", "start", "--run", run, "--confirm")  # a plan for another host never starts here
    assert start.code == 1 and "not this machine" in start.doc["error"]


def test_a_step_refuses_what_a_failed_earlier_step_left(script, tmp_path):
    run = str(tmp_path / "r")
    bad = script("estimate_memory.py", "--config", str(CONFIG), "--ram-gb", "1", "--run", run)
    assert bad.code == 1 and json.loads((tmp_path / "r" / "estimate_memory.json").read_text())["ok"] is False
    r = script("cpu_tune.py", "--run", run)
    assert r.code == 1 and r.doc["error"].startswith("the estimate_memory step failed: does not fit")
    assert r.doc["fix"] == bad.doc["fix"]
    # given every value that document holds by flags, the step does not read it
    r = script("cpu_tune.py", "--weight-gb", "1.1", "--kv-needed-gb", "0.5", "--run", run)
    assert r.code == 0 and r.doc["weight_gb"] == 1.1
    assert script("detect.py", "--spec", "9654", "--run", run).code == 1  # a detect.json that failed too
    r = script("estimate_memory.py", "--config", str(CONFIG), "--ram-gb", "24", "--avx512-bf16", "yes", "--run", run)
    assert r.code == 0 and r.doc["fit"]["ram_gb"] == 24


def test_plan_names_the_missing_step_and_a_bad_run_name_is_refused(script, tmp_path):
    r = script("launch.py", "plan", "--run", str(tmp_path / "empty"))
    assert r.code == 1 and "no detect.json in the run folder" in r.doc["error"]
    assert "detect.py --run" in r.doc["fix"]
    r = script("detect.py", "--run", "-x")
    assert r.code == 1 and "bad arguments" in r.doc["error"]
    r = script("detect.py", "--run", "a b")
    assert r.code == 1 and "not a plain name" in r.doc["error"]


def test_a_plain_run_name_lives_in_the_users_cache(tmp_path, monkeypatch):
    from epyc.deployments import runs

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert runs.run_dir("box9654") == tmp_path / "cache" / "serving-llms-on-epyc" / "run" / "box9654"
    assert runs.run_dir("./here") == runs.Path.cwd() / "here"


def test_a_step_refused_for_its_arguments_leaves_no_older_document_to_read(script, tmp_path):
    run = str(tmp_path / "r")
    assert script("estimate_memory.py", "--config", str(CONFIG), "--run", run).code == 0
    bad = script("estimate_memory.py", "--config", str(CONFIG), "--max-model-len", "4", "--run", run)
    assert bad.code == 1 and "bad arguments" in bad.doc["error"]
    r = script("cpu_tune.py", "--run", run)  # the refusal is what the run folder now says, not the older fit
    assert r.code == 1 and r.doc["error"].startswith("the estimate_memory step failed: bad arguments")


def test_check_model_judges_a_config_only_under_the_name_given(script, tmp_path):
    r = script("check_model.py", "--config", str(CONFIG), "--run", str(tmp_path / "r"))
    assert r.code == 1 and "--model" in r.doc["fix"]
    (tmp_path / "alone").mkdir()
    lone = tmp_path / "alone" / "config.json"  # nothing beside it
    lone.write_text(CONFIG.read_text())
    r = script("check_model.py", "--model", "Qwen/Qwen3-0.6B", "--config", str(lone), "--run", str(tmp_path / "r"))
    # no chat template with a config alone: check_model says what plan and verify say (verify settles it)
    assert r.code == 0 and r.doc["primary_endpoint"] == "unknown" and "/v1/completions" not in r.doc["message"]
    assert "verify settles it on the server, chat first, then completions" in r.doc["message"]
