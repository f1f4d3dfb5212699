"""Several hosts as one endpoint: a front router over each host's exposed, keyed plan (a fleet or one engine)."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

from epyc import jsonio
from epyc.decisions.command import router_plan
from epyc.decisions.handoff import markdown_table, tls_cell
from epyc.decisions.planner import PLAN_SCHEMA_VERSION, checked_tls
from epyc.deployments import runs
from epyc.errors import ScriptError
from epyc.facts.shell import tls_facts

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
    fix = (
        f"plan it with: python3 scripts/launch.py plan --run {shlex.quote(run)} --expose --plain-http --api-key-env "
        f"{key_env} (--engines per-socket for a fleet)"
    )
    if not path.is_file():
        raise ScriptError(f"--hosts {run}: no plan in that run folder ({path})", fix)
    plan = jsonio.read_json_input(str(path), "plan")
    fleet = isinstance(plan, dict) and plan.get("kind") == "fleet"
    try:
        first = jsonio.read_json_input(plan["engines"][0], "plan") if fleet else plan
        exposed = (plan["router"] if fleet else plan).get("expose") is True
        port = plan["router"]["port"] if fleet else plan["port"]
        served, engines = first["served_model_name"], len(plan["engines"]) if fleet else 1
        exposed = exposed and not (plan["router"].get("terminator") if fleet else plan.get("tls"))  # no TLS client
    except (KeyError, TypeError, IndexError, AttributeError):  # a malformed plan: refused below as not exposed
        exposed, first = False, {}
    if not exposed or first.get("api_key_env") != key_env:
        raise ScriptError(
            f"--hosts {run}: its plan ({path}) is not exposed with --api-key-env {key_env} over plain HTTP: the front "
            "router (vllm-router 0.1.17, no TLS) reaches each host over the network, and only a keyed endpoint may listen there",
            fix,
        )
    url = f"http://{address}:{port}"
    return {"run": run, "address": address, "port": port, "url": url, "engines": engines, "served_model_name": served}


def plan_front(hosts: list[tuple[str, str]], opts: dict, epyc: dict, folder: Path) -> dict:
    """launch.py plan --hosts: one router on this machine in front of every host's endpoint."""
    key_env = opts.get("api_key_env")
    if len(hosts) < 2 or not key_env:
        raise ScriptError(
            "--hosts needs two hosts or more and --api-key-env (each host is reached over the network)",
            "pass --hosts RUN=ADDRESS RUN=ADDRESS --api-key-env NAME, each RUN planned with --expose and that key",
        )
    named = [runs.run_dir(run) for run, _ in hosts]
    if len(set(named)) < len(named) or runs.run_dir(str(folder)) in named:
        raise ScriptError(
            "--hosts: a run folder named twice, or the front's own --run among the hosts' (its plan.json "
            "would replace that host's)",
            "name each host's run folder once, and plan the front with a --run of its own (e.g. --run front)",
        )
    ends = [host_endpoint(run, address, key_env) for run, address in hosts]
    if len(names := sorted({e["served_model_name"] for e in ends})) > 1:
        raise ScriptError(
            f"--hosts: the hosts serve different model names ({', '.join(names)}): a router sends any request to any of them",
            "plan every host with the same model and --served-model-name",
        )
    port, expose = opts.get("port") or epyc["serve"]["default_port"], bool(opts.get("expose"))
    tls = checked_tls(expose, opts, {"tls": tls_facts(opts, "localhost")}, epyc)
    router = router_plan([e["url"] for e in ends], port, folder, epyc, expose, tls)
    hop = "plain HTTP with the key from here: only a network you trust protects that hop; open TCP {} to this machine only"
    rows = [
        [f"{e['address']} ({e['run']})", f"{e['engines']} engine(s) behind port {e['port']}: " + hop.format(e["port"])]
        for e in ends
    ]
    rows.append(["front router", f"port {port} here: `{router['command']}`"])
    nginx = f" (nginx: `{router['terminator']['command']}`)" if tls else ""
    rows += [["TLS", tls_cell(tls) + nginx]] if expose else []
    return {
        "schema_version": PLAN_SCHEMA_VERSION,
        "kind": "front",
        "hosts": ends,
        "api_key_env": key_env,
        "served_model_name": ends[0]["served_model_name"],
        "router": router,
        "base_url": router["base_url"],
        "summary_markdown": markdown_table(["Part", "What runs"], rows),
    }


def read_front(front: dict, path: str, epyc: dict, hosts_again: bool) -> dict:
    """The front plan, refused unless it names the router its own hosts' URLs render and, with `hosts_again`
    (start, verify), unless its hosts' plans, read again, render the very same front. stop and handoff check
    the file alone: a host planned again must never leave a front no verb can stop."""
    front = {k: v for k, v in front.items() if k != "ok"}  # ok: the CLI's
    try:
        hosts = [host_arg(f"{h['run']}={h['address']}") for h in front["hosts"]]
        r = front["router"]
        folder = Path(r["state_dir"]).parent
        pair = r.get("terminator", {}).get("tls")  # the options that render it again
        own = router_plan([h["url"] for h in front["hosts"]], r["port"], folder, epyc, r["expose"] is True, pair) == r
        opts = {"api_key_env": front["api_key_env"], "port": r["port"], "expose": r["expose"], "plain_http": not pair}
        opts.update({f"tls_{k}": v for k, v in (pair or {}).items()})
    except (KeyError, TypeError, AttributeError, argparse.ArgumentTypeError):
        own = False
    if not own:
        raise ScriptError(f"{path} is not a front plan this bundle wrote", "plan the front again (--hosts)")
    if hosts_again and plan_front(hosts, opts, epyc, folder) != front:
        raise ScriptError(
            f"{path} is not what its hosts' plans render now (a host planned again since)",
            "plan the front again: python3 scripts/launch.py plan --hosts RUN=ADDRESS ... --api-key-env NAME",
        )
    return front
