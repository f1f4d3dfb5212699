"""Can the vLLM that will run this model serve it as a generation endpoint, and through which API?"""

from __future__ import annotations

import argparse

from epyc import argtypes, masking
from epyc.errors import ScriptError
from epyc.facts import architectures, hf_model, quantization, runtimes

# ---------------------------------------------------------------- pure decisions

MAX_TEMPLATE_NAMES = 20


def classify_template(
    jinja: str | None, tokenizer_config: dict | None, template_json: dict | None, readable: bool = True
) -> dict:
    """Is there a chat template vLLM picks unasked? The first of chat_template.jinja, tokenizer_config.json's and
    chat_template.json's; a list needs a 'default' or one entry; what is not text is unknown (vLLM's to read).
    Not `readable` (not all the model's files are here): none found is unknown, not absent."""
    out = {"status": "unknown", "source": None, "selected_name": None, "names": []}
    candidates = [
        ("chat_template.jinja", jinja),
        ("tokenizer_config.json", (tokenizer_config or {}).get("chat_template")),
        ("chat_template.json", (template_json or {}).get("chat_template")),
    ]
    for source, value in candidates:
        if value is None or value in ("", []):
            continue
        if isinstance(value, str):
            if "\x00" in value or "\ufffd" in value:  # not UTF-8 text: no template
                return {**out, "source": source}
            if value.strip():
                return {**out, "status": "present", "source": source}
            continue
        if not (isinstance(value, list) and all(_loadable_entry(t) for t in value)):
            return {**out, "source": source}  # a number or an object where a template goes, or a broken entry
        every = [t["name"] for t in value]
        names = [n[:100] for n in every[:MAX_TEMPLATE_NAMES]]  # shown, not all carried
        names += [f"... ({len(every)} in all)"] if len(every) > MAX_TEMPLATE_NAMES else []
        if "default" in every or len(value) == 1:  # the one transformers selects
            selected = "default" if "default" in every else names[0]
            return {**out, "status": "present", "source": source, "selected_name": selected, "names": names}
        return {**out, "status": "ambiguous", "source": source, "names": names}
    return {**out, "status": "absent" if readable else "unknown"}


def _loadable_entry(t: object) -> bool:
    """A chat-template list entry transformers loads: a printable name and a template, both text."""
    texts = isinstance(t, dict) and all(isinstance(t.get(k), str) and t[k].strip() for k in ("name", "template"))
    return texts and t["name"].isprintable()


def classify_kind(architectures: list[str], registry: dict | None) -> tuple[str, str | None]:
    """(kind, matched architecture) from the serving vLLM's registry; vLLM tries the list in order."""
    if registry is None:
        return "undetermined", None
    for arch in architectures:
        kind = registry["architectures"].get(arch)
        if kind == "speculative":
            return "unsupported", arch  # draft models for speculative decoding do not serve alone
        if kind is not None:
            return ("text" if kind == "unknown" else kind), arch
    return "unsupported", None


def _auto_map(doc: dict | None, key: str) -> object:
    auto = (doc or {}).get("auto_map")
    return auto.get(key) if isinstance(auto, dict) else None


def remote_code_needed(cfg: dict, tokenizer_config: dict | None, own: dict | None) -> str | None:
    """Why vLLM would need --trust-remote-code (never passed here) to load this model, or None: an auto_map config
    or tokenizer of a type or class the serving install (`own`, the registry probe's lists; none: not judged) lacks."""
    if not own:
        return None
    kind = cfg.get("model_type")
    if _auto_map(cfg, "AutoConfig") and isinstance(kind, str) and kind and kind not in own["config_types"]:
        return (
            f"its config (model_type {masking.clip(repr(kind), 60)}) is the repository's own code (auto_map AutoConfig)"
        )
    auto = (tokenizer_config or {}).get("auto_map")
    if not (auto if isinstance(auto, list) else _auto_map(tokenizer_config, "AutoTokenizer")):
        return None
    if kind in own["remote_tokenizer_ignored"] or kind in own["tokenizer_config_types"]:
        return None
    named = (tokenizer_config or {}).get("tokenizer_class")
    named = named.removesuffix("Fast") if isinstance(named, str) else None
    if named and (named in own["tokenizer_classes"] or f"{named}Fast" in own["tokenizer_classes"]):
        return None
    return (
        f"its tokenizer{f' ({masking.clip(named, 60)})' if named else ''} is the repository's own code "
        "(auto_map AutoTokenizer)"
    )


