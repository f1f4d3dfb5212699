"""What every script in this bundle shares, and nothing more.

- JSON out, JSON errors: a script prints exactly one JSON document on stdout; a failure is
  ``{"error": ..., "fix": ...}`` with a documented exit code, never a traceback.
- Subprocesses: argv lists with a timeout, never a shell.
- cpulists ("0-3,8,10-11") both ways, validated.
- Files under a sysroot (``--sysroot DIR`` reads DIR/proc and DIR/sys, like ``lscpu --sysroot``).
- The ssh transport for ``--host``.
- ``data/epyc.json``, the single source of pinned facts.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "data"
EPYC_JSON = DATA_DIR / "epyc.json"

EXIT_OK = 0
EXIT_FAIL = 1  # a negative verdict or an error: the JSON says which

GIB = 1024 ** 3

# The bundle's own dependencies (import names) and the venv scripts/bootstrap.py makes for them.
BUNDLE_DEPS = {"huggingface_hub": "huggingface_hub", "psutil": "psutil", "cpuinfo": "py-cpuinfo",
               "requests": "requests", "jsonschema": "jsonschema"}
BUNDLE_VENV = ROOT / ".venv"
_REEXEC_MARK = "EPYC_SKILL_BUNDLE_VENV"


def missing_deps() -> list[str]:
    """Distribution names of the bundle's dependencies this interpreter cannot import."""
    import importlib.util
    return [dist for mod, dist in BUNDLE_DEPS.items() if importlib.util.find_spec(mod) is None]


def _use_bundle_venv() -> None:
    """`python3 scripts/NAME.py` works in any shell once scripts/bootstrap.py has run: when this
    interpreter lacks the dependencies and the bundle's venv has them, run the same command there."""
    venv_python = BUNDLE_VENV / "bin" / "python"
    if (os.environ.get(_REEXEC_MARK) or not venv_python.exists()
            or Path(sys.prefix).resolve() == BUNDLE_VENV.resolve()
            or Path(sys.argv[0] or ".").resolve().parent != ROOT / "scripts"
            or not missing_deps()):
        return
    os.environ[_REEXEC_MARK] = "1"
    os.execv(str(venv_python), [str(venv_python), *sys.argv])


_use_bundle_venv()


# ---------------------------------------------------------------- errors and output

class ScriptError(Exception):
    """A failure the user can act on: printed as {"error", "fix"} with an exit code."""

    def __init__(self, error: str, fix: str, code: int = EXIT_FAIL, **extra: Any):
        super().__init__(error)
        self.error = error
        self.fix = fix
        self.code = code
        self.extra = extra

    def as_json(self) -> dict:
        return {"error": self.error, "fix": self.fix, **self.extra}


SECRET_NAME = re.compile(r"(?i)(key|token|secret|passw)")


_NAMED_SECRETS: set[str] = set()  # variables a plan names as secret, whatever they are called
# credentials written into a URL (an HF_ENDPOINT or a proxy with user:password@): never printed
# The scheme is at most 32 characters, so a text like 'a.a.a.' costs linear time, not quadratic (each
# start had scanned to the end); the credentials run to the authority's last '@', as urllib3 reads a
# password holding one.
URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,31}://)[^/\s]*@")


def treat_as_secret(*names: str) -> None:
    """A plan's API key may live under any name (`--api-key-env MYAPI`): the verbs that read the plan
    name its variables here, and from then on their values are masked like HF_TOKEN's."""
    _NAMED_SECRETS.update(n for n in names if n)


def secret_values() -> list[str]:
    """The values this shell holds under secret-looking names (HF_TOKEN, VLLM_API_KEY, MY_API_KEY, a
    password) or under a name a plan marked secret: none of them may reach what we print, whatever text
    carried it there (an upstream error, a server's reply, a log line). Eight characters at least for
    a name that only looks secret, so `TOKENIZERS_PARALLELISM=false` does not blank every "false"
    (four for a named one); longest first, so a key inside a longer one is masked whole."""
    found = {v for k, v in os.environ.items() if SECRET_NAME.search(k) and len(v.strip()) >= 8}
    found |= {os.environ[k] for k in _NAMED_SECRETS if len(os.environ.get(k, "").strip()) >= 4}
    for value in os.environ.values():  # HF_ENDPOINT=https://user:PASSWORD@mirror: the password, wherever it goes
        cred = URL_CREDENTIALS.search(value)
        password = cred.group(0)[len(cred.group(1)):-1].partition(":")[2] if cred else ""
        for form in {password, urllib.parse.unquote(password)}:  # as written, and as the client sends it
            if len(form) >= 4:
                found.add(form)
    return sorted(found, key=len, reverse=True)


def clip(text: str, limit: int, tail: bool = False) -> str:
    """text shortened to `limit` characters (its end, with tail) after its secrets are masked: a cut made
    first can leave part of a secret, which the mask, matching whole values, no longer sees."""
    text = mask_secrets(text)
    return text[-limit:] if tail else text[:limit]


def secret_forms(values: list[str]) -> list[str]:
    """Each secret value as text can carry it, longest first: as is; as it reads inside a JSON string (a
    quote, a backslash escaped); without the spaces or line ends around it (what a client sends: an
    `HF_TOKEN` ending in \\r from a Windows .env); each of its lines (logs are masked a line at a time); and
    with a byte that is not UTF-8 read as the log reader reads it (U+FFFD); percent-encoded (as a URL quotes
    it, or every byte); in hex; and in base64 or base64url."""
    forms: set[str] = set()
    for value in filter(None, values):
        readable = value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        # a line of a many-line secret is searched for on every log line: only whole-secret-long lines (8
        # characters, as secret_values asks of a value), and only for a secret of a few dozen lines (a PEM key)
        # (splitlines, not a count of \n: it also splits on \r, \v, \f, \x1c-\x1e, \x85, \u2028)
        lines = value.splitlines()
        lines = lines if len(lines) <= 64 else []
        for form in (value, value.strip(), readable, readable.strip(),
                     *(line.strip() for line in lines if len(line.strip()) >= 8)):
            if form:
                # and as a URL carries it percent-encoded (a proxy's password, a key in a query string)
                url_form = urllib.parse.quote(form, safe="", errors="surrogateescape")
                # %2f is as valid as %2F (RFC 3986 calls them the same): some clients write it so
                url_lower = re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), url_form)
                json_form = json.dumps(form)[1:-1]  # and with / escaped as \/, as PHP's and some Java encoders write it
                slashed = json_form.replace("/", "\\/")
                # and each once more inside a JSON string (an error body quoting a JSON request, as a server echoes it)
                forms.update((form, json_form, slashed, json.dumps(json_form)[1:-1], json.dumps(slashed)[1:-1],
                              url_form, url_lower))
        raw = value.strip().encode("utf-8", "surrogateescape")
        if raw:  # every byte escaped, letters too (some encoders do): %73%6B... and %73%6b...; and in hex
            forms.update(("".join(f"%{b:02X}" for b in raw), "".join(f"%{b:02x}" for b in raw), raw.hex(),
                          raw.hex().upper()))
        for text in base64_forms(value.strip()):  # and base64url's alphabet (a JWT, a URL-safe dump): -_ for +/
            forms.update((text, text.translate(BASE64URL)))
    return sorted(forms, key=len, reverse=True)


BASE64URL = str.maketrans("+/", "-_")


