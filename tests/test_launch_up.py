"""launch.py up: plan, confirm, start, verify and hand off in one command."""

import os
import time
from pathlib import Path

import pytest
from conftest import another_process_holding, host_plan


def test_up_serves_a_folder_whose_name_is_not_plain_under_a_name_it_is_given(script, tmp_path):
    """`up --model '/data/my model'` ran five scripts, then asked for --served-model-name, which up lacked."""
    folder = tmp_path / "my model"
    folder.mkdir()
    t0 = time.monotonic()
    r = script("launch.py", "up", "--yes", "--model", str(folder))
    assert r.code == 1 and "'my model', not a plain name" in r.doc["error"] and "--served-model-name" in r.doc["fix"]
    assert "phase" not in r.doc and time.monotonic() - t0 < 30
    # with a name, that check passes (the next one stops it here: the key variable is unset)
    r = script(
        "launch.py",
        "up",
        "--yes",
        "--model",
        str(folder),
        "--served-model-name",
        "my-model",
        "--api-key-env",
        "AUDIT11_UNSET",
    )
    assert r.code == 1 and "AUDIT11_UNSET: that variable is not set" in r.doc["error"], r.doc
    bad = script("launch.py", "up", "--served-model-name", "my model")
    assert bad.code == 1 and "not a plain model name" in bad.doc["error"]


def test_a_link_loop_is_a_clear_error(script, tmp_path, make_sysroot):
    """F6: Path.resolve() raises RuntimeError on a link loop (Python 3.10, 3.11): a --state-dir or a sysroot
    file that loops was an internal error."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    r = script("launch.py", "up", "--yes", "--state-dir", str(tmp_path / "loop"))
    assert r.code == 1 and "a link that leads nowhere" in r.doc["error"], r.doc
    root = make_sysroot("genoa_9654_2s_smt")
    cpulist = Path(root) / "sys/devices/system/node/node0/cpulist"
    cpulist.unlink()
    cpulist.symlink_to("cpulist")
    for tool, args in (("detect.py", []), ("cpu_tune.py", ["--weight-gb", "1", "--kv-needed-gb", "1"])):
        r = script(tool, "--sysroot", str(root), *args)
        assert "internal error" not in r.stdout, r.doc


def test_up_refuses_a_folder_whose_server_runs_before_writing_anything(script, inputs, live_tune, tmp_path):
    """F4, up's half: a second `up` with the same (default) folder wrote its documents and plan.json over the
    running server's, so the printed stop command stopped the wrong server and the first was named by nothing."""
    from epyc.deployments import serve_start, serve_stop

    _, plan = host_plan(tmp_path, inputs, live_tune)
    serve_start.start(plan, confirm=True)
    try:
        before = sorted(os.listdir(plan["state_dir"]))
        t0 = time.monotonic()
        r = script("launch.py", "up", "--yes", "--state-dir", plan["state_dir"])
        assert r.code == 1 and "holds a running server" in r.doc["error"] and "stop --plan" in r.doc["fix"], r.doc
        assert time.monotonic() - t0 < 30 and sorted(os.listdir(plan["state_dir"])) == before
    finally:
        serve_stop.stop(plan)


def test_up_holds_its_folder_so_a_second_up_cannot_rewrite_the_first_ones_plan(script, tmp_path):
    """F3: a second up into a folder whose first up was still pulling (no state yet, start's .lock not
    taken) rewrote every step document and plan.json, and the first run's server was left with no plan file
    that could stop it. Here another process holds the folder as up does."""
    run_dir = tmp_path / "up"
    run_dir.mkdir()
    with another_process_holding(str(run_dir / ".up.lock")):
        r = script("launch.py", "up", "--yes", "--state-dir", str(run_dir))
        assert r.code == 1 and "another up is running" in r.doc["error"], r.doc
        assert sorted(p.name for p in run_dir.iterdir()) == [".up.lock"]  # nothing written


@pytest.mark.parametrize("plant", ["link", "folder"])
def test_up_refuses_a_start_lock_that_is_not_its_own_file_before_any_step(script, tmp_path, plant):
    """A note of the twenty-sixth audit: up ran its five steps and wrote plan.json, and only its start then
    refused the `.lock` that was a link, a pipe or a folder. up checks start's lock file when it takes its own."""
    run_dir = tmp_path / "up"
    run_dir.mkdir()
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    {"link": lambda p: p.symlink_to(target), "folder": lambda p: p.mkdir()}[plant](run_dir / ".lock")
    r = script("launch.py", "up", "--yes", "--state-dir", str(run_dir))
    assert r.code == 1 and ".lock" in r.doc["error"] and r.doc["phase"] == "up", r.doc
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", ".up.lock"] and target.read_text() == "keep"


# ---- lesser: refusals up made only after five scripts ran; orphans; odd default state dirs; endpoints
@pytest.mark.parametrize(
    "args,env,needle",
    [
        (["--model=-x"], {}, "starts with '-'"),
        (["--expose"], {}, "an API key is required"),
        (["--api-key-env", "AUDIT7_UNSET"], {}, "AUDIT7_UNSET: that variable is not set"),
        (["--expose", "--api-key-env", "UP_KEY"], {"UP_KEY": "k" * 32}, "needs TLS"),
        (["--tls-cert", "c.pem", "--tls-key", "k.pem"], {}, "without --expose"),
    ],
)
def test_up_refuses_before_anything_runs(script, args, env, needle):
    t0 = time.monotonic()
    r = script("launch.py", "up", "--yes", *args, env=env)
    assert r.code == 1 and needle in r.doc["error"] and r.doc["fix"] and "phase" not in r.doc
    assert time.monotonic() - t0 < 30  # detect, validate, check, estimate and tune would take minutes
