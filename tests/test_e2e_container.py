"""The container path for real: a Docker engine (tests/run.sh starts one) and the locally built image of
the host stack's pins (the user's step: setup_host_stack.py --image), driven by the skill's own scripts.

The chain is SKILL.md's container path: detect -> validate (finds docker, probes the stack inside the
image) -> check_model (registry probed inside the image) -> estimate_memory -> cpu_tune -> plan ->
start -> verify -> handoff -> OpenAI SDK chat + completion -> stop. The model is served by its Hub id
from the mounted HF cache (a Hub cache snapshot made here, HF_HUB_OFFLINE=1), which proves the cache
mount. On an AMD EPYC with AVX-512 BF16 the container runs zentorch (ZenCpuPlatform, kernel proof from
the container's log); elsewhere the same image serves through the stock path (vLLM's CpuPlatform,
zentorch inactive), and the test says which. No fake anywhere in this file.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import E2E_KV_GB, ROOT, free_port, run_script, save, small_kv_tune
from epyc import bundle
from epyc.facts import hostfacts

pytestmark = pytest.mark.e2e
HUB_ID = "epyc-test/tiny-qwen3"
SECRET_TOKEN = "hf_container_secret_31337"
SECRET_KEY = "sk-container-key-4242"


def docker(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def engine() -> dict:
    host = os.environ.get("EPYC_TEST_DOCKER_HOST")
    if not host:
        pytest.skip("no Docker engine: tests/run.sh starts one when it runs as root with docker.io installable")
    env = {"DOCKER_HOST": host}
    info = docker(env, "info", "--format", "{{.ServerVersion}}", timeout=30)
    if info.returncode != 0:
        pytest.skip(f"the Docker engine at {host} does not answer: {info.stderr.strip()[-200:]}")
    return env


@pytest.fixture(scope="module")
def image(engine) -> str:
    """The measured stack's image, built (or found) by the step a user runs: setup_host_stack.py --image."""
    res = run_script("setup_host_stack.py", "--image", env=engine, timeout=2700)
    assert res.code == 0 and res.doc["ready"], res.stdout[-2000:] + res.stderr[-3000:]
    assert res.doc["image"] == bundle.load_epyc()["stacks"]["local_image"]["image"]
    print(f"\nimage {res.doc['image']}: {'reused' if res.doc['reused'] else 'built'} in {res.doc['seconds']} s")
    return res.doc["image"]


@pytest.fixture(scope="module")
def hf_home(models, tmp_path_factory) -> Path:
    """The tiny model laid out as huggingface_hub lays out a download: models--ORG--NAME/snapshots/REV,
    refs/main naming REV. Mounted into the container as its HF cache."""
    home = tmp_path_factory.mktemp("hf-home")
    repo = home / "hub" / ("models--" + HUB_ID.replace("/", "--"))
    rev = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(models["tiny"]["folder"], repo / "snapshots" / rev)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    return home


@pytest.fixture
def chain_env(engine, hf_home) -> dict:
    return {
        **engine,
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "HF_TOKEN": SECRET_TOKEN,
        "EPYC_TEST_KEY": SECRET_KEY,
    }


def container_plan(tmp: Path, stack: dict, image: str, env: dict, model: str, *extra: str) -> tuple[Path, dict]:
    """SKILL.md's container chain up to the plan, asserting on each step's JSON."""
    stock = stack["backend"] == "stock"
    det = run_script("detect.py", env=env)
    det_file = save(tmp, "detect", det)
    val = run_script(
        "validate.py",
        "--detect",
        str(det_file),
        "--image",
        image,
        *(["--stock"] if stock else []),
        env=env,
        timeout=300,
    )
    assert val.code == 0 and val.doc["path"] == "container" and val.doc["runtime"] == "docker", val.doc
    assert val.doc["stack"]["source"] == f"probe:image:{image}"  # read inside the image, not from its tag
    assert val.doc["stack"]["vllm"].startswith(bundle.load_epyc()["host_stack"]["vllm_version"])
    want = "ZenCpuPlatform" if not stock else "CpuPlatform"
    assert val.doc["stack"]["platform"].rsplit(".", 1)[-1] == want and val.doc["backend"] == stack["backend"]
    assert SECRET_TOKEN not in val.stdout + val.stderr
    save(tmp, "validate", val)  # the run folder Step 3 reads it from
    chk = skill_check_model(tmp, env, model, val.doc)
    assert chk.code == 0 and chk.doc["registry_source"] == f"probe:image:{image}", chk.doc
    assert chk.doc["primary_endpoint"] == "chat_completions"
    est = run_script(
        "estimate_memory.py", "--model", model, "--ram-gb", str(det.doc["ram_gb"]), "--max-model-len", "2048", env=env
    )
    assert est.code == 0, est.doc
    tune = small_kv_tune(est.doc["weight_gb"], est.doc["fit"]["kv_needed_gb"], env=env)
    assert tune.code == 0 and tune.doc["kv_granted_gb"] <= E2E_KV_GB, tune.doc
    files = {
        "detect": det_file,
        **{n: save(tmp, n, r) for n, r in (("validate", val), ("check", chk), ("estimate", est), ("tune", tune))},
    }
    plan = run_script(
        "launch.py",
        "plan",
        *[f"--{k}={v}" for k, v in files.items()],
        "--port",
        str(free_port()),
        "--state-dir",
        str(tmp / "run"),
        *extra,
        env=env,
    )
    assert plan.code == 0, plan.doc
    assert SECRET_TOKEN not in plan.stdout and SECRET_KEY not in plan.stdout
    return save(tmp, "plan", plan), plan.doc


