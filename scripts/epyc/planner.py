"""The plan: from the five input documents to one checked, summarised serving plan."""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from . import bundle, jsonio, kv_budget, masking, runtimes
from .architectures import normalize_version
from .argtypes import is_revision, is_served_name
from .command import (
    API_KEY_MIN,
    bound_cpus,
    container_run_argv,
    pin_prefix_problem,
    quantized_path,
    runtime_stop_pair,
    served_model_name,
    stop_command,
    throughput_env,
)
from .errors import ScriptError
from .handoff import markdown_table, summary_rows
from .hubcache import HF_MOUNT_FIX, bind_mount, hf_mount_problem, state_root
from .kv_cache import ssm_state_dtype
from .masking import secret_unsendable
from .preload import preload_value

PLAN_SCHEMA_VERSION = 5  # a plan of another version is refused with its by-hand stop (planfile.load_plan)
# the options plan and up both take about the serve itself (launch.add_serve_options declares them)
SERVE_OPTIONS = (
    "model port max_model_len served_model_name state_dir dtype expose api_key_env throughput_flags kernel_log"
).split()

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
    """What a sizing sets. `skill` is this bundle's plan; the others are what a user might type instead
    (vLLM's own defaults; every physical core bound and nothing else; no binding at all): bench.py
    --compare serves the same model under each, so the skill's rules are measured, not asserted."""
    if name not in SIZINGS:
        raise ScriptError(f"unknown sizing {name!r}", f"use one of: {', '.join(SIZINGS)}")
    return SIZINGS[name]


def plan_differences(plan: dict, fresh: dict) -> list[str]:
    """The fields where the plan on disk and a fresh rendering of its own inputs disagree. Every field
    counts: the command, env and paths decide what runs, and the rest (the stop command, the summary,
    the base URL) is what the human and the handoff are told -- an edit anywhere is refused."""
    return sorted(k for k in plan.keys() | fresh.keys() if k != "ok" and plan.get(k) != fresh.get(k))


LAUNCHABLE_KINDS = ("text", "multimodal", "undetermined")


