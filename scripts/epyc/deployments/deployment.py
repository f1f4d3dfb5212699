"""One lifecycle for every deployment: one engine (its ranks included), a fleet behind a router, a front over hosts."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from epyc import jsonio, masking, subproc
from epyc.decisions.command import inherited_env, router_plan, stop_command
from epyc.decisions.handoff import handoff_doc, systemd_unit
from epyc.decisions.planner import checked_tls
from epyc.deployments import front, planfile, process, serve_procs, serve_start, serve_stop, serve_verify
from epyc.deployments.fleet import engine_urls, state_folder
from epyc.deployments.serve_state import auth_headers, make_own_folder, read_state, write_own_file
from epyc.errors import ScriptError
from epyc.facts.shell import tls_facts

KINDS = ("engine", "fleet", "front")
SYSTEMD_GIVES = ("PATH", "HOME", "USER", "LOGNAME")
SAY_OK = {"messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 4, "temperature": 0}  # to the router


@dataclass
class Deployment:
    """What one plan file runs here: its engines' plans and, for a fleet or a front, the router in front."""

    kind: str
    file: str  # the plan file, absolute
    doc: dict  # the file's document (one engine's: its plan)
    engines: list[dict]
    router: dict | None


def open_deployment(path: str, verb: str, epyc: dict) -> Deployment:
    """The plan file read once, as its `kind` says, every part refused unless its own inputs render it."""
    doc = jsonio.read_json_input(path, "plan")
    planfile.refuse_older(doc, path)
    kind, file = doc.get("kind"), os.path.abspath(path)
    if kind == "fleet":
        return Deployment(kind, file, doc, read_fleet(doc, path, verb, epyc), doc["router"])
    if kind == "front":
        doc = front.read_front(doc, path, epyc, hosts_again=verb in ("start", "verify"))
        return Deployment(kind, file, doc, [], doc["router"])
    plan = planfile.check_plan(doc, path)
    if verb != "start":
        planfile.refuse_edited(plan, planfile.rerender(plan, epyc, env_from_plan=True, phase=verb), verb)
    return Deployment("engine", file, plan, [plan], None)


def read_if_plan(path: str) -> dict | None:
    """The document of a plan file (a regular file of bounded size, never waited on), or None: no such document."""
    try:
        doc = jsonio.read_json_input(path, "plan")
    except ScriptError:
        return None
    return doc if isinstance(doc, dict) else None


def kind_of(path: str) -> str | None:
    """The kind a plan file says it is; None where it is no plan of this version."""
    doc = read_if_plan(path) or {}
    return doc.get("kind") if doc.get("kind") in KINDS else None


# ---------------------------------------------------------------- the router: one more host process


INSTALL = {
    "vllm-router": "python3 scripts/setup_host_stack.py --router",
    "nginx": "sudo apt-get install nginx-light && sudo systemctl disable --now nginx",
}


def parts(router: dict) -> list[dict]:  # the host processes in front of the engines: the router, then nginx (TLS)
    return [router, *([router["terminator"]] if "terminator" in router else [])]


def router_running(router: dict, need=all) -> bool:  # need=any: a part alive (nginx outliving its router) runs
    return need((state := read_state(spec)) and process.group_members(state) for spec in parts(router))


def start_router(router: dict) -> dict:
    """Each part not running (a repair starts only what is gone): the router's state, its terminator's beside."""
    # PATH alone: a proxy variable would send the router's calls to its engines through the proxy
    env, states = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, []
    for spec in parts(router):
        make_own_folder(Path(spec["state_dir"]), "plan the fleet with a folder of your own", "start")
        prog = Path(spec["argv"][0])
        if not prog.exists():
            raise ScriptError(f"{prog.name} is not installed", f"run {INSTALL[prog.name]}, then start again")
        if "config" in spec:  # nginx's, beside its state: paths only, never the key's content
            write_own_file(spec["argv"][2], spec["config"])
        up = (state := read_state(spec)) and process.group_members(state)  # a dead one's log is appended to
        if up and "config" in spec:  # a running nginx re-reads its rewritten config and a renewed pair when told
            os.kill(state["pid"], signal.SIGHUP)
        states.append(state if up else process.launch(spec, env, str(prog), prog.name, False))
    return {**states[0], **({"terminator": states[1]} if len(states) > 1 else {})}


def stop_router(router: dict) -> dict:
    was = False
    for spec in reversed(parts(router)):
        if (state := read_state(spec)) and (group := process.group_members(state)):
            process.end_group(state, group)
            was = True
        Path(spec["state_file"]).unlink(missing_ok=True)
    return {"stopped": True, "was_running": was}


