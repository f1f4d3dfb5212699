"""The checks that refuse a plan: documents that disagree, unsafe arguments, a dtype, length or command nobody sized."""

from __future__ import annotations

from pathlib import Path

from epyc import bundle, masking
from epyc.argtypes import is_revision, normalize_version
from epyc.decisions import command, kv_budget
from epyc.errors import ScriptError
from epyc.facts import hubcache, kv_cache, preload, runtimes

LAUNCHABLE_KINDS = ("text", "multimodal", "undetermined")


def mismatches(inp: dict) -> list[str]:
    """Why the five documents do not describe one serve: each script echoes the inputs its decision
    used, so a set assembled from different runs (another model, other weights, a KV grant below the
    need, another host) is caught here instead of serving something nobody sized."""
    det, val, chk, est, tune = (inp[k] for k in bundle.INPUT_SCRIPTS)
    out = []
    if chk.get("model") and est.get("model") and chk["model"] != est["model"]:
        out.append(f"check_model.py ran for {chk['model']}, estimate_memory.py for {est['model']}")
    # no revision is main, as the Hub reads it
    revision_checked, revision_sized = (d.get("revision") or "main" for d in (chk, est))
    if revision_checked != revision_sized:
        out.append(f"check_model.py checked revision {revision_checked}, estimate_memory.py sized {revision_sized}")
    out += kv_budget.disagreements(tune, est)
    ranks, bind = tune.get("tensor_parallel_size") or 1, str(tune.get("vllm_cpu_omp_threads_bind"))
    per_rank = [r.get("cpus") for r in tune["ranks"] if isinstance(r, dict)] if "ranks" in tune else None
    if per_rank is not None and (bind.split("|") != per_rank or len(bind.split("|")) != ranks):
        out.append(f"cpu_tune.py binds {masking.clip(bind, 80)}, not one core list per rank of its {ranks} ranks")
    checked = normalize_version(chk.get("vllm_version"))  # '0.32.0+cpu' -> '0.32.0'
    serving = normalize_version((val.get("stack") or {}).get("vllm"))
    if checked and serving and checked != serving:  # the architecture was judged by another vLLM's registry
        out.append(f"check_model.py judged the model with vLLM {checked}'s registry, validate.py found vLLM {serving}")
    ssm = (est.get("kv_layers") or {}).get("ssm_state_dtype")
    if ssm and det.get("avx512_bf16") is not None:
        # the SSM state's dtype, and so the KV page, depends on the CPU (kv_cache.ssm_state_dtype)
        served = kv_cache.ssm_state_dtype(bool(det["avx512_bf16"]), est.get("kv_dtype") or "bfloat16")
        if ssm != served:
            has = "yes" if det["avx512_bf16"] else "no"
            why = f"estimate_memory.py sized the recurrent state in {ssm}, vLLM keeps it in {served} on the CPU "
            out.append(why + f"detect.py read (AVX-512 BF16: {has}; pass --avx512-bf16 {has})")
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
    # one machine only when one target: validate.py run here for a plan of a spec, capture or sysroot tree of
    # another host would start that host's sizing here with nothing deferred (a tree standing in for this
    # machine is validated with --detect of that tree)
    if (read := det.get("target", "localhost")) != (checked_on := val.get("target", "localhost")):
        out.append(f"detect.py read {read}, validate.py checked {checked_on}")
    return out


