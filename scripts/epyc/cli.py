"""The scripts' contract: one JSON document on stdout, exit 0/1 with error + fix, progress on stderr."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from epyc import bundle
from epyc.errors import EXIT_FAIL, EXIT_OK, ScriptError, os_error
from epyc.jsonio import check_schema, write_own_file
from epyc.masking import _MaskedStream, mask_secrets, masked_strings, secret_values

_KEEP: list[Path] = []


def keep_document(path: Path | None) -> None:
    """The document this script prints is also written to path (its run folder), whatever the outcome."""
    _KEEP[:] = [path] if path else []


def json_text(doc: Any) -> tuple[str, bool]:
    """The document as strict JSON, masked; a NaN or Infinity in it makes it an error document instead.
    -> (text, False when it had to)."""
    try:
        return json.dumps(masked_strings(doc, secret_values()), indent=2, allow_nan=False), True
    except (ValueError, RecursionError):
        error = "a result held NaN or Infinity (not valid JSON), so none is shown"
        fix = "check the input documents and flags for non-finite numbers"
        return json.dumps({"ok": False, "error": error, "fix": fix}, indent=2), False


def emit(doc: Any, rendered: str | None = None) -> bool:
    """One JSON document on stdout (or the `rendered` text that stands for it, masked). -> False when it could
    not say it, or had to replace it."""
    text, printed = json_text(doc) if rendered is None else (mask_secrets(rendered), True)
    try:  # nowhere to say it (stdout None: closed at start, `>&-`; closed since; a full disk): exit 1 says it
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except (AttributeError, OSError, ValueError):
        return False
    return printed


class JsonArgumentParser(argparse.ArgumentParser):
    """argparse that reports bad usage as a JSON error (exit 1) instead of usage text + exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ScriptError(f"bad arguments: {message}", f"see `python3 {self.prog} --help`")

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        ns, extra = super().parse_known_args(args, namespace)
        for action in self._actions:  # `--host=--` reaches argparse as an empty list, past the flag's type
            taken = action.nargs is None and action.option_strings and getattr(ns, action.dest, None) == []
            if taken and action.default != []:
                self.error(f"argument {action.option_strings[0]}: expected one value")
        return ns, extra


_INTERRUPTED: list[int] = []


def _raise_interrupt(signum, frame):
    if _INTERRUPTED:  # a second signal (GNU timeout signals the child, then its group; a double Ctrl-C) must
        return  # not cut short the cleanup the first one started (a stop that leaves no server running)
    _INTERRUPTED.append(signum)
    raise KeyboardInterrupt


def _install(handler) -> dict:
    """handler on SIGTERM, SIGHUP and SIGINT. -> the handlers to put back."""
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            previous[sig] = signal.signal(sig, handler)
    return previous


def _interrupt_on_termination() -> dict:
    """SIGTERM, SIGHUP and SIGINT (a tool timeout, a closed terminal, Ctrl-C) end a script once, as a
    KeyboardInterrupt; a later signal lets that way out finish. -> the handlers to put back."""
    _INTERRUPTED.clear()  # a script's signal regime starts here (tests run several in one process)
    return _install(_raise_interrupt)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGTERM, SIGHUP and SIGINT held until the block ends, then raised as KeyboardInterrupt (unless one is
    already being answered): a server is launched and recorded inside one, so no state misses it."""
    pending: list[int] = []
    previous = _install(lambda signum, frame: pending.append(signum))
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
    """A worker thread is left running (a Hub call past its deadline): run_main then ends with os._exit, as
    a thread inside C code can crash the interpreter's teardown."""
    _ABANDONED.append(True)