def base64_forms(value: str) -> list[str]:
    """The characters of value's base64 that it alone decides, at each of the three places it can start
    in a 3-byte group: an HTTP Basic header carries `user:SECRET` so (a proxy's or a mirror's password
    echoed by a server), and so does a Kubernetes-style secret dump. The characters a neighbour's bits
    share are left out: each form is found whatever comes before and after."""
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
    """text with every form (secret_forms) and the credentials of any URL masked. Where two secrets
    overlap in the text, the union of their spans is masked (masking one first would hide the other's
    start and leave its tail). Cheap on text without them: kernel_proof masks every line of a log that
    runs to gigabytes."""
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
    """stderr as the scripts' libraries see it: huggingface_hub and requests log through their own
    handlers (a retry warning quotes the URL, an HF_ENDPOINT password included), so what reaches the
    real stream is masked as log() masks. A script installs it at import, before those libraries
    make their handlers."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(mask_secrets(text))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _running_a_script() -> bool:  # python3 scripts/NAME.py, not a test process importing us
    try:
        return Path(sys.argv[0]).resolve().parent == Path(__file__).resolve().parent
    except (OSError, ValueError, IndexError):
        return False


if sys.stderr is not None and not isinstance(sys.stderr, _MaskedStream) and _running_a_script():
    sys.stderr = _MaskedStream(sys.stderr)


def log(msg: str) -> None:
    """Progress and diagnostics go to stderr; stdout carries only the JSON document."""
    if sys.stderr is None:  # started with stderr closed: print would then write to stdout
        return
    try:
        print(mask_secrets(msg), file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr full (`2>/dev/full`) or closed: progress is lost, not the run
        pass


# the keys our documents are made of: snake_case words, never masked (a key `error` masked because an API
# key was the word "error" would break the one contract, {"error", "fix"}); keys from a user's data
# (a tensor name, an environment variable's) are masked like any string
OUR_KEY = re.compile(r"[a-z][a-z0-9_]{0,63}")


def masked_strings(value: Any, values: list[str]) -> Any:
    """The document with secrets masked inside its strings (and keys that are not ours), never across its
    syntax: a value `true` or `4096` masked in the printed text had made `"ok": ***`, which is not JSON."""
    if isinstance(value, str):
        return mask_secrets(value, values)
    if isinstance(value, dict):
        return {k if isinstance(k, str) and OUR_KEY.fullmatch(k) else masked_strings(k, values):
                masked_strings(v, values) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [masked_strings(v, values) for v in value]
    return value


def emit(doc: Any) -> bool:
    """One JSON document on stdout. Strict JSON: a NaN or Infinity that slipped past the boundary checks
    becomes a clear error document, never output other programs cannot parse. -> False when it had to
    (the caller's exit code must then say failure too)."""
    try:
        text, printed = json.dumps(masked_strings(doc, secret_values()), indent=2, sort_keys=False,
                                   allow_nan=False), True
    except (ValueError, RecursionError):
        text, printed = json.dumps({"ok": False, "error": "a result held NaN or Infinity (not valid JSON), so none "
                                    "is shown", "fix": "check the input documents and flags for non-finite numbers"},
                                   indent=2), False
    if sys.stdout is None:  # started with stdout closed (`>&-`): nowhere to say it, so exit 1 says it
        return False
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):  # stdout closed, or a full disk under `> $RUN/x.json`: exit 1, no traceback
        return False
    return printed


class JsonArgumentParser(argparse.ArgumentParser):
    """argparse that reports bad usage as a JSON error (exit 1) instead of usage text + exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ScriptError(f"bad arguments: {message}",
                          f"see `python3 {self.prog} --help`")

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        ns, extra = super().parse_known_args(args, namespace)
        for action in self._actions:  # `--host=--` reaches argparse as an empty list, past the flag's type
            if action.nargs is None and action.option_strings and getattr(ns, action.dest, None) == [] \
                    and action.default != []:
                self.error(f"argument {action.option_strings[0]}: expected one value")
        return ns, extra


# ---------------------------------------------------------------- flag types (checked at the boundary)

def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """argparse type: a whole number in [lo, hi]; anything else names the range. ASCII digits only:
    int() would also take '1_000' and other scripts' digits ('١٢'), which no user means as a port."""
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
    """argparse type: a finite number in [lo, hi] (or (lo, hi] with lo_open): never NaN or infinity,
    which would poison the JSON (not valid JSON) or make a wait loop endless. Plain ASCII only: float()
    would also take '1_0' and other scripts' digits ('１.５')."""
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
            raise argparse.ArgumentTypeError(f"{_plain(value)} is out of range (expected "
                                             f"{'more than' if lo_open else 'from'} {_plain(lo)} "
                                             f"{'and at most' if lo_open else 'to'} {_plain(hi)})")
        return value
    parse.__name__ = "number"
    return parse


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def is_env_name(text: object) -> bool:
    return isinstance(text, str) and bool(_ENV_NAME.fullmatch(text))  # "$" would let a final newline through


def env_name(text: str) -> str:
    """argparse type: the NAME of an environment variable (it is pasted into shell examples)."""
    if not is_env_name(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an environment variable name "
                                         "(letters, digits and _, not starting with a digit)")
    return text


# docker's reference grammar, simplified: [registry[:port]/]path[:tag][@digest]; never an option
_IMAGE_REF = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
                        r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")


def image_ref(text: str) -> str:
    """argparse type: a container image reference; text that a runtime could read as an option is refused."""
    if not _IMAGE_REF.fullmatch(text or "") or len(text) > 512:
        raise argparse.ArgumentTypeError(f"{text!r} is not a container image reference (e.g. registry/name:tag)")
    return text


_VERSION = re.compile(r"[0-9]+\.[0-9]+(\.[0-9]+)?([.+-][A-Za-z0-9.+-]{1,40})?")


def version(text: str) -> str:
    """argparse type: a release number such as 0.32.0 (or 0.32.0+cpu); it names a snapshot file."""
    if not _VERSION.fullmatch(text or ""):
        raise argparse.ArgumentTypeError(f"{text!r} is not a version number (e.g. 0.32.0)")
    return text


