"""One engine split over the NUMA nodes by tensor parallelism: what each rank holds, where it runs, what the plan
serves -- for a model bigger than one socket of the recorded dual Genoa (NPS1) and dual Turin (NPS4) hosts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import sysroots
from conftest import FAKE_BIN, ROOT, fake_venv, run_script
from epyc import bundle, planfile, planner
from epyc.kv_cache import kv_layout, rank_layout

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


def chain(tmp_path: Path, host: str, *tune_args: str, weight_gb: str | None = None):
    """The skill's chain on a recorded host tree (validate sees the fake docker): -> the last result."""
    root = sysroots.build(tmp_path / "sr", sysroots.HOSTS[host])
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(QWEN3_235B))
    run, env = tmp_path / "run", {"FAKE_RT_DIR": str(tmp_path), "PATH": f"{FAKE_BIN}:/usr/bin:/bin"}
    for step in (
        ["detect.py", "--sysroot", str(root)],
        ["validate.py", "--python", sys.executable],
        ["check_model.py", "--model", "Qwen/Qwen3-235B-A22B", "--config", str(cfg)],
        ["estimate_memory.py", "--config", str(cfg), *(["--weight-gb", weight_gb] if weight_gb else [])],
        ["cpu_tune.py", *tune_args],
        ["launch.py", "plan", "--state-dir", str(tmp_path / "st")],
    ):
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
    assert tune["tensor_parallel_size"] == ranks and "does not fit one socket" in tune["socket_choice_reason"]
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
    host = planner.build_plan(docs, opt, bundle.load_epyc(), planfile.host_facts(opt, docs))
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