def mismatches(inp: dict) -> list[str]:
    """Why the five documents do not describe one serve: each script echoes the inputs its decision
    used, so a set assembled from different runs (another model, other weights, a KV grant below the
    need, another host) is caught here instead of serving something nobody sized."""
    det, val, chk, est, tune = (inp[k] for k in bundle.INPUT_SCRIPTS)
    out = []
    if chk.get("model") and est.get("model") and chk["model"] != est["model"]:
        out.append(f"check_model.py ran for {chk['model']}, estimate_memory.py for {est['model']}")
    if (est.get("revision") or "main") != (chk.get("revision") or "main"):  # none is main, as the Hub reads it
        out.append(
            f"check_model.py checked revision {chk.get('revision') or 'main'}, estimate_memory.py sized "
            f"{est.get('revision') or 'main'}"
        )
    out += kv_budget.disagreements(tune, est)
    ranks = tune.get("tensor_parallel_size") or 1
    lists = str(tune.get("vllm_cpu_omp_threads_bind")).split("|")
    if "ranks" in tune and (
        lists != [r.get("cpus") for r in tune["ranks"] if isinstance(r, dict)] or len(lists) != ranks
    ):
        out.append(
            f"cpu_tune.py binds {masking.clip(str(tune.get('vllm_cpu_omp_threads_bind')), 80)}, not one core list "
            f"per rank of its {ranks} ranks"
        )
    checked = normalize_version(chk.get("vllm_version"))  # '0.32.0+cpu' -> '0.32.0'
    serving = normalize_version((val.get("stack") or {}).get("vllm"))
    if checked and serving and checked != serving:  # the architecture was judged by another vLLM's registry
        out.append(f"check_model.py judged the model with vLLM {checked}'s registry, validate.py found vLLM {serving}")
    ssm = (est.get("kv_layers") or {}).get("ssm_state_dtype")
    if ssm and det.get("avx512_bf16") is not None:
        # the SSM state's dtype, and so the KV page, depends on the CPU (kv_cache.ssm_state_dtype)
        served = ssm_state_dtype(bool(det["avx512_bf16"]), est.get("kv_dtype") or "bfloat16")
        if ssm != served:
            out.append(
                f"estimate_memory.py sized the recurrent state in {ssm}, vLLM keeps it in {served} on the "
                f"CPU detect.py read (AVX-512 BF16: {'yes' if det['avx512_bf16'] else 'no'}; pass "
                f"--avx512-bf16 {'yes' if det['avx512_bf16'] else 'no'})"
            )
    vendor = det.get("vendor")
    if val.get("backend") == "zentorch" and vendor != "AuthenticAMD":
        # vLLM picks ZenCpuPlatform only on an AMD CPU: elsewhere zentorch is installed and never runs. A CPU
        # whose vendor detect.py could not read is no AMD one either (it would not call it an EPYC)
        out.append(
            "validate.py chose the zentorch backend, which vLLM activates only on AMD CPUs; detect.py read "
            + (f"a {masking.clip(vendor, 40)} CPU" if isinstance(vendor, str) else "no CPU vendor")
        )
    if chk.get("launchable") and chk.get("kind") not in LAUNCHABLE_KINDS:
        out.append(f"check_model.py calls a {chk.get('kind')!r} model launchable")
    listed = [s.get("socket") for s in tune.get("sockets") or [] if isinstance(s, dict)]
    if listed and "chosen_socket" in tune and tune["chosen_socket"] not in listed:  # the summary would name it
        out.append(
            f"cpu_tune.py chose socket {tune['chosen_socket']}, which its own sockets ({listed[:8]}) do not list"
        )
    if det.get("target") and tune.get("target") and det["target"] != tune["target"]:
        out.append(f"detect.py read {det['target']}, cpu_tune.py sized {tune['target']}")
    read, checked_on = det.get("target", "localhost"), val.get("target", "localhost")
    # one machine only when one target: validate.py run here for a plan of a spec, capture or sysroot tree
    # of another host would start that host's sizing here with nothing deferred (a tree standing in for
    # this machine is validated with --detect of that tree)
    if read != checked_on:
        out.append(f"detect.py read {read}, validate.py checked {checked_on}")
    return out


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
    version: str | None
    rules: dict
    revision: str | None
    throughput: bool


def refuse_inconsistent_inputs(inp: dict, opt: dict) -> None:
    """The documents must say ready, launchable, one serve and a fit, for the model the options name."""
    val, chk, est = inp["validate"], inp["check_model"], inp["estimate_memory"]
    if not val.get("ready"):
        errs = "; ".join(e["message"] for e in val.get("errors", [])) or "not ready"
        raise ScriptError(
            f"validate.py is not ready: {errs}",
            (val.get("errors") or [{}])[0].get("fix") or "fix what validate.py reported, then re-run it",
        )
    if chk.get("launchable") is False:
        raise ScriptError(f"check_model.py: {chk.get('message')}", "choose a model vLLM serves as chat/completions")
    wrong = mismatches(inp)
    if wrong:
        raise ScriptError(
            "the five documents do not describe one serve: " + "; ".join(wrong),
            "re-run the steps from the first one that differs, for one model on one host, and plan from those files",
        )
    fit = est.get("fit")
    if fit and not fit["fits"]:
        raise ScriptError(
            f"does not fit: required {fit['required_gb']} GiB vs {fit['ram_gb']} GiB RAM",
            fit.get("action") or "lower --max-model-len or use a smaller model",
        )
    model = opt.get("model") or chk.get("model")
    if chk.get("model") and model != chk["model"]:
        raise ScriptError(
            f"check_model.py ran for {chk['model']}, the plan is for {model}",
            "run check_model.py and estimate_memory.py for the model you serve",
        )


