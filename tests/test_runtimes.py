"""epyc.runtimes: its decisions, tested in-process."""

from epyc import (
    runtimes,
)


def test_runtime_argv_never_prompts_for_sudo():
    assert runtimes.runtime_argv("sudo docker") == ["sudo", "-n", "docker"]
    assert runtimes.runtime_argv("podman") == ["podman"]