def executable(text: str) -> str:
    """argparse type: an interpreter or program this script will run; it must exist and be executable."""
    nonempty(text)
    if not is_executable(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an executable file")
    return text


def real_path(path: str | Path) -> Path:
    """The path with every link followed, as far as it goes. Path.resolve() raises RuntimeError on a link
    loop (Python 3.10 and 3.11); realpath stops at the loop, and the next open names it (ELOOP)."""
    return Path(os.path.realpath(path))


def user_path(spec: str | Path, what: str = "path", expand_vars: bool = False) -> Path:
    """A path with `~` / `~user` expanded; an unknown user is a clear error (Path.expanduser raises
    RuntimeError for it). `expand_vars`: then $VARS, in huggingface_hub's order (a variable holding a `~`
    keeps it, as the Hub client does)."""
    try:
        path = Path(spec).expanduser()
        if expand_vars:
            path = Path(os.path.expandvars(path))
    except RuntimeError:
        raise ScriptError(f"{what} {str(spec)!r}: no such user's home for the '~'", f"spell {what} without ~user, "
                          "or with ~ for your own home")
    # what no file system holds (ENAMETOOLONG): Path.exists()/is_file() raise it instead of saying False
    if len(os.fsencode(path)) > 4095 or any(len(os.fsencode(part)) > 255 for part in path.parts):
        raise ScriptError(f"{what} {str(spec)[:120]!r}{'...' if len(str(spec)) > 120 else ''} is not a usable path: "
                          "too long for any file system (4095 bytes, 255 a name)", "pass a real path")
    return path


def hub_cache_env_problem(env: dict) -> str | None:
    """Why the Hugging Face cache this shell names is not one folder, or None. huggingface_hub takes an empty
    or relative HF_HUB_CACHE / HF_HOME (and, for its default HF_HOME, XDG_CACHE_HOME) as a path relative to
    wherever it runs: check_model, validate's mount and the server would each find the model in another
    folder. Judged on the hub path as the client builds it (~ then $VARS, twice for HF_HOME's: a
    variable holding `~/x` is the home's). (This bundle's cache_root follows the XDG spec and ignores a
    relative XDG_CACHE_HOME; the Hub client does not, so the hub's folder must not depend on it.)"""
    def expand(value: str) -> str:
        return os.path.expandvars(os.path.expanduser(value))

    def said(name: str) -> str:
        return f"{name} is {'empty' if not env[name] else 'a relative path ' + repr(clip(env[name], 80))}"
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if name in env:  # the first one set decides, even empty (the client's os.getenv default chain)
            return None if os.path.isabs(expand(env[name])) else said(name)
    if "HF_HOME" in env:
        return None if os.path.isabs(expand(os.path.join(expand(env["HF_HOME"]), "hub"))) else said("HF_HOME")
    if "XDG_CACHE_HOME" in env and not os.path.isabs(
            expand(os.path.join(expand(os.path.join(env["XDG_CACHE_HOME"], "huggingface")), "hub"))):
        return said("XDG_CACHE_HOME") + " and HF_HOME is unset"
    if "XDG_CACHE_HOME" not in env and "HOME" in env and not os.path.isabs(env["HOME"]):
        # ~/.cache/huggingface/hub: an empty HOME makes it /.cache/... for the client (cache_root, as a login
        # would, takes the account's home instead), a relative one a folder relative to wherever it runs
        return said("HOME") + " and HF_HOME, HF_HUB_CACHE and XDG_CACHE_HOME are unset"
    return None


def refuse_a_relative_hub_cache(env: dict) -> None:
    problem = hub_cache_env_problem(env)
    if problem:
        raise ScriptError(f"{problem}: the Hugging Face client would use a cache folder relative to wherever it "
                          "runs, so the model would be looked for in a different folder by each step",
                          "export it as an absolute path (e.g. HF_HOME=$HOME/.cache/huggingface) or unset it")


def cache_root() -> Path:
    """The user's cache folder, as the XDG base-directory spec defines it: $XDG_CACHE_HOME when it is an
    absolute path (an empty or relative one "is invalid and should be ignored"), else ~/.cache. The host
    stack's venv and the default state dirs live under it: a relative one would put gigabytes wherever
    the command happened to run."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return _roomy(user_path(xdg, "XDG_CACHE_HOME"), "XDG_CACHE_HOME")
    home = os.environ.get("HOME")
    if not home:  # unset or empty ("" expands to "/"): the account's own home, as a login would set it
        import pwd
        try:
            home = pwd.getpwuid(os.getuid()).pw_dir
        except KeyError:
            home = ""
    if not os.path.isabs(home):
        raise ScriptError(f"HOME {home[:200]!r} is not an absolute path, and XDG_CACHE_HOME names no absolute "
                          "folder: there is no cache folder to use",
                          "export XDG_CACHE_HOME=/an/absolute/folder (or HOME=/your/home), then run it again")
    return _roomy(user_path(home, "HOME") / ".cache", "HOME")


def _roomy(root: Path, what: str) -> Path:
    """A cache root with room under it for the bundle's folders (PATH_MAX is 4096 bytes): one past 3000
    bytes made a venv or state-dir path no file system takes, an OSError wherever it was first touched."""
    if len(os.fsencode(root)) > 3000:
        raise ScriptError(f"{what} is {len(os.fsencode(root)):,} bytes long: no room under it for this bundle's "
                          "folders (paths stop at 4096)", f"export {what} as a shorter absolute path")
    return root


def is_executable(path: str) -> bool:
    """A regular file this user may run (a folder or /dev/null is not)."""
    p = user_path(path)
    return p.is_file() and os.access(p, os.X_OK)


def nonempty(text: str) -> str:
    """argparse type for a target or a file (--host, --sysroot, --venv, --plan): an empty value is a mistake
    (an unset shell variable), never a silent 'use this machine' nor the current folder."""
    if not (text or "").strip():
        raise argparse.ArgumentTypeError("is empty (an unset shell variable?); pass a value, or leave the flag "
                                         "out where it has a default")
    return text


# the documents launch.py plan reads: each is checked against its schema as it is printed, too
PLAN_INPUTS = ("detect", "validate", "check_model", "estimate_memory", "cpu_tune")


_INTERRUPTED: list[int] = []


def _raise_interrupt(signum, frame):
    if _INTERRUPTED:  # a second signal (GNU timeout signals the child, then its group; a double Ctrl-C) must
        return        # not cut short the cleanup the first one started (a stop that leaves no server running)
    _INTERRUPTED.append(signum)
    raise KeyboardInterrupt


def _interrupt_on_termination() -> dict:
    """SIGTERM, SIGHUP and SIGINT (an agent's tool timeout, a closed terminal, Ctrl-C) end a script once:
    the children run() started in sessions of their own are killed on the way out, not left running, and
    the JSON says "interrupted"; a later signal lets that way out finish. -> the handlers to put back."""
    _INTERRUPTED.clear()  # a script's signal regime starts here (tests run several in one process)
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        try:
            previous[sig] = signal.signal(sig, _raise_interrupt)
        except (ValueError, OSError):  # not the main thread
            pass
    return previous


@contextlib.contextmanager
def signals_deferred():
    """SIGTERM, SIGHUP and SIGINT held until the block ends, then raised as KeyboardInterrupt: start
    launches a server and records it in state.json inside one, so no signal can leave a server that no
    state names (stop would say "not running", the port stay busy). The server does not inherit the
    handlers: exec resets caught signals to their defaults. A signal held inside a cleanup that already
    answers an interrupt is not raised: `timeout` and a double Ctrl-C send a second signal, which must
    not cut the stop short and leave the server running."""
    pending: list[int] = []
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        try:
            previous[sig] = signal.signal(sig, lambda signum, frame: pending.append(signum))
        except (ValueError, OSError):  # not the main thread
            pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if pending and not _INTERRUPTED:
            _INTERRUPTED.append(pending[0])  # as _raise_interrupt does: the cleanup this starts runs to its end
            raise KeyboardInterrupt


_ABANDONED: list[bool] = []


def abandon_thread() -> None:
    """A worker thread is left running (a Hub call past its deadline): at the end run_main leaves with
    os._exit once its document is out, since a thread still inside C code while the interpreter tears down
    can crash it (exit 139 was seen after a correct document)."""
    _ABANDONED.append(True)


def run_main(main: Callable[[Sequence[str] | None], tuple[Any, int]],
             argv: Sequence[str] | None = None,
             render: Callable[[dict, bool], str] | None = None) -> int:
    """Call ``main`` and turn every outcome into one document on stdout and an exit code.

    ``render(doc, ok)`` replaces JSON for scripts with another output format (cpu_tune's env)."""
    previous = _interrupt_on_termination()
    try:
        doc, code = main(argv)
        ok = True
        name = Path(main.__code__.co_filename).stem
        # (not detect --capture's receipt: it is no fact for the next script, and it runs on the host to plan
        # for with the standard library only, where jsonschema is not installed)
        if code == EXIT_OK and isinstance(doc, dict) and name in PLAN_INPUTS and "capture" not in doc:
            # what we print is what the next script reads: a fact past what the schema allows (a socket
            # id of 5000, a quota of 0 CPUs) is refused here, naming the field, not three scripts later
            check_schema(doc, name, f"{name}.py read facts it cannot describe",
                         "check the input it read (sysroot, capture, model files) for values no machine or "
                         "model has")
    except ScriptError as exc:
        doc, code, ok = exc.as_json(), exc.code, False
    except KeyboardInterrupt:
        doc, code, ok = {"error": "interrupted", "fix": "run the command again"}, EXIT_FAIL, False
    except OSError as exc:  # the machine's refusal (a full disk, a read-only folder, a link loop), not a bug
        doc, code, ok = os_error(exc, "the system refused an operation").as_json(), EXIT_FAIL, False
    except ModuleNotFoundError as exc:  # run with an interpreter that lacks the bundle's dependencies
        doc = {"error": f"missing Python package {exc.name!r} in {sys.executable}",
               "fix": "run python3 scripts/bootstrap.py once (it makes the bundle's venv; the scripts then use "
                      "it by themselves)"}
        code, ok = EXIT_FAIL, False
    except Exception as exc:  # the contract is JSON, even for our own bugs
        if os.environ.get("EPYC_SKILL_DEBUG"):
            traceback.print_exc()
        doc = {"error": f"internal error: {type(exc).__name__}: {exc}",
               "fix": "re-run with EPYC_SKILL_DEBUG=1 to see the traceback on stderr, and report it"}
        code, ok = EXIT_FAIL, False
    finally:
        # the work is done: a signal now must not cut the document that says what was done (a start that
        # recorded its server), so it is ignored until the document is out
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
    try:
        if isinstance(doc, dict):  # the one contract: every document says ok, and exit 1 = ok false + error + fix
            doc = {"ok": code == 0, **{k: v for k, v in doc.items() if k != "ok"}}
        if render is None:
            if not emit(doc):
                code = EXIT_FAIL
        else:  # cpu_tune --format env: shell lines, masked as any text we print
            try:
                sys.stdout.write(mask_secrets(render(doc, ok)) + "\n")
                sys.stdout.flush()
            except (OSError, ValueError):  # as emit: a closed stdout or a full disk is exit 1, no traceback
                code = EXIT_FAIL
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if _ABANDONED:
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:  # (None: the stream was closed when the script started, `2>&-`)
                    stream.flush()
            except Exception:  # whatever the stream says, the exit below must happen
                pass
        os._exit(code)
    return code


def os_error(exc: OSError, doing: str) -> "ScriptError":
    """The machine's refusal (a full disk, a folder we may not write, a link loop) in words a user acts on,
    naming the file where the error does."""
    import errno
    where = f" ({exc.filename})" if exc.filename else ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        fix = "free space on that disk (or raise the file-size limit, ulimit -f), then run it again"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "check that folder's permissions, or use another folder, then run it again"
    else:
        fix = "check the file or folder it names, then run it again"
    return ScriptError(f"{doing}: {exc.strerror or exc or type(exc).__name__}{where}", fix)


# ---------------------------------------------------------------- subprocesses

@dataclass
class RunResult:
    argv: list[str]
    returncode: int | None  # None: could not start or timed out
    stdout: str
    stderr: str
    failure: str | None = None  # "not_found" | "timeout" | "os_error"

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def find_program(name: str, env: dict | None = None) -> str | None:
    """The file a bare program name runs, from PATH's absolute folders only (as Go's exec.LookPath does
    since 1.19): with PATH="" or ".", a `numactl` or `docker` in the current folder would run instead of
    the one the human approved. A name with a '/' is itself. -> None when there is none."""
    if "/" in name:
        return name
    for folder in (env if env is not None else os.environ).get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(folder, name)
        if os.path.isabs(folder) and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def run(argv: Sequence[str], timeout: float, env: dict | None = None,
        stdin: str | None = None, progress: str | None = None, progress_every: float = 15.0,
        stderr_through: bool = False, limit: int | None = None, engine_query: bool = False) -> RunResult:
    """Run argv (never through a shell) with a hard timeout; never raises for the usual failures.

    ``progress`` names what a long command does: every ``progress_every`` seconds a line with the
    elapsed time goes to stderr, so a person watching knows it is alive (stdout stays the JSON).
    ``stderr_through`` lets the child's own progress lines reach our stderr instead of capturing them.
    ``limit``: keep at most that many bytes of stdout and of stderr, and stop the child past it (a probe
    answered by an interpreter that prints without end). Output is decoded leniently: a byte that is not
    UTF-8 is shown as U+FFFD, never an exception."""
    argv = [str(a) for a in argv]
    env = env if engine_query else run_env(argv, env)  # engine_query: which daemon does this shell name?
    program = find_program(argv[0], env)
    if program is None:
        return RunResult(argv, None, "", f"{argv[0]}: not found", "not_found")
    try:
        # a session of its own: on timeout the whole group goes, not just argv[0] -- a grandchild that
        # kept our pipe open would otherwise make the read after the kill wait forever
        proc = subprocess.Popen(argv, executable=program, stdout=subprocess.PIPE, stderr=None if stderr_through else subprocess.PIPE,
                                text=limit is None, errors="replace" if limit is None else None, env=env,
                                start_new_session=True,
                                stdin=subprocess.PIPE if stdin is not None and limit is None else subprocess.DEVNULL)
    except FileNotFoundError:
        return RunResult(argv, None, "", f"{argv[0]}: not found", "not_found")
    except OSError as exc:
        return RunResult(argv, None, "", str(exc), "os_error")
    if limit is not None:
        return _run_bounded(proc, argv, timeout, limit)
    t0 = time.monotonic()
    pending_input = stdin
    try:
        while True:
            left = timeout - (time.monotonic() - t0)
            wait = min(left, progress_every) if progress else left
            try:
                out, err = proc.communicate(input=pending_input, timeout=max(wait, 0.01))
                return RunResult(argv, proc.returncode, out, err or "")
            except subprocess.TimeoutExpired:
                pending_input = None
                elapsed = time.monotonic() - t0
                if elapsed >= timeout:
                    kill_group(proc)
                    try:
                        out, _ = proc.communicate(timeout=10)
                    except subprocess.TimeoutExpired:  # a process that left our group still holds the pipe
                        out = ""
                    return RunResult(argv, None, out or "", f"timed out after {timeout:g}s", "timeout")
                if progress:
                    log(f"{progress}: {elapsed:.0f}s elapsed")
    except BaseException:  # Ctrl-C no longer reaches a child in its own session: take it down with us
        kill_group(proc)
        raise


def _run_bounded(proc: subprocess.Popen, argv: list[str], timeout: float, limit: int) -> RunResult:
    """run() with `limit`: each pipe drained in chunks by a thread that stops keeping bytes past the limit."""
    kept: dict[str, bytearray] = {"out": bytearray(), "err": bytearray()}
    over = threading.Event()

    def drain(name: str, stream) -> None:
        while chunk := stream.read1(65536):
            kept[name] += chunk
            if len(kept[name]) > limit:
                over.set()
                return

    readers = [threading.Thread(target=drain, args=(n, s), daemon=True)
               for n, s in (("out", proc.stdout), ("err", proc.stderr)) if s is not None]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + timeout
    try:
        while any(r.is_alive() for r in readers) and not over.is_set() and time.monotonic() < deadline:
            time.sleep(0.02)
        failure = "output_limit" if over.is_set() else "timeout" if any(r.is_alive() for r in readers) else None
        if failure:
            kill_group(proc)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            failure = failure or "timeout"
    except BaseException:
        kill_group(proc)
        raise
    finally:  # close what the readers are done with (an unclosed pipe is a ResourceWarning, an error under
        # PYTHONWARNINGS=error); a reader still blocked -- a process outside the group holds the pipe -- keeps its own
        for reader, stream in zip(readers, (s for s in (proc.stdout, proc.stderr) if s is not None)):
            reader.join(timeout=1)
            if not reader.is_alive():
                stream.close()
    text = {n: bytes(b[:limit]).decode("utf-8", errors="replace") for n, b in kept.items()}
    why = {"output_limit": f"printed more than {limit:,} bytes", "timeout": f"timed out after {timeout:g}s"}
    return RunResult(argv, None if failure else proc.returncode, text["out"], why.get(failure, text["err"]), failure)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group `proc` leads (it was started with start_new_session) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


PROBE_OUTPUT_LIMIT = 16 << 20  # a registry probe prints ~100 KB; 16 MiB is no answer, it is a flood


def run_probe(prefix: Sequence[str], code: str, marker: str, timeout: float,
              shape: dict | None = None) -> tuple[dict | None, str]:
    """Run `python -c code` through prefix ([python] or a container runtime's run ... python3 IMAGE) and
    read the JSON object it prints after `marker`. -> (doc, "") or (None, why it gave none). The
    interpreter is the user's (any absolute path): what it prints is checked against `shape`, a JSON
    Schema, before anyone reads a field of it."""
    # the probe sees what the server will see (start passes no PYTHON* variable on): a shell's
    # PYTHONWARNINGS=error turned torch's import-time DeprecationWarning into "the stack is broken"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    res = run([*prefix, "-c", code], timeout=timeout, limit=PROBE_OUTPUT_LIMIT, env=env)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith(marker)), None)
    if line is None:
        tail = (res.stderr or res.failure or "").strip().splitlines()[-1:]
        return None, tail[0] if tail else "no output"
    try:
        doc = parse_json_object(line[len(marker):], "probe output", "")
    except ScriptError as exc:
        return None, f"malformed probe output ({exc.error[:120]}): {line[:200]}"
    error = best_schema_error(shape, doc) if shape else None
    if error is not None:
        field = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        return None, f"probe output field {field}: {error.message[:200]}"
    return doc, ""


CONTAINER_RUNTIMES = {"docker": ["docker"], "podman": ["podman"], "sudo docker": ["sudo", "-n", "docker"]}


# an address docker's --host takes for a daemon on this machine: printable ASCII without spaces; a unix
# socket by its absolute path (unix://rel.sock is resolved against the folder each command runs in)
DOCKER_ENGINE = re.compile(r"(unix:///|tcp://)[!-~]{1,1000}", re.ASCII)
LOOPBACK_ENGINE = re.compile(r"tcp://(127\.0\.0\.1|localhost|\[::1\])(:(?P<port>[0-9]{1,5}))?/?", re.ASCII)


def docker_engine_problem(engine: object) -> str | None:
    """Why a DOCKER_HOST value cannot be the engine of a plan, or None. Only a daemon on this machine: the
    plan's CPUs, memory node, port and cache are this machine's (detect.py read them here), and verify
    asks 127.0.0.1; a remote engine would run the server elsewhere, sized for the wrong host."""
    if isinstance(engine, str) and engine.startswith(("ssh://", "tcp://")):
        loopback = LOOPBACK_ENGINE.fullmatch(engine)
        if not loopback:
            return ("is another machine's docker: this plan is sized for this one (its CPUs, memory and port), "
                    "and verify asks 127.0.0.1")
        if loopback["port"] and not 1 <= int(loopback["port"]) <= 65535:
            return "names no port (1-65535)"
    if not isinstance(engine, str) or not DOCKER_ENGINE.fullmatch(engine):
        return ("is not the address of a docker daemon on this machine (unix:///ABSOLUTE/PATH, "
                "tcp://127.0.0.1:PORT)")
    return None


def runtime_argv(runtime: str, engine: str | None = None) -> list[str]:
    """The argv prefix of a container runtime: one of the known engines, never free text run as a
    program. 'sudo docker' is only ever used non-interactively (validate.py picks it when `sudo -n`
    works), so it never waits at a password prompt. `engine` is the docker daemon validate.py probed
    (this shell's DOCKER_HOST): named in the argv itself, so the command the human approves says which
    machine runs the server, and every later verb reaches that one whatever its own shell exports."""
    if runtime not in CONTAINER_RUNTIMES:
        raise ScriptError(f"unknown container runtime {runtime!r}",
                          f"use one of: {', '.join(CONTAINER_RUNTIMES)} (validate.py picks it)")
    if engine is None:
        return list(CONTAINER_RUNTIMES[runtime])
    problem = docker_engine_problem(engine) if runtime == "docker" else "is named only for plain docker"
    if problem:
        shown = URL_CREDENTIALS.sub(r"\1***@", engine) if isinstance(engine, str) else engine  # user:password@
        raise ScriptError(f"the docker engine {clip(repr(shown), 120)} (DOCKER_HOST, or the current docker "
                          f"context) {problem}", "unset DOCKER_HOST and use the default context (docker context use "
                          "default) for the local socket, or export this machine's daemon address; then run "
                          "validate.py and plan again; to serve on another machine, run the chain on it "
                          "(detect.py --host user@box plans it from here)")
    return [*CONTAINER_RUNTIMES[runtime], f"--host={engine}"]


def podman_remote_problem(timeout: float = 20) -> str | None:
    """Why this machine's `podman` would run a container elsewhere, or None. Its environment is cleared of
    CONTAINER_HOST/CONTAINER_CONNECTION (run_env), but a containers.conf with `[engine] remote = true` (or
    a podman-remote build, or a podman machine VM) still makes every call a remote one, which no flag
    overrides: podman itself says so as Host.ServiceIsRemote. A podman that does not answer is left to the
    call that follows (its own error says why)."""
    res = run(["podman", "info", "--format", "{{.Host.ServiceIsRemote}}"], timeout=timeout)
    if res.ok and res.stdout.strip().lower() == "true":
        return ("podman here is a remote client (containers.conf `[engine] remote = true`, podman-remote, or a "
                "podman machine VM): its containers run on another machine, not on the CPUs and memory this plan "
                "is sized for")
    return None


def sudo_docker_context_problem(timeout: float = 20) -> str | None:
    """Why `sudo -n docker` would reach a daemon on another machine, or None. sudo resets the environment
    (and run_env drops DOCKER_HOST besides), but root's docker follows root's own current context (its
    ~/.docker/config.json), and a DOCKER_HOST that root's login environment sets (pam_env) shows as the
    default context's endpoint: the endpoint is judged as a plan's engine is. A plan names no engine for
    sudo docker, so every verb asks again. A CLI without contexts answers nothing here and uses the
    default socket."""
    shown = run(["sudo", "-n", "docker", "context", "show"], timeout=timeout)
    if not shown.ok:
        return None
    name = shown.stdout.strip()
    host = run(["sudo", "-n", "docker", "context", "inspect", "--format", "{{.Endpoints.docker.Host}}"],
               timeout=timeout)
    endpoint = host.stdout.strip() if host.ok else ""
    problem = (docker_engine_problem(endpoint) if endpoint else
               None if name in ("", "default") else "could not be read (context inspect failed)")
    if problem:
        said = URL_CREDENTIALS.sub(r"\1***@", endpoint)  # user:password@ in an address
        return (f"root's current docker context is {clip(repr(name), 80)}, whose daemon {clip(repr(said), 120)} "
                f"{problem}: `sudo docker` would run the server there, not on this machine")
    return None


SUDO_DOCKER_CONTEXT_FIX = ("run `sudo docker context use default` (and drop any DOCKER_HOST from root's login "
                           "environment), or use docker or the host path (validate.py --runtime)")


PODMAN_REMOTE_FIX = ("set `remote = false` under [engine] in containers.conf (or unset CONTAINERS_CONF), or use "
                     "docker or the host path (validate.py --runtime docker|host); to serve on another machine, "
                     "run the chain on it")


def remote_runtime_problem(runtime: str, timeout: float = 20) -> tuple[str, str] | None:
    """(why, fix) when this podman or sudo docker would run containers on another machine now, else None
    (plain docker names its engine in the argv; these two cannot)."""
    check, fix = {"podman": (podman_remote_problem, PODMAN_REMOTE_FIX),
                  "sudo docker": (sudo_docker_context_problem, SUDO_DOCKER_CONTEXT_FIX)}.get(runtime, (None, ""))
    problem = check(timeout) if check else None
    return (problem, fix) if problem else None


_SEEN_LOCAL: set[str] = set()  # runtimes this process has found on this machine (verify asks on every poll)


def runtime_of(doc: dict) -> list[str]:
    """The runtime argv prefix a plan (or the state its start wrote) names: its runtime, on its engine. A
    podman or sudo docker that would reach another machine now (containers.conf, root's docker context:
    no flag in the argv overrides them) is refused for every verb, as a later shell's DOCKER_HOST is: a
    stop there would find nothing, say "not running" and drop the state of the server running here."""
    argv = runtime_argv(doc["runtime"], doc.get("engine"))
    if doc["runtime"] not in _SEEN_LOCAL:
        remote = remote_runtime_problem(doc["runtime"])
        if remote:
            raise ScriptError(remote[0], f"{remote[1]}; then run this command again (a plan made while it was "
                              "remote: validate.py and plan again)")
        _SEEN_LOCAL.add(doc["runtime"])
    return argv


def docker_engine(env: dict) -> str | None:
    """The docker daemon this shell's `docker` talks to when it is not the default: DOCKER_HOST, checked
    (an empty one is docker's default too). `sudo -n docker` drops the variable (sudo resets the
    environment), so it is asked only for plain docker."""
    value = env.get("DOCKER_HOST") or None
    if value is not None:
        runtime_argv("docker", value)  # refuses what cannot be named
    return value


def shell_docker_engine(timeout: float = 20) -> str | None:
    """The daemon this shell's `docker` reaches when it is not the default socket: DOCKER_HOST, else the
    endpoint of the current docker context when that is not `default` (DOCKER_CONTEXT, or `docker context
    use`). Read before anything is asked of docker (a remote one is refused unasked), and recorded: the
    plan names it as --host=, and a call that names none runs on the default socket (run_env)."""
    engine = docker_engine(dict(os.environ))
    if engine is not None:
        return engine
    shown = run(["docker", "context", "show"], timeout=timeout, engine_query=True)  # the shell's own context
    if not shown.ok or shown.stdout.strip() in ("", "default"):
        return None  # a CLI without contexts, or the default one: the default socket
    host = run(["docker", "context", "inspect", "--format", "{{.Endpoints.docker.Host}}"], timeout=timeout,
               engine_query=True)
    address = host.stdout.strip() if host.ok else ""
    runtime_argv("docker", address)  # refused unless a daemon on this machine, named as DOCKER_HOST is
    return address


def run_env(argv: list[str], env: dict | None) -> dict | None:
    """The environment of a command (`env`, or this process's): a docker call that names no engine
    (--host=) runs on the default socket whatever that environment exports, so a plan made for the default
    engine never starts, verifies, execs or stops on the daemon a later shell's DOCKER_HOST or docker
    context names. Every docker call goes through here (run, and the log streams that Popen). podman
    names no engine in a plan: it always runs on this machine's, never where a CONTAINER_HOST or
    CONTAINER_CONNECTION (podman's remote client) of this shell or a later one points."""
    if argv[:1] == ["podman"]:
        return {k: v for k, v in (os.environ if env is None else env).items()
                if k not in ("CONTAINER_HOST", "CONTAINER_CONNECTION")}
    docker_at = 2 if argv[:3] == ["sudo", "-n", "docker"] else 0  # sudo may keep DOCKER_HOST (env_keep)
    if argv[docker_at:docker_at + 1] != ["docker"] or (len(argv) > docker_at + 1
                                                       and argv[docker_at + 1].startswith("--host=")):
        return env
    plain = {k: v for k, v in (os.environ if env is None else env).items() if k != "DOCKER_HOST"}
    plain["DOCKER_CONTEXT"] = "default"
    return plain


# ---------------------------------------------------------------- cpulists

_CPULIST_ITEM = re.compile(r"^([0-9]+)(?:-([0-9]+))?$", re.ASCII)
MAX_CPU_ID = 8191  # Linux numbers CPUs below NR_CPUS, at most 8192 on x86_64: a list past it is not a machine


def is_another_host(target: str) -> bool:
    """detect.py's target names where its facts came from: this machine ('localhost', or a 'sysroot:' folder
    standing in for it, as the tests do), or another host -- a spec, a capture, an ssh target."""
    return target != "localhost" and not target.startswith("sysroot:")


def parse_cpulist(text: str) -> list[int]:
    """"0-3,8,10-11" -> [0, 1, 2, 3, 8, 10, 11]. Empty text is the empty set. Raises ValueError."""
    text = text.strip()
    if not text:
        return []
    cpus: set[int] = set()
    for item in text.split(","):
        m = _CPULIST_ITEM.match(item.strip())
        if not m:
            raise ValueError(f"not a cpulist item: {item!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ValueError(f"descending range in cpulist: {item!r}")
        if hi > MAX_CPU_ID:
            raise ValueError(f"CPU {hi} in cpulist {item!r}: Linux numbers CPUs 0-{MAX_CPU_ID}")
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """[0, 1, 2, 3, 8, 10, 11] -> "0-3,8,10-11" (sorted, deduplicated, ranges collapsed)."""
    ordered = sorted(set(cpus))
    if any(c < 0 for c in ordered):
        raise ValueError("negative CPU id")
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


# ---------------------------------------------------------------- sysroot files

SYS_FILE_LIMIT = 16 << 20  # /proc/cpuinfo of a 2-socket 384-thread host is ~0.6 MB


class Sysroot:
    """Reads host files below a root: "/" for this host, a captured tree for another."""

    def __init__(self, root: str | os.PathLike = "/"):
        self.root = Path(root)

    @property
    def is_live(self) -> bool:
        return real_path(self.root) == Path("/")

    def path(self, p: str) -> Path:
        return self.root / p.lstrip("/")

    def read(self, p: str) -> str | None:
        """File text, or None when it does not exist, cannot be read, is not a regular file (a FIFO in a
        captured tree would block forever, a link to /dev/zero never ends) or is larger than any
        proc/sys file a host has."""
        import stat
        try:
            path = self.path(p)
            if not self.is_live and not real_path(path).is_relative_to(real_path(self.root)):
                return None  # a captured tree's link to /proc/kmsg or another host file is not its content
            if not stat.S_ISREG(path.stat().st_mode):
                return None
            with open(path, "rb") as f:
                data = f.read(SYS_FILE_LIMIT + 1)
        except (OSError, ValueError):
            return None
        return None if len(data) > SYS_FILE_LIMIT else data.decode("utf-8", errors="replace")

    def glob(self, pattern: str) -> list[Path]:
        return sorted(self.root.glob(pattern.lstrip("/")))


def check_sysroot(root: str) -> Sysroot:
    sr = Sysroot(root)
    try:
        is_dir = sr.root.is_dir()
    except OSError as exc:  # a name too long for the file system, say
        raise ScriptError(f"sysroot {root[:200]!r} cannot be read ({exc.strerror or exc})",
                          "pass a folder that holds proc/ and sys/ captured from the host")
    if not is_dir:
        raise ScriptError(f"sysroot {root[:200]!r} is not a directory",
                          "pass a folder that holds proc/ and sys/ captured from the host")
    if sr.read("proc/cpuinfo") is None:
        raise ScriptError(f"sysroot {root!r} has no readable proc/cpuinfo",
                          "capture /proc/cpuinfo, /proc/meminfo and /sys/devices/system into the sysroot")
    return sr


# ---------------------------------------------------------------- ssh transport

_HOST_RE = re.compile(r"^(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])"
                      r"(?::(?P<port>[0-9]{1,5}))?$")


@dataclass(frozen=True)
class SshTarget:
    user: str | None
    host: str
    port: int | None

    @property
    def label(self) -> str:
        s = f"{self.user}@{self.host}" if self.user else self.host
        return f"{s}:{self.port}" if self.port else s


def parse_host(spec: str) -> SshTarget:
    """'[user@]box[:port]' -> SshTarget. Rejects anything ssh could read as an option."""
    m = _HOST_RE.fullmatch(spec or "")
    if not m or spec.startswith("-"):
        raise ScriptError(f"not a host: {spec!r}", "use --host [user@]hostname[:port]")
    port = int(m.group("port")) if m.group("port") else None
    if port is not None and not 0 < port < 65536:
        raise ScriptError(f"port out of range in {spec!r}", "use a port between 1 and 65535")
    return SshTarget(m.group("user"), m.group("host").strip("[]"), port)


def ssh_argv(target: SshTarget, remote_argv: Sequence[str], connect_timeout: int = 10) -> list[str]:
    """One non-interactive ssh call; the remote command is quoted word by word."""
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect_timeout}",
            "-o", "StrictHostKeyChecking=accept-new"]
    extra = os.environ.get("EPYC_SKILL_SSH_OPTS")  # e.g. "-i key -o UserKnownHostsFile=..."
    if extra:
        try:  # the user's own ssh options, written as shell words (as GIT_SSH_COMMAND is)
            argv += shlex.split(extra)
        except ValueError as exc:
            raise ScriptError(f"EPYC_SKILL_SSH_OPTS is not shell words ({exc})",
                              "quote it as on a command line, e.g. EPYC_SKILL_SSH_OPTS='-i ~/.ssh/id_box "
                              "-o Port=2222', or unset it")
    if target.port:
        argv += ["-p", str(target.port)]
    argv += [f"{target.user}@{target.host}" if target.user else target.host, "--"]
    argv.append(" ".join(shlex.quote(a) for a in remote_argv))
    return argv


# ---------------------------------------------------------------- pinned facts

EPYC_SCHEMA_VERSION = 1


def load_epyc(path: Path = EPYC_JSON) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ScriptError(f"cannot read {path}: {exc}",
                          "restore data/epyc.json from the repository (git checkout data/epyc.json)")
    if not isinstance(doc, dict) or doc.get("schema_version") != EPYC_SCHEMA_VERSION:
        raise ScriptError(f"{path} is not schema_version {EPYC_SCHEMA_VERSION} of the pinned facts",
                          "restore data/epyc.json from the repository (git checkout data/epyc.json)")
    return doc


MAX_INPUT_BYTES = 64 << 20  # no document this bundle reads (plans, configs, logs' JSON) comes near it


def require_regular_file(spec: str | Path, what: str, fix: str) -> os.stat_result:
    """An input must be a regular file: a FIFO would block forever, /dev/zero never ends."""
    import stat
    try:
        st = Path(spec).stat()
    except OSError as exc:
        raise ScriptError(f"cannot read {what} {str(spec)!r}: {exc.strerror or exc}", fix)
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a pipe, device or socket)"
        raise ScriptError(f"{what} {str(spec)!r} is {kind}", fix)
    return st


def output_folder_path(spec: str | Path, what: str) -> Path:
    """The path of a folder a script writes into, `~` expanded; never '-' (elsewhere a stream, here it would
    be a folder named '-' in this folder)."""
    if str(spec) == "-":
        raise ScriptError(f"{what} '-': this writes a folder, not a stream", f"pass a folder path for {what}")
    return user_path(spec, what)


def nearest_existing(path: Path) -> tuple[Path, list[str]]:
    """path's nearest ancestor that is there (by its name, as the kernel walks it; a link is not followed),
    and the names below it, deepest first: what making path would create."""
    missing = []
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path.name)
        path = path.parent
    return path, missing


