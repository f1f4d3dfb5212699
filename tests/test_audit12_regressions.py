"""Regressions from the twelfth independent bad-input audit (2026-12-02, a fresh helper on the eleventh
audit's fixes: 1,309 cases, 10 findings) and the lesser cases it noted, and from the thirteenth (the same
day, on the twelfth's fixes: 1,242 cases, 5 findings; at the end). Classes: tests/BAD_INPUT.md."""
import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, run_script
from hub_server import Hub
from model_fixtures import FIXTURES, model_folder
from test_launch import container_plan, host_plan, inputs, live_tune, rt  # noqa: F401  (fixtures)

TOKEN = "hf_QzXwVuTsRqPoNmLk9876"  # no run of 6 of its characters appears in any output by chance


def leaks(text: str, secret: str = TOKEN, run: int = 6) -> list[str]:
    """Every run of `run` characters of the secret that the text shows: a secret is never printed in part."""
    return [secret[i:i + run] for i in range(len(secret) - run + 1) if secret[i:i + run] in text]


@contextlib.contextmanager
def another_process_holding(lock_file: str):
    """Another process holds that lock file exactly as start (.lock) or up (.up.lock) does."""
    import subprocess
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
                               lock_file], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.wait(timeout=10)


# ---- F1: a runtime CLI that cannot be executed, while kernel_proof streams its log

@pytest.mark.parametrize("body", [b"not a program\n", b"", b"#!/nonexistent/interpreter\n"])
def test_kernel_proof_names_a_runtime_it_cannot_run(script, inputs, rt, tmp_path, body):  # noqa: F811
    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    broken = tmp_path / "broken-bin"
    broken.mkdir()
    (broken / "docker").write_bytes(body)
    (broken / "docker").chmod(0o755)
    # kernel_proof asks the runtime which container has the name before it reads a log: a CLI that cannot
    # run answers nothing, and nothing is read (the thirtieth audit)
    r = script("kernel_proof.py", "--plan", str(plan_file), env={**env, "PATH": f"{broken}:/usr/bin:/bin"})
    assert r.code == 1 and "did not say whether a container named" in r.doc["error"] and "docker" in r.doc["fix"], \
        r.doc


# ---- F2: a secret across the 64 KiB piece a long log line is read in

def test_a_secret_across_a_long_lines_read_cut_is_never_shown_in_part(script, tmp_path):
    from kernel_proof import LINE_READ_CHARS
    log = tmp_path / "server.log"
    pad = LINE_READ_CHARS - 10  # the token begins 10 characters before the cut
    log.write_text("y" * pad + f"{TOKEN} fallback to ref\n"
                   + "y" * pad + f"{TOKEN} [API  ][info   ][0.1]: LOWOHA matmul_direct: M=1, plugin_op=zentorch_linear kernel=brgemm\n"
                   + f"fallback {TOKEN} whole\n"
                   + "[API  ][info   ][0.1]: LOWOHA matmul_direct: M=1, plugin_op=zentorch_mm kernel=k\n")
    r = script("kernel_proof.py", "--log", str(log), env={"HF_TOKEN": TOKEN})
    assert r.code == 0 and r.doc["zentorch_matmuls"] == 1, r.doc
    assert not leaks(r.stdout + r.stderr), leaks(r.stdout + r.stderr)
    assert r.doc["fallback_lines"] == ["fallback *** whole"]  # a whole secret reads ***


def test_the_line_reader_masks_first_and_drops_a_long_lines_rest():
    import io
    import common
    from kernel_proof import LINE_READ_CHARS, line_heads
    text = ("a" * (LINE_READ_CHARS - 5) + TOKEN + " tail\n"     # cut inside the token
            + "b" * (3 * LINE_READ_CHARS) + "\n"              # three pieces long: one line, not three
            + f"short {TOKEN}\n" + "last, no newline")
    got = list(line_heads(io.StringIO(text), [TOKEN]))
    assert len(got) == 4 and not leaks("".join(got))
    reach = max(map(len, common.secret_forms([TOKEN])))  # the longest form text can carry it in (base64's)
    assert reach >= len(TOKEN)
    assert got[0] == "a" * (LINE_READ_CHARS - reach) + "\n"  # masked, then its last `reach` dropped
    assert got[1] == "b" * (LINE_READ_CHARS - reach) + "\n"
    assert got[2:] == ["short ***\n", "last, no newline"]
    assert list(line_heads(io.StringIO("x" * LINE_READ_CHARS), [])) == ["x" * LINE_READ_CHARS + "\n"]


def test_a_container_logs_error_never_shows_a_secret_in_part(script, inputs, rt, tmp_path):  # noqa: F811
    from kernel_proof import LINE_READ_CHARS
    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    (d / "logs_text").write_text("x" * (LINE_READ_CHARS - 10) + f"{TOKEN} error\n")
    (d / "logs_exit").write_text("1")
    r = script("kernel_proof.py", "--plan", str(plan_file), env={**env, "HF_TOKEN": TOKEN})
    assert r.code == 1 and "logs exited 1" in r.doc["error"] and not leaks(r.stdout + r.stderr), r.doc


# ---- F3: verify's log tail, cut at 256 KiB before it was masked

def test_the_host_log_tail_drops_the_line_its_window_cuts(tmp_path, monkeypatch):
    import serve_life
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    log = tmp_path / "server.log"
    body = "start\n" + "q" * 100 + TOKEN + " died here\n"
    log.write_text(body + "f" * (serve_life.LOG_TAIL_BYTES - 21) + "\n")  # the window begins 20 bytes before
    plan = {"path": "host", "log_file": str(log), "secrets": {"HF_TOKEN": "HF_TOKEN"}}  # the token line's end
    tail = serve_life.log_tail(plan)
    assert len(tail) == 1 and tail[0].startswith("fff") and not leaks(json.dumps(tail)), tail
    log.write_text(body)  # all of it in the window: the token line whole, masked
    assert serve_life.log_tail(plan) == ["start", "q" * 100 + "*** died here"]


@pytest.mark.parametrize("failure", ["output_limit", "timeout"])
def test_the_container_log_tail_drops_the_line_its_limit_cuts(monkeypatch, failure):
    import common
    import serve_life
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    cut = "INFO ready\n" + "c" * 100 + TOKEN[:10]  # the reader stopped inside the token
    asked = []
    monkeypatch.setattr(common, "run", lambda argv, **kw: asked.append(argv) or common.RunResult(argv, None, cut, "",
                                                                                                 failure))
    plan = {"path": "container", "runtime": "docker", "container_name": "epyc-test",
            "secrets": {"HF_TOKEN": "HF_TOKEN"}}
    assert serve_life.log_tail(plan, state={"container_id": "c" * 64}) == ["INFO ready"]
    assert asked[0][-1] == "c" * 64  # the recorded container's log, by id (the thirtieth audit's review)


# ---- F4: an empty or relative XDG_CACHE_HOME, or a relative HOME

def test_the_cache_folder_is_absolute_or_a_clear_error(monkeypatch, tmp_path):
    import common
    monkeypatch.setenv("HOME", str(tmp_path))
    for xdg in ("", "rel-cache", "./x"):
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
        assert common.cache_root() == tmp_path / ".cache"  # the XDG spec: invalid, ignored
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert common.cache_root() == tmp_path / "xdg"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "rel-home")
    with pytest.raises(common.ScriptError, match="HOME 'rel-home' is not an absolute path"):
        common.cache_root()


def test_no_script_puts_its_venv_or_run_folder_under_the_current_folder(script, tmp_path):
    # --stock: the venv's name is the point here, not whether zentorch would run on this runner's CPU
    r = script("setup_host_stack.py", "--stock", "--check", env={"XDG_CACHE_HOME": "rel-cache", "HOME": str(tmp_path)})
    assert r.code == 1 and f"{tmp_path}/.cache/serving-llms-on-epyc/venv-vllm-" in r.doc["error"], r.doc
    r = script("launch.py", "up", "--model", "Qwen/Qwen3-0.6B", "--yes", env={"XDG_CACHE_HOME": "", "HOME": "rel-home"})
    assert r.code == 1 and "HOME 'rel-home' is not an absolute path" in r.doc["error"], r.doc
    assert not (ROOT / "rel-cache").exists() and not (ROOT / "serving-llms-on-epyc").exists()


# ---- F5: whose interpreter a marked venv holds is settled before pip runs with it

def test_a_marked_venv_wrapping_another_interpreter_is_refused_before_pip(script, tmp_path):
    import setup_host_stack as shs
    venv = tmp_path / "marked"
    (venv / "bin").mkdir(parents=True)
    (venv / shs.OWNER_FILE).write_text("x")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    calls = tmp_path / "calls.log"
    # a wrapper reads no pyvenv.cfg: it is the suite's interpreter, whose purelib is outside the venv. Should
    # the check regress, pip is recorded and refused here: it must never install into the suite's own venv
    (venv / "bin" / "python").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n"
                                         f"[ \"$1 $2\" = \"-m pip\" ] && exit 1\nexec {sys.executable} \"$@\"\n")
    (venv / "bin" / "python").chmod(0o755)
    r = script("setup_host_stack.py", "--stock", "--venv", str(venv), timeout=300)
    assert r.code == 1 and "outside the venv" in r.doc["error"], r.doc
    assert "-m pip" not in calls.read_text() and not list(venv.rglob("*.dist-info"))


# ---- F6: a memory size with hundreds of digits

@pytest.mark.parametrize("where", ["proc", "node"])
@pytest.mark.parametrize("digits", [25, 400, 5000])
@pytest.mark.parametrize("tool", ["detect.py", "cpu_tune.py"])
def test_a_memory_size_past_any_host_is_a_malformed_file(script, make_sysroot, tool, where, digits):
    root = make_sysroot("masked_genoa")
    meminfo = root / "proc" / "meminfo" if where == "proc" else next(root.glob("sys/devices/system/node/node0/meminfo"))
    text = meminfo.read_text()
    meminfo.write_text(text.replace("MemTotal:", "MemTotal: " + "9" * digits + " kB\nOld:", 1))
    r = script(tool, "--sysroot", str(root))
    assert r.code == 1 and "malformed topology file: MemTotal" in r.doc["error"], r.doc


def test_a_host_with_no_memory_is_refused(script, make_sysroot):
    root = make_sysroot("masked_genoa")
    meminfo = root / "proc" / "meminfo"
    meminfo.write_text(meminfo.read_text().replace("MemTotal:", "MemTotal: 0 kB\nOld:", 1))
    for tool in ("detect.py", "cpu_tune.py"):
        r = script(tool, "--sysroot", str(root))
        assert r.code == 1 and "no MemTotal above 0" in r.doc["error"], r.doc


def test_parse_meminfo_bytes_bounds():
    import detect
    assert detect.parse_meminfo_bytes("MemTotal:  24684092 kB") == 24684092 * 1024
    assert detect.parse_meminfo_bytes("Node 0 MemTotal:       0 kB") == 0  # a memoryless node is real
    assert detect.parse_meminfo_bytes("MemFree: 1 kB") is None
    for bad in ("MemTotal: " + "1" * 21 + " kB", f"MemTotal: {(1 << 50)} kB"):
        with pytest.raises(ValueError):
            detect.parse_meminfo_bytes(bad)


# ---- F7: vllm_registry's --python and --wheel

@pytest.mark.parametrize("args,needle", [(["--wheel="], "--wheel: is empty"), (["--python="], "--python: is empty"),
                                         (["--python", "python3"], "'python3' is not an executable file")])
def test_vllm_registry_never_probes_an_interpreter_it_was_not_given(script, args, needle):
    r = script("vllm_registry.py", *args)
    assert r.code == 1 and needle in r.doc["error"], r.doc


# ---- F8: a vocab_size past any model

def test_a_vocab_size_past_any_model_is_a_schema_error(script, tmp_path):
    cfg = json.loads((FIXTURES / "Qwen3-0.6B" / "config.json").read_text())
    cfg["vocab_size"] = int("9" * 400)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(path.read_text())
    for where in (["--config", str(path), "--model", "x/y", "--weight-gb", "2"], ["--model", str(folder)],
                  ["--model", str(folder), "--weight-gb", "2"]):
        r = script("estimate_memory.py", *where, "--ram-gb", "64")
        assert r.code == 1 and "field vocab_size" in r.doc["error"], r.doc


# ---- F9: kernel_proof reads only the log start wrote

@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_kernel_proof_never_takes_a_planted_link_as_the_servers_log(script, tmp_path, inputs, live_tune, kind):  # noqa: F811
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    Path(plan["state_dir"]).mkdir(parents=True, exist_ok=True)
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("[API  ][info   ][0.1]: LOWOHA matmul_direct: M=1, plugin_op=zentorch_linear kernel=from_elsewhere\n")
    link = Path(plan["log_file"])
    link.symlink_to(elsewhere) if kind == "symlink" else os.link(elsewhere, link)
    r = script("kernel_proof.py", "--plan", str(plan_file))
    assert r.code == 1 and "link" in r.doc["error"] and "from_elsewhere" not in r.stdout, r.doc
    link.unlink()
    r = script("kernel_proof.py", "--plan", str(plan_file))
    assert r.code == 1 and "has not been started" in r.doc["error"] and "launch.py start" in r.doc["fix"], r.doc


# ---- F10: the Hub's safetensors headers get a local header's checks

def _safetensors(header: dict) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * 64


@pytest.mark.parametrize("header,needle", [
    ({"a.weight": {"dtype": "Q99", "shape": [151936, 1024], "data_offsets": [0, 2]}}, "unknown dtype 'Q99'"),
    ({"a.weight": {"dtype": "BF16", "shape": [1.5, 10 ** 9], "data_offsets": [0, 2]}}, "invalid shape"),
    ({"a.weight": {"dtype": "BF16", "shape": [10 ** 200, 10 ** 200], "data_offsets": [0, 2]}}, ""),
])
def test_a_hub_checkpoints_header_is_checked_as_a_local_one(script, tmp_path, header, needle):
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "config.json").write_bytes((FIXTURES / "Qwen3-0.6B" / "config.json").read_bytes())
    (folder / "model.safetensors").write_bytes(_safetensors(header))
    hub = Hub().start()
    try:
        hub.add_folder("t/odd", folder)
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_ETAG_TIMEOUT": "3",
               "HF_HUB_DOWNLOAD_TIMEOUT": "3", "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0"}
        r = script("estimate_memory.py", "--model", "t/odd", "--ram-gb", "64", "--hub-timeout", "20", env=env)
    finally:
        hub.stop()
    assert r.code == 1 and "t/odd" in r.doc["error"] and "network" not in r.doc["fix"], r.doc
    assert needle in r.doc["error"] and "--weight-gb" in r.doc["fix"], r.doc


# ---- lesser: a served name that reads as a URL; bench's key inside a container; an HF cache that is a file

def test_a_served_name_that_reads_as_a_url_is_refused():
    from serve_plan import is_served_name
    assert is_served_name("org/model@v2") and is_served_name("my-model:latest")
    assert not is_served_name("http://user@host") and not is_served_name("s3://bucket/x")


def test_bench_passes_the_key_into_the_container_by_name_only():
    import bench
    plan = {"path": "container", "runtime": "docker", "container_name": "epyc-x", "model": "org/m",
            "argv": ["docker", "run", "-d", "--entrypoint", "vllm", "img", "serve", "org/m"], "api_key_env": "MY_KEY"}
    assert bench.serving_target(plan)["vllm"] == ["docker", "exec", "-e", "OPENAI_API_KEY", "epyc-x", "vllm"]
    assert bench.serving_target({**plan, "api_key_env": None})["vllm"] == ["docker", "exec", "epyc-x", "vllm"]


def test_an_hf_cache_that_is_a_file_is_refused(tmp_path):
    import validate
    from common import ScriptError
    f = tmp_path / "hf-file"
    f.write_text("x")
    with pytest.raises(ScriptError, match="is not a folder"):
        validate.resolve_hf_cache({"HF_HOME": str(f)})  # its hub would be inside a file
    with pytest.raises(ScriptError, match="is not a folder"):
        validate.resolve_hf_cache({"HF_HUB_CACHE": str(f)})
    with pytest.raises(ScriptError, match="HF_HOME is a relative path 'rel-hf'"):
        validate.resolve_hf_cache({"HF_HOME": "rel-hf"})  # each step would find its own folder


def test_a_hub_cache_not_named_hub_is_mounted_where_the_container_looks(script, inputs, rt, tmp_path):  # noqa: F811
    import validate
    from test_launch import plan_args
    models = tmp_path / "data" / "models"  # HF_HUB_CACHE=/data/models: models--ORG--NAME folders right there
    models.mkdir(parents=True)
    assert validate.resolve_hf_cache({"HF_HUB_CACHE": str(models)})["mount_subdir"] == "hub"
    named_hub = validate.resolve_hf_cache({"HF_HUB_CACHE": str(tmp_path / "hf" / "hub")})  # that folder, not its parent
    assert named_hub["path"] == str(tmp_path / "hf" / "hub") and named_hub["mount_subdir"] == "hub"
    doc = json.loads(Path(inputs["validate"]).read_text())
    doc["hf_cache"].update(path=str(models), mount_subdir="hub")
    Path(inputs["validate"]).write_text(json.dumps(doc))
    d, env = rt
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st")), env=env)
    assert r.code == 0 and f"{models}:/root/.cache/huggingface/hub" in r.doc["argv"], r.doc


def test_a_list_of_many_chat_templates_is_named_in_part():
    from check_model import MAX_TEMPLATE_NAMES, classify_template
    many = [{"name": f"t{i}", "template": "x"} for i in range(100_000)]
    got = classify_template(None, {"chat_template": many}, None)
    assert got["status"] == "ambiguous" and len(got["names"]) == MAX_TEMPLATE_NAMES + 1
    assert got["names"][-1] == "... (100000 in all)"
    many[50_000]["name"] = "default"  # a default past the names shown still decides
    got = classify_template(None, {"chat_template": many}, None)
    assert got["status"] == "present" and got["selected_name"] == "default"


