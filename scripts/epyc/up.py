"""launch.py up: plan, confirm, start, verify and hand off in one command."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from . import bundle, cli, cpuid, errors, jsonio, serve_procs, serve_state, subproc
from .command import is_served_name, served_model_name, stop_command
from .deployment import with_service
from .errors import ScriptError
from .handoff import handoff_doc
from .planfile import host_facts, key_facts
from .planner import SERVE_OPTIONS, build_plan, refuse_unkeyed_exposure
from .serve_start import start
from .serve_state import NO_RETRY_FIX, state_root, write_own_file
from .serve_stop import stop
from .serve_verify import verify
from .showing import refuse_a_plan_changed_since_shown, what_runs

# ---------------------------------------------------------------- up: the whole chain


def step(script: str, args: list[str], phase: str, run_dir: Path, allow_fail: bool = False) -> dict:
    """Run one of the bundle's scripts in up's run folder (it keeps its JSON there and reads the earlier
    steps' from it; its progress lines pass through to stderr), and stop on failure unless the caller
    wants to look at a failed verdict itself."""
    errors.log(f"up: {phase}")
    argv = [sys.executable, str(bundle.SCRIPTS / script), *args, "--run", str(run_dir)]
    (run_dir / f"{phase}.json").unlink(missing_ok=True)  # a step killed before it wrote leaves no older one
    res = subproc.run(argv, timeout=3600, stderr_through=True)
    try:
        doc = json.loads(res.stdout)
    except json.JSONDecodeError:
        raise ScriptError(
            f"FAILED in phase {phase}: {script} printed no JSON ({res.failure or res.returncode})",
            NO_RETRY_FIX,
            phase=phase,
        )
    if res.returncode != 0 and not allow_fail:
        raise phase_failed(phase, doc)
    return doc


def phase_failed(phase: str, doc: dict) -> ScriptError:
    errors = doc.get("errors") or []
    msg = (
        doc.get("error")
        or "; ".join(e["message"] for e in errors)
        or doc.get("message")
        or (doc.get("fit") or {}).get("action")
        or "failed"
    )
    fix = doc.get("fix") or next((e["fix"] for e in errors if e.get("fix")), None) or NO_RETRY_FIX
    return ScriptError(f"FAILED in phase {phase}: {msg}", fix, phase=phase, result=doc)


TERMINAL = "/dev/tty"


def ask(question: str, unanswered: ScriptError) -> bool:
    """A yes/no question on the terminal (never on stdout, which carries the JSON; the plan it asks about is
    on stderr already). With no terminal (an agent's shell) it raises `unanswered`, which says what a --yes
    then does."""
    try:
        tty = open(TERMINAL, "r+")
    except OSError:
        raise unanswered from None
    with tty:
        tty.write(question + " [y/N] ")
        tty.flush()
        return tty.readline().strip().lower() in ("y", "yes")


def state_dir_arg(spec: str) -> str:
    """--state-dir: a folder that is new, empty, or one this bundle already keeps (its own files only),
    recorded by its real absolute path (a relative one is taken from the current folder, once, here).
    start writes and stop removes files there: never '/', a home or a system folder by mistake."""
    path = jsonio.user_path(spec, "--state-dir")
    there, _ = jsonio.nearest_existing(Path(os.path.abspath(path)))
    if there.is_symlink() and not there.exists():  # start would make the link's target, wherever it points
        raise ScriptError(
            f"--state-dir {spec[:200]!r} goes through a link that leads nowhere ({there})", "pass a real folder path"
        )
    path = jsonio.real_path(path)
    serve_state.refuse_state_dir(
        path, f"--state-dir {spec[:200]}", "pass a new or empty folder, e.g. ~/.cache/serving-llms-on-epyc/run/NAME"
    )
    return str(path)


def check_default_state_dir(plan: dict) -> None:
    """The state dir a plan names when --state-dir was not given (~/.cache/.../run/host-PORT) obeys the
    same rule as one that was: new, or holding only this bundle's files."""
    serve_state.refuse_state_dir(
        Path(plan["state_dir"]),
        f"the state dir {plan['state_dir']}",
        "pass --state-dir with a new or empty folder, or clear that one",
    )


def refuse_before_up(a: argparse.Namespace, model: str) -> None:
    """What plan would refuse after five scripts ran (minutes, a Hub download) is refused first."""
    if model.startswith("-"):  # passed on to check_model it read as an option ("expected one argument")
        raise ScriptError(
            f"--model {model[:100]!r} starts with '-': not a model name or folder",
            "pass a Hub id (org/name) or a folder path (./-x for a folder named -x)",
        )
    refuse_unkeyed_exposure(a.expose, a.api_key_env, key_facts(a.api_key_env))
    # a folder is served by its name: one that is not a plain name needs --served-model-name (plan would say so
    # after five scripts ran)
    local = os.path.isdir(model)
    served = a.served_model_name or served_model_name(model, os.path.realpath(model) if local else None)
    if not is_served_name(served):
        raise ScriptError(
            f"the model would be served as {served[:100]!r}, not a plain name (letters, digits and "
            "._:@+/-, not starting with '-', at most 200)",
            "pass --served-model-name NAME",
        )


def refuse_a_busy_run_dir(run_dir: Path) -> None:
    """up's steps write their five documents and plan.json into its folder before it starts: over a running server's
    (a second `up` with the default folder), the plan that stops that server would be gone, and the server
    named by nothing. A folder whose state names a running server is refused before anything is written."""
    held = serve_state.read_state({"state_file": str(run_dir / "state.json")})
    running = serve_procs.state_server(held) if held else None
    if running:
        raise ScriptError(
            f"{run_dir} holds a running server ({running}): up would write its plan over the one that stops it",
            f"{stop_command(run_dir / 'plan.json')} first, or run up with another --state-dir",
        )


UP_STOPPED = "up stopped the server it had started"


def stop_for_up(plan: dict, plan_file: Path) -> tuple[dict, str]:
    """up stops what it started when a step fails; stop itself may refuse (a runtime that does not answer
    which container has the name, one that became remote): then the step's own failure is still what up
    reports, with the refusal beside it and the command that stops the server once it can."""
    with cli.signals_deferred():  # a signal now waits until the server is stopped (or stop has said no)
        try:
            return stop(plan), UP_STOPPED
        except ScriptError as err:
            again = stop_command(plan_file)
            return (
                {"stopped": False, "refused": err.error, "fix": f"{err.fix}; then {again}"},
                f"up could NOT stop the server it had started ({err.error}); it may be running: {err.fix}, "
                f"then {again}",
            )


def up_fix(fix: str, stopped: dict) -> str:
    """What to do after up failed: its step's fix, or, when up could not stop its server, first that."""
    return f"{stopped['fix']}; then {fix}" if "refused" in stopped else fix


def interrupted(plan: dict, plan_file: Path, when: str, phase: str) -> ScriptError:
    """A signal landed while up's server ran unverified: up stops it (by the recorded container or group)."""
    stopped, said = stop_for_up(plan, plan_file)
    return ScriptError(
        f"interrupted {when}: {said}",
        up_fix("run up again", stopped),
        phase=phase,
        plan_file=str(plan_file),
        stopped=stopped,
    )


def start_or_stop(plan: dict, plan_file: Path) -> dict:
    """up's start: a Ctrl-C or SIGTERM that start held while it launched (it then says the server runs)
    stops that server, as an interrupted verify does: nothing unverified is left running."""
    try:
        return start(plan, confirm=True)
    except ScriptError as exc:
        if not exc.extra.get("interrupted"):
            raise
    except KeyboardInterrupt:  # during `docker run`: the engine may have started the container already
        pass
    raise interrupted(plan, plan_file, "during start", "start")  # whether or not the server got going


def verify_or_stop(plan: dict, plan_file: Path, timeout: float, smoke_timeout: float) -> dict:
    """up started the server, so up stops it when verify fails, and when verify is interrupted (Ctrl-C,
    or the SIGTERM of an agent's tool timeout): an endpoint nobody verified is not left running."""
    try:
        return verify(plan, timeout, smoke_timeout)
    except ScriptError as exc:
        stopped, said = stop_for_up(plan, plan_file)
        if said != UP_STOPPED:  # verify's verdict stays the error; that the server may still run is said beside it
            exc.fix = f"{exc.fix}; but {said}"
        exc.extra.update(plan_file=str(plan_file), stopped=stopped)
        raise
    except KeyboardInterrupt:  # the second signal of `timeout` or a double Ctrl-C waits in stop_for_up
        raise interrupted(plan, plan_file, "during verify", "verify") from None
    except Exception as exc:  # a full disk as verify records its verdict: nothing unverified is left running
        raise stopped_after(exc, "verify", plan_file, *stop_for_up(plan, plan_file)) from None


def stopped_after(exc: Exception, phase: str, plan_file: Path, stopped: dict, said: str) -> ScriptError:
    """What up says when a step failed on something other than its own verdict (the machine refused a
    write): the failure in words a user acts on, and whether up stopped the server it had started."""
    err = (
        errors.os_error(exc, f"{phase} could not go on")
        if isinstance(exc, OSError)
        else ScriptError(f"{phase} could not go on ({type(exc).__name__}: {exc})", "run up again")
    )
    return ScriptError(
        f"{err.error}: {said}", up_fix(err.fix, stopped), phase=phase, plan_file=str(plan_file), stopped=stopped
    )


def host_path_args(python: str | None) -> list[str]:
    """validate.py's arguments for up's --python: that interpreter AND the host path. --python names the
    host path's interpreter, so a user who gives one means to serve from it; validate's own order would
    pick a container whenever docker answers, and the interpreter given would be probed for nothing."""
    return ["--python", python, "--runtime", "host"] if python else []


@contextlib.contextmanager
def holding_the_run_dir(run_dir: Path) -> Iterator[None]:
    """up holds its folder (.up.lock) from its first step to its last verb: a second up, or a start there,
    would write over its documents and plan.json."""
    import fcntl

    if serve_state.start_in_progress({"state_dir": str(run_dir)}):
        raise ScriptError(f"a start for {run_dir} is in progress", "wait for it, or run up with another --state-dir")
    fd = serve_state.open_own_file(run_dir / ".up.lock", os.O_WRONLY | os.O_CREAT, phase="up")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ScriptError(
                f"another up is running in {run_dir}", "wait for it to finish, or run up with another --state-dir"
            ) from None
        # start's own lock file, checked now: a link or folder there is refused before five steps run
        os.close(serve_state.open_own_file(run_dir / ".lock", os.O_WRONLY | os.O_CREAT, phase="up"))
        held = {str(run_dir), str(jsonio.real_path(run_dir))}  # the plan names the folder by its real path
        serve_state.UP_HOLDS.update(held)  # this up's own start is not another's
        try:
            yield
        finally:
            serve_state.UP_HOLDS.difference_update(held)
    finally:
        os.close(fd)


def up(a: argparse.Namespace, epyc: dict) -> dict:
    model = a.model or epyc["default_model"]
    refuse_before_up(a, model)
    run_dir = Path(state_dir_arg(a.state_dir or str(state_root() / "up")))  # the default obeys the same rule
    refuse_a_busy_run_dir(run_dir)
    serve_state.make_own_folder(run_dir, "pass --state-dir with a new folder of your own", "up")
    with holding_the_run_dir(run_dir):
        return up_in(run_dir, model, a, epyc)


def detected_and_validated(run_dir: Path, a: argparse.Namespace, epyc: dict) -> tuple[dict, dict]:
    """detect (stop where the route says so), then validate (no runtime: its one-time fix, and stop)."""
    det = step("detect.py", [], "detect", run_dir)
    route = cpuid.route_host(det, epyc["supported_generations"], stock=a.stock)
    if route["route"] in ("stop", "stock_offer"):
        raise ScriptError(
            f"FAILED in phase detect: {route['reason']}",
            route["fix"],
            phase="detect",
            route=route["route"],
            started=False,
        )
    vargs = (["--stock"] if a.stock else []) + host_path_args(a.python)
    val = step("validate.py", vargs, "validate", run_dir, allow_fail=True)
    if not val.get("ready"):
        raise phase_failed("validate", val)
    return det, val


def sized(run_dir: Path, model: str, a: argparse.Namespace, epyc: dict, det: dict, val: dict) -> dict:
    """check_model, estimate_memory and cpu_tune, each reading what it needs from the run folder (the stack
    validate found, the model checked, the RAM detect read, the weights sized): the five documents."""
    chk = step("check_model.py", ["--model", model], "check_model", run_dir)
    max_len = str(a.max_model_len or epyc["serve"]["default_max_model_len"])
    sizing = ["--max-model-len", max_len, "--num-prompts", str(a.num_prompts)] + (
        ["--dtype", a.dtype] if a.dtype else []
    )
    est = step("estimate_memory.py", sizing, "estimate_memory", run_dir)  # sized as it is served
    tune = step("cpu_tune.py", [], "cpu_tune", run_dir)
    return {"detect": det, "validate": val, "check_model": chk, "estimate_memory": est, "cpu_tune": tune}


def planned_and_confirmed(run_dir: Path, model: str, a: argparse.Namespace, epyc: dict, inputs: dict) -> tuple:
    """The plan, written and shown; launched only on a yes (a --yes only for what was shown).
    -> (plan, plan_file, shown)."""
    opts = {
        **{k: getattr(a, k) for k in SERVE_OPTIONS},
        "model": model,
        "max_model_len": inputs["estimate_memory"]["fit"]["max_model_len"],
        "state_dir": str(jsonio.real_path(run_dir)),
    }
    plan = build_plan(inputs, opts, epyc, host_facts(opts, inputs))
    plan_file = run_dir / "plan.json"
    write_own_file(plan_file, json.dumps(plan, indent=2) + "\n")
    errors.log(plan["summary_markdown"])
    shown = run_dir / "shown-plan.json"
    if a.yes:
        refuse_a_plan_changed_since_shown(plan, shown)
    else:  # shown: a --yes later runs only it
        write_own_file(shown, json.dumps(what_runs(plan), indent=2) + "\n")
    unanswered = ScriptError(
        "confirmation needed and there is no terminal: up showed its plan (the summary on "
        f"stderr; {plan_file}) and launched nothing",
        "read the plan with the user and run up again with --yes to launch it: it launches only "
        "what was shown, else it shows the new plan and stops again",
        phase="confirm",
        plan_file=str(plan_file),
        started=False,
    )
    if not a.yes and not ask(plan["summary_markdown"] + "\n\nLaunch this?", unanswered):
        raise ScriptError(
            "not launched: the plan was declined",
            f"change what you want and run up again; the plan is in {plan_file}",
            phase="confirm",
            plan_file=str(plan_file),
            started=False,
        )
    return plan, plan_file, shown


def up_in(run_dir: Path, model: str, a: argparse.Namespace, epyc: dict) -> dict:
    """up's steps, in its folder, which it holds."""
    det, val = detected_and_validated(run_dir, a, epyc)
    inputs = sized(run_dir, model, a, epyc, det, val)
    plan, plan_file, shown = planned_and_confirmed(run_dir, model, a, epyc, inputs)
    result = serve_verified(plan, plan_file, a.timeout, epyc["serve"]["smoke_timeout_s"])
    # used up only by a serve that went through: after a failed start (its port taken meanwhile) the next
    # --yes is still held to what was shown, and launches only that
    shown.unlink(missing_ok=True)
    return result


def serve_verified(plan: dict, plan_file: Path, timeout: float, smoke_timeout: float) -> dict:
    """up's start and verify: each step stops the server on its own failure or interrupt, and a signal that
    lands between them, or after them, stops it too (up ends with a handoff or with nothing running)."""
    phase = "start"
    try:
        started = start_or_stop(plan, plan_file)
        phase = "verify"
        result = verify_or_stop(plan, plan_file, timeout, smoke_timeout)
        phase = "handoff"
        return {
            "ok": True,
            "phase": "done",
            "plan_file": str(plan_file),
            "started": started,
            "verify": result,
            "handoff": with_service(plan, handoff_doc(plan, result["served_model_name"], result["primary_endpoint"])),
            "stop_command": plan["stop_command"],
        }
    except KeyboardInterrupt:  # between the guarded steps or after them: a handoff, or nothing left running
        raise interrupted(plan, plan_file, "after start", "verify") from None
    except ScriptError:  # each step's own: it stopped the server already, or nothing was started
        raise
    except Exception as exc:  # the handoff after a passed verify, say: the same rule
        raise stopped_after(exc, phase, plan_file, *stop_for_up(plan, plan_file)) from None
