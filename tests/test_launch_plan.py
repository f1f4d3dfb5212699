"""launch.py plan: the exact command, environment and summary a plan holds."""

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import (
    PINNED,
    ROOT,
    SECRET,
    TOKEN,
    container_plan,
    host_plan,
    load_docs,
    plan_args,
    plan_from_4,
)
from epyc import cli
from epyc.decisions import command
from epyc.errors import ScriptError


def test_a_state_dir_with_a_colon_is_refused_for_a_container_plan(script, inputs, rt, tmp_path):
    """F8: the secrets mount was written by hand, past bind_mount's check: -v DIR:/etc:rw/secrets:... ."""
    from conftest import plan_args

    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "sd:x")), env={**rt[1], "HF_TOKEN": TOKEN})
    assert r.code == 1 and "':'" in r.doc["error"], r.doc


def test_plan_serves_the_folder_that_was_checked_and_sized(script, inputs, rt, tmp_path, monkeypatch):
    """F2: plan found the model as typed again from its own folder: a relative path (or a folder named like
    the Hub id) served another model than the one checked and sized, with their fit, endpoint and revision."""
    import shutil

    from conftest import plan_args

    (tmp_path / "elsewhere" / "models").mkdir(parents=True)
    shutil.copytree(inputs["model"], tmp_path / "elsewhere" / "models" / "m")
    docs = {k: json.loads(Path(inputs[k]).read_text()) for k in ("check", "estimate")}
    for name, doc in docs.items():  # typed as a relative path where it meant the fixture's folder
        doc["model"] = "models/m"
        (tmp_path / f"rel-{name}.json").write_text(json.dumps(doc))
    args = [
        a
        if not a.startswith(("--check=", "--estimate="))
        else a.split("=")[0] + "=" + str(tmp_path / f"rel-{a[2:].split('=')[0]}.json")
        for a in plan_args(inputs)
    ]
    import subprocess

    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "launch.py"), *args, "--state-dir", str(tmp_path / "st")],
        cwd=tmp_path / "elsewhere",
        capture_output=True,
        text=True,
        env={**os.environ, **rt[1]},
        timeout=120,
    )
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and f"check_model.py read {os.path.realpath(inputs['model'])}" in doc["error"], doc
    assert str(tmp_path / "elsewhere" / "models" / "m") in doc["error"] and "absolute path" in doc["fix"]


def test_a_state_dir_holds_one_server_whichever_plan_started_it(script, inputs, rt, tmp_path):
    """F4: two plans in one state dir (two ports): the second start wrote its state over the running first's,
    the first plan's stop then removed the second's state, and a container ran that nothing named."""
    from conftest import free_port, plan_args

    d, env = rt
    plans = []
    for tag in "AB":
        r = script(
            "launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st"), "--port", str(free_port())), env=env
        )
        assert r.code == 0, r.doc
        (tmp_path / f"plan{tag}.json").write_text(r.stdout)
        plans.append((tmp_path / f"plan{tag}.json", r.doc))
    (a_file, a), (b_file, b) = plans
    assert script("launch.py", "start", "--plan", str(a_file), "--confirm", env=env).code == 0
    r = script("launch.py", "start", "--plan", str(b_file), "--confirm", env=env)
    assert r.code == 1 and "already running" in r.doc["error"] and a["container_name"] in r.doc["error"], r.doc
    for verb in ("verify", "stop", "handoff"):  # B's verbs never judge, stop or describe A's server
        r = script("launch.py", verb, "--plan", str(b_file), env=env)
        assert r.code == 1 and "of another plan" in r.doc["error"] and f"port {a['port']}" in r.doc["error"], r.doc
    assert json.loads((tmp_path / "st" / "state.json").read_text())["container_name"] == a["container_name"]
    (d / "exited").write_text("")  # A's container is gone: its state is stale, and no refusal of B's
    r = script("launch.py", "stop", "--plan", str(b_file), env=env)
    assert r.code == 0 and (tmp_path / "st" / "state.json").exists()  # B's stop leaves A's state to A's stop
    r = script("launch.py", "verify", "--plan", str(b_file), "--timeout", "2", env=env)
    assert r.code == 1 and "nothing was started from this plan" in r.doc["error"], r.doc
    assert script("launch.py", "stop", "--plan", str(a_file), env=env).code == 0
    assert not (tmp_path / "st" / "state.json").exists()


