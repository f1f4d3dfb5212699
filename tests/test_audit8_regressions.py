"""Regressions from the eighth independent bad-input audit (881 cases, 2026-12-02, a fresh helper on the
seventh audit's fixes, with fake stack/registry interpreters and a fake `vllm bench serve`): each finding,
run the way the audit ran it. Classes: tests/BAD_INPUT.md."""
import gzip
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import psutil
import pytest

import bench
import common
import serve_life
from common import ScriptError
from test_audit4_regressions import plan_from
from test_launch import host_plan, inputs, live_tune, load_docs, rt, server_mode  # noqa: F401


# ---- 1: a chain of extended tar headers (tarfile recurses into each)

def _header(name: str, kind: bytes, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, len(data)
    return info.tobuf(format=tarfile.USTAR_FORMAT) + data + b"\0" * (-len(data) % 512)


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME])
def test_a_capture_with_a_chain_of_extended_headers_is_a_clear_error(script, tmp_path, kind):
    record = b"13 comment=x\n" if kind == tarfile.XHDTYPE else b"proc/cpuinfo\0"
    body = b"".join(_header("././@Header", kind, record) for _ in range(2000))
    body += _header("proc/cpuinfo", tarfile.REGTYPE, b"processor : 0\n") + b"\0" * 1024
    archive = tmp_path / "capture.tar.gz"
    archive.write_bytes(gzip.compress(body))
    r = script("detect.py", "--sysroot", str(archive))
    assert r.code == 1 and "a chain of extended headers" in r.doc["error"]


# ---- 2, 8: what the printed document may be checked and masked as

def test_only_the_plan_inputs_are_checked_against_their_schema_as_printed(capsys):
    """bench's --compare document is not bench.json's single-run shape: it used to end as exit 1."""
    for name, code in (("bench", 0), ("cpu_tune", 1)):
        ns: dict = {}
        exec(compile("def main(argv):\n    return {'comparison': {}, 'chosen_socket': 10 ** 9}, 0\n",
                     f"/x/{name}.py", "exec"), ns)
        assert common.run_main(ns["main"], []) == code, name
        capsys.readouterr()


@pytest.mark.parametrize("value", ["true", "4096", "localhost", '"ok": true'])
def test_a_secret_is_masked_inside_strings_and_the_output_stays_json(script, value):
    r = script("detect.py", env={"X_PASSWORD": value, "MY_TOKEN": value})
    assert isinstance(r.doc, dict) and r.doc["ok"] is True and isinstance(r.doc["logical_cores"], int)
    ok = json.loads(json.dumps(common.masked_strings({"ok": True, "n": 4096, "s": f"a {value} b"}, [value])))
    assert ok == {"ok": True, "n": 4096, "s": "a *** b"}


def test_cpu_tune_env_output_is_masked_too(script):
    r = subprocess.run([sys.executable, str(common.ROOT / "scripts" / "cpu_tune.py"), "--format", "env", "--sysroot",
                        "http://bob:Pw0rd1234@mirror/x"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Pw0rd1234" not in r.stdout + r.stderr


# ---- 4: a sysroot of another host, validated here; its CPUs at start

def test_a_tree_of_another_host_is_not_this_machine(inputs, tmp_path, live_tune):  # noqa: F811
    docs = load_docs(inputs)
    docs["validate"]["target"] = "localhost"  # validate.py run here without --detect of the tree
    with pytest.raises(ScriptError, match="detect.py read sysroot:.*validate.py checked localhost"):
        plan_from(docs)
    _, plan = host_plan(tmp_path, inputs, live_tune)
    assert serve_life.cpus_not_here(plan) is None
    sizing = {**plan["sizing"], "vllm_cpu_omp_threads_bind": "96-191"}  # a Genoa socket's cores
    assert serve_life.cpus_not_here({**plan, "sizing": sizing}) == "96-191"


def test_detect_names_a_tree_however_it_was_spelled(script, make_sysroot):
    root = make_sysroot("genoa_9654_2s_smt")
    a = script("detect.py", "--sysroot", os.path.relpath(root, common.ROOT)).doc["target"]  # scripts run in ROOT
    b = script("detect.py", "--sysroot", str(root) + "/").doc["target"]
    assert a == b == f"sysroot:{os.path.realpath(root)}"


# ---- 5, 6: bench's folder planted in advance; a state dir through a link

def test_a_planted_bench_link_makes_the_state_dir_foreign(tmp_path, inputs, live_tune):  # noqa: F811
    _, plan = host_plan(tmp_path, inputs, live_tune)
    state = Path(plan["state_dir"])
    state.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (state / time.strftime("bench-%Y%m%d-%H%M%S")).symlink_to(victim)
    assert "already holds other files (bench-" in serve_life.state_dir_problem(state)
    (state / "bench-20260101-000000").mkdir()
    (next(state.glob("bench-2026120*"))).unlink()
    assert serve_life.state_dir_problem(state) is None  # bench's own folders are fine
    made = bench.new_bench_dir(state)
    assert made.is_dir() and not made.is_symlink() and made.parent == state


def test_a_state_dir_reached_through_a_link_into_a_system_tree_is_refused(tmp_path):
    (tmp_path / "cache").symlink_to("/dev/shm")
    problem = serve_life.state_dir_problem(tmp_path / "cache" / "serving-llms-on-epyc" / "run" / "x")
    assert problem and "system tree" in problem and "/dev/shm" in problem


# ---- 7: up interrupted during verify

@pytest.mark.parametrize("mode,signals", [("never_healthy", 1), ("slow_term", 2)])
def test_an_interrupted_verify_after_up_started_stops_the_server(tmp_path, inputs, live_tune, mode,  # noqa: F811
                                                                 signals):
    """As up does it, in one process: start, then verify (the fake server never gets healthy), then the
    SIGTERM of an agent's tool timeout -- and (eighteenth audit) the second one GNU timeout sends to the
    group, or a double Ctrl-C, while stop still waits for a server slow to exit: it cut the stop short."""
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    server_mode(tmp_path, mode)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import common, json, launch, serve_life\n"
            "plan = json.load(open(sys.argv[2]))\n"
            "def main(argv):\n"
            "    serve_life.start(plan, confirm=True)\n"
            "    return launch.verify_or_stop(plan, sys.argv[2], 120, 10), 0\n"
            "sys.exit(common.run_main(main))\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(common.ROOT / "scripts"), str(plan_file)],
                            stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not serve_life.read_state(plan):
            time.sleep(0.2)
        pgid = serve_life.read_state(plan)["pgid"]
        time.sleep(3)  # verify is polling /health
        proc.send_signal(signal.SIGTERM)
        for _ in range(signals - 1):
            time.sleep(1)  # stop is waiting for the server
            proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
        doc = json.loads(out)
        assert proc.returncode == 1 and "up stopped the server" in doc["error"] and doc["plan_file"]
        assert doc["stopped"]["stopped"] and not [p for p in psutil.process_iter() if _pgid(p) == pgid]
    finally:
        proc.kill()
        serve_life.stop(plan)


def _pgid(p) -> int | None:
    try:
        return os.getpgid(p.pid)
    except OSError:
        return None


@pytest.mark.parametrize("args", [["launch.py", "start", "--confirm"], ["launch.py", "verify"], ["bench.py"],
                                  ["kernel_proof.py"]])
def test_an_empty_plan_path_is_named_as_empty(script, args):
    r = script(*args, "--plan=")
    assert r.code == 1 and "argument --plan: is empty" in r.doc["error"]
