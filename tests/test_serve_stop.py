"""epyc.deployments.serve_stop: its decisions, tested in-process."""

import os
from pathlib import Path

from conftest import host_plan


def test_stop_that_cannot_remove_the_state_says_the_server_is_stopped(inputs, live_tune, tmp_path, monkeypatch):
    """F4: on a read-only state dir stop killed the server, then failed on the state's unlink ("the system
    refused an operation") with no word that the server was gone, and every later stop failed the same way.
    The server is real; the read-only folder is simulated in-process (an unlink raising EROFS), as a
    read-only mount needs privileges a CI shell may lack."""
    import errno
    import pathlib

    from epyc.deployments import process, serve_start, serve_state, serve_stop

    _, plan = host_plan(tmp_path, inputs, live_tune)
    serve_start.start(plan, confirm=True)
    state = serve_state.read_state(plan)
    real_unlink = pathlib.Path.unlink

    def read_only(self, missing_ok=False):
        if str(self) == plan["state_file"]:
            raise OSError(errno.EROFS, "Read-only file system")
        return real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(pathlib.Path, "unlink", read_only)
    doc = serve_stop.stop(plan)
    assert doc["stopped"] is True and not process.group_members(state)
    assert "could not be removed" in doc["warnings"][0] and "Read-only file system" in doc["warnings"][0]
    again = serve_stop.stop(plan)  # the state names a server that is gone: "not running", still no error
    assert again["stopped"] is False and again["reason"] == "not running" and again["warnings"]


def test_stop_frees_the_shared_memory_verify_saw_its_engine_map_once_nothing_holds_it():
    """A killed vLLM engine leaves its /dev/shm/psm_* segments (hundreds of MB, memory): stop frees the ones
    verify recorded for this server, unless a process still maps one; it never touches an unrecorded one."""
    import mmap

    from epyc.deployments.serve_stop import free_segments

    shm = Path("/dev/shm")
    left, held, other = (shm / f"psm_test{os.getpid()}_{n}" for n in ("left", "held", "other"))
    for seg in (left, held, other):
        seg.write_bytes(b"\0" * 4096)
    state = {"shm_segments": [left.name, held.name, "../../etc/passwd"]}
    with open(held, "r+b") as f, mmap.mmap(f.fileno(), 4096):
        try:
            assert free_segments(state) == [left.name] and not left.exists()
            assert held.exists() and other.exists()
        finally:
            for seg in (left, held, other):
                seg.unlink(missing_ok=True)
    assert free_segments(None) == [] and free_segments({}) == [] and free_segments({"shm_segments": 5}) == []
