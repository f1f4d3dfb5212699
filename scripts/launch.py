#!/usr/bin/env python3
"""Plan, start, verify, hand off and stop one vLLM endpoint, from the other scripts' JSON.

    python3 scripts/launch.py plan --detect d.json --validate v.json --check c.json --estimate e.json \
        --tune t.json > plan.json                        # the exact command + the summary to confirm
    python3 scripts/launch.py start --plan plan.json --confirm   # only after the human said go
    python3 scripts/launch.py verify --plan plan.json            # health, model listed, one real request
    python3 scripts/launch.py handoff --plan plan.json           # connection table + examples
    python3 scripts/launch.py stop --plan plan.json              # stops exactly what start started
    python3 scripts/launch.py up [--model M] [--yes]             # the engineer's one command: all of it

Every subcommand prints one JSON document. Exit 0 on success; exit 1 with {"error", "fix"}; a failed
verify also names its phase (process | health | models | smoke) and carries the last 50 log lines.
No retries: on failure, report and stop.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import ScriptError  # noqa: E402

STATE_ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "serving-llms-on-epyc" / "run"
PULL_TIMEOUT_S = 3600
RUN_TIMEOUT_S = 300
LOG_TAIL = 50
NO_RETRY_FIX = "report this phase and the log lines to the user and stop: do not retry, do not debug"

# ---------------------------------------------------------------- pure: the command


def served_model_name(model: str) -> str:
    """The id clients send: the Hub id as is, a local folder by its name."""
    p = Path(model)
    return p.name if (model.startswith((".", "/", "~")) or p.is_dir()) else model


def needs_device_flag(vllm_version: str | None) -> bool:
    """`--device cpu` was removed from `vllm serve` in 0.20; passing it is an argparse error there."""
    parts = (vllm_version or "").split("+")[0].split(".")
    try:
        return (int(parts[0]), int(parts[1])) < (0, 20)
    except (ValueError, IndexError):
        return False


def serve_options(served: str, host: str, port: int, dtype: str, max_len: int, device_flag: bool) -> list[str]:
    opts = ["--served-model-name", served, "--host", host, "--port", str(port), "--dtype", dtype,
            "--max-model-len", str(max_len)]
    return opts + (["--device", "cpu"] if device_flag else [])


def container_run_argv(rt: list[str], name: str, run_flags: list[str], cpuset: list[str], hf_mount: str,
                       model_mount: list[str], env: dict, env_by_name: list[str], image: str,
                       serve_args: list[str]) -> list[str]:
    """`RT run -d` with values for the sizing env, and secrets by name only (`--env HF_TOKEN`): the value
    comes from the runtime CLI's own environment, so neither ps nor docker inspect shows it.

    The entrypoint is set to `vllm` explicitly, so the command is the same whatever the image declares
    (the stock image's entrypoint is `vllm serve`, the zentorch image has none)."""
    if any(f.startswith("--shm-size") for f in run_flags) and "--ipc=host" in run_flags:
        raise ScriptError("run flags combine --ipc=host with --shm-size", "use --ipc=host alone (data/epyc.json)")
    argv = [*rt, "run", "-d", "--name", name, *run_flags, *cpuset, *hf_mount.split(), *model_mount]
    for k, v in env.items():
        argv += ["--env", f"{k}={v}"]
    for k in env_by_name:
        argv += ["--env", k]
    return argv + ["--entrypoint", "vllm", image, "serve", *serve_args]


def throughput_env(flags: dict) -> dict:
    """The opt-in throughput flags, all or none: FREEZING alone crashes engine init."""
    env = dict(flags["env"])
    missing = [k for k in flags["required_together"] if k not in env]
    if missing:
        raise ScriptError(f"throughput flags incomplete: {missing}", "data/epyc.json must pair the flags")
    return env


def build_plan(inp: dict, opt: dict, epyc: dict) -> dict:
    """Everything start needs, and the summary the human confirms, from the five JSON inputs."""
    det, val, chk, est, tune = inp["detect"], inp["validate"], inp["check"], inp["estimate"], inp["tune"]
    if not val.get("ready"):
        errs = "; ".join(e["message"] for e in val.get("errors", [])) or "not ready"
        raise ScriptError(f"validate.py is not ready: {errs}", (val.get("errors") or [{}])[0].get("fix")
                          or "fix what validate.py reported, then re-run it")
    if chk.get("launchable") is False:
        raise ScriptError(f"check_model.py: {chk.get('message')}", "choose a model vLLM serves as chat/completions")
    fit = est.get("fit")
    if fit and not fit["fits"]:
        raise ScriptError(f"does not fit: required {fit['required_gb']} GiB vs {fit['ram_gb']} GiB RAM",
                          fit.get("action") or "lower --max-model-len or use a smaller model")
    model = opt.get("model") or chk.get("model_id")
    if chk.get("model_id") and model != chk["model_id"]:
        raise ScriptError(f"check_model.py ran for {chk['model_id']}, the plan is for {model}",
                          "run check_model.py and estimate_memory.py for the model you serve")
    path = val["path"]
    backend = val.get("backend") or "zentorch"
    dtype = opt.get("dtype") or epyc["precision"]["default"]
    if backend != "stock" and dtype == "float16":
        raise ScriptError("float16 is not a compute dtype of the zentorch CPU platform",
                          "use bfloat16 (default) or float32")
    max_len = int(opt.get("max_model_len") or (fit or {}).get("max_model_len")
                  or epyc["serve"]["default_max_model_len"])
    port = int(opt.get("port") or val["port"])
    expose = bool(opt.get("expose"))
    key_env = opt.get("api_key_env")
    if expose and not key_env:
        raise ScriptError("--expose serves on all interfaces: an API key is required",
                          "export a key in an env var and pass --api-key-env NAME")
    if key_env and not os.environ.get(key_env):
        raise ScriptError(f"--api-key-env {key_env}: that variable is not set", f"export {key_env}=<key> first")
    host = "0.0.0.0" if expose else epyc["serve"]["bind_host"]
    served = opt.get("served_model_name") or served_model_name(model)
    version = (val.get("stack") or {}).get("vllm")
    device = needs_device_flag(version)
    env = {"VLLM_CPU_OMP_THREADS_BIND": tune["vllm_cpu_omp_threads_bind"],
           "VLLM_CPU_KVCACHE_SPACE": str(tune["vllm_cpu_kvcache_space_gb"])}
    if opt.get("throughput_flags"):
        env.update(throughput_env(epyc["throughput_flags"]))
    if opt.get("kernel_log"):  # every zentorch matmul logs its plugin_op and kernel: kernel_proof.py reads them
        env.update({"ZENDNNL_API_LOG_LEVEL": "4", "ONEDNN_VERBOSE": "1"})
    env_by_name = (["HF_TOKEN"] if os.environ.get("HF_TOKEN") else []) + (["VLLM_API_KEY"] if key_env else [])
    name = epyc["container"]["name"]
    state_dir = Path(opt.get("state_dir") or STATE_ROOT / (name if path != "host" else f"host-{port}"))
    warnings = [w for w in (tune.get("warning"), tune.get("nps_note")) if w]
    warnings += [w["message"] for w in val.get("warnings", [])]
    opts = serve_options(served, host, port, dtype, max_len, device)
    pre: list[list[str]] = []
    if path == "host":
        vllm_bin = str(Path(val["python"]).parent / "vllm")
        if val.get("ld_preload", {}).get("value"):
            env["LD_PRELOAD"] = val["ld_preload"]["value"]
        argv = [*tune.get("conda_launch_prefix_argv", []), vllm_bin, "serve", model, *opts]
        runtime = "host"
        stop_cmd = "python3 scripts/launch.py stop --plan <plan.json>  (or: kill the recorded pid's group)"
    else:
        rt = common.runtime_argv(val["runtime"])
        image = val["image"]
        model_arg, mount = model, []
        if Path(model).expanduser().is_dir():  # a local folder goes into the container read-only
            real = os.path.realpath(Path(model).expanduser())
            model_arg = f"/models/{Path(real).name}"
            mount = ["-v", f"{real}:{model_arg}:ro"]
        argv = container_run_argv(rt, name, epyc["container"]["run_flags"], tune["container_cpuset_argv"],
                                  val["hf_cache"]["mount"], mount, env, env_by_name, image, [model_arg, *opts])
        pre = [[*rt, "rm", "-f", name], [*rt, "pull", image]]
        runtime = val["runtime"]
        stop_cmd = shlex.join([*rt, "rm", "-f", name])
    plan = {
        "path": path, "backend": backend, "platform": (val.get("stack") or {}).get("platform"),
        "runtime": runtime, "image": val.get("image"), "model": model, "served_model_name": served,
        "kind": chk.get("kind"), "primary_endpoint": chk.get("primary_endpoint") or "completions",
        "supported_endpoints": chk.get("supported_endpoints") or ["completions"],
        "chat_template_status": (chk.get("chat_template") or {}).get("status"),
        "host": host, "port": port, "base_url": f"http://127.0.0.1:{port}/v1", "expose": expose,
        "api_key_env": key_env, "dtype": dtype, "max_model_len": max_len, "vllm_version": version,
        "env": env, "env_by_name": env_by_name, "pre_argv": pre, "argv": argv,
        "command": shlex.join(argv), "container_name": name if path != "host" else None,
        "state_dir": str(state_dir), "log_file": str(state_dir / "server.log"),
        "state_file": str(state_dir / "state.json"), "stop_command": stop_cmd,
        "requires_confirmation": bool(val.get("requires_confirmation")),
        "confirmation_reasons": [c["message"] for c in val.get("confirmations", [])],
        "warnings": warnings,
        "sizing": {"socket": tune["chosen_socket"], "socket_choice_reason": tune["socket_choice_reason"],
                   "omp_threads_bind": tune["vllm_cpu_omp_threads_bind"], "omp_threads": tune.get("omp_threads"),
                   "kv_cache_gb": tune["vllm_cpu_kvcache_space_gb"], "numa_nodes": tune["numa_nodes_on_socket"],
                   "max_model_len": max_len},
    }
    plan["summary"] = summary_rows(plan, det, fit)
    plan["summary_markdown"] = markdown_table(["Field", "Value"], plan["summary"])
    return plan


def summary_rows(plan: dict, det: dict, fit: dict | None) -> list[list[str]]:
    platform = (plan.get("platform") or "platform not probed").rsplit(".", 1)[-1]
    backend = (f"stock vLLM CPU ({platform}), no zentorch: unaccelerated" if plan["backend"] == "stock"
               else "zentorch-accelerated (ZenCpuPlatform)")
    where = ("host venv (" + next(a for a in plan["argv"] if a.endswith("/vllm")) + ")" if plan["path"] == "host"
             else f"container ({plan['runtime']}, {plan['image']})")
    s = plan["sizing"]
    rows = [
        ["Model / kind", f"{plan['model']} -- {plan['kind']}, endpoint {plan['primary_endpoint']}"],
        ["Backend", backend],
        ["Path", where],
        ["Precision", plan["dtype"]],
        ["Fit", f"required {fit['required_gb']} GiB vs {fit['ram_gb']} GiB RAM" if fit else "not estimated"],
        ["CPU sizing", f"socket {s['socket']} ({s['socket_choice_reason']}), bind {s['omp_threads_bind']}, "
                       f"KV {s['kv_cache_gb']} GiB (socket-local), memory on nodes "
                       f"{','.join(map(str, s['numa_nodes']))}"],
        ["Hardware", (f"EPYC {det.get('epyc_generation')} ({det.get('zen_arch')})" if det.get("is_amd_epyc")
                      else f"{det.get('cpu_model')} (not an AMD EPYC)")
                     + f", {det.get('physical_cores')} cores, AVX-512 {det.get('avx512')}"],
        ["Port", f"{plan['port']} on {plan['host']}" + (" (exposed, API key required)" if plan["expose"] else "")],
    ]
    for w in plan["warnings"]:
        rows.append(["Warning", w])
    for c in plan["confirmation_reasons"]:
        rows.append(["Needs your OK", c])
    return rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------- pure: judging the server

def smoke_request(endpoint: str, served: str) -> tuple[str, dict]:
    """The one deterministic request verify sends on the primary endpoint."""
    if endpoint == "chat_completions":
        return "/v1/chat/completions", {"model": served, "messages": [{"role": "user", "content": "hi"}],
                                        "max_tokens": 16, "temperature": 0}
    return "/v1/completions", {"model": served, "prompt": "Hello, world", "max_tokens": 16, "temperature": 0}


def judge_smoke(status: int, body: str, endpoint: str) -> tuple[bool, str]:
    """A 200 is not enough: the body must be a completion with a non-error, non-empty first choice."""
    try:
        doc = json.loads(body)
    except json.JSONDecodeError:
        return False, f"HTTP {status}, body is not JSON: {body[:200]!r}"
    if status != 200:
        return False, f"HTTP {status}: {json.dumps(doc)[:300]}"
    if not isinstance(doc, dict) or "error" in doc or doc.get("object") == "error":
        return False, f"HTTP 200 carrying an error: {json.dumps(doc)[:300]}"
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices:
        return False, "no choices in the response"
    first = choices[0]
    text = (first.get("message") or {}).get("content") if endpoint == "chat_completions" else first.get("text")
    if not isinstance(text, str):
        return False, f"choices[0] has no {'message.content' if endpoint == 'chat_completions' else 'text'}"
    if not doc.get("usage", {}).get("completion_tokens"):
        return False, "the server generated no tokens"
    return True, text


def handoff_doc(plan: dict, served: str | None = None) -> dict:
    served = served or plan["served_model_name"]
    endpoint = plan["primary_endpoint"]
    path = "/v1/chat/completions" if endpoint == "chat_completions" else "/v1/completions"
    why = ("a chat template is present" if endpoint == "chat_completions"
           else "no usable chat template: raw prompts")
    base = plan["base_url"]
    auth = f" -H \"Authorization: Bearer ${plan['api_key_env']}\"" if plan.get("api_key_env") else ""
    key = f"os.environ[{plan['api_key_env']!r}]" if plan.get("api_key_env") else '"EMPTY"'
    if endpoint == "chat_completions":
        body = {"model": served, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 128,
                "temperature": 0.7}
        py_call = ("r = client.chat.completions.create(model=model, messages=[{\"role\": \"user\", \"content\": "
                   "\"Hello\"}], max_tokens=128, temperature=0.7)\nprint(r.choices[0].message.content)")
    else:
        body = {"model": served, "prompt": "Hello, world", "max_tokens": 128, "temperature": 0.7}
        py_call = ("r = client.completions.create(model=model, prompt=\"Hello, world\", max_tokens=128)\n"
                   "print(r.choices[0].text)")
    curl = (f"curl -s {base}{path[3:]} -H 'Content-Type: application/json'{auth} \\\n  -d "
            + shlex.quote(json.dumps(body)))
    python = ("import os\nfrom openai import OpenAI\n\n"
              f"client = OpenAI(base_url=\"{base}\", api_key={key})\n"
              "model = client.models.list().data[0].id\n" + py_call)
    s = plan["sizing"]
    rows = [["Base URL", f"{base} (the trailing /v1 matters)"], ["Served model", served],
            ["Endpoint", path], ["Why", why], ["Runtime / port", f"{plan['runtime']} / {plan['port']}"],
            ["Sizing", f"{s['omp_threads']} OMP threads ({s['omp_threads_bind']}), KV {s['kv_cache_gb']} GiB, "
                       f"--max-model-len {s['max_model_len']}, socket {s['socket']}, NUMA "
                       f"{','.join(map(str, s['numa_nodes']))}"],
            ["Stop", plan["stop_command"]]]
    return {"base_url": base, "served_model": served, "endpoint": path, "why": why, "runtime": plan["runtime"],
            "port": plan["port"], "sizing": s, "stop_command": plan["stop_command"], "curl_example": curl,
            "python_example": python, "table_markdown": markdown_table(["Field", "Value"], rows),
            "guidance": ["max_tokens caps the output; prompt tokens + max_tokens must stay <= --max-model-len "
                         f"({s['max_model_len']})",
                         "temperature 0 is greedy; tune temperature or top_p, not both",
                         "stream: true streams tokens (server-sent events)",
                         "the model's generation_config.json may set sampling defaults; pass explicit values"]}


# ---------------------------------------------------------------- I/O: state, process, HTTP

def load_plan(path: str) -> dict:
    plan = common.read_json_input(path, "plan")
    for key in ("path", "argv", "port", "state_file", "served_model_name"):
        if key not in plan:
            raise ScriptError(f"{path} is not a launch plan (no {key!r})", "pass the output of launch.py plan")
    return plan


def read_state(plan: dict) -> dict | None:
    try:
        return json.loads(Path(plan["state_file"]).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_state(plan: dict, state: dict) -> None:
    Path(plan["state_dir"]).mkdir(parents=True, exist_ok=True)
    Path(plan["state_file"]).write_text(json.dumps(state, indent=2) + "\n")


def process_alive(state: dict) -> bool:
    import psutil
    try:
        proc = psutil.Process(state["pid"])
        return proc.create_time() == state["create_time"] and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, KeyError):
        return False


def container_running(runtime: str, name: str) -> bool:
    res = common.run([*common.runtime_argv(runtime), "inspect", "-f", "{{.State.Running}}", name], timeout=30)
    return res.ok and res.stdout.strip() == "true"


def alive(plan: dict, state: dict) -> bool:
    return process_alive(state) if plan["path"] == "host" else container_running(plan["runtime"], plan["container_name"])


def log_tail(plan: dict, n: int = LOG_TAIL) -> list[str]:
    if plan["path"] == "host":
        try:
            lines = Path(plan["log_file"]).read_text(errors="replace").splitlines()
        except OSError:
            return []
        return lines[-n:]
    res = common.run([*common.runtime_argv(plan["runtime"]), "logs", "--tail", str(n), plan["container_name"]], timeout=30)
    return (res.stdout + res.stderr).splitlines()[-n:]


def secret_env(plan: dict) -> dict:
    """Values for the names passed to the server: read from our own environment, never written down."""
    env = {}
    if plan.get("api_key_env"):
        env["VLLM_API_KEY"] = os.environ.get(plan["api_key_env"], "")
    return env


def auth_headers(plan: dict) -> dict:
    key = os.environ.get(plan["api_key_env"]) if plan.get("api_key_env") else None
    return {"Authorization": f"Bearer {key}"} if key else {}


def port_in_use(port: int) -> bool:
    import validate
    return not validate.port_is_free(port)


def start(plan: dict, confirm: bool) -> dict:
    if not confirm:
        raise ScriptError("start needs --confirm: the human must approve the plan first",
                          "show summary_markdown from the plan, wait for a clear go, then pass --confirm")
    state = read_state(plan)
    if state and alive(plan, state):
        raise ScriptError(f"a server from this plan is already running ({plan['state_file']})",
                          "python3 scripts/launch.py stop --plan <plan.json> first")
    if port_in_use(plan["port"]):
        raise ScriptError(f"port {plan['port']} is already in use", "re-run validate.py (it picks a free port) "
                          "and plan again; with --network=host a busy port cannot be remapped", phase="start")
    Path(plan["state_dir"]).mkdir(parents=True, exist_ok=True)
    warnings: list[str] = []
    if plan["path"] == "host":
        env = {**os.environ, **plan["env"], **secret_env(plan)}
        log = open(plan["log_file"], "ab")
        proc = subprocess.Popen(plan["argv"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
        import psutil
        state = {"path": "host", "pid": proc.pid, "pgid": proc.pid, "create_time": psutil.Process(proc.pid).create_time(),
                 "log_file": plan["log_file"], "started_at": time.time()}
    else:
        rm, pull = plan["pre_argv"]
        common.run(rm, timeout=60)  # a leftover container of the same name would block `run`
        common.log(f"start: pulling {plan['image']}")
        res = common.run(pull, timeout=PULL_TIMEOUT_S)
        if not res.ok:
            raise ScriptError(f"pull failed: {(res.stderr.strip() or res.failure or '')[-300:]}",
                              "check registry access and the image name in data/epyc.json", phase="pull")
        env = {**os.environ, **secret_env(plan)}
        argv = plan["argv"]
        res = common.run(argv, timeout=RUN_TIMEOUT_S, env=env)
        if not res.ok and plan["runtime"] == "podman" and "cpuset" in res.stderr.lower():
            argv = [a for a in argv if not a.startswith(("--cpuset-cpus=", "--cpuset-mems="))]
            warnings.append("rootless podman rejected --cpuset-cpus/--cpuset-mems (no cpuset delegation): "
                            "started without them; thread binding still applies via VLLM_CPU_OMP_THREADS_BIND")
            common.run(plan["pre_argv"][0], timeout=60)
            res = common.run(argv, timeout=RUN_TIMEOUT_S, env=env)
        if not res.ok:
            raise ScriptError(f"{plan['runtime']} run failed: {(res.stderr.strip() or res.failure or '')[-400:]}",
                              NO_RETRY_FIX, phase="start")
        state = {"path": plan["path"], "runtime": plan["runtime"], "container_name": plan["container_name"],
                 "container_id": res.stdout.strip()[:64], "started_at": time.time(), "argv": argv}
    write_state(plan, state)
    return {"started": True, **state, "warnings": warnings}


def http(method: str, url: str, timeout: float, headers: dict | None = None, body: dict | None = None):
    """(status, text) or (None, reason): every request has a deadline."""
    import requests
    try:
        r = requests.request(method, url, json=body, headers=headers or {}, timeout=timeout)
        return r.status_code, r.text
    except requests.RequestException as exc:
        return None, f"{type(exc).__name__}: {exc}"


def failed(plan: dict, phase: str, reason: str, t0: float) -> ScriptError:
    return ScriptError(f"FAILED in phase {phase}: {reason}", NO_RETRY_FIX, ok=False, phase=phase,
                       elapsed_s=round(time.monotonic() - t0, 1), log_tail=log_tail(plan))


def verify(plan: dict, timeout: float, smoke_timeout: float) -> dict:
    state = read_state(plan)
    t0 = time.monotonic()
    if state is None:
        raise failed(plan, "process", "nothing was started from this plan (no state file)", t0)
    base = f"http://127.0.0.1:{plan['port']}"
    headers = auth_headers(plan)
    last_note = 0.0
    healthy_after = None
    while healthy_after is None:
        elapsed = time.monotonic() - t0
        if not alive(plan, state):
            raise failed(plan, "process", "the server process exited before it became healthy", t0)
        status, _ = http("GET", base + "/health", 5, headers)
        if status == 200:
            healthy_after = round(elapsed, 1)
            break
        if elapsed > timeout:
            raise failed(plan, "health", f"not healthy after {timeout:g}s (last: {status or 'no answer'})", t0)
        if elapsed - last_note >= 10:
            common.log(f"verify: health: waiting ({elapsed:.0f}s elapsed, last {status or 'no answer'})")
            last_note = elapsed
        time.sleep(2)
    common.log(f"verify: healthy after {healthy_after}s")
    status, text = http("GET", base + "/v1/models", 30, headers)
    try:
        ids = [m["id"] for m in json.loads(text)["data"]] if status == 200 else []
    except (ValueError, KeyError, TypeError):
        ids = []
    if plan["served_model_name"] not in ids:
        raise failed(plan, "models", f"/v1/models does not list {plan['served_model_name']!r} "
                                     f"(HTTP {status}, ids {ids})", t0)
    path, body = smoke_request(plan["primary_endpoint"], plan["served_model_name"])
    s0 = time.monotonic()
    status, text = http("POST", base + path, smoke_timeout, headers, body)
    smoke_s = round(time.monotonic() - s0, 2)
    ok, detail = judge_smoke(status, text, plan["primary_endpoint"]) if status else (False, text)
    if not ok:
        raise failed(plan, "smoke", f"{path}: {detail}", t0)
    time.sleep(1)  # a server can answer and then die on that same request
    if not alive(plan, state) or http("GET", base + "/health", 5, headers)[0] != 200:
        raise failed(plan, "smoke", "the server died after its first request", t0)
    return {"ok": True, "phase": "done", "served_model": plan["served_model_name"], "models": ids,
            "time_to_healthy_s": healthy_after, "smoke": {"endpoint": path, "output": detail, "seconds": smoke_s},
            "base_url": plan["base_url"]}


def stop(plan: dict) -> dict:
    state = read_state(plan)
    if plan["path"] != "host":
        res = common.run([*common.runtime_argv(plan["runtime"]), "rm", "-f", plan["container_name"]], timeout=120)
        Path(plan["state_file"]).unlink(missing_ok=True)
        return {"stopped": res.ok, "container_name": plan["container_name"],
                "detail": (res.stdout or res.stderr).strip()[:200]}
    if state is None or not process_alive(state):
        Path(plan["state_file"]).unlink(missing_ok=True)
        return {"stopped": False, "reason": "not running"}
    import psutil
    group = [psutil.Process(state["pid"])] + psutil.Process(state["pid"]).children(recursive=True)
    try:
        os.killpg(state["pgid"], signal.SIGTERM)  # our own session: the server and its workers, nothing else
    except ProcessLookupError:
        pass
    _, left = psutil.wait_procs(group, timeout=30)
    for p in left:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(left, timeout=10)
    Path(plan["state_file"]).unlink(missing_ok=True)
    return {"stopped": True, "pid": state["pid"], "processes": len(group), "killed_after_timeout": len(left)}


# ---------------------------------------------------------------- up: the whole chain

def step(script: str, args: list[str], phase: str, run_dir: Path, allow_fail: bool = False) -> dict:
    """Run one of the bundle's scripts (its progress lines pass through to stderr), keep its JSON in the
    run folder, and stop on failure unless the caller wants to look at a failed verdict itself."""
    common.log(f"up: {phase}")
    res = common.run([sys.executable, str(Path(__file__).parent / script), *args], timeout=3600,
                     stderr_through=True)
    try:
        doc = json.loads(res.stdout)
    except json.JSONDecodeError:
        raise ScriptError(f"FAILED in phase {phase}: {script} printed no JSON ({res.failure or res.returncode})",
                          NO_RETRY_FIX, phase=phase)
    (run_dir / f"{phase}.json").write_text(json.dumps(doc, indent=2) + "\n")
    if res.returncode != 0 and not allow_fail:
        raise phase_failed(phase, doc)
    return doc


def phase_failed(phase: str, doc: dict) -> ScriptError:
    errors = doc.get("errors") or []
    msg = (doc.get("error") or "; ".join(e["message"] for e in errors) or doc.get("message")
           or (doc.get("fit") or {}).get("action") or "failed")
    fix = doc.get("fix") or next((e["fix"] for e in errors if e.get("fix")), None) or NO_RETRY_FIX
    return ScriptError(f"FAILED in phase {phase}: {msg}", fix, phase=phase, result=doc)


def ask(question: str) -> bool:
    """A yes/no question on the terminal (never on stdout, which carries the JSON)."""
    try:
        tty = open("/dev/tty", "r+")
    except OSError:
        raise ScriptError("confirmation needed and there is no terminal", "re-run with --yes once you have read "
                          "the question (the plan: python3 scripts/launch.py plan ...)")
    with tty:
        tty.write(question + " [y/N] ")
        tty.flush()
        return tty.readline().strip().lower() in ("y", "yes")


def only_runtime_missing(val: dict) -> bool:
    """validate said no because nothing can run vLLM yet -- the one gap `up` may fill itself."""
    errors = val.get("errors") or []
    return bool(errors) and all(e["check"] == "runtime" for e in errors)


def setup_question(epyc: dict, stock: bool) -> str:
    hs = epyc["host_stack"]
    pins = hs["stock"]["pip"] if stock else hs["pip"]
    import setup_host_stack
    return (f"No container runtime and no host stack. Build the host venv now?\n"
            f"  what:  pip install {' '.join(pins)} into {setup_host_stack.default_venv(hs, stock)}\n"
            f"  time:  about {hs['install_estimate_s']} s, a few GB of wheels (run once, reused after)")


def up(a, epyc: dict) -> dict:
    run_dir = Path(a.state_dir or STATE_ROOT / "up")
    run_dir.mkdir(parents=True, exist_ok=True)
    model = a.model or epyc["default_model"]
    import detect
    det = step("detect.py", [], "detect", run_dir)
    route = detect.route_host(det, epyc["supported_generations"], stock=a.stock)
    if route["route"] in ("stop", "stock_offer"):
        raise ScriptError(f"FAILED in phase detect: {route['reason']}", route["fix"], phase="detect",
                          route=route["route"], started=False)
    vargs = ["--detect", str(run_dir / "detect.json")] + (["--stock"] if a.stock else [])
    val = step("validate.py", vargs + (["--python", a.python] if a.python else []), "validate", run_dir,
               allow_fail=True)
    if not val.get("ready") and only_runtime_missing(val) and not a.python:
        if not (a.yes or ask(setup_question(epyc, a.stock))):
            raise ScriptError("FAILED in phase validate: no runtime, and building the host stack was declined",
                              "build it (python3 scripts/setup_host_stack.py" + (" --stock" if a.stock else "")
                              + ") or make docker usable, then run up again", phase="validate")
        setup = step("setup_host_stack.py", ["--stock"] if a.stock else [], "setup_host_stack", run_dir)
        val = step("validate.py", vargs + ["--python", setup["python"]], "validate", run_dir, allow_fail=True)
    if not val.get("ready"):
        raise phase_failed("validate", val)
    vllm_version = (val.get("stack") or {}).get("vllm") or epyc["vllm_version"]
    cargs = ["--model-id", model, "--vllm-version", vllm_version]
    cargs += ["--python", val["python"]] if val.get("python") else (["--image", val["image"], "--runtime",
                                                                   val["runtime"]] if val.get("image") else [])
    chk = step("check_model.py", cargs, "check_model", run_dir)
    max_len = str(a.max_model_len or epyc["serve"]["default_max_model_len"])
    est = step("estimate_memory.py", ["--model-id", model, "--ram-gb", str(det["memory_gb"]), "--max-model-len",
                                      max_len, "--num-prompts", str(a.num_prompts)], "estimate_memory", run_dir)
    tune = step("cpu_tune.py", ["--weights-gb", str(est["weight_gb"]), "--kv-gb-needed",
                                str(est["fit"]["kv_cache_gb"])], "cpu_tune", run_dir)
    plan = build_plan({"detect": det, "validate": val, "check": chk, "estimate": est, "tune": tune},
                      {"model": model, "port": a.port, "max_model_len": est["fit"]["max_model_len"],
                       "expose": a.expose, "api_key_env": a.api_key_env, "throughput_flags": a.throughput_flags,
                       "kernel_log": a.kernel_log,
                       "dtype": a.dtype, "state_dir": str(run_dir)}, epyc)
    plan_file = run_dir / "plan.json"
    plan_file.write_text(json.dumps(plan, indent=2) + "\n")
    common.log(plan["summary_markdown"])
    if not a.yes and not ask(plan["summary_markdown"] + "\n\nLaunch this?"):
        raise ScriptError("not launched: the plan was declined", f"change what you want and run up again; the plan "
                          f"is in {plan_file}", phase="confirm", plan_file=str(plan_file), started=False)
    started = start(plan, confirm=True)
    try:
        result = verify(plan, a.timeout, epyc["serve"]["smoke_timeout_s"])
    except ScriptError as exc:  # up started it, so up stops it: a failed endpoint is not left running
        stopped = stop(plan)
        exc.extra.update(plan_file=str(plan_file), stopped=stopped)
        raise
    return {"ok": True, "phase": "done", "plan_file": str(plan_file), "started": started,
            "verify": result, "handoff": handoff_doc(plan, result["served_model"]),
            "stop_command": shlex.join([sys.executable, str(Path(__file__).resolve()), "stop", "--plan",
                                        str(plan_file)])}


# ---------------------------------------------------------------- CLI

def main(argv: Sequence[str] | None = None):
    epyc = common.load_epyc()
    p = common.JsonArgumentParser(prog="scripts/launch.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=common.JsonArgumentParser)
    pl = sub.add_parser("plan", help="render the exact command and the summary to confirm")
    for name in ("detect", "validate", "check", "estimate", "tune"):
        pl.add_argument(f"--{name}", required=True, help=f"{name} JSON file ('-' for stdin)")
    pl.add_argument("--model", help="model to serve (default: the one check_model.py checked)")
    pl.add_argument("--port", type=int)
    pl.add_argument("--max-model-len", type=int)
    pl.add_argument("--served-model-name")
    pl.add_argument("--state-dir", help="where start keeps its log and state")
    pl.add_argument("--dtype", choices=epyc["precision"]["supported"])
    pl.add_argument("--expose", action="store_true", help="listen on all interfaces (needs --api-key-env)")
    pl.add_argument("--api-key-env", help="name of the env var holding the API key (its value is never shown)")
    pl.add_argument("--throughput-flags", action="store_true",
                    help="opt in to TORCHINDUCTOR_FREEZING=1 + VLLM_USE_AOT_COMPILE=0 (+ weight prepack)")
    pl.add_argument("--kernel-log", action="store_true",
                    help="log every zentorch/oneDNN kernel call, for kernel_proof.py (verbose: not for production)")
    for name in ("start", "verify", "handoff", "stop"):
        sp = sub.add_parser(name)
        sp.add_argument("--plan", required=True, help="the plan JSON file")
        if name == "start":
            sp.add_argument("--confirm", action="store_true", help="the human approved the plan")
        if name == "verify":
            sp.add_argument("--timeout", type=float, default=epyc["serve"]["health_timeout_s"])
    u = sub.add_parser("up", help="detect -> validate -> check -> estimate -> tune -> plan -> confirm -> start "
                                  "-> verify -> handoff")
    u.add_argument("--model", help=f"default: {epyc['default_model']}")
    u.add_argument("--port", type=int)
    u.add_argument("--max-model-len", type=int)
    u.add_argument("--num-prompts", type=int, default=1)
    u.add_argument("--python", help="host-path interpreter (default: the setup_host_stack.py venv if present)")
    u.add_argument("--stock", action="store_true", help="the stock vLLM CPU path (no zentorch): only on an explicit "
                   "request, e.g. a pre-Zen4 EPYC, or a CPU that is not an EPYC")
    u.add_argument("--dtype", choices=epyc["precision"]["supported"])
    u.add_argument("--expose", action="store_true")
    u.add_argument("--api-key-env")
    u.add_argument("--throughput-flags", action="store_true")
    u.add_argument("--kernel-log", action="store_true")
    u.add_argument("--yes", action="store_true", help="skip the terminal confirmation")
    u.add_argument("--timeout", type=float, default=epyc["serve"]["health_timeout_s"])
    u.add_argument("--state-dir")
    a = p.parse_args(argv)

    if a.cmd == "plan":
        stdin_uses = [n for n in ("detect", "validate", "check", "estimate", "tune") if getattr(a, n) == "-"]
        if len(stdin_uses) > 1:
            raise ScriptError("only one input can come from stdin", "save the others to files")
        names = {"detect": "detect", "validate": "validate", "check": "check_model", "estimate": "estimate_memory",
                 "tune": "cpu_tune"}
        inputs = {k: common.read_json_input(getattr(a, k), v) for k, v in names.items()}
        opts = {k: getattr(a, k) for k in ("model", "port", "max_model_len", "served_model_name", "state_dir",
                                           "dtype", "expose", "api_key_env", "throughput_flags", "kernel_log")}
        return build_plan(inputs, opts, epyc), common.EXIT_OK
    if a.cmd == "up":
        return up(a, epyc), common.EXIT_OK
    plan = load_plan(a.plan)
    if a.cmd == "start":
        return start(plan, a.confirm), common.EXIT_OK
    if a.cmd == "verify":
        return verify(plan, a.timeout, epyc["serve"]["smoke_timeout_s"]), common.EXIT_OK
    if a.cmd == "handoff":
        return handoff_doc(plan), common.EXIT_OK
    return stop(plan), common.EXIT_OK


if __name__ == "__main__":
    sys.exit(common.run_main(main))
