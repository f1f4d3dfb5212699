"""The plan: from the five input documents to one checked, summarised serving plan."""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from epyc import bundle, jsonio
from epyc.argtypes import is_served_name
from epyc.decisions import command, forecast, kv_budget, plan_checks
from epyc.decisions.handoff import markdown_table, summary_rows
from epyc.errors import ScriptError
from epyc.facts import architectures, hubcache, preload, runtimes
from epyc.masking import secret_unsendable

API_KEY_MIN = 8
PLAN_SCHEMA_VERSION = 6  # a plan of another version is refused with its by-hand stop (planfile.load_plan)
# the options plan and up both take about the serve itself (launch.add_serve_options declares them)
TLS_OPTIONS = ("tls_cert", "tls_key", "tls_ca", "tls_name", "plain_http")
SERVE_OPTIONS = (
    "model port max_model_len served_model_name state_dir dtype expose api_key_env throughput_flags kernel_log"
).split() + [*TLS_OPTIONS]

SIZINGS = {
    # name: bind (the socket's cores / nobind / vLLM's default), kv (grant VLLM_CPU_KVCACHE_SPACE), pin (CPU +
    # memory), preload (LD_PRELOAD), seqs (--max-num-seqs from the KV capacity), throughput (the opt-in flags)
    "skill": dict(bind="cores", kv=True, pin=True, preload=True, seqs=True, throughput=False),
    "skill+throughput": dict(bind="cores", kv=True, pin=True, preload=True, seqs=True, throughput=True),
    "vllm-default": dict(bind=None, kv=False, pin=False, preload=False, seqs=False, throughput=False),
    "all-cores": dict(bind="cores", kv=False, pin=False, preload=False, seqs=False, throughput=False),
    "unpinned": dict(bind="nobind", kv=True, pin=False, preload=False, seqs=False, throughput=False),
}


def sizing_rules(name: str) -> dict:
    """What a sizing sets: `skill` is this bundle's plan, the others what a user might type instead (bench.py
    --compare serves the model under each, so the skill's rules are measured, not asserted)."""
    if name not in SIZINGS:
        raise ScriptError(f"unknown sizing {name!r}", f"use one of: {', '.join(SIZINGS)}")
    return SIZINGS[name]


def plan_differences(plan: dict, fresh: dict) -> list[str]:
    """The fields where the plan on disk and a fresh rendering of its own inputs disagree: every field counts
    (what runs, and what the human and the handoff are told), so an edit anywhere is refused."""
    return sorted(k for k in plan.keys() | fresh.keys() if k != "ok" and plan.get(k) != fresh.get(k))


@dataclass
class Choices:
    """What this plan serves, decided from the options and the documents and checked before assembly."""

    model: str
    path: str  # "host" or "container"
    backend: str  # "zentorch" or "stock"
    dtype: str
    max_len: int
    port: int
    expose: bool
    key_env: str | None
    host: str
    served: str
    rules: dict
    revision: str | None
    throughput: bool
    tls: dict | None  # the pair's paths, the CA clients trust and the name it serves on (shell.tls_facts)
    stack: dict  # the stack it serves on (plan_checks.stack_for): its image, why, what is unverified


def refuse_unkeyed_exposure(expose: bool, key_env: str | None, facts: dict) -> None:
    """All interfaces only with a key that is set, long enough, and every secret sendable in a header."""
    if expose and not key_env:
        fix = "export a key in an env var and pass --api-key-env NAME"
        raise ScriptError("--expose serves on all interfaces: an API key is required", fix)
    if key_env and not facts.get("api_key_set"):
        raise ScriptError(f"--api-key-env {key_env}: that variable is not set", f"export {key_env}=<key> first")
    if key_env and facts.get("api_key_length") is not None and facts["api_key_length"] < API_KEY_MIN:
        # a short key is guessed, and masking it would blank words wherever it appears ("local", "error")
        why = f"--api-key-env {key_env}: the key is {facts['api_key_length']} characters; a key needs {API_KEY_MIN} at least"
        fix = f"export {key_env} as a longer random key, e.g. export {key_env}="
        raise ScriptError(why, fix + "$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')")
    if facts.get("unsendable_secrets"):
        name = facts["unsendable_secrets"][0]
        fix = f"export {name} again with the token alone (printable ASCII, no spaces), then plan"
        raise ScriptError(secret_unsendable(name), fix)