def judge_router(dep: Deployment, timeout: float) -> dict:
    """The router's health, then one chat through it (with the key, when there is one), within `timeout`."""
    body, headers, why = {"model": dep.doc["served_model_name"], **SAY_OK}, auth_headers(dep.doc), "not started"
    tls = dep.router.get("terminator", {}).get("tls")  # through nginx when it serves TLS, as a client would
    base, deadline = f"http://127.0.0.1:{dep.router['port']}", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not router_running(dep.router):
            return {"answered": False, "why": "its process is gone (router.log, or tls/nginx.log, in its state dir)"}
        status, text = serve_verify.http("GET", f"{base}/health", 5, tls=tls)
        if status == 200:
            left = max(5.0, deadline - time.monotonic())
            status, text = serve_verify.http("POST", f"{base}/v1/chat/completions", left, headers, body, tls)
            if status == 200 and '"choices"' in text:
                return {"answered": True, "why": None}
            if status in (401, 403):  # no wait makes a wrong key right
                why = f"HTTP {status}: the engines refused the key in ${dep.doc['api_key_env']} (set it)"
                return {"answered": False, "why": why}
        why = f"HTTP {status}" if status else text
        time.sleep(1)
    return {"answered": False, "why": f"no answer within {timeout:g}s ({why})"}


# ---------------------------------------------------------------- the verbs


def entry_doc(dep: Deployment, **parts) -> dict:
    """A fleet's or front's document: its kind, what each verb says, the URL its router serves."""
    return {"kind": dep.kind, **parts, "base_url": dep.doc["base_url"]}


def start(dep: Deployment, epyc: dict, confirm: bool, pull: str = "missing") -> dict:
    """Every engine, then the router (what a failure leaves started is stopped); one partly running, repaired."""
    if not confirm:
        raise ScriptError(*serve_start.CONFIRM)
    for plan in dep.engines:  # rendered in this shell: the key and HF_TOKEN must be set here, now
        fresh = planfile.rerender(plan, epyc)
        serve_start.refuse_elsewhere(plan)  # a plan for another machine is refused as that, not as edited
        planfile.refuse_edited(plan, fresh, "start")
    if tls := (dep.router or {}).get("terminator", {}).get("tls"):  # expired or replaced since planned: refused
        checked_tls(True, {}, {"tls": tls_facts({f"tls_{k}": v for k, v in tls.items()}, "localhost")}, epyc)
    if dep.router is None:
        return serve_start.start(dep.engines[0], True, pull)
    # each engine's recorded server: alive (True), exited or never started (False), or its runtime did not say
    running = [serve_procs.alive(e, state) if (state := read_state(e)) is not None else False for e in dep.engines]
    if router_running(dep.router, any) or any(r is not False for r in running):
        return repair(dep, running)
    started = []
    try:
        for plan in dep.engines:
            started.append(serve_start.start(plan, True, pull))
        return entry_doc(dep, engines=started, router=start_router(dep.router))
    except BaseException as exc:  # what was interrupted after its launch was recorded runs too: stop it
        launched = len(started) + int(isinstance(exc, ScriptError) and "pid" in exc.extra)
        with contextlib.suppress(ScriptError, OSError):  # the router was not running before this start
            stop_router(dep.router)
        for plan in dep.engines[:launched]:
            with contextlib.suppress(ScriptError, OSError):
                serve_stop.stop(plan)
        raise


def repair(dep: Deployment, running: list[bool | None]) -> dict:
    """Each engine that does not serve, and the router when gone, started again while the rest serves."""
    out = []
    for plan, up in zip(dep.engines, running):  # a runtime that did not say (None) counts as running
        if up is None or (up and serve_verify.http("GET", f"http://127.0.0.1:{plan['port']}/health", 5)[0] == 200):
            out.append({"started": False, "running": True})
            continue
        serve_stop.stop(plan)
        out.append(serve_start.start(plan, confirm=True))
    router = read_state(dep.router) if router_running(dep.router) else start_router(dep.router)
    return entry_doc(dep, engines=out, router=router, repaired=sum(e["started"] for e in out))


