"""Shared test helpers: run a script as a user would, check its one JSON document against its schema."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import sysroots
from epyc import bundle
from epyc.bundle import load_epyc
from epyc.decisions import planner
from epyc.deployments import process, serve_procs, serve_start, serve_state
from epyc.facts import hubcache, shell
from epyc.verbs import up
from hypothesis import strategies as st
from model_fixtures import model_folder

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
SCHEMAS = ROOT / "data" / "schemas"
# the engine a user's shell names is not the tests': the fast suite's runtime is the fake docker, and the
# container e2e passes the real engine it was given (EPYC_TEST_DOCKER_HOST) by name
os.environ.pop("DOCKER_HOST", None)


# the run folders of the scripts the tests start: each call gets its own (run_script), unless a test chains
# steps through one on purpose (env={"EPYC_RUN": ...} or --run); never the user's ~/.cache one
RUNS = tempfile.mkdtemp(prefix="epyc-test-runs-")
os.environ["EPYC_RUN"] = os.path.join(RUNS, "session")


@pytest.fixture(autouse=True)
def own_run_folder(tmp_path, monkeypatch):
    """A test's in-process calls and the processes it starts share one run folder of the test's own."""
    monkeypatch.setenv("EPYC_RUN", str(tmp_path / "run"))


@dataclass
class Result:
    code: int
    doc: object
    stdout: str
    stderr: str


def schema_for(script: str, doc) -> dict | None:
    if isinstance(doc, dict) and "error" in doc:
        name = "error"
    else:
        name = Path(script).stem
    path = SCHEMAS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def validate(script: str, doc) -> None:
    import jsonschema

    schema = schema_for(script, doc)
    if schema is not None:
        jsonschema.validate(doc, schema)
    own = SCHEMAS / f"{Path(script).stem}.json"
    if isinstance(doc, dict) and "error" in doc and own.exists():  # a refusal that carries the whole result
        full = json.loads(own.read_text())  # (check_model, estimate_memory) is that result too
        plain = set(json.loads((SCHEMAS / "error.json").read_text())["properties"])
        if "error" in (full.get("properties") or {}) and set(doc) - plain:
            jsonschema.validate(doc, full)


def run_script(
    script: str,
    *args: str,
    env: dict | None = None,
    timeout: float = 120,
    stdin: str | None = None,
    check_schema: bool = True,
    unset: tuple[str, ...] = (),
) -> Result:
    """Run `python3 scripts/NAME.py ARGS` and parse its stdout, which must be exactly one JSON document.
    `env` is laid over this environment; the variables in `unset` are taken out of it."""
    # a file, pipe or socket a script leaves unclosed is an error here (some CI shells set PYTHONWARNINGS=error;
    # the leak then printed a traceback on stderr): every run of the suite checks it
    full_env = {"PYTHONWARNINGS": "error::ResourceWarning", **os.environ, **(env or {})}
    if "EPYC_RUN" not in (env or {}):  # a run folder of its own: a script here reads no other call's documents
        full_env["EPYC_RUN"] = tempfile.mkdtemp(prefix="run-", dir=RUNS)
    for name in unset:
        full_env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        input=stdin,
        cwd=ROOT,
    )
    # our scripts never crash with a traceback (a quoted server log inside the JSON is fine)
    assert "Traceback (most recent call last)" not in proc.stderr, proc.stderr[-3000:]
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"{script} stdout is not one JSON document:\n{proc.stdout}\n--stderr--\n{proc.stderr}")
    if check_schema:
        validate(script, doc)
    if isinstance(doc, dict) and "error" in doc:
        assert doc.get("fix"), f"error without a fix: {doc}"
        assert proc.returncode != 0, f"error document with exit 0: {doc}"
    if proc.returncode != 0:  # the one contract, checked on every run in the suite: exit 1 = error + fix
        assert proc.returncode == 1 and isinstance(doc, dict) and doc.get("error") and doc.get("fix"), doc
        assert "internal error" not in doc["error"], doc
    return Result(proc.returncode, doc, proc.stdout, proc.stderr)


@pytest.fixture
def script():
    return run_script


def answer_once(raw: bytes, linger: float = 0.0):
    """A listening socket on 127.0.0.1 whose one connection gets `raw` as is (a broken or slow HTTP answer no
    server library would send), after the request is read; closed `linger` s later. The caller closes it."""
    import socket
    import threading
    import time

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        conn.recv(65536)
        conn.sendall(raw)
        time.sleep(linger)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv


@pytest.fixture
def make_sysroot(tmp_path):
    def _make(name: str, **overrides) -> Path:
        spec = sysroots.HOSTS[name]
        if overrides:
            from dataclasses import replace

            spec = replace(spec, **overrides)
        return sysroots.build(tmp_path / name, spec)

    return _make


def detect_file(tmp_path: Path, host: str = "genoa_9654_2s_smt") -> Path:
    """detect.py's JSON for a fixture host, saved to a file: what validate.py --detect reads, so a test of
    runtimes and stacks does not depend on the CPU this session drew (Genoa, Turin or a Xeon)."""
    root = sysroots.build(tmp_path / f"sysroot-{host}", sysroots.HOSTS[host])
    r = run_script("detect.py", "--sysroot", str(root))
    assert r.code == 0, r.doc
    out = tmp_path / f"detect-{host}.json"
    out.write_text(r.stdout)
    return out


# ---------------------------------------------------------------- end to end: the real stack on this CPU

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "serving-llms-on-epyc"
BUILDER = ROOT / "tests" / "tools" / "build_test_model.py"


def backend_for_this_cpu(det: dict) -> str | None:
    """zentorch where it can run, stock vLLM CPU on any other x86-64 with AVX2/AVX-512, else None."""
    if det.get("is_amd_epyc") and det.get("avx512") and det.get("avx512_bf16"):
        return "zentorch"
    flags = Path("/proc/cpuinfo").read_text()
    return "stock" if re.search(r"\bavx(2|512f)\b", flags) else None


@pytest.fixture(scope="session")
def stack():
    det = run_script("detect.py").doc
    backend = backend_for_this_cpu(det)
    if backend is None:
        pytest.skip(f"{det.get('cpu_model')}: neither AVX2 nor AVX-512, vLLM's CPU build cannot run here")
    args = ["--stock"] if backend == "stock" else []
    r = run_script("setup_host_stack.py", *args, timeout=2400)  # idempotent: ~90 s the first time, seconds after
    assert r.code == 0, r.doc
    print(
        f"\ne2e on {det['cpu_model']} ({det['vendor_name']}): the {backend} path, platform {r.doc['stack']['platform']}"
    )
    return {**r.doc, "detect": det}


@pytest.fixture(scope="session")
def models(stack):
    out = {}
    for key, shape, quant, name in (
        ("tiny", "tiny", None, "tiny-qwen3"),
        ("headdim16", "headdim16", None, "headdim16-qwen3"),
        ("sliding", "sliding", None, "sliding-llama"),
        ("hybrid", "hybrid", None, "hybrid-qwen3next"),
        ("tiny-ct-w4", "tiny", "ct-w4", "tiny-qwen3-ct-w4"),
    ):
        res = subprocess.run(
            [
                stack["python"],
                str(BUILDER),
                "--shape",
                shape,
                *(["--quant", quant] if quant else []),
                "--out",
                str(CACHE / "models" / name),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert res.returncode == 0, res.stderr[-2000:]
        out[key] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


E2E_KV_GB = 2


def small_kv_tune(weight_gb: float, kv_needed_gb: float, env: dict | None = None, run: str | None = None):
    """cpu_tune as the chain runs it, then again with the OS reserve raised so that it grants E2E_KV_GB of
    KV cache, not the 10 GiB half of what a 24 GiB runner has left: vLLM touches every page of its cache
    at start, about 4 s a GiB on these guests (a 10 GiB start took 131 s to healthy, a 1 GiB one 46 s).
    The grant is still cpu_tune's own, and each test compares vLLM's figures with ours at whatever it is.
    The SKILL.md and README tests keep the default sizing: there the chain is the user's, unchanged."""
    args = ["--weight-gb", str(weight_gb), "--kv-needed-gb", str(kv_needed_gb), *(["--run", run] if run else [])]
    first = run_script("cpu_tune.py", *args, env=env)
    assert first.code == 0, first.doc
    reserve = first.doc["socket_ram_gb"] - weight_gb - 2 * E2E_KV_GB - 0.5  # left: 2 x the grant + 0.5
    if reserve <= first.doc["os_reserve_gb"] or first.doc["kv_granted_gb"] <= E2E_KV_GB:
        return first
    return run_script("cpu_tune.py", *args, "--os-reserve-gb", f"{reserve:.2f}", env=env)