# ---- thirteenth audit

def test_verify_masks_every_secret_of_the_shell_before_it_cuts_a_line(monkeypatch, tmp_path):
    """F1: the log tail masked the plan's secrets, cut at 1,000 characters, and only then met the full mask:
    an HF_ENDPOINT password (the host server inherits HF_ENDPOINT) or a DB_PASSWORD showed in part."""
    import serve_life
    password = "Pa55w0rdMirrorSecret"
    monkeypatch.setenv("HF_ENDPOINT", f"http://mirroruser:{password}@127.0.0.1:46999")
    monkeypatch.setenv("DB_PASSWORD", "Pw0rdDbSecretValue7788")
    log = tmp_path / "server.log"
    log.write_text("y" * 950 + f" cannot reach http://mirroruser:{password}@127.0.0.1:46999/api died\n"
                   + "x" * 990 + " Pw0rdDbSecretValue7788 died\n")
    tail = json.dumps(serve_life.log_tail({"path": "host", "log_file": str(log), "secrets": {}}))
    assert not leaks(tail, password) and not leaks(tail, "Pw0rdDbSecretValue7788"), tail[-400:]


def tail_of_a_plan_log(monkeypatch, tmp_path, line: str, env: dict) -> list[str]:
    """verify's log tail of a host plan passing HF_TOKEN and an API key in MYKEY, its log one line."""
    import serve_life
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    log = tmp_path / "server.log"
    log.write_text(line + "\n")
    return serve_life.log_tail({"path": "host", "log_file": str(log),
                                "secrets": {"HF_TOKEN": "HF_TOKEN", "VLLM_API_KEY": "MYKEY"}})


def test_a_key_holding_a_shorter_secret_is_masked_whole(monkeypatch, tmp_path, script):
    """F2: masked in plan order, an API key that holds the HF token lost only that part; the rest showed."""
    key = TOKEN + "ZZtailOfTheApiKey4455"
    assert tail_of_a_plan_log(monkeypatch, tmp_path, f"key reflected {key} died", {"MYKEY": key}) == \
        ["key reflected *** died"]
    log = tmp_path / "server.log"
    log.write_text(f"[API  ][info   ][0.1]: LOWOHA matmul_direct: M=1, plugin_op=zentorch_linear kernel=brgemm fallback {key} here\n")
    r = script("kernel_proof.py", "--log", str(log), env={"HF_TOKEN": TOKEN, "MY_API_KEY": key})
    assert r.code == 0 and "tailOfTheApiKey" not in r.stdout and "***" in r.doc["sample"], r.doc


def test_stop_stops_a_server_whose_state_file_has_another_name(script, tmp_path, inputs, live_tune):  # noqa: F811
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


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


@pytest.mark.parametrize("templates", [
    [{"name": "default"}, {"name": "tool_use", "template": "x"}],     # no template
    ["{{ messages }}", "{{ other }}"],                                # plain strings
    [{"name": "default", "template": 42}],                            # not text
    [{"name": "a\nb", "template": "x"}, {"name": "c", "template": "y"}],  # a name with a newline
])
def test_a_chat_template_list_transformers_cannot_read_is_not_present(templates):
    """F4: such lists were "present" (chat endpoint, launchable); the server would fail at load."""
    from check_model import classify_template
    got = classify_template(None, {"chat_template": templates}, None)
    assert got["status"] == "unknown" and got["source"] == "tokenizer_config.json", got
    ok = classify_template(None, {"chat_template": [{"name": "default", "template": "x"}]}, None)
    assert ok["status"] == "present" and ok["selected_name"] == "default"


@pytest.mark.parametrize("env_name", ["HF_HOME", "HF_HUB_CACHE"])
def test_a_hub_folder_that_is_a_link_is_mounted_as_its_target(tmp_path, env_name):
    """F5: the link was mounted as a link: inside the container it named a host path that is not there."""
    import validate
    target = tmp_path / "big-disk" / "hub"
    target.mkdir(parents=True)
    home = tmp_path / "hf"
    home.mkdir()
    (home / "hub").symlink_to(target)
    got = validate.resolve_hf_cache({env_name: str(home if env_name == "HF_HOME" else home / "hub")})
    assert got["path"] == str(target) and got["mount_subdir"] == "hub" and "is a link to" in got["note"], got


def test_an_empty_home_is_the_accounts_home_not_the_root(monkeypatch):
    import pwd
    import common
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", "")
    assert common.cache_root() == Path(pwd.getpwuid(os.getuid()).pw_dir) / ".cache"


# ---- fourteenth audit

def test_kernel_proof_masks_a_secrets_json_form_and_url_credentials_before_it_cuts(script, tmp_path):
    """F1: each line was masked for raw values only; a secret's JSON-escaped form and a URL's password met
    their mask after the line was cut to 300 characters, and showed in part."""
    password = 'Pw0rd"Db\\SecretValue7788'
    escaped = json.dumps(password)[1:-1]
    log = tmp_path / "server.log"
    log.write_text("fallback " + "y" * 280 + escaped + " here\n"
                   + "fallback " + "z" * 270 + "http://someone:OtherPassw0rdXYZ12@mirror/x here\n"
                   + "[API  ][info   ][0.1]: LOWOHA matmul_direct: M=1, plugin_op=zentorch_mm kernel=k\n")
    r = script("kernel_proof.py", "--log", str(log), env={"DB_PASSWORD": password})
    assert r.code == 0 and len(r.doc["fallback_lines"]) == 2, r.doc
    shown = json.dumps(r.doc["fallback_lines"])
    assert not leaks(shown, password.replace('"', "").replace("\\", "")) and "OtherPass" not in shown, shown


@pytest.mark.parametrize("pw", ["Vault-{key}-AndMoreSecretTail77", "Vault-{hf}-AndMoreSecretTail77",
                                "Vault-token=AndMoreSecretTail77"])
def test_a_shell_secret_holding_a_plan_secret_is_masked_whole(monkeypatch, tmp_path, pw):
    """F2: the plan's secrets and the token pattern were masked before the shell's: a DB_PASSWORD holding the
    API key, the HF token or `token=` lost only that part, and its tail showed."""
    key = "K3yOfTheServerApi99"
    pw = pw.format(key=key, hf=TOKEN)
    assert tail_of_a_plan_log(monkeypatch, tmp_path, f"server says {pw} died", {"MYKEY": key, "DB_PASSWORD": pw}) == \
        ["server says *** died"]


def test_a_cache_path_too_long_to_hold_a_folder_is_a_clear_error(script, tmp_path):
    """F3: an HF_HOME of 4,092 bytes passed the length check, and HF_HOME/hub did not (an OSError)."""
    deep = str(tmp_path) + "/" + "/".join(["d" * 200] * 25)
    deep = deep[:4091] + "d"  # 4,092 bytes whatever tmp_path's length (xdist's is longer): HF_HOME/hub is 4,096
    assert len(deep) == 4092 and "//" not in deep
    r = script("validate.py", "--python", sys.executable, env={"HF_HOME": deep})
    assert r.code == 1 and "Hugging Face cache" in r.doc["error"], r.doc
    long_xdg = str(tmp_path) + "/" + "/".join(["x" * 200] * 20)
    for tool, args in (("validate.py", []), ("setup_host_stack.py", ["--check"])):
        r = script(tool, *args, env={"XDG_CACHE_HOME": long_xdg, "HF_HOME": str(tmp_path / "hf")})
        assert r.code == 1 and "XDG_CACHE_HOME is" in r.doc["error"] and "shorter" in r.doc["fix"], r.doc


def test_bench_reads_a_containers_result_within_the_document_limit(monkeypatch, tmp_path):
    """F4: `docker exec NAME cat` of a result was read and written whole (100 MB: 308 MB of memory) before
    the 64 MiB document limit refused it."""
    import argparse
    import bench
    import common
    calls = []

    def fake_run(argv, **kw):
        calls.append((argv, kw))
        if "cat" in argv:
            return common.RunResult(list(argv), None, "x" * 10, "printed more than", "output_limit")
        return common.RunResult(list(argv), 0, "", "")
    monkeypatch.setattr(common, "run", fake_run)
    monkeypatch.setattr(bench, "recorded_container", lambda plan: "c" * 64)  # the id its state would record
    plan = {"path": "container", "runtime": "docker", "container_name": "vllm-epyc-8000", "model": "org/m",
            "argv": ["docker", "run", "-d", "--entrypoint", "vllm", "img", "serve", "org/m"], "api_key_env": None, "primary_endpoint": "completions",
            "base_url": "http://127.0.0.1:8000/v1", "served_model_name": "org/m"}
    args = argparse.Namespace(input_lens=[128], concurrency=[1], repeats=1, output_len=8, seed=1)
    with pytest.raises(common.ScriptError, match="is over 67,108,864 bytes"):
        bench.run_matrix(plan, args, tmp_path / "out", {})
    assert calls[-1][1]["limit"] == common.MAX_INPUT_BYTES and not list((tmp_path / "out" / "raw").iterdir())
    assert [a[:3] for a, _ in calls] == [["docker", "exec", "c" * 64]] * 2  # into the recorded container


# ---- fifteenth audit

@pytest.mark.parametrize("value,text", [
    (TOKEN + "\r", f"sent {TOKEN} end"),                        # a Windows .env's line end: the client strips it
    ("\t" + TOKEN, f"sent {TOKEN} end"),
    ("FirstLineOfKey123\nSecondLineOfKey456", "says FirstLineOfKey123"),  # logs are masked a line at a time
    ("Latin\udce9Password123", "pw Latin\ufffdPassword123 end"),            # not UTF-8: read as the log reader does
])
def test_a_secret_is_masked_in_every_form_text_carries_it(value, text):
    """F1, F3, F6: a secret with a line end, a newline or a byte that is not UTF-8 was masked only as its
    exact value; the token a client sends, a line of it, or its decoded form printed whole."""
    import common
    masked = common.mask_forms(text, common.secret_forms([value]))
    assert "***" in masked and "Password123" not in masked and "Key123" not in masked and TOKEN not in masked


def test_two_overlapping_secrets_are_masked_as_one_span():
    """F2: masking one first hid the other's start, and its tail showed."""
    import common
    forms = common.secret_forms(["AAAAoverlapBBBB", "overlapBBBBCCCC"])
    assert common.mask_forms("server says AAAAoverlapBBBBCCCC died", forms) == "server says *** died"
    assert common.mask_forms("a abcd b abcd", ["abcd"]) == "a *** b ***"


@pytest.mark.parametrize("folder", ["/var/lib", "/usr/bin", "/usr/local/bin", "/lib/systemd", "/var/spool/cron",
                                    "/var/log", "/var/lib/containerd", "/var/lib/kubelet/pods", "/root/.ssh",
                                    "/home/u/.gnupg", "/var/tmp", "/mnt", "/media", "/snap",
                                    "/var/lib/containers", "/var/lib/dpkg", "/var/lib/etcd", "/root/.kube", "/lib32"])
def test_no_system_folder_is_mounted_as_the_hf_cache(folder):
    """F4: these passed the system-folder check and would be mounted read-write into a root container."""
    from serve_plan import system_folder
    assert system_folder(folder)
    assert not system_folder("/var/lib/hf-cache") and not system_folder("/mnt/data/hf")
    assert not system_folder("/root/.cache/huggingface")


def test_a_container_logs_error_shows_the_start_of_a_long_last_line(script, inputs, rt, tmp_path):  # noqa: F811
    """F5: the error showed the end of a line cut at 64 KiB: a URL's password before its '@'."""
    from kernel_proof import LINE_READ_CHARS
    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    (d / "logs_text").write_text("Error: " + "x" * (LINE_READ_CHARS - 40) + "https://someone:OtherPassw0rdXYZ@mirror\n")
    (d / "logs_exit").write_text("1")
    r = script("kernel_proof.py", "--plan", str(plan_file), env=env)
    assert r.code == 1 and "Error: xxx" in r.doc["error"] and "OtherPass" not in r.stdout, r.doc


# ---- sixteenth audit (df316f2's own per-line forms)

def test_a_short_or_many_line_secret_does_not_mask_words_or_slow_the_masker():
    """F2, F3: every 4-character line of a secret masked the bundle's own words and JSON keys ("error",
    "serve"), and a secret of thousands of lines made each log line thousands of searches."""
    import common
    forms = common.secret_forms(["abcdefgh12\nerror"])
    assert "error" not in forms and common.mask_forms('{"error": "x"}', forms) == '{"error": "x"}'
    pem = "\n".join(f"line{i:04d}" + "Q" * 60 for i in range(2000))
    # whole-value forms only (as is, JSON, URL and every-byte percent in two cases, hex in two, base64 and
    # base64url at three offsets), no per-line ones: 2,000 lines would make each log line 2,000 searches
    assert len(common.secret_forms([pem])) <= 16
    assert "line0001" + "Q" * 60 in common.secret_forms(["\n".join(f"line{i:04d}" + "Q" * 60 for i in range(52))])


# ---- seventeenth audit (365 cases, 8 findings)

def _plan_with_hf_cache(script, inputs, rt, tmp_path, path: str, subdir="hub"):  # noqa: F811
    """launch.py plan with validate.json's hf_cache edited to `path` (a hand-edited document)."""
    from test_launch import plan_args
    doc = json.loads(Path(inputs["validate"]).read_text())
    doc["hf_cache"].update(path=path, mount_subdir=subdir)
    Path(inputs["validate"]).write_text(json.dumps(doc))
    return script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st")), env=rt[1])


def _planned_with_a_cache(script, inputs, rt, tmp_path, cache: Path) -> Path:  # noqa: F811
    """A container plan whose hub cache is `cache`, a new empty folder: the plan's file."""
    cache.mkdir()
    r = _plan_with_hf_cache(script, inputs, rt, tmp_path, str(cache))
    assert r.code == 0, r.doc
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(r.stdout)
    return plan_file


@pytest.mark.parametrize("path", ["//var/run", "//", "//etc", "//root", "//proc"])
def test_a_doubled_leading_slash_never_gets_a_system_folder_mounted(script, inputs, rt, tmp_path, path):  # noqa: F811
    """F1: os.path.normpath keeps a leading '//', the runtime reads it as '/': //var/run (the docker socket's
    folder) passed every list and was mounted read-write."""
    from serve_plan import system_folder
    assert system_folder(path)
    r = _plan_with_hf_cache(script, inputs, rt, tmp_path, path)
    assert r.code == 1 and "argv" not in r.doc, r.doc


def test_a_cache_that_became_a_link_is_refused_at_plan_and_at_start(script, inputs, rt, tmp_path):  # noqa: F811
    """F1: a path linking to /etc, written into validate.json or made a link after plan, was mounted (the
    runtime follows links): the folder must be, now, at the very path validate recorded."""
    link = tmp_path / "lnk-etc"
    link.symlink_to("/etc")
    r = _plan_with_hf_cache(script, inputs, rt, tmp_path, str(link))
    assert r.code == 1 and "is /etc now" in r.doc["error"], r.doc
    cache = tmp_path / "hf"
    plan_file = _planned_with_a_cache(script, inputs, rt, tmp_path, cache)
    cache.rmdir()
    cache.symlink_to(tmp_path / "st")  # swapped for a link between plan and start
    s = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=rt[1])
    assert s.code == 1 and "not the folder validate.py checked" in s.doc["error"], s.doc
    assert not any(c["argv"][0] == "run" for c in _calls(rt[0]))


def _calls(d):
    f = d / "calls.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


def test_hf_hub_cache_mounts_that_folder_only(tmp_path):
    """F2: HF_HUB_CACHE=$HOME/hub mounted its parent, the whole home; /mnt/hub was refused as '/mnt'."""
    import validate
    hub = tmp_path / "home" / "hub"
    got = validate.resolve_hf_cache({"HF_HUB_CACHE": str(hub)})
    assert got["path"] == str(hub) and got["mount_subdir"] == "hub"
    from serve_plan import system_folder
    assert not system_folder("/mnt/hub") and not system_folder("/srv/hub") and not system_folder("/opt/hub")


@pytest.mark.parametrize("entries,foreign", [
    ([".bashrc", ".ssh", "hub", ".cache"], [".bashrc", ".ssh", "hub", ".cache"]),        # a home
    (["credentials", "config"], ["credentials", "config"]),                                # ~/.aws
    (["models--Qwen--Qwen3-0.6B", "datasets--a--b", "spaces--c--d", ".locks", "version.txt", "CACHEDIR.TAG",
      "version_diffusers_cache.txt", "lost+found"], []),                                   # a hub cache, a disk's
    (["models--Qwen--Qwen3-0.6B", "notes.txt"], ["notes.txt"]),
])
def test_only_a_hub_cache_is_mounted_read_write(entries, foreign):
    """Seventeenth F2: no list of system folders names a home, ~/.aws, ~/.config or /nix/store: what the
    folder holds is checked instead, against what Hugging Face libraries put in a hub cache."""
    from serve_plan import foreign_cache_entries, hf_mount_problem
    assert foreign_cache_entries(entries) == foreign
    problem = hf_mount_problem("/c", {"real": "/c", "entries": entries, "error": None})
    assert (problem is None) == (not foreign) and all(repr(e) in (problem or "") for e in foreign[:5])
    assert hf_mount_problem("/c", {"real": "/c", "entries": None, "error": None}) is None  # not there yet