def gated_warnings(model: str, gated: bool | str | None) -> list[dict]:
    """A model the Hub gates, or may gate (not asked here): its host downloads it only with HF_TOKEN set there."""
    why = {True: "gated on the Hub", "unknown": "gated: unknown (the Hub was not asked here); if it is gated"}
    fix = "on the host, export HF_TOKEN=<a token whose account accepted the license> where launch.py start runs"
    message = f"{model}: {why.get(gated)}, its host downloads it only with HF_TOKEN set there"
    return [{"check": "gated", "message": message, "fix": fix}] if gated in why else []


def endpoints_for(kind: str, template_status: str, policy: dict) -> dict:
    """Which OpenAI endpoints the served model answers and which to hand off: chat needs a template vLLM picks by
    itself (without one a multimodal model is not launchable); an unreadable one is "unknown", settled by verify."""
    serves = kind in policy["generation_kinds"] or (kind == "undetermined" and policy["undetermined_proceeds"])
    if serves and template_status == "unknown":
        endpoints, primary = [], "unknown"
    elif serves and template_status == "present":
        endpoints, primary = ["chat_completions", "completions"], "chat_completions"
    elif serves and not (kind == "multimodal" and policy["multimodal_needs_chat_template"]):
        endpoints, primary = ["completions"], "completions"
    else:
        endpoints, primary = [], None
    return {"supported_endpoints": endpoints, "primary_endpoint": primary, "launchable": primary is not None}


REFUSAL_FIX = {
    "pooling": "choose a text-generation model: this skill serves chat/completions, not embeddings or scores",
    "unsupported": "choose a model whose architecture this vLLM lists (python3 scripts/vllm_registry.py), "
    "or serve a vLLM that has it",
    "multimodal": "pass a chat template (vllm serve --chat-template FILE), or choose a model that ships one",
}


def verdict(
    kind: str, arch: str | None, archs: list[str], tmpl: dict, launchable: bool, version: str | None
) -> tuple[int, str]:
    """Exit code and the one-line message the agent reports."""
    v = f"vLLM {version}" if version else "this vLLM"
    if kind == "pooling":
        return 1, (
            f"{arch} is a pooling / embedding / reranker model in {v}: it does not serve "
            "/v1/chat/completions or /v1/completions"
        )
    if kind == "unsupported":
        return 1, (
            f"{', '.join(archs)} is not in {v}'s model registry"
            if arch is None
            else f"{arch} is a speculative-decoding draft model in {v}; it does not serve on its own"
        )
    if kind == "multimodal" and not launchable:
        why = {
            "absent": "it has no chat template",
            "ambiguous": f"it has several chat templates and no default ({', '.join(tmpl['names'])})",
        }[tmpl["status"]]
        return 1, f"{arch} is multimodal in {v} but {why}: pass --chat-template <file> to serve it"
    if kind == "undetermined":
        return 0, "support could not be determined here; proceed, the launch confirms"
    if tmpl["status"] == "unknown":  # plan and verify say the same: verify settles it on the server
        return 0, (
            f"{arch} serves as {kind} generation in {v}; endpoint unknown (the chat template could not be "
            "read here): verify settles it on the server, chat first, then completions"
        )
    endpoint = "/v1/chat/completions" if tmpl["status"] == "present" else "/v1/completions"
    extra = {
        "present": "chat template present",
        "absent": "no chat template: raw prompts only (add one with --chat-template <file>)",
        "ambiguous": f"several chat templates, no default ({', '.join(tmpl['names'])}): "
        "choose one with --chat-template",
    }[tmpl["status"]]
    return 0, f"{arch} serves as {kind} generation in {v}; use {endpoint} ({extra})"


