"""Shared test helpers: run a script as a user would, check its one JSON document against its schema."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
SCHEMAS = ROOT / "data" / "schemas"
sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(Path(__file__).resolve().parent))
# the engine a user's shell names is not the tests': the fast suite's runtime is the fake docker, and the
# container e2e passes the real engine it was given (EPYC_TEST_DOCKER_HOST) by name
os.environ.pop("DOCKER_HOST", None)

import sysroots  # noqa: E402


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


def run_script(script: str, *args: str, env: dict | None = None, timeout: float = 120,
               stdin: str | None = None, check_schema: bool = True, unset: tuple[str, ...] = ()) -> Result:
    """Run `python3 scripts/NAME.py ARGS` and parse its stdout, which must be exactly one JSON document.
    `env` is laid over this environment; the variables in `unset` are taken out of it."""
    # a file, pipe or socket a script leaves unclosed is an error here (some CI shells set PYTHONWARNINGS=error;
    # the leak then printed a traceback on stderr): every run of the suite checks it
    full_env = {"PYTHONWARNINGS": "error::ResourceWarning", **os.environ, **(env or {})}
    for name in unset:
        full_env.pop(name, None)
    proc = subprocess.run([sys.executable, str(SCRIPTS / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, input=stdin, cwd=ROOT)
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
    print(f"\ne2e on {det['cpu_model']} ({det['vendor_name']}): the {backend} path, platform "
          f"{r.doc['stack']['platform']}")
    return {**r.doc, "detect": det}


@pytest.fixture(scope="session")
def models(stack):
    out = {}
    for key, shape, quant, name in (("tiny", "tiny", None, "tiny-qwen3"),
                                    ("headdim16", "headdim16", None, "headdim16-qwen3"),
                                    ("sliding", "sliding", None, "sliding-llama"),
                                    ("hybrid", "hybrid", None, "hybrid-qwen3next"),
                                    ("tiny-ct-w4", "tiny", "ct-w4", "tiny-qwen3-ct-w4")):
        res = subprocess.run([stack["python"], str(BUILDER), "--shape", shape, *(["--quant", quant] if quant else []),
                              "--out", str(CACHE / "models" / name)], capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-2000:]
        out[key] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


E2E_KV_GB = 2


def small_kv_tune(weight_gb: float, kv_needed_gb: float, env: dict | None = None):
    """cpu_tune as the chain runs it, then again with the OS reserve raised so that it grants E2E_KV_GB of
    KV cache, not the 10 GiB half of what a 24 GiB runner has left: vLLM touches every page of its cache
    at start, about 4 s a GiB on these guests (a 10 GiB start took 131 s to healthy, a 1 GiB one 46 s).
    The grant is still cpu_tune's own, and each test compares vLLM's figures with ours at whatever it is.
    The SKILL.md and README tests keep the default sizing: there the chain is the user's, unchanged."""
    args = ["--weight-gb", str(weight_gb), "--kv-needed-gb", str(kv_needed_gb)]
    first = run_script("cpu_tune.py", *args, env=env)
    assert first.code == 0, first.doc
    reserve = first.doc["socket_ram_gb"] - weight_gb - 2 * E2E_KV_GB - 0.5  # left: 2 x the grant + 0.5
    if reserve <= first.doc["os_reserve_gb"] or first.doc["kv_granted_gb"] <= E2E_KV_GB:
        return first
    return run_script("cpu_tune.py", *args, "--os-reserve-gb", f"{reserve:.2f}", env=env)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save(tmp: Path, name: str, r) -> Path:
    p = tmp / f"{name}.json"
    p.write_text(r.stdout)
    return p


def vllm_processes(model_dir: str) -> list:
    import psutil
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "serve" in cmd and model_dir in cmd:
            out.append(p)
    return out

