"""epyc.facts.hubcache: its decisions, tested in-process."""

import os
import sys
from pathlib import Path

import pytest
from conftest import _plan_with_hf_cache, hub_path_values, load_docs, plan_from_4
from epyc.errors import ScriptError
from epyc.facts import hubcache
from hypothesis import given
from hypothesis import strategies as st


# ---- F4: an empty or relative XDG_CACHE_HOME, or a relative HOME
def test_the_cache_folder_is_absolute_or_a_clear_error(monkeypatch, tmp_path):
    from epyc import errors
    from epyc.facts import hubcache

    monkeypatch.setenv("HOME", str(tmp_path))
    for xdg in ("", "rel-cache", "./x"):
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
        assert hubcache.cache_root() == tmp_path / ".cache"  # the XDG spec: invalid, ignored
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hubcache.cache_root() == tmp_path / "xdg"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "rel-home")
    with pytest.raises(errors.ScriptError, match="HOME 'rel-home' is not an absolute path"):
        hubcache.cache_root()


def test_an_hf_cache_that_is_a_file_is_refused(tmp_path):
    from epyc.errors import ScriptError
    from epyc.facts import hubcache

    f = tmp_path / "hf-file"
    f.write_text("x")
    with pytest.raises(ScriptError, match="is not a folder"):
        hubcache.resolve_hf_cache({"HF_HOME": str(f)})  # its hub would be inside a file
    with pytest.raises(ScriptError, match="is not a folder"):
        hubcache.resolve_hf_cache({"HF_HUB_CACHE": str(f)})
    with pytest.raises(ScriptError, match="HF_HOME is a relative path 'rel-hf'"):
        hubcache.resolve_hf_cache({"HF_HOME": "rel-hf"})  # each step would find its own folder


@pytest.mark.parametrize("env_name", ["HF_HOME", "HF_HUB_CACHE"])
def test_a_hub_folder_that_is_a_link_is_mounted_as_its_target(tmp_path, env_name):
    """F5: the link was mounted as a link: inside the container it named a host path that is not there."""
    from epyc.facts import hubcache

    target = tmp_path / "big-disk" / "hub"
    target.mkdir(parents=True)
    home = tmp_path / "hf"
    home.mkdir()
    (home / "hub").symlink_to(target)
    got = hubcache.resolve_hf_cache({env_name: str(home if env_name == "HF_HOME" else home / "hub")})
    assert got["path"] == str(target) and got["mount_subdir"] == "hub" and "is a link to" in got["note"], got


def test_an_empty_home_is_the_accounts_home_not_the_root(monkeypatch):
    import pwd

    from epyc.facts import hubcache

    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", "")
    assert hubcache.cache_root() == Path(pwd.getpwuid(os.getuid()).pw_dir) / ".cache"


@pytest.mark.parametrize("path", ["//var/run", "//", "//etc", "//root", "//proc"])
def test_a_doubled_leading_slash_never_gets_a_system_folder_mounted(script, inputs, rt, tmp_path, path):
    """F1: os.path.normpath keeps a leading '//', the runtime reads it as '/': //var/run (the docker socket's
    folder) passed every list and was mounted read-write."""
    r = _plan_with_hf_cache(script, inputs, rt, tmp_path, path)
    assert r.code == 1 and "argv" not in r.doc, r.doc


def test_hf_hub_cache_mounts_that_folder_only(tmp_path):
    """F2: HF_HUB_CACHE=$HOME/hub mounted its parent, the whole home; /mnt/hub was refused as '/mnt'."""
    from epyc.facts import hubcache

    hub = tmp_path / "home" / "hub"
    got = hubcache.resolve_hf_cache({"HF_HUB_CACHE": str(hub)})
    assert got["path"] == str(hub) and got["mount_subdir"] == "hub"


@pytest.mark.parametrize(
    "entries,foreign",
    [
        ([".bashrc", ".ssh", "hub", ".cache"], [".bashrc", ".ssh", "hub", ".cache"]),  # a home
        (["credentials", "config"], ["credentials", "config"]),  # ~/.aws
        (
            [
                "models--Qwen--Qwen3-0.6B",
                "datasets--a--b",
                "spaces--c--d",
                ".locks",
                "version.txt",
                "CACHEDIR.TAG",
                "version_diffusers_cache.txt",
                "lost+found",
            ],
            [],
        ),  # a hub cache, a disk's
        (["models--Qwen--Qwen3-0.6B", "notes.txt"], ["notes.txt"]),
    ],
)
def test_only_a_hub_cache_is_mounted_read_write(entries, foreign):
    """Seventeenth F2: no list of system folders names a home, ~/.aws, ~/.config or /nix/store: what the
    folder holds is checked instead, against what Hugging Face libraries put in a hub cache."""
    from epyc.facts.hubcache import foreign_cache_entries, hf_mount_problem

    assert foreign_cache_entries(entries) == foreign
    problem = hf_mount_problem("/c", {"real": "/c", "entries": entries, "error": None})
    assert (problem is None) == (not foreign) and all(repr(e) in (problem or "") for e in foreign[:5])
    assert hf_mount_problem("/c", {"real": "/c", "entries": None, "error": None}) is None  # not there yet


