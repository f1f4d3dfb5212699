"""What up showed last, and whether a --yes may launch the plan it has now."""

from __future__ import annotations

import json
import os
from pathlib import Path

from epyc import jsonio, masking
from epyc.errors import ScriptError


def what_runs(plan: dict) -> dict:
    """What a yes starts: the commands, the environment and the secrets (by the variable each is read from)."""
    return {"pre_argv": plan["pre_argv"], "command": plan["command"], "env": plan["env"], "secrets": plan["secrets"]}


def showing_differs(before: dict | None, now: dict) -> str | None:
    """Why a --yes cannot launch `now` on the strength of the showing `before` (None: it is what was shown)."""
    if not isinstance(before, dict) or any(k not in before for k in now):  # not JSON, not ours, another version
        return "up could not read the plan it showed last (shown-plan.json is not a showing of this bundle's)"
    changed = [k for k in now if before[k] != now[k]]
    return f"the plan differs from the one up showed last ({', '.join(changed)})" if changed else None


def refuse_a_plan_changed_since_shown(plan: dict, shown: Path) -> None:
    """`up --yes` launches only what up last showed (shown-plan.json), when it showed one."""
    if not os.path.lexists(shown):
        return
    try:  # as a file of the state dir is read: never through a link
        with os.fdopen(jsonio.open_own_file(shown, os.O_RDONLY, phase="confirm"), "rb") as f:
            before = json.loads(f.read(1 << 20))
    except (OSError, ValueError, RecursionError, ScriptError):
        before = None
    now = what_runs(plan)
    said = showing_differs(before, now)
    if said is None:
        return
    jsonio.write_own_file(shown, json.dumps(now, indent=2) + "\n")
    raise ScriptError(
        f"not launched: {said}; it now runs: {masking.clip(plan['command'], 600)}",
        "read the new plan (the summary above; plan.json) and run up again with --yes to launch it",
        phase="confirm",
        plan_file=str(shown.with_name("plan.json")),
        started=False,
    )
