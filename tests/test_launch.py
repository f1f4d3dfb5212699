"""launch.py: the rendered command, the container path's argv and failure modes against the FAKE runtime
(the real engine runs in test_e2e_container.py; the fake is for what it cannot show here: rootless podman,
a daemon that is down, sudo docker), and start/verify/stop on real processes with a misbehaving HTTP server."""
import json
import re
import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

import serve_life
import serve_plan
from common import ScriptError, load_epyc
from conftest import ROOT, run_script, sysroots
from model_fixtures import model_folder

FAKE_BIN = ROOT / "tests" / "fakes" / "bin"
NO_FACTS = {"hf_token_set": False, "hf_offline": False, "api_key_set": False, "model_dir": None}


def facts_for(docs: dict, **more) -> dict:
    """NO_FACTS, with the HF cache the documents name as it is on this disk (a container plan checks it) and
    the model folder check_model read (plan serves only that one)."""
    import validate
    return {**NO_FACTS, "hf_cache": validate.cache_listing(docs["validate"]["hf_cache"]["path"]),
            "model_dir": docs["check_model"].get("model_dir"), **more}
FAKE_SERVER = ROOT / "tests" / "fakes" / "openai_server.py"
SECRET = "hf_plan_secret_5678"
PINNED = "amdih/zendnn_zentorch:vllm_v0.25.1_zentorch_v2.11.0.3_ubuntu22.04_2026_ww30"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def rt(tmp_path):
    d = tmp_path / "rt"
    d.mkdir()
    return d, {"FAKE_RT_DIR": str(d), "PATH": f"{FAKE_BIN}:{os.environ['PATH']}"}


@pytest.fixture
def inputs(tmp_path, rt):
    """The five JSON inputs, each produced by the real script (validate sees the FAKE docker)."""
    d, env = rt
    model = model_folder("Qwen3-0.6B", tmp_path / "models")
    genoa = sysroots.build(tmp_path / "genoa", sysroots.HOSTS["genoa_9654_2s_smt"])
    out = {}
    for name, script, args in [
        ("detect", "detect.py", ["--sysroot", str(genoa)]),
        ("validate", "validate.py", ["--python", sys.executable, "--detect", str(tmp_path / "detect.json")]),
        ("check", "check_model.py", ["--model", str(model), "--vllm-version", "0.25.1"]),
        ("estimate", "estimate_memory.py", ["--model", str(model), "--ram-gb", "384"]),
        ("tune", "cpu_tune.py", ["--sysroot", str(genoa), "--socket", "1", "--weight-gb", "1.11",
                                 "--kv-needed-gb", "0.44"]),
    ]:
        r = run_script(script, *args, env=env)
        assert r.code == 0, r.doc
        path = tmp_path / f"{name}.json"
        path.write_text(r.stdout)
        out[name] = path
    out["model"] = model
    return out


SCRIPT_OF = {"detect": "detect", "validate": "validate", "check": "check_model", "estimate": "estimate_memory",
             "tune": "cpu_tune"}


def load_docs(inputs) -> dict:
    """The five documents keyed as a plan keeps them: by the script that wrote each."""
    return {SCRIPT_OF[k]: json.loads(Path(inputs[k]).read_text()) for k in SCRIPT_OF}


def plan_args(inputs, *extra):
    return ["plan", *[f"--{k}={inputs[k]}" for k in ("detect", "validate", "check", "estimate", "tune")], *extra]


def test_container_plan_renders_the_exact_command(script, inputs, rt, tmp_path):
    d, env = rt
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st")), env={**env, "HF_TOKEN": SECRET})
    p = r.doc
    assert r.code == 0 and p["path"] == "container" and p["runtime"] == "docker"
    hf = json.loads(Path(inputs["validate"]).read_text())["hf_cache"]["path"]
    real = os.path.realpath(inputs["model"])
    assert p["argv"] == [
        "docker", "run", "-d", "--name", f"vllm-epyc-{p['port']}", "--ipc=host", "--network=host", "--cap-add=SYS_NICE",
        "--cpuset-cpus=96-191,288-383", "--cpuset-mems=1", "-v", f"{hf}:/root/.cache/huggingface/hub",
        "-v", f"{real}:/models/Qwen3-0.6B:ro", "-v", f"{tmp_path / 'st' / 'secrets'}:{serve_plan.SECRETS_TARGET}:ro",
        "--env", "VLLM_CPU_OMP_THREADS_BIND=96-191", "--env", "VLLM_CPU_KVCACHE_SPACE=190",
        "--entrypoint", "sh", PINNED, "-c", serve_plan.SECRET_LOADER, "vllm", "/models/Qwen3-0.6B",
        "--served-model-name", "Qwen3-0.6B", "--host", "127.0.0.1",
        "--port", str(p["port"]), "--dtype", "bfloat16", "--max-model-len", "4096", "--max-num-seqs", "256",
            "--max-num-batched-tokens", "2048"]
    # sized for serving, not one prompt: a 384 GiB socket's KV holds hundreds of full-length 4k requests
    assert p["sizing"]["kv_tokens"] == 190 * 2**30 // 114688 and p["sizing"]["kv_full_length_requests"] >= 64
    assert "| KV cache | holds 1,778,834 tokens = 434 requests of 4096 tokens at once; --max-num-seqs 256, --max-num-batched-tokens 2048 |" \
        in p["summary_markdown"]
    assert p["secrets"] == {"HF_TOKEN": "HF_TOKEN"} and p["env_by_name"] == ["HF_TOKEN"]
    assert p["pre_argv"] == [["docker", "rm", "-f", f"vllm-epyc-{p['port']}"], ["docker", "pull", PINNED]]
    assert not any(a.startswith("--shm-size") or a == "--device" for a in p["argv"])
    assert SECRET not in r.stdout  # by name only
    assert "| CPU sizing | socket 1 (forced by --socket), bind 96-191" in p["summary_markdown"]
    assert "EPYC Genoa (Zen4), 192 cores" in p["summary_markdown"]


