"""The skill's own evals (evals/evals.json) and skill card, in amd/skills' format: checked offline with the
rules of its docs/evals.md and docs/skill-cards.md (their validator needs that repository, not reachable
here, so the same rules are written as a JSON schema and a few counts)."""

from __future__ import annotations

import json
import re

import jsonschema
from conftest import ROOT

ID_PROMPT = {"id": {"type": "string", "minLength": 1}, "prompt": {"type": "string", "minLength": 1}}
TEXTS = {"type": "array", "items": {"type": "string", "minLength": 1}}
SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["evaluations"],
    "properties": {
        "comment": {"type": ["string", "array"]},
        "evaluations": {
            "type": "array",
            "minItems": 1,
            "items": {
                "oneOf": [
                    {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["id", "prompt", "skill_should_trigger"],
                        "properties": {
                            **ID_PROMPT,
                            "skill_should_trigger": {"const": True},
                            "expected_behavior": TEXTS,
                            "unexpected_behavior": TEXTS,
                            "logs_contain": TEXTS,
                            "files_exist": TEXTS,
                            "workspace": {"type": "string", "minLength": 1},
                            "note": {"type": "string"},
                        },
                    },
                    {  # a prompt no skill should fire for: no behaviour phase, so no behaviour fields
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["id", "prompt", "skill_should_trigger"],
                        "properties": {
                            **ID_PROMPT,
                            "skill_should_trigger": {"const": False},
                            "note": {"type": "string"},
                        },
                    },
                ]
            },
        },
    },
}
BEHAVIOUR = ("expected_behavior", "unexpected_behavior", "logs_contain", "files_exist")


def evaluations() -> list[dict]:
    doc = json.loads((ROOT / "evals" / "evals.json").read_text())
    jsonschema.validate(doc, SCHEMA)
    return doc["evaluations"]


def test_the_evals_validate_and_reach_tier_1():
    evals = evaluations()
    ids = [e["id"] for e in evals]
    assert len(ids) == len(set(ids))
    assert sum(e["skill_should_trigger"] for e in evals) >= 3 and sum(not e["skill_should_trigger"] for e in evals) >= 2
    assert any(k in e for e in evals for k in BEHAVIOUR)
    for e in evals:  # the skill's own name proves only that it was staged: routing grades that
        assert not any("serving-llms-on-epyc" in s for s in e.get("logs_contain", []))


def test_the_behaviour_cases_the_skill_promises_are_there():
    by_id = {e["id"]: e for e in evaluations()}
    remote = by_id["epyc-remote-dual-socket-plan"]
    assert "--spec 9654" in remote["logs_contain"] and "--cpuset-mems=0" in remote["logs_contain"]
    assert any("--device cpu" in u for u in remote["unexpected_behavior"])
    assert "detect.py" in by_id["epyc-non-epyc-host-stops"]["logs_contain"]
    assert "required_gb" in by_id["epyc-model-too-big"]["logs_contain"]
    assert "check_model.py" in by_id["epyc-unknown-architecture"]["logs_contain"]


def test_the_skill_card_has_its_three_sections():
    card = (ROOT / "skill-card.md").read_text()
    for section in ("Description", "Owner", "License"):
        body = re.search(rf"^## {section}\n(.*?)(?=^## |\Z)", card, re.M | re.S)
        assert body and body.group(1).strip(), section