def test_an_edited_plan_is_called_edited_not_a_missing_variable(script, tmp_path, inputs, live_tune, monkeypatch):
    """A plan edited to expose its server (options.expose, options.api_key_env) was refused by verify, stop and
    handoff with "--api-key-env MYKEY: that variable is not set" while MYKEY was set; start said the truth."""
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    plan["options"].update(expose=True, plain_http=True, api_key_env="MYKEY")
    plan_file.write_text(json.dumps(plan))
    for verb in ("verify", "stop", "handoff"):
        r = script("launch.py", verb, "--plan", str(plan_file), env={"MYKEY": "sk-audit35-key"})
        assert r.code == 1 and "differs" in r.doc["error"] and "not set" not in r.doc["error"], (verb, r.doc)
        assert "sk-audit35-key" not in r.stdout + r.stderr


def test_plan_names_an_empty_input_path_as_empty(script, inputs):
    """`plan --detect ''` said "detect JSON '.' is a directory"; the other file flags say it is empty."""
    args = [a if not a.startswith("--detect=") else "--detect=" for a in plan_args(inputs)]
    r = script("launch.py", *args)
    assert r.code == 1 and "--detect: is empty (an unset shell variable?)" in r.doc["error"], r.doc


@pytest.mark.parametrize(
    "upstream", [{"error": "boom", "fix": 123}, {"error": {"a": 1}, "fix": ["x"]}, {"error": "boom", "fix": ""}]
)
def test_an_upstream_error_reaches_the_user_as_text(script, inputs, tmp_path, upstream):
    bad = tmp_path / "check.json"
    bad.write_text(json.dumps(upstream))
    r = script(
        "launch.py",
        "plan",
        *[f"--{k}={inputs[k] if k != 'check' else bad}" for k in ("detect", "validate", "check", "estimate", "tune")],
    )
    assert r.code == 1 and isinstance(r.doc["error"], str) and isinstance(r.doc["fix"], str) and r.doc["fix"]


def test_a_document_value_past_a_flags_range_never_reaches_the_command(inputs):
    docs = load_docs(inputs)
    docs["estimate_memory"]["max_num_batched_tokens"] = 10**300
    with pytest.raises(ScriptError, match="max_num_batched_tokens"):
        plan_from_4(docs)


@pytest.mark.parametrize(
    "edit",
    [
        lambda v: v["ld_preload"].update(value=["/usr/lib/libtcmalloc.so.4"]),
        lambda v: v["ld_preload"].update(value=7),
        lambda v: v["stack"].update(vllm=19),
        lambda v: v.update(ready=False, errors=[{"check": "x", "severity": "error", "message": 5, "fix": "y"}]),
    ],
)
def test_validate_fields_of_the_wrong_type_are_refused_by_plan(script, inputs, rt, tmp_path, edit):
    doc = json.loads(Path(inputs["validate"]).read_text())
    doc.setdefault(
        "stack", {"vllm": None, "zentorch": None, "torch": None, "platform": None, "source": None, "zen_active": None}
    )
    edit(doc)
    bad = tmp_path / "validate-edited.json"
    bad.write_text(json.dumps(doc))
    r = script(
        "launch.py",
        "plan",
        *[
            f"--{k}={inputs[k] if k != 'validate' else bad}"
            for k in ("detect", "validate", "check", "estimate", "tune")
        ],
        env=rt[1],
    )
    assert r.code == 1 and "validate" in r.doc["error"] and "field" in r.doc["error"], r.doc


