"""A fleet: one engine per socket (or per share of one socket) behind vllm-router, run as one endpoint."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from pathlib import Path

from epyc import errors, jsonio, subproc
from epyc.decisions import forecast, planner, sizing
from epyc.decisions.command import router_binary, router_plan
from epyc.decisions.handoff import markdown_table, tls_cell
from epyc.decisions.kv_budget import need_of
from epyc.deployments import runs
from epyc.deployments.serve_state import write_own_file
from epyc.errors import ScriptError
from epyc.facts import hubcache, remote_host
from epyc.facts.shell import shell_facts


def install_router(epyc: dict) -> dict:
    """The pinned vllm-router in a venv of its own under the cache (a Rust binary from PyPI), once."""
    binary = router_binary(epyc)
    venv = binary.parent.parent
    actions = []
    if not binary.exists():
        for argv, timeout in (
            ([sys.executable, "-m", "venv", str(venv)], 120),
            ([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", epyc["router"]["pip"]], 900),
        ):
            errors.log(f"fleet: {shlex.join(argv)}")
            res = subproc.run(argv, timeout=timeout, stderr_through=True, env=subproc.no_python_settings())
            if res.returncode != 0:
                raise ScriptError(
                    f"installing {epyc['router']['pip']} failed ({res.failure or res.returncode})",
                    "check pip's output above and the package index, then run the fleet plan again",
                )
        actions.append(f"installed {epyc['router']['pip']} into {venv}")
    return {"router": str(binary), "actions": actions}


def engine_tunes(facts, epyc: dict, busy: dict | None, base: sizing.SizingRequest, engines: str) -> list[dict]:
    """cpu_tune's document for each engine: `per-socket` (one engine on each socket this process may use), or
    N engines sharing one socket, each with its slice of the cores and of the memory."""
    topo, allowed = facts.topology, set(facts.allowed_cpus)
    if engines in ("per-socket", "per-node"):
        sockets = [s for s in topo.sockets if any(c in allowed for c in topo.socket_cpus(s))]
        ways = {s: len(topo.socket_nodes(s)) if engines == "per-node" else 1 for s in sockets}
        if sum(ways.values()) < 2:
            raise ScriptError(
                f"{engines}: this host has {len(sockets)} usable socket(s) of {max(ways.values(), default=0)} "
                "node(s) each, so one engine",
                "serve it with launch.py plan, or pass --engines N to split the socket's cores",
            )
        return [
            sizing.tune(facts, epyc, busy, dataclasses.replace(base, socket=s, part=(i, n) if n > 1 else None))
            for s, n in ways.items()
            for i in range(n)
        ]
    n = int(engines)
    first = sizing.tune(facts, epyc, busy, dataclasses.replace(base, part=(0, n)))
    on = dataclasses.replace(base, socket=first["chosen_socket"])
    return [first] + [sizing.tune(facts, epyc, busy, dataclasses.replace(on, part=(i, n))) for i in range(1, n)]


def engine_urls(engines: list[dict]) -> list[str]:
    return [f"http://127.0.0.1:{e['port']}" for e in engines]


ENGINE_ROWS = (
    *("CPU sizing", "Hardware", "Port", "Pinning", "Environment", "Command (exactly what start runs)"),
    *("Planned for", "Warning", "Forecast"),
)


def fleet_warnings(engines: list[dict]) -> list[list[str]]:
    """Every engine's warnings, each once: one that only some engines have names them."""
    said: dict[str, list[int]] = {}
    for i, e in enumerate(engines):
        for w in e["warnings"]:
            said.setdefault(w["message"], []).append(i)
    return [
        ["Warning", m if len(ix) == len(engines) else f"engine {', '.join(map(str, ix))}: {m}"]
        for m, ix in said.items()
    ]


def state_folder(folder: Path, val: dict) -> Path:
    """The fleet's state: its run folder, or another host's default one (its one line runs the chain without --run)."""
    return hubcache.state_root(val["home"]) / runs.DEFAULT if val.get("home") else folder


