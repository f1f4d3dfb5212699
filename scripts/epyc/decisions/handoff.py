"""What the user is shown: the plan's summary table, the smoke request and the handoff."""

from __future__ import annotations

import json
import shlex

from epyc.decisions import forecast
from epyc.decisions.command import INHERITED_ENV, runtime_stop_pair
from epyc.errors import ScriptError
from epyc.facts import runtimes
from epyc.masking import redact


def model_cell(plan: dict) -> str:
    endpoint = plan["primary_endpoint"]
    if endpoint == "unknown":
        endpoint = "unknown until verify settles it (chat first, then completions)"
    revision = f" at revision {plan['revision']}" if plan.get("revision") else ""
    return f"{plan['model']}{revision} -- {plan['model_kind']}, endpoint {endpoint}"


def backend_cell(plan: dict) -> str:
    platform = (plan.get("platform") or "platform not probed").rsplit(".", 1)[-1]
    if plan["backend"] == "stock":
        return f"stock vLLM CPU ({platform}), no zentorch: unaccelerated"
    return "zentorch-accelerated (ZenCpuPlatform)"


def path_cell(plan: dict) -> str:
    """Where it runs, on which stack (data/epyc.json `stacks`), and why that one when the plan chose it."""
    s = plan.get("stack") or {}
    pins = f" + zentorch {s.get('zentorch')}" * bool(s.get("zentorch"))
    pins = f"; {s.get('label')}: vLLM {s.get('vllm')}{pins}" * bool(s)
    pins += f". {s.get('why')}; set it up first: {s.get('setup')}" * bool(s.get("why"))
    pins += f". Not known to run {', '.join(s.get('unverified') or ())}: verify will show" * bool(s.get("unverified"))
    if plan["path"] == "host":
        return "host venv (" + next(a for a in plan["argv"] if a.endswith("/vllm")) + pins + ")"
    engine = f", on the engine at {plan['engine']}" if plan.get("engine") else ""
    return f"container ({plan['runtime']}, {plan['image']}{engine}{pins})"


def precision_cell(plan: dict) -> str:
    q = plan.get("quantization")
    if not q:
        return plan["dtype"]
    kernel = q["kernel"] or "a kernel vLLM picks at load (unknown to this skill)"
    return f"{plan['dtype']} activations; weights {q['method']} {q['bits'] or '?'}-bit, run by {kernel}"


def kv_cell(s: dict) -> str:
    """What the KV grant holds: tokens and full-length requests, or requests alone for a recurrent model."""
    if s.get("kv_tokens") is not None and s.get("kv_full_length_requests") is not None:
        batched = f", --max-num-batched-tokens {s['max_num_batched_tokens']}" if s.get("max_num_batched_tokens") else ""
        return (
            f"holds {s['kv_tokens']:,} tokens = {s['kv_full_length_requests']} requests of "
            f"{s['max_model_len']} tokens at once; --max-num-seqs {s['max_num_seqs']}{batched}"
        )
    if s.get("kv_full_length_requests") is not None:
        return (
            f"holds {s['kv_full_length_requests']} requests at once (a recurrent state per sequence, no "
            f"per-token KV); --max-num-seqs {s['max_num_seqs']}"
        )
    return "capacity not computed (max_model_len differs from the estimate's)"


def hardware_cell(det: dict, sizing: dict) -> str:
    """The CPU, and the cores of the socket that serves (the host's total only beside it)."""
    cpu = f"{det.get('cpu_model')} (not an AMD EPYC)"
    if det.get("is_amd_epyc"):
        cpu = f"EPYC {det.get('epyc_generation')} ({det.get('zen_arch')})"
    sockets = det.get("socket_count") or 1
    where = f"socket {sizing['socket']}" if sizing["tensor_parallel_size"] == 1 else f"{len(sizing['ranks'])} ranks"
    cores = f"{sizing['omp_threads']} cores on {where}" + (
        f" (host: {sockets} sockets, {det.get('physical_cores')} cores)" if sockets > 1 else ""
    )
    return f"{cpu}, {cores}, AVX-512 {'yes' if det.get('avx512') else 'no'}"


