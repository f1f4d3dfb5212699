"""What up showed last, and whether a --yes may launch the plan it has now."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from . import (
    masking,
    serve_state,
)
from .errors import ScriptError
from .serve_state import write_own_file


def what_runs(plan: dict) -> dict:
    """What a yes starts: the commands (the runtime's pre-steps and the server's), the environment, and the
    secrets it is given (each by the variable it is read from: a token set since the showing is a change)."""
    return {"pre_argv": plan["pre_argv"], "command": plan["command"], "env": plan["env"], "secrets": plan["secrets"]}


UP_REQUEST_FLAGS = (
    "model",
    "port",
    "served_model_name",
    "max_model_len",
    "num_prompts",
    "python",
    "stock",
    "dtype",
    "expose",
    "api_key_env",
    "throughput_flags",
    "kernel_log",
)


def up_request(a: argparse.Namespace, model: str) -> dict:
    """What up was asked for (its flags as typed, not --yes/--timeout/--state-dir): recorded with a showing
    only to say, when a --yes asks for something else, that the plan it holds was shown for another request."""
    return {**{k: getattr(a, k) for k in UP_REQUEST_FLAGS}, "model": model}


def showing_differs(before: dict | None, now: dict, request: dict) -> str | None:
    """Why a --yes cannot launch `now` on the strength of the showing `before` (None: it is what was shown).
    Any difference holds it, however the request was spelled: the same folder typed another way, a default
    given explicitly, or another model altogether is not proof that the human read this plan."""
    if isinstance(before, dict) and "command" not in before and before.get("question"):
        return "up had not shown this plan (its last question was the host stack's)"
    if not isinstance(before, dict) or any(k not in before for k in now):  # not JSON, not ours, another version
        return "up could not read the plan it showed last (shown-plan.json is not a showing of this bundle's)"
    changed = [k for k in now if before[k] != now[k]]
    if not changed:
        return None
    asked = before.get("request")
    flags = [k for k in UP_REQUEST_FLAGS if asked.get(k) != request.get(k)] if isinstance(asked, dict) else []
    if flags:  # an older showing (another model, other flags)
        return (
            f"up last showed a plan for another request (--{', --'.join(f.replace('_', '-') for f in flags)} "
            f"differ), not this one"
        )
    return f"the plan changed since up showed it ({', '.join(changed)})"


def read_showing(shown: Path) -> dict | None:
    """What up last showed (shown-plan.json), or None where it cannot be read as a showing."""
    try:  # as a file of the state dir is read: never through a link, never a FIFO that blocks
        with os.fdopen(serve_state.open_own_file(shown, os.O_RDONLY, phase="confirm"), "rb") as f:
            before = json.loads(f.read(1 << 20))
    except (OSError, ValueError, RecursionError, ScriptError):
        return None
    return before if isinstance(before, dict) else None


def refuse_a_plan_changed_since_shown(plan: dict, shown: Path, request: dict) -> None:
    """`up --yes` after an up that showed its plan and launched nothing (no terminal, or declined) plans again:
    it launches only when what runs is what was shown. A port taken, a socket chosen by load, a Hub revision
    moved, a token set in between made the yes launch a plan nobody read. Without an earlier showing
    (--yes given up front), there is nothing to hold it to."""
    if not os.path.lexists(shown):
        return
    before = read_showing(shown)
    now = what_runs(plan)
    said = showing_differs(before, now, request)
    if said is None:
        return
    write_own_file(shown, json.dumps({"request": request, **now}, indent=2) + "\n")
    raise ScriptError(
        f"not launched: {said}; it now runs: {masking.clip(plan['command'], 600)}",
        "read the new plan (the summary above; plan.json) and run up again with --yes to launch it",
        phase="confirm",
        plan_file=str(shown.with_name("plan.json")),
        started=False,
    )