def test_validate_refuses_a_home_as_the_containers_hub_cache_and_takes_a_busy_hf_home(script, tmp_path):
    """Seventeenth F2: HF_HUB_CACHE=/home/alice passed; validate now says why, before any plan. Eighteenth
    F2: an HF_HOME holding Gradio's, trackio's or a sandbox's files was refused: only its hub is mounted."""
    from conftest import detect_file
    home = tmp_path / "alice"
    (home / ".ssh").mkdir(parents=True)
    (home / ".bashrc").write_text("x")
    fake = ROOT / "tests" / "fakes" / "bin"
    rtd = tmp_path / "rt"
    rtd.mkdir()
    env = {"FAKE_RT_DIR": str(rtd), "PATH": f"{fake}:{os.environ['PATH']}", "HF_HUB_CACHE": str(home)}
    det = str(detect_file(tmp_path))
    r = script("validate.py", "--python", sys.executable, "--detect", det, env=env)
    assert r.code == 1 and "'.bashrc'" in r.doc["error"] and "read-write" in r.doc["error"], r.doc
    assert "HF_HUB_CACHE" in r.doc["fix"]
    hf_home = tmp_path / "hf-home"
    for entry in ("gradio", "trackio", "sandbox", "lighteval", "token", "xet", "hub/models--a--b"):
        (hf_home / entry).mkdir(parents=True)
    env.pop("HF_HUB_CACHE")
    r = script("validate.py", "--python", sys.executable, "--detect", det, env={**env, "HF_HOME": str(hf_home)})
    assert r.code == 0 and r.doc["hf_cache"]["path"] == str(hf_home / "hub"), r.doc


def test_the_legacy_hub_cache_variable_is_read_as_huggingface_hub_reads_it(tmp_path):
    """Eighteenth note: HUGGINGFACE_HUB_CACHE, which check_model and estimate honour through huggingface_hub,
    was ignored here: the container could mount another cache than the one checked."""
    import validate
    old = tmp_path / "legacy"
    assert validate.resolve_hf_cache({"HUGGINGFACE_HUB_CACHE": str(old)})["path"] == str(old)
    assert validate.resolve_hf_cache({"HUGGINGFACE_HUB_CACHE": str(old), "HF_HUB_CACHE": str(tmp_path / "new")})[
        "path"] == str(tmp_path / "new")


def test_nothing_under_run_is_mounted_or_a_state_dir():
    """Eighteenth F6: the /run/media exception let a state dir, or a cache docker would create, into /run."""
    from serve_plan import in_system_tree, system_folder
    assert system_folder("/run/media/alice/disk/hf") and in_system_tree("/run/media/aud18/st")


def test_a_reflected_key_in_a_broken_status_line_is_masked_before_any_cut(monkeypatch):
    """F3: http() cut the exception text at 300 characters before anything masked it; with earlier copies
    shrunk to ***, the cut copy fell inside redact's limit and 29 of the key's 35 characters showed."""
    import serve_life
    from conftest import answer_once
    from serve_plan import redact
    key = "sk-Zq7Wm4Rt9Yp2Lx8Nc5Vb3Hj6Kd1Fg0Se"
    srv = answer_once(b"HTTP/1.1 2x0 " + key.encode() * 4 + b"A" * 80 + key.encode() + b"\r\n\r\n")
    status, why = serve_life.http("GET", f"http://127.0.0.1:{srv.getsockname()[1]}/", 10)
    srv.close()
    assert status is None and key in why  # whole, for the caller's mask
    shown = redact(why, [key])
    assert not leaks(shown, key), shown


def test_the_hubs_last_warning_is_masked_before_it_is_cut(monkeypatch):
    """F4: a 250-character HF_ENDPOINT password, cut at 300 characters before the '@', showed in part."""
    import logging
    import hf_model
    pw = "JwA0H1O2" + "x9Y8z7W6" * 30
    monkeypatch.setenv("HF_ENDPOINT", f"http://bob:{pw}@127.0.0.1:46004")
    handler = hf_model._LastWarning()
    handler.emit(logging.LogRecord("hf", logging.WARNING, __file__, 1,
                                   f"HTTP Error 503 thrown while requesting HEAD http://bob:{pw}@127.0.0.1:46004/x",
                                   None, None))
    assert not leaks(handler.last, pw), handler.last


def test_a_secret_that_is_a_common_word_never_removes_the_documents_keys(script, inputs, rt, tmp_path):  # noqa: F811
    """F5: MYK=error made verify's failure {"***": ...}: no `error` key, the contract broken. Our keys are
    never masked; and a key under 8 characters is refused at plan (guessable, and masking it blanks words)."""
    import common
    doc = common.masked_strings({"error": "error here", "fix": "f", "x.error": 1}, ["error"])
    assert doc == {"error": "*** here", "fix": "f", "x.***": 1}
    from test_launch import plan_args
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st"), "--api-key-env", "MYK"),
               env={**rt[1], "MYK": "error"})
    assert r.code == 1 and "8 at least" in r.doc["error"] and "error" in r.doc, r.doc


def test_a_secret_split_by_carriage_returns_does_not_slow_the_masker():
    """F6: the 64-line bound counted only \\n; 4,000 lines joined by \\r made every log line 8,000 searches."""
    import common
    many = "\r".join(f"part{i:05d}QQQQ" for i in range(4000))
    assert len(common.secret_forms([many])) <= 12


def test_a_url_password_is_masked_decoded_and_a_key_percent_encoded(monkeypatch):
    """F7: a proxy password pr%40xy... was masked only as written; the client sends pr@xy... ."""
    import common
    monkeypatch.setenv("HTTPS_PROXY", "http://u:pr%40xy-pass-123@proxy:3128")
    monkeypatch.setenv("MY_API_KEY", "key/with+chars=1")
    text = "decoded pr@xy-pass-123 / query ?k=key%2Fwith%2Bchars%3D1"
    masked = common.mask_secrets(text)
    assert "xy-pass" not in masked and "with" not in masked, masked


def test_a_state_dir_with_a_colon_is_refused_for_a_container_plan(script, inputs, rt, tmp_path):  # noqa: F811
    """F8: the secrets mount was written by hand, past bind_mount's check: -v DIR:/etc:rw/secrets:... ."""
    from test_launch import plan_args
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "sd:x")),
               env={**rt[1], "HF_TOKEN": TOKEN})
    assert r.code == 1 and "':'" in r.doc["error"], r.doc


def test_the_word_token_in_prose_is_not_masked():
    from serve_plan import mask_token_patterns
    assert mask_token_patterns("token count 5") == "token count 5"
    assert mask_token_patterns('{"token": "abc"} Bearer xyz x-api-key: k') == '{"token": "***"} Bearer *** x-api-key: ***'


# ---- the EPYC Rome runner (AVX2, 2026-12-02): what vLLM does differently without AVX-512

def test_an_estimate_for_the_other_kind_of_cpu_is_a_mismatch_for_a_recurrent_model():
    """vLLM keeps the SSM state in float32 only on an AVX-512 BF16 CPU: an estimate made for the other kind
    sizes the wrong KV page, so plan names the flag that fixes it."""
    from serve_plan import mismatches
    est = {"kv_layers": {"ssm_state_dtype": "float32"}, "avx512_bf16": True}
    docs = {"detect": {"avx512_bf16": False}, "validate": {}, "check_model": {}, "estimate_memory": est, "cpu_tune": {}}
    assert any("--avx512-bf16 no" in m for m in mismatches(docs))
    docs["estimate_memory"] = {"kv_layers": {"ssm_state_dtype": None}, "avx512_bf16": True}  # no recurrent layer
    assert mismatches(docs) == []


def test_an_int4_checkpoint_is_not_served_on_a_cpu_without_avx512():
    """vLLM 0.32.0's _C_AVX2 has no cpu_gemm_wna16 (measured on EPYC Rome): the engine would die at start."""
    from common import load_epyc
    from serve_plan import quantized_path
    report = {"method": "awq", "format": None, "bits": 4, "symmetric": True, "group_size": 128}
    assert quantized_path(report, "stock", "bfloat16", load_epyc(), avx512=True)["kernel"].startswith("cpu_gemm_wna16")
    refused = quantized_path(report, "stock", "bfloat16", load_epyc(), avx512=False)
    assert refused["served_on_cpu"] is False and "_C_AVX2" in refused["note"]


# ---- eighteenth audit (88 cases, 7 findings), on the seventeenth's fixes

def test_stop_works_after_the_hub_cache_changed_under_a_running_server(script, inputs, rt, tmp_path):  # noqa: F811
    """F1: every verb re-rendered the plan with the cache's content as it is now: a Gradio folder made after
    start made stop refuse the plan, and the container could not be stopped with the tool. Only start
    looks at the disk again; the phase named is the verb's."""
    cache = tmp_path / "hub"
    plan_file = _planned_with_a_cache(script, inputs, rt, tmp_path, cache)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=rt[1]).code == 0
    (cache / "gradio").mkdir()
    v = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "1", env=rt[1])
    assert "Hugging Face" not in v.stdout, v.doc
    s = script("launch.py", "stop", "--plan", str(plan_file), env=rt[1])
    assert s.code == 0 and s.doc["stopped"], s.doc
    assert [c["argv"][0] for c in _calls(rt[0])][-2:] == ["stop", "rm"]
    again = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=rt[1])
    assert again.code == 1 and "'gradio'" in again.doc["error"] and again.doc["phase"] == "start", again.doc


def test_a_key_of_spaces_is_refused_at_plan(script, inputs, rt, tmp_path):  # noqa: F811
    """F4: a length of 0 read as 'not known' (0 or 8), so '        ' planned an exposed server."""
    from test_launch import plan_args
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st"), "--expose", "--api-key-env",
                                       "MYK"), env={**rt[1], "MYK": " " * 8})
    assert r.code == 1 and ("0 characters" in r.doc["error"] or "not set" in r.doc["error"]), r.doc


def test_an_estimate_that_contradicts_itself_is_a_mismatch():
    """F5: avx512_bf16 edited to true on an estimate sized with a bf16 state planned a float32 CPU's sizing."""
    from serve_plan import mismatches
    est = {"kv_layers": {"ssm_state_dtype": "bfloat16"}, "avx512_bf16": True, "kv_dtype": "bfloat16"}
    docs = {"detect": {"avx512_bf16": True}, "validate": {}, "check_model": {}, "estimate_memory": est, "cpu_tune": {}}
    assert any("vLLM keeps it in float32" in m for m in mismatches(docs))


def test_check_model_says_an_int4_kernel_needs_avx512(script, tmp_path):
    """F7: check_model called AWQ served on the stock path where plan (rightly) refuses it on an AVX2 CPU."""
    import quantization
    from common import load_epyc
    epyc = load_epyc()
    got = quantization.cpu_kernel({"method": "awq", "bits": 4}, "stock", "bfloat16", epyc["quantization"]["kernels"],
                                  None, epyc["quantization"]["stock_needs_avx512"])
    assert got["served_on_cpu"] and "needs AVX-512" in got["note"] and "_C_AVX2" in got["note"]


# ---- nineteenth audit (36 cases, 4 findings), on the eighteenth's fixes

def test_huggingface_hubs_shared_blob_store_is_a_hub_caches_own(tmp_path):
    """F1: huggingface_hub 2.x keeps <hub>/blobs/ for every Xet-backed download: a real cache was refused."""
    from serve_plan import foreign_cache_entries
    hub = tmp_path / "hub"
    (hub / "models--Qwen--Qwen3-0.6B").mkdir(parents=True)
    try:  # made by the library itself where it has the store
        from huggingface_hub.utils import _shared_blobs
        _shared_blobs._ensure_shared_blobs_dir(str(hub))
    except (ImportError, AttributeError):
        (hub / "blobs").mkdir()
    assert (hub / "blobs").is_dir() and foreign_cache_entries(sorted(p.name for p in hub.iterdir())) == []


def test_stop_and_bench_act_on_a_plan_whose_model_folder_moved(script, inputs, rt, tmp_path):  # noqa: F811
    """F2, F3a: verbs other than start re-rendered with the model folder as the disk holds it now: a folder
    moved under a running container made stop refuse the plan (the container ran on). They take it, and
    the cache, from the plan; bench too, and a refusal names bench's phase."""
    import shutil
    cache = tmp_path / "hub"
    plan_file = _planned_with_a_cache(script, inputs, rt, tmp_path, cache)
    plan = json.loads(plan_file.read_text())
    assert plan["model_dir"] and script("launch.py", "start", "--plan", str(plan_file), "--confirm",
                                        env=rt[1]).code == 0
    shutil.move(plan["model_dir"], plan["model_dir"] + "-moved")
    (cache / "notes.txt").write_text("x")
    b = script("bench.py", "--plan", str(plan_file), "--input-lens", "16", "--concurrency", "1", "--repeats", "1",
               "--out", str(tmp_path / "bench"), env=rt[1], timeout=120)
    assert "differs" not in b.stdout and "Hugging Face" not in b.stdout, b.doc
    s = script("launch.py", "stop", "--plan", str(plan_file), env=rt[1])
    assert s.code == 0 and s.doc["stopped"], s.doc


def test_a_plan_of_the_older_layout_is_stopped_but_never_started(script, inputs, rt, tmp_path):  # noqa: F811
    """F3b: a server started by the bundle before the hub-only mount: its validate.json (mount_subdir null)
    failed the schema, and stop could not act on it. It renders as it was for stop; start refuses it."""
    cache = tmp_path / "hf-home"
    cache.mkdir()
    r = _plan_with_hf_cache(script, inputs, rt, tmp_path, str(cache), subdir=None)
    assert r.code == 1 and "older version" in r.doc["error"] and "validate.py again" in r.doc["fix"], r.doc
    import serve_life
    from common import load_epyc
    plan_file, _ = _planned_with_a_cache(script, inputs, rt, tmp_path, tmp_path / "hub"), None
    plan = json.loads(plan_file.read_text())
    plan["inputs"]["validate"]["hf_cache"].update(path=str(cache), mount_subdir=None)  # as the older bundle wrote
    old = serve_life.rerender(plan, load_epyc(), env_from_plan=True, phase="stop")
    assert f"{cache}:/root/.cache/huggingface" in old["argv"]


def test_an_interrupt_held_by_start_ends_up_and_compare(monkeypatch, tmp_path):
    """F4: start turns a Ctrl-C held while it launched into an error that says the server runs; bench
    --compare logged it as a failed sizing and started the next one, up left the server up."""
    import launch
    from common import ScriptError
    calls = []
    monkeypatch.setattr(launch, "start", lambda plan, confirm: (_ for _ in ()).throw(
        ScriptError("interrupted, after the server was launched and recorded: it is running", "f", interrupted=True)))
    monkeypatch.setattr(launch, "stop", lambda plan: calls.append("stop") or {"stopped": True})
    with pytest.raises(ScriptError, match="up stopped the server"):
        launch.start_or_stop({"x": 1}, tmp_path / "plan.json")
    assert calls == ["stop"]


# ---- twentieth audit (~50 cases, 4 findings), on the nineteenth's fixes

def test_bench_compare_looks_at_the_disk_as_start_does(script, inputs, rt, tmp_path):  # noqa: F811
    """F1: bench's plan check trusts the plan's model folder (for a running server), but --compare starts
    servers: a model link moved since the plan made it serve a folder nobody confirmed. It is refused now."""
    import shutil
    from test_launch import plan_args
    real = Path(inputs["model"])
    v1, v2, link = tmp_path / "v1", tmp_path / "v2", tmp_path / "current"
    shutil.copytree(real, v1)
    shutil.copytree(real, v2)
    link.symlink_to(v1)
    for name, script_name, args in (("check", "check_model.py", ["--vllm-version", "0.25.1"]),
                                    ("estimate", "estimate_memory.py", ["--ram-gb", "384"])):
        r = script(script_name, "--model", str(link), *args, env=rt[1])
        Path(inputs[name]).write_text(r.stdout)
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st")), env=rt[1])
    assert r.code == 0 and r.doc["model_dir"] == str(v1), r.doc
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(r.stdout)
    link.unlink()
    link.symlink_to(v2)
    b = script("bench.py", "--plan", str(plan_file), "--compare", "--input-lens", "16", "--concurrency", "1",
               "--repeats", "1", "--out", str(tmp_path / "cmp"), env=rt[1], timeout=120)
    # refused as reading another folder than the one checked (twenty-second audit), before any comparison
    assert b.code == 1 and f"check_model.py read {v1}" in b.doc["error"] and str(v2) in b.doc["error"], b.doc
    assert b.doc["phase"] == "bench" and not any(c["argv"][0] == "run" for c in _calls(rt[0]))


def test_bench_tokenizes_with_the_model_the_server_runs():
    """F2: the host path passed the model as typed at plan time (a relative folder means another one from
    here, or a Hub repo): it takes the served command's model now, as the container path did."""
    import bench
    plan = {"path": "host", "argv": ["numactl", "-N", "1", "/v/bin/vllm", "serve", "/abs/models/Qwen3-0.6B", "--port",
                                     "8000"], "model": "models/Qwen3-0.6B"}
    assert bench.serving_target(plan)["tokenizer"] == "/abs/models/Qwen3-0.6B"


def test_verbs_take_the_model_folder_start_served_not_an_edited_plans(script, inputs, rt, tmp_path):  # noqa: F811
    """F3: a model_dir edited with the argv to match passed every verb but start; handoff then named a
    model the server does not list. start records the folder it served; the other verbs render with it."""
    plan_file = _planned_with_a_cache(script, inputs, rt, tmp_path, tmp_path / "hub")
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=rt[1]).code == 0
    plan = json.loads(plan_file.read_text())
    assert json.loads(Path(plan["state_file"]).read_text())["model_dir"] == plan["model_dir"]
    import serve_life
    from common import load_epyc
    forged = json.loads(plan_file.read_text())
    forged["model_dir"] = str(tmp_path)
    fresh = serve_life.rerender(forged, load_epyc(), env_from_plan=True, phase="handoff")
    assert fresh["model_dir"] == plan["model_dir"] != forged["model_dir"]  # so refuse_edited refuses it
    assert script("launch.py", "stop", "--plan", str(plan_file), env=rt[1]).code == 0