def refuse_unsafe_arguments(model: object, val: dict, tune: dict) -> None:
    """What becomes an argument must be one argument, never an option, and the pin exactly cpu_tune's."""
    if not isinstance(model, str) or not model or model.startswith("-") or any(ord(c) < 32 for c in model):
        raise ScriptError(
            f"model {model!r} would be read as an option or is not one argument",
            "pass a Hub id (owner/name) or a folder path that does not start with '-' (e.g. ./-name)",
        )
    problem = pin_prefix_problem(
        tune.get("host_pin_argv", []),
        tune.get("container_cpuset_argv", []),
        tune.get("numa_nodes"),
        bound_cpus(tune.get("vllm_cpu_omp_threads_bind")),
    )
    if problem:
        raise ScriptError(problem, "pass the unmodified output of cpu_tune.py")
    if val["path"] == "host" and not (isinstance(val.get("python"), str) and val["python"].startswith("/")):
        raise ScriptError(
            f"validate.py's python {val.get('python')!r} is not an absolute path",
            "pass the unmodified output of validate.py (it names the interpreter by absolute path)",
        )


def chosen_dtype(opt: dict, epyc: dict, backend: str, est: dict) -> str:
    """The serving dtype: one the platform computes in, and the one estimate_memory sized."""
    dtype = opt.get("dtype") or epyc["precision"]["default"]
    if backend != "stock" and dtype not in epyc["precision"]["host_stack_supported"]:
        raise ScriptError(
            f"{dtype} is not a compute dtype of the zentorch CPU platform: " + epyc["precision"]["host_stack_note"],
            f"use {' or '.join(epyc['precision']['host_stack_supported'])}",
        )
    if est.get("dtype") is not None and est["dtype"] != dtype:  # weights and KV bytes are per dtype
        raise ScriptError(
            f"estimate_memory.py sized the model at {masking.clip(str(est['dtype']), 40)}, the plan serves {dtype}",
            f"run estimate_memory.py with --dtype {dtype} (then cpu_tune.py with its "
            "figures), or plan with the dtype it sized; then plan again",
        )
    return dtype


def chosen_max_len(opt: dict, epyc: dict, est: dict) -> int:
    """--max-model-len, at most the length estimate_memory sized (the KV grant is for that many tokens)."""
    sized = (est.get("fit") or {}).get("max_model_len")
    max_len = int(opt.get("max_model_len") or sized or epyc["serve"]["default_max_model_len"])
    if opt.get("max_model_len") and sized and max_len > sized:
        raise ScriptError(
            f"--max-model-len {max_len} is past the {sized} tokens estimate_memory.py sized (and "
            "cpu_tune.py granted KV cache for)"
            + (f"; the model's own limit is {est['model_max_seq_len']}" if est.get("model_max_seq_len") else ""),
            f"re-run estimate_memory.py --max-model-len {max_len}, then cpu_tune.py with its "
            "kv_needed_gb, and plan with those (launch.py up does all three)",
        )
    return max_len


def refuse_unkeyed_exposure(expose: bool, key_env: str | None, facts: dict) -> None:
    """All interfaces only with a key that is set, long enough, and every secret sendable in a header."""
    if expose and not key_env:
        raise ScriptError(
            "--expose serves on all interfaces: an API key is required",
            "export a key in an env var and pass --api-key-env NAME",
        )
    if key_env and not facts.get("api_key_set"):
        raise ScriptError(f"--api-key-env {key_env}: that variable is not set", f"export {key_env}=<key> first")
    if key_env and facts.get("api_key_length") is not None and facts["api_key_length"] < API_KEY_MIN:
        # a short key is guessed, and masking it would blank words wherever it appears ("local", "error")
        raise ScriptError(
            f"--api-key-env {key_env}: the key is {facts['api_key_length']} characters; a key needs "
            f"{API_KEY_MIN} at least",
            f"export {key_env} as a longer random key, e.g. "
            f"export {key_env}=$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')",
        )
    if facts.get("unsendable_secrets"):
        name = facts["unsendable_secrets"][0]
        raise ScriptError(
            secret_unsendable(name), f"export {name} again with the token alone (printable ASCII, no spaces), then plan"
        )


