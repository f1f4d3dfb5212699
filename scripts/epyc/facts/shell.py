"""What a plan depends on besides its documents: this shell's secrets, the model's folder, the HF cache."""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

from epyc import bundle, jsonio
from epyc.errors import ScriptError
from epyc.facts import hubcache
from epyc.masking import SECRET_VALUE


def key_facts(key_env: str | None) -> dict:
    """Whether the API key variable is set in this shell, and its length (its value never leaves here)."""
    return {
        "api_key_set": bool(key_env and os.environ.get(key_env)),
        "api_key_length": len(os.environ.get(key_env, "").strip()) if key_env else None,
    }


def tls_facts(opt: dict, target: str, there: bool = False) -> dict | None:
    """The TLS pair's paths, CA, the name served on and what the certificate holds (the key's content stays here);
    `there`: another host's pair, its paths that host's, read and checked there by `launch.py up`."""
    given = {k: opt.get(f"tls_{k}") for k in ("cert", "key", "ca")}
    if not (given["cert"] or given["key"]):
        return None
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization as ser

    name = opt.get("tls_name") or (socket.gethostname() if target == "localhost" else "another host (--tls-name)")
    said = bundle.load_epyc()["tls"]  # a host name's pattern (an IPv6 literal is no URL's host) and the refusals
    named, absolute = re.fullmatch(said["host_name"], name), all(map(os.path.isabs, filter(None, given.values())))
    bad = (not (given["cert"] and given["key"]), there and not absolute, opt.get("tls_name") and not named)
    for no, (why, fix) in zip(bad, said["given"]):  # in the order of epyc.json's tls.given
        if no:
            raise ScriptError(why.format(name=name[:100]), fix)
    if there:
        return {"tls": {**given, "name": name}, "checked": True}
    paths = {k: v and os.path.realpath(jsonio.user_path(v)) for k, v in given.items()}
    out = {"tls": {**paths, "name": name}, "now": time.time()}
    try:
        cert = x509.load_pem_x509_certificate(Path(paths["cert"] or "").read_bytes())
        key = ser.load_pem_private_key(Path(paths["key"] or "").read_bytes(), None)
    except (OSError, ValueError, TypeError) as exc:  # the message names a path or the format, never the content
        return {**out, "unreadable": f"{type(exc).__name__}: {exc}"}
    alt = next((e.value for e in cert.extensions if isinstance(e.value, x509.SubjectAlternativeName)), [])
    spki = (ser.Encoding.DER, ser.PublicFormat.SubjectPublicKeyInfo)
    out["tls"]["ca"] = paths["ca"] or (paths["cert"] if cert.issuer == cert.subject else None)
    out.update({f"not_{k}": getattr(cert, f"not_valid_{k}_utc").timestamp() for k in ("before", "after")})
    matches = cert.public_key().public_bytes(*spki) == key.public_key().public_bytes(*spki)
    return {**out, "matches": matches, "names": [str(n.value) for n in alt]}


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
        "tls": tls_facts(opt, inputs["detect"].get("target", "localhost"), bool(val.get("deferred"))),
        "model_dir": os.path.realpath(folder) if folder is not None and folder.is_dir() else None,
        "hf_cache": hubcache.cache_listing(val["hf_cache"]["path"])
        if list_cache and val.get("path") == "container" and not val.get("deferred")
        else None,
    }
