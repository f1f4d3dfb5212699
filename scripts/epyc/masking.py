"""Secrets: which values are secret, and masking them in everything the bundle prints."""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from typing import Any

SECRET_NAME = re.compile(r"(?i)(key|token|secret|passw)")
_NAMED_SECRETS: set[str] = set()
# credentials written into a URL (user:password@), never printed: they run to the authority's last '@', as
# urllib3 reads them, and a bounded scheme keeps the scan linear
URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,31}://)[^/\s]*@")
# the keys our documents are made of (snake_case), never masked: a key `error` masked would break the contract;
# keys from a user's data (a tensor name) are masked like any string
OUR_KEY = re.compile(r"[a-z][a-z0-9_]{0,63}")
# a key's name then ':' or '=' (a header, JSON, a query string): "token count 5" is prose, not a credential
_BEARER = re.compile(r"(?i)(bearer\s+|(?:api[_-]?key|token)[\"']?\s*[:=][\"'\s]*)[^\s\"',}]+")
SECRET_VALUE = re.compile(r"[\x21-\x7e]{1,4096}")


def treat_as_secret(*names: str) -> None:
    """The verbs that read a plan name its key's variables (`--api-key-env MYAPI`) here: masked from then on."""
    _NAMED_SECRETS.update(n for n in names if n)


def secret_values() -> list[str]:
    """The values this shell holds under secret-looking names (8 characters at least, so `...=false` is no
    secret) or names a plan marked secret (4 at least); longest first, so a key inside a longer one is masked whole."""
    found = {v for k, v in os.environ.items() if SECRET_NAME.search(k) and len(v.strip()) >= 8}
    found |= {os.environ[k] for k in _NAMED_SECRETS if len(os.environ.get(k, "").strip()) >= 4}
    for value in os.environ.values():  # HF_ENDPOINT=https://user:PASSWORD@mirror: the password as written and as sent
        cred = URL_CREDENTIALS.search(value)
        password = cred.group(0)[len(cred.group(1)) : -1].partition(":")[2] if cred else ""
        found |= {form for form in (password, urllib.parse.unquote(password)) if len(form) >= 4}
    return sorted(found, key=len, reverse=True)


def clip(text: str, limit: int, tail: bool = False) -> str:
    """text shortened to `limit` characters (its end, with tail) after its secrets are masked: a cut made
    first can leave part of a secret the mask no longer sees."""
    text = mask_secrets(text)
    return text[-limit:] if tail else text[:limit]


def secret_forms(values: list[str]) -> list[str]:
    """Each secret value in the forms an honest echo carries it, longest first: as is and stripped, JSON-escaped,
    percent-encoded (either hex case), and base64 as an HTTP Basic header carries `user:SECRET`."""
    forms: set[str] = set()
    for value in filter(None, values):
        for form in filter(None, {value, value.strip()}):
            url_form = urllib.parse.quote(form, safe="", errors="surrogateescape")
            url_lower = re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), url_form)
            forms.update((form, json.dumps(form)[1:-1], url_form, url_lower))
        forms.update(base64_forms(value.strip()))
    return sorted(forms, key=len, reverse=True)


def base64_forms(value: str) -> list[str]:
    """The characters of value's base64 that it alone decides, at each of the three offsets in a 3-byte group
    (a Basic header's `user:SECRET`): found whatever comes before and after."""
    import base64

    raw = value.encode("utf-8", "surrogateescape")
    forms = []
    for k in range(3):
        text = base64.b64encode(b"\0" * k + raw + b"\0\0").decode()
        first, end = -(-8 * k // 6), 8 * (k + len(raw)) // 6  # chars whose 6 bits all lie in value's bytes
        if end - first >= 8:  # as short a run as a word would be masked everywhere
            forms.append(text[first:end])
    return forms


def mask_forms(text: str, forms: list[str]) -> str:
    """text with every form and any URL's credentials masked; overlapping secrets are masked as the union of
    their spans. Cheap on text without them (kernel_proof masks every line of a log)."""
    spans = []
    for form in forms:
        at = text.find(form)
        while at != -1:
            spans.append((at, at + len(form)))
            at = text.find(form, at + 1)
    if spans:
        out, end = [], 0
        for start, stop in sorted(spans):
            if start > end or not out:  # a new span (one touching or inside the last extends it)
                out += [text[end:start], "***"]
            end = max(end, stop)
        text = "".join(out) + text[end:]
    return URL_CREDENTIALS.sub(r"\1***@", text) if "://" in text else text


def mask_secrets(text: str, values: list[str] | None = None) -> str:
    return mask_forms(text, secret_forms(secret_values() if values is None else values))


class _MaskedStream:
    """stderr as the libraries see it: what they log through their own handlers is masked as log() masks."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(mask_secrets(text))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def masked_strings(value: Any, values: list[str]) -> Any:
    """The document with secrets masked inside its strings (and keys that are not ours): it stays JSON."""
    if isinstance(value, str):
        return mask_secrets(value, values)
    if isinstance(value, dict):
        return {
            k if isinstance(k, str) and OUR_KEY.fullmatch(k) else masked_strings(k, values): masked_strings(v, values)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [masked_strings(v, values) for v in value]
    return value


def mask_token_patterns(text: str) -> str:
    """Anything after `Bearer`/`api_key`/`token` masked (a server that reflects headers must not get the key
    printed); cheap on text without those words."""
    low = text.lower()
    if "bearer" in low or "api" in low or "token" in low:  # what _BEARER needs to match at all
        text = _BEARER.sub(lambda m: m.group(1) + "***", text)
    return text


def mask_server_text(text: str, forms: list[str]) -> str:
    """A server's text with every secret form and URL credentials masked, then the token patterns (in that
    order, so a secret holding `token=` is masked whole)."""
    return mask_token_patterns(mask_forms(text, forms))


def redact(text: str, secrets: list[str], limit: int = 200) -> str:
    """A server's text as we may show it: masked (the plan's secrets and this shell's, as the server inherits
    HF_ENDPOINT), then shortened."""
    text = mask_server_text(text, secret_forms([*secrets, *secret_values()]))
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def secret_unsendable(name: str) -> str:
    """The refusal of a secret whose value no HTTP header carries (plan and start say it alike)."""
    return (
        f"{name} holds characters a token cannot have (spaces, newlines or other non-printing ones, or "
        "more than 4096 of them; its value is not shown)"
    )