# ---------------------------------------------------------------- gathering (I/O)


def quantization_report(desc: dict | None, epyc: dict) -> dict | None:
    """The checkpoint's quantization, and the kernel each path runs it with (bfloat16 serving)."""
    if desc is None:
        return None
    q = epyc["quantization"]
    kernels = {
        b: quantization.cpu_kernel(desc, b, "bfloat16", q["kernels"], None, q.get("stock_needs_avx512"))
        for b in ("zentorch", "stock")
    }
    return {**desc, "cpu_kernels": kernels}


def pick_registry(args: argparse.Namespace, notes: list[str]) -> dict | None:
    """The registry of the vLLM that will serve: probe it live when we can, else a saved snapshot."""
    # an image is asked on the engine this shell's docker names (as validate.py records it for the plan)
    engine = runtimes.shell_docker_engine() if args.image and not args.python and args.runtime == "docker" else None
    if args.python or (args.image and runtimes.image_is_local(args.runtime, args.image, engine)):
        prefix, label = architectures.probe_argv(args.python, args.image, args.runtime, engine)
        try:
            return architectures.probe_live(prefix, label)
        except ScriptError as exc:
            if args.python:  # the user named the interpreter that will serve: a snapshot is not its registry
                raise ScriptError(
                    f"--python {args.python}: its vLLM registry could not be probed ({exc.error})",
                    "pass the interpreter of the host stack (setup_host_stack.py prints it), or "
                    "drop --python to use the pinned version's snapshot",
                )
            notes.append(f"registry probe failed ({exc.error}); falling back to a snapshot")
    elif args.image:
        notes.append(f"image {args.image} is not pulled: its registry was not probed; using a snapshot")
    snap = architectures.load_snapshot(args.vllm_version)
    if snap is None:
        notes.append(f"no registry snapshot for vLLM {args.vllm_version} in data/vllm_registry/")
    return snap


def read_model(files: hf_model.ModelFiles) -> dict:
    cfg = files.config()
    archs = cfg.get("architectures")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise ScriptError(
            f"{files.ref}: config.json has no 'architectures' list",
            "this is not a transformers model vLLM can load; check the model id",
        )
    return {
        "architectures": archs,
        "config": cfg,
        "quantization": quantization.describe(cfg),
        "jinja": files.text("chat_template.jinja"),
        "tokenizer_config": files.json("tokenizer_config.json"),
        "template_json": files.json("chat_template.json"),
        "gated": files.gated(),
    }


def unreadable_doc(
    base: dict, registry: dict | None, version: str, why: hf_model.Unreadable, epyc: dict, notes: list[str]
) -> dict:
    """A model whose files cannot be read here (gated, offline): support undetermined, and the launch confirms."""
    tmpl = classify_template(None, None, None, readable=False)
    return {
        **base,
        "source": "hub",
        "model_dir": None,
        "architectures": [],
        "kind": "undetermined",
        "supported": None,
        "registry_source": (registry or {}).get("source"),
        "vllm_version": version,
        "chat_template": tmpl,
        **endpoints_for("undetermined", tmpl["status"], epyc["model_support_policy"]),
        "message": f"{why.message}; support could not be determined -- proceed, the launch confirms",
        "fix": why.fix,
        "unreadable_reason": why.reason,
        "notes": notes,
        "gated": (gated := why.reason == "gated" or "unknown"),  # True, or "unknown": the Hub did not answer
        "warnings": gated_warnings(base["model"], gated),
    }


