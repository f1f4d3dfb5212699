"""epyc.decisions.handoff: its decisions, tested in-process."""

import json

import pytest
from conftest import SCRIPTS, facts_for, load_docs
from epyc.bundle import load_epyc
from epyc.decisions import handoff, planner
from epyc.facts import shell


def test_the_handoffs_python_example_names_the_served_model(inputs, tmp_path):
    """It took `models.list().data[0].id`: a server listing other ids first got the example's requests."""
    from conftest import load_docs
    from epyc.bundle import load_epyc
    from epyc.decisions import handoff, planner

    docs = load_docs(inputs)
    opt = {"port": 8123, "state_dir": str(tmp_path / "st")}
    plan = planner.build_plan(docs, opt, load_epyc(), shell.shell_facts(opt, docs))
    example = handoff.handoff_doc(plan)["python_example"]
    assert f'model = "{plan["served_model_name"]}"' in example and "models.list" not in example


def test_an_attention_free_plan_says_how_many_requests_it_holds(inputs):
    """The review: a Mamba plan (no per-token KV: kv_tokens null) said "capacity not computed (max_model_len
    differs from the estimate's)", though the lengths matched and the capacity was computed."""
    from conftest import facts_for, load_docs
    from epyc.bundle import load_epyc
    from epyc.decisions import handoff, planner

    plan = planner.build_plan(load_docs(inputs), {}, load_epyc(), facts_for(load_docs(inputs)))
    plan["sizing"] = {**plan["sizing"], "kv_tokens": None, "kv_full_length_requests": 360, "max_num_seqs": 256}
    rows = dict(handoff.summary_rows(plan, load_docs(inputs)["detect"], None))
    assert rows["KV cache"].startswith(
        "holds 360 requests at once (a recurrent state per sequence, no per-token KV); --max-num-seqs 256; granted as"
    )


def test_an_exposed_handoff_says_it_listens_on_every_address(inputs, monkeypatch):
    """The handoff of an --expose'd server gave only http://127.0.0.1:PORT/v1: true on this machine, but the
    user exposed it to reach it from another one, and nothing said the server listens on every address or
    that those clients need the key. The Base URL row says both; a loopback plan's row is unchanged."""
    from conftest import facts_for, load_docs
    from epyc.bundle import load_epyc
    from epyc.decisions import handoff, planner

    monkeypatch.setenv("MY_KEY", "sk-test")
    docs = load_docs(inputs)
    exposed = planner.build_plan(
        docs,
        {"expose": True, "plain_http": True, "api_key_env": "MY_KEY"},
        load_epyc(),
        facts_for(docs, api_key_set=True),
    )
    row = next(line for line in handoff.handoff_doc(exposed)["table_markdown"].splitlines() if "Base URL" in line)
    assert f"listens on every address (0.0.0.0:{exposed['port']})" in row and "$MY_KEY" in row, row
    local = planner.build_plan(docs, {}, load_epyc(), facts_for(docs))
    assert (
        f"| Base URL | http://127.0.0.1:{local['port']}/v1 (the trailing /v1 matters) |"
        in handoff.handoff_doc(local)["table_markdown"]
    )


def test_odd_quantization_and_usage_values_are_not_taken_at_face_value():
    from epyc.facts import quantization

    assert (
        quantization.describe({"quantization_config": {"quant_method": ["awq"], "bits": "four"}})["method"] == "unknown"
    )
    body = json.dumps({"choices": [{"message": {"content": "x"}}], "usage": {"completion_tokens": True}})
    assert handoff.judge_smoke(200, body, "chat_completions")[0] is False


def test_a_reply_with_a_5000_digit_number_is_a_failed_smoke_not_a_crash():
    body = '{"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": %s}}' % ("9" * 5000)
    ok, detail = handoff.judge_smoke(200, body, "chat_completions")
    assert ok is False and detail.startswith("HTTP 200, body is not JSON")


def test_a_summary_cell_stays_on_one_line():
    table = handoff.markdown_table(
        ["Field", "Value"], [["Socket", "0\n| Command | rm -rf ~"], ["Note", "ok \x1b[2K\u202e"]]
    )
    assert table.splitlines()[2:] == ["| Socket | 0\\n\\| Command \\| rm -rf ~ |", "| Note | ok \\x1b[2K\\u202e |"]


def test_completions_handoff_for_a_base_model(inputs, tmp_path):
    docs = load_docs(inputs)
    docs["check_model"].update(primary_endpoint="completions", supported_endpoints=["completions"])
    plan = planner.build_plan(docs, {}, load_epyc(), facts_for(docs))
    h = handoff.handoff_doc(plan)
    assert h["endpoint_path"] == "/v1/completions" and "client.completions.create" in h["python_example"]
    assert '"prompt": "Hello, world"' in h["curl_example"]


def test_judge_smoke():
    ok = json.dumps({"choices": [{"message": {"content": "x"}}], "usage": {"completion_tokens": 1}})
    assert handoff.judge_smoke(200, ok, "chat_completions") == (True, "x")
    assert not handoff.judge_smoke(200, ok, "completions")[0]  # no choices[0].text
    assert not handoff.judge_smoke(500, ok, "chat_completions")[0]
    assert not handoff.judge_smoke(200, "<html>", "chat_completions")[0]


def test_the_smoke_request_is_deterministic_and_short():
    """verify's one request: greedy (temperature 0), 16 tokens, on the endpoint the plan serves."""
    path, body = handoff.smoke_request("chat_completions", "m")
    assert path == "/v1/chat/completions" and body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 16,
        "temperature": 0,
    }
    path, body = handoff.smoke_request("completions", "m")
    assert path == "/v1/completions" and body["temperature"] == 0 and body["max_tokens"] == 16 and body["prompt"]


