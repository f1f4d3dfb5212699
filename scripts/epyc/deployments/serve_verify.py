"""Verifying a started server: alive, healthy, the model listed, one real request."""

from __future__ import annotations

import json
import math
import os
import threading
import time

from epyc import errors, masking
from epyc.decisions.handoff import judge_smoke, smoke_request
from epyc.deployments import serve_procs, serve_state
from epyc.errors import ScriptError

MODELS_SHOWN = 20
HTTP_BODY_LIMIT = 1 << 20
ALIVE_ASKS = 3
VERIFY_LOCK_WAIT_S = 15.0
RUN_KEYS = ("path", "pid", "pgid", "create_time", "marker", "container_id", "started_at")
REPAIR_FIX = (
    "read log_tail for why it died, then start it again: python3 scripts/launch.py start --plan <plan.json> "
    "--confirm (on a fleet's plan that restarts only the failed engines, while the router serves)"
)


def http(
    method: str, url: str, timeout: float, headers: dict | None = None, body: dict | None = None, tls=None
) -> tuple[int | None, str]:
    """(status, text) or (None, reason) within `timeout` for the whole exchange (a daemon thread we stop awaiting)."""
    import requests

    url, box = url.replace("http://", "https://", 1) if tls else url, {}  # a TLS server: https on any address
    deadline_missed = f"no complete answer within {timeout:g}s"

    def exchange() -> None:
        try:
            session = requests.Session()
            # never through the shell's proxy (it would see the key), with ~/.netrc credentials, or to a redirect
            session.trust_env = False
            if tls:  # a plan's pair: its CA, and the name it serves on whatever address is dialled
                session.verify = tls["ca"] or True
                session.get_adapter("https://").poolmanager.connection_pool_kw["server_hostname"] = tls["name"]
            with session.request(
                method, url, json=body, headers=headers or {}, timeout=timeout, stream=True, allow_redirects=False
            ) as r:
                data = bytearray()
                for chunk in r.iter_content(65536):
                    data += chunk
                    if len(data) > HTTP_BODY_LIMIT:
                        box["result"] = (None, f"the answer is over {HTTP_BODY_LIMIT:,} bytes")
                        return
                box["result"] = (r.status_code, data.decode(r.encoding or "utf-8", errors="replace"))
        except Exception as exc:  # noqa: BLE001 -- a thread's exception would print a traceback; it is the answer here
            from urllib3.exceptions import ReadTimeoutError

            # requests' per-read timeout (while streaming, wrapped in a ConnectionError) can beat the join: one wording
            wrapped = exc.args[0] if isinstance(exc, requests.ConnectionError) and exc.args else None
            late = isinstance(exc, requests.Timeout) or isinstance(wrapped, ReadTimeoutError)
            box["result"] = (None, deadline_missed if late else f"{type(exc).__name__}: {exc}")

    worker = threading.Thread(target=exchange, daemon=True)
    worker.start()
    worker.join(timeout)
    return box.get("result", (None, deadline_missed))


def failed(
    plan: dict, phase: str, reason: str, t0: float, fix: str = serve_state.NO_RETRY_FIX, state: dict | None = None
) -> ScriptError:
    """A verify failure, its reason masked like any server text; `state`: the run judged, whose log is shown."""
    reason = masking.redact(reason, serve_state.known_secrets(plan), limit=2000)
    said = {"ok": False, "phase": phase, "elapsed_s": round(time.monotonic() - t0, 1)}
    return ScriptError(
        f"FAILED in phase {phase}: {reason}", fix, **said, log_tail=serve_procs.log_tail(plan, state=state)
    )


def time_since_start(state: dict) -> float | None:
    """Seconds from the server's launch (the state's wall clock) to now, never negative; None without a time."""
    started = state.get("started_at")
    if isinstance(started, bool) or not isinstance(started, (int, float)) or not math.isfinite(started):
        return None
    return round(max(0.0, time.time() - started), 1)


def no_state_said(plan: dict) -> str:
    """Why own_state found nothing, in words: no state file, one no start wrote, or another plan's ended run."""
    state = serve_state.read_state(plan)
    if other := serve_procs.foreign_state(plan, state) if state else None:
        return f"the state there is of another plan's ended run: {other}"
    return "its state.json names no server a start recorded" if os.path.lexists(plan["state_file"]) else "no state file"


def rewrite_state_of_run(plan: dict, judged: dict, new: dict, t0: float) -> None:
    """verify's write of the state, under start's .lock, only while state.json records the run it judged."""

    def busy() -> ScriptError:
        why = f"a start or stop held the state dir for {VERIFY_LOCK_WAIT_S:g}s as verify went to record its verdict"
        fix = "run verify again once that start or stop is done"
        return failed(plan, "process", f"{why}: the server it judged may be going", t0, fix=fix, state=judged)

    with serve_state.holding_the_start_lock(plan, busy=busy, wait_s=VERIFY_LOCK_WAIT_S):
        now = serve_state.read_state(plan)
        if now is None or any(now.get(k) != judged.get(k) for k in RUN_KEYS):  # another launch, or none
            why = "the server was stopped or started again while verify ran: this verdict is of a run state.json no longer records"
            fix = "run verify again: it judges the server the state dir records now"
            raise failed(plan, "process", why, t0, fix=fix, state=judged)
        serve_state.write_state(plan, new)


