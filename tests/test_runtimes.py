"""epyc.facts.runtimes: its decisions, tested in-process."""

from epyc.facts import runtimes


def test_runtime_argv_never_prompts_for_sudo():
    assert runtimes.runtime_argv("sudo docker") == ["sudo", "-n", "docker"]
    assert runtimes.runtime_argv("podman") == ["podman"]
