"""Regressions from the thirty-third independent audit (2026-12-03, a fresh helper on 105db79: the life cycle
under a real Docker engine, SKILL.md followed as written, and vLLM 0.32's own config reading compared with
ours over transformers' default config of every causal-LM type vLLM registers; 8 findings). Classes:
tests/BAD_INPUT.md."""
import json

import pytest

import kv_cache
from test_launch import host_plan, inputs, live_tune, rt  # noqa: F401

# the published shapes of openbmb/MiniCPM3-4B, mistralai/Mamba-Codestral-7B-v0.1 and tiiuae/falcon-mamba-7b
MINICPM3 = {"architectures": ["MiniCPM3ForCausalLM"], "model_type": "minicpm3", "hidden_size": 2560,
            "num_hidden_layers": 62, "num_attention_heads": 40, "num_key_value_heads": 40, "q_lora_rank": 768,
            "kv_lora_rank": 256, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "max_position_embeddings": 32768,
            "vocab_size": 73448, "torch_dtype": "bfloat16"}
CODESTRAL = {"architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "conv_kernel": 4, "expand": 2,
             "head_dim": 64, "hidden_size": 4096, "n_groups": 8, "num_heads": 128, "num_hidden_layers": 64,
             "state_size": 128, "vocab_size": 32768}
FALCON_MAMBA = {"architectures": ["FalconMambaForCausalLM"], "model_type": "falcon_mamba", "hidden_size": 4096,
                "num_hidden_layers": 64, "intermediate_size": 8192, "vocab_size": 65024, "state_size": 16,
                "conv_kernel": 4, "expand": 16}


def estimate(script, tmp_path, name, config, *args):
    cfg = tmp_path / f"{name}.json"
    cfg.write_text(json.dumps(config))
    return script("estimate_memory.py", "--model", f"org/{name}", "--config", str(cfg), "--ram-gb", "24",
                  "--avx512-bf16", "yes", *args)


def test_minicpm3_caches_every_heads_k_and_v_not_a_latent(script, tmp_path):
    """F2: any kv_lora_rank was sized as DeepSeek's MLA latent (576 B a token and layer). vLLM 0.32 keeps the
    latent only for its MLA model types; MiniCPM3's model decompresses it and caches K and V of its 40 heads,
    96 wide: 27x the bytes. A 4B model at 32k context "fit" in 24 GiB needing 39."""
    r = estimate(script, tmp_path, "MiniCPM3-4B", MINICPM3, "--weight-gb", "7.6", "--max-model-len", "32768")
    assert r.code == 1 and r.doc["error"].startswith("does not fit: 38.66 GiB required"), r.doc
    assert r.doc["kv_attention"] == "mha" and r.doc["kv_bytes_per_token"] == 2 * 40 * 96 * 2 * 62
    # a DeepSeek type with the same fields is still the latent: kv_lora_rank + qk_rope_head_dim
    lay = kv_cache.kv_layout({**MINICPM3, "model_type": "deepseek_v3"})
    assert (lay["attention"], lay["bytes_per_token_per_layer"]) == ("mla", (256 + 32) * 2)
    # a kv_lora_rank with no head widths is refused, never sized as 0 bytes
    with pytest.raises(kv_cache.ScriptError, match="kv_lora_rank without qk_nope_head_dim"):
        kv_cache.kv_layout({k: v for k, v in MINICPM3.items() if not k.startswith("qk_")})


