"""launch.py as a whole: its verbs, their arguments and the plan file they share."""

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import (
    LONG_NAME,
    ROOT,
    container_plan,
    host_plan,
    load_docs,
    plan_args,
    plan_from,
)
from epyc import argtypes
from epyc.decisions import command
from epyc.deployments import serve_state
from epyc.errors import ScriptError
from epyc.facts import remote_host
from epyc.verbs import bench_plan


def test_integers_in_documents_are_whole_numbers_not_floats(script, tmp_path, inputs, live_tune):
    """jsonschema counts 10.0 as an integer: a port of 44751.0 reached socket.bind (an internal error) and a
    KV grant of 10.0 became '--max-num-seqs 22.0' in the approved command."""
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    edited = tmp_path / "port-float.json"
    edited.write_text(json.dumps({**plan, "port": float(plan["port"])}))
    for verb in (["start", "--confirm"], ["handoff"], ["stop"]):
        r = script("launch.py", verb[0], "--plan", str(edited), *verb[1:])
        assert r.code == 1 and "field port" in r.doc["error"] and "is not of type 'integer'" in r.doc["error"], r.doc
    tune = json.loads(inputs["tune"].read_text())
    tune["kv_granted_gb"] = float(tune["kv_granted_gb"])
    inputs["tune"].write_text(json.dumps(tune))
    from conftest import plan_args

    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st")))
    assert r.code == 1 and "kv_granted_gb" in r.doc["error"], r.doc


def test_a_hub_cache_not_named_hub_is_mounted_where_the_container_looks(script, inputs, rt, tmp_path):
    from conftest import plan_args
    from epyc.facts import hubcache

    models = tmp_path / "data" / "models"  # HF_HUB_CACHE=/data/models: models--ORG--NAME folders right there
    models.mkdir(parents=True)
    assert hubcache.resolve_hf_cache({"HF_HUB_CACHE": str(models)})["mount_subdir"] == "hub"
    named_hub = hubcache.resolve_hf_cache({"HF_HUB_CACHE": str(tmp_path / "hf" / "hub")})  # that folder, not its parent
    assert named_hub["path"] == str(tmp_path / "hf" / "hub") and named_hub["mount_subdir"] == "hub"
    doc = json.loads(Path(inputs["validate"]).read_text())
    doc["hf_cache"].update(path=str(models), mount_subdir="hub")
    Path(inputs["validate"]).write_text(json.dumps(doc))
    d, env = rt
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st")), env=env)
    assert r.code == 0 and f"{models}:/root/.cache/huggingface/hub" in r.doc["argv"], r.doc


@pytest.mark.parametrize(
    "tool,args",
    [
        ("detect.py", ["--spec", "9654", "--sockets", "1", "--ram-gb-per-socket", "384", "--save-sysroot", "{out}"]),
        ("launch.py", ["plan", "--detect=-"]),  # reads stdin, prints: the write is stdout's, already exit 1
    ],
)
def test_a_full_disk_is_named_never_an_internal_error(script, tmp_path, tool, args):
    """F4: each write path gave `internal error: OSError [Errno 27]` under ulimit -f 0."""
    import resource
    import subprocess

    out = tmp_path / "out"
    argv = [sys.executable, str(ROOT / "scripts" / tool), *[a.format(out=out) for a in args]]
    r = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=120,
        input="{}",
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY)),
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr
    if r.stdout:
        assert "internal error" not in r.stdout, r.stdout
    if tool == "detect.py":
        doc = json.loads(r.stdout)
        assert "cannot write the rendered host files" in doc["error"] and "File too large" in doc["error"]


@pytest.mark.parametrize("verb", ["start", "stop"])
def test_a_runtime_that_does_not_say_which_container_has_the_name_is_not_acted_on(
    verb,
    script,
    inputs,
    rt,
    tmp_path,
):
    """Twenty-eighth audit, F2: an `inspect` that failed once (a slow daemon) read as "no container", and stop
    (with no state) or start then stopped or removed by name whatever held it: another plan's server."""
    from conftest import calls

    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    (d / f"created-{plan['container_name']}").write_text("a" * 64)  # another state dir's, running
    (d / "inspect_fails").touch()
    before = len(calls(d))
    args = ["--confirm"] if verb == "start" else []
    r = script("launch.py", verb, "--plan", str(plan_file), *args, env=env)
    assert r.code == 1 and "did not say whether a container named" in r.doc["error"], r.doc
    assert r.doc["phase"] == verb and f"run {verb} again" in r.doc["fix"]
    assert [c["argv"][0] for c in calls(d)[before:]] == ["inspect"]  # nothing stopped, removed or run