def skill_check_model(tmp: Path, env: dict, model: str, validate: dict):
    """SKILL.md's Step 3, run by bash as written in a run folder that holds validate's document: the
    registry is read inside the image validate chose. The user's model stands in for the default."""
    from conftest import Result
    from docs import commands

    line = next(c.line for c in commands("SKILL.md") if c.script == "check_model.py" and c.tag is None)
    shell_env = {
        **os.environ,
        **env,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "EPYC_RUN": str(tmp),
    }
    assert json.loads((tmp / "validate.json").read_text()) == validate
    line = line.replace(bundle.load_epyc()["default_model"], model)
    res = subprocess.run(["bash", "-c", line], env=shell_env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = (tmp / "check_model.json").read_text()
    return Result(res.returncode, json.loads(out), out, res.stderr)


def no_container(env: dict, name: str) -> bool:
    out = docker(env, "ps", "-a", "--filter", f"name=^{name}$", "--format", "{{.Names}}").stdout
    return out.strip() == ""


def port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_container_chain_serves_by_hub_id_from_the_mounted_cache(stack, image, chain_env, tmp_path):
    env = chain_env
    zen = stack["backend"] == "zentorch"
    plan_file, plan = container_plan(
        tmp_path, stack, image, env, HUB_ID, "--api-key-env", "EPYC_TEST_KEY", *(["--kernel-log"] if zen else [])
    )
    name = plan["container_name"]
    cpuset = next(a for a in plan["argv"] if a.startswith("--cpuset-cpus=")).split("=", 1)[1]
    assert "--ipc=host" in plan["argv"] and "HF_HUB_OFFLINE=1" in plan["argv"]
    # the engine validate probed is named in the command: verify, handoff, kernel_proof and stop below run
    # in a shell without DOCKER_HOST and still reach the engine (here a private socket tests/run.sh started)
    assert plan["engine"] == env["DOCKER_HOST"] and plan["argv"][:3] == [
        "docker",
        f"--host={env['DOCKER_HOST']}",
        "run",
    ]
    shell = {k: v for k, v in env.items() if k != "DOCKER_HOST"}
    assert plan["env_by_name"] == ["HF_TOKEN", "VLLM_API_KEY"] and "--env" not in plan["argv"][-12:]
    # a leftover container of the same name: start removes it
    assert docker(env, "create", "--name", name, image, "true").returncode == 0
    start = run_script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env, timeout=600)
    try:
        assert start.code == 0, start.doc
        assert "pulling" not in start.stderr  # the image is local: pull policy "missing" does not pull
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, timeout=30).stdout
        assert SECRET_TOKEN not in ps and SECRET_KEY not in ps
        ver = run_script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "400", env=shell, timeout=500)
        assert ver.code == 0, json.dumps(ver.doc, indent=1)[-3000:]
        hand = run_script("launch.py", "handoff", "--plan", str(plan_file), env=shell)
        assert hand.code == 0 and SECRET_KEY not in hand.stdout
        assert (
            hand.doc["engine"] == env["DOCKER_HOST"] and f"(engine {env['DOCKER_HOST']})" in hand.doc["table_markdown"]
        )

        from openai import AuthenticationError, OpenAI

        client = OpenAI(base_url=hand.doc["base_url"], api_key=SECRET_KEY, timeout=120)
        assert client.models.list().data[0].id == HUB_ID  # served by its Hub id, from the mounted cache
        chat = client.chat.completions.create(
            model=HUB_ID, messages=[{"role": "user", "content": "hello"}], max_tokens=8, temperature=0
        )
        assert chat.usage.completion_tokens > 0
        comp = client.completions.create(model=HUB_ID, prompt="the container serves", max_tokens=8, temperature=0)
        assert comp.usage.completion_tokens > 0
        with pytest.raises(AuthenticationError):
            OpenAI(base_url=hand.doc["base_url"], api_key="wrong", timeout=30).models.list()

        # the engine's own view: the planned cpuset, the host IPC namespace, the CPUs inside
        info = json.loads(docker(env, "inspect", name).stdout)[0]
        assert info["HostConfig"]["CpusetCpus"] == cpuset and info["HostConfig"]["IpcMode"] == "host"
        assert info["HostConfig"]["NetworkMode"] == "host"
        config = json.dumps(info)  # secrets reach the server as mounted files: none in the container's config
        assert SECRET_TOKEN not in config and SECRET_KEY not in config
        environ = docker(env, "exec", name, "sh", "-c", "tr '\\0' '\\n' < /proc/1/environ").stdout
        assert f"VLLM_API_KEY={SECRET_KEY}" in environ and f"HF_TOKEN={SECRET_TOKEN}" in environ
        status = docker(env, "exec", name, "cat", "/proc/1/status").stdout
        inside = next(ln.split(":", 1)[1].strip() for ln in status.splitlines() if ln.startswith("Cpus_allowed_list"))
        assert hostfacts.parse_cpulist(inside) == hostfacts.parse_cpulist(cpuset)
        logs = docker(env, "logs", name).stdout + docker(env, "logs", name).stderr
        secrets_dir = Path(plan["state_dir"]) / "secrets"  # the one place a value is on disk: 0700, removed by stop
        assert oct(secrets_dir.stat().st_mode & 0o777) == "0o700"
        for f in Path(plan["state_dir"]).iterdir():  # our state and logs hold no secret
            if f.is_file():
                text = f.read_text(errors="replace")
                assert SECRET_TOKEN not in text and SECRET_KEY not in text, f
        assert SECRET_TOKEN not in logs and SECRET_KEY not in logs

        # another plan on this port with a state dir of its own: the container's name is the same, and its
        # stop must leave this container alone (the engine's id is compared with what the state recorded)
        other = run_script(
            "launch.py",
            "plan",
            *[
                f"--{k}={tmp_path / (f + '.json')}"
                for k, f in (
                    ("detect", "detect"),
                    ("validate", "validate"),
                    ("check", "check"),
                    ("estimate", "estimate"),
                    ("tune", "tune"),
                )
            ],
            "--port",
            str(plan["port"]),
            "--state-dir",
            str(tmp_path / "other"),
            "--api-key-env",
            "EPYC_TEST_KEY",
            env=env,
        )
        assert other.code == 0 and other.doc["container_name"] == name, other.doc
        bystander = run_script("launch.py", "stop", "--plan", str(save(tmp_path, "other-plan", other)), env=shell)
        assert bystander.code == 1 and "has no record of" in bystander.doc["error"], bystander.doc
        assert json.loads(docker(env, "inspect", name).stdout)[0]["State"]["Running"] is True

        proof = run_script("kernel_proof.py", "--plan", str(plan_file), env=shell, timeout=300)
        if zen:
            assert proof.code == 0 and proof.doc["zentorch_matmuls"] > 0, proof.doc
        else:
            assert proof.code == 1 and proof.doc["zentorch_matmuls"] == 0
        back_s = engine_killed_and_back(env, name, plan, shell)
        print(
            f"\ncontainer ({stack['backend']} path, {info['Config']['Image']}): healthy after "
            f"{ver.doc['time_to_healthy_s']} s, cpuset {cpuset}, {proof.doc['zentorch_matmuls']} zentorch matmuls; "
            f"its engine killed, answering again after {back_s:.0f} s (restart policy)"
        )
    finally:
        stop = run_script("launch.py", "stop", "--plan", str(plan_file), env=shell, timeout=200)
    assert stop.code == 0 and stop.doc["stopped"] is True and stop.doc["graceful"] is True
    assert no_container(env, name) and port_closed(plan["port"])
    assert not (Path(plan["state_dir"]) / "secrets").exists()