def refuse_inconsistent_inputs(inp: dict, opt: dict) -> None:
    """The documents must say ready, launchable, one serve and a fit, for the model the options name."""
    val, chk, est = inp["validate"], inp["check_model"], inp["estimate_memory"]
    if not val.get("ready"):
        errs = "; ".join(e["message"] for e in val.get("errors", [])) or "not ready"
        fix = (val.get("errors") or [{}])[0].get("fix") or "fix what validate.py reported, then re-run it"
        raise ScriptError(f"validate.py is not ready: {errs}", fix)
    if chk.get("launchable") is False:
        raise ScriptError(f"check_model.py: {chk.get('message')}", "choose a model vLLM serves as chat/completions")
    if wrong := mismatches(inp):
        fix = "re-run the steps from the first one that differs, for one model on one host, and plan from those files"
        raise ScriptError("the five documents do not describe one serve: " + "; ".join(wrong), fix)
    if (fit := est.get("fit")) and not fit["fits"]:
        fix = fit.get("action") or "lower --max-model-len or use a smaller model"
        raise ScriptError(f"does not fit: required {fit['required_gb']} GiB vs {fit['ram_gb']} GiB RAM", fix)
    model = opt.get("model") or chk.get("model")
    if chk.get("model") and model != chk["model"]:
        fix = "run check_model.py and estimate_memory.py for the model you serve"
        raise ScriptError(f"check_model.py ran for {chk['model']}, the plan is for {model}", fix)


def refuse_unsafe_arguments(model: object, val: dict, tune: dict) -> None:
    """What becomes an argument must be one argument, never an option, and the pin exactly cpu_tune's."""
    if not isinstance(model, str) or not model or model.startswith("-") or any(ord(c) < 32 for c in model):
        fix = "pass a Hub id (owner/name) or a folder path that does not start with '-' (e.g. ./-name)"
        raise ScriptError(f"model {model!r} would be read as an option or is not one argument", fix)
    bound = command.bound_cpus(tune.get("vllm_cpu_omp_threads_bind"))
    pins = (tune.get("host_pin_argv", []), tune.get("container_cpuset_argv", []), tune.get("numa_nodes"), bound)
    if problem := command.pin_prefix_problem(*pins):
        raise ScriptError(problem, "pass the unmodified output of cpu_tune.py")
    if val["path"] == "host" and not (isinstance(val.get("python"), str) and val["python"].startswith("/")):
        fix = "pass the unmodified output of validate.py (it names the interpreter by absolute path)"
        raise ScriptError(f"validate.py's python {val.get('python')!r} is not an absolute path", fix)


def chosen_dtype(opt: dict, epyc: dict, backend: str, est: dict) -> str:
    """The serving dtype: one the platform computes in, and the one estimate_memory sized."""
    dtype, precision = opt.get("dtype") or epyc["precision"]["default"], epyc["precision"]
    if backend != "stock" and dtype not in precision["host_stack_supported"]:
        why = f"{dtype} is not a compute dtype of the zentorch CPU platform: " + precision["host_stack_note"]
        raise ScriptError(why, f"use {' or '.join(precision['host_stack_supported'])}")
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
        fix = "run check_model.py (and estimate_memory.py) again with a plain --revision"
        raise ScriptError(f"check_model.json's revision {str(revision)[:200]!r} is not a branch, tag or commit", fix)
    return revision


def refuse_unrunnable_command(val: dict, epyc: dict, facts: dict) -> None:
    """What the command would hold must be right: on the host, LD_PRELOAD only the pinned libraries; in a
    container, a known runtime on a local engine, and mounts of a model folder and of a hub cache that is a
    cache, never a system folder."""
    if val["path"] == "host":
        preload.preload_value((val.get("ld_preload") or {}).get("value"), epyc["host_stack"]["ld_preload_libs"])
        return
    runtimes.runtime_argv(val["runtime"], val.get("engine"))
    if facts.get("model_dir"):
        hubcache.bind_mount(facts["model_dir"], f"/models/{Path(facts['model_dir']).name}", read_only=True)
    cache = val["hf_cache"]["path"]
    hubcache.bind_mount(cache, epyc["container"]["hf_cache_mount_target"] + "/hub")
    # another host's cache is checked there, by its own chain
    if not val.get("deferred") and (problem := hubcache.hf_mount_problem(cache, facts.get("hf_cache"))):
        raise ScriptError(
            f"cannot mount the Hugging Face hub cache {cache[:300]!r} read-write into the container: it {problem}",
            hubcache.HF_MOUNT_FIX,
        )


CLAIMS = ("tensor_parallel", "fleet", "restart", "kernel_proof")  # what a row of `stacks` says was seen to work