@pytest.mark.parametrize(
    "field,value",
    [
        ("kv_bytes_per_sequence", 2**70),
        ("kv_bytes_per_token", 2**50),
        ("weight_bytes", 0),
        ("weight_bytes", 2**70),
        ("fit/max_model_len", 7),
    ],
)  # the twenty-ninth's F5: below the flags' 16
def test_an_estimate_of_no_or_impossible_bytes_is_refused(field, value, script, inputs, rt, tmp_path):
    """A note of the twenty-eighth audit: an edited estimate of 2**70 KV bytes per sequence planned a cache that
    "holds 0 tokens", and 0 or 2**70 weight bytes passed. estimate_memory.py writes none of these (weights
    are at least vocab x hidden, at most 1 PiB). 0 KV bytes stays valid: a model of attention-free layers."""
    from conftest import plan_args

    doc = json.loads(Path(inputs["estimate"]).read_text())
    *parents, key = field.split("/")
    at = doc
    for part in parents:
        at = at[part]
    at[key] = value
    edited = tmp_path / "estimate-edited.json"
    edited.write_text(json.dumps(doc))
    r = script("launch.py", *plan_args({**inputs, "estimate": edited}, "--state-dir", str(tmp_path / "st")), env=rt[1])
    assert r.code == 1 and "is not estimate_memory.py's output" in r.doc["error"] and field in r.doc["error"], r.doc


@pytest.mark.parametrize(
    "edit",
    [{"chosen_socket": 7}, {"sockets/0/socket": -1}, {"sockets/0/physical_cores": -1}, {"sockets/0/ram_gb": 2.0**62}],
)
def test_a_tune_naming_a_socket_it_does_not_list_is_refused(edit, script, inputs, rt, tmp_path):
    """Twenty-ninth audit, F3: tune.json's chosen_socket edited to 7 planned with "socket 7" in the summary on a
    two-socket machine (the bind, cpuset and nodes were still socket 1's); a socket of -1, -1 cores or 2**62
    GB passed."""
    from conftest import plan_args

    doc = json.loads(Path(inputs["tune"]).read_text())
    ((field, value),) = edit.items()
    *parents, key = field.split("/")
    at = doc
    for part in parents:
        at = at[int(part)] if part.isdigit() else at[part]
    at[key] = value
    edited = tmp_path / "tune-edited.json"
    edited.write_text(json.dumps(doc))
    r = script("launch.py", *plan_args({**inputs, "tune": edited}, "--state-dir", str(tmp_path / "st")), env=rt[1])
    assert r.code == 1, r.doc
    assert ("do not list" in r.doc["error"]) if field == "chosen_socket" else ("cpu_tune.py's output" in r.doc["error"])


def test_bench_reads_the_max_num_seqs_the_server_runs_with(script, inputs, rt, tmp_path):
    """The review of F5's fix: a sizing that leaves --max-num-seqs out (vllm-default) runs at vLLM's CPU server
    default, 128, whatever capacity the plan computed (256 there): the warning named a flag never passed, and
    a concurrency of 200 queued unwarned. And a chat endpoint's template adds tokens to the longest request."""
    _, plan = container_plan(script, inputs, rt, tmp_path)
    r = script(
        "launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st2"), "--sizing", "vllm-default"), env=rt[1]
    )
    assert r.code == 0 and "--max-num-seqs" not in r.doc["argv"], r.doc
    assert bench_plan.served_max_num_seqs(r.doc, 128) == 128
    _, warnings = bench_plan.matrix_against_the_plan(r.doc, [16], 16, [200], 128)
    assert [w["check"] for w in warnings] == ["concurrency"] and "--max-num-seqs 128 the server" in warnings[0][
        "message"
    ]
    chat = {**plan, "primary_endpoint": "chat_completions"}
    limit = plan["max_model_len"]
    _, warnings = bench_plan.matrix_against_the_plan(chat, [limit - 64], 64, [1], 128)
    assert warnings[0]["check"] == "length" and "the chat template adds tokens" in warnings[0]["message"]
    assert bench_plan.matrix_against_the_plan(
        {**chat, "primary_endpoint": "completions"}, [limit - 64], 64, [1], 128
    ) == (None, [])


def test_an_input_path_expands_a_tilde_as_output_paths_do(script, inputs, tmp_path):
    """`--detect=~/d.json` (bash leaves that ~ alone) was "No such file '~/d.json'", though --state-dir, --venv
    and --capture expand it."""
    (tmp_path / "d.json").write_text(inputs["detect"].read_text())
    args = [a if not a.startswith("--detect=") else "--detect=~/d.json" for a in plan_args(inputs)]
    r = script("launch.py", *args, env={"HOME": str(tmp_path)})
    assert r.code == 0 and r.doc["ok"] is True, r.doc


# ---- F1, F10: text that vLLM or a runtime would read as an option
def test_a_model_or_served_name_that_reads_as_an_option_is_refused(script, inputs, rt):
    docs = load_docs(inputs)
    for name in ("--trust-remote-code", "-x"):
        with pytest.raises(ScriptError, match="read as an option"):
            plan_from(
                {
                    **docs,
                    "check_model": {**docs["check_model"], "model": name},
                    "estimate_memory": {**docs["estimate_memory"], "model": name},
                }
            )
    for bad in ("--trust-remote-code", "-x", "a b", "x\ny", "n" * 201):
        r = script("launch.py", *plan_args(inputs, f"--served-model-name={bad}"), env=rt[1])
        assert r.code == 1 and "served-model-name" in r.doc["error"], (bad, r.doc)
    with pytest.raises(ScriptError, match="served model name"):
        plan_from(docs, {"served_model_name": "--trust-remote-code"})