def free_port(block: int = 5) -> int:
    """A free port with the `block` - 1 after it free too: a fleet takes its engines' and the router's metrics
    port after it (and another test's connections come and go on this machine's ephemeral ports)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + block < 65536 and all(port_free(p) for p in range(port + 1, port + block)):
            return port
    raise AssertionError("no free block of ports")


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def save(tmp: Path, name: str, r) -> Path:
    p = tmp / f"{name}.json"
    p.write_text(r.stdout)
    return p


def vllm_processes(model_dir: str) -> list:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "serve" in cmd and model_dir in cmd:
            out.append(p)
    return out


# ---------------------------------------------------------------- shared helpers and fixtures of the behaviour files


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


def _verify_mode(script, tmp_path, inputs, live_tune, mode):
    plan_file, _ = host_plan(tmp_path, inputs, live_tune)
    server_mode(tmp_path, mode)
    try:
        assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
        return script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "6")
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))


def _run_measuring_memory(name: str, *args: str, env: dict) -> tuple[int, dict, int]:
    """Run scripts/NAME.py from a fresh interpreter that reports the largest resident size of what it
    waited for (the script and its children) -> (exit code, JSON document, max RSS in KiB)."""
    import os
    import subprocess
    import sys

    probe = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "print(r.stdout)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, sys.executable, str(bundle.ROOT / "scripts" / name), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    ).stdout
    head, _, body = out.partition("\n")
    code, max_rss_kb = map(int, head.split())
    return code, json.loads(body), max_rss_kb


TOKEN = "hf_QzXwVuTsRqPoNmLk9876"  # no run of 6 of its characters appears in any output by chance


def leaks(text: str, secret: str = TOKEN, run: int = 6) -> list[str]:
    """Every run of `run` characters of the secret that the text shows: a secret is never printed in part."""
    return [secret[i : i + run] for i in range(len(secret) - run + 1) if secret[i : i + run] in text]


@contextlib.contextmanager
def another_process_holding(lock_file: str):
    """Another process holds that lock file exactly as start (.lock) or up (.up.lock) does."""
    import subprocess

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
            "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
            lock_file,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.wait(timeout=10)


def _safetensors(header: dict) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * 64


def tail_of_a_plan_log(monkeypatch, tmp_path, line: str, env: dict) -> list[str]:
    """verify's log tail of a host plan passing HF_TOKEN and an API key in MYKEY, its log one line."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    log = tmp_path / "server.log"
    log.write_text(line + "\n")
    return serve_procs.log_tail(
        {"path": "host", "log_file": str(log), "secrets": {"HF_TOKEN": "HF_TOKEN", "VLLM_API_KEY": "MYKEY"}}
    )


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _plan_with_hf_cache(script, inputs, rt, tmp_path, path: str, subdir="hub"):  # noqa: F811
    """launch.py plan with validate.json's hf_cache edited to `path` (a hand-edited document)."""
    from conftest import plan_args

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


