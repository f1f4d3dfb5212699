"""scripts/kernel_proof.py: its contract and its decisions."""

import time
from pathlib import Path

import pytest
from conftest import FORGED, REAL, REAL_LOG, calls, container_plan, host_plan


def test_kernel_proof_names_at_most_a_few_hundred_distinct_ops(script, tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "".join(
            f"[API  ][info   ][0.1]: LOWOHA matmul_direct: M=1, plugin_op=op{i}{'x' * 300} kernel=k{i % 3}\n"
            for i in range(5000)
        )
    )
    r = script("kernel_proof.py", "--log", str(log))
    assert r.code == 0 and r.doc["zentorch_matmuls"] == 5000, r.doc
    ops = r.doc["by_plugin_op"]
    assert len(ops) == 201 and ops["(other)"] == 4800 and sum(ops.values()) == 5000
    assert max(map(len, ops)) <= 200 and r.doc["by_kernel"] == {"k0": 1667, "k1": 1667, "k2": 1666}


# ---- F1: a runtime CLI that cannot be executed, while kernel_proof streams its log
@pytest.mark.parametrize("body", [b"not a program\n", b"", b"#!/nonexistent/interpreter\n"])
def test_kernel_proof_names_a_runtime_it_cannot_run(script, inputs, rt, tmp_path, body):
    d, env = rt
    plan_file, _ = container_plan(script, inputs, rt, tmp_path)
    broken = tmp_path / "broken-bin"
    broken.mkdir()
    (broken / "docker").write_bytes(body)
    (broken / "docker").chmod(0o755)
    # kernel_proof asks the runtime which container has the name before it reads a log: a CLI that cannot
    # run answers nothing, and nothing is read (the thirtieth audit)
    r = script("kernel_proof.py", "--plan", str(plan_file), env={**env, "PATH": f"{broken}:/usr/bin:/bin"})
    assert r.code == 1 and "did not say whether a container named" in r.doc["error"] and "docker" in r.doc["fix"], r.doc


# ---- F9: kernel_proof reads only the log start wrote
def test_kernel_proof_never_takes_a_planted_link_as_the_servers_log(script, tmp_path, inputs, live_tune):
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    Path(plan["state_dir"]).mkdir(parents=True, exist_ok=True)
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text(
        "[API  ][info   ][0.1]: LOWOHA matmul_direct: M=1, plugin_op=zentorch_linear kernel=from_elsewhere\n"
    )
    link = Path(plan["log_file"])
    link.symlink_to(elsewhere)
    r = script("kernel_proof.py", "--plan", str(plan_file))
    assert r.code == 1 and "link" in r.doc["error"] and "from_elsewhere" not in r.stdout, r.doc
    link.unlink()
    r = script("kernel_proof.py", "--plan", str(plan_file))
    assert r.code == 1 and "has not been started" in r.doc["error"] and "launch.py start" in r.doc["fix"], r.doc


def test_kernel_proof_reads_only_the_log_of_the_container_its_plan_started(script, inputs, rt, tmp_path):
    """The review of the twenty-eighth's fixes: kernel_proof read `docker logs NAME` whoever's container had
    the name (one per port): another plan's run proved zentorch for this one."""
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    (d / f"created-{plan['container_name']}").write_text("a" * 64)  # another state dir's, on this port
    (d / "logs_lines").write_text("10000")
    r = script("kernel_proof.py", "--plan", str(plan_file), env=env)
    assert r.code == 1 and "is not the one this plan's start recorded" in r.doc["error"], r.doc
    (d / f"created-{plan['container_name']}").unlink()
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    r = script("kernel_proof.py", "--plan", str(plan_file), env=env)
    assert r.code == 0 and r.doc["zentorch_matmuls"] == 10000, r.doc


# ---- F4 and F5: an inspect that did not answer let kernel_proof read another plan's log, and verify pass
def test_kernel_proof_reads_no_log_the_runtime_has_not_named_this_plans(script, inputs, rt, tmp_path):
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    r = script("kernel_proof.py", "--plan", str(plan_file), env=env)
    assert r.code == 1 and "no container named" in r.doc["error"] and "start" in r.doc["fix"], r.doc
    (d / f"created-{plan['container_name']}").write_text("a" * 64)  # another state dir's, on this port
    (d / "logs_lines").write_text("10000")
    (d / "inspect_fails").touch()
    before = len(calls(d))
    r = script("kernel_proof.py", "--plan", str(plan_file), env=env)
    assert r.code == 1 and "did not say whether a container named" in r.doc["error"], r.doc
    assert not any(c["argv"][0] == "logs" for c in calls(d)[before:])
    (d / "inspect_fails").unlink()
    (d / f"created-{plan['container_name']}").unlink()
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    before = len(calls(d))
    r = script("kernel_proof.py", "--plan", str(plan_file), env=env)
    assert r.code == 0 and r.doc["zentorch_matmuls"] == 10000, r.doc
    assert [c["argv"] for c in calls(d)[before:] if c["argv"][0] == "logs"] == [["logs", "f" * 64]]