def served_revision(inp: dict, model: str, facts: dict) -> str | None:
    """The revision checked and sized is the one served; a folder has none, and must be the folder read."""
    chk = inp["check_model"]
    for reader, said in (("check_model.py", chk), ("estimate_memory.py", inp["estimate_memory"])):
        # a relative path, or a folder named like a Hub id, can mean another model than the one checked
        if "model_dir" in said and said["model_dir"] != facts.get("model_dir"):
            read = said["model_dir"] or f"the Hub id {said.get('model')}"
            here = facts.get("model_dir") or "a Hub id (no such folder here)"
            raise ScriptError(
                f"{reader} read {read}, but {model} is {here} from where plan runs",
                "run check_model.py, estimate_memory.py and plan from the same folder, or pass the "
                "model folder as an absolute path",
            )
    revision = None if facts.get("model_dir") else chk.get("revision")
    if revision is not None and not is_revision(revision):  # a document's value becomes a vLLM argument
        raise ScriptError(
            f"check_model.json's revision {str(revision)[:200]!r} is not a branch, tag or commit",
            "run check_model.py (and estimate_memory.py) again with a plain --revision",
        )
    return revision


def refuse_unrunnable_command(val: dict, epyc: dict, facts: dict) -> None:
    """What the command would hold must be right: on the host, LD_PRELOAD only the pinned libraries; in a
    container, a known runtime on a local engine, and mounts of a model folder and of a hub cache that is a
    cache, never a system folder."""
    if val["path"] == "host":
        preload_value((val.get("ld_preload") or {}).get("value"), epyc["host_stack"]["ld_preload_libs"])
        return
    runtimes.runtime_argv(val["runtime"], val.get("engine"))
    if facts.get("model_dir"):
        bind_mount(facts["model_dir"], f"/models/{Path(facts['model_dir']).name}", read_only=True)
    bind_mount(val["hf_cache"]["path"], epyc["container"]["hf_cache_mount_target"] + "/hub")
    if not val.get("deferred"):  # another host's cache is checked there, by its own chain
        problem = hf_mount_problem(val["hf_cache"]["path"], facts.get("hf_cache"))
        if problem:
            raise ScriptError(
                f"cannot mount the Hugging Face hub cache {val['hf_cache']['path'][:300]!r} "
                f"read-write into the container: it {problem}",
                HF_MOUNT_FIX,
            )


def choose(inp: dict, opt: dict, epyc: dict, facts: dict) -> Choices:
    """Every refusal, before anything is assembled: what remains is a serve that start would run."""
    refuse_inconsistent_inputs(inp, opt)
    det, val, chk, est, tune = (inp[k] for k in bundle.INPUT_SCRIPTS)
    model = opt.get("model") or chk.get("model")
    refuse_unsafe_arguments(model, val, tune)
    backend = val.get("backend") or "zentorch"
    dtype = chosen_dtype(opt, epyc, backend, est)
    max_len = chosen_max_len(opt, epyc, est)
    expose, key_env = bool(opt.get("expose")), opt.get("api_key_env")
    refuse_unkeyed_exposure(expose, key_env, facts)
    served = opt.get("served_model_name") or served_model_name(model, facts.get("model_dir"))
    if not is_served_name(served):
        raise ScriptError(
            f"served model name {served!r} is not a plain name (letters, digits and ._:@+/-, not "
            "starting with '-', at most 200)",
            "pass --served-model-name NAME",
        )
    rules = sizing_rules(opt.get("sizing") or "skill")
    throughput = bool(opt.get("throughput_flags") or rules["throughput"])
    if throughput and backend == "stock":
        raise ScriptError(
            "the throughput flags are for the zentorch path only: on stock vLLM CPU (vLLM 0.32, "
            "CpuPlatform) the engine segfaults in onednn_mm while warming up (measured on an Intel "
            "runner, 2026-12-01)",
            "plan without --throughput-flags on the stock path",
        )
    revision = served_revision(inp, model, facts)
    refuse_unrunnable_command(val, epyc, facts)
    quant = quantized_path(chk.get("quantization"), backend, dtype, epyc, det.get("avx512"))
    if quant and quant["served_on_cpu"] is False:
        raise ScriptError(
            f"{model} is a {quant['method']} {quant['bits'] or '?'}-bit checkpoint this CPU's "
            f"{backend} path cannot run: {quant['note']}",
            "serve the unquantized (bfloat16) checkpoint here, or this one on a CPU with AVX-512",
        )
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
        version=(val.get("stack") or {}).get("vllm"),
        rules=rules,
        revision=revision,
        throughput=throughput,
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
        env.update(throughput_env(epyc["throughput_flags"]))
    if opt.get("kernel_log"):  # every zentorch matmul logs its plugin_op and kernel: kernel_proof.py reads them
        env.update({"ZENDNNL_API_LOG_LEVEL": "4", "ONEDNN_VERBOSE": "1"})
    if facts.get("hf_offline"):
        env["HF_HUB_OFFLINE"] = "1"  # an offline host serves from its HF cache, and so does the server
    secrets = {
        **({"HF_TOKEN": "HF_TOKEN"} if facts.get("hf_token_set") else {}),
        **({"VLLM_API_KEY": ch.key_env} if ch.key_env else {}),
    }
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
    }
    return [x for flag, value in flags.items() if value for x in (flag, str(value))], capacity, batched