# ---- F8: a context longer than the one sized
def test_plan_refuses_a_max_model_len_past_the_estimate(script, inputs, rt, tmp_path):
    _, env = rt
    sized = json.loads(Path(inputs["estimate"]).read_text())["fit"]["max_model_len"]
    r = script(
        "launch.py", *plan_args(inputs, "--max-model-len", str(sized * 4), "--state-dir", str(tmp_path / "a")), env=env
    )
    assert r.code == 1 and f"past the {sized} tokens estimate_memory.py sized" in r.doc["error"]
    assert f"--max-model-len {sized * 4}" in r.doc["fix"]
    r = script(
        "launch.py", *plan_args(inputs, "--max-model-len", str(sized // 2), "--state-dir", str(tmp_path / "b")), env=env
    )
    assert r.code == 0 and f"--max-model-len {sized // 2}" in " ".join(r.doc["argv"])  # shorter fits what was sized


# ---- 2, 8: what the printed document may be checked and masked as
def test_only_the_plan_inputs_are_checked_against_their_schema_as_printed(capsys):
    """bench's --compare document is not bench.json's single-run shape: it used to end as exit 1."""
    for name, code in (("bench", 0), ("cpu_tune", 1)):
        ns: dict = {}
        exec(
            compile(
                "def main(argv):\n    return {'comparison': {}, 'chosen_socket': 10 ** 9}, 0\n", f"/x/{name}.py", "exec"
            ),
            ns,
        )
        assert cli.run_main(ns["main"], []) == code, name
        capsys.readouterr()


@pytest.mark.parametrize(
    "args", [["launch.py", "start", "--confirm"], ["launch.py", "verify"], ["bench.py"], ["kernel_proof.py"]]
)
def test_an_empty_plan_path_is_named_as_empty(script, args):
    r = script(*args, "--plan=")
    assert r.code == 1 and "argument --plan: is empty" in r.doc["error"]


def test_plan_refuses_a_state_dir_that_is_a_file(script, inputs, tmp_path):
    from conftest import plan_args

    (tmp_path / "afile").write_text("x")
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "afile")))
    assert r.code == 1 and "not a folder" in r.doc["error"]


def test_container_plan_renders_the_exact_command(script, inputs, rt, tmp_path):
    d, env = rt
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st")), env={**env, "HF_TOKEN": SECRET})
    p = r.doc
    assert r.code == 0 and p["path"] == "container" and p["runtime"] == "docker"
    hf = json.loads(Path(inputs["validate"]).read_text())["hf_cache"]["path"]
    real = os.path.realpath(inputs["model"])
    assert p["argv"] == [
        "docker",
        "run",
        "-d",
        "--name",
        f"vllm-epyc-{p['port']}",
        "--ipc=host",
        "--network=host",
        "--cap-add=SYS_NICE",
        "--restart=unless-stopped",
        "--cpuset-cpus=96-191,288-383",
        "--cpuset-mems=1",
        "-v",
        f"{hf}:/root/.cache/huggingface/hub",
        "-v",
        f"{real}:/models/Qwen3-0.6B:ro",
        "-v",
        f"{tmp_path / 'st' / 'secrets'}:{command.SECRETS_TARGET}:ro",
        "--env",
        "VLLM_CPU_OMP_THREADS_BIND=96-191",
        "--env",
        "VLLM_CPU_KVCACHE_SPACE=190",
        "--entrypoint",
        "sh",
        PINNED,
        "-c",
        command.SECRET_LOADER,
        "vllm",
        "/models/Qwen3-0.6B",
        "--served-model-name",
        "Qwen3-0.6B",
        "--host",
        "127.0.0.1",
        "--port",
        str(p["port"]),
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "4096",
        "--max-num-seqs",
        "256",
        "--max-num-batched-tokens",
        "2048",
    ]
    # sized for serving, not one prompt: a 384 GiB socket's KV holds hundreds of full-length 4k requests
    assert p["sizing"]["kv_tokens"] == 190 * 2**30 // 114688 and p["sizing"]["kv_full_length_requests"] >= 64
    assert (
        "| KV cache | holds 1,778,834 tokens = 434 requests of 4096 tokens at once; --max-num-seqs 256, --max-num-batched-tokens 2048; granted as 0.5 of the socket RAM left after OS reserve and weights (380.9 GiB); at least the need, at most what the socket has left |"
        in p["summary_markdown"]
    )
    assert p["secrets"] == {"HF_TOKEN": "HF_TOKEN"} and p["env_by_name"] == ["HF_TOKEN"]
    assert p["pre_argv"] == [["docker", "rm", "-f", f"vllm-epyc-{p['port']}"], ["docker", "pull", PINNED]]
    assert not any(a.startswith("--shm-size") or a == "--device" for a in p["argv"])
    assert SECRET not in r.stdout  # by name only
    assert "| CPU sizing | socket 1 (forced by --socket), bind 96-191" in p["summary_markdown"]
    # the serving socket's cores, the host's beside them
    assert "EPYC Genoa (Zen4), 96 cores on socket 1 (host: 2 sockets, 192 cores)" in p["summary_markdown"]