def checked_tls(expose: bool, opt: dict, facts: dict, epyc: dict) -> dict | None:
    """The pair a plan serves TLS with, or None (plain HTTP exposed only by name); a bad certificate refused."""
    f, said = facts.get("tls"), epyc["tls"]
    if f and not expose:  # a fleet's nginx would listen on all interfaces with no key asked for
        raise ScriptError(*said["unexposed"])
    if f is None and expose and not opt.get("plain_http"):
        raise ScriptError(said["untls"][0], f"{said['untls'][1]} ({said['first_try']})")
    if not f or f.get("checked"):
        return f and f["tls"]
    tls, names, f = f["tls"], f.get("names", []), {"not_after": 0, "not_before": 0, **f}
    named = {tls["name"], f"*.{str(tls['name']).partition('.')[2]}"} & set(names)  # its own name or a wildcard's
    bad = [f.get("unreadable"), not f.get("matches"), f["now"] > f["not_after"], f["now"] < f["not_before"], not named]
    for no, (why, fix) in zip(bad, said["refusals"]):  # in the order of epyc.json's tls.refusals
        if no:
            at = {k: time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(f[k])) for k in ("not_after", "not_before")}
            why = why.format(**{**f, **tls, **at, "names": ", ".join(names) or "none"})
            raise ScriptError(f"--tls-cert {tls['cert']}: {why}", f"{fix} ({said['first_try']})")
    return tls


def choose(inp: dict, opt: dict, epyc: dict, facts: dict) -> Choices:
    """Every refusal, before anything is assembled: what remains is a serve that start would run."""
    plan_checks.refuse_inconsistent_inputs(inp, opt)
    det, val, chk, est, tune = (inp[k] for k in bundle.INPUT_SCRIPTS)
    model = opt.get("model") or chk.get("model")
    plan_checks.refuse_unsafe_arguments(model, val, tune)
    backend = val.get("backend") or "zentorch"
    dtype = plan_checks.chosen_dtype(opt, epyc, backend, est)
    max_len = plan_checks.chosen_max_len(opt, epyc, est)
    expose, key_env = bool(opt.get("expose")), opt.get("api_key_env")
    refuse_unkeyed_exposure(expose, key_env, facts)
    tls = checked_tls(expose, opt, facts, epyc)
    served = opt.get("served_model_name") or command.served_model_name(model, facts.get("model_dir"))
    if not is_served_name(served):
        raise ScriptError(
            f"served model name {served!r} is not a plain name (letters, digits and ._:@+/-, not "
            "starting with '-', at most 200)",
            "pass --served-model-name NAME",
        )
    rules = sizing_rules(opt.get("sizing") or "skill")
    throughput = bool(opt.get("throughput_flags") or rules["throughput"])
    if throughput and backend == "stock":
        why = "the throughput flags are for the zentorch path only: on stock vLLM CPU (vLLM 0.32, CpuPlatform) "
        why += "the engine segfaults in onednn_mm while warming up (measured on an Intel runner, 2026-12-01)"
        raise ScriptError(why, "plan without --throughput-flags on the stock path")
    revision = plan_checks.served_revision(inp, model, facts)
    plan_checks.refuse_unrunnable_command(val, epyc, facts)
    quant = command.quantized_path(chk.get("quantization"), backend, dtype, epyc, det.get("avx512"))
    if quant and quant["served_on_cpu"] is False:
        why = f"{model} is a {quant['method']} {quant['bits'] or '?'}-bit checkpoint this CPU's {backend} path"
        fix = "serve the unquantized (bfloat16) checkpoint here, or this one on a CPU with AVX-512"
        raise ScriptError(f"{why} cannot run: {quant['note']}", fix)
    return Choices(
        model=model,
        path=val["path"],
        backend=backend,
        dtype=dtype,
        max_len=max_len,
        port=int(opt.get("port") or val["port"]),
        expose=expose,
        key_env=key_env,
        host="0.0.0.0" if expose else epyc["serve"]["bind_host"],
        served=served,
        rules=rules,
        revision=revision,
        throughput=throughput,
        tls=tls,
        stack=plan_checks.stack_for(inp, [architectures.stack_row(epyc, n) for n in epyc["stacks"]]),
    )


