"""A fleet: one engine per socket (or per share of one socket) behind vllm-router, run as one endpoint."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from . import bundle, errors, hubcache, jsonio, remote_host, runs, subproc
from .errors import ScriptError
from .handoff import handoff_doc, markdown_table
from .kv_budget import need_of
from .planfile import host_facts, read_plan
from .planner import build_plan, refuse_unkeyed_exposure
from .serve_procs import alive, log_tail, state_server
from .serve_start import start
from .serve_state import auth_headers, make_own_folder, open_own_file, read_state, write_own_file
from .serve_stop import stop
from .serve_verify import http, verify
from .sizing import SizingRequest, sample_busy
from .sizing import tune as size_socket

FLEET_VERSION = 1


# ---------------------------------------------------------------- the router's install


def router_binary(epyc: dict) -> Path:
    return hubcache.cache_root() / "serving-llms-on-epyc" / epyc["router"]["venv"] / "bin" / "vllm-router"


def install_router(epyc: dict) -> dict:
    """The pinned vllm-router in a venv of its own under the cache (a Rust binary from PyPI), once."""
    binary = router_binary(epyc)
    venv = binary.parent.parent
    actions = []
    if not binary.exists():
        steps = [
            ([sys.executable, "-m", "venv", str(venv)], 120),
            ([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", epyc["router"]["pip"]], 900),
        ]
        for argv, timeout in steps:
            errors.log(f"fleet: {shlex.join(argv)}")
            res = subproc.run(argv, timeout=timeout, stderr_through=True, env=subproc.no_python_settings())
            if res.returncode != 0:
                raise ScriptError(
                    f"installing {epyc['router']['pip']} failed ({res.failure or res.returncode})",
                    "check pip's output above and the package index, then run the fleet plan again",
                )
        actions.append(f"installed {epyc['router']['pip']} into {venv}")
    return {"router": str(binary), "actions": actions}


# ---------------------------------------------------------------- sizing and the plan


def engine_tunes(facts, epyc: dict, busy: dict | None, base: SizingRequest, engines: str) -> list[dict]:
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
            size_socket(facts, epyc, busy, dataclasses.replace(base, socket=s, part=(i, n) if n > 1 else None))
            for s, n in ways.items()
            for i in range(n)
        ]
    n = int(engines)
    first = size_socket(facts, epyc, busy, dataclasses.replace(base, part=(0, n)))
    on = dataclasses.replace(base, socket=first["chosen_socket"])
    return [first] + [size_socket(facts, epyc, busy, dataclasses.replace(on, part=(i, n))) for i in range(1, n)]


def router_plan(urls: list[str], port: int, folder: Path, epyc: dict, expose: bool = False) -> dict:
    """The router's command: every engine's URL, the pinned policy, 127.0.0.1 on the fleet's port (all
    interfaces with --expose). It holds no key: it passes the client's Authorization header on, and each
    engine checks it (measured with vllm-router 0.1.17), so a keyed fleet keeps its key off every argv."""
    bind = "0.0.0.0" if expose else "127.0.0.1"
    argv = [str(router_binary(epyc)), "--host", bind, "--port", str(port), "--worker-urls", *urls]
    metrics = port + len(urls) + 1  # the port after the engines': the fleet's block, one per fleet
    # its workers' first check every 2 s, not 30: an engine healthy a second after the router's first look
    # (every vLLM start, a host's router started just before) would otherwise wait 30 s more
    # and a dead engine's circuit tried again after 10 s, not 60: a repaired engine gets requests again within
    # seconds of its start (measured: the 60 s default left it idle a minute after its repair)
    argv += ["--policy", epyc["router"]["policy"], "--worker-startup-check-interval", "2", "--log-level", "info"]
    argv += ["--cb-timeout-duration-secs", "10"]
    argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics)]
    return {
        "argv": argv,
        "command": shlex.join(argv),
        "port": port,
        "base_url": f"http://127.0.0.1:{port}/v1",
        "state_dir": str(folder / "router"),
        "expose": expose,
    }


def engine_urls(engines: list[dict]) -> list[str]:
    return [f"http://127.0.0.1:{e['port']}" for e in engines]


ENGINE_ROWS = (
    *("CPU sizing", "Hardware", "Port", "Pinning", "Environment", "Command (exactly what start runs)"),
    *("Planned for", "Warning"),
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


def plan_fleet(inputs: dict, opts: dict, epyc: dict, facts_host: dict, tunes: list[dict], folder: Path) -> dict:
    """Each engine an ordinary plan (its own socket or share, port, state dir) plus the router in front."""
    expose = bool(opts.get("expose"))
    refuse_unkeyed_exposure(expose, opts.get("api_key_env"), facts_host)  # the engines are planned unexposed
    port = opts.get("port") or inputs["validate"]["port"]
    engines = []
    for i, tune in enumerate(tunes):  # the engines stay on 127.0.0.1: only the router is exposed
        opt = {**opts, "expose": False, "port": port + 1 + i, "state_dir": str(folder / f"engine-{i}")}
        engines.append(build_plan({**inputs, "cpu_tune": tune}, opt, epyc, facts_host))
    router = router_plan(engine_urls(engines), port, folder, epyc, expose)
    rows = [
        [
            f"engine {i}",
            f"{e['sizing']['vllm_cpu_omp_threads_bind']} on socket {e['sizing']['socket']}, "
            f"KV {e['sizing']['kv_granted_gb']} GiB, port {e['port']}: `{e['command']}`",
        ]
        for i, e in enumerate(engines)
    ]
    rows.append(
        [
            "router",
            f"port {port} on {'all interfaces (every engine checks the key in $' + opts['api_key_env'] + ')' if expose else '127.0.0.1'}, "
            f"{epyc['router']['pip']}, policy {epyc['router']['policy']}: `{router['command']}`",
        ]
    )
    planned_for = next((v for k, v in engines[0]["summary"] if k == "Planned for"), None)
    if planned_for:  # another host: what the engines assume, and the router to install there
        rows.append(
            [
                "Planned for",
                f"{planned_for}; there, first: python3 scripts/setup_host_stack.py --router "
                f"({epyc['router']['pip']}; the router's path above is where it installs for this user)",
            ]
        )
    return {
        "fleet_version": FLEET_VERSION,
        "engines": [str(Path(e["state_dir"]) / "plan.json") for e in engines],
        "router": router,
        "base_url": router["base_url"],
        # the rows every engine shares; each engine's socket, cores, KV, port and command are in its own row
        "summary_markdown": markdown_table(
            ["Field", "Value"], [r for r in engines[0]["summary"] if r[0] not in ENGINE_ROWS] + fleet_warnings(engines)
        )
        + "\n\n"
        + markdown_table(["Part", "What runs"], rows),
        "_engine_plans": engines,
    }


def refuse_a_running_fleet(folder: Path) -> None:
    """A plan written over a running fleet's would leave its router and engines named by nothing: refused,
    with the stop that works (the fleet's own plan is the only record of its router)."""
    path = folder / "plan.json"
    if file_kind(str(path)) is None:
        return
    fleet = json.loads(path.read_text())
    engines = fleet.get("engines") if isinstance(fleet.get("engines"), list) else []
    states = [read_state({"state_file": str(folder / f"engine-{i}" / "state.json")}) for i in range(len(engines))]
    if router_alive(router_state(fleet)) or any(state_server(s) for s in states if s):
        stop_cmd = shlex.join(["python3", str(bundle.SCRIPTS / "launch.py"), "stop", "--plan", str(path)])
        raise ScriptError(
            f"{folder} holds a running fleet: a new plan there would leave it named by nothing",
            f"{stop_cmd} first, or plan with another --run",
        )


def write_fleet(fleet: dict, folder: Path) -> dict:
    """The engines' plans into their state dirs (where start keeps them), the fleet's into the run folder."""
    for plan in fleet.pop("_engine_plans"):
        Path(plan["state_dir"]).mkdir(parents=True, exist_ok=True, mode=0o700)
        write_own_file(Path(plan["state_dir"]) / "plan.json", json.dumps(plan, indent=2) + "\n")
    return fleet


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
    busy = None if sysroot or host else sample_busy(facts.topology, facts.allowed_cpus, cfg["sample_seconds"])
    # cpu_tune's own thresholds, as the user ran it for one engine
    base = SizingRequest(tune["busy_threshold"], cfg["default_reserved_cores"], tune["os_reserve_gb"], need_of(est))
    tunes = engine_tunes(facts, epyc, busy, base, engines)
    for tune in tunes:
        jsonio.check_schema(
            tune, "cpu_tune", "an engine's sizing", "report it: the fleet sized a socket no schema allows"
        )
    fleet = plan_fleet(inputs, opts, epyc, host_facts(opts, inputs), tunes, folder)
    return write_fleet(fleet, folder)


# ---------------------------------------------------------------- reading it back


def is_fleet(doc: object) -> bool:
    return isinstance(doc, dict) and "fleet_version" in doc


def read_fleet(path: str, verb: str, epyc: dict) -> tuple[dict, list[dict]]:
    """The fleet and its engines, each engine read as every verb reads a plan (refused if edited), and the
    router's command refused unless it is what those engines render."""
    fleet = jsonio.read_json_input(path, "plan")
    folder = Path(os.path.abspath(path)).parent
    own = [str(folder / f"engine-{i}" / "plan.json") for i in range(len(fleet.get("engines") or []))]
    if fleet.get("fleet_version") != FLEET_VERSION or fleet.get("engines") != own or len(own) < 2:
        raise ScriptError(
            f"{path} is not a fleet this bundle planned in {folder} (its engines are {folder}/engine-N/plan.json)",
            "plan the fleet again (launch.py plan --engines)",
        )
    engines = [read_plan(p, verb, epyc) for p in own]
    if any(e["state_dir"] != str(Path(p).parent) for e, p in zip(engines, own)):
        raise ScriptError(f"{path}: an engine's plan names another state dir", "plan the fleet again")
    folder = Path(fleet["router"]["state_dir"]).parent
    want = router_plan(
        engine_urls(engines), fleet["router"]["port"], folder, epyc, fleet["router"].get("expose") is True
    )
    if fleet["router"] != want:
        raise ScriptError(f"{path}: the router's command differs from what its engines render", "plan the fleet again")
    if want["expose"] and not all(e.get("api_key_env") for e in engines):
        raise ScriptError(f"{path}: an exposed router in front of an engine without a key", "plan the fleet again")
    return fleet, engines


# ---------------------------------------------------------------- the life cycle


def router_state(fleet: dict) -> dict | None:
    try:
        return json.loads((Path(fleet["router"]["state_dir"]) / "state.json").read_text())
    except (OSError, ValueError, KeyError, TypeError):  # none recorded, or a plan of no router at all
        return None


def engine_running(plan: dict) -> bool | None:
    """alive() of the server this engine's state records (False with no state)."""
    state = read_state(plan)
    return alive(plan, state) if state is not None else False


def repair_fleet(fleet: dict, engines: list[dict], running: list[bool | None]) -> dict:
    """A running fleet's start: each engine that does not serve (gone, or alive and not healthy) is stopped
    (what its death left is freed) and started again from its own plan, while the router serves from the
    others and sends to it again once its health check passes; a router that is gone is started again."""
    engines_out = []
    for plan, up in zip(engines, running):  # a runtime that did not say (None) counts as running
        if up is None or (up and http("GET", f"http://127.0.0.1:{plan['port']}/health", 5)[0] == 200):
            engines_out.append({"started": False, "running": True})
            continue
        stop(plan)
        engines_out.append(start(plan, confirm=True))
    state = router_state(fleet)
    router = state if router_alive(state) else start_router(fleet)
    return {"engines": engines_out, "router": router, "repaired": sum(e["started"] for e in engines_out)}


def start_fleet(fleet: dict, engines: list[dict]) -> dict:
    """Every engine, then the router (it waits for them itself); a failure stops what this start started. A
    fleet of which anything still runs is repaired in place (repair_fleet)."""
    running = [engine_running(e) for e in engines]
    if router_alive(router_state(fleet)) or any(r is not False for r in running):
        return repair_fleet(fleet, engines, running)
    started = []
    try:
        for plan in engines:
            started.append(start(plan, confirm=True))
        return {"engines": started, "router": start_router(fleet)}
    except BaseException as exc:  # an engine interrupted after its launch was recorded runs too: stop it
        launched = len(started) + int(isinstance(exc, ScriptError) and "pid" in exc.extra)
        for plan in engines[:launched]:
            with contextlib.suppress(ScriptError, OSError):
                stop(plan)
        raise


def start_router(fleet: dict) -> dict:
    r = fleet["router"]
    folder = Path(r["state_dir"])
    make_own_folder(folder, "plan the fleet with a folder of your own", "start")
    if router_alive(router_state(fleet)):
        raise ScriptError(f"the fleet's router ({folder}) is running", "stop the fleet first, then start it")
    if not Path(r["argv"][0]).exists():
        raise ScriptError(
            "vllm-router is not installed", "run python3 scripts/setup_host_stack.py --router, then start again"
        )
    log = os.fdopen(open_own_file(folder / "router.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab")
    with log:
        proc = subprocess.Popen(
            r["argv"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        )
    proc.returncode = 0  # detached on purpose: not ours to wait for (no ResourceWarning at exit)
    state = {"pid": proc.pid, "pgid": proc.pid, "argv": r["argv"], "started_at": time.time()}
    try:
        write_own_file(folder / "state.json", json.dumps(state) + "\n")
    except BaseException:  # a router no state names would outlive every stop
        subproc.kill_group(proc)
        raise
    return state


def router_alive(state: dict | None) -> bool:
    """The recorded router runs: its pid, in its own group, started when start said (it renames itself
    `vllm::router`, so its command line names nothing)."""
    import psutil  # (here: a script imports this module before it moves into the bundle's venv)

    if not state:
        return False
    try:
        proc = psutil.Process(state["pid"])
        started = abs(proc.create_time() - state["started_at"]) < 5
        return os.getpgid(state["pid"]) == state["pgid"] and started and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError, KeyError, TypeError):
        return False


def verify_fleet(fleet: dict, engines: list[dict], timeout: float, smoke_timeout: float) -> dict:
    """Each engine verified on its own port, then the router answering one request for them: a failed
    engine is named (degraded) and the router still has to answer from the others."""
    results, failed = [], []
    for i, plan in enumerate(engines):
        try:
            results.append(verify(plan, timeout, smoke_timeout))
        except ScriptError as exc:
            failed.append(
                {
                    "engine": i,
                    "port": plan["port"],
                    "error": exc.error,
                    "phase": exc.extra.get("phase"),
                    "log_tail": exc.extra.get("log_tail") or log_tail(plan),
                }
            )
    router = judge_router(fleet, engines[0], timeout if not failed else 30)
    doc = {"engines": results, "failed_engines": failed, "router": router, "base_url": fleet["base_url"]}
    if failed or not router["answered"]:
        which = ", ".join(f"engine {f['engine']} (port {f['port']}): {f['error']}" for f in failed)
        say = "the router answers from the others" if router["answered"] else f"the router: {router['why']}"
        raise ScriptError(
            f"{'degraded: ' + which + '; ' if failed else ''}{say}",
            "read each failed engine's log_tail, then python3 scripts/launch.py start --plan <the fleet's plan.json> "
            "--confirm: it restarts only what failed (an engine, or the router) while the rest serves",
            phase="verify",
            **doc,
        )
    return doc


def judge_router(fleet: dict, engine: dict, timeout: float) -> dict:
    """The router's health, then one chat through it (with the engines' key, when they have one), within
    timeout."""
    served, headers = engine["served_model_name"], auth_headers(engine)
    base = f"http://127.0.0.1:{fleet['router']['port']}"
    deadline = time.monotonic() + timeout
    why = "not started"
    while time.monotonic() < deadline:
        if not router_alive(router_state(fleet)):
            return {"answered": False, "why": "its process is gone (router.log in its state dir)"}
        status, text = http("GET", f"{base}/health", 5)
        if status == 200:
            body = {
                "model": served,
                "messages": [{"role": "user", "content": "Say OK."}],
                "max_tokens": 4,
                "temperature": 0,
            }
            left = max(5.0, deadline - time.monotonic())
            status, text = http("POST", f"{base}/v1/chat/completions", left, body=body, headers=headers)
            if status == 200 and '"choices"' in text:
                return {"answered": True, "why": None}
            if status in (401, 403):  # no wait makes a wrong key right
                name = engine.get("api_key_env")
                return {"answered": False, "why": f"HTTP {status}: the engines refused the key in ${name} (set it)"}
        why = f"HTTP {status}" if status else text
        time.sleep(1)
    return {"answered": False, "why": f"no answer within {timeout:g}s ({why})"}


def stop_fleet(fleet: dict, engines: list[dict]) -> dict:
    """The router first (no new request reaches a stopping engine), then every engine, each whatever the
    one before it said: one that cannot be stopped is named, the others are still stopped."""
    router = stop_router(fleet)
    stopped, refused = [], []
    for i, plan in enumerate(engines):
        try:
            stopped.append(stop(plan))
        except ScriptError as exc:
            refused.append(f"engine {i}: {exc.error} ({exc.fix})")
            stopped.append({"stopped": False, "reason": exc.error})
    if refused:
        raise ScriptError(
            "; ".join(refused), "do what each says, then stop the fleet again", router=router, engines=stopped
        )
    return {"router": router, "engines": stopped, "stopped": True}


def stop_router(fleet: dict) -> dict:
    """SIGTERM to the router's own group, SIGKILL after 10 s; its state removed after."""
    state = router_state(fleet)
    running = router_alive(state)
    for sig in (signal.SIGTERM, signal.SIGKILL) if running else ():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(state["pgid"], sig)
        deadline = time.monotonic() + 10
        while router_alive(state) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not router_alive(state):
            break
    (Path(fleet["router"]["state_dir"]) / "state.json").unlink(missing_ok=True)
    return {"stopped": True, "was_running": running}


def handoff_fleet(fleet: dict, engines: list[dict], plan_file: str) -> dict:
    """One engine's handoff, told as the fleet's: the router's URL and port, the fleet's stop command."""
    from .serve_verify import verified_state

    # engine 0's by-hand stop is not the fleet's: the fleet's own stop command stops every part
    doc = handoff_doc(engines[0], settled=verified_state(engines[0]).get("primary_endpoint"), by_hand=False)
    base, port = fleet["base_url"], fleet["router"]["port"]
    stop_cmd = shlex.join(["python3", str(bundle.SCRIPTS / "launch.py"), "stop", "--plan", os.path.abspath(plan_file)])
    swap = {engines[0]["base_url"]: base, engines[0]["stop_command"]: stop_cmd, f"/ {engines[0]['port']}": f"/ {port}"}
    for key in ("curl_example", "python_example", "table_markdown"):
        for old, new in swap.items():
            doc[key] = doc[key].replace(old, new)
    return {
        **doc,
        "base_url": base,
        "port": port,
        "stop_command": stop_cmd,
        "engines": [e["base_url"] for e in engines],
    }


def as_one_endpoint(fleet: dict, engines: list[dict]) -> dict:
    """Engine 0's plan as bench measures a fleet: the router's URL, every engine's bound CPUs."""
    first = engines[0]
    binds = ",".join(e["env"]["VLLM_CPU_OMP_THREADS_BIND"] for e in engines)
    # without engine 0's pin: the bandwidth is read on every engine's CPUs, not engine 0's memory node alone
    argv = first["argv"][next(i for i, a in enumerate(first["argv"]) if a.endswith("/vllm")) :]
    env = {**first["env"], "VLLM_CPU_OMP_THREADS_BIND": binds}
    return {**first, "argv": argv, "base_url": fleet["base_url"], "env": env}


def life_verb(a: argparse.Namespace, epyc: dict) -> dict:
    """launch.py start, verify, handoff or stop on a fleet's plan."""
    fleet, engines = read_fleet(a.plan, a.cmd, epyc)
    if a.cmd == "start":
        if not a.confirm:
            raise ScriptError("start needs --confirm: the human must approve the plan first", "show the summary first")
        return start_fleet(fleet, engines)
    if a.cmd == "verify":
        return verify_fleet(fleet, engines, a.timeout, epyc["serve"]["smoke_timeout_s"])
    if a.cmd == "handoff":
        return handoff_fleet(fleet, engines, a.plan)
    return stop_fleet(fleet, engines)


def file_kind(path: str) -> str | None:
    """ "fleet" or "front" for a regular file holding such a plan, else None (the plan reader then says what
    is wrong with it)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > jsonio.MAX_INPUT_BYTES:
            return None
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return "fleet" if is_fleet(doc) else "front" if isinstance(doc, dict) and "front_version" in doc else None


def engines_arg(text: str) -> str:
    """--engines: per-socket, or a count of engines to share one socket."""
    if text in ("per-socket", "per-node") or (text.isdigit() and 2 <= int(text) <= 64):
        return text
    raise argparse.ArgumentTypeError(f"{text[:40]!r}: per-socket, per-node, or a number of engines from 2 to 64")
