"""argparse types: every flag's value is checked where it enters."""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable

from epyc.errors import ScriptError
from epyc.jsonio import user_path

# git check-ref-format: no "..", "//", leading "-" or "/", trailing "/" or ".", part starting "." or ending ".lock"
_REVISION_RE = re.compile(r"^(?!.*\.\.)(?!.*//)(?![-/.])(?!.*/\.)(?!.*\.lock(?:/|$))[A-Za-z0-9._/-]{1,200}(?<![/.])$")
_SERVED_NAME = re.compile(r"^(?!.*://)[A-Za-z0-9][A-Za-z0-9._:@+/-]{0,199}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
NOT_A_KEY = ("HF_TOKEN", "PATH", "HOME", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH")


def is_revision(text: object) -> bool:
    """A branch, tag or commit as git allows one: what --revision takes, and what a document may carry."""
    return isinstance(text, str) and _REVISION_RE.fullmatch(text) is not None


def is_served_name(text: object) -> bool:
    """One argv element vLLM reads as a value, and the id clients send: no leading '-', space or control
    character, and no URL (the mask of URL credentials would rewrite it)."""
    return isinstance(text, str) and bool(_SERVED_NAME.fullmatch(text))  # fullmatch: "$" lets a final \n through


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """argparse type: a whole number in [lo, hi]; anything else names the range. ASCII digits only (int()
    would also take '1_000' and '١٢')."""

    def parse(text: str) -> int:
        if not isinstance(text, str) or not re.fullmatch(r"\s*[+-]?[0-9]{1,30}\s*", text):
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (expected {lo} to {hi})")
        value = int(text.strip(), 10)
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is out of range (expected {lo} to {hi})")
        return value

    parse.__name__ = "whole number"
    return parse


def _plain(x: float) -> str:
    """1048576, not 1.04858e+06: a range in an error is read by a person."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def float_in(lo: float, hi: float, lo_open: bool = False) -> Callable[[str], float]:
    """argparse type: a finite number in [lo, hi] (or (lo, hi] with lo_open), in plain ASCII: never NaN,
    infinity (not JSON; an endless wait), '1_0' or '１.５'."""

    def parse(text: str) -> float:
        try:
            if not text.isascii() or "_" in text:
                raise ValueError(text)
            value = float(text)
        except (ValueError, TypeError, AttributeError):
            raise argparse.ArgumentTypeError(f"{text!r} is not a number")
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if value < lo or value > hi or (lo_open and value == lo):
            span = (
                f"more than {_plain(lo)} and at most {_plain(hi)}" if lo_open else f"from {_plain(lo)} to {_plain(hi)}"
            )
            raise argparse.ArgumentTypeError(f"{_plain(value)} is out of range (expected {span})")
        return value

    parse.__name__ = "number"
    return parse


def is_env_name(text: object) -> bool:
    return isinstance(text, str) and bool(_ENV_NAME.fullmatch(text))


def _checked(accepts: Callable[[str], bool], why: str, shown: int | None = None) -> Callable[[str], str]:
    """argparse type: the text itself when `accepts` takes it, else "'text' why" (the text cut to `shown`)."""

    def parse(text: str) -> str:
        if not accepts(text):
            raise argparse.ArgumentTypeError(f"{text[:shown]!r} {why}")
        return text

    return parse


# the NAME of an environment variable (it is pasted into shell examples)
env_name = _checked(
    is_env_name, "is not an environment variable name (letters, digits and _, not starting with a digit)"
)

# docker's reference grammar, simplified: [registry[:port]/]path[:tag][@digest]; never an option
_IMAGE_REF = re.compile(
    r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)
image_ref = _checked(
    lambda text: bool(_IMAGE_REF.fullmatch(text or "")) and len(text) <= 512,
    "is not a container image reference (e.g. registry/name:tag)",
)

# a release number such as 0.32.0 (or 0.32.0+cpu); it names a snapshot file
_VERSION = re.compile(r"[0-9]+\.[0-9]+(\.[0-9]+)?([.+-][A-Za-z0-9.+-]{1,40})?")
version = _checked(lambda text: bool(_VERSION.fullmatch(text or "")), "is not a version number (e.g. 0.32.0)")


def executable(text: str) -> str:
    """argparse type: an interpreter or program this script will run; it must exist and be executable."""
    nonempty(text)
    if not is_executable(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an executable file")
    return text


def is_executable(path: str) -> bool:
    """A regular file this user may run (a folder or /dev/null is not)."""
    p = user_path(path)
    return p.is_file() and os.access(p, os.X_OK)


def nonempty(text: str) -> str:
    """argparse type for a target or a file: an empty value is a mistake (an unset shell variable), never a
    silent 'use this machine' nor the current folder."""
    if not (text or "").strip():
        raise argparse.ArgumentTypeError(
            "is empty (an unset shell variable?); pass a value, or leave the flag out where it has a default"
        )
    return text


# --revision, checked where it is read (estimate_memory --config never resolves a model with it)
revision_arg = _checked(
    is_revision,
    "is not a branch, tag or commit (letters, digits and ._/-; no '..', '//', leading '-', '.' or '/', no part ending '.lock')",
    shown=200,
)
served_name_arg = _checked(
    is_served_name, "is not a plain model name (letters, digits and ._:@+/-, not starting with '-', at most 200)"
)


def api_key_env_arg(text: str) -> str:
    """The variable holding the API key: a name (it is pasted into shell examples), and not one that holds
    something else (HF_TOKEN would make the Hub token the server's key)."""
    name = env_name(text)
    if name in NOT_A_KEY:
        raise argparse.ArgumentTypeError(
            f"{name} holds something else than an API key: export the key in its own variable (e.g. VLLM_API_KEY) and name that"
        )
    return name


def parse_bool(text: str) -> bool:
    if text.lower() not in ("true", "1", "yes", "false", "0", "no"):
        raise ScriptError(f"not a boolean: {text!r}", "pass true or false (the avx512 field from detect.py)")
    return text.lower() in ("true", "1", "yes")


def normalize_version(v: str | None) -> str | None:
    """'0.32.0+cpu' -> '0.32.0' (snapshots are keyed by the release)."""
    m = re.match(r"^v?([0-9]+\.[0-9]+\.[0-9]+)", v or "")
    return m.group(1) if m else None