def test_plan_options_and_rules(script, inputs, rt, monkeypatch):
    d, env = rt
    thr = script("launch.py", *plan_args(inputs, "--throughput-flags"), env=env).doc
    assert {"TORCHINDUCTOR_FREEZING": "1", "VLLM_USE_AOT_COMPILE": "0", "ZENTORCH_WEIGHT_PREPACK": "1"}.items() <= \
        thr["env"].items()
    assert "HF_TOKEN" not in thr["env_by_name"] or os.environ.get("HF_TOKEN")
    r = script("launch.py", *plan_args(inputs, "--expose"), env=env)
    assert r.code == 1 and "--api-key-env" in r.doc["fix"]
    r = script("launch.py", *plan_args(inputs, "--expose", "--api-key-env", "MY_KEY"), env=env)
    assert r.code == 1 and "not set" in r.doc["error"]
    r = script("launch.py", *plan_args(inputs, "--expose", "--api-key-env", "MY_KEY"),
               env={**env, "MY_KEY": "sk-very-secret"})
    assert r.code == 0 and r.doc["host"] == "0.0.0.0" and "VLLM_API_KEY" in r.doc["env_by_name"]
    assert "sk-very-secret" not in r.stdout
    r = script("launch.py", *plan_args(inputs, "--dtype", "float16"), env=env)
    assert r.code == 1 and "float16" in r.doc["error"]


def test_needs_device_flag_only_before_020():
    assert serve_plan.needs_device_flag("0.19.1") and not serve_plan.needs_device_flag("0.20.0")
    assert not serve_plan.needs_device_flag("0.32.0+cpu") and not serve_plan.needs_device_flag(None)


def test_container_command_sets_the_vllm_entrypoint_whatever_the_image_declares():
    """The stock image's entrypoint is `vllm serve`, the zentorch image has none: --entrypoint vllm +
    `serve ...` runs the same command in both."""
    plan = serve_plan.container_run_argv(["podman"], "vllm-epyc", ["--ipc=host"], [], "-v /h:/root/.cache/huggingface",
                                     [], {"A": "1"}, [], "vllm/vllm-openai-cpu:latest-x86_64", ["m", "--port", "1"])
    assert plan[-7:] == ["--entrypoint", "vllm", "vllm/vllm-openai-cpu:latest-x86_64", "serve", "m", "--port", "1"]
    with pytest.raises(Exception):
        serve_plan.container_run_argv(["docker"], "n", ["--ipc=host", "--shm-size=16g"], [], "", [], {}, [], "i", [])


@pytest.mark.parametrize("mutate,needle", [
    (lambda i: i["validate"].update(ready=False, errors=[{"message": "no runtime", "fix": "get one"}]), "not ready"),
    (lambda i: i["check_model"].update(launchable=False, message="BertModel is pooling"), "pooling"),
    (lambda i: i["estimate_memory"]["fit"].update(fits=False, action="lower --max-model-len to 1024"), "does not fit"),
])
def test_plan_refuses_inconsistent_inputs(inputs, mutate, needle):
    docs = load_docs(inputs)
    mutate(docs)
    with pytest.raises(ScriptError) as e:
        serve_plan.build_plan(docs, {}, load_epyc(), facts_for(docs))
    assert needle in e.value.error
    with pytest.raises(ScriptError) as e:
        serve_plan.build_plan(load_docs(inputs),
                              {"model": "other/model"}, load_epyc(), facts_for(docs))
    assert "check_model.py ran for" in e.value.error


def test_plan_bad_files(script, inputs, tmp_path, rt):
    d, env = rt
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    args = plan_args(inputs)
    r = script("launch.py", *[a if not a.startswith("--tune=") else f"--tune={bad}" for a in args], env=env)
    assert r.code == 1 and "not JSON" in r.doc["error"]
    r = script("launch.py", *[a if not a.startswith("--tune=") else "--tune=/nope.json" for a in args], env=env)
    assert r.code == 1 and "cannot read" in r.doc["error"]
    r = script("launch.py", "plan", "--detect", "-", "--validate", "-", "--check", "x", "--estimate", "x",
               "--tune", "x", env=env)
    assert r.code == 1 and "stdin" in r.doc["error"]
    r = script("launch.py", "start", "--plan", str(bad), env=env)
    assert r.code == 1
    r = script("launch.py", "launch", env=env)
    assert r.code == 1 and "bad arguments" in r.doc["error"]


# ---- container path against the FAKE runtime


def container_plan(script, inputs, rt, tmp_path, **env_extra):
    d, env = rt
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st")), env={**env, **env_extra})
    path = tmp_path / "plan.json"
    path.write_text(r.stdout)
    return path, r.doc


def calls(d):
    return [json.loads(line) for line in (d / "calls.jsonl").read_text().splitlines()]


