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