def test_attention_free_mamba_models_keep_a_state_per_sequence_not_a_kv_cache(script, tmp_path):
    """F3: Mamba-2's SSM heads (num_heads, head_dim) were read as attention heads: 64 layers of 2 MiB a
    token, a fitting model refused at 4096; FalconMamba was refused for lacking attention heads. Both are
    attention-free to vLLM: each layer keeps one recurrent state per sequence, whatever its length."""
    r = estimate(script, tmp_path, "Mamba-Codestral-7B-v0.1", CODESTRAL, "--weight-gb", "14.6",
                 "--max-model-len", "32768")
    assert r.code == 0 and r.doc["kv_attention"] == "none" and r.doc["kv_bytes_per_token"] == 0, r.doc
    inner, conv_dim = 128 * 64, 128 * 64 + 2 * 8 * 128  # vLLM's mamba2 shapes: conv (kernel-1) x conv_dim
    state = conv_dim * 3 * 2 + inner * 128 * 4           # bf16 conv state, float32 SSM state (AVX-512 BF16)
    assert r.doc["kv_layers"] == {"full": 0, "sliding": 0, "none": 64, "sliding_window": None,
                                  "recurrent_family": "mamba2", "recurrent_state_bytes": state,
                                  "ssm_state_dtype": "float32"}
    assert r.doc["kv_needed_gb_per_sequence"] == round(64 * 2 * state / 2**30, 3)  # the same at 32k as at 4k
    r = estimate(script, tmp_path, "falcon-mamba-7b", FALCON_MAMBA, "--weight-gb", "14.5", "--max-model-len", "4096")
    assert r.code == 0 and r.doc["kv_layers"]["recurrent_family"] == "mamba1", r.doc
    assert r.doc["kv_layers"]["recurrent_state_bytes"] == 8192 * 3 * 2 + 8192 * 16 * 4
    broken = {k: v for k, v in FALCON_MAMBA.items() if k != "state_size"}
    r = estimate(script, tmp_path, "broken-mamba", broken, "--weight-gb", "14.5")
    assert r.code == 1 and "falcon_mamba model whose recurrent state this config does not size" in r.doc["error"]