def test_container_start_pulls_runs_with_secret_by_name(script, inputs, rt, tmp_path):
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path, HF_TOKEN=SECRET)
    before = len(calls(d))
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env={**env, "HF_TOKEN": SECRET})
    name = f"vllm-epyc-{plan['port']}"
    assert r.code == 0 and r.doc["started"] and r.doc["container_name"] == name
    made = calls(d)[before:]
    # a container of that name is asked about first (none here, so nothing is removed; another plan's is never
    # removed), then the approved commands: pulled, as the image was not local
    assert [c["argv"][0] for c in made] == ["inspect", "image", "pull", "run"]
    assert ["docker", *made[3]["argv"]] == plan["argv"]
    assert SECRET not in json.dumps(made) and SECRET not in r.stdout + r.stderr
    secret_file = tmp_path / "st" / "secrets" / "HF_TOKEN"  # what the container mounts read-only
    assert secret_file.read_text() == SECRET and oct(secret_file.stat().st_mode & 0o777) == "0o600"
    stop = script("launch.py", "stop", "--plan", str(plan_file), env=env)
    assert stop.doc["stopped"] and [c["argv"] for c in calls(d)[-2:]] == [["stop", "-t", "30", "f" * 64],
                                                                           ["rm", "-f", "f" * 64]]  # by its id
    assert not secret_file.exists()


def test_start_refuses_a_planned_secret_that_is_not_set(script, inputs, rt, tmp_path):
    """An API-key server planned in one shell and started in another where the key is unset would
    enforce nothing: start refuses, and nothing runs."""
    d, env = rt
    r = script("launch.py", *plan_args(inputs, "--api-key-env", "MY_KEY", "--state-dir", str(tmp_path / "k")),
               env={**env, "MY_KEY": "sk-set-at-plan-time"})
    keyed = tmp_path / "keyed.json"
    keyed.write_text(r.stdout)
    before = len(calls(d))
    s = script("launch.py", "start", "--plan", str(keyed), "--confirm", env=env)
    assert s.code == 1 and s.doc["phase"] == "start" and "MY_KEY" in s.doc["error"]
    assert not any(c["argv"][0] == "run" for c in calls(d)[before:])


def test_rootless_podman_cpuset_rejection_drops_the_flags(script, inputs, rt, tmp_path):
    d, env = rt
    (d / "daemon_down").touch()
    (d / "podman_can_run").touch()
    (d / "cpuset_rejected").touch()
    val = run_script("validate.py", "--python", sys.executable, "--detect", str(inputs["detect"]), env=env)
    assert val.doc["runtime"] == "podman"
    Path(inputs["validate"]).write_text(val.stdout)
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    assert plan["argv"][0] == "podman" and "--cpuset-mems=1" in plan["argv"]
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env)
    assert r.code == 0 and "cpuset" in r.doc["warnings"][0]
    runs = [c["argv"] for c in calls(d) if c["argv"][0] == "run" and "--rootfs" not in c["argv"]]
    assert any(a.startswith("--cpuset") for a in runs[0]) and not any(a.startswith("--cpuset") for a in runs[-1])
    assert "VLLM_CPU_OMP_THREADS_BIND=96-191" in runs[-1]  # thread binding still applies
    # podman made the refused run's container (exited): it is removed by its id before the retry takes the name
    removals = [c["argv"] for c in calls(d) if c["argv"][0] == "rm"]
    assert removals == [["rm", "-f", "e" * 64]] and r.doc["container_id"] == "f" * 64, removals


def test_pull_failure_is_named(script, inputs, rt, tmp_path):
    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    (d / "pull_fails").touch()
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env)
    assert r.code == 1 and r.doc["phase"] == "pull"


def test_container_that_exited_fails_verify_in_process_phase_with_logs(script, inputs, rt, tmp_path):
    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    (d / "exited").touch()
    r = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "5", env=env)
    assert r.code == 1 and r.doc["phase"] == "process" and "ERROR fake engine failure" in r.doc["log_tail"]


def test_start_needs_confirmation(script, inputs, rt, tmp_path):
    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    r = script("launch.py", "start", "--plan", str(plan_file), env=env)
    assert r.code == 1 and "--confirm" in r.doc["error"]
    assert not any(c["argv"][0] in ("pull", "run") for c in calls(d) if "--rootfs" not in c["argv"])


# ---- host path: real processes, a misbehaving HTTP server


@pytest.fixture(scope="module")
def live_tune():
    """cpu_tune for this machine: the host-path tests really start the planned argv, pin prefix included."""
    r = run_script("cpu_tune.py", "--weight-gb", "1.11", "--kv-needed-gb", "0.44")
    assert r.code == 0, r.doc
    return {**r.doc, "detect": run_script("detect.py").doc}


def fake_venv(tmp_path) -> Path:
    """A venv whose `bin/vllm` is the misbehaving server: start runs the plan's real argv, unedited."""
    bin_dir = tmp_path / "fake-venv" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "python").unlink(missing_ok=True)
    (bin_dir / "python").symlink_to(sys.executable)
    vllm = bin_dir / "vllm"
    # the mode is a file beside it: start gives the server only the plan's env and a few shell variables
    vllm.write_text(f"#!{sys.executable}\nimport os, runpy, sys\nfrom pathlib import Path\n"
                    "mode = Path(__file__).with_name('mode')\n"
                    "if mode.exists():\n    os.environ['FAKE_SERVER_MODE'] = mode.read_text().strip()\n"
                    f"sys.argv[0] = {str(FAKE_SERVER)!r}\nrunpy.run_path({str(FAKE_SERVER)!r}, run_name='__main__')\n")
    vllm.chmod(0o755)
    return bin_dir / "python"


def server_mode(tmp_path, mode: str) -> None:
    """How the fake server (tests/fakes/openai_server.py) misbehaves on its next start."""
    (tmp_path / "fake-venv" / "bin" / "mode").write_text(mode)