def host_command(ch: Choices, val: dict, tune: dict, epyc: dict, env: dict, model_arg: str, opts: list[str]) -> dict:
    """The host path: the pin prefix, the venv's vllm, the model by its real path; LD_PRELOAD in env."""
    env["PYTHONUNBUFFERED"] = "1"  # the log tail a failed verify shows is the server's last words
    preload = preload_value((val.get("ld_preload") or {}).get("value"), epyc["host_stack"]["ld_preload_libs"])
    if preload and ch.rules["preload"]:
        env["LD_PRELOAD"] = preload
    argv = [
        *(tune.get("host_pin_argv", []) if ch.rules["pin"] else []),
        str(Path(val["python"]).parent / "vllm"),
        "serve",
        model_arg,
        *opts,
    ]
    # another host has neither this bundle nor its state: the process is found by its command there
    pattern = f"vllm serve {re.escape(model_arg)} .*--port {ch.port}( |$)"
    return {
        "argv": argv,
        "pre_argv": [],
        "runtime": "host",
        "remote_stop": shlex.join(["pkill", "-TERM", "-f", pattern]),
    }


def container_command(
    ch: Choices,
    val: dict,
    tune: dict,
    epyc: dict,
    env: dict,
    facts: dict,
    opts: list[str],
    name: str,
    state_dir: Path,
    secrets: dict,
) -> dict:
    """The container path: the runtime validate probed, the cpuset, the hub cache and a model folder mounted."""
    rt = runtimes.runtime_argv(val["runtime"], val.get("engine"))
    model_arg, mount = ch.model, []
    if facts.get("model_dir"):  # a local folder goes into the container read-only
        model_arg = f"/models/{Path(facts['model_dir']).name}"
        mount = bind_mount(facts["model_dir"], model_arg, read_only=True)
    # the hub cache only, where the container's huggingface_hub looks
    hf_mount = bind_mount(val["hf_cache"]["path"], epyc["container"]["hf_cache_mount_target"] + "/hub")
    argv = container_run_argv(
        rt,
        name,
        epyc["container"]["run_flags"],
        tune["container_cpuset_argv"] if ch.rules["pin"] else [],
        hf_mount,
        mount,
        env,
        str(state_dir / "secrets") if secrets else None,
        val["image"],
        [model_arg, *opts],
        epyc["container"]["shm_size_if_ipc_isolated"],
    )
    return {
        "argv": argv,
        "pre_argv": [[*rt, "rm", "-f", name], [*rt, "pull", val["image"]]],
        "runtime": val["runtime"],
        "remote_stop": runtime_stop_pair(rt, name),
    }


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