def test_an_interrupt_during_a_container_run_ends_up_with_a_stop(monkeypatch, tmp_path):
    """F4: a Ctrl-C during `docker run` (the engine may have started it) went past up's stop."""
    import launch
    from common import ScriptError
    calls = []
    monkeypatch.setattr(launch, "start", lambda plan, confirm: (_ for _ in ()).throw(KeyboardInterrupt()))
    monkeypatch.setattr(launch, "stop", lambda plan: calls.append("stop") or {"stopped": True})
    with pytest.raises(ScriptError, match="up stopped the server"):
        launch.start_or_stop({"x": 1}, tmp_path / "plan.json")
    assert calls == ["stop"]


@pytest.mark.parametrize("name,value", [("MYK", "abcd efgh ijkl"), ("HF_TOKEN", "hf_abcdefgh\nijkl"),
                                        ("MYK", "k" * 4097)])
def test_a_secret_no_header_carries_is_refused_at_plan_and_at_start(script, inputs, rt, tmp_path, name, value):  # noqa: F811
    """A key with a space planned, the human confirmed, and only start refused it: plan says it now, and
    start still does for a shell whose value changed since, neither showing the value."""
    from test_launch import plan_args
    good = {**rt[1], "MYK": "k" * 24, "HF_TOKEN": "hf_" + "t" * 20}
    args = plan_args(inputs, "--state-dir", str(tmp_path / "st"), "--api-key-env", "MYK")
    r = script("launch.py", *args, env={**good, name: value})
    assert r.code == 1 and f"{name} holds characters a token cannot have" in r.doc["error"], r.doc
    assert value not in r.stdout and "then plan" in r.doc["fix"]
    planned = script("launch.py", *args, env=good)
    assert planned.code == 0, planned.doc
    (tmp_path / "plan.json").write_text(planned.stdout)
    s = script("launch.py", "start", "--plan", str(tmp_path / "plan.json"), "--confirm", env={**good, name: value})
    assert s.code == 1 and f"{name} holds characters a token cannot have" in s.doc["error"], s.doc
    assert s.doc["phase"] == "start" and value not in s.stdout
    assert not [c for c in _calls(rt[0]) if c["argv"][0] in ("run", "pull", "rm")]  # nothing was started


@pytest.mark.parametrize("env", [{"HF_HUB_CACHE": "$FOO/hub", "FOO": "/tmp/a"}, {"HF_HOME": "$FOO", "FOO": "~/yy"},
                                 {"HF_HUB_CACHE": "$FOO", "FOO": "~/yy"}, {"HF_HOME": "~/zz"},
                                 {"HUGGINGFACE_HUB_CACHE": "~/${FOO}", "FOO": "q"}, {"XDG_CACHE_HOME": "/tmp/xdg"},
                                 {"HF_HUB_CACHE": "$UNSET_VAR_X/h"}, {"HF_HOME": "/tmp/$FOO", "FOO": "$BAR", "BAR": "b"}])
def test_the_hub_cache_is_the_one_huggingface_hub_itself_reads(tmp_path, env):
    """A note left by the nineteenth audit: $VARS were expanded before `~`, the reverse of the Hub client,
    so a variable holding a `~` named another folder than the one the server downloads into. (The client
    expands an HF_HOME twice, a named hub cache once: compared here with the client itself.) Where the
    client's answer is a relative path (a variable holding a `~`, an unset variable), each step would look
    in another folder: refused, as a test below asserts."""
    import subprocess
    import validate
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "XDG_"))}
    hub = subprocess.run([sys.executable, "-c", "import huggingface_hub.constants as c; print(c.HF_HUB_CACHE)"],
                         env={**clean, **env}, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    if not os.path.isabs(hub.stdout.strip()):
        from common import ScriptError
        with pytest.raises(ScriptError, match="relative path"):
            validate.resolve_hf_cache({**clean, **env})
        return
    cwd = os.getcwd()
    os.chdir(tmp_path)  # a relative result (a variable holding `~`) is relative here, as for the Hub client
    try:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # expandvars reads the process environment, as the Hub client does
        ours = validate.resolve_hf_cache({**clean, **env})["path"]
    finally:
        os.chdir(cwd)
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert ours == os.path.realpath(tmp_path / hub.stdout.strip()), (ours, hub.stdout)


# ---- the twenty-first audit

def test_an_interrupted_container_start_removes_what_it_launched(script, inputs, rt, tmp_path):  # noqa: F811
    """F1: a signal during `docker run` (the engine may start the container anyway) left a server and its
    key file with no state: verify said nothing was started, and the fix said to run start again."""
    import signal
    import subprocess
    import time
    from test_launch import SECRET, calls, container_plan
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path, HF_TOKEN=SECRET)
    (d / "run_hang").touch()
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "launch.py"), "start", "--plan", str(plan_file),
                             "--confirm"], env={**os.environ, **env, "HF_TOKEN": SECRET}, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not [c for c in calls(d) if c["argv"][:1] == ["run"]]:
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    doc = json.loads(out)
    assert proc.returncode == 1 and "interrupted before the container" in doc["error"], doc
    assert "start removed it" in doc["error"] and doc["phase"] == "start" and SECRET not in out
    assert calls(d)[-1]["argv"] == ["rm", "-f", plan["container_name"]]
    assert not (tmp_path / "st" / "secrets" / "HF_TOKEN").exists() and not (tmp_path / "st" / "state.json").exists()


def test_a_hard_linked_state_file_is_refused_before_the_server_is_launched(script, inputs, live_tune, tmp_path):  # noqa: F811
    """F2: the state file's hard-link refusal came after Popen: the server ran and no state named it."""
    from test_launch import host_plan
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    Path(plan["state_dir"]).mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    os.link(victim, Path(plan["state_dir"]) / "state.json")
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm")
    assert r.code == 1 and "has other names (a hard link)" in r.doc["error"] and r.doc["phase"] == "start", r.doc
    assert not Path(plan["log_file"]).exists() and victim.read_text() == "keep me\n"  # nothing was launched


def test_a_state_that_cannot_be_written_takes_the_launched_server_down(inputs, live_tune, tmp_path, monkeypatch):  # noqa: F811
    """F2: a full disk (or an immutable state.json) after the launch: `internal error: OSError`, and the
    server ran with no state. The server is real (the fake venv's vllm); the full disk is simulated (a
    write_state raising ENOSPC: a disk cannot be filled safely here)."""
    import errno
    import psutil
    import serve_life
    from common import ScriptError
    from test_launch import host_plan
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    launched = []
    real_popen = serve_life.subprocess.Popen

    def popen(*a, **k):
        launched.append(real_popen(*a, **k))
        return launched[-1]

    def full_disk(plan, state):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(serve_life.subprocess, "Popen", popen)
    monkeypatch.setattr(serve_life, "write_state", full_disk)
    with pytest.raises(ScriptError) as err:
        serve_life.start(plan, confirm=True)
    assert "its state could not be written" in err.value.error and "No space left on device" in err.value.error
    assert "start stopped it" in err.value.error and err.value.extra["phase"] == "start"
    assert launched and not psutil.pid_exists(launched[0].pid)
    assert not [p for p in psutil.process_iter() if _pgid(p.pid) == launched[0].pid]


@pytest.mark.parametrize("secret", [None, "HF_TOKEN", "MYK"])
def test_bench_tokenizes_a_local_folder_where_the_container_mounts_it(script, inputs, rt, tmp_path, secret):  # noqa: F811
    """F3: with a secret the container runs `sh -c LOADER vllm MODEL ...`, with no "serve" in its argv: bench
    fell back to the model as typed, a host path the container lacks (every --expose plan of a folder)."""
    import bench
    from test_launch import plan_args
    env = {**rt[1], "MYK": "k" * 24}
    if secret == "HF_TOKEN":
        env["HF_TOKEN"] = "hf_" + "t" * 20
    extra = ["--api-key-env", "MYK"] if secret == "MYK" else []
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st"), *extra), env=env)
    assert r.code == 0 and r.doc["path"] == "container", r.doc
    assert ("-c" in r.doc["argv"]) == bool(secret)  # the loader form, or the plain one
    assert bench.serving_target(r.doc)["tokenizer"] == f"/models/{inputs['model'].name}"


def test_a_plan_with_the_default_state_dir_is_stopped_from_another_shell(script, inputs, rt, tmp_path):  # noqa: F811
    """F6: the default state dir was derived again by every verb from $XDG_CACHE_HOME / $HOME: stop from a
    terminal with another one said the plan differs, and the server stayed up."""
    from test_launch import calls, plan_args
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


def test_bench_takes_the_secrets_state_from_the_plan_as_verify_does(script, inputs, rt, tmp_path):  # noqa: F811
    """F7: bench (it starts nothing) rendered with this shell's HF_TOKEN and HF_HUB_OFFLINE: an unedited
    plan of a running server was refused as edited where verify passed. An API key the server wants and
    this shell lacks is named, not sent empty."""
    from test_launch import plan_args
    env = {**rt[1], "MYK": "k" * 24}
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st"), "--api-key-env", "MYK"), env=env)
    (tmp_path / "plan.json").write_text(r.stdout)
    assert r.code == 0 and script("launch.py", "start", "--plan", str(tmp_path / "plan.json"), "--confirm",
                                  env=env).code == 0
    bench = ["bench.py", "--plan", str(tmp_path / "plan.json"), "--input-lens", "16", "--concurrency", "1",
             "--repeats", "1", "--no-bandwidth", "--out", str(tmp_path / "bench")]
    for other in ({"HF_TOKEN": "hf_" + "z" * 20}, {"HF_HUB_OFFLINE": "1"}):
        b = script(*bench, env={**env, **other}, timeout=120)
        assert "differs" not in b.stdout, b.doc  # it went on to run (the fake runtime's exec is no benchmark)
    b = script(*bench, env={**rt[1]}, timeout=120)
    assert b.code == 1 and "MYK is not set in this shell" in b.doc["error"], b.doc
    assert script("launch.py", "stop", "--plan", str(tmp_path / "plan.json"), env=env).doc["stopped"]


def test_stop_takes_down_a_process_the_server_forked_on_its_way_down(inputs, live_tune, tmp_path):  # noqa: F811
    """F5: stop signalled the group as it first saw it, waited for the group to empty, then removed the
    state anyway: a process forked after the SIGTERM ran on, and no state named it."""
    import psutil
    import serve_life
    from test_launch import host_plan, server_mode
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    server_mode(tmp_path, "fork_on_term")
    serve_life.start(plan, confirm=True)
    pgid = serve_life.read_state(plan)["pgid"]
    try:
        time.sleep(2)  # the fake server has installed its SIGTERM handler
        out = serve_life.stop(plan)
        assert out["stopped"] and out["processes"] == 2 and out["killed_after_timeout"] == 1, out
        assert not [p for p in psutil.process_iter(["status"]) if _pgid(p.pid) == pgid  # a zombie waits for
                    and p.info["status"] != psutil.STATUS_ZOMBIE]  # this machine's init to reap it: it is gone
        assert serve_life.read_state(plan) is None
    finally:
        for p in psutil.process_iter():
            if _pgid(p.pid) == pgid:
                p.kill()


def test_an_old_process_with_an_empty_environ_is_not_waited_for(monkeypatch):
    """The settling of a process inside execve is for a launch's first moments: vLLM's renamed workers read
    empty for good, and stop, with their leader gone, waited 2 s on each of them at every look."""
    import subprocess
    import psutil
    import serve_life
    worker = subprocess.Popen(["sleep", "30"], env={})
    try:
        time.sleep(0.5)
        monkeypatch.setattr(serve_life, "EXEC_YOUNG_S", 0.2)
        t0 = time.monotonic()
        assert serve_life.settled_environ(psutil.Process(worker.pid)) is None
        assert time.monotonic() - t0 < 0.5
        monkeypatch.setattr(serve_life, "EXEC_YOUNG_S", 60.0)
        t0 = time.monotonic()
        assert serve_life.settled_environ(psutil.Process(worker.pid)) is None
        assert time.monotonic() - t0 >= serve_life.EXEC_SETTLE_S  # young: asked again until the settle time
    finally:
        worker.kill()
        worker.wait()


def _at_revision(rev_checked, rev_sized):
    def edit(docs):
        for name, rev in (("check_model", rev_checked), ("estimate_memory", rev_sized)):
            docs[name].update(model="Qwen/Qwen3-0.6B", revision=rev, model_dir=None)
        docs["check_model"]["source"] = "hub"
    return edit


def test_the_revision_checked_and_sized_is_the_one_served(inputs, live_tune, tmp_path):  # noqa: F811
    """F4: check_model and estimate_memory took --revision, the plan served main: another architecture, size
    or chat template than the one the human confirmed. It is served, shown, and cross-checked now."""
    _, plan = host_plan(tmp_path, inputs, live_tune, edit=_at_revision("v2.0", "v2.0"))
    served = plan["argv"][plan["argv"].index("serve") + 1:]
    assert served[0] == "Qwen/Qwen3-0.6B" and served[served.index("--revision") + 1] == "v2.0"
    assert plan["revision"] == "v2.0" and "Qwen/Qwen3-0.6B at revision v2.0" in plan["summary_markdown"]
    _, main = host_plan(tmp_path, inputs, live_tune, edit=_at_revision(None, None))
    assert "--revision" not in main["argv"] and main["revision"] is None
    from common import ScriptError
    with pytest.raises(ScriptError) as err:
        host_plan(tmp_path, inputs, live_tune, edit=_at_revision("v2.0", None))
    assert "check_model.py checked revision v2.0, estimate_memory.py sized main" in err.value.error


def test_a_local_folder_is_served_without_a_revision(inputs, live_tune, tmp_path):  # noqa: F811
    def edit(docs):
        docs["check_model"]["revision"] = docs["estimate_memory"]["revision"] = "v2.0"
    _, plan = host_plan(tmp_path, inputs, live_tune, edit=edit)
    assert plan["model_dir"] and "--revision" not in plan["argv"] and plan["revision"] is None


def test_an_older_plan_that_served_main_is_stopped_but_never_started(inputs, live_tune, tmp_path):  # noqa: F811
    """An older bundle's plan has no `revision` and served main whatever was checked: the verbs acting on
    its server still accept it; start renders it as it would run now, and refuses it."""
    import serve_life
    from common import load_epyc
    _, plan = host_plan(tmp_path, inputs, live_tune, edit=_at_revision(None, None))
    old = {k: v for k, v in plan.items() if k != "revision"}
    old["inputs"] = {**plan["inputs"], "check_model": {**plan["inputs"]["check_model"], "revision": "v2.0"}}
    old["inputs"]["estimate_memory"] = {k: v for k, v in plan["inputs"]["estimate_memory"].items() if k != "revision"}
    serve_life.refuse_edited(old, serve_life.rerender(old, load_epyc(), env_from_plan=True, phase="stop"), "stop")
    from common import ScriptError
    with pytest.raises(ScriptError) as err:
        serve_life.refuse_edited(old, serve_life.rerender(old, load_epyc()), "start")
    assert "differs" in err.value.error and "argv" in err.value.error


def test_a_revision_with_a_local_folder_is_refused_not_dropped(script, tmp_path):
    """A note of the twenty-third and twenty-eighth audits: check_model and estimate_memory recorded the
    revision of a local folder, and plan served the folder without it (a folder has no revisions)."""
    folder = model_folder("Qwen3-0.6B", tmp_path)
    for name in ("check_model.py", "estimate_memory.py"):
        r = script(name, "--model", str(folder), "--revision", "v2.0", *(["--ram-gb", "64"] if "estimate" in name else []))
        assert r.code == 1 and "is a local folder: its files are what is served" in r.doc["error"], (name, r.doc)
        assert "drop --revision" in r.doc["fix"]
        assert script(name, "--model", str(folder), *(["--ram-gb", "64"] if "estimate" in name else [])).code == 0
        # `main` means no revision: SKILL.md passes --revision "$REV" (default main) whatever MODEL is
        assert script(name, "--model", str(folder), "--revision", "main",
                      *(["--ram-gb", "64"] if "estimate" in name else [])).code == 0


def test_a_revision_git_would_refuse_is_refused(script, tmp_path):
    """A note of the twenty-first audit: `x.lock` passed as a revision."""
    folder = model_folder("Qwen3-0.6B", tmp_path)
    for rev in ("x.lock", "a/.hidden", "a//b", "release.lock/1"):
        r = script("check_model.py", "--model", str(folder), "--revision", rev)
        assert r.code == 1 and "argument --revision" in r.doc["error"], (rev, r.doc)
        assert "not a branch, tag or commit" in r.doc["error"]


def test_a_signal_between_ups_start_and_verify_stops_the_server(inputs, live_tune, tmp_path, monkeypatch):  # noqa: F811
    """A note of the twenty-first audit: a signal landing after start_or_stop returned and before
    verify_or_stop's guard left the server up. The server is real (the fake venv's); the signal's landing
    in that gap is simulated by a verify_or_stop that raises it before doing anything (a real signal cannot
    be aimed at those bytecodes)."""
    import psutil
    import launch
    import serve_life
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)

    def interrupted_before_its_guard(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(launch, "verify_or_stop", interrupted_before_its_guard)
    from common import ScriptError
    with pytest.raises(ScriptError) as err:
        launch.serve_verified(plan, plan_file, 30, 10)
    assert "up stopped the server it had started" in err.value.error and err.value.extra["stopped"]["stopped"]
    assert serve_life.read_state(plan) is None
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(plan["port"]) in (p.info["cmdline"] or [])]


def test_the_bundles_own_venv_is_never_the_stack_venv(tmp_path):
    """A note of the twenty-first audit: `--venv <bundle>/.venv` was accepted while it did not exist yet
    (a fresh checkout), and the vLLM stack went into the tools' interpreter."""
    import setup_host_stack as shs
    from common import ROOT as BUNDLE
    assert "the bundle's own .venv" in shs.venv_refusal(BUNDLE / ".venv", tmp_path / "default")
    (tmp_path / "link").symlink_to(BUNDLE / ".venv")
    assert "the bundle's own .venv" in shs.venv_refusal(tmp_path / "link", tmp_path / "default")
    assert shs.venv_refusal(tmp_path / "elsewhere", tmp_path / "default") is None