def _at_revision(rev_checked, rev_sized):
    def edit(docs):
        for name, rev in (("check_model", rev_checked), ("estimate_memory", rev_sized)):
            docs[name].update(model="Qwen/Qwen3-0.6B", revision=rev, model_dir=None)
        docs["check_model"]["source"] = "hub"

    return edit


@contextlib.contextmanager
def leader_killed_workers_left(tmp_path, plan):
    """A real start of the fake server in its renamed-worker mode, its leader then SIGKILLed (an OOM kill)
    while the workers, renamed and without the run's marker in view, live on. Yields the group; the
    whole group is killed on the way out."""

    from conftest import server_mode
    from epyc.deployments import serve_start

    server_mode(tmp_path, "renamed_worker")
    serve_start.start(plan, confirm=True)
    pgid = serve_state.read_state(plan)["pgid"]
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(process.group_scan(pgid, 0)) < 2:
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


def load_epyc_doc():
    from epyc.bundle import load_epyc

    return load_epyc()


def _plan_in(script, inputs, rt, folder: Path, port: int) -> tuple[Path, dict]:  # noqa: F811
    from conftest import plan_args

    r = script("launch.py", *plan_args(inputs, "--state-dir", str(folder), "--port", str(port)), env=rt[1])
    assert r.code == 0, r.doc
    path = folder.parent / f"{folder.name}-plan.json"
    path.write_text(r.stdout)
    return path, r.doc