def host_docs(tmp_path, inputs, live_tune, edit=None) -> dict:
    """The five documents of a host-path serve on this machine, its server the fake venv's."""
    docs = load_docs(inputs)
    if edit:
        edit(docs)
    docs["validate"].update(path="host", runtime="host", image=None, python=str(fake_venv(tmp_path)), target="localhost",
                            ld_preload={"value": None, "note": None})
    docs["cpu_tune"] = {k: v for k, v in live_tune.items() if k != "detect"}
    docs["detect"] = live_tune["detect"]  # one host: the five documents must agree (plan cross-checks)
    if docs["detect"].get("vendor") != "AuthenticAMD":
        # vLLM runs zentorch only on AMD CPUs, so on an Intel runner this host is served as `up --stock` does
        docs["validate"]["backend"] = "stock"
    return docs


def host_plan(tmp_path, inputs, live_tune, port=None, edit=None, **opts):
    docs = host_docs(tmp_path, inputs, live_tune, edit)
    opt = {"port": port or free_port(), "state_dir": str(tmp_path / "st-host"), **opts}
    plan = serve_plan.build_plan(docs, opt, load_epyc(), serve_life.host_facts(opt, docs))
    path = tmp_path / "plan-host.json"
    path.write_text(json.dumps(plan))
    return path, plan


@pytest.mark.parametrize("mode,phase,needle", [
    ("exit_early", "process", "exited before"),
    ("never_healthy", "health", "not healthy after 4s"),
    ("wrong_model", "models", "does not list"),
    ("error_payload", "smoke", "HTTP 200 carrying an error"),
    ("empty_choices", "smoke", "no choices"),
    ("die_on_request", "smoke", "ConnectionError"),
    ("die_after_answer", "smoke", "died after its first request"),
])
def test_verify_catches_each_failure(script, tmp_path, inputs, live_tune, mode, phase, needle):
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    server_mode(tmp_path, mode)
    started = script("launch.py", "start", "--plan", str(plan_file), "--confirm")
    assert started.code == 0, started.doc
    try:
        r = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "4")
        assert r.code == 1 and r.doc["phase"] == phase and needle in r.doc["error"], r.doc
        assert r.doc["fix"].startswith("report") and any("fake server: mode=" in ln for ln in r.doc["log_tail"])
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))


def test_good_server_verifies_hands_off_and_stops_only_its_own_processes(script, tmp_path, inputs, live_tune):
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    try:
        s = script("launch.py", "start", "--plan", str(plan_file), "--confirm")
        assert s.code == 0
        again = script("launch.py", "start", "--plan", str(plan_file), "--confirm")
        assert again.code == 1 and "already running" in again.doc["error"]
        r = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "20")
        assert r.code == 0 and r.doc["ok"] and r.doc["smoke"]["endpoint_path"] == "/v1/chat/completions"
        bind = live_tune["vllm_cpu_omp_threads_bind"]
        assert f"VLLM_CPU_OMP_THREADS_BIND={bind}" in Path(plan["log_file"]).read_text()  # the sizing env arrived
        # counted from the launch (the fake answers /health 1 s after its own start), whenever verify began
        assert r.doc["smoke"]["output"] == "hello there" and r.doc["time_to_healthy_s"] >= 1
        h = script("launch.py", "handoff", "--plan", str(plan_file)).doc
        assert h["base_url"].endswith("/v1") and "chat.completions.create" in h["python_example"]
        assert "| Base URL |" in h["table_markdown"]
        # the handoff's curl example really works against the server
        curl = subprocess.run(["bash", "-c", h["curl_example"]], capture_output=True, text=True, timeout=30)
        assert json.loads(curl.stdout)["choices"][0]["message"]["content"] == "hello there"
    finally:
        st = script("launch.py", "stop", "--plan", str(plan_file))
    assert st.doc["stopped"] and not psutil.pid_exists(s.doc["pid"]) or \
        psutil.Process(s.doc["pid"]).status() == psutil.STATUS_ZOMBIE
    assert decoy.poll() is None  # not ours: untouched
    decoy.kill()
    with socket.socket() as c:
        assert c.connect_ex(("127.0.0.1", plan["port"])) != 0  # nothing listens any more


def test_port_taken_before_start(script, tmp_path, inputs, live_tune):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        plan_file, _ = host_plan(tmp_path, inputs, live_tune, port=s.getsockname()[1])
        r = script("launch.py", "start", "--plan", str(plan_file), "--confirm")
        assert r.code == 1 and "in use" in r.doc["error"]


def test_exposed_server_is_verified_with_the_key_by_name(script, tmp_path, inputs, live_tune, monkeypatch):
    monkeypatch.setenv("MY_API_KEY", "sk-test-key-42")
    plan_file, plan = host_plan(tmp_path, inputs, live_tune, expose=True, api_key_env="MY_API_KEY")
    assert plan["host"] == "0.0.0.0" and "sk-test-key-42" not in plan_file.read_text()
    try:
        assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
        r = script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "20")
        assert r.code == 0, r.doc
        assert "api_key_set=True" in Path(plan["log_file"]).read_text()
        h = script("launch.py", "handoff", "--plan", str(plan_file)).doc
        assert '"Authorization: Bearer ${MY_API_KEY}"' in h["curl_example"] and "sk-test-key-42" not in json.dumps(h)
        # the example runs as pasted: the key comes from the variable, and the server accepts it
        curl = subprocess.run(["bash", "-c", h["curl_example"]], capture_output=True, text=True, timeout=30)
        assert json.loads(curl.stdout)["choices"][0]["message"]["content"] == "hello there"
        # and the server really refuses a request without it (verify checked that too)
        assert '"Unauthorized"' in subprocess.run(["curl", "-s", plan["base_url"] + "/models"], capture_output=True,
                                                  text=True, timeout=30).stdout
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))