def died(plan: dict, state: dict, t0: float) -> ScriptError:
    """The server is gone: a start that never became healthy, or a death while serving (their fixes differ)."""
    seen = state.get("healthy_at")
    if not isinstance(seen, (int, float)) or isinstance(seen, bool):
        return failed(plan, "process", "the server process exited before it became healthy", t0)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seen))
    ago = f"last seen healthy at {when}, {max(0.0, time.time() - seen):.0f}s ago"
    why = f"the server died after it had been healthy ({ago}): a crash while serving, not a failed start"
    return failed(plan, "process", why, t0, fix=REPAIR_FIX, state=state)


def wait_healthy(plan: dict, state: dict, base: str, headers: dict, timeout: float, t0: float) -> tuple[float, bool]:
    """Poll /health until 200 while the server lives. -> (seconds since start, healthy at the first poll)."""
    last_note, polls = 0.0, 0
    while True:
        elapsed = time.monotonic() - t0
        # None (the runtime did not answer this poll): asked again on the next
        if serve_procs.alive(plan, state) is False:
            raise died(plan, state, t0)
        # a container that exits is restarted by its policy: before it was ever healthy that is a failed start
        if "healthy_at" not in state and (n := serve_procs.restarted(plan, state)):
            raise failed(plan, "process", f"the server exited before it became healthy (restarted {n} times)", t0)
        status, _ = http("GET", base + "/health", 5, headers, tls=plan.get("tls"))
        if status == 200:
            return time_since_start(state), polls == 0
        polls += 1
        if elapsed > timeout:
            raise failed(plan, "health", f"not healthy after {timeout:g}s (last: {status or 'no answer'})", t0)
        if elapsed - last_note >= 10:
            errors.log(f"verify: health: waiting ({elapsed:.0f}s elapsed, last {status or 'no answer'})")
            last_note = elapsed
        time.sleep(2)


def listed_models(plan: dict, base: str, headers: dict, t0: float) -> list[str]:
    """/v1/models lists the served name; with a key planned, only to a request that carries it."""
    status, text = http("GET", base + "/v1/models", 30, headers, tls=plan.get("tls"))
    try:
        ids = [m["id"] for m in json.loads(text)["data"]] if status == 200 else []
    except (ValueError, KeyError, TypeError, RecursionError):
        ids = []
    # what the server lists is its text: masked like any
    secrets = serve_state.known_secrets(plan)
    ids = [m if m == plan["served_model_name"] else masking.redact(str(m), secrets, 200) for m in ids]
    key_env = plan.get("api_key_env")
    if status in (401, 403) and key_env:  # the server's key is not the one in this shell
        why = f"/v1/models with the key in ${key_env} answered HTTP {status}: the server was started with another key"
        fix = (
            f"set {key_env} to the key the server was started with, then run verify again (or stop it and start "
            "it with this key): the server itself may be fine"
        )
        raise failed(plan, "auth", why, t0, fix=fix)
    if plan["served_model_name"] not in ids:
        why = f"/v1/models does not list {plan['served_model_name']!r} (HTTP {status}, ids {ids})"
        raise failed(plan, "models", why, t0)
    if key_env:  # a key was planned: a request without it must be refused
        status, _ = http("GET", base + "/v1/models", 30, tls=plan.get("tls"))
        if status != 401:
            why = f"/v1/models without the API key answered HTTP {status}, not 401: the server does not enforce its key"
            raise failed(plan, "auth", why, t0)
    return ids


def smoke(plan: dict, base: str, headers: dict, smoke_timeout: float, t0: float) -> tuple[str, str, str, float]:
    """One real request, settling an unknown endpoint (chat first). -> (endpoint, path, answer text, seconds)."""
    tried, secrets, unknown = [], serve_state.known_secrets(plan), plan["primary_endpoint"] == "unknown"
    for endpoint in ("chat_completions", "completions") if unknown else (plan["primary_endpoint"],):
        path, body = smoke_request(endpoint, plan["served_model_name"])
        s0 = time.monotonic()
        status, text = http("POST", base + path, smoke_timeout, headers, body, tls=plan.get("tls"))
        smoke_s = round(time.monotonic() - s0, 2)
        ok, detail = judge_smoke(status, text, endpoint, secrets) if status else (False, masking.redact(text, secrets))
        tried.append(f"{path}: {detail}")
        if ok:
            if unknown:
                errors.log(f"verify: the endpoint is {path} ({'; '.join(tried[:-1]) or 'first try'})")
            return endpoint, path, detail, smoke_s
    raise failed(plan, "smoke", "; ".join(tried), t0)


