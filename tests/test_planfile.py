"""epyc.deployments.planfile: its decisions, tested in-process."""

import time

import pytest
from conftest import (
    host_plan,
    load_epyc_doc,
)
from epyc.bundle import load_epyc
from epyc.deployments import planfile
from epyc.errors import ScriptError
from epyc.facts import shell


def test_plan_refuses_an_estimate_sized_for_another_dtype(tmp_path, inputs, live_tune):
    """F3: plan --dtype float32 on an estimate of bfloat16 served float32 with half its memory counted: the
    summary called a fit what could run out of memory, and --max-num-seqs was twice what the KV cache holds."""
    from conftest import load_docs
    from epyc.decisions import planner
    from epyc.errors import ScriptError

    docs = load_docs(inputs)
    docs["validate"].update(backend="stock")  # a stack that serves float32 (zentorch's platform does not)
    assert docs["estimate_memory"]["dtype"] == "bfloat16"
    opt = {"port": 8000, "state_dir": str(tmp_path / "st"), "dtype": "float32"}
    with pytest.raises(ScriptError) as err:
        planner.build_plan(docs, opt, load_epyc_doc(), shell.shell_facts(opt, docs))
    assert "sized the model at bfloat16, the plan serves float32" in err.value.error
    assert "--dtype float32" in err.value.fix


def test_an_edited_input_inside_a_plan_is_checked_against_its_schema(tmp_path, inputs, live_tune):
    """kv_granted_gb: [7] built an 8 GiB list before the edit was noticed: inputs are schema-checked first."""
    _, plan = host_plan(tmp_path, inputs, live_tune)
    plan["inputs"]["cpu_tune"]["kv_granted_gb"] = [7]
    t0 = time.monotonic()
    with pytest.raises(ScriptError, match="cpu_tune is not cpu_tune.py's output: field kv_granted_gb"):
        planfile.rerender(plan, load_epyc())
    assert time.monotonic() - t0 < 5


def test_the_stop_by_hand_of_another_versions_plan_names_its_engine_and_its_key_files():
    """The refusal of a plan of another version says how to stop its server: the runtime's own commands on
    the engine the plan names (the default socket would miss it), and the key files start wrote."""
    from epyc.deployments.planfile import stop_by_hand

    plan = {
        "runtime": "docker",
        "engine": "unix:///run/other.sock",
        "container_name": "vllm-epyc-8000",
        "state_dir": "/x/st",
        "state_file": "/x/st/state.json",
    }
    rt = "docker --host=unix:///run/other.sock"
    assert stop_by_hand(plan) == (
        f"stop its server by hand ({rt} stop -t 30 vllm-epyc-8000 && {rt} rm vllm-epyc-8000 && rm -rf /x/st/secrets)"
    )
    for junk in (
        {**plan, "runtime": ["sh", "-c"]},
        {**plan, "container_name": "x; rm -rf ~"},
        {**plan, "engine": "ssh://elsewhere"},
    ):
        assert stop_by_hand(junk) == "stop its server by hand (kill -- -PGID, with the pgid /x/st/state.json records)"
