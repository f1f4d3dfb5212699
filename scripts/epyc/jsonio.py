"""JSON in and out: strict reading of input documents, schema checks, and the files and folders we write."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

from epyc import errors
from epyc.errors import ScriptError
from epyc.masking import clip

SCHEMAS = Path(__file__).resolve().parent.parent.parent / "data" / "schemas"  # bundle.DATA_DIR / "schemas"
MAX_INPUT_BYTES = 64 << 20


def scratch_dir(prefix: str) -> Path:
    """A folder for an unpacked tree or a lone config, removed when the script exits."""
    import atexit
    import shutil
    import tempfile

    dest = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, dest, True)
    return dest


def real_path(path: str | Path) -> Path:
    """The path with every link followed, as far as it goes (a loop is named by the next open, not raised)."""
    return Path(os.path.realpath(path))


def user_path(spec: str | Path, what: str = "path", expand_vars: bool = False) -> Path:
    """A path with `~` / `~user` expanded (an unknown user is a ScriptError); `expand_vars`: then $VARS,
    in huggingface_hub's order (a variable holding a `~` keeps it)."""
    try:
        path = Path(spec).expanduser()
        if expand_vars:
            path = Path(os.path.expandvars(path))
    except RuntimeError:
        raise ScriptError(
            f"{what} {str(spec)!r}: no such user's home for the '~'",
            f"spell {what} without ~user, or with ~ for your own home",
        )
    return path


def require_regular_file(spec: str | Path, what: str, fix: str) -> os.stat_result:
    """An input must be a regular file: a FIFO would block forever, /dev/zero never ends."""
    try:
        st = Path(spec).stat()
    except OSError as exc:
        raise ScriptError(f"cannot read {what} {str(spec)!r}: {exc.strerror or exc}", fix)
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a pipe, device or socket)"
        raise ScriptError(f"{what} {str(spec)!r} is {kind}", fix)
    return st


def nearest_existing(path: Path) -> tuple[Path, list[str]]:
    """path's nearest ancestor that is there (a link is not followed), and the names below it, deepest
    first: what making path would create."""
    missing = []
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path.name)
        path = path.parent
    return path, missing


def empty_output_dir(spec: str | Path, what: str, fix: str, make: bool = True) -> Path:
    """A folder the script writes into, new or empty, so every entry in it is the script's own; never '-'
    (elsewhere a stream). make=False: checked only, made later, so a refusal leaves no folder behind."""
    if str(spec) == "-":
        raise ScriptError(f"{what} '-': this writes a folder, not a stream", f"pass a folder path for {what}")
    path = user_path(spec, what)
    parent, missing = nearest_existing(path)
    named = f"{what} {clip(repr(str(spec)), 200)}"
    if missing:
        if ".." in missing:  # `new/../x`: the kernel needs `new` to exist; making it leaves it behind
            why = "goes through a folder that does not exist and back out of it ('..')"
            raise ScriptError(f"{named} {why}", f"spell {what} without '..' past a new folder")
        if not (parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)):
            why = f"{str(parent)[:200]} is not a folder this user may write in"
            raise ScriptError(f"cannot create {named}: {why}", f"pass a writable folder for {what}")
    elif not path.is_dir():
        raise ScriptError(f"{what} {str(spec)!r} exists and is not a folder", f"pass a folder path for {what}")
    elif held := sorted(os.listdir(path)):
        shown = ", ".join(clip(repr(n), 60) for n in held[:3]) + (f" and {len(held) - 3} more" if held[3:] else "")
        raise ScriptError(f"{named} is not empty (it holds {shown})", fix)
    if make:
        path.mkdir(parents=True, exist_ok=True)
    return path


def output_file(spec: str | Path, what: str) -> Path:
    """A file the script writes: never '-' (stdout carries the document), a link, a pipe or a device."""
    if str(spec) == "-":
        why = "stdout carries the JSON document, so this writes only to a file"
        raise ScriptError(f"{what} '-': {why}", f"pass a file path for {what}, e.g. ./capture.txt")
    path = user_path(spec, what)
    if path.is_symlink() or (path.exists() and not path.is_file()):  # a FIFO blocks the write; a link points elsewhere
        why = "exists and is not a regular file (a link, folder, pipe or device)"
        raise ScriptError(f"{what} {str(spec)!r} {why}", f"pass a new file path for {what}")
    return path


