"""epyc.decisions.command: its decisions, tested in-process."""

import os
import signal
import subprocess
import sys
import time

from epyc.bundle import load_epyc
from epyc.decisions import command
from epyc.deployments import process
from epyc.facts import preload


# ---- lesser: a served name that reads as a URL; bench's key inside a container; an HF cache that is a file
def test_a_served_name_that_reads_as_a_url_is_refused():
    from epyc.argtypes import is_served_name

    assert is_served_name("org/model@v2") and is_served_name("my-model:latest")
    assert not is_served_name("http://user@host") and not is_served_name("s3://bucket/x")


def test_an_int4_checkpoint_is_not_served_on_a_cpu_without_avx512():
    """vLLM 0.32.0's _C_AVX2 has no cpu_gemm_wna16 (measured on EPYC Rome): the engine would die at start."""
    from epyc.bundle import load_epyc
    from epyc.decisions.command import quantized_path

    report = {"method": "awq", "format": None, "bits": 4, "symmetric": True, "group_size": 128}
    assert quantized_path(report, "stock", "bfloat16", load_epyc(), avx512=True)["kernel"].startswith("cpu_gemm_wna16")
    refused = quantized_path(report, "stock", "bfloat16", load_epyc(), avx512=False)
    assert refused["served_on_cpu"] is False and "_C_AVX2" in refused["note"]


def test_the_served_arguments_are_read_by_the_plans_path():
    """F1: a host command carrying '--entrypoint' as a value was read as a container's."""
    from epyc.decisions.command import serve_args

    host = ["numactl", "-N", "0", "/v/bin/vllm", "serve", "org/m", "--revision", "--entrypoint"]
    assert serve_args(host, container=False)[0] == "org/m"


def test_the_pin_shapes_cpu_tune_makes_are_accepted():
    assert command.pin_prefix_problem(["numactl", "--cpunodebind=0,1", "--membind=0,1"], []) is None
    assert command.pin_prefix_problem(["taskset", "-c", "0-3,8"], ["--cpuset-cpus=0-3,8", "--cpuset-mems=0"]) is None
    assert command.pin_prefix_problem([], []) is None
    assert preload.preload_value(
        "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", load_epyc()["host_stack"]["ld_preload_libs"]
    )


# ---- F9: the server's environment is the plan's, not the whole shell's
def test_the_host_server_gets_the_plans_env_and_only_named_shell_variables():
    shell = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "LC_ALL": "C",
        "HF_HOME": "/hf",
        "LD_LIBRARY_PATH": "/tmp/evil",
        "VLLM_ATTENTION_BACKEND": "X",
        "PYTHONPATH": "/tmp/evil",
        "MY_API_KEY": "sk",
    }
    env = command.server_env(shell, {"VLLM_CPU_KVCACHE_SPACE": "2"}, {"VLLM_API_KEY": "sk"}, "t" * 32)
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "LC_ALL": "C",
        "HF_HOME": "/hf",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_API_KEY": "sk",
        command.MARKER_ENV: "t" * 32,
    }


def test_the_server_reaches_the_hub_the_user_configured():
    env = command.server_env(
        {"HF_ENDPOINT": "http://mirror:8080", "REQUESTS_CA_BUNDLE": "/etc/ca.pem"}, {}, {}, "t" * 32
    )
    assert env["HF_ENDPOINT"] == "http://mirror:8080" and env["REQUESTS_CA_BUNDLE"] == "/etc/ca.pem"


def test_a_server_inside_execve_is_still_alive_and_ours():
    """start's server execs twice (the pin program, then vllm's #! python); while a process is inside
    execve its /proc environ reads empty. verify or stop asking then judged it "exited" or not ours:
    seen by the suite as a verify failing with an empty server log. Each read here is one group_members
    would make; without the settling, about half of these launches read empty at least once."""
    import psutil

    token = "c" * 32
    chain = (
        "import os, sys; os.execv(sys.executable, [sys.executable, '-c', "
        '\'import os, sys; os.execv("/bin/sleep", ["sleep", "30"])\'])'
    )
    for _ in range(10):
        leader = subprocess.Popen(
            [sys.executable, "-c", chain], start_new_session=True, env={**os.environ, command.MARKER_ENV: token}
        )
        try:
            proc = psutil.Process(leader.pid)
            deadline = time.monotonic() + 0.6  # both execs happen in this window; read as often as we can
            while time.monotonic() < deadline:
                env = process.settled_environ(proc)
                assert env and env.get(command.MARKER_ENV) == token, "a launching server read as not ours"
            state = {"pgid": leader.pid, "create_time": proc.create_time(), "marker": token}
            assert process.process_alive(state)
        finally:
            os.killpg(leader.pid, signal.SIGKILL)
            leader.wait()


def test_container_command_sets_the_vllm_entrypoint_whatever_the_image_declares():
    """The stock image's entrypoint is `vllm serve`, the zentorch image has none: --entrypoint vllm +
    `serve ...` runs the same command in both."""
    plan = command.container_run_argv(
        ["podman"],
        "vllm-epyc",
        ["--ipc=host"],
        [],
        "-v /h:/root/.cache/huggingface",
        [],
        {"A": "1"},
        [],
        "vllm/vllm-openai-cpu:v0.32.0-x86_64",
        ["m", "--port", "1"],
    )
    assert plan[-7:] == ["--entrypoint", "vllm", "vllm/vllm-openai-cpu:v0.32.0-x86_64", "serve", "m", "--port", "1"]
