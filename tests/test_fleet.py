"""A fleet (epyc.deployments.fleet): engines behind the real vllm-router, through launch.py as a user runs it. The
engines are the fake OpenAI server (tests/fakes/openai_server.py) started by the plans' own argv; the real
vLLM fleet runs in tests/test_e2e.py."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from conftest import cert_pair, free_port, host_docs, load_while, run_script
from epyc.bundle import load_epyc
from epyc.deployments import fleet


@pytest.fixture(scope="session")
def router():
    r = run_script("setup_host_stack.py", "--router", timeout=900)
    assert r.code == 0 and r.doc["ready"], r.doc
    return r.doc["router"]


def run_with(tmp_path, docs: dict) -> str:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    for name, doc in docs.items():
        (run / f"{name}.json").write_text(json.dumps(doc))
    return str(run)


def chat(port: int) -> dict:
    from epyc.deployments.serve_verify import http

    body = {"model": "Qwen3-0.6B", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    status, text = http("POST", f"http://127.0.0.1:{port}/v1/chat/completions", 20, body=body)
    assert status == 200, text
    return json.loads(text)


def test_two_engines_behind_the_router_serve_as_one_and_stop_as_one(router, tmp_path, inputs, live_tune):
    """Plan 2 engines sharing this runner's socket, start, verify (each engine and the router), chat through
    the router, kill one engine: verify names it and the router still answers; start repairs it alone under
    load (no request fails) and verify passes again; stop leaves nothing."""
    run = run_with(tmp_path, host_docs(tmp_path, inputs, live_tune))
    port = free_port()
    p = run_script("launch.py", "plan", "--engines", "2", "--port", str(port), "--run", run)
    assert p.code == 0, p.doc
    engines = [json.loads(open(e).read()) for e in p.doc["engines"]]
    binds = [e["sizing"]["vllm_cpu_omp_threads_bind"] for e in engines]
    assert len(set(binds)) == 2 and [e["port"] for e in engines] == [port + 1, port + 2]
    assert p.doc["router"]["argv"][0] == router and "--worker-urls" in p.doc["router"]["argv"]
    assert "| engine 1 |" in p.doc["summary_markdown"] and "| router |" in p.doc["summary_markdown"]
    # the fleet's own forecast: its engines' rates summed, once in the summary (not once per engine)
    assert p.doc["forecast"]["shape"]["engines"] == 2 and p.doc["summary_markdown"].count("| Forecast |") == 1
    try:
        s = run_script("launch.py", "start", "--run", run, "--confirm")
        assert s.code == 0, s.doc
        pids = [s.doc["router"]["pid"]] + [e["pid"] for e in s.doc["engines"]]
        v = run_script("launch.py", "verify", "--run", run, "--timeout", "30")
        assert v.code == 0 and v.doc["router"]["answered"] and v.doc["failed_engines"] == [], v.doc
        for _ in range(4):
            chat(port)
        h = run_script("launch.py", "handoff", "--run", run)
        assert h.code == 0 and h.doc["base_url"] == f"http://127.0.0.1:{port}/v1", h.doc
        # the fleet's stop, not engine 0's; the router's port
        assert h.doc["stop_command"].endswith(f"stop --plan {run}/plan.json") and h.doc["port"] == port
        assert f"| Stop | {h.doc['stop_command']} |" in h.doc["table_markdown"]
        again = run_script("launch.py", "plan", "--run", run)  # over a running fleet: refused, its plan kept
        assert again.code == 1 and "holds a running fleet" in again.doc["error"], again.doc
        assert json.loads(open(os.path.join(run, "plan.json")).read())["kind"] == "fleet"
        state = json.loads(open(os.path.join(engines[1]["state_dir"], "state.json")).read())
        os.killpg(state["pgid"], signal.SIGKILL)  # an engine dies while the router serves
        v = run_script("launch.py", "verify", "--run", run, "--timeout", "10")
        assert v.code == 1 and "engine 1" in v.doc["error"] and "the router answers from the others" in v.doc["error"]
        assert [f["engine"] for f in v.doc["failed_engines"]] == [1]
        # a death after verify passed is said as one, and the fix is the repair, not a full outage
        assert "died after it had been healthy" in v.doc["failed_engines"][0]["error"]
        assert "restarts only what failed" in v.doc["fix"]
        chat(port)  # and it does

        # the repair: start on the running fleet restarts engine 1 alone while 8 clients send through the router,
        # until verify passes again; then the router sends to the repaired engine too (its new log says so)
        def repair_and_verify():
            repair = run_script("launch.py", "start", "--run", run, "--confirm")
            verified = run_script("launch.py", "verify", "--run", run, "--timeout", "30")
            for _ in range(60):  # the router's health check takes the engine back (every 5 s, 2 passes)
                if open(engines[1]["log_file"]).read().count("POST /v1/chat/completions") > 1:
                    break
                time.sleep(1)
            return repair, verified

        answered, (repair, v) = load_while(port, "Qwen3-0.6B", repair_and_verify)
        assert repair.code == 0 and repair.doc["repaired"] == 1 and repair.doc["engines"][0]["started"] is False
        assert answered and all(code == 200 for code in answered), answered
        pids += [repair.doc["engines"][1]["pid"]]
        assert v.code == 0 and v.doc["failed_engines"] == [], v.doc
        served = open(engines[1]["log_file"]).read().count("POST /v1/chat/completions")
        assert served > 1, served  # verify's own request, and the router's
        # the router gone too: start brings it back, and leaves the engines that serve alone
        os.killpg(json.loads(open(os.path.join(run, "router", "state.json")).read())["pgid"], signal.SIGKILL)
        again = run_script("launch.py", "start", "--run", run, "--confirm")
        assert again.code == 0 and again.doc["repaired"] == 0 and again.doc["router"]["pid"] not in pids, again.doc
        pids.append(again.doc["router"]["pid"])
        assert run_script("launch.py", "verify", "--run", run, "--timeout", "30").code == 0
    finally:
        st = run_script("launch.py", "stop", "--run", run)
    assert st.code == 0 and st.doc["router"]["stopped"], st.doc
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not any(os.path.exists(os.path.join(e["state_dir"], "state.json")) for e in engines)


def test_a_fleet_is_an_explicit_choice_and_refuses_what_it_cannot_do(router, tmp_path, inputs, live_tune):
    run = run_with(tmp_path, host_docs(tmp_path, inputs, live_tune))
    r = run_script("launch.py", "plan", "--engines", "per-socket", "--run", run)
    assert r.code == 1 and "1 usable socket(s)" in r.doc["error"] and "--engines N" in r.doc["fix"]
    r = run_script("launch.py", "plan", "--engines", "1", "--run", run)
    assert r.code == 1 and "from 2 to 64" in r.doc["error"]
    r = run_script("launch.py", "plan", "--engines", "64", "--run", run)
    assert r.code == 1 and "engines cannot share" in r.doc["error"]
    # a fleet whose engines are named elsewhere (another plan's server) is never acted on
    p = run_script("launch.py", "plan", "--engines", "2", "--run", run)
    assert p.code == 0, p.doc
    other = tmp_path / "elsewhere.json"
    other.write_text(json.dumps({**p.doc, "engines": [str(tmp_path / "x" / "plan.json")] * 2}))
    r = run_script("launch.py", "stop", "--plan", str(other))
    assert r.code == 1 and "is not a fleet this bundle planned" in r.doc["error"]
    # the key variable verify sends through the router is the engines' own: one edited in the fleet's file is refused
    fleet_file = Path(run) / "plan.json"
    fleet_file.write_text(json.dumps({**p.doc, "api_key_env": "AWS_SECRET_ACCESS_KEY"}))
    r = run_script("launch.py", "verify", "--plan", str(fleet_file))
    assert r.code == 1 and "differs from what its engines render" in r.doc["error"], r.doc


def test_an_exposed_fleet_is_keyed_at_every_engine_and_the_key_is_on_no_command_line(
    router, tmp_path, inputs, live_tune
):
    """--expose needs --api-key-env and TLS: nginx on all interfaces with the bundle-made pair, the router behind
    it and the engines on 127.0.0.1, each engine checking the key the client sends (the router passes the
    Authorization header on); https with the CA and the key answers, without either it does not; the pair's
    key and the API key are on no command line, in no plan and no log."""
    import socket
    import subprocess

    from epyc.deployments.serve_verify import http

    key = "sk-fleet-key-0123456789"
    env = {"FLEET_KEY": key}
    run = run_with(tmp_path, host_docs(tmp_path, inputs, live_tune))
    port = free_port()
    r = run_script("launch.py", "plan", "--engines", "2", "--expose", "--port", str(port), "--run", run, env=env)
    assert r.code == 1 and "--api-key-env" in r.doc["fix"], r.doc
    args = ["--engines", "2", "--expose", "--api-key-env", "FLEET_KEY", "--port", str(port), "--run", run]
    r = run_script("launch.py", "plan", *args, env=env)
    assert r.code == 1 and "needs TLS" in r.doc["error"] and "tls-selfsigned" in r.doc["fix"], r.doc
    pair = run_script("launch.py", "tls-selfsigned", "--out", str(tmp_path / "pair"))
    assert pair.code == 0 and pair.doc["made_with"] == "cryptography" and socket.gethostname() in pair.doc["names"]
    secret_lines = Path(pair.doc["key"]).read_text().splitlines()[1:-1]
    unexposed = [a for a in args if a not in ("--expose", "--api-key-env", "FLEET_KEY")]
    r = run_script("launch.py", "plan", *unexposed, "--tls-cert", pair.doc["cert"], "--tls-key", pair.doc["key"])
    assert r.code == 1 and "without --expose" in r.doc["error"], r.doc  # nginx on all interfaces, no key asked
    p = run_script("launch.py", "plan", *args, "--tls-cert", pair.doc["cert"], "--tls-key", pair.doc["key"], env=env)
    assert p.code == 0, p.doc
    argv, nginx = p.doc["router"]["argv"], p.doc["router"]["terminator"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert (
        nginx["port"] == port and nginx["tls"]["ca"] == pair.doc["cert"] and "behind nginx" in p.doc["summary_markdown"]
    )
    assert p.doc["base_url"] == f"https://{socket.gethostname()}:{port}/v1"
    engines = [json.loads(open(e).read()) for e in p.doc["engines"]]
    assert all("127.0.0.1" in e["argv"] and "0.0.0.0" not in e["argv"] and not e["tls"] for e in engines)
    body = {"model": "Qwen3-0.6B", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    tls = nginx["tls"]
    try:
        s = run_script("launch.py", "start", "--run", run, "--confirm", env=env)
        assert s.code == 0, s.doc
        pids = [s.doc["router"]["pid"], s.doc["router"]["terminator"]["pid"]] + [e["pid"] for e in s.doc["engines"]]
        cmdlines = " ".join(
            " ".join(pr.cmdline())
            for pid in pids
            for pr in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        )
        assert "nginx" in cmdlines and key not in cmdlines and not any(x in cmdlines for x in secret_lines)
        v = run_script("launch.py", "verify", "--run", run, "--timeout", "30", env=env)
        assert v.code == 0 and v.doc["router"]["answered"], v.doc
        url = f"https://127.0.0.1:{port}/v1/chat/completions"
        assert http("POST", url, 20, body=body, tls=tls)[0] == 401
        assert http("POST", url, 20, body=body, headers={"Authorization": "Bearer wrong-key"}, tls=tls)[0] == 401
        assert http("POST", url, 20, body=body, headers={"Authorization": f"Bearer {key}"}, tls=tls)[0] == 200
        no_ca = http("POST", url, 20, body=body, headers={"Authorization": f"Bearer {key}"}, tls={**tls, "ca": None})
        assert no_ca[0] is None and "CERTIFICATE_VERIFY_FAILED" in no_ca[1]
        h = run_script("launch.py", "handoff", "--run", run, env=env)
        assert h.code == 0 and f"--cacert {pair.doc['cert']}" in h.doc["curl_example"], h.doc
        assert "httpx.Client(verify=" in h.doc["python_example"]
        curl = ["bash", "-c", h.doc["curl_example"].replace(" \\\n", " ")]
        said = subprocess.run(curl, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
        assert said.returncode == 0 and '"choices"' in said.stdout, said
        curl[2] = curl[2].replace(f"--cacert {pair.doc['cert']} ", "")
        said = subprocess.run(curl, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
        assert said.returncode == 60, said  # curl: the peer's certificate cannot be verified
        # the router gone, nginx alive: the fleet still runs (no plan over it), start repairs it and reloads nginx
        nginx = psutil.Process(s.doc["router"]["terminator"]["pid"])
        workers = {c.pid for c in nginx.children()}
        os.killpg(s.doc["router"]["pid"], signal.SIGKILL)
        time.sleep(1)
        tls_args = ["--tls-cert", pair.doc["cert"], "--tls-key", pair.doc["key"]]
        again = run_script("launch.py", "plan", *args, *tls_args, env=env)
        assert again.code == 1 and "holds a running fleet" in again.doc["error"], again.doc
        again = run_script("launch.py", "start", "--run", run, "--confirm", env=env)
        assert again.code == 0 and again.doc["router"]["terminator"]["pid"] == nginx.pid, again.doc
        deadline = time.monotonic() + 10
        while workers & {c.pid for c in nginx.children()} and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not workers & {c.pid for c in nginx.children()}  # SIGHUP: new workers on the config and pair now
        os.killpg(again.doc["router"]["pid"], signal.SIGKILL)  # stop with nginx alone left: no nginx after it
    finally:
        st = run_script("launch.py", "stop", "--run", run, env=env)
    assert st.code == 0 and st.doc["router"]["was_running"] and st.doc["running"] is False, st.doc
    written = [Path(f).read_text(errors="replace") for f in Path(run).rglob("*") if f.is_file() and f.name != "key.pem"]
    assert written and not any(x in t for t in written for x in [key, *secret_lines])
    assert (
        not psutil.pid_exists(s.doc["router"]["terminator"]["pid"])
        or psutil.Process(s.doc["router"]["terminator"]["pid"]).status() == psutil.STATUS_ZOMBIE
    )
    # a pair replaced by an expired one since the plan: start refuses it before anything runs (one engine does too)
    cert_pair(tmp_path / "pair", names=(socket.gethostname(),), days=(-10, -1))
    r = run_script("launch.py", "start", "--run", run, "--confirm", env=env)
    assert r.code == 1 and "expired on" in r.doc["error"] and "renew it" in r.doc["fix"], r.doc


def test_a_front_router_serves_several_hosts_fleets_as_one_endpoint(router, tmp_path, inputs, live_tune):
    """Two hosts, each an exposed keyed fleet planned in its own run folder (here both on this machine, at
    127.0.0.1), and one front router over them: planned from the hosts' plans, started, verified, chatting
    with the key only, stopped on its own; the hosts' fleets keep serving and are stopped by their own plan."""
    from epyc.deployments.serve_verify import http

    key = "sk-front-key-0123456789"
    env = {"FRONT_KEY": key}
    runs, ports = [], []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        run = run_with(tmp_path / name, host_docs(tmp_path, inputs, live_tune))
        port = free_port()
        args = ["--engines", "2", "--port", str(port), "--api-key-env", "FRONT_KEY", "--run", run]
        unexposed = run_script("launch.py", "plan", *args, env=env)
        assert unexposed.code == 0, unexposed.doc
        runs.append(run)
        ports.append(port)
    fport = free_port()
    front_run = str(tmp_path / "front")
    hosts = [f"{runs[0]}=127.0.0.1", f"{runs[1]}=127.0.0.1"]
    front_plan = ["plan", "--hosts", *hosts, "--api-key-env", "FRONT_KEY", "--port", str(fport), "--run", front_run]
    r = run_script("launch.py", *front_plan, env=env)
    assert r.code == 1 and "is not exposed with --api-key-env FRONT_KEY" in r.doc["error"], r.doc
    assert "--expose --plain-http --api-key-env FRONT_KEY" in r.doc["fix"]
    for run, port in zip(runs, ports):
        args = ["--engines", "2", "--expose", "--plain-http", "--port", str(port), "--api-key-env", "FRONT_KEY"]
        args += ["--run", run]
        assert run_script("launch.py", "plan", *args, env=env).code == 0
    r = run_script("launch.py", "plan", "--hosts", hosts[0], "--api-key-env", "FRONT_KEY", "--run", front_run, env=env)
    assert r.code == 1 and "two hosts or more" in r.doc["error"]
    p = run_script("launch.py", *front_plan, env=env)
    assert p.code == 0, p.doc
    argv = p.doc["router"]["argv"]
    assert argv[argv.index("--worker-urls") + 1 : argv.index("--worker-urls") + 3] == [
        f"http://127.0.0.1:{q}" for q in ports
    ]
    assert f"open TCP {ports[0]} to this machine only" in p.doc["summary_markdown"]
    body = {"model": "Qwen3-0.6B", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    url = f"http://127.0.0.1:{fport}/v1/chat/completions"
    try:
        for run in runs:
            s = run_script("launch.py", "start", "--run", run, "--confirm", env=env)
            assert s.code == 0, s.doc
        s = run_script("launch.py", "start", "--run", front_run, "--confirm", env=env)
        assert s.code == 0 and key not in " ".join(psutil.Process(s.doc["router"]["pid"]).cmdline()), s.doc
        v = run_script("launch.py", "verify", "--run", front_run, "--timeout", "30", env=env)
        assert v.code == 0 and v.doc["router"]["answered"], v.doc
        assert http("POST", url, 20, body=body)[0] == 401
        for _ in range(4):
            assert http("POST", url, 20, body=body, headers={"Authorization": f"Bearer {key}"})[0] == 200
        w = run_script(
            "launch.py", "verify", "--run", front_run, "--timeout", "60", env={"FRONT_KEY": "sk-not-the-key-000"}
        )
        assert (
            w.code == 1 and "refused the key in $FRONT_KEY" in w.doc["error"] and w.doc["router"]["answered"] is False
        )
        b = run_script("bench.py", "--plan", os.path.join(front_run, "plan.json"), env=env)
        assert b.code == 1 and "is a front router over several hosts" in b.doc["error"], b.doc
        h = run_script("launch.py", "handoff", "--run", front_run, env=env)
        assert (
            h.code == 0 and h.doc["base_url"] == f"http://127.0.0.1:{fport}/v1" and h.doc["api_key_env"] == "FRONT_KEY"
        )
    finally:  # everything stopped before anything is asserted: a failed check leaves no process behind
        st = run_script("launch.py", "stop", "--run", front_run, env=env)
        alive = run_script("launch.py", "verify", "--run", runs[0], "--timeout", "10", env=env)
        stops = [run_script("launch.py", "stop", "--run", run, env=env) for run in runs]
    assert st.code == 0 and st.doc["stopped"] and not st.doc["running"], st.doc
    assert alive.code == 0, alive.doc  # the hosts' fleets serve on after the front stops
    assert all(s.code == 0 for s in stops), [s.doc for s in stops]
    # a host planned again (another port): the front refuses to start a router its hosts no longer render,
    # and its stop still works
    args = ["--engines", "2", "--expose", "--plain-http", "--port", str(free_port()), "--api-key-env", "FRONT_KEY"]
    args += ["--run", runs[1]]
    assert run_script("launch.py", "plan", *args, env=env).code == 0
    again = run_script("launch.py", "start", "--run", front_run, "--confirm", env=env)
    assert again.code == 1 and "is not what its hosts' plans render now" in again.doc["error"], again.doc
    assert run_script("launch.py", "stop", "--run", front_run, env=env).code == 0
    own = run_script("launch.py", "plan", "--hosts", *hosts, "--api-key-env", "FRONT_KEY", "--run", runs[1], env=env)
    assert own.code == 1 and "the front's own --run among the hosts'" in own.doc["error"], own.doc


def test_a_container_fleet_runs_one_container_per_socket_and_stop_removes_each(router, tmp_path, inputs, rt):
    """The container path (the fake runtime: it records each call and starts no server): per-socket on the
    recorded dual Genoa plans one container per socket, each with its socket's cpuset and memory node;
    start runs both and the router; stop removes both containers and the router."""
    from conftest import load_docs

    d, env = rt
    run = run_with(tmp_path, load_docs(inputs))
    port = free_port()
    p = run_script("launch.py", "plan", "--engines", "per-socket", "--port", str(port), "--run", run, env=env)
    assert p.code == 0, p.doc
    engines = [json.loads(open(e).read()) for e in p.doc["engines"]]
    assert [e["path"] for e in engines] == ["container", "container"]
    cpusets = [next(a for a in e["argv"] if a.startswith("--cpuset-cpus=")) for e in engines]
    assert cpusets == ["--cpuset-cpus=0-95,192-287", "--cpuset-cpus=96-191,288-383"]
    assert [next(a for a in e["argv"] if a.startswith("--cpuset-mems=")) for e in engines] == [
        "--cpuset-mems=0",
        "--cpuset-mems=1",
    ]
    (d / "next_id").write_text("a" * 64 + "\n" + "b" * 64 + "\n")  # two containers, two ids, as an engine gives
    try:
        s = run_script("launch.py", "start", "--run", run, "--confirm", env=env)
        assert s.code == 0, s.doc
        router_pid = s.doc["router"]["pid"]
        calls = [json.loads(line)["argv"] for line in (d / "calls.jsonl").read_text().splitlines()]
        runs = [c for c in calls if c[:2] == ["run", "-d"]]
        assert [next(a for a in c if a.startswith("--cpuset-cpus=")) for c in runs] == cpusets
    finally:
        st = run_script("launch.py", "stop", "--run", run, env=env)
    assert st.code == 0 and st.doc["router"]["was_running"], st.doc
    names = {e["container_name"] for e in engines}
    assert {f.name.removeprefix("removed-") for f in d.glob("removed-*")} == names
    assert not psutil.pid_exists(router_pid) or psutil.Process(router_pid).status() == psutil.STATUS_ZOMBIE


def test_per_socket_engines_on_a_dual_socket_host_each_get_their_socket():
    """Recorded topologies, a dual Genoa NPS1 and a dual Turin NPS4: engine i binds socket i's physical cores
    and its memory (all four nodes of it on NPS4)."""
    import sysroots
    from epyc.decisions.kv_budget import Need
    from epyc.decisions.sizing import SizingRequest
    from epyc.facts import hostfacts

    root = sysroots.build(
        __import__("pathlib").Path(__import__("tempfile").mkdtemp()) / "sr", sysroots.HOSTS["genoa_9654_2s_smt"]
    )
    facts = hostfacts.gather(hostfacts.Sysroot(root), "sysroot:x", live=False)
    epyc = load_epyc()
    base = SizingRequest(
        busy_threshold=15, reserve_cores=0, os_reserve_gb=2.0, need=Need(weight_gb=15.0, kv_needed_gb=4.0)
    )
    tunes = fleet.engine_tunes(facts, epyc, None, base, "per-socket")
    assert [t["chosen_socket"] for t in tunes] == [0, 1]
    assert [t["vllm_cpu_omp_threads_bind"] for t in tunes] == ["0-95", "96-191"]
    assert [t["numa_nodes"] for t in tunes] == [[0], [1]]
    nps4 = sysroots.build(
        __import__("pathlib").Path(__import__("tempfile").mkdtemp()) / "sr", sysroots.HOSTS["turin_9755_2s_nps4"]
    )
    on_nps4 = fleet.engine_tunes(
        hostfacts.gather(hostfacts.Sysroot(nps4), "sysroot:y", live=False), epyc, None, base, "per-socket"
    )
    assert [t["numa_nodes"] for t in on_nps4] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # NPS4: a socket's four nodes each
    assert [t["vllm_cpu_omp_threads_bind"] for t in on_nps4] == ["0-127", "128-255"]
    per_node = fleet.engine_tunes(
        hostfacts.gather(hostfacts.Sysroot(nps4), "sysroot:y", live=False), epyc, None, base, "per-node"
    )
    assert [t["numa_nodes"] for t in per_node] == [[n] for n in range(8)]  # one engine per node, its memory alone
    assert [t["vllm_cpu_omp_threads_bind"] for t in per_node][:2] == ["0-31", "32-63"]
    assert [t["container_cpuset_argv"] for t in per_node][1] == ["--cpuset-cpus=32-63", "--cpuset-mems=1"]
    # vLLM keeps an engine's memory on its first core's node: a socket-wide engine has no more of it than one per node
    assert per_node[0]["socket_ram_gb"] == on_nps4[0]["socket_ram_gb"] == 192.0
    assert fleet.engine_tunes(facts, epyc, None, base, "per-node") == tunes  # NPS1: per-node is per-socket
    halves = fleet.engine_tunes(facts, epyc, None, base, "2")
    assert [t["vllm_cpu_omp_threads_bind"] for t in halves] == ["0-47", "48-95"]
    assert halves[0]["socket_ram_gb"] == tunes[0]["socket_ram_gb"] / 2


def test_two_dual_socket_hosts_planned_from_spec_rows_behind_one_front(router, tmp_path):
    """Recorded topologies, two hosts: each a dual EPYC 9654 (NPS1) from its --spec row, planned as a fleet of
    its own (an engine per socket, exposed with the key), and one front naming both hosts' routers; nothing
    is started or reached (the addresses are documentation ones)."""
    from model_fixtures import FIXTURES

    env = {"FLEET_KEY": "sk-two-hosts-0123456789"}
    config = str(FIXTURES / "Qwen3-0.6B" / "config.json")
    hosts = []
    for name, address in (("boxA", "192.0.2.10"), ("boxB", "192.0.2.11")):
        run = str(tmp_path / name)
        chain = [
            ("detect.py", "--spec", "9654", "--sockets", "2", "--ram-gb-per-socket", "384", "--nps", "1"),
            ("validate.py",),
            ("check_model.py", "--model", "Qwen/Qwen3-0.6B", "--config", config),
            ("estimate_memory.py", "--config", config, "--max-model-len", "4096"),
            ("cpu_tune.py",),
            ("launch.py", "plan", "--engines", "per-socket", "--expose", "--plain-http", "--api-key-env", "FLEET_KEY"),
        ]
        for step in chain:
            r = run_script(*step, "--run", run, env=env)
            assert r.code == 0, (step, r.doc)
        engines = [json.loads(open(e).read()) for e in r.doc["engines"]]
        assert [next(a for a in e["argv"] if a.startswith("--cpuset-")) for e in engines] == [
            "--cpuset-cpus=0-95,192-287",
            "--cpuset-cpus=96-191,288-383",
        ]
        hosts.append(f"{run}={address}")
    f = run_script(
        "launch.py", "plan", "--hosts", *hosts, "--api-key-env", "FLEET_KEY", "--run", str(tmp_path / "front"), env=env
    )
    assert f.code == 0, f.doc
    argv = f.doc["router"]["argv"]
    assert argv[argv.index("--worker-urls") + 1 :][:2] == ["http://192.0.2.10:8000", "http://192.0.2.11:8000"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert (
        "| 192.0.2.10 (" in f.doc["summary_markdown"]
        and "open TCP 8000 to this machine only" in f.doc["summary_markdown"]
    )