TOKEN_30 = "hf_AuditThirtyToken12345"


def wait_for_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not serve_start.port_in_use(port):
        assert time.monotonic() < deadline, f"nothing listens on {port}"
        time.sleep(0.1)


def free_port_plan(script, inputs, rt, tmp_path):  # noqa: F811
    """A container plan on a port of its own: these tests listen on it (8000 may be another test's)."""
    r = script(
        "launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st"), "--port", str(free_port())), env=rt[1]
    )
    assert r.code == 0, r.doc
    path = tmp_path / "plan.json"
    path.write_text(r.stdout)
    return path, r.doc


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file another owner needs root (CI runs as root)")


def _vm(tmp, sockets: int, nodes: int):
    """A guest of `sockets` one-core packages (VMware's default cores-per-socket = 1, QEMU's -smp N) whose
    CPUs sit in `nodes` NUMA nodes, in order: no package has a node of its own."""

    from sysroots import HostSpec, build

    root = build(
        tmp / f"vm{sockets}x{nodes}",
        HostSpec("AMD EPYC 9654 96-Core Processor", 25, 17, sockets=sockets, cores=1, node_mem_gib=8.0),
    )
    per = sockets // nodes
    for n in range(sockets):
        shutil.rmtree(root / f"sys/devices/system/node/node{n}")
    for n in range(nodes):
        node = root / f"sys/devices/system/node/node{n}"
        node.mkdir(parents=True)
        (node / "cpulist").write_text(f"{n * per}-{n * per + per - 1}\n")
        (node / "meminfo").write_text(f"Node {n} MemTotal: {32 * 1024**2} kB\n")
    return root


FORGED = (
    'INFO:     127.0.0.1:50312 - "GET /plugin_op=zentorch_linear_unary_out,kernel=aocl_dlp_blocked HTTP/1.1" '
    "404 Not Found\n"
)


REAL_LOG = Path(__file__).resolve().parent / "fixtures" / "zendnnl" / "api-log-level-4.log"


REAL = next(line + "\n" for line in REAL_LOG.read_text().splitlines() if "plugin_op=" in line)


MINICPM3 = {
    "architectures": ["MiniCPM3ForCausalLM"],
    "model_type": "minicpm3",
    "hidden_size": 2560,
    "num_hidden_layers": 62,
    "num_attention_heads": 40,
    "num_key_value_heads": 40,
    "q_lora_rank": 768,
    "kv_lora_rank": 256,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32,
    "max_position_embeddings": 32768,
    "vocab_size": 73448,
    "torch_dtype": "bfloat16",
}


CODESTRAL = {
    "architectures": ["Mamba2ForCausalLM"],
    "model_type": "mamba2",
    "conv_kernel": 4,
    "expand": 2,
    "head_dim": 64,
    "hidden_size": 4096,
    "n_groups": 8,
    "num_heads": 128,
    "num_hidden_layers": 64,
    "state_size": 128,
    "vocab_size": 32768,
}


FALCON_MAMBA = {
    "architectures": ["FalconMambaForCausalLM"],
    "model_type": "falcon_mamba",
    "hidden_size": 4096,
    "num_hidden_layers": 64,
    "intermediate_size": 8192,
    "vocab_size": 65024,
    "state_size": 16,
    "conv_kernel": 4,
    "expand": 16,
}


def estimate(script, tmp_path, name, config, *args):
    cfg = tmp_path / f"{name}.json"
    cfg.write_text(json.dumps(config))
    return script(
        "estimate_memory.py",
        "--model",
        f"org/{name}",
        "--config",
        str(cfg),
        "--ram-gb",
        "24",
        "--avx512-bf16",
        "yes",
        *args,
    )