def test_an_hf_cache_path_the_summary_cannot_show_is_not_mounted(tmp_path):
    """Notes of the twenty-first audit: a cache path with a newline was mounted (the summary's quoted
    command read as another folder); a FIFO as the cache was "a file"; `//x` was "a link to /x"."""
    import validate
    from common import ScriptError
    from serve_plan import bind_mount
    with pytest.raises(ScriptError) as err:
        bind_mount(str(tmp_path / "new\nline"), "/root/.cache/huggingface/hub")
    assert "printable" in err.value.error
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ScriptError) as err:
        validate._hf_cache_at(tmp_path / "fifo")
    assert "not a folder: a pipe, socket or device" in err.value.error
    (tmp_path / "hub").mkdir()
    assert validate._hf_cache_at(Path("/" + str(tmp_path / "hub")))["note"] is None


# ---- the twenty-second audit

def test_a_full_disk_during_verify_is_a_clear_error_and_up_stops_its_server(inputs, live_tune, tmp_path):  # noqa: F811
    """F4: verify's state write on a full disk was `internal error: OSError`, and up, which stops its server
    only on its own errors and interrupts, left the unverified server running. The full disk is real
    enough: RLIMIT_FSIZE 0 (ulimit -f 0) makes every write fail with EFBIG, set as verify begins."""
    import subprocess
    import psutil
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    code = ("import sys, resource; sys.path.insert(0, sys.argv[1]); import common, json, launch\n"
            "plan = json.load(open(sys.argv[2]))\n"
            "real_verify = launch.verify\n"
            "def verify_on_a_full_disk(*args):\n"
            "    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
            "    return real_verify(*args)\n"
            "launch.verify = verify_on_a_full_disk\n"
            "sys.exit(common.run_main(lambda argv: (launch.serve_verified(plan, sys.argv[2], 60, 10), 0)))\n")
    r = subprocess.run([sys.executable, "-c", code, str(ROOT / "scripts"), str(plan_file)], capture_output=True,
                       text=True, timeout=180)
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and "internal error" not in doc["error"], doc
    assert "cannot write" in doc["error"] and "File too large" in doc["error"] and "ulimit -f" in doc["fix"], doc
    assert doc["stopped"]["stopped"] and doc["plan_file"]  # up's rule: a failed verify stops the server
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(plan["port"]) in (p.info["cmdline"] or [])]


@pytest.mark.parametrize("tool,args", [
    ("detect.py", ["--spec", "9654", "--sockets", "1", "--ram-gb-per-socket", "384", "--save-sysroot", "{out}"]),
    ("launch.py", ["plan", "--detect=-"]),  # reads stdin, prints: the write is stdout's, already exit 1
])
def test_a_full_disk_is_named_never_an_internal_error(script, tmp_path, tool, args):
    """F4: each write path gave `internal error: OSError [Errno 27]` under ulimit -f 0."""
    import resource
    import subprocess
    out = tmp_path / "out"
    argv = [sys.executable, str(ROOT / "scripts" / tool), *[a.format(out=out) for a in args]]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, input="{}",
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY)))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    if r.stdout:
        assert "internal error" not in r.stdout, r.stdout
    if tool == "detect.py":
        doc = json.loads(r.stdout)
        assert "cannot write the rendered host files" in doc["error"] and "File too large" in doc["error"]


def test_any_failure_of_verify_stops_ups_server(monkeypatch, tmp_path):
    """F4: only ScriptError and KeyboardInterrupt stopped the server; any other failure left it running.
    The failing verify and the stop are stand-ins here: the real chain is the test above."""
    import errno
    import launch
    stops = []

    def verify_fails(*args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(launch, "verify", verify_fails)
    monkeypatch.setattr(launch, "stop", lambda plan: stops.append(plan) or {"stopped": True})
    from common import ScriptError
    with pytest.raises(ScriptError) as err:
        launch.verify_or_stop({"port": 1}, tmp_path / "plan.json", 5, 5)
    assert stops and "No space left on device: up stopped the server it had started" in err.value.error
    assert "free space" in err.value.fix and err.value.extra["phase"] == "verify"


def test_a_link_loop_is_a_clear_error(script, tmp_path, make_sysroot):
    """F6: Path.resolve() raises RuntimeError on a link loop (Python 3.10, 3.11): a --state-dir or a sysroot
    file that loops was an internal error."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    r = script("launch.py", "up", "--yes", "--state-dir", str(tmp_path / "loop"))
    assert r.code == 1 and "exists and is not a folder" in r.doc["error"], r.doc
    root = make_sysroot("genoa_9654_2s_smt")
    cpulist = Path(root) / "sys/devices/system/node/node0/cpulist"
    cpulist.unlink()
    cpulist.symlink_to("cpulist")
    for tool, args in (("detect.py", []), ("cpu_tune.py", ["--weight-gb", "1", "--kv-needed-gb", "1"])):
        r = script(tool, "--sysroot", str(root), *args)
        assert "internal error" not in r.stdout, r.doc


@pytest.mark.parametrize("rev", ["../../../etc/x", "-x", "--trust-remote-code", "a b", "main\n", "x.lock", 7])
def test_a_revision_from_a_document_is_checked_before_it_becomes_an_argument(inputs, live_tune, tmp_path, rev):  # noqa: F811
    """F1: only the --revision flag was checked: a check_model.json (and estimate) carrying '--entrypoint'
    or '../x' put it into the served command as given."""
    from common import ScriptError
    with pytest.raises(ScriptError) as err:
        host_plan(tmp_path, inputs, live_tune, edit=_at_revision(rev, rev))
    assert "is not a branch, tag or commit" in err.value.error or "wrong type" in err.value.error, err.value.error


def test_estimate_checks_its_revision_even_from_a_config_alone(script, tmp_path):
    """F1: with --config the model is never resolved, and --revision was recorded unchecked."""
    folder = model_folder("Qwen3-0.6B", tmp_path)
    r = script("estimate_memory.py", "--config", str(folder / "config.json"), "--weight-gb", "1.2", "--ram-gb", "64",
               "--revision", "../../x")
    assert r.code == 1 and "argument --revision" in r.doc["error"] and "not a branch, tag or commit" in r.doc["error"]


def test_the_served_arguments_are_read_by_the_plans_path():
    """F1: a host command carrying '--entrypoint' as a value was read as a container's."""
    from serve_plan import serve_args
    host = ["numactl", "-N", "0", "/v/bin/vllm", "serve", "org/m", "--revision", "--entrypoint"]
    assert serve_args(host, container=False)[0] == "org/m"



def test_plan_serves_the_folder_that_was_checked_and_sized(script, inputs, rt, tmp_path, monkeypatch):  # noqa: F811
    """F2: plan found the model as typed again from its own folder: a relative path (or a folder named like
    the Hub id) served another model than the one checked and sized, with their fit, endpoint and revision."""
    import shutil
    from test_launch import plan_args
    (tmp_path / "elsewhere" / "models").mkdir(parents=True)
    shutil.copytree(inputs["model"], tmp_path / "elsewhere" / "models" / "m")
    docs = {k: json.loads(Path(inputs[k]).read_text()) for k in ("check", "estimate")}
    for name, doc in docs.items():  # typed as a relative path where it meant the fixture's folder
        doc["model"] = "models/m"
        (tmp_path / f"rel-{name}.json").write_text(json.dumps(doc))
    args = [a if not a.startswith(("--check=", "--estimate=")) else
            a.split("=")[0] + "=" + str(tmp_path / f"rel-{a[2:].split('=')[0]}.json") for a in plan_args(inputs)]
    import subprocess
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "launch.py"), *args, "--state-dir",
                        str(tmp_path / "st")], cwd=tmp_path / "elsewhere", capture_output=True, text=True,
                       env={**os.environ, **rt[1]}, timeout=120)
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and f"check_model.py read {os.path.realpath(inputs['model'])}" in doc["error"], doc
    assert str(tmp_path / "elsewhere" / "models" / "m") in doc["error"] and "absolute path" in doc["fix"]



def test_a_container_start_that_cannot_remove_what_it_launched_says_so(script, inputs, rt, tmp_path):  # noqa: F811
    """F3: the clean-up's `rm` result was ignored: with the daemon gone quiet, start said it removed the
    container while it ran on with no state naming it."""
    import signal
    import subprocess
    from test_launch import calls, container_plan
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    (d / "run_hang").touch()
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "launch.py"), "start", "--plan", str(plan_file),
                             "--confirm"], env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not [c for c in calls(d) if c["argv"][:1] == ["run"]]:
        time.sleep(0.1)
    (d / "rm_fails").touch()
    proc.send_signal(signal.SIGTERM)
    doc = json.loads(proc.communicate(timeout=90)[0])
    assert proc.returncode == 1 and "could not record it, nor remove it" in doc["error"], doc
    assert "it may be running" in doc["error"] and "removed" not in doc["error"]
    assert doc["fix"].startswith(f"docker rm -f {plan['container_name']}") and doc["interrupted"]



def test_stop_keeps_the_state_of_a_group_whose_leader_died_and_whose_workers_remain(inputs, live_tune, tmp_path):  # noqa: F811
    """F5: the API server died (OOM-killed), its renamed workers lived (their environ shows no marker): stop
    said "not running" and removed the only state that named them. It keeps it now, names them, and kills
    nothing it cannot prove is this run's."""
    import serve_life
    from common import ScriptError
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    with leader_killed_workers_left(tmp_path, plan) as pgid:
        with pytest.raises(ScriptError) as err:
            serve_life.stop(plan)
        assert "cannot be proven this run's" in err.value.error and f"kill -- -{pgid}" in err.value.fix
        assert serve_life.read_state(plan) is not None
        assert [p for p in serve_life.group_scan(pgid, 0) if p.name() == "sleep"]  # not killed
    assert serve_life.stop(plan) == {"stopped": False, "reason": "not running"}
    assert serve_life.read_state(plan) is None


@contextlib.contextmanager
def leader_killed_workers_left(tmp_path, plan):
    """A real start of the fake server in its renamed-worker mode, its leader then SIGKILLed (an OOM kill)
    while the workers, renamed and without the run's marker in view, live on. Yields the group; the
    whole group is killed on the way out."""
    import signal
    import serve_life
    from test_launch import server_mode
    server_mode(tmp_path, "renamed_worker")
    serve_life.start(plan, confirm=True)
    pgid = serve_life.read_state(plan)["pgid"]
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(serve_life.group_scan(pgid, 0)) < 2:
            time.sleep(0.2)
        os.kill(pgid, signal.SIGKILL)  # the leader only
        time.sleep(1)
        yield pgid
    finally:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        time.sleep(0.5)



@pytest.mark.parametrize("kind", ["file", "link"])
def test_bench_never_writes_its_raw_results_through_a_planted_name(tmp_path, kind):
    """F7: an --out folder holding a file named raw was an internal error (FileExistsError); a link named raw
    had the results written into its target."""
    import argparse
    import bench
    from common import ScriptError
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "victim").mkdir()
    (out / "raw").write_text("x") if kind == "file" else (out / "raw").symlink_to(tmp_path / "victim")
    plan = {"path": "host", "argv": ["/v/bin/vllm", "serve", "m"]}
    args = argparse.Namespace(input_lens=[16], concurrency=[1], repeats=1, output_len=8, seed=1)
    with pytest.raises(ScriptError, match="is not a folder of bench's own"):
        bench.run_matrix(plan, args, out, {})
    assert not list((tmp_path / "victim").iterdir())



def test_verify_names_an_api_key_this_shell_lacks_and_keeps_the_last_pass(inputs, live_tune, tmp_path, monkeypatch):  # noqa: F811
    """Note of the twenty-second audit: verify in a shell without the key judged a healthy server failed
    (HTTP 401) and cleared its last pass, so handoff refused it. It names the variable first now."""
    import serve_life
    from common import ScriptError
    monkeypatch.setenv("MYK", "k" * 24)
    plan_file, plan = host_plan(tmp_path, inputs, live_tune, api_key_env="MYK")
    serve_life.start(plan, confirm=True)
    try:
        serve_life.write_state(plan, {**serve_life.read_state(plan), "verified_at": 1.0})
        monkeypatch.delenv("MYK")
        with pytest.raises(ScriptError) as err:
            serve_life.verify(plan, 30, 10)
        assert "MYK is not set in this shell" in err.value.error and err.value.extra["phase"] == "verify"
        assert serve_life.read_state(plan)["verified_at"] == 1.0
    finally:
        serve_life.stop(plan)


# ---- a CI run on EPYC Rome: time_to_healthy_s counted from verify's own start read 0.0 when the two starts
# before it took longer than the fake's 1 s start-up. It counts from the launch now, and says when it is a bound.

def test_time_to_healthy_counts_from_the_launch_and_says_when_it_is_only_a_bound(inputs, live_tune, tmp_path):  # noqa: F811
    import serve_life
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    serve_life.start(plan, confirm=True)
    try:
        first = serve_life.verify(plan, 30, 10)  # right after start: verify waits for the fake's 1 s
        assert first["time_to_healthy_s"] >= 1 and not first["healthy_at_first_poll"]
        time.sleep(2)
        late = serve_life.verify(plan, 30, 10)  # the server was up before this verify looked: a bound
        assert late["healthy_at_first_poll"] and late["time_to_healthy_s"] >= first["time_to_healthy_s"] + 2
    finally:
        serve_life.stop(plan)


@pytest.mark.parametrize("started_at", [None, "12", True, float("nan"), float("inf")])
def test_time_since_start_of_a_state_without_a_usable_time_is_unknown(started_at):
    import serve_life
    assert serve_life.time_since_start({"started_at": started_at}) is None
    assert serve_life.time_since_start({"started_at": time.time() + 3600}) == 0.0  # a clock set back


# ---- the twenty-third audit (2026-12-02, ~290 cases on the twenty-second's fixes: 5 findings)

def test_start_refuses_while_the_kept_state_names_a_dead_leaders_workers(inputs, live_tune, tmp_path):  # noqa: F811
    """F1: stop kept the state of a dead leader's unprovable workers; the next start wrote over it, and the
    workers were named by nothing (the tool could never show them again)."""
    import serve_life
    from common import ScriptError
    from test_launch import server_mode
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    with leader_killed_workers_left(tmp_path, plan):
        with pytest.raises(ScriptError, match="cannot be proven"):
            serve_life.stop(plan)
        kept = serve_life.read_state(plan)
        server_mode(tmp_path, "good")
        with pytest.raises(ScriptError) as err:
            serve_life.start(plan, confirm=True)
        assert "already running" in err.value.error and "whose leader is gone" in err.value.error
        assert serve_life.read_state(plan) == kept  # still names the workers
    assert serve_life.stop(plan) == {"stopped": False, "reason": "not running"}


def test_verify_refuses_a_key_no_header_can_carry_at_once(inputs, live_tune, tmp_path, monkeypatch):  # noqa: F811
    """F2: a key variable holding a newline made every request fail before it was sent: verify waited out its
    whole timeout (600 s by default), then called a healthy server dead and cleared its last pass."""
    import serve_life
    from common import ScriptError
    monkeypatch.setenv("MYK", "k" * 24)
    plan_file, plan = host_plan(tmp_path, inputs, live_tune, api_key_env="MYK")
    serve_life.start(plan, confirm=True)
    try:
        serve_life.verify(plan, 30, 10)
        passed = serve_life.read_state(plan)["verified_at"]
        for bad in ("part1xxxxxxx\npart2yyyyyy", "k" * 24 + "\r", "with space"):
            monkeypatch.setenv("MYK", bad)
            t0 = time.monotonic()
            with pytest.raises(ScriptError) as err:
                serve_life.verify(plan, 600, 10)
            assert time.monotonic() - t0 < 5 and "MYK holds characters" in err.value.error
            assert bad not in err.value.error + err.value.fix and err.value.extra["phase"] == "verify"
            assert serve_life.read_state(plan)["verified_at"] == passed
    finally:
        serve_life.stop(plan)


def test_plan_refuses_an_estimate_sized_for_another_dtype(tmp_path, inputs, live_tune):  # noqa: F811
    """F3: plan --dtype float32 on an estimate of bfloat16 served float32 with half its memory counted: the
    summary called a fit what could run out of memory, and --max-num-seqs was twice what the KV cache holds."""
    from common import ScriptError
    from test_launch import load_docs
    import serve_life
    import serve_plan
    docs = load_docs(inputs)
    docs["validate"].update(backend="stock")  # a stack that serves float32 (zentorch's platform does not)
    assert docs["estimate_memory"]["dtype"] == "bfloat16"
    opt = {"port": 8000, "state_dir": str(tmp_path / "st"), "dtype": "float32"}
    with pytest.raises(ScriptError) as err:
        serve_plan.build_plan(docs, opt, load_epyc_doc(), serve_life.host_facts(opt, docs))
    assert "sized the model at bfloat16, the plan serves float32" in err.value.error
    assert "--dtype float32" in err.value.fix


def load_epyc_doc():
    from common import load_epyc
    return load_epyc()


def test_up_sizes_the_dtype_it_serves(inputs, tmp_path, monkeypatch):  # noqa: F811
    """F3, up's half: its estimate_memory step sized bfloat16 whatever --dtype up served. The steps before it
    are the fixtures' real documents (detect of a Genoa tree, validate, check_model); up stops at the estimate."""
    import argparse
    import launch
    from common import ScriptError
    from test_launch import load_docs
    docs = load_docs(inputs)
    seen = {}

    def step(script, args, phase, run_dir, allow_fail=False):
        seen[phase] = args
        if phase == "estimate_memory":
            raise ScriptError("the test stops here", "-")
        return docs[phase]
    monkeypatch.setattr(launch, "step", step)
    a = argparse.Namespace(model=docs["check_model"]["model"], state_dir=str(tmp_path / "up"), stock=False,
                           python=None, yes=True, max_model_len=None, num_prompts=4, port=None, expose=False,
                           served_model_name="m", api_key_env=None, throughput_flags=False, kernel_log=False,
                           timeout=30, dtype="float32")
    with pytest.raises(ScriptError, match="the test stops here"):
        launch.up(a, load_epyc_doc())
    assert seen["estimate_memory"][-2:] == ["--dtype", "float32"]
    a.dtype = None  # the default: the estimate's own default, the same as plan's
    with pytest.raises(ScriptError, match="the test stops here"):
        launch.up(a, load_epyc_doc())
    assert "--dtype" not in seen["estimate_memory"]


