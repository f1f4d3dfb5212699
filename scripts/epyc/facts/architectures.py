"""Which architectures a given vLLM serves, and as what: text / multimodal / pooling / unsupported."""

from __future__ import annotations

import argparse
import json
import sys

from epyc import argtypes, bundle, subproc
from epyc.errors import ScriptError
from epyc.facts import runtimes

SNAPSHOT_DIR = bundle.DATA_DIR / "vllm_registry"
PROBE_TIMEOUT_S = 180

# vLLM's registry dicts and what serving them means, in precedence (LlamaForCausalLM, also an embedding, generates)
REGISTRY_KINDS = [
    ("_MULTIMODAL_MODELS", "multimodal"),
    ("_TEXT_GENERATION_MODELS", "text"),
    ("_TRANSFORMERS_SUPPORTED_MODELS", "text"),
    ("_TRANSFORMERS_BACKEND_MODELS", "text"),
    ("_EMBEDDING_MODELS", "pooling"),
    ("_REWARD_MODELS", "pooling"),
    ("_SEQUENCE_CLASSIFICATION_MODELS", "pooling"),
    ("_TOKEN_CLASSIFICATION_MODELS", "pooling"),
    ("_LATE_INTERACTION_MODELS", "pooling"),
    ("_SPECULATIVE_DECODING_MODELS", "speculative"),
]


def kinds_from_dicts(dicts: dict[str, list[str]]) -> dict[str, str]:
    """{dict name: [arch, ...]} -> {arch: kind}, first kind in REGISTRY_KINDS order wins."""
    out: dict[str, str] = {}
    for name, kind in REGISTRY_KINDS:
        for arch in dicts.get(name, []):
            out.setdefault(arch, kind)
    return dict(sorted(out.items()))


# Runs inside the interpreter that will serve: imports vLLM for real, so plugins count too.
PROBE_CODE = r"""
import json, sys
out = {}
try:
    import importlib.metadata as md
    import vllm
    out["vllm_version"] = getattr(vllm, "__version__", None)
    from vllm.model_executor.models import registry as r
    names = %s
    out["dicts"] = {n: sorted(getattr(r, n, {}) or {}) for n in names}
    out["supported"] = sorted(r.ModelRegistry.get_supported_archs())
    # what this vLLM loads without --trust-remote-code (model_check.remote_code_needed): config types it or
    # transformers defines, those with a tokenizer of their own, tokenizer classes by name, hub tokenizers ignored
    try:
        import transformers
        from transformers.models.auto import configuration_auto as ca, tokenization_auto as ta
        from vllm.transformers_utils.config import _CONFIG_REGISTRY
        try:
            from vllm.tokenizers.registry import _MODEL_TYPES_WITH_INCORRECT_TOKENIZER_CLASS as vllm_ignored
        except Exception:
            vllm_ignored = ()
        own_config = {}
        for kind in _CONFIG_REGISTRY:
            try:
                own_config[kind] = _CONFIG_REGISTRY[kind] in ta.TOKENIZER_MAPPING
            except Exception:
                own_config[kind] = False
        out["own_code"] = {
            "config_types": sorted(set(ca.CONFIG_MAPPING_NAMES) | set(_CONFIG_REGISTRY)),
            "tokenizer_config_types": sorted({k for k in ca.CONFIG_MAPPING_NAMES if k not in _CONFIG_REGISTRY
                                              and k in ta.TOKENIZER_MAPPING_NAMES}
                                             | {k for k, mapped in own_config.items() if mapped}),
            "tokenizer_classes": sorted({v for v in ta.TOKENIZER_MAPPING_NAMES.values() if isinstance(v, str)}
                                        | set(ta.REGISTERED_TOKENIZER_CLASSES) | set(ta.REGISTERED_FAST_ALIASES)
                                        | {n for n in dir(transformers) if n.endswith(("Tokenizer", "TokenizerFast",
                                                                                        "Backend"))}
                                        | {"TokenizersBackend", "BloomTokenizer", "PreTrainedTokenizerFast"}),
            "remote_tokenizer_ignored": sorted(set(getattr(ta, "MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS", ()))
                                               | set(vllm_ignored)),
        }
    except Exception:
        pass
except Exception as exc:
    out["error"] = "%%s: %%s" %% (type(exc).__name__, exc)
print("@@REGISTRY@@" + json.dumps(out))
""" % repr([n for n, _ in REGISTRY_KINDS])