def test_capture_runs_with_the_standard_library_alone(tmp_path):
    """F4: SKILL.md sends `detect.py --capture` to the host to plan for, "standard library only". It wrote the
    archive, then exit 1 "missing Python package 'jsonschema'": the receipt was checked as detect's facts.
    The bundle is copied without its venv and run with no site-packages (-S), as on a bare server."""
    import shutil
    import subprocess
    import sys
    from conftest import ROOT
    bundle = tmp_path / "bundle"
    for part in ("scripts", "data"):
        shutil.copytree(ROOT / part, bundle / part)
    archive = tmp_path / "host.tar.gz"
    res = subprocess.run([sys.executable, "-I", "-S", str(bundle / "scripts" / "detect.py"), "--capture",
                          str(archive)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout) == {"ok": True, "capture": str(archive), "files": json.loads(res.stdout)["files"]}
    probe = subprocess.run([sys.executable, "-I", "-S", "-c", "import jsonschema"], capture_output=True, timeout=60)
    assert probe.returncode != 0  # the run above really had no jsonschema
    assert archive.stat().st_size > 0


def test_the_container_stop_handed_over_removes_the_key_files_too(inputs):  # noqa: F811
    """F6: the handoff's Stop row for a container was the runtime's `stop && rm`, which leaves HF_TOKEN and the
    API key in <state>/secrets (reference.md says stop removes them: launch.py stop does). The row names
    launch.py stop first, and the by-hand form removes the folder too."""
    import serve_plan
    from common import load_epyc
    from test_launch import facts_for, load_docs
    plan = serve_plan.build_plan(load_docs(inputs), {}, load_epyc(), facts_for(load_docs(inputs)))
    stop = plan["stop_command"]
    assert stop.startswith("python3 scripts/launch.py stop --plan <plan.json>")
    assert stop.endswith(f"&& rm -rf {plan['state_dir']}/secrets)")
    assert f"| Stop | {stop} |" in serve_plan.handoff_doc(plan)["table_markdown"]


def test_host_bench_measures_only_this_plans_own_server(script, tmp_path, inputs, live_tune):  # noqa: F811
    """F1: a host plan that started nothing benched whatever answered on its port (another plan's server, its
    own state dir) and filed the figures under this plan, costed with this plan's weights. bench now needs
    the server this plan's start recorded, as a container plan needs its recorded container."""
    import socket
    from pathlib import Path
    plan_file, plan = host_plan(tmp_path, inputs, live_tune)
    with socket.socket() as s:  # someone's server on the plan's port
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", plan["port"]))
        s.listen()
        r = script("bench.py", "--plan", str(plan_file), "--repeats", "1", "--input-lens", "16", "--concurrency", "1",
                   "--output-len", "4", "--no-bandwidth")
    assert r.code == 1 and r.doc["error"] == "no server from this plan is running (no state file)", r.doc
    assert "launch.py start --plan <plan.json> --confirm, then verify, then bench" in r.doc["fix"]
    state_dir = Path(plan["state_dir"])
    assert not state_dir.exists() or not list(state_dir.glob("bench-*"))  # nothing measured, nothing filed


def test_verify_says_a_stop_while_it_waited_is_a_stop_not_a_crash(script, inputs, rt, tmp_path):  # noqa: F811
    """F7: `launch.py stop` while verify polled made verify say "the server process exited before it became
    healthy" (SKILL.md: report, do not retry). Once the stop is done, state.json records no run: verify says
    the server was stopped while it waited. A server that dies by itself is still the crash (second half)."""
    import os
    import subprocess
    import sys
    import time
    from conftest import ROOT
    from test_audit30_regressions import free_port_plan
    d, env = rt
    plan_file, plan = free_port_plan(script, inputs, rt, tmp_path)

    def verify_in_background():
        return subprocess.Popen([sys.executable, str(ROOT / "scripts" / "launch.py"), "verify", "--plan",
                                 str(plan_file), "--timeout", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, **env})
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    verify = verify_in_background()
    time.sleep(3)  # verify polls /health: nothing listens on the port
    assert script("launch.py", "stop", "--plan", str(plan_file), env=env).doc["stopped"] is True
    out, _ = verify.communicate(timeout=120)
    doc = json.loads(out)
    assert verify.returncode == 1 and doc["phase"] == "process", doc
    assert "the server was stopped (or started again) while verify waited" in doc["error"]
    assert doc["fix"].startswith("if you stopped it, nothing is wrong")
    # the container dies by itself: the state still records it -> the crash verdict
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    verify = verify_in_background()
    time.sleep(3)
    (d / "exited").touch()  # the fake runtime's inspect: the container does not run
    out, _ = verify.communicate(timeout=120)
    doc = json.loads(out)
    assert doc["error"] == "FAILED in phase process: the server process exited before it became healthy", doc
    script("launch.py", "stop", "--plan", str(plan_file), env=env)


def up_with_no_terminal(monkeypatch, docs: dict, run_dir, port):
    """launch.up on the fixtures' real documents (each step returns its document), with no terminal to ask on
    and the launch recorded, not run -> (the up arguments, the list of plans launched)."""
    import argparse
    import launch
    launched = []

    monkeypatch.setattr(launch, "step", lambda script, args, phase, run_dir, allow_fail=False: docs[phase])
    monkeypatch.setattr(launch, "TERMINAL", str(run_dir) + "-no-such-terminal")  # launch.ask's own no-terminal path
    monkeypatch.setattr(launch, "serve_verified", lambda plan, plan_file, *rest: launched.append(plan) or {"ok": True})
    a = argparse.Namespace(model=docs["check_model"]["model"], state_dir=str(run_dir), stock=False, python=None,
                           yes=False, max_model_len=None, num_prompts=4, port=port, expose=False,
                           served_model_name=None, api_key_env=None, throughput_flags=False, kernel_log=False,
                           timeout=30, dtype=None)
    return a, launched


def test_up_yes_launches_only_the_plan_it_showed(inputs, tmp_path, monkeypatch):  # noqa: F811
    """F5: `up` with no terminal shows its plan and stops ("re-run with --yes"); the --yes run planned again and
    launched whatever that said (the port taken in between: 8000 shown, 8001 run). What a --yes launches
    after a showing is held to what was shown; a changed plan is shown again, not run. The steps before the
    plan are the fixtures' real documents (a Genoa tree); the launch itself is recorded, not run."""
    import launch
    from common import ScriptError, load_epyc
    from test_launch import load_docs
    docs = load_docs(inputs)
    run_dir = tmp_path / "up"
    docs["validate"]["port"] = 18601  # no --port: the first free port validate found
    a, launched = up_with_no_terminal(monkeypatch, docs, run_dir, None)
    with pytest.raises(ScriptError, match="no terminal"):
        launch.up(a, load_epyc())
    shown = json.loads((run_dir / "shown-plan.json").read_text())
    assert "--port 18601" in shown["command"] and not launched
    a.yes, docs["validate"]["port"] = True, 18602  # 18601 taken in between: the second run plans another port
    with pytest.raises(ScriptError, match=r"the plan changed since up showed it \(pre_argv, command\)") as changed:
        launch.up(a, load_epyc())
    assert "--port 18602" in changed.value.error and changed.value.extra["started"] is False and not launched
    launch.up(a, load_epyc())  # the changed plan was shown (stderr, plan.json): a yes now runs exactly it
    assert len(launched) == 1 and launched[0]["port"] == 18602 and not (run_dir / "shown-plan.json").exists()
    a.state_dir = str(tmp_path / "fresh")  # --yes up front, nothing shown before: as it always was
    launch.up(a, load_epyc())
    assert len(launched) == 2


def test_a_container_plan_of_the_older_bundle_still_stops(script, inputs, rt, tmp_path):  # noqa: F811
    """The review of F6: a container plan made before it handed over the runtime's `stop && rm` as its
    stop_command; every verb compares a plan with its rendering, so stop, verify and handoff refused it as
    edited. The verbs that act on its server read that older form as it was; start refuses it (plan again)."""
    import serve_plan
    from test_launch import container_plan
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    assert script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env).code == 0
    rt_argv = plan["argv"][:plan["argv"].index("run")]
    older = {**plan, "stop_command": serve_plan.runtime_stop_pair(rt_argv, plan["container_name"])}
    assert older["stop_command"] == f"docker stop -t 30 {plan['container_name']} && docker rm {plan['container_name']}"
    plan_file.write_text(json.dumps(older))
    r = script("launch.py", "handoff", "--plan", str(plan_file), env=env)
    assert "edited" not in json.dumps(r.doc), r.doc
    r = script("launch.py", "stop", "--plan", str(plan_file), env=env)
    assert r.code == 0 and r.doc["stopped"] is True, r.doc
    r = script("launch.py", "start", "--plan", str(plan_file), "--confirm", env=env)
    assert r.code == 1 and "stop_command" in r.doc["error"], r.doc
    plan_file.write_text(json.dumps({**plan, "stop_command": older["stop_command"] + " ; rm -rf ~"}))
    r = script("launch.py", "stop", "--plan", str(plan_file), env=env)  # any other edit is still refused
    assert r.code == 1 and "stop_command" in r.doc["error"], r.doc


