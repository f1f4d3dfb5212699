"""A plan on disk: reading it back, checking it, and re-rendering it from its inputs."""

from __future__ import annotations

from pathlib import Path

from epyc import bundle, jsonio, masking
from epyc.decisions import command, planner
from epyc.deployments import serve_procs, serve_state
from epyc.errors import ScriptError
from epyc.facts import runtimes, shell

PLAN_FIX = "pass the unmodified output of launch.py plan (plan again if you need changes)"


def refuse_edited(plan: dict, fresh: dict, phase: str) -> None:
    """A plan runs only as its own inputs render it: an edited argv, env or binary is never executed."""
    if diff := planner.plan_differences(plan, fresh):
        raise ScriptError(
            f"the plan differs from what its own inputs render now ({', '.join(diff)}): it was "
            "edited, or the environment changed since it was planned (HF_TOKEN, HF_HUB_OFFLINE, "
            "the API key variable, the model folder)",
            "plan again in this shell and confirm that plan: what the human approves is exactly what runs",
            phase=phase,
        )


def rerender(plan: dict, epyc: dict, env_from_plan: bool = False, phase: str = "start") -> dict:
    """The plan its own inputs and options give in this shell now. `env_from_plan`: secrets, offline state,
    HF cache and model folder as the plan recorded them (stop works where the key is not exported, and
    under a moved cache)."""
    try:
        for name in bundle.INPUT_SCRIPTS:  # an edited input is refused before it is used
            what = f"the plan's inputs: {name} is not {name}.py's output"
            jsonio.check_schema(plan["inputs"].get(name), name, what, PLAN_FIX)
        facts = shell.shell_facts(plan["options"], plan["inputs"], list_cache=not env_from_plan)
        if env_from_plan:
            facts.update(
                hf_token_set="HF_TOKEN" in (plan.get("secrets") or {}),
                api_key_set=bool(plan["options"].get("api_key_env")),
                api_key_length=None,
                unsendable_secrets=[],
                hf_offline=(plan.get("env") or {}).get("HF_HUB_OFFLINE") == "1",
            )
            # the pair as start checked it: a certificate expired since must not stop verify or stop
            facts["tls"] = facts["tls"] and {"tls": plan.get("tls"), "checked": True}
            facts["hf_cache"] = {"real": plan["inputs"]["validate"]["hf_cache"]["path"], "entries": None, "error": None}
            # the folder start served (its state records it), not the plan's field an edit could change with the
            # argv; no state of this plan's (nothing started): the disk
            served = serve_state.read_state(plan) or {}
            served = {} if serve_procs.foreign_state(plan, served) else served
            if "model_dir" in served and isinstance(served["model_dir"], (str, type(None))):
                facts["model_dir"] = served["model_dir"]
        return planner.build_plan(plan["inputs"], plan["options"], epyc, facts)
    except ScriptError as exc:  # e.g. the API key variable is not set in this shell
        exc.extra.setdefault("phase", phase)
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ScriptError(f"the plan's inputs cannot be rendered again ({type(exc).__name__}: {exc})", PLAN_FIX)


def stop_by_hand(plan: dict) -> str:
    """How to stop the server of a plan this bundle does not read, by the runtime's commands or a group kill."""
    name, state_dir = plan.get("container_name"), plan.get("state_dir")
    try:
        rt = runtimes.runtime_argv(plan.get("runtime"), plan.get("engine"))
    except (ScriptError, TypeError):
        rt = None
    if rt and isinstance(name, str) and serve_state.CONTAINER_NAME.fullmatch(name):
        return f"stop its server by hand ({command.runtime_stop_pair(rt, name, state_dir if isinstance(state_dir, str) else None)})"
    if isinstance(plan.get("state_file"), str):
        return f"stop its server by hand (kill -- -PGID, with the pgid {plan['state_file']} records)"
    return "stop its server by hand (ps, then kill its process group)"


def refuse_older(doc: object, path: str) -> None:
    """A plan file of another version of this bundle is never read on: one message, with the stop by hand."""
    if not isinstance(doc, dict) or doc.get("schema_version") == planner.PLAN_SCHEMA_VERSION:
        return
    if {"argv", "kind", "fleet_version", "front_version"} & doc.keys():
        raise ScriptError(
            f"{path} is a plan of another version of this bundle (schema_version "
            f"{masking.clip(str(doc.get('schema_version')), 20)}; this bundle reads {planner.PLAN_SCHEMA_VERSION})",
            stop_by_hand(doc) + ", then plan again with this bundle",
        )


def check_plan(plan: object, path: str) -> dict:
    """An engine's plan checked against its schema, its state and log in its state dir, its secrets masked."""
    jsonio.check_schema(plan, "plan", f"{path} is not a launch plan", PLAN_FIX)
    masking.treat_as_secret(*(plan.get("secrets") or {}).values(), plan.get("api_key_env") or "")
    state_dir = Path(plan["state_dir"])  # read before rerender compares the rest: never a file elsewhere
    if Path(plan["state_file"]) != state_dir / "state.json" or Path(plan["log_file"]) != state_dir / "server.log":
        raise ScriptError(f"{path}: state_file and log_file must be state.json and server.log in state_dir", PLAN_FIX)
    return plan


def load_plan(path: str) -> dict:
    """An engine's plan file, read and checked (check_plan)."""
    plan = jsonio.read_json_input(path, "plan")
    refuse_older(plan, path)
    return check_plan(plan, path)


def read_plan(path: str, verb: str, epyc: dict) -> dict:
    """A plan by load_plan's rules, refused unless its inputs render it (but for start, with the plan's secrets)."""
    plan = load_plan(path)
    refuse_edited(plan, rerender(plan, epyc, env_from_plan=verb != "start", phase=verb), verb)
    return plan