def verify_keyed_server(script, tmp_path, inputs, live_tune, monkeypatch, mode: str, key: str):
    """Start a plan with an API key (from MY_API_KEY) on the fake server in `mode`, verify it, stop it:
    -> (the plan, verify's result)."""
    monkeypatch.setenv("MY_API_KEY", key)
    plan_file, plan = host_plan(tmp_path, inputs, live_tune, expose=True, api_key_env="MY_API_KEY")
    try:
        server_mode(tmp_path, mode)
        assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
        return plan, script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "20")
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))


def test_a_server_that_reflects_the_key_in_its_model_list_never_gets_it_printed(script, tmp_path, inputs, live_tune,
                                                                                 monkeypatch):
    _, r = verify_keyed_server(script, tmp_path, inputs, live_tune, monkeypatch, "models_reflect", "sk-reflected-77")
    assert r.code == 1 and r.doc["phase"] == "models" and "Bearer ***" in r.doc["error"], r.doc
    assert "sk-reflected-77" not in r.stdout + r.stderr


@pytest.mark.parametrize("mode,settled", [("good", "/v1/chat/completions"),
                                          ("no_chat_template", "/v1/completions")])
def test_an_unknown_endpoint_is_settled_by_verify_on_the_running_server(script, tmp_path, inputs, live_tune,
                                                                       mode, settled):
    """The chat template could not be read: the plan says so instead of guessing, handoff waits for verify,
    and verify tries chat, then completions, and hands off the one that answered."""
    def unreadable_template(docs):  # what check_model.py says when it cannot read the template
        docs["check_model"].update(primary_endpoint="unknown", supported_endpoints=[],
                                   chat_template={"status": "unknown", "source": None, "selected_name": None,
                                                  "names": []})
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


def test_completions_handoff_for_a_base_model(inputs, tmp_path):
    docs = load_docs(inputs)
    docs["check_model"].update(primary_endpoint="completions", supported_endpoints=["completions"])
    plan = serve_plan.build_plan(docs, {}, load_epyc(), facts_for(docs))
    h = serve_plan.handoff_doc(plan)
    assert h["endpoint_path"] == "/v1/completions" and "client.completions.create" in h["python_example"]
    assert '"prompt": "Hello, world"' in h["curl_example"]


def test_judge_smoke():
    ok = json.dumps({"choices": [{"message": {"content": "x"}}], "usage": {"completion_tokens": 1}})
    assert serve_plan.judge_smoke(200, ok, "chat_completions") == (True, "x")
    assert not serve_plan.judge_smoke(200, ok, "completions")[0]  # no choices[0].text
    assert not serve_plan.judge_smoke(500, ok, "chat_completions")[0]
    assert not serve_plan.judge_smoke(200, "<html>", "chat_completions")[0]


def test_sudo_docker_plan_is_non_interactive(inputs):
    docs = load_docs(inputs)
    docs["validate"]["runtime"] = "sudo docker"
    plan = serve_plan.build_plan(docs, {}, load_epyc(), facts_for(docs))
    assert plan["argv"][:4] == ["sudo", "-n", "docker", "run"]
    assert plan["pre_argv"][0][:3] == ["sudo", "-n", "docker"]


@pytest.mark.parametrize("edit,needle", [
    (lambda p: p["argv"].insert(3, "--privileged"), "argv"),
    (lambda p: p["env"].update(LD_PRELOAD="/tmp/evil.so"), "env"),
    (lambda p: p.update(image="docker.io/evil/image:1"), "image"),
    # a bind its cpuset holds: with numactl the pin prefix still fits and the rendered argv differs; without it
    # (taskset -c, exactly the bind) the pin prefix itself no longer fits the bind
    (lambda p: p["inputs"]["cpu_tune"].update(vllm_cpu_omp_threads_bind="96-100"), "argv|taskset prefix"),
])
def test_start_refuses_an_edited_plan(script, inputs, rt, tmp_path, edit, needle):
    """What the human approved is what runs: a plan whose command no longer matches its own inputs
    (edited by hand, or inputs edited to smuggle a value) is refused before anything runs."""
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    edit(plan)
    plan_file.write_text(json.dumps(plan))
    before = len(calls(d))
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env)
    assert r.code == 1 and r.doc["phase"] == "start"
    assert re.search(needle, r.doc["error"]) and ("differs" in r.doc["error"] or "taskset prefix" in r.doc["error"])
    assert not any(c["argv"][0] in ("run", "pull", "rm") for c in calls(d)[before:])


def test_a_plan_never_points_state_outside_its_state_dir(script, inputs, rt, tmp_path):
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    plan["state_file"] = str(victim)
    plan_file.write_text(json.dumps(plan))
    for verb in ("start", "stop"):
        r = script("launch.py", verb, "--plan", str(plan_file), *(["--confirm"] if verb == "start" else []), env=env)
        assert r.code == 1 and "state_dir" in r.doc["error"]
    assert victim.read_text() == "keep me"


def test_preload_names_only_the_pinned_libraries():
    libs = load_epyc()["host_stack"]["ld_preload_libs"]
    ok = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.9"
    assert serve_plan.preload_value(ok, libs) == ok
    for bad in ("/tmp/evil.so", "libtcmalloc_minimal.so.4", f"{ok}:/tmp/x.so"):
        with pytest.raises(ScriptError):
            serve_plan.preload_value(bad, libs)


