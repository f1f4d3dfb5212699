"""What up showed last, and whether a --yes may launch the plan it has now."""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import masking, serve_state
from .errors import ScriptError
from .serve_state import write_own_file


def what_runs(plan: dict) -> dict:
    """What a yes starts: the commands (the runtime's pre-steps and the server's), the environment, and the
    secrets it is given (each by the variable it is read from: a token set since the showing is a change)."""
    return {"pre_argv": plan["pre_argv"], "command": plan["command"], "env": plan["env"], "secrets": plan["secrets"]}


def showing_differs(before: dict | None, now: dict) -> str | None:
    """Why a --yes cannot launch `now` on the strength of the showing `before` (None: it is what was shown)."""
    if not isinstance(before, dict) or any(k not in before for k in now):  # not JSON, not ours, another version
        return "up could not read the plan it showed last (shown-plan.json is not a showing of this bundle's)"
    changed = [k for k in now if before[k] != now[k]]
    return f"the plan differs from the one up showed last ({', '.join(changed)})" if changed else None


def read_showing(shown: Path) -> dict | None:
    """What up last showed (shown-plan.json), or None where it cannot be read as a showing."""
    try:  # as a file of the state dir is read: never through a link
        with os.fdopen(serve_state.open_own_file(shown, os.O_RDONLY, phase="confirm"), "rb") as f:
            before = json.loads(f.read(1 << 20))
    except (OSError, ValueError, RecursionError, ScriptError):
        return None
    return before if isinstance(before, dict) else None


def refuse_a_plan_changed_since_shown(plan: dict, shown: Path) -> None:
    """`up --yes` after an up that showed its plan and launched nothing launches only when what runs is what
    was shown; with no earlier showing there is nothing to hold it to."""
    if not os.path.lexists(shown):
        return
    before = read_showing(shown)
    now = what_runs(plan)
    said = showing_differs(before, now)
    if said is None:
        return
    write_own_file(shown, json.dumps(now, indent=2) + "\n")
    raise ScriptError(
        f"not launched: {said}; it now runs: {masking.clip(plan['command'], 600)}",
        "read the new plan (the summary above; plan.json) and run up again with --yes to launch it",
        phase="confirm",
        plan_file=str(shown.with_name("plan.json")),
        started=False,
    )