def test_plan_options_and_rules(script, inputs, rt, monkeypatch):
    d, env = rt
    thr = script("launch.py", *plan_args(inputs, "--throughput-flags"), env=env).doc
    assert {"TORCHINDUCTOR_FREEZING": "1", "VLLM_USE_AOT_COMPILE": "0", "ZENTORCH_WEIGHT_PREPACK": "1"}.items() <= thr[
        "env"
    ].items()
    assert "HF_TOKEN" not in thr["env_by_name"] or os.environ.get("HF_TOKEN")
    r = script("launch.py", *plan_args(inputs, "--expose"), env=env)
    assert r.code == 1 and "--api-key-env" in r.doc["fix"]
    r = script("launch.py", *plan_args(inputs, "--expose", "--api-key-env", "MY_KEY"), env=env)
    assert r.code == 1 and "not set" in r.doc["error"]
    keyed = {**env, "MY_KEY": "sk-very-secret"}
    r = script("launch.py", *plan_args(inputs, "--expose", "--api-key-env", "MY_KEY"), env=keyed)
    assert r.code == 1 and "needs TLS" in r.doc["error"] and "--plain-http" in r.doc["fix"]  # plain only by name
    r = script("launch.py", *plan_args(inputs, "--expose", "--plain-http", "--api-key-env", "MY_KEY"), env=keyed)
    assert r.code == 0 and r.doc["host"] == "0.0.0.0" and "VLLM_API_KEY" in r.doc["env_by_name"]
    assert "sk-very-secret" not in r.stdout
    r = script("launch.py", *plan_args(inputs, "--dtype", "float16"), env=env)
    assert r.code == 1 and "float16" in r.doc["error"]


def test_plan_bad_files(script, inputs, tmp_path, rt):
    d, env = rt
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    args = plan_args(inputs)
    r = script("launch.py", *[a if not a.startswith("--tune=") else f"--tune={bad}" for a in args], env=env)
    assert r.code == 1 and "not JSON" in r.doc["error"]
    r = script("launch.py", *[a if not a.startswith("--tune=") else "--tune=/nope.json" for a in args], env=env)
    assert r.code == 1 and "cannot read" in r.doc["error"]
    r = script(
        "launch.py",
        "plan",
        "--detect",
        "-",
        "--validate",
        "-",
        "--check",
        "x",
        "--estimate",
        "x",
        "--tune",
        "x",
        env=env,
    )
    assert r.code == 1 and "stdin" in r.doc["error"]
    r = script("launch.py", "start", "--plan", str(bad), env=env)
    assert r.code == 1
    r = script("launch.py", "launch", env=env)
    assert r.code == 1 and "bad arguments" in r.doc["error"]


def test_a_plan_never_points_state_outside_its_state_dir(script, inputs, rt, tmp_path):
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    plan["state_file"] = str(victim)
    plan_file.write_text(json.dumps(plan))
    for verb in ("start", "stop"):
        r = script("launch.py", verb, "--plan", str(plan_file), *(["--confirm"] if verb == "start" else []), env=env)
        assert r.code == 1 and "state_dir" in r.doc["error"]
    assert victim.read_text() == "keep me"
