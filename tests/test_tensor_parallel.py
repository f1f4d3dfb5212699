"""One engine split over the NUMA nodes by tensor parallelism: what each rank holds, where it runs, what the plan
serves -- for a model bigger than one socket of the recorded dual Genoa (NPS1) and dual Turin (NPS4) hosts."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import sysroots
from conftest import FAKE_BIN, ROOT, fake_venv, run_script
from epyc import bundle
from epyc.decisions import planner
from epyc.facts import shell
from epyc.facts.kv_cache import kv_layout, rank_layout

# Qwen3-235B-A22B's config.json (shapes only): ~470 GB in bfloat16, more than one 384 GiB socket
QWEN3_235B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "moe_intermediate_size": 1536,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_hidden_layers": 94,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def test_a_rank_holds_its_share_of_the_kv_heads_or_a_replica():
    gqa = kv_layout(QWEN3_235B)
    assert [rank_layout(gqa, n)["bytes_per_token"] * n for n in (2, 4)] == [gqa["bytes_per_token"]] * 2
    assert rank_layout(gqa, 8)["bytes_per_token"] == rank_layout(gqa, 4)["bytes_per_token"]  # 4 KV heads, 8 ranks
    assert rank_layout(gqa, 3) is None  # 64 attention heads do not split three ways: vLLM refuses it
    mla = kv_layout(json.loads((ROOT / "tests/fixtures/models/DeepSeek-V2-Lite/config.json").read_text()))
    assert rank_layout(mla, 2)["bytes_per_token"] == mla["bytes_per_token"]  # the one latent is on every rank


def chain(tmp_path: Path, host, *tune_args: str, weight_gb: str | None = None, last: str = "plan"):
    """The skill's chain on a recorded host tree (validate sees the fake docker): -> the last result."""
    root = sysroots.build(tmp_path / "sr", sysroots.HOSTS[host] if isinstance(host, str) else host)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(QWEN3_235B))
    run, env = tmp_path / "run", {"FAKE_RT_DIR": str(tmp_path), "PATH": f"{FAKE_BIN}:/usr/bin:/bin"}
    for step in (
        ["detect.py", "--sysroot", str(root)],
        ["validate.py", "--python", sys.executable],
        ["check_model.py", "--model", "Qwen/Qwen3-235B-A22B", "--config", str(cfg)],
        ["estimate_memory.py", "--config", str(cfg), *(["--weight-gb", weight_gb] if weight_gb else [])],
        ["cpu_tune.py", *tune_args],
        ["launch.py", "plan", "--state-dir", str(tmp_path / "st")][: 4 if last == "plan" else 0],
    ):
        if not step:
            break
        r = run_script(*step, "--run", str(run), env=env)
        if r.code:
            return r
    return r


@pytest.mark.parametrize(
    "host,ranks,first,rank_kv",
    [("genoa_9654_2s_smt", 2, "0-95|96-191|", 81), ("turin_9755_2s_nps4", 8, "0-31|32-63|64-95|", 59)],
)
def test_a_model_bigger_than_one_socket_is_one_engine_with_a_rank_per_node(tmp_path, host, ranks, first, rank_kv):
    r = chain(tmp_path, host)
    assert r.code == 0, r.doc
    p, tune = r.doc, r.doc["inputs"]["cpu_tune"]
    assert tune["tensor_parallel_size"] == ranks and "does not fit one engine's memory" in tune["socket_choice_reason"]
    assert [x["numa_node"] for x in tune["ranks"]] == list(range(ranks))
    assert (tune["vllm_cpu_omp_threads_bind"] + "|").startswith(first) and tune["kv_granted_gb"] == rank_kv
    row = next(x for x in p["inputs"]["estimate_memory"]["tensor_parallel"] if x["ranks"] == ranks)
    assert tune["weight_gb"] == row["weight_gb"] < p["inputs"]["estimate_memory"]["weight_gb"] / ranks * 1.01
    mems = ",".join(map(str, range(ranks)))
    assert p["argv"][p["argv"].index("--tensor-parallel-size") + 1] == str(ranks)
    assert f"--cpuset-mems={mems}" in p["argv"] and f"VLLM_CPU_OMP_THREADS_BIND={tune['vllm_cpu_omp_threads_bind']}"
    assert f"one engine, tensor parallel over {ranks} ranks" in p["summary_markdown"]
    assert f"KV {rank_kv} GiB per rank" in p["summary_markdown"]

    # the host path: the same ranks, the process pinned to every rank's node
    docs = dict(p["inputs"])
    docs["validate"] = {**docs["validate"], "path": "host", "runtime": "host", "image": None}
    docs["validate"]["python"] = str(fake_venv(tmp_path))
    opt = {"state_dir": str(tmp_path / "st-host")}
    host = planner.build_plan(docs, opt, bundle.load_epyc(), shell.shell_facts(opt, docs))
    assert host["argv"][:3] == ["numactl", f"--cpunodebind={mems}", f"--membind={mems}"]
    assert host["env"]["VLLM_CPU_OMP_THREADS_BIND"] == tune["vllm_cpu_omp_threads_bind"]
    assert "--tensor-parallel-size" in host["argv"]