def test_the_legacy_hub_cache_variable_is_read_as_huggingface_hub_reads_it(tmp_path):
    """Eighteenth note: HUGGINGFACE_HUB_CACHE, which check_model and estimate honour through huggingface_hub,
    was ignored here: the container could mount another cache than the one checked."""
    from epyc.facts import hubcache

    old = tmp_path / "legacy"
    assert hubcache.resolve_hf_cache({"HUGGINGFACE_HUB_CACHE": str(old)})["path"] == str(old)
    assert hubcache.resolve_hf_cache({"HUGGINGFACE_HUB_CACHE": str(old), "HF_HUB_CACHE": str(tmp_path / "new")})[
        "path"
    ] == str(tmp_path / "new")


@pytest.mark.parametrize("folder", ["/root/.ssh", "/home/alice/.ssh/new", "/root/.docker", "/home/bob/.kube"])
def test_a_key_folder_is_never_mounted_even_empty_or_not_there_yet(folder):
    from epyc.facts.hubcache import bind_mount

    with pytest.raises(ScriptError, match="a key folder"):
        bind_mount(folder, "/root/.cache/huggingface/hub")


def test_nothing_under_run_is_mounted_or_a_state_dir():
    """Eighteenth F6: the /run/media exception let a state dir, or a cache docker would create, into /run."""
    from epyc.facts.hubcache import in_system_tree

    assert in_system_tree("/run/media/aud18/st")


# ---- nineteenth audit (36 cases, 4 findings), on the eighteenth's fixes
def test_huggingface_hubs_shared_blob_store_is_a_hub_caches_own(tmp_path):
    """F1: huggingface_hub 2.x keeps <hub>/blobs/ for every Xet-backed download: a real cache was refused."""
    from epyc.facts.hubcache import foreign_cache_entries

    hub = tmp_path / "hub"
    (hub / "models--Qwen--Qwen3-0.6B").mkdir(parents=True)
    try:  # made by the library itself where it has the store
        from huggingface_hub.utils import _shared_blobs

        _shared_blobs._ensure_shared_blobs_dir(str(hub))
    except (ImportError, AttributeError):
        (hub / "blobs").mkdir()
    assert (hub / "blobs").is_dir() and foreign_cache_entries(sorted(p.name for p in hub.iterdir())) == []


@pytest.mark.parametrize(
    "env",
    [
        {"HF_HUB_CACHE": "$FOO/hub", "FOO": "/tmp/a"},
        {"HF_HOME": "$FOO", "FOO": "~/yy"},
        {"HF_HUB_CACHE": "$FOO", "FOO": "~/yy"},
        {"HF_HOME": "~/zz"},
        {"HUGGINGFACE_HUB_CACHE": "~/${FOO}", "FOO": "q"},
        {"XDG_CACHE_HOME": "/tmp/xdg"},
        {"HF_HUB_CACHE": "$UNSET_VAR_X/h"},
        {"HF_HOME": "/tmp/$FOO", "FOO": "$BAR", "BAR": "b"},
    ],
)
def test_the_hub_cache_is_the_one_huggingface_hub_itself_reads(tmp_path, env):
    """A note left by the nineteenth audit: $VARS were expanded before `~`, the reverse of the Hub client,
    so a variable holding a `~` named another folder than the one the server downloads into. (The client
    expands an HF_HOME twice, a named hub cache once: compared here with the client itself.) Where the
    client's answer is a relative path (a variable holding a `~`, an unset variable), each step would look
    in another folder: refused, as a test below asserts."""
    import subprocess

    from epyc.facts import hubcache

    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "XDG_"))}
    hub = subprocess.run(
        [sys.executable, "-c", "import huggingface_hub.constants as c; print(c.HF_HUB_CACHE)"],
        env={**clean, **env},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if not os.path.isabs(hub.stdout.strip()):
        from epyc.errors import ScriptError

        with pytest.raises(ScriptError, match="relative path"):
            hubcache.resolve_hf_cache({**clean, **env})
        return
    cwd = os.getcwd()
    os.chdir(tmp_path)  # a relative result (a variable holding `~`) is relative here, as for the Hub client
    try:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # expandvars reads the process environment, as the Hub client does
        ours = hubcache.resolve_hf_cache({**clean, **env})["path"]
    finally:
        os.chdir(cwd)
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert ours == os.path.realpath(tmp_path / hub.stdout.strip()), (ours, hub.stdout)


def test_an_hf_cache_path_the_summary_cannot_show_is_not_mounted(tmp_path):
    """Notes of the twenty-first audit: a cache path with a newline was mounted (the summary's quoted
    command read as another folder); a FIFO as the cache was "a file"; `//x` was "a link to /x"."""
    from epyc.errors import ScriptError
    from epyc.facts import hubcache
    from epyc.facts.hubcache import bind_mount

    with pytest.raises(ScriptError) as err:
        bind_mount(str(tmp_path / "new\nline"), "/root/.cache/huggingface/hub")
    assert "printable" in err.value.error
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ScriptError) as err:
        hubcache._hf_cache_at(tmp_path / "fifo")
    assert "not a folder: a pipe, socket or device" in err.value.error
    (tmp_path / "hub").mkdir()
    assert hubcache._hf_cache_at(Path("/" + str(tmp_path / "hub")))["note"] is None