def stack_found(val: dict, rows: list[dict]) -> dict:
    """The row of `stacks` validate's runtime is (its image, or its path's pins), else one nothing is known of."""
    stack, backend = val.get("stack") or {}, val.get("backend") or "zentorch"
    for row in rows:
        pins = (row["vllm"], row["zentorch"]) == (normalize_version(stack.get("vllm")), stack.get("zentorch"))
        pins = pins or (row["image"] or "-") == val.get("image")  # an image of ours, whatever its probe read
        if (row["path"], row["backend"]) == (val["path"], backend) and pins:
            return {**row, "image": val.get("image"), "setup": None}  # the user's own image/venv is kept
    label = f"the image {val['image']}" if val["path"] == "container" else f"the venv of {val.get('python')}"
    return {"name": None, "label": label, "image": val.get("image"), "vllm": normalize_version(stack.get("vllm"))}


def unmet(row: dict, needs: dict) -> list[str]:
    """What the plan needs that this stack is not known to do (unknown is not known)."""
    seen = {k: c["value"] is True for k, c in row.get("verified", {}).items() if k in CLAIMS}
    seen.update((q["method"], q["value"] is True) for q in row.get("verified", {}).get("quantization", []))
    archs, listed = needs["architectures"], row.get("listed") or needs["architectures"]  # no registry: not a gap
    gaps = {
        f"tensor parallelism ({needs['ranks']} ranks)": needs["ranks"] > 1 and not seen.get("tensor_parallel"),
        f"{needs['quantization']} checkpoints": needs["quantization"] and not seen.get(needs["quantization"]),
        f"{'/'.join(archs)} (not in vLLM {row['vllm']}'s registry)": bool(archs) and not set(archs) & set(listed),
    }
    return [what for what, gap in gaps.items() if gap]


def stack_for(inp: dict, rows: list[dict]) -> dict:
    """The stack the plan serves on: validate's when it is known to meet every need (tensor-parallel ranks, the
    architecture, the quantization), else the first row of its path and backend that is (set up by its one command;
    a locally built image only on docker, whose store holds it), else validate's, with what is unverified and the
    row that is known."""
    chk, found = inp["check_model"], stack_found(inp["validate"], rows)
    needs = {
        "ranks": inp["cpu_tune"].get("tensor_parallel_size") or 1,
        "architectures": chk.get("architectures") or [],
        "quantization": (chk.get("quantization") or {}).get("method"),
    }
    gaps = unmet(found, needs)
    known = [r for r in rows if r["backend"] == found.get("backend") and r["setup"] and not unmet(r, needs)]
    fits, docker = known if gaps and found["name"] else [], inp["validate"].get("runtime") in ("docker", "sudo docker")
    same = next((r for r in fits if r["path"] == found["path"] and (docker or not r.get("build"))), None)
    other = None if same else next((r for r in fits if r["path"] != found["path"] or r.get("build")), None)
    chosen, why = same or found, same and f"{found['label']} is not known to run {', '.join(gaps)}; this one is"
    doc = {k: chosen.get(k) for k in ("name", "label", "image", "vllm", "zentorch", "setup")}
    doc.update(why=why or None, unverified=[] if same else gaps)
    run = f"{other['label']} is known to{' (docker)' * bool(other.get('build'))}" if other else None
    doc["instead"] = other and f"{run}: {other['setup']}, then {other['validate']}, plan again"
    return {**doc, "verified": [k for k in CLAIMS if chosen.get("verified", {}).get(k, {}).get("value") is True]}


def stack_warnings(stack: dict) -> list[dict]:
    """What the human confirming the plan is told of its stack: a step to run first, needs nobody saw it meet."""
    first = {"check": "stack", "message": f"{stack['why']}: set it up first", "fix": stack["setup"]}
    why = f"{stack['label']} is not known to run {', '.join(stack['unverified'])}: verify will show if it answers"
    unknown = {"check": "stack", "message": why, "fix": stack["instead"]}
    return [w for w, on in ((first, stack["why"]), (unknown, stack["unverified"])) if on]