def up_with_no_terminal(monkeypatch, docs: dict, run_dir, port):
    """launch.up on the fixtures' real documents (each step returns its document), with no terminal to ask on
    and the launch recorded, not run -> (the up arguments, the list of plans launched)."""
    import argparse

    launched = []

    monkeypatch.setattr(up, "step", lambda script, args, phase, run_dir, allow_fail=False: docs[phase])
    monkeypatch.setattr(up, "TERMINAL", str(run_dir) + "-no-such-terminal")  # launch.ask's own no-terminal path
    monkeypatch.setattr(up, "serve_verified", lambda plan, plan_file, *rest: launched.append(plan) or {"ok": True})
    a = argparse.Namespace(
        model=docs["check_model"]["model"],
        state_dir=str(run_dir),
        stock=False,
        python=None,
        yes=False,
        max_model_len=None,
        num_prompts=4,
        port=port,
        expose=False,
        tls_cert=None,
        tls_key=None,
        tls_ca=None,
        tls_name=None,
        plain_http=False,
        served_model_name=None,
        api_key_env=None,
        throughput_flags=False,
        kernel_log=False,
        timeout=30,
        dtype=None,
    )
    return a, launched


def plan_from(docs, opts=None, facts=None):
    return planner.build_plan(docs, opts or {}, load_epyc(), facts or facts_for(docs))


LONG_NAME = "x" * 300  # one path component past the file system's 255


def config_only_model(tmp_path: Path) -> Path:
    """A model folder with Qwen3-0.6B's real config.json and no weights: each test adds the weights it needs."""
    m = tmp_path / "m"
    m.mkdir()
    (m / "config.json").write_text((model_folder("Qwen3-0.6B", tmp_path / "real") / "config.json").read_text())
    return m


def plan_from_4(docs, opts=None):
    return planner.build_plan(docs, opts or {}, load_epyc(), facts_for(docs))


def _safetensors_4(path: Path, header: dict) -> None:
    import struct

    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def _interpreter(tmp_path: Path, line: str) -> str:
    """An interpreter that prints one probe line whatever it is asked: a broken or hostile python."""
    exe = tmp_path / "py" / "python"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text(f"#!/bin/sh\nprintf '%s\\n' {json.dumps(line)}\n")
    exe.chmod(0o755)
    return str(exe)


KEY = "sk-audit7-Q9x"