def verify(dep: Deployment, epyc: dict, timeout: float) -> dict:
    """serve_verify's phases on each engine (a failed one is named), then one request through the router."""
    smoke = epyc["serve"]["smoke_timeout_s"]
    if dep.router is None:
        return serve_verify.verify(dep.engines[0], timeout, smoke)
    results, failed = [], []
    for i, plan in enumerate(dep.engines):
        try:
            results.append(serve_verify.verify(plan, timeout, smoke))
        except ScriptError as exc:
            entry = {"engine": i, "port": plan["port"], "error": exc.error, "phase": exc.extra.get("phase")}
            failed.append({**entry, "log_tail": exc.extra.get("log_tail") or serve_procs.log_tail(plan)})
    router = judge_router(dep, timeout if not failed else 30)
    doc = entry_doc(dep, engines=results, failed_engines=failed, router=router)
    if dep.kind == "front":
        doc["hosts"] = [h["url"] for h in dep.doc["hosts"]]
    if not failed and router["answered"]:
        return doc
    which = ", ".join(f"engine {f['engine']} (port {f['port']}): {f['error']}" for f in failed)
    say = "the router answers from the others" if router["answered"] else f"the router: {router['why']}"
    fix = epyc["router"]["degraded_fix"][dep.kind].format(key=dep.doc["api_key_env"])
    raise ScriptError(f"{'degraded: ' + which + '; ' if failed else ''}{say}", fix, phase="verify", **doc)


def handoff(dep: Deployment) -> dict:
    """What the user gets, at the deployment's entry: its URL, port and stop command."""
    if dep.kind == "front":
        if not router_running(dep.router):
            raise ScriptError("the front router is not running", "start it (launch.py start --confirm), then verify")
        doc = {k: dep.doc[k] for k in ("base_url", "served_model_name", "api_key_env", "router")}
        hosts, stop = [h["url"] for h in dep.doc["hosts"]], stop_command(dep.file)
        return {"kind": "front", **doc, "port": dep.router["port"], "hosts": hosts, "stop_command": stop}
    first = dep.engines[0]
    settled = serve_verify.verified_state(first).get("primary_endpoint")
    if dep.kind == "engine":
        return with_service(first, handoff_doc(first, settled=settled))
    entry = {"base_url": dep.doc["base_url"], "port": dep.router["port"], "stop_command": stop_command(dep.file)}
    entry["tls"] = dep.router.get("terminator", {}).get("tls")
    doc = handoff_doc(first, settled=settled, entry=entry)
    return {"kind": "fleet", **doc, "engines": [e["base_url"] for e in dep.engines]}


def stop(dep: Deployment) -> dict:
    """The router first, then every engine, whatever the one before said (one that refuses is named)."""
    if dep.router is None:
        return serve_stop.stop(dep.engines[0])
    stopped, refused = [], []
    try:
        router = stop_router(dep.router)
    except ScriptError as exc:  # a stuck router is named; the engines are still stopped
        router = {"stopped": False, "reason": exc.error}
        refused.append(f"the router: {exc.error} ({exc.fix})")
    for i, plan in enumerate(dep.engines):
        try:
            stopped.append(serve_stop.stop(plan))
        except ScriptError as exc:
            refused.append(f"engine {i}: {exc.error} ({exc.fix})")
            stopped.append({"stopped": False, "reason": exc.error})
    if refused:
        raise ScriptError("; ".join(refused), "do what each says, then stop again", router=router, engines=stopped)
    running = router_running(dep.router, any)
    return {"kind": dep.kind, "router": router, "engines": stopped, "stopped": True, "running": running}


def act(verb: str, path: str, epyc: dict, confirm: bool = False, pull: str = "missing", timeout: float = 0) -> dict:
    """launch.py start, verify, handoff or stop on any plan file: a refusal from below names the verb."""
    try:
        dep = open_deployment(path, verb, epyc)
        if verb == "start":
            return start(dep, epyc, confirm, pull)
        if verb == "verify":
            return verify(dep, epyc, timeout)
        return handoff(dep) if verb == "handoff" else stop(dep)
    except ScriptError as exc:
        exc.extra.setdefault("phase", verb)
        raise


# ---------------------------------------------------------------- around the verbs


def refuse_to_plan_over(folder: Path) -> None:
    """A plan written over a running fleet's or front's would leave its router and engines named by nothing."""
    path = folder / "plan.json"
    doc = read_if_plan(str(path)) or {}
    if {"fleet_version", "front_version"} & doc.keys():  # what it runs is unknown here
        planfile.refuse_older(doc, str(path))
    try:
        engines = len(doc["engines"]) if doc.get("kind") == "fleet" else 0
        router = doc["router"] if doc.get("kind") in ("fleet", "front") else None
    except (KeyError, TypeError):
        return
    states = [read_state({"state_file": str(folder / f"engine-{i}" / "state.json")}) for i in range(engines)]
    alive = isinstance(router, dict) and router_running(router, any)  # nginx alone, its router gone, still runs
    if alive or any(serve_procs.state_server(s) for s in states if s):
        raise ScriptError(
            f"{folder} holds a running {doc['kind']}: a new plan there would leave it named by nothing",
            f"{stop_command(path)} first, or plan with another --run",
        )