@pytest.mark.parametrize("mutate,needle", [
    (lambda i: i["estimate_memory"].update(model="other/model"), "estimate_memory.py for other/model"),
    (lambda i: i["cpu_tune"].update(weight_gb=15.0), "cpu_tune.py sized for 15.0 GiB of weights, estimate_memory.py "
                                                      "says 1.11"),
    (lambda i: i["cpu_tune"].update(kv_needed_gb=9.0), "KV need"),
    (lambda i: (i["estimate_memory"]["fit"].update(kv_needed_gb=300.0), i["cpu_tune"].update(kv_needed_gb=300.0)),
     "below the 300.0 GiB needed"),
    (lambda i: i["cpu_tune"].update(target="root@other-box"), "cpu_tune.py sized root@other-box"),
])
def test_plan_refuses_documents_that_describe_different_serves(inputs, mutate, needle):
    docs = load_docs(inputs)
    docs["cpu_tune"]["target"] = docs["detect"]["target"]  # the fixture's tune and detect read the same sysroot
    serve_plan.build_plan(docs, {}, load_epyc(), facts_for(docs))  # consistent: fine
    mutate(docs)
    with pytest.raises(ScriptError) as e:
        serve_plan.build_plan(docs, {}, load_epyc(), facts_for(docs))
    assert "do not describe one serve" in e.value.error and needle in e.value.error


@pytest.mark.parametrize("sizing,bind,kv,seqs", [
    ("skill", "96-191", "190", True), ("vllm-default", None, None, False), ("all-cores", "96-191", None, False),
    ("unpinned", "nobind", "190", False), ("skill+throughput", "96-191", "190", True),
])
def test_sizing_baselines_for_the_comparison(inputs, sizing, bind, kv, seqs):
    """bench.py --compare serves the same model under each sizing: only the rules differ."""
    docs = load_docs(inputs)
    plan = serve_plan.build_plan(docs, {"sizing": sizing}, load_epyc(), facts_for(docs))
    assert plan["env"].get("VLLM_CPU_OMP_THREADS_BIND") == bind and plan["env"].get("VLLM_CPU_KVCACHE_SPACE") == kv
    assert ("--max-num-seqs" in plan["argv"]) == seqs and plan["sizing"]["sizing_rule"] == sizing
    assert any(a.startswith("--cpuset-cpus") for a in plan["argv"]) == (sizing in ("skill", "skill+throughput"))
    assert ("TORCHINDUCTOR_FREEZING" in plan["env"]) == (sizing == "skill+throughput")
    with pytest.raises(ScriptError):
        serve_plan.build_plan(docs, {"sizing": "magic"}, load_epyc(), facts_for(docs))


def test_a_plan_for_another_host_shows_its_assumptions_and_never_starts_here(script, tmp_path):
    """The 9654 request from the issue, with the skill's own commands only: spec -> validate (deferred)
    -> estimate from a config file -> cpu_tune on the rendered host -> plan. The plan shows the exact
    container command and what was assumed; start refuses to run it on this machine."""
    root = tmp_path / "s9654"
    det = run_script("detect.py", "--spec", "9654", "--sockets", "2", "--ram-gb-per-socket", "384",
                     "--save-sysroot", str(root))
    files = {"detect": tmp_path / "d.json"}
    files["detect"].write_text(det.stdout)
    val = run_script("validate.py", "--detect", str(files["detect"]))
    cfg = ROOT / "tests" / "fixtures" / "models" / "Qwen3-0.6B" / "config.json"
    est = run_script("estimate_memory.py", "--model", "Qwen/Qwen3-0.6B", "--config", str(cfg), "--weight-gb", "1.11",
                     "--ram-gb", "384", "--max-model-len", "4096", env={"HF_HUB_OFFLINE": "1"})
    chk = run_script("check_model.py", "--model", str(cfg.parent), "--vllm-version", "0.25.1")
    # the folder holds the same config as the Hub id: the document check_model gives for that id
    chk_doc = {**chk.doc, "model": "Qwen/Qwen3-0.6B", "source": "hub", "model_dir": None}
    tune = run_script("cpu_tune.py", "--sysroot", str(root), "--weight-gb", str(est.doc["weight_gb"]),
                      "--kv-needed-gb", str(est.doc["fit"]["kv_needed_gb"]))
    for name, r in (("validate", val), ("estimate", est), ("tune", tune)):
        assert r.code == 0, r.doc
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(r.stdout)
    files["check"] = tmp_path / "check.json"
    files["check"].write_text(json.dumps(chk_doc))
    plan = run_script("launch.py", "plan", *[f"--{k}={v}" for k, v in files.items()], "--state-dir", str(tmp_path / "st"))
    assert plan.code == 0, plan.doc
    p = plan.doc
    assert p["target"].startswith("spec:EPYC 9654") and "port" in p["deferred"]
    assert "--cpuset-cpus=0-95,192-287" in p["argv"] and "VLLM_CPU_OMP_THREADS_BIND=0-95" in p["argv"]
    assert p["sizing"]["kv_full_length_requests"] >= 64  # a 384 GiB socket serves many 4k requests at once
    assert "| Planned for | spec:EPYC 9654" in p["summary_markdown"]
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan.stdout)
    r = run_script("launch.py", "start", "--plan", str(plan_file), "--confirm")
    assert r.code == 1 and "not this machine" in r.doc["error"]


def test_throughput_flags_are_refused_on_the_stock_path(inputs):
    """Measured: on stock vLLM CPU the flags segfault the engine in onednn_mm at warm-up."""
    docs = load_docs(inputs)
    docs["validate"]["backend"] = "stock"
    for opt in ({"throughput_flags": True}, {"sizing": "skill+throughput"}):
        with pytest.raises(ScriptError, match="zentorch path only"):
            serve_plan.build_plan(docs, opt, load_epyc(), facts_for(docs))