def plan_env(ch: Choices, tune: dict, epyc: dict, opt: dict, facts: dict) -> tuple[dict, dict]:
    """The server's environment (no secret values) and the secrets it gets: variable -> where start reads it."""
    env = {}
    if ch.rules["bind"]:
        env["VLLM_CPU_OMP_THREADS_BIND"] = (
            tune["vllm_cpu_omp_threads_bind"] if ch.rules["bind"] == "cores" else "nobind"
        )
    if ch.rules["kv"]:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(tune["kv_granted_gb"])
    if ch.throughput:
        env.update(command.throughput_env(epyc["throughput_flags"]))
    if opt.get("kernel_log"):  # every zentorch matmul logs its plugin_op and kernel: kernel_proof.py reads them
        env.update({"ZENDNNL_API_LOG_LEVEL": "4", "ONEDNN_VERBOSE": "1"})
    if facts.get("hf_offline"):
        env["HF_HUB_OFFLINE"] = "1"  # an offline host serves from its HF cache, and so does the server
    secrets = {"HF_TOKEN": "HF_TOKEN"} if facts.get("hf_token_set") else {}
    if ch.key_env:
        secrets["VLLM_API_KEY"] = ch.key_env
    return env, secrets


def serve_opts(ch: Choices, inp: dict, opt: dict, epyc: dict) -> tuple[list[str], kv_budget.Capacity, int]:
    """vllm serve's options after the model, the KV capacity behind --max-num-seqs, and the batched tokens."""
    est, tune = inp["estimate_memory"], inp["cpu_tune"]
    sized = (est.get("fit") or {}).get("max_model_len")
    batched = int(est.get("max_num_batched_tokens") or epyc["serve"]["max_num_batched_tokens"])
    ranks = tune.get("tensor_parallel_size") or 1
    need = kv_budget.need_of(est, ranks) or kv_budget.Need()
    if opt.get("max_model_len") and opt["max_model_len"] != sized:  # not the length the estimate's sequences have
        need = replace(need, kv_bytes_per_sequence=None)
    capacity = kv_budget.capacity(tune["kv_granted_gb"], need, epyc["serve"]["max_num_seqs_cap"], batched)
    # the KV sizing's assumptions are pinned, not left to vLLM's defaults: how many sequences run at once, and
    # how many tokens a step takes (a sliding-window layer keeps that many beyond its window)
    seqs = ch.rules["seqs"]
    pair = ch.tls and (ch.tls if ch.path == "host" else command.TLS_TARGET)  # a container reads them mounted
    flags = {
        "--served-model-name": ch.served,
        "--host": ch.host,
        "--port": ch.port,
        "--dtype": ch.dtype,
        "--max-model-len": ch.max_len,
        "--tensor-parallel-size": ranks if ranks > 1 else None,
        "--max-num-seqs": capacity.max_num_seqs if seqs else None,
        "--max-num-batched-tokens": batched if seqs else None,
        "--revision": ch.revision,
        "--ssl-certfile": pair and pair["cert"],
        "--ssl-keyfile": pair and pair["key"],
    }
    return [x for flag, value in flags.items() if value for x in (flag, str(value))], capacity, batched


def serve_command(
    ch: Choices, inp: dict, epyc: dict, env: dict, facts: dict, opts: list[str], name: str, secrets_dir: str | None
) -> dict:
    """What start runs: on the host, the pin prefix, the venv's vllm and the model by its real path (LD_PRELOAD in
    env); in a container, the runtime validate probed, the cpuset, the hub cache and a model folder mounted."""
    val, tune = inp["validate"], inp["cpu_tune"]
    if ch.path == "host":
        # a local folder by its real absolute path: the command means the same from anywhere
        model_arg = facts.get("model_dir") or ch.model
        env["PYTHONUNBUFFERED"] = "1"  # the log tail a failed verify shows is the server's last words
        libs = preload.preload_value((val.get("ld_preload") or {}).get("value"), epyc["host_stack"]["ld_preload_libs"])
        if libs and ch.rules["preload"]:
            env["LD_PRELOAD"] = libs
        pin = tune.get("host_pin_argv", []) if ch.rules["pin"] else []
        argv = [*pin, str(Path(val["python"]).parent / "vllm"), "serve", model_arg, *opts]
        # another host has neither this bundle nor its state: the process is found by its command there
        pattern = f"vllm serve {re.escape(model_arg)} .*--port {ch.port}( |$)"
        return {"argv": argv, "pre_argv": [], "remote_stop": shlex.join(["pkill", "-TERM", "-f", pattern])}
    rt = runtimes.runtime_argv(val["runtime"], val.get("engine"))
    model_arg, mount = ch.model, []
    if facts.get("model_dir"):  # a local folder goes into the container read-only
        model_arg = f"/models/{Path(facts['model_dir']).name}"
        mount = hubcache.bind_mount(facts["model_dir"], model_arg, read_only=True)
    mount += [x for k, t in command.TLS_TARGET.items() if ch.tls for x in hubcache.bind_mount(ch.tls[k], t, True)]
    # the hub cache only, where the container's huggingface_hub looks
    hf_mount = hubcache.bind_mount(val["hf_cache"]["path"], epyc["container"]["hf_cache_mount_target"] + "/hub")
    argv = command.container_run_argv(
        rt,
        name,
        epyc["container"]["run_flags"],
        tune["container_cpuset_argv"] if ch.rules["pin"] else [],
        hf_mount,
        mount,
        env,
        secrets_dir,
        ch.stack["image"],
        [model_arg, *opts],
        epyc["container"]["shm_size_if_ipc_isolated"],
    )
    built = any(r["setup"] and r.get("image") == ch.stack["image"] for r in epyc["stacks"].values())  # never pulled
    pre_argv = [[*rt, "rm", "-f", name], [*rt, *(["image", "inspect"] if built else ["pull"]), ch.stack["image"]]]
    return {"argv": argv, "pre_argv": pre_argv, "remote_stop": command.runtime_stop_pair(rt, name)}