def sizing_cell(s: dict) -> str:
    """One socket and its bind, or the tensor-parallel ranks: each one's node and cores, its KV."""
    if s["tensor_parallel_size"] == 1:
        return (
            f"socket {s['socket']} ({s['socket_choice_reason']}), bind {s['vllm_cpu_omp_threads_bind']}, "
            f"KV {s['kv_granted_gb']} GiB (socket-local), memory on nodes {','.join(map(str, s['numa_nodes']))}"
        )
    ranks = "; ".join(
        f"rank {r['rank']}: node {r['numa_node']} (socket {r['socket']}), cores {r['cpus']}" for r in s["ranks"]
    )
    return (
        f"one engine, tensor parallel over {s['tensor_parallel_size']} ranks ({s['socket_choice_reason']}); {ranks}; "
        f"KV {s['kv_granted_gb']} GiB per rank, each in its own node's memory"
    )


def pinning_cell(plan: dict) -> str:
    if plan["path"] != "host":
        return "--cpuset-* flags in the command"
    pin = plan["argv"][: plan["argv"].index(next(a for a in plan["argv"] if a.endswith("/vllm")))]
    return shlex.join(pin) if pin else "none (numactl/taskset not found)"


def environment_cell(plan: dict) -> str:
    env = ", ".join(f"{k}={v}" for k, v in plan["env"].items())
    env += "".join(f", {k} (from ${src}, value not shown)" for k, src in plan["secrets"].items())
    if plan["path"] == "host":
        inherited = ", ".join(n for n in INHERITED_ENV if n.isupper() and "PROXY" not in n)
        env += f"; from this shell only {inherited}, LC_* and the proxy variables"
    return env


def fit_cell(fit: dict | None, plan: dict) -> str:
    """The fit against the RAM estimate_memory was given, and the serving socket's own when that differs."""
    if not fit:
        return "not estimated"
    socket_ram = (plan.get("inputs") or {}).get("cpu_tune", {}).get("socket_ram_gb")
    cell = f"required {fit['required_gb']} GiB vs {fit['ram_gb']} GiB RAM"
    if socket_ram is not None and abs(socket_ram - fit["ram_gb"]) > 0.01:
        where = "the serving socket" if plan["sizing"]["tensor_parallel_size"] == 1 else "each rank's node"
        cell += f"; {where} holds {socket_ram} GiB"
    return cell


def tls_cell(tls: dict | None) -> str:  # what protects the exposed endpoint: this pair, or nothing (--plain-http)
    if not tls:
        return "none (--plain-http): the API key and every prompt and answer cross the network in clear; a trusted network only"
    return f"{tls['cert']} (key {tls['key']}) for {tls['name']}; clients trust {tls['ca'] or 'the system CAs'}"


def summary_rows(plan: dict, det: dict, fit: dict | None) -> list[list[str]]:
    """The table the human confirms: every row a fact of the plan, the exact command among them."""
    s = plan["sizing"]
    rows = [
        ["Model / kind", model_cell(plan)],
        ["Backend", backend_cell(plan)],
        ["Path", path_cell(plan)],
        ["Precision", precision_cell(plan)],
        ["Fit", fit_cell(fit, plan)],
        ["CPU sizing", sizing_cell(s)],
        ["KV cache", f"{kv_cell(s)}; granted as {s['kv_basis']}"],
        ["Forecast", forecast.summary_text(plan["forecast"])],
    ]
    if s["sizing_rule"] != "skill":
        rows.append(["Sizing rule", f"{s['sizing_rule']} (a comparison baseline, not the skill's sizing)"])
    port = f"{plan['port']} on {plan['host']}" + (" (exposed, API key required)" if plan["expose"] else "")
    rows += [
        ["Hardware", hardware_cell(det, s)],
        ["Port", port],
        *([["TLS", tls_cell(plan.get("tls"))]] if plan["expose"] or plan.get("tls") else []),
        ["Pinning", pinning_cell(plan)],
        ["Environment", environment_cell(plan)],
        ["Command (exactly what start runs)", plan["command"]],
    ]
    if plan["deferred"]:
        cell = (
            f"{plan['target']} -- not this machine: {', '.join(plan['deferred'])} are assumed; on the host, from "
            "a copy of the bundle, the line 'On the host' plans it from the host itself: confirm this summary there"
        )
        if plan.get("api_key_env"):
            cell += (
                f"; the key in ${plan['api_key_env']} reaches the server only through launch.py start there "
                "(or up; this command pasted alone would serve without it)"
            )
        rows += [["Planned for", cell], ["On the host", plan["on_host_command"]]]
    rows += [["Warning", w["message"]] for w in plan["warnings"]]
    rows += [["Needs your OK", c] for c in plan["confirmation_reasons"]]
    return rows


