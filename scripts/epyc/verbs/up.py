"""launch.py up: plan, confirm, start, verify and hand off in one command."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from epyc import bundle, cli, errors, jsonio, subproc
from epyc.argtypes import is_served_name
from epyc.decisions import command, handoff, planner
from epyc.deployments import deployment, serve_procs, serve_state
from epyc.deployments.serve_start import start
from epyc.deployments.serve_stop import stop
from epyc.deployments.serve_verify import verify
from epyc.errors import ScriptError
from epyc.facts import cpuid, hubcache, shell
from epyc.verbs.showing import refuse_a_plan_changed_since_shown, what_runs

TERMINAL = "/dev/tty"
UP_STOPPED = "up stopped the server it had started"


def step(script: str, args: list[str], phase: str, run_dir: Path, allow_fail: bool = False) -> dict:
    """One of the bundle's scripts run in up's folder, its progress on stderr; a failure raises unless `allow_fail`."""
    errors.log(f"up: {phase}")
    argv = [sys.executable, str(bundle.SCRIPTS / script), *args, "--run", str(run_dir)]
    (run_dir / f"{phase}.json").unlink(missing_ok=True)  # a step killed before it wrote leaves no older one
    res = subproc.run(argv, timeout=3600, stderr_through=True)
    try:
        doc = json.loads(res.stdout)
    except json.JSONDecodeError:
        why = f"FAILED in phase {phase}: {script} printed no JSON ({res.failure or res.returncode})"
        raise ScriptError(why, serve_state.NO_RETRY_FIX, phase=phase)
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
    fix = doc.get("fix") or next((e["fix"] for e in errors if e.get("fix")), None) or serve_state.NO_RETRY_FIX
    return ScriptError(f"FAILED in phase {phase}: {msg}", fix, phase=phase, result=doc)


def ask(question: str, unanswered: ScriptError) -> bool:
    """A yes/no question on the terminal (stdout carries the JSON); with none (an agent's shell) `unanswered`."""
    try:
        tty = open(TERMINAL, "r+")
    except OSError:
        raise unanswered from None
    with tty:
        tty.write(question + " [y/N] ")
        tty.flush()
        return tty.readline().strip().lower() in ("y", "yes")


def state_dir_arg(spec: str) -> str:
    """--state-dir: a folder new, empty or this bundle's (its own files only), by its real absolute path."""
    path = jsonio.user_path(spec, "--state-dir")
    there, _ = jsonio.nearest_existing(Path(os.path.abspath(path)))
    if there.is_symlink() and not there.exists():  # start would make the link's target, wherever it points
        raise ScriptError(
            f"--state-dir {spec[:200]!r} goes through a link that leads nowhere ({there})", "pass a real folder path"
        )
    path, fix = jsonio.real_path(path), "pass a new or empty folder, e.g. ~/.cache/serving-llms-on-epyc/run/NAME"
    serve_state.refuse_state_dir(path, f"--state-dir {spec[:200]}", fix)
    return str(path)


def check_default_state_dir(plan: dict) -> None:
    """The default state dir a plan names (~/.cache/.../run/host-PORT) obeys state_dir_arg's rule."""
    fix = "pass --state-dir with a new or empty folder, or clear that one"
    serve_state.refuse_state_dir(Path(plan["state_dir"]), f"the state dir {plan['state_dir']}", fix)


def refuse_before_up(a: argparse.Namespace, model: str, epyc: dict) -> None:
    """What plan would refuse after five scripts ran (minutes, a Hub download) is refused first."""
    if model.startswith("-"):  # passed on to check_model it read as an option ("expected one argument")
        raise ScriptError(
            f"--model {model[:100]!r} starts with '-': not a model name or folder",
            "pass a Hub id (org/name) or a folder path (./-x for a folder named -x)",
        )
    planner.refuse_unkeyed_exposure(a.expose, a.api_key_env, shell.key_facts(a.api_key_env))
    planner.checked_tls(a.expose, vars(a), {"tls": shell.tls_facts(vars(a), "localhost")}, epyc)
    # a folder is served by its name: one that is not a plain name needs --served-model-name
    local = os.path.isdir(model)
    served = a.served_model_name or command.served_model_name(model, os.path.realpath(model) if local else None)
    if not is_served_name(served):
        raise ScriptError(
            f"the model would be served as {served[:100]!r}, not a plain name (letters, digits and "
            "._:@+/-, not starting with '-', at most 200)",
            "pass --served-model-name NAME",
        )


def refuse_a_busy_run_dir(run_dir: Path) -> None:
    """A folder whose state names a running server: up would write over the plan that stops it."""
    held = serve_state.read_state({"state_file": str(run_dir / "state.json")})
    if held and (running := serve_procs.state_server(held)):
        raise ScriptError(
            f"{run_dir} holds a running server ({running}): up would write its plan over the one that stops it",
            f"{command.stop_command(run_dir / 'plan.json')} first, or run up with another --state-dir",
        )


def stop_for_up(plan: dict, plan_file: Path) -> tuple[dict, str]:
    """up stops what it started when a step fails. -> (stop's document, what up says: a refusal with its fix)."""
    with cli.signals_deferred():  # a signal now waits until the server is stopped (or stop has said no)
        try:
            return stop(plan), UP_STOPPED
        except ScriptError as err:
            again = command.stop_command(plan_file)
            return (
                {"stopped": False, "refused": err.error, "fix": f"{err.fix}; then {again}"},
                f"up could NOT stop the server it had started ({err.error}); it may be running: {err.fix}, "
                f"then {again}",
            )


def stopped_after(plan: dict, plan_file: Path, phase: str, error: str, fix: str) -> ScriptError:
    """up stops the server it started after a step failed or a signal: the failure, and whether up stopped it."""
    stopped, said = stop_for_up(plan, plan_file)
    fix = f"{stopped['fix']}; then {fix}" if "refused" in stopped else fix
    return ScriptError(f"{error}: {said}", fix, phase=phase, plan_file=str(plan_file), stopped=stopped)


def in_words(exc: Exception, phase: str) -> tuple[str, str]:
    """A failure other than a step's own verdict (a write refused) as the error and fix a user acts on."""
    if isinstance(exc, OSError):
        err = errors.os_error(exc, f"{phase} could not go on")
        return err.error, err.fix
    return f"{phase} could not go on ({type(exc).__name__}: {exc})", "run up again"


def start_or_stop(plan: dict, plan_file: Path) -> dict:
    """up's start: a signal that start held while it launched stops that server, whether or not it got going."""
    try:
        return start(plan, confirm=True)
    except ScriptError as exc:
        if not exc.extra.get("interrupted"):
            raise
    except KeyboardInterrupt:  # during `docker run`: the engine may have started the container already
        pass
    raise stopped_after(plan, plan_file, "start", "interrupted during start", "run up again")


def verify_or_stop(plan: dict, plan_file: Path, timeout: float, smoke_timeout: float) -> dict:
    """up stops the server it started when verify fails or is interrupted (Ctrl-C, an agent's tool timeout)."""
    try:
        return verify(plan, timeout, smoke_timeout)
    except ScriptError as exc:
        stopped, said = stop_for_up(plan, plan_file)
        if said != UP_STOPPED:  # verify's verdict stays the error; that the server may still run is said beside it
            exc.fix = f"{exc.fix}; but {said}"
        exc.extra.update(plan_file=str(plan_file), stopped=stopped)
        raise
    except KeyboardInterrupt:  # the second signal of `timeout` or a double Ctrl-C waits in stop_for_up
        raise stopped_after(plan, plan_file, "verify", "interrupted during verify", "run up again") from None
    except Exception as exc:  # a full disk as verify records its verdict: nothing unverified is left running
        raise stopped_after(plan, plan_file, "verify", *in_words(exc, "verify")) from None


@contextlib.contextmanager
def holding_the_run_dir(run_dir: Path) -> Iterator[None]:
    """up holds its folder (.up.lock) from its first step to its last (a second up or start there is refused)."""
    if serve_state.start_in_progress({"state_dir": str(run_dir)}):
        raise ScriptError(f"a start for {run_dir} is in progress", "wait for it, or run up with another --state-dir")
    fd = jsonio.open_own_file(run_dir / ".up.lock", os.O_WRONLY | os.O_CREAT, phase="up")
    try:
        if not serve_state.flock_within(fd, 0):
            raise ScriptError(
                f"another up is running in {run_dir}", "wait for it to finish, or run up with another --state-dir"
            )
        # start's own lock file, checked now: a link or folder there is refused before five steps run
        os.close(jsonio.open_own_file(run_dir / ".lock", os.O_WRONLY | os.O_CREAT, phase="up"))
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
    refuse_before_up(a, model, epyc)
    run_dir = Path(state_dir_arg(a.state_dir or str(hubcache.state_root() / "up")))  # the default obeys the same rule
    refuse_a_busy_run_dir(run_dir)
    serve_state.make_own_folder(run_dir, "pass --state-dir with a new folder of your own", "up")
    with holding_the_run_dir(run_dir):
        inputs = documents(run_dir, model, a, epyc)
        plan, plan_file, shown = planned_and_confirmed(run_dir, model, a, epyc, inputs)
        result = serve_verified(plan, plan_file, a.timeout, epyc["serve"]["smoke_timeout_s"])
        # used up only by a serve that went through: after a failed start the next --yes is still held to it
        shown.unlink(missing_ok=True)
        return result


def documents(run_dir: Path, model: str, a: argparse.Namespace, epyc: dict) -> dict:
    """The five steps, each reading the earlier ones' JSON from the run folder (detect's route may stop up)."""
    det = step("detect.py", [], "detect", run_dir)
    route = cpuid.route_host(det, epyc["supported_generations"], stock=a.stock)
    if route["route"] in ("stop", "stock_offer"):
        why = f"FAILED in phase detect: {route['reason']}"
        raise ScriptError(why, route["fix"], phase="detect", route=route["route"], started=False)
    # --python names the host path's interpreter: validate would pick a container whenever docker answers
    vargs = (["--stock"] if a.stock else []) + (["--python", a.python, "--runtime", "host"] if a.python else [])
    val = step("validate.py", vargs, "validate", run_dir, allow_fail=True)
    if not val.get("ready"):
        raise phase_failed("validate", val)
    chk = step("check_model.py", ["--model", model], "check_model", run_dir)
    max_len = str(a.max_model_len or epyc["serve"]["default_max_model_len"])
    dtype = ["--dtype", a.dtype] if a.dtype else []
    sizing = ["--max-model-len", max_len, "--num-prompts", str(a.num_prompts), *dtype]
    est = step("estimate_memory.py", sizing, "estimate_memory", run_dir)  # sized as it is served
    tune = step("cpu_tune.py", [], "cpu_tune", run_dir)
    return {"detect": det, "validate": val, "check_model": chk, "estimate_memory": est, "cpu_tune": tune}


def planned_and_confirmed(run_dir: Path, model: str, a: argparse.Namespace, epyc: dict, inputs: dict) -> tuple:
    """The plan, written and shown, launched only on a yes (a --yes only for what was shown)."""
    fit_len, here = inputs["estimate_memory"]["fit"]["max_model_len"], str(jsonio.real_path(run_dir))
    opts = {**{k: getattr(a, k) for k in planner.SERVE_OPTIONS}, "model": model, "max_model_len": fit_len}
    opts["state_dir"] = here
    plan = planner.build_plan(inputs, opts, epyc, shell.shell_facts(opts, inputs))
    plan_file = run_dir / "plan.json"
    jsonio.write_own_file(plan_file, json.dumps(plan, indent=2) + "\n")
    errors.log(plan["summary_markdown"])
    shown = run_dir / "shown-plan.json"
    if a.yes:
        refuse_a_plan_changed_since_shown(plan, shown)
    else:  # shown: a --yes later runs only it
        jsonio.write_own_file(shown, json.dumps(what_runs(plan), indent=2) + "\n")
    said = {"phase": "confirm", "plan_file": str(plan_file), "started": False}
    unanswered = ScriptError(*(t.format(plan_file=plan_file) for t in epyc["serve"]["up_unanswered"]), **said)
    if not a.yes and not ask(plan["summary_markdown"] + "\n\nLaunch this?", unanswered):
        fix = f"change what you want and run up again; the plan is in {plan_file}"
        raise ScriptError("not launched: the plan was declined", fix, **said)
    return plan, plan_file, shown


def serve_verified(plan: dict, plan_file: Path, timeout: float, smoke_timeout: float) -> dict:
    """up's start, verify and handoff; a failure or signal anywhere stops the server (a handoff, or nothing runs)."""
    phase = "start"
    try:
        started = start_or_stop(plan, plan_file)
        phase = "verify"
        result = verify_or_stop(plan, plan_file, timeout, smoke_timeout)
        phase = "handoff"
        shown = handoff.handoff_doc(plan, result["served_model_name"], result["primary_endpoint"])
        doc = {"ok": True, "phase": "done", "plan_file": str(plan_file), "started": started, "verify": result}
        return {**doc, "handoff": deployment.with_service(plan, shown), "stop_command": plan["stop_command"]}
    except KeyboardInterrupt:  # between the guarded steps or after them: a handoff, or nothing left running
        raise stopped_after(plan, plan_file, "verify", "interrupted after start", "run up again") from None
    except ScriptError:  # each step's own: it stopped the server already, or nothing was started
        raise
    except Exception as exc:  # the handoff after a passed verify, say: the same rule
        raise stopped_after(plan, plan_file, phase, *in_words(exc, phase)) from None