@pytest.mark.parametrize("name", ["server.log", "state.json"])
@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_fifo_or_folder_under_a_state_file_name_is_refused_not_waited_on(
    script,
    tmp_path,
    inputs,
    live_tune,
    name,
    kind,
):
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    st = Path(plan["state_dir"])
    st.mkdir(parents=True, exist_ok=True)
    os.mkfifo(st / name) if kind == "fifo" else (st / name).mkdir()
    try:
        for verb in ("start", "verify", "handoff", "stop"):
            r = script(
                "launch.py",
                verb,
                "--plan",
                str(plan_file),
                *(["--confirm"] if verb == "start" else []),
                *(["--timeout", "2"] if verb == "verify" else []),
                timeout=60,
            )
            assert r.code in (0, 1) and "internal error" not in json.dumps(r.doc), (verb, r.doc)
    finally:
        script("launch.py", "stop", "--plan", str(plan_file))
    import psutil  # refused before anything ran: no server was left behind unseen

    assert not [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]


def test_a_final_newline_or_a_huge_length_does_not_slip_through(inputs, script, rt):
    docs = load_docs(inputs)
    assert not argtypes.is_served_name("tiny\n") and argtypes.is_served_name("tiny")
    assert command.pin_prefix_problem(["numactl", "--cpunodebind=0\n", "--membind=0"], [])
    assert command.pin_prefix_problem(["taskset", "-c", "0-1\n"], [])
    assert (
        not argtypes.is_env_name("KEY\n")
        and remote_host.parse_host("box")
        and pytest.raises(ScriptError, remote_host.parse_host, "box\n")
    )
    docs["estimate_memory"]["fit"]["max_model_len"] = int("9" * 400)
    with pytest.raises(ScriptError, match="not one start would run"):
        plan_from(docs)
    r = script("launch.py", *plan_args(inputs, "--state-dir", "/tmp/" + "a" * 5000), env=rt[1])
    assert r.code == 1 and "too long" in r.doc["error"]
    r = script("detect.py", "--capture", "/tmp/" + "c" * 5000)
    assert r.code == 1 and "too long" in r.doc["error"]


def test_the_default_state_dir_obeys_the_same_rule(script, inputs, rt, tmp_path):
    """No --state-dir: the plan's ~/.cache/serving-llms-on-epyc/run/NAME is checked like a given one."""
    home = tmp_path / "home"
    env = {**rt[1], "HOME": str(home)}
    r = script("launch.py", *plan_args(inputs, "--port", "18777"), env=env)
    assert r.code == 0
    default = Path(r.doc["state_dir"])
    assert default.parent == home / ".cache" / "serving-llms-on-epyc" / "run"
    default.parent.mkdir(parents=True)
    default.write_text("a file where the folder goes")
    r = script("launch.py", *plan_args(inputs, "--port", "18777"), env=env)
    assert r.code == 1 and "is not a folder" in r.doc["error"] and "--state-dir" in r.doc["fix"]
    assert serve_state.state_dir_problem(default) == "exists and is not a folder"
    assert serve_state.state_dir_problem(Path("relative")) == "is not an absolute path"
    assert "too long" in serve_state.state_dir_problem(tmp_path / LONG_NAME)


def test_a_state_dir_through_a_dangling_link_is_refused_before_anything_is_made(script, tmp_path, inputs):
    """The user named the link, not the folder chain it points at: nothing is made there."""
    (tmp_path / "link").symlink_to(tmp_path / "nowhere" / "deeper" / "x")
    for where in ("link", "link/sub"):
        r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / where)))
        assert r.code == 1 and "a link that leads nowhere" in r.doc["error"], r.doc
        assert not (tmp_path / "nowhere").exists()
    (tmp_path / "real").mkdir()
    (tmp_path / "ok").symlink_to(tmp_path / "real")  # a link to a folder that is there: followed
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "ok" / "st")))
    assert r.code == 0 and r.doc["state_dir"] == str((tmp_path / "real" / "st").resolve()), r.doc


def test_launch_help_gives_each_verb_a_line_and_start_says_it_repairs_a_running_fleet():
    """Issue 52: `launch.py --help` listed start, verify, handoff and stop with no line; each verb says what it
    does, and start's that on a running fleet or front it starts again only what failed (deployment.start)."""
    import re
    import subprocess

    argv = [sys.executable, str(ROOT / "scripts" / "launch.py"), "--help"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout
    said = dict(re.findall(r"^    ([\w-]+) +(\S.*)$", out, re.M))  # each verb's first line, as argparse lays it out
    assert sorted(said) == sorted(["plan", "start", "verify", "handoff", "stop", "up", "tls-selfsigned"]), out
    assert "start again only what failed while the rest serves" in " ".join(out.split())