def table_cell(value: object) -> str:
    """One cell on one line: `|` and every unprintable escaped (a newline, ESC or bidi override would forge the row)."""
    text = str(value).replace("|", "\\|")
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(table_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def smoke_request(endpoint: str, served: str, hello: str = "hi", limits: dict | None = None) -> tuple[str, dict]:
    """The one deterministic request verify sends on the primary endpoint (the handoff's example: another hello)."""
    limits = limits or {"max_tokens": 16, "temperature": 0}
    if endpoint == "chat_completions":
        return "/v1/chat/completions", {"model": served, "messages": [{"role": "user", "content": hello}], **limits}
    return "/v1/completions", {"model": served, "prompt": "Hello, world", **limits}


def judge_smoke(status: int, body: str, endpoint: str, secrets: list[str] = ()) -> tuple[bool, str]:
    """A 200 is not enough: the body must be a completion with a non-error, non-empty first choice (text redacted)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):  # ValueError: not JSON, or an integer past Python's 4300 digits
        return False, f"HTTP {status}, body is not JSON: {redact(body, secrets)!r}"
    if status != 200:
        return False, f"HTTP {status}: {redact(json.dumps(doc), secrets)}"
    if not isinstance(doc, dict) or "error" in doc or doc.get("object") == "error":
        return False, f"HTTP 200 carrying an error: {redact(json.dumps(doc), secrets)}"
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices:
        return False, "no choices in the response"
    first = choices[0]
    if not isinstance(first, dict):
        return False, "choices[0] is not an object"
    chat = endpoint == "chat_completions"
    message = first.get("message") if chat else None
    text = (message.get("content") if isinstance(message, dict) else None) if chat else first.get("text")
    if not isinstance(text, str):
        return False, f"choices[0] has no {'message.content' if chat else 'text'}"
    usage = doc.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens <= 0:  # true is not a count
        return False, "the server generated no tokens (usage.completion_tokens missing or 0)"
    return True, redact(text, secrets)


def examples(endpoint: str, base: str, served: str, key_env: str | None, ca: str | None = None) -> tuple[str, str, str]:
    """The endpoint's path, a curl line and an OpenAI-client snippet for it (trusting `ca`); the key by its name only."""
    key = f"os.environ[{key_env!r}]" if key_env else '"EMPTY"'
    path, body = smoke_request(endpoint, served, "Hello", {"max_tokens": 128, "temperature": 0.7})
    py_call = (
        'r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello"}], '
        "max_tokens=128, temperature=0.7)\nprint(r.choices[0].message.content)"
        if endpoint == "chat_completions"
        else 'r = client.completions.create(model=model, prompt="Hello, world", max_tokens=128)\nprint(r.choices[0].text)'
    )
    # quoted word by word; the key is expanded by the user's shell from the variable's NAME
    auth = f' -H "Authorization: Bearer ${{{key_env}}}"' if key_env else ""
    cacert = ["--cacert", ca] if ca else []
    head = shlex.join(["curl", "-s", *cacert, base + path[3:], "-H", "Content-Type: application/json"])
    curl = f"{head}{auth} \\\n  -d {shlex.quote(json.dumps(body))}"
    key += f", http_client=httpx.Client(verify={ca!r})" if ca else ""  # the SDK trusts the CA through httpx
    imports = "import os\nimport httpx\n" if ca else "import os\n"
    client = f'{imports}from openai import OpenAI\n\nclient = OpenAI(base_url="{base}", api_key={key})\n'
    return path, curl, client + f"model = {json.dumps(served)}  # the served model name\n" + py_call


def systemd_word(word: str) -> str:
    """One ExecStart word as systemd reads it: quoted when it must be, `%` and `$` doubled (no expansion)."""
    word = word.replace("%", "%%").replace("$", "$$")
    if word and not any(c in word for c in " \t\"'\\;"):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_unit(plan: dict, user: str, program: str, inherited: dict) -> dict:
    """The host server as a systemd service (`program`: the argv's first word, absolute), its env from a file
    beside the state (the plan's over `inherited`), secrets from one the user writes. -> name, unit, env files."""
    name = f"vllm-epyc-{plan['port']}.service"
    env_file, secrets_file = f"{plan['state_dir']}/server.env", f"{plan['state_dir']}/secrets.env"
    secrets_line = f"EnvironmentFile={secrets_file}\n" if plan["env_by_name"] else ""
    exec_start = " ".join(systemd_word(w) for w in [program, *plan["argv"][1:]])
    unit = f"""[Unit]
Description=vLLM {plan["served_model_name"]} on port {plan["port"]} (serving-llms-on-epyc)
After=network-online.target
Wants=network-online.target

[Service]
Type=exec
User={user}
EnvironmentFile={env_file}
{secrets_line}ExecStart={exec_start}
Restart=on-failure
RestartSec=10
TimeoutStopSec=60

[Install]
WantedBy=multi-user.target
"""
    env = "".join(f"{k}={json.dumps(str(v), ensure_ascii=False)}\n" for k, v in {**inherited, **plan["env"]}.items())
    return {"name": name, "unit": unit, "env_file": env_file, "env": env, "secrets_file": secrets_file}


def handoff_doc(plan: dict, served: str | None = None, settled: str | None = None, entry: dict | None = None) -> dict:
    """What the user gets (base URL, endpoint, examples), at `entry` (a router's base_url, port, stop_command) when
    given; an endpoint the plan left "unknown" is the one verify `settled`."""
    served = served or plan["served_model_name"]
    endpoint = plan["primary_endpoint"] if plan["primary_endpoint"] != "unknown" else settled
    if endpoint not in ("chat_completions", "completions"):
        raise ScriptError(
            "the plan's endpoint is unknown (the chat template could not be read) and verify has not settled it yet",
            "run: python3 scripts/launch.py verify --plan <plan.json>, then handoff",
        )
    why = ("settled by verify: " if settled and plan["primary_endpoint"] == "unknown" else "") + (
        "a chat template is present" if endpoint == "chat_completions" else "no usable chat template: raw prompts"
    )
    entry = entry or {k: plan.get(k) for k in ("base_url", "port", "stop_command", "tls")}
    base, port, key_env, s = entry["base_url"], entry["port"], plan.get("api_key_env"), plan["sizing"]
    path, curl, python = examples(endpoint, base, served, key_env, ca := (entry.get("tls") or {}).get("ca"))
    runs_on = f"{plan['runtime']} / {port}" + (f" (engine {plan['engine']})" if plan.get("engine") else "")
    reach = (
        f"; it listens on every address ({plan['host']}:{port}): from another machine use this host's address, "
        f"with the key in ${key_env}"
    )
    sizing = (
        f"{s['omp_threads']} OMP threads ({s['vllm_cpu_omp_threads_bind']}), KV {s['kv_granted_gb']} GiB, "
        f"--max-model-len {s['max_model_len']}, socket {s['socket']}, NUMA {','.join(map(str, s['numa_nodes']))}"
    )
    rows = [
        ["Base URL", f"{base} (the trailing /v1 matters{reach if plan.get('expose') else ''})"],
        ["Served model", served],
        ["Endpoint", path],
        ["Why", why],
        ["Runtime / port", runs_on],
        ["Sizing", sizing],
        ["Stop", entry["stop_command"]],
        *([["CA", f"{ca}: give it to clients to trust (curl --cacert, httpx verify=)"]] if ca else []),
    ]
    if entry["stop_command"] == plan["stop_command"] and plan.get("container_name"):  # the key files stay behind
        rt = runtimes.runtime_argv(plan["runtime"], plan.get("engine"))
        rows.append(["Stop without the bundle", runtime_stop_pair(rt, plan["container_name"], plan["state_dir"])])
    return {
        "base_url": base,
        "served_model_name": served,
        "endpoint_path": path,
        "why": why,
        "runtime": plan["runtime"],
        # the daemon the container runs on (docker --host=...): the one `docker logs` or `exec` must name
        "engine": plan.get("engine"),
        "port": port,
        "sizing": s,
        "stop_command": entry["stop_command"],
        "curl_example": curl,
        "python_example": python,
        "table_markdown": markdown_table(["Field", "Value"], rows),
        "guidance": [
            f"max_tokens caps the output; prompt tokens + max_tokens must stay <= --max-model-len ({s['max_model_len']})",
            "temperature 0 is greedy; tune temperature or top_p, not both",
            "stream: true streams tokens (server-sent events)",
            "the model's generation_config.json may set sampling defaults; pass explicit values",
        ],
    }