def build_plan(inp: dict, opt: dict, epyc: dict, facts: dict) -> dict:
    """Everything start needs, and the summary the human confirms, from the five input documents, the
    options, and the host facts that matter (planfile.host_facts: secrets set, the model's folder, the
    cache's listing). Every refusal comes first (choose); then the command is assembled."""
    ch = choose(inp, opt, epyc, facts)
    det, val, chk, est, tune = (inp[k] for k in bundle.INPUT_SCRIPTS)
    env, secrets = plan_env(ch, tune, epyc, opt, facts)
    opts, capacity, batched = serve_opts(ch, inp, opt, epyc)
    name = f"{epyc['container']['name']}-{ch.port}"  # one container per endpoint: plans never remove each other's
    state_dir = Path(opt.get("state_dir") or state_root() / (name if ch.path != "host" else f"host-{ch.port}"))
    if ch.path == "host":  # a local folder by its real absolute path: the command means the same from anywhere
        cmd = host_command(ch, val, tune, epyc, env, facts.get("model_dir") or ch.model, opts)
    else:
        cmd = container_command(ch, val, tune, epyc, env, facts, opts, name, state_dir, secrets)
    # here: from any folder, on the copy of the plan start keeps beside the server's state (it also removes
    # the key files start wrote); another host: the runtime's own stop, or the process by its command
    stop = cmd["remote_stop"] if val.get("deferred") else stop_command(state_dir / "plan.json")
    extra = (
        [{"check": "throughput_flags", "message": epyc["throughput_flags"]["gotcha"], "fix": None}]
        if ch.throughput
        else []
    )
    plan = {
        "schema_version": PLAN_SCHEMA_VERSION,
        "kind": "engine",
        "target": det.get("target", "localhost"),
        "deferred": val.get("deferred", []),
        "path": ch.path,
        "backend": ch.backend,
        "platform": (val.get("stack") or {}).get("platform"),
        "runtime": cmd["runtime"],
        "engine": val.get("engine") if ch.path != "host" else None,
        "image": val.get("image"),
        "model": ch.model,
        "served_model_name": ch.served,
        "model_kind": chk.get("kind"),
        "primary_endpoint": chk.get("primary_endpoint") or "unknown",
        "supported_endpoints": chk.get("supported_endpoints") or [],
        "chat_template_status": (chk.get("chat_template") or {}).get("status"),
        "host": ch.host,
        "port": ch.port,
        "base_url": f"http://127.0.0.1:{ch.port}/v1",
        "expose": ch.expose,
        "api_key_env": ch.key_env,
        "dtype": ch.dtype,
        "max_model_len": ch.max_len,
        "vllm_version": ch.version,
        "quantization": quantized_path(chk.get("quantization"), ch.backend, ch.dtype, epyc, det.get("avx512")),
        "model_dir": facts.get("model_dir"),
        "revision": ch.revision,
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
        "requires_confirmation": bool(val.get("requires_confirmation")),
        "confirmation_reasons": [c["message"] for c in val.get("confirmations", [])],
        "warnings": [
            {"check": w["check"], "message": w["message"], "fix": w.get("fix")}
            for w in [*tune.get("warnings", []), *val.get("warnings", []), *extra]
        ],
        "sizing": sizing_doc(opt, tune, capacity, batched if ch.rules["seqs"] else None, ch.max_len),
    }
    return finish_plan(plan, inp, opt, state_dir, det, est.get("fit"))


def finish_plan(plan: dict, inp: dict, opt: dict, state_dir: Path, det: dict, fit: dict | None) -> dict:
    """The plan's inputs (start renders them again), its options, its summary; checked against its schema."""
    plan["inputs"] = inp  # start re-renders from these and refuses a plan whose command was edited
    # the state dir as resolved here: stop run from another shell must find the server this plan's start recorded
    plan["options"] = {k: v for k, v in {**opt, "state_dir": str(state_dir)}.items() if v is not None}
    plan["summary"] = summary_rows(plan, det, fit)
    plan["summary_markdown"] = markdown_table(["Field", "Value"], plan["summary"])
    # what the human is shown must be a plan start would accept
    jsonio.check_schema(
        plan,
        "plan",
        "the plan these documents render is not one start would run",
        "pass the unmodified outputs of detect, validate, check_model, estimate_memory and cpu_tune",
    )
    return plan