_NAMES = {"type": "array", "maxItems": 100000, "items": {"type": "string", "maxLength": 200}}
OWN_CODE_KEYS = ["config_types", "tokenizer_config_types", "tokenizer_classes", "remote_tokenizer_ignored"]
OWN_CODE_SHAPE = {"type": "object", "required": OWN_CODE_KEYS, "properties": dict.fromkeys(OWN_CODE_KEYS, _NAMES)}
REGISTRY_SHAPE = {
    "type": "object",
    "properties": {
        "vllm_version": {"type": ["string", "null"], "maxLength": 100},
        "error": {"type": "string"},
        "dicts": {"type": "object", "additionalProperties": _NAMES},
        "supported": _NAMES,
        "own_code": OWN_CODE_SHAPE,
    },
    "if": {"not": {"required": ["error"]}},
    "then": {"required": ["dicts", "vllm_version"]},
}


def probe_live(argv_prefix: list[str], label: str) -> dict:
    raw, why = subproc.run_probe(argv_prefix, PROBE_CODE, "@@REGISTRY@@", PROBE_TIMEOUT_S, shape=REGISTRY_SHAPE)
    if raw is None:
        raise ScriptError(
            f"could not probe vLLM's registry in {label}: {why}",
            "check that this runtime has vLLM installed (python -c 'import vllm')",
        )
    if "error" in raw:
        raise ScriptError(
            f"vLLM in {label} failed to import its registry: {raw['error']}", "repair the vLLM install of that runtime"
        )
    kinds = kinds_from_dicts(raw["dicts"])
    for arch in raw.get("supported", []):
        kinds.setdefault(arch, "unknown")
    return {
        "vllm_version": raw["vllm_version"],
        "source": f"probe:{label}",
        "architectures": kinds,
        **({"own_code": raw["own_code"]} if raw.get("own_code") else {}),
    }


def load_snapshot(version: str | None) -> dict | None:
    v = argtypes.normalize_version(version)
    if not v or not (SNAPSHOT_DIR / f"{v}.json").exists():
        return None
    doc = json.loads((SNAPSHOT_DIR / f"{v}.json").read_text())
    doc["source"] = f"snapshot:data/vllm_registry/{v}.json"
    return doc


def add_probe_args(p: argparse.ArgumentParser, source: argparse._ActionsContainer) -> None:
    """--python and --image on `source` (the parser, or a group of it), and --runtime: the vLLM to probe."""
    source.add_argument("--python", type=argtypes.executable, help="probe the vLLM installed for this interpreter")
    source.add_argument("--image", type=argtypes.image_ref, help="probe the vLLM inside this local container image")
    p.add_argument(
        "--runtime",
        default="docker",
        choices=sorted(runtimes.CONTAINER_RUNTIMES),
        help="container runtime for --image (default docker)",
    )


def probe_argv(
    python: str | None, image: str | None, runtime: str | None, engine: str | None = None
) -> tuple[list[str], str]:
    """argv prefix that runs `python -c` in the runtime that will serve (docker on `engine`: validate's)."""
    if image:
        rt = runtimes.runtime_argv(runtime or "docker", engine)
        return [*rt, "run", "--rm", "--network=none", "--entrypoint", "python3", image], f"image:{image}"
    return [python or sys.executable], f"python:{python or sys.executable}"


def stack_row(epyc: dict, name: str) -> dict:
    """A row of data/epyc.json `stacks`, its pins resolved (vllm, zentorch, image) and its registry's names."""
    row, pins = epyc["stacks"][name], epyc[epyc["stacks"][name]["pins"]]
    listed = (load_snapshot(pins["vllm_version"]) or {}).get("architectures")
    zentorch = pins.get("zentorch_version") if row["backend"] == "zentorch" else None
    image = row.get("image", pins.get("image"))
    return {**row, "name": name, "vllm": pins["vllm_version"], "zentorch": zentorch, "image": image, "listed": listed}


def stack_listing(epyc: dict, archs: list[str], path: str | None, backend: str | None) -> dict | None:
    """The row (of `path` and `backend` first) one command sets up whose registry serves one of `archs`."""
    rows = [stack_row(epyc, n) for n in epyc["stacks"]]
    rows.sort(key=lambda r: (r["path"] != path, r["backend"] != backend))  # stable: data's order within
    return next(
        (r for r in rows if r["setup"] and {(r["listed"] or {}).get(a) for a in archs} & {"text", "multimodal"}), None
    )