def engine_killed_and_back(env: dict, name: str, plan: dict, shell: dict) -> float:
    """SIGKILL to the engine core inside the container (the crash a user sees): vLLM's API process then exits,
    and the restart policy brings the same container back; it answers again and verify passes on it.
    -> seconds from the kill to a healthy answer."""
    import psutil
    from epyc.deployments.serve_verify import http

    before = json.loads(docker(env, "inspect", name).stdout)[0]
    main = psutil.Process(before["State"]["Pid"])
    core = next(p for p in main.children(recursive=True) if "EngineCore" in " ".join(p.cmdline()) + p.name())
    t0 = time.monotonic()
    core.kill()
    while time.monotonic() - t0 < 600:
        after = json.loads(docker(env, "inspect", name).stdout)[0]
        if (
            after["RestartCount"] > before["RestartCount"]
            and http("GET", f"{plan['base_url'][:-3]}/health", 5)[0] == 200
        ):
            break
        time.sleep(2)
    else:
        raise AssertionError(f"not back within 600 s: {after['State']}")
    back_s = time.monotonic() - t0
    assert after["Id"] == before["Id"] and after["State"]["Pid"] != before["State"]["Pid"]
    ver = run_script("launch.py", "verify", "--plan", plan["state_dir"] + "/plan.json", "--timeout", "400", env=shell)
    assert ver.code == 0, json.dumps(ver.doc, indent=1)[-3000:]
    return back_s