def test_concurrent_state_writes_never_show_a_reader_half_a_state(tmp_path):
    """F5: write_state used one temp name: two writers at once (two verifies) truncated the file the other had
    just renamed into place, and a reader (a stop) saw junk, said "not running" and left the server up."""
    import subprocess
    import serve_life
    plan = {"state_file": str(tmp_path / "state.json")}
    serve_life.write_state(plan, {"path": "host", "pgid": 1, "create_time": 1.0, "n": 0})  # a start's fields
    writer = ("import sys; sys.path.insert(0, sys.argv[1]); import serve_life\n"
              "for i in range(1500): serve_life.write_state({'state_file': sys.argv[2]}, "
              "{'path': 'host', 'pgid': 1, 'create_time': 1.0, 'pad': 'x' * 4000, 'n': i})")
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(ROOT / "scripts"), plan["state_file"]],
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    reads = torn = 0
    while any(p.poll() is None for p in procs):
        reads += 1
        torn += serve_life.read_state(plan) is None
    errors = [p.communicate()[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors  # no writer failed on the other's temp file
    assert reads > 100 and torn == 0
    assert serve_life.read_state(plan)["n"] == 1499
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]  # no temp file left behind


def test_a_state_dir_holds_one_server_whichever_plan_started_it(script, inputs, rt, tmp_path):  # noqa: F811
    """F4: two plans in one state dir (two ports): the second start wrote its state over the running first's,
    the first plan's stop then removed the second's state, and a container ran that nothing named."""
    from test_launch import free_port, plan_args
    d, env = rt
    plans = []
    for tag in "AB":
        r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st"), "--port", str(free_port())),
                   env=env)
        assert r.code == 0, r.doc
        (tmp_path / f"plan{tag}.json").write_text(r.stdout)
        plans.append((tmp_path / f"plan{tag}.json", r.doc))
    (a_file, a), (b_file, b) = plans
    assert script("launch.py", "start", "--plan", str(a_file), "--confirm", env=env).code == 0
    r = script("launch.py", "start", "--plan", str(b_file), "--confirm", env=env)
    assert r.code == 1 and "already running" in r.doc["error"] and a["container_name"] in r.doc["error"], r.doc
    for verb in ("verify", "stop", "handoff"):  # B's verbs never judge, stop or describe A's server
        r = script("launch.py", verb, "--plan", str(b_file), env=env)
        assert r.code == 1 and "of another plan" in r.doc["error"] and f"port {a['port']}" in r.doc["error"], r.doc
    assert json.loads((tmp_path / "st" / "state.json").read_text())["container_name"] == a["container_name"]
    (d / "exited").write_text("")  # A's container is gone: its state is stale, and no refusal of B's
    r = script("launch.py", "stop", "--plan", str(b_file), env=env)
    assert r.code == 0 and (tmp_path / "st" / "state.json").exists()  # B's stop leaves A's state to A's stop
    r = script("launch.py", "verify", "--plan", str(b_file), "--timeout", "2", env=env)
    assert r.code == 1 and "nothing was started from this plan" in r.doc["error"], r.doc
    assert script("launch.py", "stop", "--plan", str(a_file), env=env).code == 0
    assert not (tmp_path / "st" / "state.json").exists()


def test_a_host_plans_verbs_refuse_another_plans_running_server(inputs, live_tune, tmp_path):  # noqa: F811
    """F4 on the host path: start refused already, but stop with the other plan would have killed the running
    server (the state names a process group, not a plan)."""
    import serve_life
    from common import ScriptError
    _, a = host_plan(tmp_path, inputs, live_tune)
    _, b = host_plan(tmp_path, inputs, live_tune)  # the same state dir, another port
    assert a["state_dir"] == b["state_dir"] and a["port"] != b["port"]
    serve_life.start(a, confirm=True)
    try:
        for act in (lambda: serve_life.start(b, confirm=True), lambda: serve_life.stop(b),
                    lambda: serve_life.verify(b, 5, 5)):
            with pytest.raises(ScriptError) as err:
                act()
            assert f"port {a['port']}" in err.value.error, err.value.error
        assert serve_life.process_alive(serve_life.read_state(a))
        serve_life.verify(a, 30, 10)
    finally:
        serve_life.stop(a)


def test_up_refuses_a_folder_whose_server_runs_before_writing_anything(script, inputs, live_tune, tmp_path):  # noqa: F811
    """F4, up's half: a second `up` with the same (default) folder wrote its documents and plan.json over the
    running server's, so the printed stop command stopped the wrong server and the first was named by nothing."""
    import serve_life
    _, plan = host_plan(tmp_path, inputs, live_tune)
    serve_life.start(plan, confirm=True)
    try:
        before = sorted(os.listdir(plan["state_dir"]))
        t0 = time.monotonic()
        r = script("launch.py", "up", "--yes", "--state-dir", plan["state_dir"])
        assert r.code == 1 and "holds a running server" in r.doc["error"] and "stop --plan" in r.doc["fix"], r.doc
        assert time.monotonic() - t0 < 30 and sorted(os.listdir(plan["state_dir"])) == before
    finally:
        serve_life.stop(plan)


def test_stop_waits_for_a_start_in_progress_instead_of_saying_not_running(script, inputs, live_tune, tmp_path):  # noqa: F811
    """A note of the twenty-third audit: stop took no lock, so while a start held the state dir (a container
    pull and run can take minutes) stop found no state, said "not running", and the server came up after.
    Here another process holds the lock exactly as start does."""
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    Path(plan["state_dir"]).mkdir(parents=True, exist_ok=True)
    with another_process_holding(str(Path(plan["state_dir"]) / ".lock")):
        r = script("launch.py", "stop", "--plan", str(plan_file))
        assert r.code == 1 and "a start (or another stop) for" in r.doc["error"] and "in progress" in r.doc["error"], r.doc
        assert "wait for start" in r.doc["fix"] and r.doc["phase"] == "stop"
    r = script("launch.py", "stop", "--plan", str(plan_file))
    assert r.code == 0 and r.doc["stopped"] is False, r.doc


def test_up_with_python_serves_on_the_host_path_even_when_docker_answers(inputs, rt, tmp_path, monkeypatch):  # noqa: F811
    """A note of the twenty-third audit: `up --python VENV` on a host whose docker answered planned a container,
    and the interpreter the user named was probed for nothing. up now asks validate for the host path. The
    validate step here is the real validate.py, with the fake docker on PATH answering `docker info`."""
    import argparse
    import launch
    from common import ScriptError
    from test_launch import load_docs
    docs = load_docs(inputs)
    _, env = rt
    seen = {}

    def step(script, args, phase, run_dir, allow_fail=False):
        if phase != "validate":
            return docs[phase]
        args = [str(inputs["detect"]) if a.endswith("detect.json") else a for a in args]
        seen["args"] = args
        seen["doc"] = run_script("validate.py", *args, env=env).doc
        raise ScriptError("the test stops here", "-")
    monkeypatch.setattr(launch, "step", step)
    a = argparse.Namespace(model=docs["check_model"]["model"], state_dir=str(tmp_path / "up"), stock=False,
                           python=sys.executable, yes=True, max_model_len=None, num_prompts=1, port=None,
                           expose=False, served_model_name="m", api_key_env=None, throughput_flags=False,
                           kernel_log=False, timeout=30, dtype=None)
    with pytest.raises(ScriptError, match="the test stops here"):
        launch.up(a, load_epyc_doc())
    assert seen["args"][-4:] == ["--python", sys.executable, "--runtime", "host"]
    assert seen["doc"]["path"] != "container" and "docker" not in seen["doc"]["runtime_detail"], seen["doc"]
    # without --python, the documented order: the fake docker answers, so the container path
    a.python = None
    with pytest.raises(ScriptError, match="the test stops here"):
        launch.up(a, load_epyc_doc())
    assert "--runtime" not in seen["args"] and seen["doc"]["path"] == "container", seen["doc"]


@pytest.mark.parametrize("env,needle", [
    ({"HF_HOME": ""}, "HF_HOME is empty"), ({"HF_HUB_CACHE": "cache/hub"}, "HF_HUB_CACHE is a relative path"),
    ({"HUGGINGFACE_HUB_CACHE": ""}, "HUGGINGFACE_HUB_CACHE is empty"),
    ({"XDG_CACHE_HOME": ""}, "XDG_CACHE_HOME is empty and HF_HOME is unset"),
    ({"XDG_CACHE_HOME": "rel"}, "XDG_CACHE_HOME is a relative path"),
])
def test_a_hub_cache_relative_to_where_a_step_runs_is_refused_by_every_step_that_reads_it(script, tmp_path, env, needle):
    """A note left by the twenty-second audit: an empty HF_HOME (or XDG_CACHE_HOME) read as unset here, while
    the Hub client takes it as a folder relative to where it runs (an empty HF_HOME: ./hub). check_model,
    validate's container mount and the server would each have looked for the model in another folder.
    The Hub client's own reading is asked first, so the test follows it if it ever changes."""
    import subprocess
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "XDG_"))}
    hub = subprocess.run([sys.executable, "-c", "import huggingface_hub.constants as c; print(c.HF_HUB_CACHE)"],
                         env={**clean, **env}, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert not os.path.isabs(hub.stdout.strip()), hub.stdout  # the client: a folder relative to its cwd
    others = tuple(k for k in os.environ if k.startswith(("HF_", "HUGGINGFACE_", "XDG_")) and k not in env)
    for tool, args in (("check_model.py", ["--model", "Qwen/Qwen3-0.6B", "--vllm-version", "0.32.0"]),
                       ("estimate_memory.py", ["--model", "Qwen/Qwen3-0.6B"]),
                       ("validate.py", ["--runtime", "docker"])):
        r = script(tool, *args, env=env, unset=others)
        assert r.code == 1 and needle in r.doc["error"] and "absolute path" in r.doc["fix"], (tool, r.doc)
    if "XDG" in needle:  # an absolute HF_HOME decides: the XDG folder is then not the Hub's
        r = script("estimate_memory.py", "--model", "Qwen/Qwen3-0.6B", env={**env, "HF_HOME": str(tmp_path / "hf"),
                   "HF_HUB_OFFLINE": "1"}, unset=others)
        assert "relative path" not in r.stdout and " is empty" not in r.stdout, r.doc


# ---- the twenty-fourth audit (2026-12-03, ~165 cases on the twenty-third's fixes: 6 findings)

def test_two_plans_on_one_port_and_folder_are_told_apart_by_their_command(inputs, live_tune, tmp_path):  # noqa: F811
    """F1: plan B (same port and state dir, another --served-model-name) was taken for plan A: B's verify
    judged A's server with B's model name and cleared its pass, B's stop killed it. The state records the
    plan's identity (command, env, where) now."""
    import serve_life
    from common import ScriptError
    _, a = host_plan(tmp_path, inputs, live_tune)
    _, b = host_plan(tmp_path, inputs, live_tune, port=a["port"], served_model_name="other-model")
    assert (a["state_dir"], a["port"]) == (b["state_dir"], b["port"]) and a["argv"] != b["argv"]
    serve_life.start(a, confirm=True)
    try:
        serve_life.verify(a, 30, 10)
        for act in (lambda: serve_life.stop(b), lambda: serve_life.verify(b, 5, 5),
                    lambda: serve_life.verified_state(b), lambda: serve_life.start(b, confirm=True)):
            with pytest.raises(ScriptError) as err:
                act()
            assert "another command on the same port" in err.value.error, err.value.error
        assert serve_life.process_alive(serve_life.read_state(a)) and serve_life.verified_state(a)
    finally:
        assert serve_life.stop(a)["stopped"] is True


def test_a_state_without_port_or_identity_is_judged_by_the_port_its_run_serves(inputs, live_tune, tmp_path):  # noqa: F811
    """F2: a state of an older bundle (no port, no identity) made any host plan with that folder its owner:
    a plan for another port stopped the running server. The port is read from the run's command line now."""
    import serve_life
    from common import ScriptError
    _, a = host_plan(tmp_path, inputs, live_tune)
    _, c = host_plan(tmp_path, inputs, live_tune)  # the same folder, another port
    serve_life.start(a, confirm=True)
    try:
        legacy = {k: v for k, v in serve_life.read_state(a).items() if k not in ("port", "plan_id")}
        serve_life.write_state(a, legacy)
        with pytest.raises(ScriptError) as err:
            serve_life.stop(c)
        assert f"port {a['port']}" in err.value.error, err.value.error
        assert serve_life.process_alive(legacy)
    finally:
        assert serve_life.stop(a)["stopped"] is True  # its own plan: the port on the command line is its


def test_up_holds_its_folder_so_a_second_up_cannot_rewrite_the_first_ones_plan(script, tmp_path):
    """F3: a second up into a folder whose first up was still pulling (no state yet, start's .lock not
    taken) rewrote every step document and plan.json, and the first run's server was left with no plan file
    that could stop it. Here another process holds the folder as up does."""
    run_dir = tmp_path / "up"
    run_dir.mkdir()
    with another_process_holding(str(run_dir / ".up.lock")):
        r = script("launch.py", "up", "--yes", "--state-dir", str(run_dir))
        assert r.code == 1 and "another up is running" in r.doc["error"], r.doc
        assert sorted(p.name for p in run_dir.iterdir()) == [".up.lock"]  # nothing written


def test_stop_that_cannot_remove_the_state_says_the_server_is_stopped(inputs, live_tune, tmp_path, monkeypatch):  # noqa: F811
    """F4: on a read-only state dir stop killed the server, then failed on the state's unlink ("the system
    refused an operation") with no word that the server was gone, and every later stop failed the same way.
    The server is real; the read-only folder is simulated in-process (an unlink raising EROFS), as a
    read-only mount needs privileges a CI shell may lack."""
    import errno
    import pathlib
    import serve_life
    _, plan = host_plan(tmp_path, inputs, live_tune)
    serve_life.start(plan, confirm=True)
    state = serve_life.read_state(plan)
    real_unlink = pathlib.Path.unlink

    def read_only(self, missing_ok=False):
        if str(self) == plan["state_file"]:
            raise OSError(errno.EROFS, "Read-only file system")
        return real_unlink(self, missing_ok=missing_ok)
    monkeypatch.setattr(pathlib.Path, "unlink", read_only)
    doc = serve_life.stop(plan)
    assert doc["stopped"] is True and not serve_life.group_members(state)
    assert "could not be removed" in doc["warnings"][0] and "Read-only file system" in doc["warnings"][0]
    again = serve_life.stop(plan)  # the state names a server that is gone: "not running", still no error
    assert again["stopped"] is False and again["reason"] == "not running" and again["warnings"]


def test_bench_and_kernel_proof_refuse_another_plans_run_in_the_state_dir(script, inputs, live_tune, tmp_path):  # noqa: F811
    """F6: bench (with the plan's endpoint known) loaded whatever answered on its port and wrote its
    bench-* folder into the other server's state dir; kernel_proof --plan read the other run's log as
    this plan's proof."""
    import serve_life
    _, a = host_plan(tmp_path, inputs, live_tune)
    c_file, c = host_plan(tmp_path, inputs, live_tune)  # the same folder, another port
    assert c["primary_endpoint"] != "unknown"
    serve_life.start(a, confirm=True)
    try:
        before = sorted(os.listdir(a["state_dir"]))
        r = script("bench.py", "--plan", str(c_file), "--repeats", "1", "--no-bandwidth")
        assert r.code == 1 and "another plan" in r.doc["error"] and f"port {a['port']}" in r.doc["error"], r.doc
        assert sorted(os.listdir(a["state_dir"])) == before
        k = script("kernel_proof.py", "--plan", str(c_file))
        assert k.code == 1 and "another plan" in k.doc["error"] and "proves nothing" in k.doc["error"], k.doc
        os.killpg(serve_life.read_state(a)["pgid"], signal.SIGKILL)  # A crashes: its state stays, stale
        time.sleep(0.5)
        v = script("launch.py", "verify", "--plan", str(c_file), "--timeout", "5")
        assert v.code == 1 and "another plan's ended run" in v.doc["error"], v.doc
    finally:
        serve_life.stop(a)


def test_a_container_whose_state_cannot_be_written_is_said_removed(script, inputs, rt, tmp_path, monkeypatch):  # noqa: F811
    """A note of the twenty-fourth audit: a container start on a full disk said only "cannot write
    state.json"; the container had been launched and removed, and the host path says so. The runtime is the
    fake docker; the full disk is simulated in-process (write_state raising what it raises on ENOSPC: a
    file-size limit would also stop the runtime's own writes)."""
    import errno
    import common
    import serve_life
    from common import ScriptError
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    def full_disk(plan, state):
        raise common.os_error(OSError(errno.ENOSPC, "No space left on device"), f"cannot write {plan['state_file']}")
    monkeypatch.setattr(serve_life, "write_state", full_disk)
    with pytest.raises(ScriptError) as err:
        serve_life.start(plan, confirm=True)
    assert "was launched, but its state could not be written" in err.value.error, err.value.error
    assert "start removed it" in err.value.error and "No space left" in err.value.error
    made = [c["argv"][0] for c in _calls(d)]
    assert made[-1] == "rm" and "run" in made


# ---- the twenty-fifth audit (2026-12-03, ~1,290 cases, 1,125 of them forged states: 4 findings, 3 notes;
# the engine ones are in tests/test_docker_engine.py)

def test_start_and_bench_refuse_a_relative_hub_cache_the_server_would_read(script, inputs, live_tune, tmp_path):  # noqa: F811
    """F4: validate and the Hub reads refused a relative HF_HOME, but start passed it on to the host server,
    which would have looked for (and downloaded) the model under start's own folder."""
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env={"HF_HOME": "relcache"})
    assert r.code == 1 and "HF_HOME is a relative path 'relcache'" in r.doc["error"], r.doc
    assert not os.path.exists(plan["state_file"])  # nothing started
    b = script("bench.py", "--plan", str(plan_file), "--repeats", "1", "--no-bandwidth", env={"HF_HOME": ""})
    assert b.code == 1 and "HF_HOME is empty" in b.doc["error"], b.doc