def output_dir(spec: str | Path, what: str) -> Path:
    """A folder the script writes into: created if missing; an existing file or an unwritable place is a
    clear error before any work is done."""
    path = output_folder_path(spec, what)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ScriptError(f"{what} {str(spec)!r} exists and is not a folder", f"pass a folder path for {what}")
    except OSError as exc:
        raise ScriptError(f"cannot create {what} {str(spec)!r}: {exc.strerror or exc}",
                          f"pass a writable folder for {what}")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ScriptError(f"{what} {str(spec)!r} is not writable", f"pass a writable folder for {what}")
    return path


def empty_output_dir(spec: str | Path, what: str, fix: str, make: bool = True) -> Path:
    """output_dir, new or empty: every entry in it is then the script's own, so nothing planted there (a
    link under one of its file names) takes a write elsewhere, and `/` or a home is never filled.
    make=False checks it and makes nothing: a run that may still refuse (no server to measure) checks its
    output first and makes it only once it goes on, so a refusal leaves no folder behind."""
    path = output_folder_path(spec, what)
    parent, missing = nearest_existing(path)
    if missing:
        if ".." in missing:  # `new/../x`: the kernel needs `new` to exist; making it leaves it behind
            raise ScriptError(f"{what} {clip(repr(str(spec)), 200)} goes through a folder that does not exist "
                              "and back out of it ('..')", f"spell {what} without '..' past a new folder")
        if not (parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)):
            raise ScriptError(f"cannot create {what} {clip(repr(str(spec)), 200)}: {str(parent)[:200]} is not a "
                              "folder this user may write in", f"pass a writable folder for {what}")
    elif not path.is_dir():
        raise ScriptError(f"{what} {str(spec)!r} exists and is not a folder", f"pass a folder path for {what}")
    else:
        try:
            held = sorted(os.listdir(path))
        except OSError as exc:
            raise os_error(exc, f"cannot read {what} {str(spec)!r}")
        if held:
            shown = ", ".join(clip(repr(n), 60) for n in held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
            raise ScriptError(f"{what} {clip(repr(str(spec)), 200)} is not empty (it holds {shown})", fix)
    return output_dir(spec, what) if make else path  # (making it checks a folder that is there is writable)


def output_file(spec: str | Path, what: str) -> Path:
    """A file the script writes: its folder must exist and the path must not be a folder."""
    if str(spec) == "-":  # elsewhere '-' means a stream; here it would be a file named '-' in this folder
        raise ScriptError(f"{what} '-': stdout carries the JSON document, so this writes only to a file",
                          f"pass a file path for {what}, e.g. ./capture.tar.gz")
    path = user_path(spec, what)
    try:
        path.lstat()
    except FileNotFoundError:
        pass
    except OSError as exc:  # a name too long, a path through a file
        raise ScriptError(f"{what} {str(spec)[:200]!r}: {exc.strerror or exc}", f"pass a usable file path for {what}")
    if path.is_dir():
        raise ScriptError(f"{what} {str(spec)!r} is a folder", f"pass a file path for {what}, e.g. {path}/capture.tar.gz")
    if path.is_symlink() or (path.exists() and not path.is_file()):  # a FIFO blocks the write; a link points elsewhere
        raise ScriptError(f"{what} {str(spec)!r} exists and is not a regular file (a link, pipe or device)",
                          f"pass a new file path for {what}")
    if not path.parent.is_dir():
        raise ScriptError(f"{what} {str(spec)!r}: folder {str(path.parent)!r} does not exist",
                          f"create it first, or pass a path in an existing folder")
    return path


def read_input_bytes(spec: str | Path, what: str, fix: str, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of an input file, refusing what is not a regular file and anything over `limit` bytes:
    an input is data, never a stream. A `~` is expanded, as in every path the scripts write."""
    path = user_path(spec, what)
    st = require_regular_file(path, what, fix)
    try:
        if st.st_size > limit:
            raise ScriptError(f"{what} {str(spec)!r} is {st.st_size:,} bytes, over the {limit:,} this bundle reads",
                              fix)
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise ScriptError(f"cannot read {what} {str(spec)!r}: {exc.strerror or exc}", fix)
    if len(data) > limit:
        raise ScriptError(f"{what} {str(spec)!r} grew past {limit:,} bytes while being read", fix)
    return data


def read_input_text(spec: str | Path, what: str, fix: str, limit: int = MAX_INPUT_BYTES, strict: bool = True) -> str:
    """read_input_bytes as UTF-8: strict for documents (a byte that is not UTF-8 is an error naming the
    file), lenient (replacement characters) for logs."""
    return decode_input(read_input_bytes(spec, what, fix, limit), f"{what} {str(spec)!r}", fix, strict)


def decode_input(data: bytes, label: str, fix: str, strict: bool = True) -> str:
    """Input bytes as UTF-8 text; a byte that is not UTF-8 is an error naming where it came from."""
    try:
        return data.decode("utf-8", errors="strict" if strict else "replace")
    except UnicodeDecodeError as exc:
        raise ScriptError(f"{label} is not UTF-8 text (byte {exc.start})", fix)


class NotANumber(ValueError):
    """A JSON text with a number JSON does not have (NaN, Infinity) or no float can hold (1e400)."""


def _no_constant(name: str):
    raise NotANumber(f"{name} is not a JSON number")  # Python's reader takes NaN / Infinity; JSON does not


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: valid JSON syntax, but no finite number
        raise NotANumber(f"{text[:40]} is too large for a number")
    return value


def strict_json_loads(text: str, unique_keys: bool = False) -> Any:
    """json.loads as JSON is: no NaN or Infinity, no number past a float; unique_keys for this bundle's own
    documents. Raises NotANumber, DuplicateKey or another ValueError."""
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float,
                      object_pairs_hook=refuse_duplicate_keys if unique_keys else None)


class DuplicateKey(ValueError):
    pass


def refuse_duplicate_keys(pairs: list) -> dict:
    """An object whose keys are all different. A document with a key twice reads as its last value in
    Python, as its first in other readers, and the human reviewing a plan file may see either one."""
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen: set = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise DuplicateKey(f"the key {clip(repr(twice), 80)} appears twice in one object")
    return doc


def parse_json_object(text: str, what: str, fix: str, unique_keys: bool = False) -> dict:
    """Text that must hold one JSON object; anything else is a ScriptError naming `what`. unique_keys for
    this bundle's own documents (a plan, a step's output): one of them with a key twice was edited by hand
    or cut and pasted together. A model's config.json is read as vLLM reads it (the last value wins)."""
    if text.startswith("\ufeff"):  # a byte-order mark: Python's message ("decode using utf-8-sig") helps no user
        raise ScriptError(f"{what} starts with a byte-order mark (BOM), which JSON does not allow",
                          f"save it as UTF-8 without a BOM; {fix}")
    try:
        doc = strict_json_loads(text, unique_keys)
    except json.JSONDecodeError as exc:
        raise ScriptError(f"{what} is not JSON ({exc.msg}, line {exc.lineno})", fix)
    except DuplicateKey as exc:
        raise ScriptError(f"{what} is ambiguous: {exc}", fix)
    except RecursionError:
        raise ScriptError(f"{what} is nested too deeply to be one of this bundle's documents", fix)
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise ScriptError(f"{what} holds a value JSON readers refuse ({str(exc)[:120]})", fix)
    if not isinstance(doc, dict):
        raise ScriptError(f"{what} is not a JSON object", fix)
    return doc


def read_json_input(spec: str, what: str) -> dict:
    """Load another script's JSON output from a file path, or '-' for stdin."""
    fix = f"save the output of the {what} step to a file and pass its path"
    if spec == "-":
        try:
            data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        except (AttributeError, OSError, ValueError) as exc:  # stdin closed (None), write-only, or detached
            raise ScriptError(f"{what} on stdin: stdin cannot be read ({getattr(exc, 'strerror', None) or exc})", fix)
        if len(data) > MAX_INPUT_BYTES:
            raise ScriptError(f"{what} on stdin is over {MAX_INPUT_BYTES:,} bytes", fix)
        text = decode_input(data, f"{what} on stdin", fix)
    else:
        text = read_input_text(spec, f"{what} JSON", fix)
    doc = parse_json_object(text, f"{what} input {spec!r}", f"pass the unmodified stdout of the {what} step",
                            unique_keys=what != "config.json")  # a model's config: read as vLLM reads it
    if "error" in doc:  # its words are passed on only when they are what our contract says: text
        upstream, upstream_fix = doc.get("error"), doc.get("fix")
        raise ScriptError(f"the {what} step failed: " + (clip(upstream, 500) if isinstance(upstream, str)
                                                         else "(its error is not text)"),
                          clip(upstream_fix, 500) if isinstance(upstream_fix, str) and upstream_fix.strip()
                          else f"fix the {what} step first")
    return doc


def _ecma_pattern(validator, pattern: str, instance: Any, schema: dict):
    """`pattern` as JSON Schema means it (ECMA-262): `$` is the end of the text. Python's `$` also matches
    before a final newline, which would let "96-191\\n" through a cpulist pattern into an argv."""
    import jsonschema
    if not validator.is_type(instance, "string"):
        return
    python = pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith("\\$") else pattern
    if not re.search(python, instance):
        yield jsonschema.exceptions.ValidationError(f"{instance[:80]!r} does not match {pattern!r}")


def best_schema_error(schema: dict, doc: Any):
    """The most telling way doc breaks schema (Draft 2020-12, ECMA patterns), or None."""
    import jsonschema
    base = jsonschema.Draft202012Validator
    # "integer" is a whole-number type, not a value: JSON Schema lets 10.0 pass, and a port of 44751.0 or a
    # KV grant of 10.0 then reached a socket call or the command ("--max-num-seqs 22.0") the human approves
    strict = base.TYPE_CHECKER.redefine("integer", lambda _checker, value: isinstance(value, int)
                                        and not isinstance(value, bool))
    validator = jsonschema.validators.extend(base, {"pattern": _ecma_pattern}, type_checker=strict)
    return jsonschema.exceptions.best_match(validator(schema).iter_errors(doc))


def check_schema(doc: Any, schema_name: str, what: str, fix: str) -> None:
    """A document read at the boundary must match its schema (data/schemas/NAME.json); the error names
    the field, the value and the rule it broke."""
    schema = json.loads((DATA_DIR / "schemas" / f"{schema_name}.json").read_text())
    error = best_schema_error(schema, doc)
    if error is not None:
        field = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise ScriptError(f"{what}: field {field}: {error.message[:300]}", fix)


def gb(n_bytes: float, digits: int = 2) -> float:
    return round(n_bytes / GIB, digits)