def with_service(plan: dict, doc: dict) -> dict:
    """The host path's handoff with the systemd unit that keeps the server up (one not written: said)."""
    if plan["path"] != "host":
        return doc
    try:
        return {**doc, "service": keep_service(plan)}
    except ScriptError as exc:
        return {**doc, "guidance": [*doc["guidance"], f"no systemd unit: {exc.error} ({exc.fix})"]}


def keep_service(plan: dict) -> dict:
    """The host server as a systemd unit beside its state, and how to install it."""
    import pwd

    # what start passes on from its shell, less what systemd gives a service itself and a URL with a password
    inherited = inherited_env(dict(os.environ))
    inherited = {k: v for k, v in inherited.items() if k not in SYSTEMD_GIVES and not masking.URL_CREDENTIALS.search(v)}
    program = subproc.find_program(plan["argv"][0]) or plan["argv"][0]
    svc = systemd_unit(plan, pwd.getpwuid(os.getuid()).pw_name, program, inherited)
    unit_file = Path(plan["state_dir"]) / "server.service"
    write_own_file(unit_file, svc["unit"])
    write_own_file(Path(svc["env_file"]), svc["env"])
    secrets = list(plan["env_by_name"])
    first = f"first write {', '.join(n + '=...' for n in secrets)} into {svc['secrets_file']} (mode 0600): "
    then = "systemd restarts it on failure and starts it at boot; stop it with sudo systemctl disable --now "
    return {
        "unit_file": str(unit_file),
        "env_file": svc["env_file"],
        "secrets_file": svc["secrets_file"] if secrets else None,
        "install": [
            plan["stop_command"],  # this server first: the unit's takes the same port
            f"sudo install -m 0644 {shlex.quote(str(unit_file))} /etc/systemd/system/{svc['name']}",
            f"sudo systemctl daemon-reload && sudo systemctl enable --now {svc['name']}",
        ],
        "note": (first if secrets else "") + then + svc["name"],
    }


def read_fleet(fleet: dict, path: str, verb: str, epyc: dict) -> list[dict]:
    """The fleet's engines, each read as every verb reads a plan (refused if edited; start renders them after
    its --confirm), the router's command refused unless it is what those engines render."""
    folder = Path(os.path.abspath(path)).parent
    own = [str(folder / f"engine-{i}" / "plan.json") for i in range(len(fleet.get("engines") or []))]
    if fleet.get("engines") != own or len(own) < 2 or not isinstance(fleet.get("router"), dict):
        raise ScriptError(
            f"{path} is not a fleet this bundle planned in {folder} (its engines are {folder}/engine-N/plan.json)",
            "plan the fleet again (launch.py plan --engines)",
        )
    engines = [planfile.load_plan(p) if verb == "start" else planfile.read_plan(p, verb, epyc) for p in own]
    val = engines[0]["inputs"]["validate"]
    if any(e["state_dir"] != str(state_folder(folder, val) / f"engine-{i}") for i, e in enumerate(engines)):
        raise ScriptError(f"{path}: an engine's plan names another state dir", "plan the fleet again")
    r = fleet["router"]
    try:
        there, tls = Path(r["state_dir"]).parent, r.get("terminator", {}).get("tls")  # the pair, re-rendered for nginx
        want = router_plan(engine_urls(engines), r["port"], there, epyc, r.get("expose") is True, tls, val.get("home"))
    except (KeyError, TypeError):
        want = None
    if r != want:
        raise ScriptError(f"{path}: the router's command differs from what its engines render", "plan the fleet again")
    if want["expose"] and not all(e.get("api_key_env") for e in engines):
        raise ScriptError(f"{path}: an exposed router in front of an engine without a key", "plan the fleet again")
    # what verify sends through the router (the key's variable, the name) is its engines', never the file's own
    rendered = {"api_key_env": engines[0]["api_key_env"], "served_model_name": engines[0]["served_model_name"]}
    if {k: fleet.get(k) for k in (*rendered, "base_url")} != {**rendered, "base_url": r["base_url"]}:
        raise ScriptError(
            f"{path}: its key, model name or URL differs from what its engines render", "plan the fleet again"
        )
    return engines