def test_the_handoff_is_the_table_and_examples_a_user_pastes(inputs):
    docs = load_docs(inputs)
    plan = planner.build_plan(docs, {}, load_epyc(), facts_for(docs))
    port, name = plan["port"], plan["container_name"]
    h = handoff.handoff_doc(plan)
    assert h["table_markdown"] == "\n".join(
        [
            "| Field | Value |",
            "|---|---|",
            f"| Base URL | http://127.0.0.1:{port}/v1 (the trailing /v1 matters) |",
            "| Served model | Qwen3-0.6B |",
            "| Endpoint | /v1/chat/completions |",
            "| Why | a chat template is present |",
            f"| Runtime / port | docker / {port} |",
            "| Sizing | 96 OMP threads (96-191), KV 190 GiB, --max-model-len 4096, socket 1, NUMA 1 |",
            f"| Stop | python3 {SCRIPTS}/launch.py stop --plan {plan['state_dir']}/plan.json |",
            f"| Stop without the bundle | docker stop -t 30 {name} && "
            f"docker rm {name} && rm -rf {plan['state_dir']}/secrets |",
        ]
    )
    assert h["curl_example"] == (
        f"curl -s http://127.0.0.1:{port}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
        '  -d \'{"model": "Qwen3-0.6B", "messages": [{"role": "user", "content": "Hello"}], '
        '"max_tokens": 128, "temperature": 0.7}\''
    )
    assert (
        h["python_example"].splitlines()[3]
        == f'client = OpenAI(base_url="http://127.0.0.1:{port}/v1", api_key="EMPTY")'
    )
    assert (h["served_model_name"], h["why"], h["runtime"], h["port"]) == (
        "Qwen3-0.6B",
        "a chat template is present",
        "docker",
        port,
    )
    assert (
        h["guidance"][0] == "max_tokens caps the output; prompt tokens + max_tokens must stay <= --max-model-len (4096)"
    )
    # a key by name: the Python example reads it from the environment, never a value
    plan["api_key_env"] = "MY_KEY"
    assert "api_key=os.environ['MY_KEY'])" in handoff.handoff_doc(plan)["python_example"]


@pytest.mark.parametrize(
    "body,verdict",
    [
        ({"choices": ["hello"], "usage": {"completion_tokens": 1}}, "choices[0] is not an object"),
        ({"choices": [], "usage": {"completion_tokens": 1}}, "no choices in the response"),
        ({"choices": {"0": {}}}, "no choices in the response"),
        ({"choices": [{"message": "hi"}], "usage": {"completion_tokens": 1}}, "choices[0] has no message.content"),
        (
            {"choices": [{"message": {"content": "x"}}], "usage": None},
            "the server generated no tokens (usage.completion_tokens missing or 0)",
        ),
        (
            {"choices": [{"message": {"content": "x"}}], "usage": {"completion_tokens": 0}},
            "the server generated no tokens (usage.completion_tokens missing or 0)",
        ),
        ({"object": "error", "message": "boom"}, 'HTTP 200 carrying an error: {"object": "error", "message": "boom"}'),
        (["x"], 'HTTP 200 carrying an error: ["x"]'),
    ],
)
def test_each_bad_smoke_reply_gets_its_own_verdict(body, verdict):
    assert handoff.judge_smoke(200, json.dumps(body), "chat_completions") == (False, verdict)


@pytest.mark.parametrize("path", ["container", "host"])
@pytest.mark.parametrize("remote", [False, True])
def test_every_stop_command_runs_as_printed(inputs, tmp_path, path, remote):
    """A stop command is pasted into a shell as it is: each one the plan and the handoff print parses in bash
    and runs (here: launch.py stop answers in JSON; pkill finds no such server). Another host's is the
    runtime's own stop, or the process by its command: neither names this machine's bundle or state."""
    import subprocess
    import sys

    docs = load_docs(inputs)
    if path == "host":
        docs["validate"].update(path="host", runtime="host", image=None, python=sys.executable)
    if remote:
        for name in ("detect", "validate", "cpu_tune"):
            docs[name]["target"] = "spec:EPYC 9654 2S NPS1 SMT on"
        docs["validate"]["deferred"] = ["runtime", "port"]
    opt = {"port": 8123, "state_dir": str(tmp_path / "st")}
    plan = planner.build_plan(docs, opt, load_epyc(), facts_for(docs))
    table = handoff.handoff_doc(plan)["table_markdown"] if not remote else ""
    stops = [
        plan["stop_command"],
        *(r.split(" | ")[1].removesuffix(" |") for r in table.splitlines() if r.startswith("| Stop")),
    ]
    for stop in stops:
        assert subprocess.run(["bash", "-n", "-c", stop], capture_output=True).returncode == 0, stop
    assert (str(tmp_path) in plan["stop_command"]) is not remote and (
        SCRIPTS.name in plan["stop_command"]
    ) is not remote
    if remote and path == "container":
        assert plan["stop_command"] == "docker stop -t 30 vllm-epyc-8123 && docker rm vllm-epyc-8123"
    if path == "host" or not remote:
        env = {"PATH": f"{sys.executable.rsplit('/', 1)[0]}:/usr/bin:/bin"}
        res = subprocess.run(["bash", "-c", plan["stop_command"]], capture_output=True, text=True, env=env, timeout=60)
        if remote:  # pkill: 1 = no process matched (it ran)
            assert res.returncode == 1 and not res.stderr, res.stderr
        else:
            assert res.returncode in (0, 1) and json.loads(res.stdout), res.stderr
