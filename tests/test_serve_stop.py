"""epyc.serve_stop: its decisions, tested in-process."""

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

    from epyc import (
        serve_procs,
        serve_start,
        serve_state,
        serve_stop,
    )

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
    assert doc["stopped"] is True and not serve_procs.group_members(state)
    assert "could not be removed" in doc["warnings"][0] and "Read-only file system" in doc["warnings"][0]
    again = serve_stop.stop(plan)  # the state names a server that is gone: "not running", still no error
    assert again["stopped"] is False and again["reason"] == "not running" and again["warnings"]


def test_stop_frees_the_shared_memory_a_dead_engine_left_and_nothing_else():
    """A killed vLLM engine leaves its /dev/shm/psm_* segments (hundreds of MB, memory): stop removes this
    user's made since the server started that no process maps, and keeps a mapped one and an older one."""
    import mmap
    import time as _time

    from epyc.serve_stop import orphan_segments

    t0 = _time.time()
    shm = Path("/dev/shm")
    old, left, held = (shm / f"psm_test{os.getpid()}_{n}" for n in ("old", "left", "held"))
    for seg in (old, left, held):
        seg.write_bytes(b"\0" * 4096)
    os.utime(old, (t0 - 3600, t0 - 3600))
    with open(held, "r+b") as f, mmap.mmap(f.fileno(), 4096):
        try:
            freed = orphan_segments(t0)
            assert left.name in freed and not left.exists()
            assert held.exists() and old.exists() and held.name not in freed
        finally:
            for seg in (old, left, held):
                seg.unlink(missing_ok=True)
    assert orphan_segments(None) == []