def test_a_state_with_a_key_twice_is_refused_not_read_as_its_last_value(script, inputs, live_tune, tmp_path):  # noqa: F811
    """C1: a state.json edited to name a key twice was read as its last value by every verb (plans and step
    documents refuse that since the twenty-third). Which pid or port it means is anyone's guess: refused, and
    nothing is killed."""
    import serve_life
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    serve_life.start(plan, confirm=True)
    try:
        text = Path(plan["state_file"]).read_text()
        Path(plan["state_file"]).write_text(text.replace("{", '{"pgid": 1, ', 1))
        for verb in ("stop", "verify", "handoff"):
            r = script("launch.py", verb, "--plan", str(plan_file))
            assert r.code == 1 and "is ambiguous" in r.doc["error"] and "appears twice" in r.doc["error"], r.doc
        Path(plan["state_file"]).write_text(text)
        assert serve_life.process_alive(serve_life.read_state(plan))
    finally:
        serve_life.stop(plan)


def test_an_older_plan_sized_at_another_dtype_still_stops_but_never_starts(script, inputs, live_tune, tmp_path):  # noqa: F811
    """The review of the twenty-fifth's fixes: an older `up --dtype float32` sized the model at bfloat16 (it
    did not pass the dtype on). plan refuses that pair now; the verbs acting on its running server must
    still read it (stop most of all), and start must not run it again."""
    _, plan = host_plan(tmp_path, inputs, live_tune, dtype="float32",
                        edit=lambda docs: docs["estimate_memory"].update(dtype="float32"))
    older = json.loads(json.dumps(plan))
    older["inputs"]["estimate_memory"]["dtype"] = "bfloat16"  # what the older up recorded
    pfile = tmp_path / "older-plan.json"
    pfile.write_text(json.dumps(older))
    stop = script("launch.py", "stop", "--plan", str(pfile))
    assert stop.code == 0 and stop.doc["reason"] == "not running", stop.doc
    start = script("launch.py", "start", "--plan", str(pfile), "--confirm")
    assert start.code == 1 and "sized the model at bfloat16, the plan serves float32" in start.doc["error"], start.doc


def test_a_stale_state_of_an_older_bundle_is_cleared_by_its_own_stop(inputs, live_tune, tmp_path):  # noqa: F811
    """The review's fourth finding: a state with neither port nor plan_id whose server has exited was
    "another plan's" (its port unreadable): stop never removed it, verify called it foreign."""
    import serve_life
    _, plan = host_plan(tmp_path, inputs, live_tune)
    serve_life.start(plan, confirm=True)
    state = serve_life.read_state(plan)
    serve_life.write_state(plan, {k: v for k, v in state.items() if k not in ("port", "plan_id")})
    os.killpg(state["pgid"], signal.SIGKILL)
    time.sleep(0.5)
    assert serve_life.stop(plan) == {"stopped": False, "reason": "not running"}
    assert serve_life.read_state(plan) is None


def test_handoff_hands_off_only_a_server_healthy_now(script, inputs, live_tune, tmp_path):  # noqa: F811
    """The twenty-fourth's F5: a verify that could not write its state (read-only folder, `ulimit -f 0`) could
    not clear the pass it found, so handoff gave out a server whose engine had died since. handoff now asks
    /health itself: vLLM's API process outlives a dead engine and answers 503 (the fake does so on SIGUSR1)."""
    import serve_life
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    serve_life.start(plan, confirm=True)
    try:
        assert script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "20").code == 0
        assert script("launch.py", "handoff", "--plan", str(plan_file)).code == 0
        # a key this shell holds wrongly is no server down: /health is asked without it (twenty-seventh, F2)
        assert script("launch.py", "handoff", "--plan", str(plan_file), env={"MY_API_KEY": "ABCDEFGHIJ\nKLMNOPQ"}).code == 0
        os.kill(serve_life.read_state(plan)["pid"], signal.SIGUSR1)
        # verify with no room to write (as root a read-only folder would not stop it) cannot clear the pass...
        again = subprocess.run(["bash", "-c", 'ulimit -f 0; exec "$0" "$@"', sys.executable,
                                str(ROOT / "scripts" / "launch.py"), "verify", "--plan", str(plan_file), "--timeout", "5"],
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 1 and json.loads(again.stdout)["error"], again.stdout
        assert "verified_at" in serve_life.read_state(plan)
        state = serve_life.read_state(plan)
        for forged_pass in (True, -1, 1e308, "1"):  # forged passes are none (twenty-sixth and -seventh, notes)
            serve_life.write_state(plan, {**state, "verified_at": forged_pass})
            forged = script("launch.py", "handoff", "--plan", str(plan_file))
            assert forged.code == 1 and "has not passed verify" in forged.doc["error"], (forged_pass, forged.doc)
        serve_life.write_state(plan, state)
        hand = script("launch.py", "handoff", "--plan", str(plan_file))  # ...and handoff does not trust it
        assert hand.code == 1 and "not healthy now (/health: HTTP 503)" in hand.doc["error"], hand.doc
        assert "stop it, start it again, then verify" in hand.doc["fix"] and "base_url" not in hand.doc
    finally:
        serve_life.stop(plan)


@pytest.mark.parametrize("wrap", [
    lambda k: "Basic " + __import__("base64").b64encode(f"user:{k}".encode()).decode(),   # a Basic header echoed
    lambda k: __import__("base64").b64encode(f"{k}\n".encode()).decode(),                # a secret dump
    lambda k: "Basic " + __import__("base64").b64encode(f"ab:{k}xy".encode()).decode(),
    lambda k: "q=" + __import__("urllib.parse").parse.quote(k, safe="").replace("%2F", "%2f").replace("%2B", "%2b")
    .replace("%3D", "%3d"),                                                               # %2f, not %2F
    lambda k: "eyJhbGciOiJub25lIn0." + __import__("base64").urlsafe_b64encode(               # base64url (a JWT)
        f'{{"key":"{k}"}}'.encode()).decode().rstrip("="),
    lambda k: "u=" + "".join(f"%{b:02X}" for b in k.encode()),                            # every byte escaped
    lambda k: "u=" + "".join(f"%{b:02x}" for b in k.encode()),
    lambda k: "hex " + k.encode().hex() + " and " + k.encode().hex().upper(),             # twenty-eighth, F5
    lambda k: '{"key": "' + k.replace("/", "\\/") + '"}',                                  # JSON with \/
    lambda k: __import__("json").dumps({"body": '{"key": "' + k.replace("/", "\\/") + '"}'}),  # and in JSON again
])
def test_a_secret_in_base64_or_lowercase_percent_encoding_is_masked(wrap, monkeypatch):
    """Noted since the twenty-fourth: a server echoing the Basic header a mirror's password went out in, or
    a client writing %2f for %2F, printed the secret in a form the mask did not know."""
    import common
    monkeypatch.setenv("MY_API_KEY", "sk/Secret+Value=123")
    text = wrap("sk/Secret+Value=123")
    masked = common.mask_secrets(f"server said: {text} end")
    assert "***" in masked and text not in masked, masked
    assert common.mask_secrets("Basic dXNlcjpwYXNzd29yZA== and words") == "Basic dXNlcjpwYXNzd29yZA== and words"
    tilde_key = "sk-~~~~secret~~~~value"  # its base64 has + where base64url has -
    monkeypatch.setenv("MY_API_KEY", tilde_key)
    for pre in ("", "a", "ab"):
        url_safe = __import__("base64").urlsafe_b64encode((pre + tilde_key).encode()).decode()
        assert "-" in url_safe and url_safe not in common.mask_secrets(f"token {url_safe} end"), url_safe


def test_bench_tokenizes_with_the_served_revisions_snapshot(tmp_path, monkeypatch):
    """Noted since the twenty-fourth: `vllm bench serve` takes no revision, so given the repo id it took
    the default branch's tokenizer; in an offline cache holding only the served revision, none at all.
    The cache below is filled by huggingface_hub itself from the local Hub (branch v1 only)."""
    import bench
    from huggingface_hub import hf_hub_download
    folder = tmp_path / "repo"
    folder.mkdir()
    for name in ("config.json", "tokenizer_config.json"):
        (folder / name).write_bytes((FIXTURES / "Qwen3-0.6B" / name).read_bytes())
    hub = Hub().start()
    cache = tmp_path / "hf" / "hub"
    try:
        repo = hub.add_folder("t/rev", folder, branches={"v1"})
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        got = [hf_hub_download("t/rev", name, revision="v1", cache_dir=str(cache), endpoint=hub.url)
               for name in ("config.json", "tokenizer_config.json")]
    finally:
        hub.stop()
    assert not (cache / "models--t--rev" / "refs" / "main").exists()  # only the served revision is cached
    snap = f"models--t--rev/snapshots/{repo.commit}"
    assert {Path(g).parent for g in got} == {cache / snap}
    validate = {"hf_cache": {"path": str(cache), "mount_subdir": "hub"}}
    host = {"path": "host", "model": "t/rev", "revision": "v1", "model_dir": None, "inputs": {"validate": validate},
            "argv": ["/v/bin/vllm", "serve", "t/rev", "--revision", "v1", "--port", "8000"]}
    assert bench.serving_target(host)["tokenizer"] == f"{cache}/{snap}"
    box = {**host, "path": "container", "runtime": "docker", "engine": None, "container_name": "epyc-x",
           "argv": ["docker", "run", "-d", "--entrypoint", "vllm", "img", "serve", "t/rev", "--revision", "v1"]}
    assert bench.serving_target(box)["tokenizer"] == f"/root/.cache/huggingface/hub/{snap}"
    # the commit itself names the same folder; a revision the cache lacks, or none, leaves the repo id
    assert bench.serving_target({**host, "revision": repo.commit})["tokenizer"] == f"{cache}/{snap}"
    assert bench.serving_target({**host, "revision": "v2"})["tokenizer"] == "t/rev"
    assert bench.serving_target({**host, "revision": None})["tokenizer"] == "t/rev"


def _plan_in(script, inputs, rt, folder: Path, port: int) -> tuple[Path, dict]:  # noqa: F811
    from test_launch import plan_args
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(folder), "--port", str(port)), env=rt[1])
    assert r.code == 0, r.doc
    path = folder.parent / f"{folder.name}-plan.json"
    path.write_text(r.stdout)
    return path, r.doc


def test_stop_never_takes_down_a_container_its_state_dir_did_not_start(script, inputs, rt, tmp_path):  # noqa: F811
    """Noted since the twenty-fourth: a container's name is one per port, not per state dir. Plan B (same
    port, its own state dir, nothing started) stopped plan A's container by that name; and a plan whose
    container another start had replaced stopped the newcomer. stop now asks the engine for the container's
    id first: none recorded here, or another id than the state's, and the container is left alone."""
    d, env = rt
    a_file, a = _plan_in(script, inputs, rt, tmp_path / "a", 18555)
    b_file, b = _plan_in(script, inputs, rt, tmp_path / "b", 18555)
    assert a["container_name"] == b["container_name"]
    assert script("launch.py", "start", "--plan", str(a_file), "--confirm", env=env).code == 0
    before = len(_calls(d))
    r = script("launch.py", "stop", "--plan", str(b_file), env=env)
    assert r.code == 1 and "has no record of" in r.doc["error"] and str(tmp_path / "b") in r.doc["error"], r.doc
    assert f"docker stop -t 30 {a['container_name']}" in r.doc["fix"]
    assert not any(c["argv"][0] in ("stop", "rm") for c in _calls(d)[before:])
    # nor does B's start remove it (its port may not be bound yet: vLLM takes a minute to listen)
    r = script("launch.py", "start", "--plan", str(b_file), "--confirm", env=env)
    assert r.code == 1 and "is running (id ffffffffffff)" in r.doc["error"] and "no record of" in r.doc["error"], r.doc
    assert not any(c["argv"][0] in ("stop", "rm", "run") for c in _calls(d)[before:])
    # and a bench --compare of B reports each sizing not served, never stopping A's container
    r = script("bench.py", "--plan", str(b_file), "--compare", "--input-lens", "16", "--concurrency", "1",
               "--repeats", "1", "--no-bandwidth", "--out", str(tmp_path / "cmp"), env=env, timeout=300)
    assert r.code == 1 and "no sizing could be served" in r.doc["error"] and "its stop" in r.doc["fix"], r.doc
    assert not any(c["argv"][0] in ("stop", "rm", "run") for c in _calls(d)[before:])
    # another start replaced A's container under the same name (A's own is gone): A's stop leaves it alone
    (d / f"created-{a['container_name']}").write_text("a" * 64)
    assert script("launch.py", "verify", "--plan", str(a_file), "--timeout", "3", env=env).doc["phase"] == "process"
    before = len(_calls(d))
    r = script("launch.py", "stop", "--plan", str(a_file), env=env)
    assert r.code == 0 and r.doc["stopped"] is False and r.doc["reason"] == "not running", r.doc
    assert "now is another start's (id aaaaaaaaaaaa, not ffffffffffff): left alone" in r.doc["warnings"][0]
    assert not any(c["argv"][0] in ("stop", "rm") for c in _calls(d)[before:])
    assert not (tmp_path / "a" / "state.json").exists()
    # once that one is gone, its own container, recorded: stopped as before
    (d / f"removed-{a['container_name']}").touch()
    assert script("launch.py", "start", "--plan", str(a_file), "--confirm", env=env).code == 0
    r = script("launch.py", "stop", "--plan", str(a_file), env=env)
    assert r.code == 0 and r.doc["stopped"] is True, r.doc


def test_an_older_plan_without_model_dir_started_now_can_still_be_stopped(script, inputs, live_tune, tmp_path):  # noqa: F811
    """Twenty-sixth audit, F4: a plan of an older bundle has no `model_dir`; start recorded `null` for it,
    which the other verbs took as "a Hub id, no folder" and refused the plan, stop included: the server ran
    on with nothing able to stop it. start records no folder for such a plan; the verbs read the disk."""
    _, plan = host_plan(tmp_path, inputs, live_tune)
    older = {k: v for k, v in plan.items() if k != "model_dir"}
    pfile = tmp_path / "older-plan.json"
    pfile.write_text(json.dumps(older))
    started = script("launch.py", "start", "--plan", str(pfile), "--confirm")
    assert started.code == 0, started.doc
    try:
        assert "model_dir" not in json.loads(Path(plan["state_file"]).read_text())
        assert script("launch.py", "verify", "--plan", str(pfile), "--timeout", "20").code == 0
        # the null an earlier bundle recorded for such a plan (twenty-seventh, note): read as "not recorded"
        import serve_life
        serve_life.write_state(plan, {**serve_life.read_state(plan), "model_dir": None})
        assert script("launch.py", "handoff", "--plan", str(pfile)).code == 0
    finally:
        stop = script("launch.py", "stop", "--plan", str(pfile))
    assert stop.code == 0 and stop.doc["stopped"] is True, stop.doc


def test_a_start_while_another_up_holds_the_folder_is_refused(script, inputs, live_tune, tmp_path):  # noqa: F811
    """Twenty-sixth audit, F1: a plain start of an older plan in a folder where an up ran its steps started a
    server, and up's plan.json, written next, named another: no plan could stop it. start refuses while
    another process holds .up.lock (up's own start holds it in the same process: not refused)."""
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    Path(plan["state_dir"]).mkdir(parents=True, exist_ok=True)
    with another_process_holding(str(Path(plan["state_dir"]) / ".up.lock")):
        r = script("launch.py", "start", "--plan", str(plan_file), "--confirm")
        assert r.code == 1 and "an up in" in r.doc["error"] and "running its steps" in r.doc["error"], r.doc
        assert not Path(plan["state_file"]).exists()
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
    assert script("launch.py", "stop", "--plan", str(plan_file)).doc["stopped"] is True


def test_a_start_while_stop_waits_for_the_server_is_refused_not_orphaned(script, inputs, live_tune, tmp_path):  # noqa: F811
    """Twenty-sixth audit, F2: stop held no lock; a start that came in while the server took its time to exit
    wrote its state, and stop then removed that state: a new server ran, named by nothing. stop now holds
    .lock for its whole run. (The fake server's slow_term mode takes 3 s to exit on SIGTERM.)"""
    import serve_life
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    (Path(plan["argv"][next(k for k, a in enumerate(plan["argv"]) if a.endswith("/vllm"))]).parent / "mode").write_text(
        "slow_term")
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
    stopping = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "launch.py"), "stop", "--plan", str(plan_file)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)  # SIGTERM sent; the server still exiting
        r = script("launch.py", "start", "--plan", str(plan_file), "--confirm")
        assert r.code == 1 and "or a stop" in r.doc["error"], r.doc
        out, _ = stopping.communicate(timeout=60)
        assert json.loads(out)["stopped"] is True
        assert serve_life.read_state(plan) is None and not serve_life.port_in_use(plan["port"])
    finally:
        if stopping.poll() is None:
            stopping.kill()
        serve_life.stop(plan)


