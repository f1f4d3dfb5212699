"""The run folder: each step keeps its document there, and the next step reads what it needs from it."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from epyc import cli, jsonio
from epyc.deployments.serve_state import make_own_folder
from epyc.errors import ScriptError
from epyc.facts.hubcache import state_root

DEFAULT = "local"  # this machine's run folder; another target's is named by --run


def run_dir(spec: str) -> Path:
    """--run: a plain name is a folder under ~/.cache/serving-llms-on-epyc/run/, anything with a '/' a path."""
    if "/" not in spec and spec not in (".", ".."):
        if not spec or spec.startswith("-") or not spec.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ScriptError(
                f"--run {spec[:100]!r} is not a plain name (letters, digits, . _ -) nor a path",
                "pass a name like box9654, or a folder path like ./run",
            )
        return state_root() / spec
    return Path(os.path.abspath(jsonio.user_path(spec, "--run")))


def add_run_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--run",
        default=os.environ.get("EPYC_RUN") or DEFAULT,
        help="run folder: each step keeps its JSON there and reads the earlier steps' (a name under "
        "~/.cache/serving-llms-on-epyc/run/, or a path; default: $EPYC_RUN, else %(default)s)",
    )


def keep(args: argparse.Namespace, step: str) -> Path:
    """This script's document, whatever its outcome, also goes to RUN/STEP.json. -> the run folder."""
    folder = run_dir(args.run)
    cli.keep_document(folder / f"{step}.json")  # first: a refusal below replaces the older document too
    return make_own_folder(folder, "pass --run a folder of your own", step)


def keep_before_parsing(argv, step: str) -> None:
    """The run folder read off the command line before it is parsed: a bad-arguments exit is this step's
    document too, never the older one left for the next step to read. (A bad --run is said by the parser.)"""
    pre = cli.JsonArgumentParser(add_help=False)
    add_run_arg(pre)
    try:
        keep(pre.parse_known_args(argv)[0], step)
    except (ScriptError, OSError):
        pass


def earlier(folder: Path, step: str) -> dict | None:
    """An earlier step's document in the run folder, or None; one that failed is refused with its own error and fix."""
    path = folder / f"{step}.json"
    if not path.exists():
        return None
    doc = jsonio.read_json_input(str(path), step)
    if step != "plan":
        jsonio.check_schema(doc, step, f"{path} is not {step}.py's output", f"run {step}.py again with --run {folder}")
    return doc


def needed(folder: Path, step: str, flag: str) -> dict:
    """An earlier step's document that this step cannot go on without."""
    doc = earlier(folder, step)
    if doc is None:
        raise ScriptError(
            f"no {step}.json in the run folder {folder}, and no {flag}",
            f"run python3 scripts/{'launch.py plan' if step == 'plan' else step + '.py'} --run {folder} first, "
            f"or pass {flag}",
        )
    return doc


def host_source(detected: dict) -> tuple[str | None, str | None]:
    """(sysroot, ssh host) that reads again the host detect.py read: None, None for this machine."""
    target = detected.get("target", "localhost")
    kind, _, where = target.partition(":")
    if target == "localhost":
        return None, None
    if kind == "spec":
        return (detected.get("spec") or {}).get("sysroot"), None  # detect.py --spec rendered it there
    if kind in ("sysroot", "capture"):
        return where, None
    return None, target
