"""What a plan depends on besides its documents: this shell's secrets, the model's folder, the HF cache."""

from __future__ import annotations

import os

from epyc import jsonio
from epyc.facts import hubcache
from epyc.masking import SECRET_VALUE


def key_facts(key_env: str | None) -> dict:
    """Whether the API key variable is set in this shell, and its length (its value never leaves here)."""
    return {
        "api_key_set": bool(key_env and os.environ.get(key_env)),
        "api_key_length": len(os.environ.get(key_env, "").strip()) if key_env else None,
    }


def shell_facts(opt: dict, inputs: dict, list_cache: bool = True) -> dict:
    """What a plan depends on besides its documents, from this shell and disk (`list_cache`: the HF cache too)."""
    chk, val = inputs["check_model"], inputs["validate"]
    model = opt.get("model") or chk.get("model") or ""
    folder = jsonio.user_path(model, "the model") if model else None
    key_env = opt.get("api_key_env")
    return {
        "hf_token_set": bool(os.environ.get("HF_TOKEN")),
        "hf_offline": os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"),
        # another host's key is set there (its plan says so): this shell need not hold it
        **(key_facts(key_env) if not val.get("deferred") else {"api_key_set": bool(key_env), "api_key_length": None}),
        # a value no header carries is refused here, as start would refuse it, not after the human confirmed
        "unsendable_secrets": [
            name
            for name in ("HF_TOKEN", key_env)
            if name and os.environ.get(name) and not SECRET_VALUE.fullmatch(os.environ[name])
        ],
        "model_dir": os.path.realpath(folder) if folder is not None and folder.is_dir() else None,
        "hf_cache": hubcache.cache_listing(val["hf_cache"]["path"])
        if list_cache and val.get("path") == "container" and not val.get("deferred")
        else None,
    }