def test_up_yes_after_the_host_stack_question_shows_the_plan_before_it_runs(inputs, tmp_path, monkeypatch):  # noqa: F811
    """The review of F5: with no runtime, up's first question (no terminal) is the host stack's; the --yes run
    then built it and launched a plan nobody had seen. The yes answers the build; the plan is shown and held."""
    import launch
    from common import ScriptError, load_epyc
    from test_launch import load_docs
    docs = load_docs(inputs)
    built = []
    no_runtime = {"ok": False, "ready": False, "errors": [{"check": "runtime", "message": "no runtime", "fix": "-"}]}

    def step(script, args, phase, run_dir, allow_fail=False):
        if script == "setup_host_stack.py":
            built.append(True)
            return {"python": "/usr/bin/python3"}
        if phase == "validate":
            return docs["validate"] if built else no_runtime
        return docs[phase]

    a, launched = up_with_no_terminal(monkeypatch, docs, tmp_path / "up", 18603)
    monkeypatch.setattr(launch, "step", step)
    with pytest.raises(ScriptError, match="no terminal"):
        launch.up(a, load_epyc())
    assert not built and not launched
    a.yes = True
    with pytest.raises(ScriptError, match=r"up had not shown this plan \(its last question was the host stack's\)"):
        launch.up(a, load_epyc())
    assert built and not launched  # the build was the question answered
    launch.up(a, load_epyc())
    assert len(launched) == 1 and launched[0]["port"] == 18603