def sizing_doc(opt: dict, tune: dict, capacity: kv_budget.Capacity, batched: int | None, max_len: int) -> dict:
    """The plan's sizing: the socket, its bind and KV grant, and what the grant holds."""
    return {
        "sizing_rule": opt.get("sizing") or "skill",
        "socket": tune["chosen_socket"],
        **{k: tune.get(k) for k in ("socket_choice_reason", "vllm_cpu_omp_threads_bind", "omp_threads")},
        **{k: tune.get(k) for k in ("tensor_parallel_size", "ranks", "kv_granted_gb", "kv_basis")},
        **asdict(capacity),
        "numa_nodes": tune["numa_nodes"],
        "max_num_batched_tokens": batched,
        "max_model_len": max_len,
    }


def what_serves(ch: Choices, inp: dict, epyc: dict, facts: dict) -> dict:
    """The plan's first fields: where it serves, on which stack, which model, at which address and precision."""
    det, val, chk = inp["detect"], inp["validate"], inp["check_model"]
    return {
        "schema_version": PLAN_SCHEMA_VERSION,
        "kind": "engine",
        "target": det.get("target", "localhost"),
        "deferred": (d := val.get("deferred", []))
        + (["the TLS pair (checked there by launch.py up)"] if ch.tls and d else []),
        "path": ch.path,
        "backend": ch.backend,
        "platform": (val.get("stack") or {}).get("platform"),
        "runtime": "host" if ch.path == "host" else val["runtime"],
        "engine": val.get("engine") if ch.path != "host" else None,
        "image": ch.stack["image"],
        "stack": ch.stack,
        "model": ch.model,
        "served_model_name": ch.served,
        "model_kind": chk.get("kind"),
        "primary_endpoint": chk.get("primary_endpoint") or "unknown",
        "supported_endpoints": chk.get("supported_endpoints") or [],
        "chat_template_status": (chk.get("chat_template") or {}).get("status"),
        "host": ch.host,
        "port": ch.port,
        "base_url": f"https://{ch.tls['name']}:{ch.port}/v1" if ch.tls else f"http://127.0.0.1:{ch.port}/v1",
        "expose": ch.expose,
        "tls": ch.tls,
        "api_key_env": ch.key_env,
        "dtype": ch.dtype,
        "max_model_len": ch.max_len,
        "vllm_version": (val.get("stack") or {}).get("vllm") if ch.stack["why"] is None else ch.stack["vllm"],
        "quantization": command.quantized_path(chk.get("quantization"), ch.backend, ch.dtype, epyc, det.get("avx512")),
        "model_dir": facts.get("model_dir"),
        "revision": ch.revision,
    }


