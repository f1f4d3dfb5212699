"""detect.py / cpu_tune.py --host against a real sshd on 127.0.0.1 that this test starts (not a mock)."""

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
pytestmark = [
    pytest.mark.ssh,
    pytest.mark.skipif(SSHD is None, reason="openssh-server not installed (.ci/run installs it)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the test sshd logs in as the current user: needs root"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    d = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True, timeout=30)
    (d / "authorized_keys").write_text((d / "user_key.pub").read_text())
    os.chmod(d / "authorized_keys", 0o600)
    Path("/run/sshd").mkdir(exist_ok=True)  # privilege-separation dir sshd insists on
    port = _free_port()
    cfg = d / "sshd_config"
    cfg.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\n"
        "UsePAM no\nPidFile none\n"
    )
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"sshd exited: {proc.stderr.read()}")
            time.sleep(0.1)
    opts = f"-i {d / 'user_key'} -o UserKnownHostsFile={d / 'known_hosts'} -o IdentitiesOnly=yes"
    yield {"spec": f"root@127.0.0.1:{port}", "env": {"EPYC_SKILL_SSH_OPTS": opts}}
    proc.terminate()
    proc.wait(timeout=10)


def test_detect_over_ssh_matches_local(script, sshd):
    remote = script("detect.py", "--host", sshd["spec"], env=sshd["env"])
    local = script("detect.py")
    assert remote.code == 0, remote.doc
    assert remote.doc["target"] == sshd["spec"]
    # the login's home, which a plan for that host puts its paths under (issue 52); none for this machine
    assert remote.doc["home"] == __import__("pwd").getpwuid(0).pw_dir and local.doc["home"] is None
    for key in (
        "cpu_model",
        "cpu_family",
        "cpu_model_number",
        "epyc_generation",
        "zen_arch",
        "avx512",
        "avx512_bf16",
        "logical_cores",
        "physical_cores",
        "socket_count",
        "numa_node_count",
        "ram_total_gb",
        "is_supported_epyc",
        "node_ram_gb",
    ):
        assert remote.doc[key] == local.doc[key], key


def test_cpu_tune_over_ssh_plans_without_load(script, sshd):
    r = script("cpu_tune.py", "--host", sshd["spec"], env=sshd["env"])
    assert r.code == 0, r.doc
    assert "unknown" in r.doc["socket_choice_reason"] and r.doc["socket_busy_pct"] is None


def test_hostile_host_spec_never_reaches_ssh(script):
    r = script("detect.py", "--host", "x;touch /tmp/pwned")
    assert r.code == 1 and "not a host" in r.doc["error"]