def test_ups_own_start_is_not_refused_by_the_folder_it_holds(inputs, live_tune, tmp_path, monkeypatch):  # noqa: F811
    """The other side of F1's fix: up holds .up.lock through its start, in the same process; that start is
    up's own and runs. The steps here return the host-path documents host_plan uses (a fake venv's server)."""
    import argparse
    import launch
    from test_launch import free_port, host_docs
    docs = host_docs(tmp_path, inputs, live_tune)
    monkeypatch.setattr(launch, "step", lambda script, args, phase, run_dir, allow_fail=False: docs[phase])
    a = argparse.Namespace(model=docs["check_model"]["model"], state_dir=str(tmp_path / "up"), stock=True,
                           python=None, yes=True, max_model_len=None, num_prompts=1, port=free_port(), expose=False,
                           served_model_name="m", api_key_env=None, throughput_flags=False, kernel_log=False,
                           timeout=30, dtype=None)
    done = launch.up(a, load_epyc_doc())
    try:
        assert done["ok"] and done["started"]["started"] and done["verify"]["ok"], done
    finally:
        plan = json.loads(Path(done["plan_file"]).read_text())
        import serve_life
        assert serve_life.stop(plan)["stopped"] is True


@pytest.mark.parametrize("vendor,refused", [("GenuineIntel", True), ("HygonGenuine", True), ("AuthenticAMD", False),
                                            (None, True)])
def test_zentorch_on_a_cpu_detect_read_as_not_amd_is_a_mismatch(vendor, refused):
    """A note of the twenty-sixth audit: a validate.json that chose zentorch planned beside a detect.json of
    an Intel CPU, and the summary read "zentorch-accelerated" for a platform vLLM never picks there. (None, a
    note left since the twenty-eighth: a CPU whose vendor detect.py could not read is not called an EPYC, so
    validate.py is never ready with zentorch for it; a spec writes AuthenticAMD.)"""
    from serve_plan import mismatches
    docs = {"detect": {"vendor": vendor}, "validate": {"backend": "zentorch"}, "check_model": {}, "estimate_memory": {},
            "cpu_tune": {}}
    assert any("activates only on AMD CPUs" in m for m in mismatches(docs)) == refused
    assert vendor is not None or any("detect.py read no CPU vendor" in m for m in mismatches(docs))
    docs["validate"]["backend"] = "stock"
    assert mismatches(docs) == []


@pytest.mark.parametrize("plant", ["link", "fifo", "folder"])
def test_up_refuses_a_start_lock_that_is_not_its_own_file_before_any_step(script, tmp_path, plant):
    """A note of the twenty-sixth audit: up ran its five steps and wrote plan.json, and only its start then
    refused the `.lock` that was a link, a pipe or a folder. up checks start's lock file when it takes its own."""
    run_dir = tmp_path / "up"
    run_dir.mkdir()
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    {"link": lambda p: p.symlink_to(target), "fifo": os.mkfifo, "folder": lambda p: p.mkdir()}[plant](run_dir / ".lock")
    r = script("launch.py", "up", "--yes", "--state-dir", str(run_dir))
    assert r.code == 1 and ".lock" in r.doc["error"] and r.doc["phase"] == "up", r.doc
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", ".up.lock"] and target.read_text() == "keep"


def test_a_state_with_a_number_json_does_not_have_is_refused_as_edited(script, inputs, live_tune, tmp_path):  # noqa: F811
    """Twenty-seventh audit, F1: Python's reader took NaN in state.json; stop killed the server, then printed
    "a result held NaN" and exited 1. A state start never wrote is refused before anything acts on it."""
    import serve_life
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    serve_life.start(plan, confirm=True)
    try:
        text = Path(plan["state_file"]).read_text()
        for bad in ("NaN", "Infinity", "1e400"):
            Path(plan["state_file"]).write_text(text.replace("{", f'{{"junk": {bad}, ', 1))
            r = script("launch.py", "stop", "--plan", str(plan_file))
            assert r.code == 1 and "holds a number JSON does not have" in r.doc["error"], r.doc
            assert serve_life.process_alive(json.loads(text))
        Path(plan["state_file"]).write_text(text)
    finally:
        serve_life.stop(plan)


def test_sudo_docker_calls_never_follow_a_docker_host_sudo_keeps():
    """Twenty-seventh audit, note: a sudoers `env_keep += DOCKER_HOST` let `sudo -n docker` reach the daemon
    the shell named; a plan for sudo docker names no engine (sudo resets the environment otherwise)."""
    import common
    pinned = common.run_env(["sudo", "-n", "docker", "run", "x"], {"DOCKER_HOST": "tcp://10.9.9.9:2375", "K": "1"})
    assert pinned == {"K": "1", "DOCKER_CONTEXT": "default"}
    assert common.run_env(["sudo", "-n", "true"], {"DOCKER_HOST": "x"}) == {"DOCKER_HOST": "x"}


def test_a_start_whose_run_meets_another_plans_container_leaves_it_running(script, inputs, rt, tmp_path):  # noqa: F811
    """Twenty-eighth audit, F1: another plan's start on this port (its own state dir) made its container while
    ours pulled; our `run` failed on the name, and its clean-up removed that container by name, ending a
    verified server. A `run` refused on the name created nothing of ours: nothing is removed."""
    from test_launch import calls
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    (d / "pull_creates").write_text(plan["container_name"])
    before = len(calls(d))
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env)
    assert r.code == 1 and "another container took the name" in r.doc["error"], r.doc
    assert r.doc["phase"] == "start" and "another port" in r.doc["fix"]
    made = [c["argv"][0] for c in calls(d)[before:]]
    assert made[-2:] == ["pull", "run"] and "rm" not in made[made.index("pull"):], made  # theirs is left alone
    assert (d / f"created-{plan['container_name']}").read_text() == "a" * 64
    assert not (d / f"removed-{plan['container_name']}").exists() and not (tmp_path / "st" / "state.json").exists()


@pytest.mark.parametrize("verb", ["start", "stop"])
def test_a_runtime_that_does_not_say_which_container_has_the_name_is_not_acted_on(verb, script, inputs, rt,  # noqa: F811
                                                                                   tmp_path):
    """Twenty-eighth audit, F2: an `inspect` that failed once (a slow daemon) read as "no container", and stop
    (with no state) or start then stopped or removed by name whatever held it: another plan's server."""
    from test_launch import calls
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    (d / f"created-{plan['container_name']}").write_text("a" * 64)  # another state dir's, running
    (d / "inspect_fails").touch()
    before = len(calls(d))
    args = ["--confirm"] if verb == "start" else []
    r = script("launch.py", verb, "--plan", str(plan_file), *args, env=env)
    assert r.code == 1 and "did not say whether a container named" in r.doc["error"], r.doc
    assert r.doc["phase"] == verb and f"run {verb} again" in r.doc["fix"]
    assert [c["argv"][0] for c in calls(d)[before:]] == ["inspect"]  # nothing stopped, removed or run


def test_bench_writes_only_into_a_new_or_empty_out_folder(script, inputs, rt, tmp_path):  # noqa: F811
    """Twenty-eighth audit, F4: `--out` took any folder, and what was planted in it took bench's writes
    elsewhere: a link named plot.png (matplotlib's savefig follows it), raw/NAME.json (vllm bench serve
    writes it), skill/ under --compare; `--out /` filled the root with results. A non-empty --out is
    refused before anything runs, and the plot is written as bench's other files are, never via a link."""
    import bench
    from common import ScriptError
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    (out / "plot.png").symlink_to(victim)
    for args in ([], ["--compare"]):
        r = script("bench.py", "--plan", str(plan_file), "--out", str(out), *args, env=rt[1], timeout=120)
        assert r.code == 1 and "is not empty (it holds 'plot.png')" in r.doc["error"], r.doc
        assert "a new or empty folder" in r.doc["fix"] and victim.read_text() == "keep"
    with pytest.raises(ScriptError, match="symbolic link"):
        bench.plot([{"input_len": 16, "concurrency": 1, "output_throughput": 5.0, "median_tpot_ms": 9.0}],
                   out / "plot.png")
    assert victim.read_text() == "keep"
    (out / "plot.png").unlink()
    written = bench.plot([{"input_len": 16, "concurrency": 1, "output_throughput": 5.0, "median_tpot_ms": 9.0}],
                         out / "plot.png")
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and written == str(out / "plot.png")


@pytest.mark.parametrize("field,value", [("kv_bytes_per_sequence", 2 ** 70), ("kv_bytes_per_token", 2 ** 50),
                                         ("weight_bytes", 0), ("weight_bytes", 2 ** 70),
                                         ("fit/max_model_len", 7)])  # the twenty-ninth's F5: below the flags' 16
def test_an_estimate_of_no_or_impossible_bytes_is_refused(field, value, script, inputs, rt, tmp_path):  # noqa: F811
    """A note of the twenty-eighth audit: an edited estimate of 2**70 KV bytes per sequence planned a cache that
    "holds 0 tokens", and 0 or 2**70 weight bytes passed. estimate_memory.py writes none of these (weights
    are at least vocab x hidden, at most 1 PiB). 0 KV bytes stays valid: a model of attention-free layers."""
    from test_launch import plan_args
    doc = json.loads(Path(inputs["estimate"]).read_text())
    *parents, key = field.split("/")
    at = doc
    for part in parents:
        at = at[part]
    at[key] = value
    edited = tmp_path / "estimate-edited.json"
    edited.write_text(json.dumps(doc))
    r = script("launch.py", *plan_args({**inputs, "estimate": edited}, "--state-dir", str(tmp_path / "st")), env=rt[1])
    assert r.code == 1 and "is not estimate_memory.py's output" in r.doc["error"] and field in r.doc["error"], r.doc


def test_a_state_file_start_did_not_write_names_no_server(script, inputs, rt, tmp_path):  # noqa: F811
    """A note of the twenty-eighth audit (and the twenty-ninth's F1): state.json replaced by `{}`, or by a
    container's name without the id every start records, was taken as a
    state: verify wrote its pass into it, handoff handed the server off, and stop acted on the container
    by name as if this state dir had started it. It names no server now: the container is not recorded."""
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    state_file = tmp_path / "st" / "state.json"
    name = plan["container_name"]  # and (the twenty-ninth's F1) a container state of a name and no id of a start
    for edited in ({}, {"primary_endpoint": "chat_completions", "verified_at": time.time()}, {"path": "container"},
                   {"path": "container", "container_name": name, "verified_at": time.time()},
                   *({"path": "container", "container_name": name, "container_id": bad} for bad in ("", "zzzz", 12345))):
        state_file.write_text(json.dumps(edited))
        v = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "5", env=env)
        assert v.code == 1 and "nothing was started from this plan" in v.doc["error"], (edited, v.doc)
        h = script("launch.py", "handoff", "--plan", str(plan_file), env=env)
        assert h.code == 1 and "base_url" not in h.doc, (edited, h.doc)
        s = script("launch.py", "stop", "--plan", str(plan_file), env=env)
        assert s.code == 1 and "has no record of" in s.doc["error"], (edited, s.doc)
        assert json.loads(state_file.read_text()) == edited


def test_a_first_start_cannot_slip_in_while_stop_runs(inputs, live_tune, tmp_path, monkeypatch):  # noqa: F811
    """A note of the twenty-eighth audit: stop took no lock in a state dir without `.lock` (no start had
    run there yet), so a first start during it was recorded and then had its state removed by stop. stop
    makes the lock file now and holds it: the start is refused until stop is done."""
    import serve_life
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    Path(plan["state_dir"]).mkdir(parents=True, exist_ok=True)
    assert not (Path(plan["state_dir"]) / ".lock").exists()
    seen = {}
    real = serve_life._stop_locked

    def stop_with_a_start_arriving(p):
        seen["start"] = run_script("launch.py", "start", "--plan", str(plan_file), "--confirm", timeout=120)
        return real(p)
    monkeypatch.setattr(serve_life, "_stop_locked", stop_with_a_start_arriving)
    assert serve_life.stop(plan)["stopped"] is False
    start = seen["start"]
    assert start.code == 1 and "another start, or a stop" in start.doc["error"], start.doc
    assert not Path(plan["state_file"]).exists()


def test_up_reports_verifys_failure_when_its_own_stop_is_refused(script, inputs, rt, tmp_path, monkeypatch):  # noqa: F811
    """Twenty-ninth audit, F2: up stops what it started when verify fails; once stop could refuse (a runtime
    that does not say which container has the name), its refusal replaced verify's verdict, with no plan
    file and nothing saying the server may still run. Verify's failure stays the error now, with the
    refusal beside it and the command that stops the server."""
    import launch
    from common import ScriptError
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    (d / "inspect_fails").touch()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ScriptError) as err:
        launch.verify_or_stop(plan, plan_file, 3, 3)
    failure = err.value
    assert failure.extra["phase"] in ("process", "health", "models", "smoke"), failure.as_json()
    assert failure.extra["plan_file"] == str(plan_file) and failure.extra["stopped"]["stopped"] is False
    assert "did not say whether a container named" in failure.extra["stopped"]["refused"]
    assert "up could NOT stop the server it had started" in failure.fix and f"--plan {plan_file}" in failure.fix
    assert (tmp_path / "st" / "state.json").exists()  # the running server stays named


def test_start_records_the_containers_id_even_when_run_does_not_print_it(script, inputs, rt, tmp_path):  # noqa: F811
    """A state names its container by id (the twenty-ninth's F1: by name alone it could be anyone's). A
    `run` that printed something else has the id asked of the runtime; none at all is a failed start."""
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    (d / "run_quiet").touch()
    (d / "next_id").write_text("b" * 64)
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env)
    assert r.code == 0 and r.doc["container_id"] == "b" * 64, r.doc
    assert script("launch.py", "stop", "--plan", str(plan_file), env=env).doc["stopped"] is True
    (d / "next_id").write_text("not-an-id")
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env)
    assert r.code == 1 and "printed no container id, and inspect named none" in r.doc["error"], r.doc
    assert (d / f"removed-{plan['container_name']}").exists() and not (tmp_path / "st" / "state.json").exists()


@pytest.mark.parametrize("edit", [{"chosen_socket": 7}, {"sockets/0/socket": -1}, {"sockets/0/physical_cores": -1},
                                  {"sockets/0/ram_gb": 2.0 ** 62}])
def test_a_tune_naming_a_socket_it_does_not_list_is_refused(edit, script, inputs, rt, tmp_path):  # noqa: F811
    """Twenty-ninth audit, F3: tune.json's chosen_socket edited to 7 planned with "socket 7" in the summary on a
    two-socket machine (the bind, cpuset and nodes were still socket 1's); a socket of -1, -1 cores or 2**62
    GB passed."""
    from test_launch import plan_args
    doc = json.loads(Path(inputs["tune"]).read_text())
    (field, value), = edit.items()
    *parents, key = field.split("/")
    at = doc
    for part in parents:
        at = at[int(part)] if part.isdigit() else at[part]
    at[key] = value
    edited = tmp_path / "tune-edited.json"
    edited.write_text(json.dumps(doc))
    r = script("launch.py", *plan_args({**inputs, "tune": edited}, "--state-dir", str(tmp_path / "st")), env=rt[1])
    assert r.code == 1, r.doc
    assert ("do not list" in r.doc["error"]) if field == "chosen_socket" else ("cpu_tune.py's output" in r.doc["error"])


def test_a_runtime_that_does_not_answer_is_never_read_as_a_server_that_exited(script, inputs, rt, tmp_path):  # noqa: F811
    """The review of the twenty-eighth's fixes: an `inspect` that did not answer read as "not running": verify
    failed a healthy server as "exited" (and up then stopped it), handoff called it gone, and start or up
    could write over the state of a server that may run. Now verify asks again on its next poll, handoff
    refuses, and a state whose container cannot be asked about counts as running."""
    import serve_life
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    (d / "inspect_fails").touch()
    v = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "3", env=env)
    assert v.code == 1 and v.doc["phase"] != "process" and "exited" not in v.doc["error"], v.doc
    h = script("launch.py", "handoff", "--plan", str(plan_file), env=env)
    assert h.code == 1 and "did not say whether a container named" in h.doc["error"], h.doc
    again = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env)
    assert again.code == 1 and "did not say whether it runs, so it may" in again.doc["error"], again.doc
    assert serve_life.read_state(plan)["container_id"] == "f" * 64  # the state is kept
    (d / "inspect_fails").unlink()
    assert script("launch.py", "stop", "--plan", str(plan_file), env=env).doc["stopped"] is True


def test_a_refused_run_leaves_a_running_container_of_its_name_alone(script, inputs, rt, tmp_path):  # noqa: F811
    """The review of the twenty-eighth's fixes: docker checks a run's cpusets and mounts before it takes the
    name, so a run refused so (not on the name) created nothing, and the running container of its name,
    made by another plan's start during our pull, was removed by the clean-up. It is left alone."""
    from test_launch import calls
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    (d / "pull_creates").write_text(plan["container_name"])
    (d / "cpuset_rejected").touch()
    before = len(calls(d))
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env)
    assert r.code == 1 and "cgroup controller `cpuset`" in r.doc["error"], r.doc
    assert "is not this start's: left alone" in r.doc["error"]
    made = [c["argv"][0] for c in calls(d)[before:]]
    assert "rm" not in made[made.index("run"):] and not (d / f"removed-{plan['container_name']}").exists(), made


def test_kernel_proof_reads_only_the_log_of_the_container_its_plan_started(script, inputs, rt, tmp_path):  # noqa: F811
    """The review of the twenty-eighth's fixes: kernel_proof read `docker logs NAME` whoever's container had
    the name (one per port): another plan's run proved zentorch for this one."""
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    (d / f"created-{plan['container_name']}").write_text("a" * 64)  # another state dir's, on this port
    (d / "logs_lines").write_text("10000")
    r = script("kernel_proof.py", "--plan", str(plan_file), env=env)
    assert r.code == 1 and "is not the one this plan's start recorded" in r.doc["error"], r.doc
    (d / f"created-{plan['container_name']}").unlink()
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    r = script("kernel_proof.py", "--plan", str(plan_file), env=env)
    assert r.code == 0 and r.doc["zentorch_matmuls"] == 10000, r.doc