@pytest.mark.parametrize("cache", ["/", "/etc", "/var/run", "/run/docker", "/usr", "/root", "/x/../etc"])
def test_a_system_folder_is_never_mounted_as_the_hf_cache(inputs, cache):
    docs = load_docs(inputs)
    docs["validate"]["hf_cache"]["path"] = cache
    with pytest.raises(ScriptError, match="cannot mount"):
        plan_from_4(docs)
    assert hubcache.bind_mount("/root/.cache/huggingface", "/root/.cache/huggingface")[1].startswith("/root/.cache")


@pytest.mark.parametrize(
    "env",
    [
        {"HF_HUB_ETAG_TIMEOUT": "abc"},
        {"HF_HUB_DOWNLOAD_TIMEOUT": "abc"},
        {"HF_ENDPOINT": "http://127.0.0.1:80a"},
        {"HF_ENDPOINT": "http://bob:Zq9se/cretPW77@host"},
    ],
)
def test_hub_settings_huggingface_hub_cannot_import_with_are_a_clear_error(script, env):
    for name in ("check_model.py", "estimate_memory.py"):
        r = script(name, "--model", "someorg/somemodel", "--hub-timeout", "3", env=env)  # stdout: one document
        assert r.code == 1 and "HF_* settings" in r.doc["error"] and "Zq9se" not in r.stdout + r.stderr, (name, r.doc)


@given(
    st.dictionaries(
        st.sampled_from(["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"]),
        hub_path_values,
        max_size=4,
    ),
    st.sampled_from([None, "", "/root", "/srv/home", "relhome"]),
)
def test_a_hub_cache_is_refused_exactly_when_the_hub_client_would_read_a_relative_one(env, home):
    """hub_cache_env_problem judges the folder as huggingface_hub itself builds it: its constants module is
    reloaded under each environment and asked. And where it finds no problem, validate names the very
    folder the client reads (an empty HOME had validate name /root/.cache/... and the client /.cache/...)."""
    import importlib
    from unittest import mock

    import huggingface_hub.constants as constants
    from epyc import errors
    from epyc.facts import hubcache

    names = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME")
    full = {
        **{k: v for k, v in os.environ.items() if k not in names},
        "HUBTEST_ABS": "/srv/hf",
        "HUBTEST_TILDE": "~/x",
        "HUBTEST_REL": "rel",
        **env,
        **({} if home is None else {"HOME": home}),
    }
    full.pop("HUBTEST_UNSET", None)
    try:
        with mock.patch.dict(os.environ, full, clear=True):
            client = importlib.reload(constants).HF_HUB_CACHE
            problem = hubcache.hub_cache_env_problem(dict(os.environ))
            try:
                named = None if problem else hubcache.resolve_hf_cache(dict(os.environ))["path"]
            except errors.ScriptError:  # another refusal (a user ~nosuchuser names no home): no folder named
                named = None
    finally:
        importlib.reload(constants)
    home_decides = not any(k in env for k in names)
    assert (problem is None) == (
        os.path.isabs(client) and not (home_decides and home is not None and not os.path.isabs(home))
    ), (env, home, client, problem)
    if named is not None:
        assert named == os.path.realpath(client), (env, home, client, named)
