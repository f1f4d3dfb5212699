"""validate.py: runtime order, CPU gate, stack compatibility, HF cache, ports, ELF execstack.
The container runtimes here are the FAKE in tests/fakes, for runtime choices a real engine cannot show here
(podman, sudo docker, a daemon that is down); test_e2e_container.py validates against the real engine."""
import os
import socket
import subprocess
import sys

import pytest

import validate as v
from conftest import ROOT, detect_file

FAKE_BIN = ROOT / "tests" / "fakes" / "bin"
PINNED = "amdih/zendnn_zentorch:vllm_v0.25.1_zentorch_v2.11.0.3_ubuntu22.04_2026_ww30"


@pytest.fixture
def fake_rt(tmp_path, monkeypatch):
    d = tmp_path / "rt"
    d.mkdir()
    env = {"FAKE_RT_DIR": str(d), "PATH": f"{FAKE_BIN}:{os.environ['PATH']}",
           "DETECT_JSON": str(detect_file(tmp_path))}
    return d, env


def run_validate(script, env, *args):
    # --python this test interpreter: it has no vLLM, so the host path is unavailable unless stated;
    # --detect a Genoa's facts, so the CPU gate is the fixture's, not this session's CPU
    return script("validate.py", "--python", sys.executable, "--detect", env["DETECT_JSON"], *args, env=env)


def test_docker_daemon_up_gives_the_container_path_with_the_stack_from_the_tag(script, fake_rt):
    d, env = fake_rt
    r = run_validate(script, env)
    assert r.code == 0 and r.doc["ready"] and r.doc["runtime"] == "docker" and r.doc["path"] == "container"
    assert r.doc["image"] == PINNED
    assert r.doc["stack"]["vllm"] == "0.25.1" and r.doc["stack"]["zentorch"] == "2.11.0.3"
    assert r.doc["stack"]["source"].startswith("tag:") and r.doc["compatibility"]["status"] == "proceed"
    assert any(a["check"] == "image" for a in r.doc["advisories"])
    assert r.doc["hf_cache"]["path"].startswith("/")


def test_nothing_runs_anywhere(script, fake_rt):
    d, env = fake_rt
    (d / "daemon_down").touch()
    r = run_validate(script, env)
    assert r.code == 1 and r.doc["ready"] is False and r.doc["runtime"] is None
    err = next(e for e in r.doc["errors"] if e["check"] == "runtime")
    assert "docker group" in err["fix"] and "setup_host_stack.py" in err["fix"]
    assert "setrlimit" in r.doc["runtime_detail"]["podman"]  # podman present but cannot start containers
    calls = (d / "calls.jsonl").read_text()
    assert "sudo" not in calls  # never escalates through the fake either


def test_podman_that_can_run_is_chosen_when_docker_is_down(script, fake_rt):
    d, env = fake_rt
    (d / "daemon_down").touch()
    (d / "podman_can_run").touch()
    r = run_validate(script, env)
    assert r.doc["runtime"] == "podman" and r.doc["ready"]


def test_local_image_is_probed_and_a_failed_probe_is_reported(script, fake_rt):
    d, env = fake_rt
    (d / "images").write_text(PINNED + "\n")
    r = run_validate(script, env)
    assert any(w["check"] == "image" and "could not probe" in w["message"] for w in r.doc["warnings"])
    assert '"--entrypoint", "python3"' in (d / "calls.jsonl").read_text()


def test_no_avx512_blocks_unless_stock_was_accepted(script, fake_rt):
    d, env = fake_rt
    r = run_validate(script, env, "--avx512", "false", "--generation", "Milan")
    assert r.code == 1 and r.doc["ready"] is False and r.doc["zentorch_capable"] is False
    assert "--stock" in next(e for e in r.doc["errors"] if e["check"] == "cpu")["fix"]
    s = run_validate(script, env, "--avx512", "false", "--generation", "Milan", "--stock")
    assert s.code == 0 and s.doc["path"] == "container" and s.doc["backend"] == "stock"
    assert s.doc["requires_confirmation"] is True
    assert s.doc["image"] == "vllm/vllm-openai-cpu:latest-x86_64" and s.doc["zentorch_capable"] is False


def test_unvalidated_generation_needs_confirmation(script, fake_rt):
    d, env = fake_rt
    r = run_validate(script, env, "--generation", "Bergamo", "--avx512", "true")
    assert r.code == 0 and r.doc["requires_confirmation"] and r.doc["confirmations"][0]["check"] == "cpu"


def test_venice_on_another_vllm_needs_confirmation(script, fake_rt):
    d, env = fake_rt
    other = "amdih/zendnn_zentorch:vllm_v0.30.0_zentorch_v2.12.0.0_ubuntu22.04"
    (d / "images").write_text(other + "\n")  # another image must be local: only the pinned tags are trusted
    r = run_validate(script, env, "--generation", "Venice", "--avx512", "true", "--image", other)
    assert r.doc["compatibility"]["status"] == "confirmation_required" and r.doc["requires_confirmation"]
    ok = run_validate(script, env, "--generation", "Venice", "--avx512", "true")
    assert ok.doc["compatibility"]["status"] == "proceed" and not ok.doc["requires_confirmation"]