def plan_fleet(inputs: dict, opts: dict, epyc: dict, facts_host: dict, tunes: list[dict], folder: Path) -> dict:
    """Each engine an ordinary plan (its own socket or share, port, state dir) plus the router in front."""
    expose = bool(opts.get("expose"))
    planner.refuse_unkeyed_exposure(expose, opts.get("api_key_env"), facts_host)  # the engines are planned unexposed
    tls = planner.checked_tls(expose, opts, facts_host, epyc)  # served by nginx in front of the router
    port, there = opts.get("port") or inputs["validate"]["port"], state_folder(folder, inputs["validate"])
    measured = {k: v for k, v in inputs["cpu_tune"].items() if k == "measured"}  # its cores, scaled to each engine's
    engines = []
    for i, tune in enumerate(tunes):  # the engines stay on 127.0.0.1: only the router is exposed
        opt = {**opts, "expose": False, "port": port + 1 + i, "state_dir": str(there / f"engine-{i}")}
        opt.update(dict.fromkeys(planner.TLS_OPTIONS))  # plain HTTP on 127.0.0.1: nginx serves the pair
        engines.append(
            planner.build_plan({**inputs, "cpu_tune": {**tune, **measured}}, opt, epyc, {**facts_host, "tls": None})
        )
    router = router_plan(engine_urls(engines), port, there, epyc, expose, tls, inputs["validate"].get("home"))
    rows = [
        [
            f"engine {i}",
            f"{e['sizing']['vllm_cpu_omp_threads_bind']} on socket {e['sizing']['socket']}, "
            f"KV {e['sizing']['kv_granted_gb']} GiB, port {e['port']}: `{e['command']}`",
        ]
        for i, e in enumerate(engines)
    ]
    on = f"all interfaces (every engine checks the key in ${opts['api_key_env']})" if expose else "127.0.0.1"
    pip, policy = epyc["router"]["pip"], epyc["router"]["policy"]
    on = f"127.0.0.1:{router['argv'][4]}, behind nginx on all interfaces" if tls else on  # the block's last port
    nginx = f"; nginx on port {port}: `{router['terminator']['command']}`" if tls else ""
    rows += [["TLS", tls_cell(tls) + nginx]] if expose else []
    rows.append(["router", f"port {port} on {on}, {pip}, policy {policy}: `{router['command']}`"])
    ahead = forecast.plan_forecast({**inputs, "cpu_tune": {**tunes[0], **measured}}, epyc, len(engines)).to_json()
    planned_for = next((v for k, v in engines[0]["summary"] if k == "Planned for"), None)
    if planned_for:  # another host: what the engines assume, and the router to install there
        install = f"python3 scripts/setup_host_stack.py --router ({pip}; the router's path above is where it installs for this user)"
        rows.append(["Planned for", f"{planned_for}; there, first: {install}"])
    return {
        "schema_version": planner.PLAN_SCHEMA_VERSION,
        "kind": "fleet",
        "engines": [str(folder / f"engine-{i}" / "plan.json") for i in range(len(engines))],
        "router": router,
        "base_url": router["base_url"],
        "served_model_name": engines[0]["served_model_name"],
        "api_key_env": engines[0]["api_key_env"],
        "forecast": ahead,
        # the rows every engine shares; each engine's socket, cores, KV, port and command are in its own row
        "summary_markdown": markdown_table(
            ["Field", "Value"],
            [r for r in engines[0]["summary"] if r[0] not in ENGINE_ROWS]
            + [["Forecast", forecast.summary_text(ahead)]]
            + fleet_warnings(engines),
        )
        + "\n\n"
        + markdown_table(["Part", "What runs"], rows),
        "_engine_plans": engines,
    }


def plan_from_run(inputs: dict, opts: dict, epyc: dict, folder: Path, engines: str) -> dict:
    """launch.py plan --engines: the host detect read, read again and sized per engine; the router pinned."""
    if not inputs["validate"].get("deferred") and not router_binary(epyc).exists():  # another host's: there
        raise ScriptError(
            f"a fleet needs vllm-router ({epyc['router']['pip']}), not installed",
            "run python3 scripts/setup_host_stack.py --router (a venv of its own under the cache), then plan again",
        )
    sysroot, host = runs.host_source(inputs["detect"])
    facts = remote_host.gather_from_args(sysroot, host)
    cfg, est, tune = epyc["cpu"], inputs["estimate_memory"], inputs["cpu_tune"]
    busy = None if sysroot or host else sizing.sample_busy(facts.topology, facts.allowed_cpus, cfg["sample_seconds"])
    # cpu_tune's own thresholds, as the user ran it for one engine
    base = sizing.SizingRequest(
        tune["busy_threshold"], cfg["default_reserved_cores"], tune["os_reserve_gb"], need_of(est)
    )
    tunes = engine_tunes(facts, epyc, busy, base, engines)
    for tune in tunes:
        jsonio.check_schema(
            tune, "cpu_tune", "an engine's sizing", "report it: the fleet sized a socket no schema allows"
        )
    if inputs["validate"].get("home"):  # another host's: every engine's plan names the fleet's one line there
        opts = {**opts, "on_host_command": planner.on_host_command(inputs, opts, engines)}
    fleet = plan_fleet(inputs, opts, epyc, shell_facts(opts, inputs), tunes, folder)
    for plan, file in zip(fleet.pop("_engine_plans"), fleet["engines"]):  # in its state dir here, where start keeps it
        Path(file).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_own_file(Path(file), json.dumps(plan, indent=2) + "\n")
    return fleet


def as_one_endpoint(fleet: dict, engines: list[dict]) -> dict:
    """Engine 0's plan as bench measures a fleet: the router's URL, every engine's bound CPUs."""
    first = engines[0]
    binds = ",".join(e["env"]["VLLM_CPU_OMP_THREADS_BIND"] for e in engines)
    # without engine 0's pin: the bandwidth is read on every engine's CPUs, not engine 0's memory node alone
    argv = first["argv"][next(i for i, a in enumerate(first["argv"]) if a.endswith("/vllm")) :]
    env = {**first["env"], "VLLM_CPU_OMP_THREADS_BIND": binds}
    return {**first, "argv": argv, "base_url": fleet["base_url"], "env": env, "engines_behind": len(engines)}


def engines_arg(text: str) -> str:
    """--engines: per-socket, per-node, or a count of engines to share one socket."""
    if text in ("per-socket", "per-node") or (text.isdigit() and 2 <= int(text) <= 64):
        return text
    raise argparse.ArgumentTypeError(f"{text[:40]!r}: per-socket, per-node, or a number of engines from 2 to 64")
