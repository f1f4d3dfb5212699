"""Several hosts as one endpoint: a front router over each host's exposed, keyed plan (a fleet or one engine)."""

from __future__ import annotations

import argparse
import os
import re
import shlex
from pathlib import Path

from . import bundle, jsonio, runs
from .errors import ScriptError
from .fleet import is_fleet, judge_router, router_alive, router_plan, router_state, start_router, stop_router
from .handoff import markdown_table

FRONT_VERSION = 1
ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}")


def host_arg(text: str) -> tuple[str, str]:
    """--hosts RUN=ADDRESS: the run folder that planned a host, and the address the front router reaches it at."""
    run, sep, address = text.partition("=")
    if not sep or not run or not ADDRESS.fullmatch(address):
        raise argparse.ArgumentTypeError(
            f"{text[:80]!r}: RUN=ADDRESS, the host's run folder and its host name or IPv4 address (box1=10.0.0.5)"
        )
    return run, address


def host_endpoint(run: str, address: str, key_env: str) -> dict:
    """What the front router needs of one host: its plan's port, exposed, keyed with the front's key."""
    path = runs.run_dir(run) / "plan.json"
    plan = jsonio.read_json_input(str(path), "plan")
    first = jsonio.read_json_input(plan["engines"][0], "plan") if is_fleet(plan) else plan
    exposed = plan["router"].get("expose") is True if is_fleet(plan) else plan.get("expose") is True
    if not exposed or first.get("api_key_env") != key_env:
        raise ScriptError(
            f"--hosts {run}: its plan ({path}) is not exposed with --api-key-env {key_env}: the front router "
            "reaches each host over the network, and only a keyed endpoint may listen there",
            f"plan it with: python3 scripts/launch.py plan --run {shlex.quote(run)} --engines per-socket "
            f"--expose --api-key-env {key_env}",
        )
    port = plan["router"]["port"] if is_fleet(plan) else plan["port"]
    engines = len(plan["engines"]) if is_fleet(plan) else 1
    return {
        "run": run,
        "address": address,
        "port": port,
        "url": f"http://{address}:{port}",
        "engines": engines,
        "served_model_name": first["served_model_name"],
        "plan_id": first.get("plan_id"),
    }


def plan_front(hosts: list[tuple[str, str]], opts: dict, epyc: dict, folder: Path) -> dict:
    """launch.py plan --hosts: one router on this machine in front of every host's endpoint."""
    key_env = opts.get("api_key_env")
    if len(hosts) < 2 or not key_env:
        raise ScriptError(
            "--hosts needs two hosts or more and --api-key-env (each host is reached over the network)",
            "pass --hosts RUN=ADDRESS RUN=ADDRESS --api-key-env NAME, each RUN planned with --expose and that key",
        )
    ends = [host_endpoint(run, address, key_env) for run, address in hosts]
    if len({e["served_model_name"] for e in ends}) > 1:
        raise ScriptError(
            "--hosts: the hosts serve different model names ("
            + ", ".join(sorted({e["served_model_name"] for e in ends}))
            + "): a router sends any request to any of them",
            "plan every host with the same model and --served-model-name",
        )
    port = opts.get("port") or epyc["serve"]["default_port"]
    router = router_plan([e["url"] for e in ends], port, folder, epyc, bool(opts.get("expose")))
    rows = [
        [
            f"{e['address']} ({e['run']})",
            f"{e['engines']} engine(s) behind port {e['port']}: open TCP {e['port']} to this machine only",
        ]
        for e in ends
    ]
    rows.append(["front router", f"port {port} here: `{router['command']}`"])
    return {
        "front_version": FRONT_VERSION,
        "hosts": ends,
        "api_key_env": key_env,
        "served_model_name": ends[0]["served_model_name"],
        "router": router,
        "base_url": router["base_url"],
        "summary_markdown": markdown_table(["Part", "What runs"], rows),
    }


def is_front(doc: object) -> bool:
    return isinstance(doc, dict) and "front_version" in doc


def read_front(path: str, epyc: dict) -> dict:
    """The front plan, refused unless its hosts' plans, read again, render the very router it names."""
    front = {k: v for k, v in jsonio.read_json_input(path, "plan").items() if k != "ok"}  # ok: the CLI's
    try:
        hosts = [(h["run"], h["address"]) for h in front["hosts"]]
        opts = {
            "api_key_env": front["api_key_env"],
            "port": front["router"]["port"],
            "expose": front["router"]["expose"],
        }
        folder = Path(front["router"]["state_dir"]).parent
    except (KeyError, TypeError):
        hosts = None
    if front.get("front_version") != FRONT_VERSION or not hosts or plan_front(hosts, opts, epyc, folder) != front:
        raise ScriptError(
            f"{path} is not what its hosts' plans render now (edited, or a host planned again since)",
            "plan the front again: python3 scripts/launch.py plan --hosts RUN=ADDRESS ... --api-key-env NAME",
        )
    return front


def life_verb(a: argparse.Namespace, epyc: dict) -> dict:
    """launch.py start, verify, handoff or stop on a front plan: the front router only; each host's own plan
    is started, verified and stopped on that host."""
    front = read_front(a.plan, epyc)
    if a.cmd == "start":
        if not a.confirm:
            raise ScriptError("start needs --confirm: the human must approve the plan first", "show the summary first")
        return {"router": start_router(front), "base_url": front["base_url"]}
    if a.cmd == "verify":
        router = judge_router(front, front, a.timeout)
        if not router["answered"]:
            raise ScriptError(
                f"the front router: {router['why']}",
                "verify each host's plan on that host (launch.py verify --run RUN there), then verify the front again",
                phase="verify",
                router=router,
            )
        return {"router": router, "base_url": front["base_url"], "hosts": [h["url"] for h in front["hosts"]]}
    stop_cmd = shlex.join(["python3", str(bundle.SCRIPTS / "launch.py"), "stop", "--plan", os.path.abspath(a.plan)])
    if a.cmd == "handoff":
        return {
            "base_url": front["base_url"],
            "port": front["router"]["port"],
            "served_model_name": front["served_model_name"],
            "api_key_env": front["api_key_env"],
            "hosts": [h["url"] for h in front["hosts"]],
            "router": front["router"],
            "stop_command": stop_cmd,
        }
    return {"router": stop_router(front), "stopped": True, "running": router_alive(router_state(front))}
