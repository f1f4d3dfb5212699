"""The on-demand mutation tool (README "Mutation testing"): it scores for real, and never leaves a mutant behind."""

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "tools"))
import mutation  # noqa: E402

pytestmark = pytest.mark.serial  # it mutates scripts/ in place: no other test may run meanwhile

MODULE = ROOT / "scripts" / "epyc" / "facts" / "quantization.py"


def digest() -> str:
    return hashlib.sha256(MODULE.read_bytes()).hexdigest()


def tool(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "tests/tools/mutation.py", *args],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finish(p: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """Wait for the tool; past the timeout, SIGTERM it (its handler puts the module back; a SIGKILL or an
    abandoned run would leave a mutant on disk for the tests after this one) and fail with its progress."""
    try:
        return p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=120)
        raise AssertionError(f"the mutation tool ran past {timeout} s; stdout {out[-500:]!r}, stderr {err[-2000:]!r}")


def test_wilson_interval_is_what_a_sample_can_say():
    assert mutation.wilson(0, 0) is None
    assert mutation.wilson(34, 40) == [70.9, 92.9]  # 85 % of 40: anywhere from ~71 % to ~93 %
    assert mutation.wilson(40, 40) == [91.2, 100.0] and mutation.wilson(0, 40) == [0.0, 8.8]


def test_a_sampled_run_scores_real_mutants_and_restores_the_module():
    before = digest()
    p = tool("scripts/epyc/facts/quantization.py", "--sample", "3", "--seed", "5")
    out, err = finish(p, 900)  # ~10 s on an idle runner; CI's runner has stalled for minutes on I/O
    doc = json.loads(out)
    assert p.returncode == 0 and doc["ok"] and doc["judged"] == 3, err[-2000:]
    assert doc["detected"] == sum(m["killed"] + m["timeout"] for m in doc["modules"])
    mod = doc["modules"][0]
    assert mod["mutants_in_module"] > 50 and mod["killed"] + mod["survived"] + mod["timeout"] == 3
    assert doc["interval_95_pct"] and len(mod["survivors"]) == mod["survived"] + mod["timeout"]
    assert err.count("mutation: scripts/epyc/facts/quantization.py ") == 3
    assert digest() == before


def test_interrupted_mid_mutant_puts_the_original_back():
    before = digest()
    p = tool("scripts/epyc/facts/quantization.py", "--sample", "20")
    deadline = time.monotonic() + 600  # the unmutated baseline runs first
    while time.monotonic() < deadline and digest() == before:  # the first mutant is on disk, its tests run
        time.sleep(0.05)
    if digest() == before:
        finish(p, 0)  # stops the tool (the module stays whole) and fails with its progress
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 1 and "interrupted" in json.loads(out)["error"]
    assert digest() == before


def test_unknown_module_or_sample_is_refused():
    for args, field, needle in (
        (["scripts/nope.py"], "fix", "scripts/epyc/facts/kv_cache.py"),
        (["--sample", "0"], "error", "out of range"),
        (["--seed", "x"], "error", "--seed"),
        (["--bogus"], "error", "unrecognized"),
    ):
        p = tool(*args)
        out, _ = p.communicate(timeout=60)
        doc = json.loads(out)
        assert p.returncode == 1 and doc["ok"] is False and needle in doc[field] and doc["fix"], doc


def test_the_changed_line_is_found_when_a_mutant_removes_lines():
    src = "a = 1\ndoc = {\n  'x': 1,\n}\nprint(doc)\n"
    assert mutation.changed_lines(src, "a = 1\ndoc = None\nprint(doc)\n") == ("doc = { / 'x': 1, / }", "doc = None")
    assert mutation.changed_lines("x = a + b\n", "x = a - b\n") == ("x = a + b", "x = a - b")


def test_prose_mutants_are_told_apart_from_decisions():
    assert mutation.is_prose('    notes.append("capped to the model")', '    notes.append("XXcapped to the modelXX")')
    assert not mutation.is_prose('    kind = "gqa"', '    kind = "XXgqaXX"')  # a value a test compares
    assert not mutation.is_prose("    x = a + b", "    x = a - b")
    assert not mutation.is_prose('    s = "a b" + c', '    s = "a b" - c')
