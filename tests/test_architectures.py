"""epyc.facts.architectures: its decisions, tested in-process."""

import pytest
from conftest import load_docs, plan_from_4
from epyc.errors import ScriptError


def test_a_model_judged_by_another_vllms_registry_is_a_mismatch(inputs):
    docs = load_docs(inputs)
    docs["check_model"]["vllm_version"] = "0.11.0"
    docs["validate"].setdefault("stack", {})["vllm"] = "0.32.0+cpu"
    with pytest.raises(ScriptError, match="vLLM 0.11.0's registry, validate.py found vLLM 0.32.0"):
        plan_from_4(docs)
    from epyc.argtypes import normalize_version

    assert normalize_version("0.32.0+cpu") == "0.32.0" and normalize_version(None) is None