def say(doc: Any, code: int, ok: bool, render: Callable[[dict, bool], str] | None) -> int:
    """The document out: written to the run folder keep_document named, if any, then printed (as JSON, or as
    `render` makes it). -> the exit code, 1 when either write failed."""
    if isinstance(doc, dict):  # the one contract: every document says ok, and exit 1 = ok false + error + fix
        doc = {"ok": code == 0, **{k: v for k, v in doc.items() if k != "ok"}}
    path = _KEEP.pop() if _KEEP else None
    try:
        if path:
            write_own_file(path, json_text(doc)[0] + "\n")
    except ScriptError as exc:
        with contextlib.suppress(OSError):  # an older document there must not pass for this step's
            os.unlink(path)
        if code == EXIT_OK:  # (a failure already is the first thing to say)
            doc, code, ok = {"ok": False, **exc.as_json()}, EXIT_FAIL, False
    return code if emit(doc, None if render is None else render(doc, ok)) else EXIT_FAIL  # cpu_tune --format env


def failure(exc: BaseException) -> tuple[dict, int]:
    """The error + fix and exit code of a script that raised (the contract is JSON, even for our own bug)."""
    if isinstance(exc, ScriptError):
        return exc.as_json(), exc.code
    if isinstance(exc, KeyboardInterrupt):
        return {"error": "interrupted", "fix": "run the command again"}, EXIT_FAIL
    if isinstance(exc, OSError):  # the machine's refusal (a full disk, a read-only folder, a link loop), not a bug
        return os_error(exc, "the system refused an operation").as_json(), EXIT_FAIL
    if isinstance(exc, ModuleNotFoundError):  # run with an interpreter that lacks the bundle's dependencies
        fix = (
            "run python3 scripts/bootstrap.py once (it makes the bundle's venv; the scripts then use it by themselves)"
        )
        return {"error": f"missing Python package {exc.name!r} in {sys.executable}", "fix": fix}, EXIT_FAIL
    if os.environ.get("EPYC_SKILL_DEBUG"):
        traceback.print_exc()
    fix = "re-run with EPYC_SKILL_DEBUG=1 to see the traceback on stderr, and report it"
    return {"error": f"internal error: {type(exc).__name__}: {exc}", "fix": fix}, EXIT_FAIL


def run_main(
    main: Callable[[Sequence[str] | None], tuple[Any, int]],
    argv: Sequence[str] | None = None,
    render: Callable[[dict, bool], str] | None = None,
) -> int:
    """Call ``main`` and turn every outcome into one document on stdout and an exit code. ``render(doc, ok)``
    replaces JSON for scripts with another output format (cpu_tune's env)."""
    if Path(sys.argv[0] or ".").resolve().parent == bundle.SCRIPTS:  # a script, not a test calling main
        venv_python = bundle.BUNDLE_VENV / "bin" / "python"
        # when this interpreter lacks the dependencies and the bundle's venv has them, the same command runs there
        if not (
            os.environ.get(bundle.REEXEC_MARK)
            or not venv_python.exists()
            or Path(sys.prefix).resolve() == bundle.BUNDLE_VENV.resolve()
            or all(importlib.util.find_spec(name) for name in bundle.BUNDLE_DEPS.values())
        ):
            os.environ[bundle.REEXEC_MARK] = "1"
            os.execv(str(venv_python), [str(venv_python), *sys.argv])
        if sys.stderr is not None and not isinstance(sys.stderr, _MaskedStream):
            sys.stderr = _MaskedStream(sys.stderr)  # what libraries log through their own handlers is masked too
    previous = _interrupt_on_termination()
    try:
        doc, code = main(argv)
        ok = True
        name = Path(main.__code__.co_filename).stem
        # (not detect --capture's receipt: it runs on the host to plan for, where jsonschema is not installed)
        if code == EXIT_OK and isinstance(doc, dict) and name in bundle.INPUT_SCRIPTS and "capture" not in doc:
            # what we print is what the next script reads: a fact past its schema is refused here, not later
            check_schema(
                doc,
                name,
                f"{name}.py read facts it cannot describe",
                "check the input it read (sysroot, capture, model files) for values no machine or model has",
            )
    except (KeyboardInterrupt, Exception) as exc:
        (doc, code), ok = failure(exc), False
    finally:
        # the work is done: a signal now must not cut the document that says what was done
        _install(signal.SIG_IGN)
    try:
        code = say(doc, code, ok, render)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if _ABANDONED:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # whatever the stream says (None: closed at start), exit must happen
                stream.flush()
        os._exit(code)
    return code