def test_stack_compatibility_rules():
    zen = "vllm.platforms.zen_cpu.ZenCpuPlatform"
    assert v.stack_compatibility({"vllm": "0.32.0+cpu", "platform": zen}, "Turin", "0.32.0", False)["status"] == "proceed"
    stock = {"vllm": "0.32.0", "platform": "vllm.platforms.cpu.CpuPlatform"}
    assert v.stack_compatibility(stock, "Genoa", "0.32.0", False)["status"] == "blocked"
    assert v.stack_compatibility(stock, "Milan", "0.32.0", True)["status"] == "proceed"
    assert v.stack_compatibility({"vllm": "0.31.0", "platform": zen}, "Venice", "0.32.0", False)["status"] == \
        "confirmation_required"


def test_runtime_order():
    assert v.choose_runtime(True, True, True, True) == "docker"
    assert v.choose_runtime(False, True, True, True) == "podman"
    assert v.choose_runtime(False, False, True, True) == "sudo docker"
    assert v.choose_runtime(False, False, False, True) == "host"
    assert v.choose_runtime(False, False, False, False) is None


def test_hf_cache_follows_links_and_honours_env(tmp_path):
    real = tmp_path / "real-hf"
    real.mkdir()
    link = tmp_path / "hf-link"
    link.symlink_to(real)
    out = v.resolve_hf_cache({"HF_HOME": str(link)})
    assert out["path"] == str(real / "hub")  # the hub cache only
    assert "link" in out["note"] and out["nfs"] is False
    assert v.resolve_hf_cache({"HF_HUB_CACHE": str(real / "hub")})["path"] == str(real / "hub")  # itself, not its parent


def test_port_skips_a_busy_one(script, fake_rt):
    d, env = fake_rt
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        r = run_validate(script, env, "--port-start", str(busy))
        assert r.doc["port"] != busy and r.doc["port"] > busy


def _so(tmp_path, name, execstack):
    src = tmp_path / "x.c"
    src.write_text("int f(void) { return 1; }\n")
    out = tmp_path / name
    flags = ["-z", "execstack"] if execstack else ["-z", "noexecstack"]
    subprocess.run(["gcc", "-shared", "-fPIC", *flags, "-o", str(out), str(src)], check=True, timeout=60)
    return out.read_bytes()


def test_elf_execstack_on_real_shared_objects(tmp_path):
    assert v.elf_has_execstack(_so(tmp_path, "rwe.so", True)) is True
    assert v.elf_has_execstack(_so(tmp_path, "rw.so", False)) is False
    assert v.elf_has_execstack(b"not an elf at all" * 8) is None


def test_execstack_scan_finds_vllm_C_in_an_env(tmp_path):
    """A fake env whose vllm package carries an execstack _C.abi3.so; validate flags it with the fix."""
    pkg = tmp_path / "site" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_C.abi3.so").write_bytes(_so(tmp_path, "c.so", True))
    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'site'} exec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    assert v.execstack_libs(str(py)) == [str(pkg / "_C.abi3.so")]


def test_hf_token_presence_only(script, fake_rt):
    d, env = fake_rt
    r = run_validate(script, {**env, "HF_TOKEN": "hf_validate_secret_999"})
    assert r.doc["hf_token_set"] is True
    assert "hf_validate_secret_999" not in r.stdout + r.stderr


@pytest.mark.parametrize("args,needle", [(["--avx512", "maybe"], "boolean"), (["--port-start", "0"], "port"),
                                         (["--runtime", "lxc"], "bad arguments")])
def test_bad_arguments(script, fake_rt, args, needle):
    d, env = fake_rt
    r = run_validate(script, env, *args)
    assert r.code == 1 and needle in r.doc["error"]


def test_missing_python(script, fake_rt):
    d, env = fake_rt
    r = script("validate.py", "--python", "/nonexistent/python", "--detect", env["DETECT_JSON"], env=env)
    assert r.code == 1 and "setup_host_stack.py" in r.doc["fix"]


def test_validate_for_a_host_that_is_not_this_one_defers_what_only_the_host_can_say(script, tmp_path):
    """The CPU gate and the stack pins still apply to a described host; its runtime, port, HF cache and
    libraries are assumed and listed, never probed on this machine."""
    det = tmp_path / "d.json"
    det.write_text(script("detect.py", "--spec", "9654", "--sockets", "2", "--ram-gb-per-socket", "384").stdout)
    r = script("validate.py", "--detect", str(det), env={"PATH": "/nonexistent"})  # no docker here to probe
    assert r.code == 0 and r.doc["target"].startswith("spec:EPYC 9654")
    assert r.doc["runtime"] == "docker" and r.doc["path"] == "container" and r.doc["stack"]["source"].startswith("tag:")
    assert "port" in r.doc["deferred"] and any(a["check"] == "deferred" for a in r.doc["advisories"])
    assert r.doc["compatibility"]["status"] == "proceed"
    milan = tmp_path / "m.json"
    milan.write_text(script("detect.py", "--spec", "7763", "--ram-gb-per-socket", "256").stdout)
    m = script("validate.py", "--detect", str(milan), "--runtime", "host")
    assert m.code == 1 and "no AVX-512" in m.doc["error"]  # the CPU gate still applies
    s = script("validate.py", "--detect", str(milan), "--runtime", "host", "--stock")
    assert s.code == 0 and s.doc["stack"]["zentorch"] is None and s.doc["stack"]["source"].startswith("assumed:")
