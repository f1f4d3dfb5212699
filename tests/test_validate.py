"""validate.py: runtime order, CPU gate, stack compatibility, HF cache, ports, ELF execstack.
The container runtimes here are the FAKE in tests/fakes, for runtime choices a real engine cannot show here
(podman, sudo docker, a daemon that is down); test_e2e_container.py validates against the real engine."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    ROOT,
    calls,
    container_plan,
    detect_file,
    load_epyc_doc,
    run_script,
)
from epyc import bundle
from epyc.facts import hubcache, preload, runtimes, validation

FAKE_BIN = ROOT / "tests" / "fakes" / "bin"
PINNED = "amdih/zendnn_zentorch:vllm_v0.25.1_zentorch_v2.11.0.3_ubuntu22.04_2026_ww30"


@pytest.fixture
def fake_rt(tmp_path, monkeypatch):
    d = tmp_path / "rt"
    d.mkdir()
    env = {"FAKE_RT_DIR": str(d), "PATH": f"{FAKE_BIN}:{os.environ['PATH']}", "DETECT_JSON": str(detect_file(tmp_path))}
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


def test_the_local_image_not_built_yet_is_fixed_by_the_line_that_builds_it_never_a_pull(script, fake_rt):
    """validate --image localhost/... before setup_host_stack.py --image: the fix builds it (a pull of localhost/...
    would fail or reach whatever listens there)."""
    row = bundle.load_epyc()["stacks"]["local_image"]
    r = run_validate(script, fake_rt[1], "--image", row["image"])
    (err,) = [e for e in r.doc["errors"] if e["check"] == "image"]
    assert r.code == 1 and err["fix"] == row["setup"] + ", then re-run validate.py" and "pull" not in err["fix"]


def test_no_avx512_blocks_unless_stock_was_accepted(script, fake_rt):
    d, env = fake_rt
    r = run_validate(script, env, "--avx512", "false", "--generation", "Milan")
    assert r.code == 1 and r.doc["ready"] is False and r.doc["zentorch_capable"] is False
    assert "--stock" in next(e for e in r.doc["errors"] if e["check"] == "cpu")["fix"]
    s = run_validate(script, env, "--avx512", "false", "--generation", "Milan", "--stock")
    assert s.code == 0 and s.doc["path"] == "container" and s.doc["backend"] == "stock"
    assert s.doc["requires_confirmation"] is False and not s.doc["confirmations"]  # --stock is the user's OK
    assert [c["check"] for c in s.doc["confirmed"]] == ["cpu"]
    assert s.doc["image"] == "vllm/vllm-openai-cpu:v0.32.0-x86_64" and s.doc["zentorch_capable"] is False


def test_an_intel_box_asking_for_stock_with_no_runtime_has_one_cause_and_its_ok_recorded(script, fake_rt, tmp_path):
    """A Xeon asking for the stock path before any runtime exists: the runtime error is the one cause
    (compatibility unknown, not `blocked`, which SKILL.md's Step 2 reads as stop), and --stock, the user's OK
    given in the request, is recorded as given: nothing is left to confirm."""
    d, env = fake_rt
    (d / "daemon_down").touch()
    xeon = detect_file(tmp_path, "xeon_8480")
    r = script("validate.py", "--python", sys.executable, "--detect", str(xeon), "--stock", env=env)
    assert r.code == 1 and [e["check"] for e in r.doc["errors"]] == ["runtime"], r.doc
    assert "setup_host_stack.py --stock" in r.doc["fix"]
    assert r.doc["compatibility"] == {"status": "unknown", "message": "no runtime to probe (the runtime error)"}
    assert r.doc["requires_confirmation"] is False and not r.doc["confirmations"]
    assert [c["check"] for c in r.doc["confirmed"]] == ["cpu"] and "explicit request" in r.doc["confirmed"][0][
        "message"
    ]


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
    assert (
        validation.stack_compatibility({"vllm": "0.32.0+cpu", "platform": zen}, "Turin", "0.32.0", False)["status"]
        == "proceed"
    )
    stock = {"vllm": "0.32.0", "platform": "vllm.platforms.cpu.CpuPlatform"}
    assert validation.stack_compatibility(stock, "Genoa", "0.32.0", False)["status"] == "blocked"
    assert validation.stack_compatibility(stock, "Milan", "0.32.0", True)["status"] == "proceed"
    assert (
        validation.stack_compatibility({"vllm": "0.31.0", "platform": zen}, "Venice", "0.32.0", False)["status"]
        == "confirmation_required"
    )


def test_runtime_order():
    assert runtimes.choose_runtime(True, True, True, True) == "docker"
    assert runtimes.choose_runtime(False, True, True, True) == "podman"
    assert runtimes.choose_runtime(False, False, True, True) == "sudo docker"
    assert runtimes.choose_runtime(False, False, False, True) == "host"
    assert runtimes.choose_runtime(False, False, False, False) is None


def test_hf_cache_follows_links_and_honours_env(tmp_path):
    real = tmp_path / "real-hf"
    real.mkdir()
    link = tmp_path / "hf-link"
    link.symlink_to(real)
    out = hubcache.resolve_hf_cache({"HF_HOME": str(link)})
    assert out["path"] == str(real / "hub")  # the hub cache only
    assert "link" in out["note"] and out["nfs"] is False
    assert hubcache.resolve_hf_cache({"HF_HUB_CACHE": str(real / "hub")})["path"] == str(
        real / "hub"
    )  # itself, not its parent


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
    assert preload.elf_has_execstack(_so(tmp_path, "rwe.so", True)) is True
    assert preload.elf_has_execstack(_so(tmp_path, "rw.so", False)) is False
    assert preload.elf_has_execstack(b"not an elf at all" * 8) is None


def test_execstack_scan_finds_vllm_C_in_an_env(tmp_path):
    """A fake env whose vllm package carries an execstack _C.abi3.so; validate flags it with the fix."""
    pkg = tmp_path / "site" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_C.abi3.so").write_bytes(_so(tmp_path, "c.so", True))
    py = tmp_path / "python"
    py.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "site"} exec {sys.executable} "$@"\n')
    py.chmod(0o755)
    assert preload.execstack_libs(str(py)) == [str(pkg / "_C.abi3.so")]


def test_hf_token_presence_only(script, fake_rt):
    d, env = fake_rt
    r = run_validate(script, {**env, "HF_TOKEN": "hf_validate_secret_999"})
    assert r.doc["hf_token_set"] is True
    assert "hf_validate_secret_999" not in r.stdout + r.stderr


@pytest.mark.parametrize(
    "args,needle",
    [(["--avx512", "maybe"], "boolean"), (["--port-start", "0"], "port"), (["--runtime", "lxc"], "bad arguments")],
)
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


def test_vllms_folder_as_an_interpreter_names_it_is_probed_like_any_answer(tmp_path):
    """validate.py asked the user's --python where vllm lives and opened every _C*.so there: a FIFO named
    _C.so blocked it forever; a 300-character name was an internal error."""
    import os
    import subprocess
    import sys

    pkg = tmp_path / "site" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    os.mkfifo(pkg / "_C.abi3.so")
    py = tmp_path / "python"
    py.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "site"} exec {sys.executable} "$@"\n')
    py.chmod(0o755)
    liar = tmp_path / "liar"  # answers the probe with a folder no file system holds
    liar.write_text('#!/bin/sh\necho \'@@VLLMDIR@@{"folder": "/tmp/' + "n" * 300 + "\"}'\n")
    liar.chmod(0o755)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from epyc.facts import preload; "
        "print(preload.execstack_libs(sys.argv[2]), preload.execstack_libs(sys.argv[3]))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(bundle.ROOT / "scripts"), str(py), str(liar)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout.strip() == "[] []", r.stdout + r.stderr


def test_a_cache_path_too_long_to_hold_a_folder_is_a_clear_error(script, tmp_path):
    """An HF_HOME too long for the folders under it: named, never an internal error."""
    deep = str(tmp_path) + "/" + "/".join(["d" * 200] * 25)
    deep = deep[:4091] + "d"  # 4,092 bytes whatever tmp_path's length (xdist's is longer): HF_HOME/hub is 4,096
    assert len(deep) == 4092 and "//" not in deep
    r = script("validate.py", "--python", sys.executable, env={"HF_HOME": deep})
    assert r.code == 1 and "too long" in r.doc["error"].lower(), r.doc


def test_validate_refuses_a_home_as_the_containers_hub_cache_and_takes_a_busy_hf_home(script, tmp_path):
    """Seventeenth F2: HF_HUB_CACHE=/home/alice passed; validate now says why, before any plan. Eighteenth
    F2: an HF_HOME holding Gradio's, trackio's or a sandbox's files was refused: only its hub is mounted."""
    from conftest import detect_file

    home = tmp_path / "alice"
    (home / ".ssh").mkdir(parents=True)
    (home / ".bashrc").write_text("x")
    fake = ROOT / "tests" / "fakes" / "bin"
    rtd = tmp_path / "rt"
    rtd.mkdir()
    env = {"FAKE_RT_DIR": str(rtd), "PATH": f"{fake}:{os.environ['PATH']}", "HF_HUB_CACHE": str(home)}
    det = str(detect_file(tmp_path))
    r = script("validate.py", "--python", sys.executable, "--detect", det, env=env)
    assert r.code == 1 and "'.bashrc'" in r.doc["error"] and "read-write" in r.doc["error"], r.doc
    assert "HF_HUB_CACHE" in r.doc["fix"]
    hf_home = tmp_path / "hf-home"
    for entry in ("gradio", "trackio", "sandbox", "lighteval", "token", "xet", "hub/models--a--b"):
        (hf_home / entry).mkdir(parents=True)
    env.pop("HF_HUB_CACHE")
    r = script("validate.py", "--python", sys.executable, "--detect", det, env={**env, "HF_HOME": str(hf_home)})
    assert r.code == 0 and r.doc["hf_cache"]["path"] == str(hf_home / "hub"), r.doc


def test_up_with_python_serves_on_the_host_path_even_when_docker_answers(inputs, rt, tmp_path, monkeypatch):
    """A note of the twenty-third audit: `up --python VENV` on a host whose docker answered planned a container,
    and the interpreter the user named was probed for nothing. up now asks validate for the host path. The
    validate step here is the real validate.py, with the fake docker on PATH answering `docker info`."""
    import argparse

    from conftest import load_docs
    from epyc.errors import ScriptError
    from epyc.verbs import up

    docs = load_docs(inputs)
    _, env = rt
    seen = {}

    def step(script, args, phase, run_dir, allow_fail=False):
        if phase != "validate":
            return docs[phase]
        args = [str(inputs["detect"]) if a.endswith("detect.json") else a for a in args]
        seen["args"] = args
        seen["doc"] = run_script("validate.py", *args, env=env).doc
        raise ScriptError("the test stops here", "-")

    monkeypatch.setattr(up, "step", step)
    a = argparse.Namespace(
        model=docs["check_model"]["model"],
        state_dir=str(tmp_path / "up"),
        stock=False,
        python=sys.executable,
        yes=True,
        max_model_len=None,
        num_prompts=1,
        port=None,
        expose=False,
        tls_cert=None,
        tls_key=None,
        tls_ca=None,
        tls_name=None,
        plain_http=False,
        served_model_name="m",
        api_key_env=None,
        throughput_flags=False,
        kernel_log=False,
        timeout=30,
        dtype=None,
    )
    with pytest.raises(ScriptError, match="the test stops here"):
        up.up(a, load_epyc_doc())
    assert seen["args"][-4:] == ["--python", sys.executable, "--runtime", "host"]
    assert seen["doc"]["path"] != "container" and "docker" not in seen["doc"]["runtime_detail"], seen["doc"]
    # without --python, the documented order: the fake docker answers, so the container path
    a.python = None
    with pytest.raises(ScriptError, match="the test stops here"):
        up.up(a, load_epyc_doc())
    assert "--runtime" not in seen["args"] and seen["doc"]["path"] == "container", seen["doc"]


def test_validate_gives_a_relative_python_back_absolute_and_unresolved(script, inputs):
    """validate.py --python .venv/bin/python answered with that relative path, which launch plan and up then
    refused ("pass the unmodified output of validate.py": it was unmodified). It now answers with the absolute
    path, not resolved: a venv's python is a link, and only the link's path finds the venv's packages."""
    import os
    import sys

    from conftest import ROOT

    rel = os.path.relpath(sys.executable, ROOT)  # the scripts run in the bundle's folder
    r = script("validate.py", "--detect", str(inputs["detect"]), "--python", rel, "--runtime", "host")
    want = os.path.join(str(ROOT), rel)  # (this interpreter has no vLLM: the probe names it, and no "python")
    assert r.doc["runtime_detail"]["host"].startswith(want + ": ") and os.path.isabs(want), r.doc["runtime_detail"]


def test_skill_step_3_runs_on_the_stock_container_path_before_the_image_is_pulled(tmp_path, inputs, rt):
    """validate is ready on the stock container path with the image not pulled, its stack read from the pinned
    tag (vX.Y.Z): SKILL.md's Step 3, run as written in that run folder, judges by that version's snapshot,
    saying the image is not pulled."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from conftest import ROOT, run_script
    from docs import commands
    from epyc.bundle import load_epyc

    _, env = rt  # a docker that answers, with no image pulled
    run = {"EPYC_RUN": str(tmp_path / "run")}
    val = run_script("validate.py", "--detect", str(inputs["detect"]), "--stock", env={**env, **run})
    assert val.code == 0 and val.doc["runtime"] == "docker" and val.doc["stack"]["vllm"] == "0.32.0", val.doc
    line = next(c.line for c in commands("SKILL.md") if c.script == "check_model.py" and c.tag is None)
    model = str(Path(inputs["detect"]).parent / "models" / "Qwen3-0.6B")
    shell_env = {**os.environ, **env, **run, "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"}
    res = subprocess.run(
        ["bash", "-c", line.replace(load_epyc()["default_model"], model)],
        env=shell_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    doc = json.loads((tmp_path / "run" / "check_model.json").read_text())
    assert (
        res.returncode == 0
        and doc["kind"] == "text"
        and doc["vllm_version"] == load_epyc()["stock_image"]["vllm_version"]
    ), doc
    assert any("is not pulled" in n and "snapshot" in n for n in doc["notes"]), doc["notes"]


def test_validate_expands_a_tilde_in_python(script, inputs, tmp_path):
    """`--python=~/venv/bin/python` (bash leaves that ~ alone) passed the existence check, which expands it,
    and came back as CWD/~/venv/bin/python."""
    import sys

    (tmp_path / "py").symlink_to(sys.executable)
    r = script(
        "validate.py",
        "--detect",
        str(inputs["detect"]),
        "--python=~/py",
        "--runtime",
        "host",
        env={"HOME": str(tmp_path)},
    )
    assert r.doc["runtime_detail"]["host"].startswith(f"{tmp_path}/py: "), r.doc["runtime_detail"]


# ---- F4, F5: numbers that are not JSON, upstream errors that are not text
@pytest.mark.parametrize(
    "body", ['{"ram_gb": NaN}', '{"ram_gb": Infinity}', '{"ram_gb": -Infinity}', '{"ram_gb": 1e400}']
)
def test_a_non_finite_number_in_an_input_document_is_refused(script, tmp_path, body):
    doc = tmp_path / "detect.json"
    doc.write_text(body)
    r = script("validate.py", "--detect", str(doc), "--python", sys.executable)
    assert r.code == 1 and "refuse" in r.doc["error"]
    json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"{c} in the output"))  # strict JSON out


def test_rootless_podman_cpuset_rejection_drops_the_flags(script, inputs, rt, tmp_path):
    d, env = rt
    (d / "daemon_down").touch()
    (d / "podman_can_run").touch()
    (d / "cpuset_rejected").touch()
    val = run_script("validate.py", "--python", sys.executable, "--detect", str(inputs["detect"]), env=env)
    assert val.doc["runtime"] == "podman"
    Path(inputs["validate"]).write_text(val.stdout)
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    assert plan["argv"][0] == "podman" and "--cpuset-mems=1" in plan["argv"]
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env)
    assert r.code == 0 and "cpuset" in r.doc["warnings"][0]
    runs = [c["argv"] for c in calls(d) if c["argv"][0] == "run" and "--rootfs" not in c["argv"]]
    assert any(a.startswith("--cpuset") for a in runs[0]) and not any(a.startswith("--cpuset") for a in runs[-1])
    assert "VLLM_CPU_OMP_THREADS_BIND=96-191" in runs[-1]  # thread binding still applies
    # podman made the refused run's container (exited): it is removed by its id before the retry takes the name
    removals = [c["argv"] for c in calls(d) if c["argv"][0] == "rm"]
    assert removals == [["rm", "-f", "e" * 64]] and r.doc["container_id"] == "f" * 64, removals


def test_no_host_stack_is_named_as_the_venv_to_make_not_the_bundles_own(script, inputs, tmp_path):
    """With no runtime and no host stack yet, the runtime error names the venv setup_host_stack.py makes: the
    bundle's own .venv (the scripts' libraries) is never probed as if it could serve."""
    r = script(
        "validate.py", "--detect", str(inputs["detect"]), "--runtime", "host", env={"XDG_CACHE_HOME": str(tmp_path)}
    )
    assert r.code == 1 and f"no host stack venv at {tmp_path}/serving-llms-on-epyc/" in r.doc["error"], r.doc
    assert ".venv" not in r.doc["error"] and "setup_host_stack.py" in r.doc["fix"]


@pytest.mark.parametrize("home", [None, "/home/al ice;id", "/home/bob"])
def test_another_hosts_home_not_read_is_said_as_assumed_never_silently_roots(tmp_path, home):
    """Review of issue 52: a capture without HOME, or with one a shell would read (dropped), became /root unsaid."""
    import sysroots
    import validate as validate_cli
    from epyc.bundle import load_epyc
    from epyc.facts import cpuid, hostfacts

    root = sysroots.build(tmp_path / "sr", sysroots.HOSTS["genoa_9654_2s_smt"])
    if home:
        (root / "HOME").write_text(home + "\n")
    detected = cpuid.report(hostfacts.gather(hostfacts.Sysroot(root), "capture:box.tar", live=False), load_epyc())
    (tmp_path / "d.json").write_text(json.dumps(detected))
    doc, _ = validate_cli.main(
        ["--detect", str(tmp_path / "d.json"), "--runtime", "docker", "--run", str(tmp_path / "r")]
    )
    said = [w for w in doc["warnings"] if w["check"] == "home"]
    if home == "/home/bob":
        assert doc["home"] == home and not said and "home (assumed /root)" not in doc["deferred"]
    else:
        assert doc["home"] == "/root" and "home (assumed /root)" in doc["deferred"]
        assert "planned under /root" in said[0]["message"] and "--capture" in said[0]["fix"]