def test_engine_that_dies_in_the_container_fails_in_smoke(stack, image, models, engine, tmp_path):
    """head_dim 16, mounted as a local folder (/models, read-only): healthy, then the first request kills it.
    The shared memory its engine left in the host's /dev/shm (--ipc=host) is freed by stop."""
    env = {**engine, "HF_HUB_OFFLINE": "1"}
    plan_file, plan = container_plan(tmp_path, stack, image, env, models["headdim16"]["folder"])
    assert any(a.endswith(":/models/headdim16-qwen3:ro") for a in plan["argv"])
    assert run_script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env, timeout=600).code == 0
    try:
        ver = run_script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "400", env=env, timeout=500)
        assert ver.code == 1 and ver.doc["phase"] in ("smoke", "process"), json.dumps(ver.doc)[-2000:]
        assert ver.doc["log_tail"], "the container's log tail is part of the failure"
        segments = json.loads(Path(plan["state_file"]).read_text())["shm_segments"]
        # a root container's segments are seen (and freed) only by root: a docker-group user reads no root /proc
        assert segments or os.geteuid() != 0, "verify records the healthy engine's shared memory before a request"
    finally:
        stop = run_script("launch.py", "stop", "--plan", str(plan_file), env=env, timeout=200)
    assert no_container(env, plan["container_name"])
    assert stop.code == 0 and not [n for n in segments if Path("/dev/shm", n).exists()], stop.doc


def test_container_removed_while_verify_polls(stack, image, chain_env, tmp_path):
    env = chain_env
    plan_file, plan = container_plan(tmp_path, stack, image, env, HUB_ID)
    assert run_script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env, timeout=600).code == 0
    verify = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "launch.py"), "verify", "--plan", str(plan_file), "--timeout", "300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    time.sleep(10)
    assert docker(env, "rm", "-f", plan["container_name"]).returncode == 0
    out, _ = verify.communicate(timeout=120)
    doc = json.loads(out)
    assert verify.returncode == 1 and doc["phase"] == "process", doc
    run_script("launch.py", "stop", "--plan", str(plan_file), env=env)
    assert no_container(env, plan["container_name"])


def test_a_busy_port_fails_before_anything_runs_and_the_built_image_is_never_pulled(stack, image, chain_env, tmp_path):
    env = chain_env
    plan_file, plan = container_plan(tmp_path, stack, image, env, HUB_ID)
    with socket.socket() as s:  # a listener on the planned port: with --network=host that is fatal
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", plan["port"]))
        s.listen()
        r = run_script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env)
        assert r.code == 1 and r.doc["phase"] == "start" and "in use" in r.doc["error"]
    # `--pull always` on the image this host built: looked for (image inspect), never pulled from localhost
    r = run_script(
        "launch.py", "start", "--plan", str(plan_file), "--confirm", "--pull", "always", env=env, timeout=300
    )
    try:
        assert r.code == 0 and "inspect localhost/" in r.stderr and "pull" not in r.stderr, (r.doc, r.stderr)
    finally:
        run_script("launch.py", "stop", "--plan", str(plan_file), env=env)
    assert no_container(env, plan["container_name"])


def test_an_image_that_is_not_local_is_not_trusted_by_its_tag(stack, engine, tmp_path):
    det = save(tmp_path, "detect", run_script("detect.py"))
    r = run_script(
        "validate.py",
        "--detect",
        str(det),
        "--image",
        "localhost/no-such-image:1",
        *(["--stock"] if stack["backend"] == "stock" else []),
        env=engine,
        timeout=120,
    )
    assert r.code == 1 and r.doc["path"] == "container"
    err = next(e for e in r.doc["errors"] if e["check"] == "image")
    assert "not a local image" in err["message"] and "docker pull localhost/no-such-image:1" in err["fix"]