def still_alive(plan: dict, state: dict, base: str, headers: dict, t0: float) -> None:
    """A pass needs the runtime's yes and a healthy answer after the request (a port answering proves nothing)."""
    for _ in range(ALIVE_ASKS):
        time.sleep(1)
        running = serve_procs.alive(plan, state)
        if running is not None:
            break
    if running is None:
        why = f"{plan['runtime']} did not say whether the container runs (inspect failed {ALIVE_ASKS} times)"
        fix = f"check the runtime ({plan['runtime']} info), then run verify again: the server may be fine"
        raise failed(plan, "process", f"{why}: verify passes only a server it saw running", t0, fix=fix, state=state)
    if not running or http("GET", base + "/health", 5, headers, tls=plan.get("tls"))[0] != 200:
        raise failed(plan, "smoke", "the server died after its first request", t0)


def verify(plan: dict, timeout: float, smoke_timeout: float) -> dict:
    """Alive, healthy, the model listed, one real request answered, still alive: each failure names its phase."""
    state = serve_procs.own_state(plan, "verify")
    t0 = time.monotonic()
    if state is None:
        raise failed(plan, "process", f"nothing was started from this plan ({no_state_said(plan)})", t0)
    serve_state.require_api_key(plan, "verify")
    if "verified_at" in state:  # an earlier pass says nothing once this verify runs: handoff waits for its verdict
        state = {k: v for k, v in state.items() if k != "verified_at"}
        rewrite_state_of_run(plan, state, state, t0)
    base, headers = f"http://127.0.0.1:{plan['port']}", serve_state.auth_headers(plan)
    healthy_after, first_poll = wait_healthy(plan, state, base, headers, timeout, t0)
    # the shared memory the healthy engine maps before any request (an earlier verify's kept): stop frees it once dead
    state = {**state, "shm_segments": serve_procs.segments_mapped(plan, state), "healthy_at": time.time()}
    rewrite_state_of_run(plan, state, state, t0)
    already = " (already, at the first poll)" if first_poll else ""
    errors.log(f"verify: healthy {healthy_after}s after start{already}")
    ids = listed_models(plan, base, headers, t0)
    endpoint, path, detail, smoke_s = smoke(plan, base, headers, smoke_timeout, t0)
    still_alive(plan, state, base, headers, t0)
    # handoff and bench read what verify settled and that it passed, on this run of the server
    passed = {**state, "primary_endpoint": endpoint, "verified_at": time.time()}
    rewrite_state_of_run(plan, state, passed, t0)
    # a server may list thousands of ids (one listed 40,001): the served one and a few beside it say enough
    shown = [plan["served_model_name"], *[m for m in ids if m != plan["served_model_name"]][: MODELS_SHOWN - 1]]
    return {
        "ok": True,
        "phase": "done",
        "served_model_name": plan["served_model_name"],
        "models": shown,
        "models_listed": len(ids),
        "time_to_healthy_s": healthy_after,
        "healthy_at_first_poll": first_poll,
        "primary_endpoint": endpoint,
        "smoke": {"endpoint_path": path, "output": detail, "seconds": smoke_s},
        "base_url": plan["base_url"],
    }


def verified_state(plan: dict) -> dict:
    """The state of this plan's server, running, passed its last verify and healthy now: what is handed off."""
    state = serve_procs.own_state(plan, "handoff")
    if state is None:
        raise ScriptError(
            f"no server from this plan is running ({no_state_said(plan)}: not started yet, or stopped)",
            "python3 scripts/launch.py start --plan <plan.json> --confirm, then verify",
        )
    running = serve_procs.alive(plan, state)
    if running is None:
        raise serve_procs.runtime_silent(plan, "handoff", "nothing is handed off")
    if not running:
        raise ScriptError(
            "the server from this plan is not running (it exited)",
            "read its log (the plan's log_file), start it again (launch.py start), then verify",
        )
    passed = state.get("verified_at")
    # verify writes a time: `true`, a negative number or one past this moment is not one it wrote
    if isinstance(passed, bool) or not isinstance(passed, (int, float)) or not 0 < passed <= time.time() + 60:
        fix = "python3 scripts/launch.py verify --plan <plan.json>; hand off after it passes"
        raise ScriptError("the server from this plan has not passed verify (not run yet, running, or failed)", fix)
    # its engine can die after the pass; asked without the key, which a wrong one here must not read as a server down
    status, text = http("GET", f"http://127.0.0.1:{plan['port']}/health", 5, tls=plan.get("tls"))
    if status != 200:
        said = f"HTTP {status}" if status else masking.redact(text, serve_state.known_secrets(plan), 200)
        raise ScriptError(
            f"the server from this plan passed verify but is not healthy now (/health: {said})",
            "read its log (the plan's log_file); stop it, start it again, then verify",
        )
    return state