def test_one_that_fits_a_socket_stays_on_one_unless_asked(tmp_path):
    r = chain(tmp_path, "genoa_9654_2s_smt", weight_gb="60")
    assert r.code == 0 and r.doc["inputs"]["cpu_tune"]["tensor_parallel_size"] == 1
    assert "--tensor-parallel-size" not in r.doc["argv"]
    asked = chain(tmp_path / "asked", "genoa_9654_2s_smt", "--tensor-parallel", "2", weight_gb="60")
    assert asked.code == 0 and asked.doc["inputs"]["cpu_tune"]["ranks"][1]["cpus"] == "96-191"


def test_one_too_big_for_the_host_or_unevenly_split_is_refused_with_the_numbers(tmp_path):
    r = chain(tmp_path, "genoa_9654_2s_smt", weight_gb="2000")
    assert r.code == 1 and "required vs 768.0 GiB of RAM" in r.doc["error"]
    r = chain(tmp_path / "three", "genoa_9654_2s_smt", "--tensor-parallel", "3")
    assert r.code == 1 and "do not spread evenly over the 2 NUMA node(s)" in r.doc["error"]
    r = chain(tmp_path / "socket", "genoa_9654_2s_smt", "--tensor-parallel", "2", "--socket", "0")
    assert r.code == 1 and "--socket and --tensor-parallel both given" in r.doc["error"]


def test_ranks_share_a_memory_limit_and_no_node_is_promised_twice(tmp_path):
    limited = dataclasses.replace(sysroots.HOSTS["genoa_9654_2s_smt"], cgroup_memory_max=str(460 * 2**30))
    tune = chain(tmp_path, limited, last="cpu_tune").doc  # each rank's weights + grant within its half of 460
    assert tune["tensor_parallel_size"] == 2 and tune["weight_gb"] + tune["kv_granted_gb"] + 1 <= 230
    r = chain(tmp_path / "nps4", "turin_9755_2s_nps4", "--socket", "0", weight_gb="20", last="cpu_tune")
    assert r.doc["socket_ram_gb"] == 192.0, r.doc  # one engine on an NPS4 socket: its first core's node
    assert chain(tmp_path / "one", "epyc_4584px", last="cpu_tune").code == 1  # 128 GiB, one node: estimate says no
    run, cfg = str(tmp_path / "one" / "run"), str(tmp_path / "one" / "config.json")
    assert run_script("estimate_memory.py", "--config", cfg, "--ram-gb", "1000", "--run", run).code == 0
    one_node = run_script("cpu_tune.py", "--run", run)  # and nothing to split it over: the socket's refusal
    assert one_node.code == 1 and "socket RAM 128 GiB cannot hold" in one_node.doc["error"], one_node.doc


