"""epyc.decisions.model_check: its decisions, tested in-process."""

import pytest


def test_a_list_of_many_chat_templates_is_named_in_part():
    from epyc.decisions.model_check import MAX_TEMPLATE_NAMES, classify_template

    many = [{"name": f"t{i}", "template": "x"} for i in range(100_000)]
    got = classify_template(None, {"chat_template": many}, None)
    assert got["status"] == "ambiguous" and len(got["names"]) == MAX_TEMPLATE_NAMES + 1
    assert got["names"][-1] == "... (100000 in all)"
    many[50_000]["name"] = "default"  # a default past the names shown still decides
    got = classify_template(None, {"chat_template": many}, None)
    assert got["status"] == "present" and got["selected_name"] == "default"


@pytest.mark.parametrize(
    "templates",
    [
        [{"name": "default"}, {"name": "tool_use", "template": "x"}],  # no template
        ["{{ messages }}", "{{ other }}"],  # plain strings
        [{"name": "default", "template": 42}],  # not text
        [{"name": "a\nb", "template": "x"}, {"name": "c", "template": "y"}],  # a name with a newline
    ],
)
def test_a_chat_template_list_transformers_cannot_read_is_not_present(templates):
    """F4: such lists were "present" (chat endpoint, launchable); the server would fail at load."""
    from epyc.decisions.model_check import classify_template

    got = classify_template(None, {"chat_template": templates}, None)
    assert got["status"] == "unknown" and got["source"] == "tokenizer_config.json", got
    ok = classify_template(None, {"chat_template": [{"name": "default", "template": "x"}]}, None)
    assert ok["status"] == "present" and ok["selected_name"] == "default"


def test_files_that_may_be_incomplete_prove_a_template_never_its_absence():
    """A folder of configs passed as --config may lack chat_template.jinja: a template found there is present,
    none found is unknown (verify settles it), never absent (which would hand off raw completions)."""
    from epyc.decisions.model_check import classify_template

    assert classify_template("{{ messages }}", None, None, readable=False)["status"] == "present"
    assert classify_template(None, {"chat_template": "x"}, None, readable=False)["source"] == "tokenizer_config.json"
    assert classify_template(None, {"eos_token": "</s>"}, None, readable=False)["status"] == "unknown"
    assert classify_template(None, {"eos_token": "</s>"}, None)["status"] == "absent"  # a whole folder: absent


@pytest.mark.parametrize("gated", [True, "unknown"])
def test_a_model_that_is_or_may_be_gated_names_hf_token_for_its_host(gated):
    from epyc.decisions.model_check import gated_warnings

    (w,) = gated_warnings("meta-llama/Llama-3.1-8B-Instruct", gated)
    assert w["check"] == "gated" and "HF_TOKEN" in w["message"] and "export HF_TOKEN=" in w["fix"]
    assert ("gated: unknown" in w["message"]) == (gated == "unknown")


@pytest.mark.parametrize("gated", [False, None])
def test_a_model_the_hub_does_not_gate_or_a_local_folder_has_no_gated_warning(gated):
    from epyc.decisions.model_check import gated_warnings

    assert gated_warnings("Qwen/Qwen3-0.6B", gated) == []