def test_the_review_of_the_sizing_fixes(script, tmp_path):
    """The review: a multimodal wrapper whose text_config names no model_type (Kimi-K2.5's shape) is read
    under the parent's type, and vLLM gives its language model the DeepSeek type: the latent, not 85x more.
    A Mamba model's notes speak of no attention page it does not have."""
    kimi = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
            "text_config": {"num_hidden_layers": 61, "num_attention_heads": 64, "hidden_size": 7168,
                            "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                            "max_position_embeddings": 262144}}
    lay = kv_cache.kv_layout(kimi)
    assert (lay["attention"], lay["bytes_per_token_per_layer"]) == ("mla", (512 + 64) * 2)
    r = estimate(script, tmp_path, "Mamba-Codestral-7B-v0.1", CODESTRAL, "--weight-gb", "14.6")
    note = next(n for n in r.doc["notes"] if "mamba2 layers keep a recurrent state" in n)
    assert note.endswith("no attention layer: nothing grows with the length") and "attention pages" not in note


def test_an_attention_free_plan_says_how_many_requests_it_holds(inputs):  # noqa: F811
    """The review: a Mamba plan (no per-token KV: kv_tokens null) said "capacity not computed (max_model_len
    differs from the estimate's)", though the lengths matched and the capacity was computed."""
    import serve_plan
    from common import load_epyc
    from test_launch import facts_for, load_docs
    plan = serve_plan.build_plan(load_docs(inputs), {}, load_epyc(), facts_for(load_docs(inputs)))
    plan["sizing"] = {**plan["sizing"], "kv_tokens": None, "kv_full_length_requests": 360, "max_num_seqs": 256}
    rows = dict(serve_plan.summary_rows(plan, load_docs(inputs)["detect"], None))
    assert rows["KV cache"] == ("holds 360 requests at once (a recurrent state per sequence, no per-token KV); "
                                "--max-num-seqs 256")


def test_bench_stops_at_the_first_run_no_request_completed(tmp_path, monkeypatch):
    """F1 moved the e2e proof of this (a stopped plan's bench now refuses before it runs): an endpoint that
    goes away once bench is running (vllm bench serve writes a result of 0 completed requests) ends the matrix
    at that first run, loudly, not after every cell. The one fake here is vllm bench serve's run: a server
    dying between bench's check and its first request is a race a real test cannot hold still."""
    import types
    from pathlib import Path
    import bench
    recorded = json.loads((Path(__file__).parent / "fixtures" / "bench" / "in128_c1_r1.json").read_text())
    runs = []

    def run(argv, **kw):
        runs.append(argv)
        folder, name = argv[argv.index("--result-dir") + 1], argv[argv.index("--result-filename") + 1]
        Path(folder, name).write_text(json.dumps({**recorded, "completed": 0, "failed": 10}))
        return types.SimpleNamespace(ok=True, stdout="", stderr="", failure=None, returncode=0)
    monkeypatch.setattr(bench.common, "run", run)
    monkeypatch.setattr(bench, "serving_target", lambda plan, container=None: {"vllm": ["/venv/bin/vllm"],
                                                                             "tokenizer": "/models/m"})
    plan = {"path": "host", "primary_endpoint": "completions", "base_url": "http://127.0.0.1:8000/v1",
            "served_model_name": "m"}
    args = types.SimpleNamespace(input_lens=[128, 256], concurrency=[1, 4], repeats=2, output_len=8, seed=0)
    with pytest.raises(kv_cache.ScriptError, match=r"no request completed at input 128, concurrency 1 \(10 failed\)"):
        bench.run_matrix(plan, args, tmp_path / "out", {})
    assert len(runs) == 1 and [p.name for p in (tmp_path / "out" / "raw").iterdir()] == ["in128_c1_r1.json"]