def test_a_bind_edited_away_from_its_ranks_is_refused(tmp_path):
    assert chain(tmp_path, "genoa_9654_2s_smt", last="cpu_tune").code == 0
    tune_file = tmp_path / "run" / "cpu_tune.json"
    doc = json.loads(tune_file.read_text())
    doc["vllm_cpu_omp_threads_bind"] = doc["env"]["VLLM_CPU_OMP_THREADS_BIND"] = "0-95"
    tune_file.write_text(json.dumps(doc))
    r = run_script("launch.py", "plan", "--run", str(tmp_path / "run"), "--state-dir", str(tmp_path / "st"))
    assert r.code == 1 and "binds 0-95, not one core list per rank of its 2 ranks" in r.doc["error"], r.doc


def test_a_mixture_of_experts_step_reads_its_active_experts_whatever_the_bytes(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(QWEN3_235B))
    full, four_bit = (
        run_script("estimate_memory.py", "--config", str(cfg), *extra).doc for extra in ([], ["--weight-gb", "120"])
    )
    assert 40 < full["active_weight_bytes"] / 2**30 < 43  # 22B active parameters in bfloat16
    assert four_bit["active_weight_bytes"] / full["active_weight_bytes"] == pytest.approx(120 / full["weight_gb"], 0.01)
    assert [r["ranks"] for r in full["tensor_parallel"]] == [2, 4, 8]  # vLLM's shared-memory reduce stops at 8


def test_the_env_format_says_the_ranks_vllm_must_be_told(tmp_path):
    assert chain(tmp_path, "genoa_9654_2s_smt", last="cpu_tune").code == 0
    env = subprocess.run(
        [sys.executable, str(ROOT / "scripts/cpu_tune.py"), "--format", "env", "--run", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "export VLLM_CPU_OMP_THREADS_BIND='0-95|96-191'" in env and "--tensor-parallel-size 2' >&2" in env


def test_a_tensor_parallel_plan_says_its_stack_was_never_seen_to_run_it(tmp_path):
    """Issue 51 on the recorded dual Genoa with docker: two ranks into the seed's image, where tensor parallelism
    was never run -> the summary's Path row and a warning say so and name the stack that is known to (the host
    stack: its setup line, then validate's); on that stack the same plan has nothing unverified."""
    r = chain(tmp_path, "genoa_9654_2s_smt")
    assert r.code == 0, r.doc
    p, epyc = r.doc, bundle.load_epyc()
    assert p["stack"]["name"] == "seed_image" and p["stack"]["unverified"] == ["tensor parallelism (2 ranks)"]
    assert p["image"] == epyc["container"]["image"] and p["stack"]["why"] is None
    assert "Not known to run tensor parallelism (2 ranks): verify will show" in dict(p["summary"])["Path"]
    (warn,) = [w for w in p["warnings"] if w["check"] == "stack"]
    assert "not known to run tensor parallelism (2 ranks)" in warn["message"]
    setup = "python3 scripts/setup_host_stack.py, then python3 scripts/validate.py --runtime host"
    assert warn["fix"] == f"the measured stack, in a host venv is known to: {setup}, plan again"

    docs, pins = dict(p["inputs"]), {"vllm": epyc["host_stack"]["vllm_version"]}
    pins["zentorch"] = epyc["host_stack"]["zentorch_version"]
    docs["validate"] = {**docs["validate"], "path": "host", "runtime": "host", "image": None}
    docs["validate"].update(python=str(fake_venv(tmp_path)), stack={**docs["validate"]["stack"], **pins})
    docs["check_model"] = {**docs["check_model"], "vllm_version": pins["vllm"]}
    opt = {"state_dir": str(tmp_path / "st-host")}
    host = planner.build_plan(docs, opt, epyc, shell.shell_facts(opt, docs))
    assert host["stack"]["name"] == "host_stack" and host["stack"]["unverified"] == []
    assert "tensor_parallel" in host["stack"]["verified"] and not [w for w in host["warnings"] if w["check"] == "stack"]