def read_input_bytes(spec: str | Path, what: str, fix: str, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of an input file (`~` expanded), refusing what is not a regular file and anything over
    `limit` bytes: an input is data, never a stream."""
    path = user_path(spec, what)
    st = require_regular_file(path, what, fix)
    if st.st_size > limit:
        raise ScriptError(f"{what} {str(spec)!r} is {st.st_size:,} bytes, over the {limit:,} this bundle reads", fix)
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise ScriptError(f"cannot read {what} {str(spec)!r}: {exc.strerror or exc}", fix)
    if len(data) > limit:
        raise ScriptError(f"{what} {str(spec)!r} is over the {limit:,} bytes this bundle reads", fix)
    return data


def read_input_text(spec: str | Path, what: str, fix: str, limit: int = MAX_INPUT_BYTES, strict: bool = True) -> str:
    """read_input_bytes as UTF-8: strict for documents, lenient (replacement characters) for logs."""
    return decode_input(read_input_bytes(spec, what, fix, limit), f"{what} {str(spec)!r}", fix, strict)


def decode_input(data: bytes, label: str, fix: str, strict: bool = True) -> str:
    """Input bytes as UTF-8 text; a byte that is not UTF-8 is an error naming where it came from."""
    try:
        return data.decode("utf-8", errors="strict" if strict else "replace")
    except UnicodeDecodeError as exc:
        raise ScriptError(f"{label} is not UTF-8 text (byte {exc.start})", fix)


class DuplicateKey(ValueError):
    pass


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: valid JSON syntax, but no finite number
        raise ValueError(f"{text[:40]} is too large for a number")
    return value


def strict_json_loads(text: str, unique_keys: bool = False) -> Any:
    """json.loads as JSON is: no NaN or Infinity, no number past a float; unique_keys for this bundle's own
    documents. Raises DuplicateKey or another ValueError."""
    hook = refuse_duplicate_keys if unique_keys else None
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float, object_pairs_hook=hook)


def refuse_duplicate_keys(pairs: list) -> dict:
    """An object whose keys are all different: other readers take a key's first value, Python its last."""
    doc = dict(pairs)
    if len(doc) != len(pairs):
        seen: set = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise DuplicateKey(f"the key {clip(repr(twice), 80)} appears twice in one object")
    return doc


def parse_json_object(text: str, what: str, fix: str, unique_keys: bool = False) -> dict:
    """Text that must hold one JSON object; anything else is a ScriptError naming `what`. unique_keys for
    this bundle's own documents, not a model's config.json (vLLM reads a key's last value)."""
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
    doc = parse_json_object(
        text, f"{what} input {spec!r}", f"pass the unmodified stdout of the {what} step", what != "config.json"
    )
    if "error" in doc:  # its words are passed on only when they are what our contract says: text
        upstream, upstream_fix = doc.get("error"), doc.get("fix")
        error = clip(upstream, 500) if isinstance(upstream, str) else "(its error is not text)"
        has_fix = isinstance(upstream_fix, str) and upstream_fix.strip()
        raise ScriptError(
            f"the {what} step failed: {error}", clip(upstream_fix, 500) if has_fix else f"fix the {what} step first"
        )
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


def best_schema_error(schema: dict, doc: Any) -> Any:
    """The most telling way doc breaks schema (Draft 2020-12, ECMA patterns), or None."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    # "integer" is a whole-number type, not a value: JSON Schema lets 10.0 pass, and "--max-num-seqs 22.0" follows
    strict = base.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool)
    )
    validator = jsonschema.validators.extend(base, {"pattern": _ecma_pattern}, type_checker=strict)
    return jsonschema.exceptions.best_match(validator(schema).iter_errors(doc))


def schema_problem(schema: dict, doc: Any, limit: int) -> str | None:
    """How doc breaks schema as "field F: message" (the message cut to `limit`), or None."""
    error = best_schema_error(schema, doc)
    if error is None:
        return None
    return f"field {'/'.join(str(p) for p in error.absolute_path) or '(top level)'}: {error.message[:limit]}"


def check_schema(doc: Any, schema_name: str, what: str, fix: str) -> None:
    """A document read at the boundary must match its schema (data/schemas/NAME.json), or a ScriptError."""
    if problem := schema_problem(json.loads((SCHEMAS / f"{schema_name}.json").read_text()), doc, 300):
        raise ScriptError(f"{what}: {problem}", fix)


def open_own_file(path: str | Path, flags: int, mode: int = 0o600, phase: str = "start") -> int:
    """Open a file the bundle keeps, never through a link nor waiting on a FIFO; one written gets `mode`."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ScriptError(
                f"{path} is a symbolic link: {phase} reads and writes only its own files, never through a link",
                "remove the link, or use a fresh folder",
                phase=phase,
            ) from None
        refusal = errors.os_error(exc, f"cannot open {path}")
        refusal.extra["phase"] = phase
        raise refusal from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device of that name: never waited on
            raise ScriptError(f"{path} is not a regular file", "remove it, or use a fresh folder", phase=phase)
        if flags & os.O_CREAT:
            os.fchmod(fd, mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_own_file(path: str | Path, text: str) -> None:
    """Write (or overwrite) a file of the state dir or run folder, 0600, never through a link."""
    try:
        with os.fdopen(open_own_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as f:
            f.write(text)
    except OSError as exc:  # a full disk: opened, and the write (or its flush at close) refused
        raise errors.os_error(exc, f"cannot write {path}") from None