def _pids(marker: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


def _pgid_8(p) -> int | None:
    try:
        return os.getpgid(p.pid)
    except OSError:
        return None


@pytest.fixture
def bad_files(tmp_path):
    """Inputs that are not documents: a FIFO (blocks a reader forever), /dev/zero (never ends), a folder,
    bytes that are not UTF-8, an integer JSON readers refuse, a plan-shaped object missing its fields."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "nonutf8.json").write_bytes(b'{"x": "\xff\xfe"}')
    (tmp_path / "bigint.json").write_text('{"x": ' + "9" * 5000 + "}")
    (tmp_path / "obj.json").write_text("{}")
    (tmp_path / "adir").mkdir()
    return {
        "fifo": str(fifo),
        "zero": "/dev/zero",
        "dir": str(tmp_path / "adir"),
        "nonutf8": str(tmp_path / "nonutf8.json"),
        "bigint": str(tmp_path / "bigint.json"),
        "obj": str(tmp_path / "obj.json"),
    }


READERS = [
    ("launch.py", ["stop", "--plan"]),
    ("launch.py", ["handoff", "--plan"]),
    ("launch.py", ["verify", "--plan"]),
    ("kernel_proof.py", ["--plan"]),
    ("kernel_proof.py", ["--log"]),
    ("bench.py", ["--plan"]),
    ("validate.py", ["--detect"]),
    ("estimate_memory.py", ["--weight-gb", "1", "--config"]),
]


CASES = [
    (n, a, k)
    for n, a in READERS
    for k in ("fifo", "zero", "dir", "nonutf8", "bigint")
    if not (a == ["--log"] and k in ("nonutf8", "bigint"))
]  # a log is read leniently: any text is a log


FAKE_BIN = ROOT / "tests" / "fakes" / "bin"


NO_FACTS = {"hf_token_set": False, "hf_offline": False, "api_key_set": False, "model_dir": None}


def facts_for(docs: dict, **more) -> dict:
    """NO_FACTS, with the HF cache the documents name as it is on this disk (a container plan checks it) and
    the model folder check_model read (plan serves only that one)."""
    return {
        **NO_FACTS,
        "hf_cache": hubcache.cache_listing(docs["validate"]["hf_cache"]["path"]),
        "model_dir": docs["check_model"].get("model_dir"),
        **more,
    }


FAKE_SERVER = ROOT / "tests" / "fakes" / "openai_server.py"


SECRET = "hf_plan_secret_5678"


PINNED = "amdih/zendnn_zentorch:vllm_v0.25.1_zentorch_v2.11.0.3_ubuntu22.04_2026_ww30"


@pytest.fixture
def rt(tmp_path):
    d = tmp_path / "rt"
    d.mkdir()
    return d, {"FAKE_RT_DIR": str(d), "PATH": f"{FAKE_BIN}:{os.environ['PATH']}"}


@pytest.fixture(scope="session")
def input_docs(tmp_path_factory):
    """The five JSON inputs, each produced once per session by the real script (validate sees the fake
    docker): the model folder and sysroot they name are shared and only read."""
    base = tmp_path_factory.mktemp("inputs")
    rt_dir = base / "rt"
    rt_dir.mkdir()
    env = {"FAKE_RT_DIR": str(rt_dir), "PATH": f"{FAKE_BIN}:{os.environ['PATH']}"}
    model = model_folder("Qwen3-0.6B", base / "models")
    genoa = sysroots.build(base / "genoa", sysroots.HOSTS["genoa_9654_2s_smt"])
    texts = {}
    for name, script, args in [
        ("detect", "detect.py", ["--sysroot", str(genoa)]),
        ("validate", "validate.py", ["--python", sys.executable, "--detect", str(base / "detect.json")]),
        ("check", "check_model.py", ["--model", str(model), "--vllm-version", "0.25.1"]),
        ("estimate", "estimate_memory.py", ["--model", str(model), "--ram-gb", "384"]),
        (
            "tune",
            "cpu_tune.py",
            ["--sysroot", str(genoa), "--socket", "1", "--weight-gb", "1.11", "--kv-needed-gb", "0.44"],
        ),
    ]:
        r = run_script(script, *args, env=env)
        assert r.code == 0, r.doc
        (base / f"{name}.json").write_text(r.stdout)
        texts[name] = r.stdout
    return model, texts


@pytest.fixture
def inputs(tmp_path, rt, input_docs):
    """The five documents as files of this test's own, naming a model folder of its own (a test may rewrite,
    move or remove either)."""
    model, texts = input_docs
    own = tmp_path / "models" / model.name
    shutil.copytree(model, own)
    out = {}
    for name, text in texts.items():
        out[name] = tmp_path / f"{name}.json"
        out[name].write_text(text.replace(json.dumps(str(model))[1:-1], json.dumps(str(own))[1:-1]))
    out["model"] = own
    return out


SCRIPT_OF = {
    "detect": "detect",
    "validate": "validate",
    "check": "check_model",
    "estimate": "estimate_memory",
    "tune": "cpu_tune",
}


def load_docs(inputs) -> dict:
    """The five documents keyed as a plan keeps them: by the script that wrote each."""
    return {SCRIPT_OF[k]: json.loads(Path(inputs[k]).read_text()) for k in SCRIPT_OF}


def plan_args(inputs, *extra):
    return ["plan", *[f"--{k}={inputs[k]}" for k in ("detect", "validate", "check", "estimate", "tune")], *extra]


def container_plan(script, inputs, rt, tmp_path, **env_extra):
    d, env = rt
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st")), env={**env, **env_extra})
    path = tmp_path / "plan.json"
    path.write_text(r.stdout)
    return path, r.doc


def calls(d):
    """What the fake runtime was asked, in order (nothing yet: no file)."""
    log = d / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


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
    vllm.write_text(
        f"#!{sys.executable}\nimport os, runpy, sys\nfrom pathlib import Path\n"
        "mode = Path(__file__).with_name('mode')\n"
        "if mode.exists():\n    os.environ['FAKE_SERVER_MODE'] = mode.read_text().strip()\n"
        f"sys.argv[0] = {str(FAKE_SERVER)!r}\nrunpy.run_path({str(FAKE_SERVER)!r}, run_name='__main__')\n"
    )
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
    docs["validate"].update(
        path="host",
        runtime="host",
        image=None,
        python=str(fake_venv(tmp_path)),
        target="localhost",
        ld_preload={"value": None, "note": None},
    )
    docs["cpu_tune"] = {k: v for k, v in live_tune.items() if k != "detect"}
    docs["detect"] = live_tune["detect"]  # one host: the five documents must agree (plan cross-checks)
    if docs["detect"].get("vendor") != "AuthenticAMD":
        # vLLM runs zentorch only on AMD CPUs, so on an Intel runner this host is served as `up --stock` does
        docs["validate"]["backend"] = "stock"
    return docs


def host_plan(tmp_path, inputs, live_tune, port=None, edit=None, **opts):
    docs = host_docs(tmp_path, inputs, live_tune, edit)
    opt = {"port": port or free_port(), "state_dir": str(tmp_path / "st-host"), **opts}
    plan = planner.build_plan(docs, opt, load_epyc(), shell.shell_facts(opt, docs))
    path = tmp_path / "plan-host.json"
    path.write_text(json.dumps(plan))
    return path, plan


def verify_keyed_server(script, tmp_path, inputs, live_tune, monkeypatch, mode: str, key: str):
    """Start a plan with an API key (from MY_API_KEY) on the fake server in `mode`, verify it, stop it:
    -> (the plan, verify's result)."""
    monkeypatch.setenv("MY_API_KEY", key)
    plan_file, plan = host_plan(tmp_path, inputs, live_tune, expose=True, plain_http=True, api_key_env="MY_API_KEY")
    try:
        server_mode(tmp_path, mode)
        assert script("launch.py", "start", "--plan", str(plan_file), "--confirm").code == 0
        return plan, script("launch.py", "verify", "--plan", str(plan_file), "--timeout", "20")
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
    max_leaves=12,
)


