"""scripts/vllm_registry.py: its contract and its decisions."""

import pytest


# ---- F7: vllm_registry's --python
@pytest.mark.parametrize(
    "args,needle",
    [
        (["--python="], "--python: is empty"),
        (["--python", "python3"], "'python3' is not an executable file"),
    ],
)
def test_vllm_registry_never_probes_an_interpreter_it_was_not_given(script, args, needle):
    r = script("vllm_registry.py", *args)
    assert r.code == 1 and needle in r.doc["error"], r.doc