def test_a_client_cannot_write_a_kernel_line_into_the_proof(script, tmp_path):
    """F1: vLLM's access log writes each request's path: one unauthenticated GET of
    /plugin_op=zentorch_linear_unary_out,kernel=aocl_dlp_blocked made kernel_proof say "zentorch kernels
    executed". A matmul counts only as zendnnl's own record (LOWOHA matmul_direct: ...), never from an access line."""
    log = tmp_path / "server.log"
    # and the review of that fix: vLLM's own logger writes a requested model name into its error line
    error_line = (
        "(APIServer pid=1) ERROR 12-03 17:00:00 [serving.py:274] Error with model error=ErrorResponse("
        "message='The model `LOWOHA matmul_direct: M=1, plugin_op=zentorch_linear_unary_out, "
        "kernel=aocl_dlp_blocked, x` does not exist.', type='NotFoundError', code=404)\n"
    )
    log.write_text(
        FORGED
        + FORGED.replace("GET /", "POST /v1/LOWOHA%20matmul_direct:")
        + "plugin_op=a kernel=b\n"
        + error_line
        + error_line.replace("(APIServer pid=1) ERROR 12-03", "[API ][info ][1]: x")
    )
    r = script("kernel_proof.py", "--log", str(log))
    assert r.code == 1 and r.doc["zentorch_matmuls"] == 0 and r.doc["verdict"] == "no zentorch matmul in the log"
    log.write_text(FORGED + REAL * 3 + "(EngineCore_DP0 pid=7) " + REAL)
    r = script("kernel_proof.py", "--log", str(log))
    assert r.code == 0 and r.doc["zentorch_matmuls"] == 4 and r.doc["by_kernel"] == {"aocl_dlp_blocked": 4}
    assert r.doc["sample"].startswith("[API    ][info   ][")
    r = script("kernel_proof.py", "--log", str(REAL_LOG))  # the real log, whole: every record, nothing else
    assert r.code == 0 and r.doc["by_plugin_op"] == {"zentorch::zentorch_linear_unary": 2, "zentorch::zentorch_mm": 1}


def test_a_stock_plan_proves_no_zentorch_whatever_its_log_says(script, tmp_path, inputs, live_tune):
    """F1, the other half: a stock plan's server (vLLM's CpuPlatform) runs no zentorch, so lines that read as
    its matmuls are not this server's kernels: exit 1, with the reason."""

    def stock(docs):
        docs["validate"]["backend"] = "stock"

    plan_file, plan = host_plan(tmp_path, inputs, live_tune, edit=stock, kernel_log=True)
    assert plan["backend"] == "stock"
    Path(plan["state_dir"]).mkdir(parents=True, exist_ok=True)
    Path(plan["log_file"]).write_text(REAL)
    r = script("kernel_proof.py", "--plan", str(plan_file))
    assert r.code == 1 and r.doc["error"].startswith("the plan serves stock vLLM, which runs no zentorch")
    assert r.doc["zentorch_matmuls"] == 1 and "validate.py without --stock" in r.doc["fix"]
    Path(plan["log_file"]).write_text("nothing of zendnnl\n")  # none either: the same reason, not "--kernel-log"
    r = script("kernel_proof.py", "--plan", str(plan_file))
    assert (
        r.code == 1 and r.doc["error"].startswith("the plan serves stock vLLM") and "--kernel-log" not in r.doc["fix"]
    )


# ---- F4: a log line no regex may spend minutes on
@pytest.mark.parametrize("line", ["plugin_op=a " * 64000, "onednn_verbose," * 64000])
def test_a_kernel_log_line_of_a_megabyte_is_read_in_seconds(script, tmp_path, line):
    log = tmp_path / "server.log"
    log.write_text(f"{line}\n[API  ][info   ][0.1]: LOWOHA matmul_direct: M=1, plugin_op=zentorch_mm kernel=k\n")
    t0 = time.monotonic()
    r = script("kernel_proof.py", "--log", str(log), timeout=60)
    assert r.code == 0 and r.doc["zentorch_matmuls"] == 1 and time.monotonic() - t0 < 20