def refuse_remote_code(doc: dict, remote: str, arch: str, version: str) -> None:
    """vLLM loads the model only with --trust-remote-code, which this bundle never passes: refused."""
    message = (
        f"{arch} is in vLLM {version}'s registry, but {remote}: vLLM loads it only with --trust-remote-code, "
        "which this bundle does not pass (it would run the repository's Python)"
    )
    fix = (
        "choose a model vLLM loads with its own code (the same model converted to a transformers "
        "architecture, or another), or serve it by hand, having read its code, with vllm serve --trust-remote-code"
    )
    doc.update(supported=False, launchable=False, supported_endpoints=[], primary_endpoint=None, remote_code=remote)
    doc.update(message=message, error=message, fix=fix)


def check(
    model_ref: str,
    revision: str | None,
    vllm_version: str,
    registry: dict | None,
    hub_timeout: float,
    epyc: dict,
    notes: list[str],
    config: str | None = None,
    where: tuple[str | None, str | None] = (None, None),
) -> tuple[dict, int]:
    """check_model.py's document and exit code: the architecture judged by the serving vLLM's registry, the
    endpoint by the chat template. With `config`: from that file and the tokenizer and template files beside it."""
    version = (registry or {}).get("vllm_version") or vllm_version
    probed = registry and (registry["source"] or "").startswith("probe")
    if probed and argtypes.normalize_version(version) != argtypes.normalize_version(vllm_version):
        notes.append(f"probed vLLM is {version}, not the --vllm-version {vllm_version} given")
    base = {"model": model_ref, "revision": revision}
    try:
        files = hf_model.config_only(config) if config else hf_model.resolve(model_ref, revision)
        model = hf_model.with_deadline(lambda: read_model(files), hub_timeout, online=files.kind == "hub")
    except hf_model.Unreadable as why:
        return unreadable_doc(base, registry, version, why, epyc, notes), 0
    tmpl = classify_template(model["jinja"], model["tokenizer_config"], model["template_json"], files.kind != "config")
    kind, arch = classify_kind(model["architectures"], registry)
    eps = endpoints_for(kind, tmpl["status"], epyc["model_support_policy"])
    code, message = verdict(kind, arch, model["architectures"], tmpl, eps["launchable"], version)
    doc = {
        **base,
        "source": files.kind,
        "model_dir": str(files.folder) if files.kind == "local" else None,
        "architectures": model["architectures"],
        "kind": kind,
        "supported": None if kind == "undetermined" else code == 0,
        "registry_source": (registry or {}).get("source"),
        "vllm_version": version,
        "chat_template": tmpl,
        **eps,
        "message": message,
        "notes": notes,
        "quantization": quantization_report(model["quantization"], epyc),
        "gated": model["gated"],
        "warnings": gated_warnings(model_ref, model["gated"]),
    }
    code = 1 if kind in epyc["model_support_policy"]["refuse_kinds"] else code
    own = (registry or {}).get("own_code")
    remote = None if code else remote_code_needed(model["config"], model["tokenizer_config"], own)
    if not own and (_auto_map(model["config"], "AutoConfig") or (model["tokenizer_config"] or {}).get("auto_map")):
        notes.append(
            f"the repository ships code of its own (auto_map): whether vLLM {version} needs --trust-remote-code for it "
            f"(never passed here) was not judged: its registry ({(registry or {}).get('source')}) does not list it"
        )
    if remote:  # vLLM refuses it at load without --trust-remote-code, which this bundle never passes
        refuse_remote_code(doc, remote, arch, version)
        return doc, 1
    if code:  # the one contract: exit 1 carries error and fix; an architecture another stack lists: its setup step
        row = kind == "unsupported" and not arch and architectures.stack_listing(epyc, doc["architectures"], *where)
        fix = row and f"vLLM {row['vllm']} has it ({row['label']}): {row['setup']}, then {row['validate']}, then this"
        doc.update(error=message, fix=fix or REFUSAL_FIX.get(kind, REFUSAL_FIX["unsupported"]))
    return doc, code