def test_the_smoke_request_is_deterministic_and_short():
    """verify's one request: greedy (temperature 0), 16 tokens, on the endpoint the plan serves."""
    path, body = serve_plan.smoke_request("chat_completions", "m")
    assert path == "/v1/chat/completions" and body == {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                       "max_tokens": 16, "temperature": 0}
    path, body = serve_plan.smoke_request("completions", "m")
    assert path == "/v1/completions" and body["temperature"] == 0 and body["max_tokens"] == 16 and body["prompt"]


def test_kernel_log_turns_on_exactly_the_two_kernel_logs(inputs):
    """kernel_proof.py reads ZenDNN's API log and oneDNN's verbose lines: both, and only with --kernel-log."""
    docs = load_docs(inputs)
    with_log = serve_plan.build_plan(docs, {"kernel_log": True}, load_epyc(), facts_for(docs))["env"]
    without = serve_plan.build_plan(docs, {}, load_epyc(), facts_for(docs))["env"]
    assert {k: v for k, v in with_log.items() if k not in without} == {"ZENDNNL_API_LOG_LEVEL": "4", "ONEDNN_VERBOSE": "1"}



# ---- what the human reads: the confirmation summary and the handoff, whole (each row is a decision)

def test_the_confirmation_summary_names_every_decision_in_words(inputs):
    docs = load_docs(inputs)
    plan = serve_plan.build_plan(docs, {}, load_epyc(), facts_for(docs, hf_token_set=True))
    model, port = plan["model"], plan["port"]
    assert plan["summary"] == [
        ["Model / kind", f"{model} -- text, endpoint chat_completions"],
        ["Backend", "zentorch-accelerated (ZenCpuPlatform)"],
        ["Path", f"container (docker, {PINNED})"],
        ["Precision", "bfloat16"],
        ["Fit", "required 3.55 GiB vs 384.0 GiB RAM"],
        ["CPU sizing", "socket 1 (forced by --socket), bind 96-191, KV 190 GiB (socket-local), memory on nodes 1"],
        ["KV cache", "holds 1,778,834 tokens = 434 requests of 4096 tokens at once; --max-num-seqs 256, "
                     "--max-num-batched-tokens 2048"],
        ["Hardware", "EPYC Genoa (Zen4), 192 cores, AVX-512 yes"],
        ["Port", f"{port} on 127.0.0.1"],
        ["Pinning", "--cpuset-* flags in the command"],
        ["Environment", "VLLM_CPU_OMP_THREADS_BIND=96-191, VLLM_CPU_KVCACHE_SPACE=190, "
                        "HF_TOKEN (from $HF_TOKEN, value not shown)"],
        ["Command (exactly what start runs)", plan["command"]],
    ]
    import shlex
    assert shlex.split(plan["command"]) == plan["argv"]  # the command shown is the argv start runs
    assert plan["summary_markdown"].splitlines()[:3] == [
        "| Field | Value |", "|---|---|", f"| Model / kind | {model} -- text, endpoint chat_completions |"]


def test_the_summary_of_an_exposed_quantized_baseline_says_so(inputs, monkeypatch):
    """The rows that only some plans have: the exposed port, the quantized weights and their kernel, a
    comparison sizing, the warnings and the questions the human must answer."""
    monkeypatch.setenv("MY_KEY", "sk-summary-test")
    docs = load_docs(inputs)
    docs["check_model"]["quantization"] = {"method": "compressed-tensors", "format": "pack-quantized", "bits": 4,
                                           "symmetric": True, "group_size": 128, "cpu_kernels": {}}
    docs["validate"]["confirmations"] = [{"check": "c", "message": "the image is not the pinned one", "fix": "f"}]
    plan = serve_plan.build_plan(docs, {"expose": True, "api_key_env": "MY_KEY", "sizing": "all-cores"}, load_epyc(),
                                 facts_for(docs, api_key_set=True))
    rows = dict((k, v) for k, v in plan["summary"] if k not in ("Warning",))
    assert plan["quantization"]["kernel"].startswith("zentorch_dynamic_qlinear")
    assert rows["Precision"] == ("bfloat16 activations; weights compressed-tensors 4-bit, run by "
                                 + plan["quantization"]["kernel"])
    assert rows["Port"] == f"{plan['port']} on 0.0.0.0 (exposed, API key required)"
    assert rows["Sizing rule"] == "all-cores (a comparison baseline, not the skill's sizing)"
    assert rows["Needs your OK"] == "the image is not the pinned one"
    assert "VLLM_API_KEY (from $MY_KEY, value not shown)" in rows["Environment"]
    assert "sk-summary-test" not in json.dumps(plan)


def test_the_handoff_is_the_table_and_examples_a_user_pastes(inputs):
    docs = load_docs(inputs)
    plan = serve_plan.build_plan(docs, {}, load_epyc(), facts_for(docs))
    port, name = plan["port"], plan["container_name"]
    h = serve_plan.handoff_doc(plan)
    assert h["table_markdown"] == "\n".join([
        "| Field | Value |", "|---|---|",
        f"| Base URL | http://127.0.0.1:{port}/v1 (the trailing /v1 matters) |",
        "| Served model | Qwen3-0.6B |",
        "| Endpoint | /v1/chat/completions |",
        "| Why | a chat template is present |",
        f"| Runtime / port | docker / {port} |",
        "| Sizing | 96 OMP threads (96-191), KV 190 GiB, --max-model-len 4096, socket 1, NUMA 1 |",
        f"| Stop | python3 scripts/launch.py stop --plan <plan.json>  (by hand: docker stop -t 30 {name} && "
        f"docker rm {name} && rm -rf {plan['state_dir']}/secrets) |"])
    assert h["curl_example"] == (
        f"curl -s http://127.0.0.1:{port}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
        "  -d '{\"model\": \"Qwen3-0.6B\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], "
        "\"max_tokens\": 128, \"temperature\": 0.7}'")
    assert h["python_example"].splitlines()[3] == f'client = OpenAI(base_url="http://127.0.0.1:{port}/v1", api_key="EMPTY")'
    assert (h["served_model_name"], h["why"], h["runtime"], h["port"]) == ("Qwen3-0.6B", "a chat template is present",
                                                                         "docker", port)
    assert h["guidance"][0] == "max_tokens caps the output; prompt tokens + max_tokens must stay <= --max-model-len (4096)"
    # a key by name: the Python example reads it from the environment, never a value
    plan["api_key_env"] = "MY_KEY"
    assert 'api_key=os.environ[\'MY_KEY\'])' in serve_plan.handoff_doc(plan)["python_example"]


