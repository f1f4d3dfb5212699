"""What a plan depends on besides its documents: this shell's secrets, the model's folder, the HF cache."""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

from epyc import jsonio
from epyc.facts import hubcache
from epyc.masking import SECRET_VALUE


def key_facts(key_env: str | None) -> dict:
    """Whether the API key variable is set in this shell, and its length (its value never leaves here)."""
    return {
        "api_key_set": bool(key_env and os.environ.get(key_env)),
        "api_key_length": len(os.environ.get(key_env, "").strip()) if key_env else None,
    }


def tls_facts(opt: dict, target: str) -> dict | None:
    """The certificate pair's facts a plan is checked against, read with `cryptography` (the key's content never
    leaves here): its paths, the CA clients trust, the name the plan serves on, and what the certificate holds."""
    if not (opt.get("tls_cert") or opt.get("tls_key")):
        return None
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization as ser

    ssh = re.fullmatch(r"(?:[\w.-]+@)?([\w.-]+)(?::[0-9]+)?", target)  # another host by ssh; a spec names none
    here = target == "localhost" or target.startswith("sysroot:")
    name = opt.get("tls_name") or (socket.gethostname() if here else ssh and ssh.group(1))
    paths = {
        k: os.path.realpath(jsonio.user_path(opt[f"tls_{k}"])) if opt.get(f"tls_{k}") else None
        for k in ("cert", "key", "ca")
    }
    out = {"tls": {**paths, "name": name}, "now": time.time()}
    try:
        cert = x509.load_pem_x509_certificate(Path(paths["cert"] or "").read_bytes())
        key = ser.load_pem_private_key(Path(paths["key"] or "").read_bytes(), None)
    except (OSError, ValueError, TypeError) as exc:  # the message names a path or the format, never the content
        return {**out, "unreadable": f"{type(exc).__name__}: {exc}"}
    try:
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [*alt.get_values_for_type(x509.DNSName), *map(str, alt.get_values_for_type(x509.IPAddress))]
    except x509.ExtensionNotFound:
        names = []
    spki = (ser.Encoding.DER, ser.PublicFormat.SubjectPublicKeyInfo)
    out["tls"]["ca"] = paths["ca"] or (paths["cert"] if cert.issuer == cert.subject else None)
    return {
        **out,
        "matches": cert.public_key().public_bytes(*spki) == key.public_key().public_bytes(*spki),
        "not_before": cert.not_valid_before_utc.timestamp(),
        "not_after": cert.not_valid_after_utc.timestamp(),
        "names": names,
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
        "tls": tls_facts(opt, inputs["detect"].get("target", "localhost")),
        "model_dir": os.path.realpath(folder) if folder is not None and folder.is_dir() else None,
        "hf_cache": hubcache.cache_listing(val["hf_cache"]["path"])
        if list_cache and val.get("path") == "container" and not val.get("deferred")
        else None,
    }