# zentorch's own matmuls in float32 (bf16 needs AVX-512 BF16, which not every runner has): the image's build
ZEN_OPS = """
import torch, zentorch
x, w, b = torch.randn(4, 64), torch.randn(32, 64), torch.randn(32)
torch.ops.zentorch.zentorch_linear_unary(x, w, b)
torch.ops.zentorch.zentorch_linear_unary(x, w)
torch.ops.zentorch.zentorch_mm(x, w.t().contiguous())
"""


def test_kernel_proof_counts_what_the_images_zentorch_writes(image, engine, tmp_path):
    """kernel_proof's pattern against zendnnl's live output on this runner, not only the captured fixture
    (tests/fixtures/zendnnl): the image's zentorch runs three matmuls with ZENDNNL_API_LOG_LEVEL=4, and
    the proof counts exactly those three, by op and kernel. A zentorch release that changes its record's
    shape fails here before it makes a real server's proof say "no zentorch matmul"."""
    res = docker(
        engine,
        "run",
        "--rm",
        "--network=none",
        "-e",
        "ZENDNNL_API_LOG_LEVEL=4",
        image,
        "python3",
        "-c",
        ZEN_OPS,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    log = tmp_path / "zendnnl.log"
    log.write_text(res.stdout + res.stderr)
    r = run_script("kernel_proof.py", "--log", str(log))
    assert r.code == 0 and r.doc["verdict"] == "zentorch kernels executed", r.doc
    assert r.doc["by_plugin_op"] == {"zentorch::zentorch_linear_unary": 2, "zentorch::zentorch_mm": 1}, r.doc
    assert r.doc["zentorch_matmuls"] == 3 and sum(r.doc["by_kernel"].values()) == 3


def test_a_keyed_fleet_of_two_containers_behind_the_router(stack, image, chain_env, tmp_path):
    """Issue 33's container path on the real engine: the runner's cores split between two containers of the
    image, each with its cpuset and the key by name, behind the real vllm-router (a host process holding
    no key): a chat through the router needs the key; stop removes both containers and the router."""
    from epyc.deployments.serve_verify import http

    env = chain_env
    assert run_script("setup_host_stack.py", "--router", timeout=900).code == 0
    container_plan(tmp_path, stack, image, env, HUB_ID)
    run = tmp_path / "fleet"
    run.mkdir()
    names = {"detect": "detect", "validate": "validate", "check": "check_model", "estimate": "estimate_memory"}
    for src, name in {**names, "tune": "cpu_tune"}.items():
        shutil.copy(tmp_path / f"{src}.json", run / f"{name}.json")
    port = free_port()
    args = ["--engines", "2", "--port", str(port), "--api-key-env", "EPYC_TEST_KEY", "--run", str(run)]
    p = run_script("launch.py", "plan", *args, env=env)
    assert p.code == 0, p.doc
    engines = [json.loads(Path(e).read_text()) for e in p.doc["engines"]]
    assert [e["path"] for e in engines] == ["container", "container"] and SECRET_KEY not in p.stdout
    body = {"model": engines[0]["served_model_name"], "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
        s = run_script("launch.py", "start", "--run", str(run), "--confirm", env=env, timeout=900)
        assert s.code == 0, s.doc
        v = run_script("launch.py", "verify", "--run", str(run), "--timeout", "500", env=env, timeout=1200)
        assert v.code == 0 and v.doc["router"]["answered"], json.dumps(v.doc)[-3000:]
        for e in engines:  # each container holds its own share of the cores
            cpus = docker(env, "inspect", "-f", "{{.HostConfig.CpusetCpus}}", e["container_name"]).stdout.strip()
            assert cpus and cpus == next(a for a in e["argv"] if a.startswith("--cpuset-cpus=")).split("=", 1)[1]
            assert SECRET_KEY not in docker(env, "inspect", e["container_name"]).stdout
        assert http("POST", url, 120, body=body)[0] == 401
        status, text = http("POST", url, 120, body=body, headers={"Authorization": f"Bearer {SECRET_KEY}"})
        assert status == 200, text
    finally:
        st = run_script("launch.py", "stop", "--run", str(run), env=env, timeout=600)
    assert st.code == 0 and st.doc["router"]["stopped"], st.doc
    assert all(no_container(env, e["container_name"]) for e in engines) and port_closed(port)