def on_host_command(inp: dict, opt: dict, engines: str | None = None) -> str:
    """The one line that renders this plan on its host from a copy of the bundle, with its flags: `up` for one
    engine (it shows this summary there and asks), the chain to `launch.py plan` for a fleet (then start)."""
    val, fit = inp["validate"], inp["estimate_memory"].get("fit") or {}
    model, max_len = opt.get("model") or inp["check_model"]["model"], opt.get("max_model_len") or fit["max_model_len"]
    serve = {**{k: opt.get(k) for k in SERVE_OPTIONS}, "model": model, "max_model_len": max_len}
    sized = {"max_model_len": max_len, "num_prompts": fit.get("num_prompts"), "dtype": opt.get("dtype")}
    host = {"stock": val.get("backend") == "stock", "python": val["python"] if val["path"] == "host" else None}
    flags, check = command.as_flags, {"model": model, "revision": inp["check_model"].get("revision")}
    if not engines:
        return shlex.join(["python3", "scripts/launch.py", "up", *flags({**serve, **sized, **host})])
    steps = [["detect.py"], ["validate.py", *flags({**host, "runtime": "host" if host["python"] else None})]]
    steps += [["check_model.py", *flags(check)], ["estimate_memory.py", *flags(sized)], ["cpu_tune.py"]]
    steps.append(["launch.py", "plan", *flags({**serve, "engines": engines})])
    return " && ".join(shlex.join(["python3", f"scripts/{s[0]}", *s[1:]]) for s in steps)


def build_plan(inp: dict, opt: dict, epyc: dict, facts: dict) -> dict:
    """Everything start needs, and the summary the human confirms, from the five input documents, the options and
    the host facts that matter (shell.shell_facts). Every refusal comes first (choose); then the assembly."""
    ch = choose(inp, opt, epyc, facts)
    det, val, chk, est, tune = (inp[k] for k in bundle.INPUT_SCRIPTS)
    env, secrets = plan_env(ch, tune, epyc, opt, facts)
    opts, capacity, batched = serve_opts(ch, inp, opt, epyc)
    name = f"{epyc['container']['name']}-{ch.port}"  # one container per endpoint: plans never remove each other's
    home = val.get("home")  # another host's: its state dir under its home, where the plan's one line (up) keeps it
    default = "up" if home else name if ch.path != "host" else f"host-{ch.port}"
    state_dir = Path(opt.get("state_dir") or hubcache.state_root(home) / default)
    cmd = serve_command(ch, inp, epyc, env, facts, opts, name, str(state_dir / "secrets") if secrets else None)
    # here: from any folder, on the copy of the plan start keeps beside the server's state (it also removes
    # the key files start wrote); another host: the runtime's own stop, or the process by its command
    stop = cmd["remote_stop"] if val.get("deferred") else command.stop_command(state_dir / "plan.json")
    gotcha = {"check": "throughput_flags", "message": epyc["throughput_flags"]["gotcha"], "fix": None}
    plan = {
        **what_serves(ch, inp, epyc, facts),
        "env": env,
        "env_by_name": list(secrets),
        "secrets": secrets,
        "pre_argv": cmd["pre_argv"],
        "argv": cmd["argv"],
        "command": shlex.join(cmd["argv"]),
        "container_name": name if ch.path != "host" else None,
        "state_dir": str(state_dir),
        "log_file": str(state_dir / "server.log"),
        "state_file": str(state_dir / "state.json"),
        "stop_command": stop,
        "on_host_command": opt.get("on_host_command") or (on_host_command(inp, opt) if val.get("deferred") else None),
        "requires_confirmation": bool(val.get("requires_confirmation")),
        "confirmation_reasons": [c["message"] for c in val.get("confirmations", [])],
        "warnings": [
            {"check": w["check"], "message": w["message"], "fix": w.get("fix")}
            for w in [*tune.get("warnings", []), *val.get("warnings", []), *chk.get("warnings", [])]
            + ([gotcha] if ch.throughput else [])
            + plan_checks.stack_warnings(ch.stack)
        ],
        "sizing": sizing_doc(opt, tune, capacity, batched if ch.rules["seqs"] else None, ch.max_len),
        "forecast": forecast.plan_forecast(inp, epyc).to_json(),
        "inputs": inp,  # start re-renders from these and refuses a plan whose command was edited
        # the state dir as resolved here: stop run from another shell must find the server this plan's start recorded
        "options": {k: v for k, v in {**opt, "state_dir": str(state_dir)}.items() if v is not None},
    }
    plan["summary"] = summary_rows(plan, det, est.get("fit"))
    plan["summary_markdown"] = markdown_table(["Field", "Value"], plan["summary"])
    # what the human is shown must be a plan start would accept
    jsonio.check_schema(
        plan,
        "plan",
        "the plan these documents render is not one start would run",
        "pass the unmodified outputs of detect, validate, check_model, estimate_memory and cpu_tune",
    )
    return plan
