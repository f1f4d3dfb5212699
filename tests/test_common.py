"""The shared module: cpulists, argv running, host specs, error documents."""
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

import common
from conftest import ROOT


@given(st.sets(st.integers(min_value=0, max_value=4096), max_size=300))
def test_cpulist_round_trip(cpus):
    text = common.format_cpulist(cpus)
    assert common.parse_cpulist(text) == sorted(cpus)
    # canonical: formatting the parse gives the same text back
    assert common.format_cpulist(common.parse_cpulist(text)) == text


@pytest.mark.parametrize("text,expected", [
    ("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]),
    ("5", [5]),
    ("", []),
    (" 0-1\n", [0, 1]),
    ("3,1,2", [1, 2, 3]),
])
def test_parse_cpulist_examples(text, expected):
    assert common.parse_cpulist(text) == expected


@pytest.mark.parametrize("bad", ["a", "3-1", "1,,2", "-1", "1-", "0-99999999", "1 2"])
def test_parse_cpulist_rejects(bad):
    with pytest.raises(ValueError):
        common.parse_cpulist(bad)


@given(st.text(max_size=40))
def test_parse_cpulist_garbage_is_valueerror_or_list(text):
    try:
        out = common.parse_cpulist(text)
    except ValueError:
        return
    assert out == sorted(set(out))


def test_format_cpulist_collapses():
    assert common.format_cpulist([11, 10, 0, 1, 2, 3, 8, 3]) == "0-3,8,10-11"


def test_run_never_raises_on_missing_binary_or_timeout():
    r = common.run(["definitely-not-a-binary-xyz"], timeout=5)
    assert r.failure == "not_found" and not r.ok
    r = common.run(["sleep", "5"], timeout=0.3)
    assert r.failure == "timeout" and r.returncode is None


def test_a_timeout_takes_the_whole_process_group_and_returns():
    """A child that forked a grandchild holding our pipe (a shell, sudo, ssh): the kill takes the group,
    so reading the pipe after it does not wait for the grandchild's 617 s."""
    import time
    import psutil
    import os
    naptime = f"617.{os.getpid()}"  # this run's own: a grandchild another run left behind is not ours
    t0 = time.monotonic()
    r = common.run(["bash", "-c", f"echo started; sleep {naptime} & wait"], timeout=1)
    assert r.failure == "timeout" and time.monotonic() - t0 < 15
    time.sleep(0.2)
    left = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", naptime]]
    assert not left, left


@pytest.mark.parametrize("spec,user,host,port", [
    ("box", None, "box", None),
    ("me@box.example:2222", "me", "box.example", 2222),
    ("root@127.0.0.1", "root", "127.0.0.1", None),
])
def test_parse_host(spec, user, host, port):
    t = common.parse_host(spec)
    assert (t.user, t.host, t.port) == (user, host, port)


@pytest.mark.parametrize("bad", ["-oProxyCommand=sh", "a b", "me@", "box:99999", "box;rm", ""])
def test_parse_host_rejects_option_like_and_garbage(bad):
    with pytest.raises(common.ScriptError):
        common.parse_host(bad)


def test_ssh_argv_quotes_remote_words():
    argv = common.ssh_argv(common.parse_host("me@box:2222"), ["sh", "-c", "echo $HOME; cat /x"])
    assert argv[:2] == ["ssh", "-o"] and "BatchMode=yes" in argv and "-p" in argv
    assert argv[-2] == "--"
    assert argv[-1] == "sh -c 'echo $HOME; cat /x'"


def test_read_json_input_rejects_error_documents(tmp_path):
    f = tmp_path / "x.json"
    f.write_text(json.dumps({"error": "boom", "fix": "do it"}))
    with pytest.raises(common.ScriptError) as e:
        common.read_json_input(str(f), "detect")
    assert "boom" in e.value.error and e.value.fix == "do it"
    f.write_text("[1]")
    with pytest.raises(common.ScriptError):
        common.read_json_input(str(f), "detect")
    with pytest.raises(common.ScriptError):
        common.read_json_input(str(tmp_path / "missing.json"), "detect")


def test_epyc_json_matches_its_schema():
    import jsonschema
    from conftest import SCHEMAS
    jsonschema.validate(common.load_epyc(), json.loads((SCHEMAS / "epyc.json").read_text()))


def test_runtime_argv_never_prompts_for_sudo():
    assert common.runtime_argv("sudo docker") == ["sudo", "-n", "docker"]
    assert common.runtime_argv("podman") == ["podman"]


def test_missing_dependency_is_a_json_error_with_the_install_fix(tmp_path):
    """A user running the scripts with a python3 that lacks the dependencies gets told how to fix it."""
    import subprocess
    import sys
    from conftest import SCRIPTS
    shadow = tmp_path / "psutil.py"  # an import of psutil that fails like a missing package
    shadow.write_text("raise ModuleNotFoundError(\"No module named 'psutil'\", name='psutil')\n")
    res = subprocess.run([sys.executable, str(SCRIPTS / "detect.py")], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and "psutil" in doc["error"] and "scripts/bootstrap.py" in doc["fix"]


def test_a_bare_python3_runs_the_scripts_through_the_bundle_venv(tmp_path):
    """SKILL.md's step 0 made .venv; a python3 without the dependencies (a fresh venv here) then runs
    `python3 scripts/detect.py` as written: the script re-runs itself in the bundle venv."""
    import subprocess
    import sys
    from conftest import ROOT, SCRIPTS
    assert (ROOT / ".venv" / "bin" / "python").exists(), "tests/run.sh runs scripts/bootstrap.py first"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=120)
    bare = tmp_path / "bare" / "bin" / "python3"
    assert subprocess.run([str(bare), "-c", "import psutil"], capture_output=True, timeout=60).returncode != 0
    res = subprocess.run([str(bare), str(SCRIPTS / "detect.py")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout)["logical_cores"] >= 1
    boot = subprocess.run([str(bare), str(SCRIPTS / "bootstrap.py"), "--check"], capture_output=True, text=True,
                          timeout=60)
    doc = json.loads(boot.stdout)
    assert boot.returncode == 0 and doc["ready"] and doc["venv"] == str(ROOT / ".venv") and not doc["missing"]


def test_run_probe_reads_the_marked_json_line_or_says_why_not():
    import sys
    doc, why = common.run_probe([sys.executable], "print('noise'); print('@@X@@{\"a\": 1}')", "@@X@@", 30)
    assert (doc, why) == ({"a": 1}, "")
    doc, why = common.run_probe([sys.executable], "import sys; sys.exit('boom')", "@@X@@", 30)
    assert doc is None and why == "boom"
    doc, why = common.run_probe([sys.executable], "print('@@X@@{oops')", "@@X@@", 30)
    assert doc is None and "malformed" in why
    doc, why = common.run_probe(["/no/such/python"], "pass", "@@X@@", 30)
    assert doc is None and "not found" in why


def test_a_home_of_an_unknown_user_is_an_error_not_a_crash(tmp_path):
    """Path.expanduser raises RuntimeError for ~nosuchuser: every path the scripts expand goes through user_path."""
    for call in (lambda: common.output_dir("~no-such-user-here/x", "--out"),
                 lambda: common.output_file("~no-such-user-here/x.tar", "--capture"),
                 lambda: common.user_path("~no-such-user-here", "--venv")):
        with pytest.raises(common.ScriptError, match="no such user"):
            call()
    assert common.user_path("~/x") == Path.home() / "x"


@pytest.mark.parametrize("how", ["write-only", "closed"])
def test_stdin_that_cannot_be_read_is_an_error(tmp_path, how):
    """`--plan -` with stdin closed or opened for writing: a clear error, not an internal one."""
    import subprocess
    import sys
    argv = [sys.executable, str(ROOT / "scripts" / "bench.py"), "--plan", "-"]
    if how == "write-only":
        with open(tmp_path / "w", "wb") as w:
            res = subprocess.run(argv, stdin=w, capture_output=True, text=True, timeout=60)
    else:
        res = subprocess.run(["bash", "-c", 'exec "$@" <&-', "bash", *argv], capture_output=True, text=True,
                             timeout=60)
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and "stdin cannot be read" in doc["error"] and doc["fix"], res.stdout + res.stderr



json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
                           max_leaves=12)


@given(st.dictionaries(st.text(max_size=6), json_values, min_size=1, max_size=5), st.data())
def test_a_document_with_a_key_twice_is_refused_and_one_without_reads_as_written(doc, data):
    """This bundle's documents (a plan the human reviewed, a step's output) must mean one thing: Python reads
    a key given twice as its last value, other readers as the first, a reviewer as whichever they saw."""
    text = json.dumps(doc)
    assert common.parse_json_object(text, "plan", "fix", unique_keys=True) == doc
    key = data.draw(st.sampled_from(sorted(doc)))
    twice = text[:-1] + ", " + json.dumps(key) + ": " + json.dumps(data.draw(json_values)) + "}"
    with pytest.raises(common.ScriptError) as err:
        common.parse_json_object(twice, "plan", "fix", unique_keys=True)
    assert "appears twice" in err.value.error and err.value.fix == "fix"
    nested = json.dumps({"outer": doc})[:-2] + ", " + json.dumps(key) + ": 1}}"
    with pytest.raises(common.ScriptError, match="appears twice"):
        common.parse_json_object(nested, "plan", "fix", unique_keys=True)
    assert common.parse_json_object(twice, "config.json", "fix") == json.loads(twice)  # read as vLLM reads it


def test_a_plan_with_a_key_twice_is_refused_by_every_verb(script, tmp_path):
    """A plan file edited by hand to say `"port": 8000, ..., "port": 9000`: the summary the human read and the
    port a verb would use could differ. Every verb refuses the file before anything runs."""
    plan = tmp_path / "plan.json"
    plan.write_text('{"path": "host", "port": 8000, "port": 9000}')
    for verb in ("start", "verify", "stop", "handoff"):
        r = script("launch.py", verb, "--plan", str(plan), *(["--confirm"] if verb == "start" else []))
        assert r.code == 1 and "appears twice" in r.doc["error"] and "'port'" in r.doc["error"], r.doc


hub_path_values = st.sampled_from(["", "/abs/hf", "rel", "~/hf", "~", "$HUBTEST_ABS", "$HUBTEST_TILDE", "$HUBTEST_REL",
                                   "$HUBTEST_UNSET/x", "${HUBTEST_ABS}/y", "./x", "~nosuchuser_zz/x"])


@given(st.dictionaries(st.sampled_from(["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"]),
                       hub_path_values, max_size=4),
       st.sampled_from([None, "", "/root", "/srv/home", "relhome"]))
def test_a_hub_cache_is_refused_exactly_when_the_hub_client_would_read_a_relative_one(env, home):
    """hub_cache_env_problem judges the folder as huggingface_hub itself builds it: its constants module is
    reloaded under each environment and asked. And where it finds no problem, validate names the very
    folder the client reads (an empty HOME had validate name /root/.cache/... and the client /.cache/...)."""
    import importlib
    from unittest import mock
    import huggingface_hub.constants as constants
    import validate
    names = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME")
    full = {**{k: v for k, v in os.environ.items() if k not in names}, "HUBTEST_ABS": "/srv/hf",
            "HUBTEST_TILDE": "~/x", "HUBTEST_REL": "rel", **env, **({} if home is None else {"HOME": home})}
    full.pop("HUBTEST_UNSET", None)
    try:
        with mock.patch.dict(os.environ, full, clear=True):
            client = importlib.reload(constants).HF_HUB_CACHE
            problem = common.hub_cache_env_problem(dict(os.environ))
            try:
                named = None if problem else validate.resolve_hf_cache(dict(os.environ))["path"]
            except common.ScriptError:  # another refusal (a user ~nosuchuser names no home): no folder named
                named = None
    finally:
        importlib.reload(constants)
    home_decides = not any(k in env for k in names)
    assert (problem is None) == (os.path.isabs(client) and not (home_decides and home is not None
                                                                 and not os.path.isabs(home))), (env, home, client, problem)
    if named is not None:
        assert named == os.path.realpath(client), (env, home, client, named)