hub_path_values = st.sampled_from(
    [
        "",
        "/abs/hf",
        "rel",
        "~/hf",
        "~",
        "$HUBTEST_ABS",
        "$HUBTEST_TILDE",
        "$HUBTEST_REL",
        "$HUBTEST_UNSET/x",
        "${HUBTEST_ABS}/y",
        "./x",
        "~nosuchuser_zz/x",
    ]
)


def load_while(
    port: int, model: str, action, clients: int = 8, timeout: float = 20, pause: float = 0.0
) -> tuple[list, object]:
    """`clients` threads sending chats through the router (each `pause` s after its last answer) until
    `action` (run meanwhile) returns and 2 s more: -> (every request's HTTP status, what action returned)."""
    import threading
    import time

    from epyc.deployments.serve_verify import http

    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    codes, done = [], threading.Event()

    deadline = time.monotonic() + 900

    def client() -> None:
        for _ in range(200_000):  # bounded in count and time; ends with the action
            if done.is_set() or time.monotonic() > deadline:
                return
            codes.append(http("POST", f"http://127.0.0.1:{port}/v1/chat/completions", timeout, body=body)[0])
            time.sleep(pause)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    try:
        result = action()
        time.sleep(2)
    finally:
        done.set()
        for t in threads:
            t.join(30)
    return codes, result


def cert_pair(folder: Path, names=("localhost",), days=(-1, 30)) -> tuple[Path, Path]:
    """A certificate and its key made with `cryptography`, valid from days[0] to days[1] from now (a test's own
    expired or not-yet-valid one; the bundle's own pair is launch.py tls-selfsigned's)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key, now = ec.generate_private_key(ec.SECP256R1()), datetime.datetime.now(datetime.timezone.utc)
    subject = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, names[0])])
    cert = (
        x509.CertificateBuilder(subject, subject, key.public_key(), x509.random_serial_number())
        .not_valid_before(now + datetime.timedelta(days=days[0]))
        .not_valid_after(now + datetime.timedelta(days=days[1]))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return folder / "cert.pem", folder / "key.pem"
