"""epyc.deployments.serve_start: its decisions, tested in-process."""

import subprocess

import pytest
from conftest import (
    _pgid,
    calls,
    container_plan,
    host_plan,
    load_docs,
    plan_from,
)
from epyc.deployments import process, serve_start
from epyc.errors import ScriptError


def test_a_state_that_cannot_be_written_takes_the_launched_server_down(inputs, live_tune, tmp_path, monkeypatch):
    """F2: a full disk (or an immutable state.json) after the launch: `internal error: OSError`, and the
    server ran with no state. The server is real (the fake venv's vllm); the full disk is simulated (a
    write_state raising ENOSPC: a disk cannot be filled safely here)."""
    import errno

    import psutil
    from conftest import host_plan
    from epyc.deployments import process, serve_start
    from epyc.errors import ScriptError

    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    launched = []
    real_popen = subprocess.Popen

    def popen(*a, **k):
        launched.append(real_popen(*a, **k))
        return launched[-1]

    def full_disk(plan, state):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.setattr(process, "write_state", full_disk)
    with pytest.raises(ScriptError) as err:
        serve_start.start(plan, confirm=True)
    assert "its state could not be written" in err.value.error and "No space left on device" in err.value.error
    assert "start stopped it" in err.value.error and err.value.extra["phase"] == "start"
    assert launched and not psutil.pid_exists(launched[0].pid)
    assert not [p for p in psutil.process_iter() if _pgid(p.pid) == launched[0].pid]


def test_a_host_plans_verbs_refuse_another_plans_running_server(inputs, live_tune, tmp_path):
    """F4 on the host path: start refused already, but stop with the other plan would have killed the running
    server (the state names a process group, not a plan)."""
    from epyc.deployments import serve_start, serve_state, serve_stop, serve_verify
    from epyc.errors import ScriptError

    _, a = host_plan(tmp_path, inputs, live_tune)
    _, b = host_plan(tmp_path, inputs, live_tune)  # the same state dir, another port
    assert a["state_dir"] == b["state_dir"] and a["port"] != b["port"]
    serve_start.start(a, confirm=True)
    try:
        for act in (
            lambda: serve_start.start(b, confirm=True),
            lambda: serve_stop.stop(b),
            lambda: serve_verify.verify(b, 5, 5),
        ):
            with pytest.raises(ScriptError) as err:
                act()
            assert f"port {a['port']}" in err.value.error, err.value.error
        assert process.process_alive(serve_state.read_state(a))
        serve_verify.verify(a, 30, 10)
    finally:
        serve_stop.stop(a)


def test_a_container_whose_state_cannot_be_written_is_said_removed(script, inputs, rt, tmp_path, monkeypatch):
    """A note of the twenty-fourth audit: a container start on a full disk said only "cannot write
    state.json"; the container had been launched and removed, and the host path says so. The runtime is the
    fake docker; the full disk is simulated in-process (write_state raising what it raises on ENOSPC: a
    file-size limit would also stop the runtime's own writes)."""
    import errno

    from epyc import errors
    from epyc.deployments import serve_start
    from epyc.errors import ScriptError

    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    def full_disk(plan, state):
        raise errors.os_error(OSError(errno.ENOSPC, "No space left on device"), f"cannot write {plan['state_file']}")

    monkeypatch.setattr(serve_start, "write_state", full_disk)
    with pytest.raises(ScriptError) as err:
        serve_start.start(plan, confirm=True)
    assert "was launched, but its state could not be written" in err.value.error, err.value.error
    assert "start removed it" in err.value.error and "No space left" in err.value.error
    made = [c["argv"][0] for c in calls(d)]
    assert made[-1] == "rm" and "run" in made


# ---- 4: a sysroot of another host, validated here; its CPUs at start
def test_a_tree_of_another_host_is_not_this_machine(inputs, tmp_path, live_tune):
    docs = load_docs(inputs)
    docs["validate"]["target"] = "localhost"  # validate.py run here without --detect of the tree
    with pytest.raises(ScriptError, match="detect.py read sysroot:.*validate.py checked localhost"):
        plan_from(docs)
    _, plan = host_plan(tmp_path, inputs, live_tune)
    assert serve_start.cpus_not_here(plan) is None
    sizing = {**plan["sizing"], "vllm_cpu_omp_threads_bind": "96-191"}  # a Genoa socket's cores
    assert serve_start.cpus_not_here({**plan, "sizing": sizing}) == "96-191"