def test_every_field_of_a_plan_is_compared_with_a_fresh_rendering(inputs):
    """start (and every verb) refuses a plan that differs from its own inputs' rendering in any field: the
    command, its env and secrets, where it runs, and what the summary, stop command and handoff say."""
    docs = load_docs(inputs)
    plan = serve_plan.build_plan(docs, {}, load_epyc(), facts_for(docs))
    assert {"argv", "env", "stop_command", "summary_markdown", "base_url"} <= plan.keys()
    for field in plan.keys() - {"ok"}:  # ok: the printed verdict, not a field the plan renders
        assert serve_plan.plan_differences({**plan, field: "edited"}, plan) == [field]
    assert serve_plan.plan_differences({**plan, "extra": 1}, plan) == ["extra"]
    assert serve_plan.plan_differences(plan, plan) == []


@pytest.mark.parametrize("body,verdict", [
    ({"choices": ["hello"], "usage": {"completion_tokens": 1}}, "choices[0] is not an object"),
    ({"choices": [], "usage": {"completion_tokens": 1}}, "no choices in the response"),
    ({"choices": {"0": {}}}, "no choices in the response"),
    ({"choices": [{"message": "hi"}], "usage": {"completion_tokens": 1}}, "choices[0] has no message.content"),
    ({"choices": [{"message": {"content": "x"}}], "usage": None},
     "the server generated no tokens (usage.completion_tokens missing or 0)"),
    ({"choices": [{"message": {"content": "x"}}], "usage": {"completion_tokens": 0}},
     "the server generated no tokens (usage.completion_tokens missing or 0)"),
    ({"object": "error", "message": "boom"}, 'HTTP 200 carrying an error: {"object": "error", "message": "boom"}'),
    (["x"], 'HTTP 200 carrying an error: ["x"]'),
])
def test_each_bad_smoke_reply_gets_its_own_verdict(body, verdict):
    assert serve_plan.judge_smoke(200, json.dumps(body), "chat_completions") == (False, verdict)


def test_a_long_or_secret_bearing_server_text_is_shortened_and_masked():
    assert serve_plan.redact("x" * 250, []) == "x" * 200 + "... (250 chars)"
    assert serve_plan.redact("y" * 200, []) == "y" * 200
    assert serve_plan.redact("Authorization: Bearer sk-abc123 and sk-abc123", ["sk-abc123"]) == \
        "Authorization: Bearer *** and ***"
    assert serve_plan.judge_smoke(500, "z" * 300, "completions")[1] == f"HTTP 500, body is not JSON: {'z' * 200 + '... (300 chars)'!r}"


def test_a_host_plan_preloads_the_library_validate_found(inputs):
    docs = load_docs(inputs)
    lib = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
    docs["validate"].update(path="host", runtime="host", image=None, python=sys.executable,
                            ld_preload={"value": lib, "note": None})
    assert serve_plan.build_plan(docs, {}, load_epyc(), facts_for(docs))["env"]["LD_PRELOAD"] == lib
    assert "LD_PRELOAD" not in serve_plan.build_plan(docs, {"sizing": "vllm-default"}, load_epyc(), facts_for(docs))["env"]


@pytest.mark.parametrize("edit", [
    lambda t: t.update(container_cpuset_argv=["--cpuset-cpus=96-191,288-383", "--cpuset-mems=0"]),
    lambda t: t.update(container_cpuset_argv=["--cpuset-cpus=96-191,288-383", "--cpuset-mems=99999"]),
    lambda t: t.update(container_cpuset_argv=["--cpuset-cpus=96-191,288-383", "--cpuset-mems=0-1"]),
    lambda t: t.update(container_cpuset_argv=["--cpuset-cpus=0-95", "--cpuset-mems=1"]),  # socket 0's, bind 96-191
    lambda t: t.update(host_pin_argv=["taskset", "-c", "0-95"]),
    lambda t: t.update(host_pin_argv=["numactl", "--cpunodebind=1", "--membind=0"]),
])
def test_the_container_is_pinned_to_the_nodes_and_cpus_cpu_tune_sized(inputs, edit):
    """Twenty-sixth audit, F5: `"cpus" in flag` was true for --cpuset-mems (cpuset), so a container's memory
    node was never compared with the nodes cpu_tune sized, and its CPUs never with the bind; the host's
    numactl twin was refused."""
    docs = load_docs(inputs)
    assert docs["cpu_tune"]["numa_nodes"] == [1] and docs["cpu_tune"]["vllm_cpu_omp_threads_bind"] == "96-191"
    serve_plan.build_plan(docs, {}, load_epyc(), facts_for(docs))  # as cpu_tune made it: planned
    edit(docs["cpu_tune"])
    with pytest.raises(ScriptError) as err:
        serve_plan.build_plan(docs, {}, load_epyc(), facts_for(docs))
    assert "cpu_tune" in err.value.error and "unmodified output of cpu_tune.py" in err.value.fix
