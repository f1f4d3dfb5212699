"""Every numeric flag takes exactly the range reference.md's "Flag ranges" table promises: both ends
accepted, one step past either end refused with an error naming the flag and the range. In-process
(each script's main with its argv), so it runs in milliseconds: a trailing unknown flag makes argparse
stop with its own error once every value has been converted, so nothing past parsing ever runs."""

from __future__ import annotations

import importlib
import re

import pytest
from conftest import ROOT
from epyc.errors import ScriptError

ROW = re.compile(
    r"^\| `(?P<script>\w+)\.py (?:(?P<sub>[a-z]+) )?(?P<flag>--[a-z-]+)` \| (?P<kind>whole number|number) "
    r"\| (?P<open>[\[(])(?P<lo>\d+), (?P<hi>\d+)\] \|$"
)


def documented_ranges() -> list[dict]:
    text = (ROOT / "reference.md").read_text().split("## Flag ranges", 1)[1].split("\n## ", 1)[0]
    rows = [m.groupdict() for m in map(ROW.match, text.splitlines()) if m]
    assert len(rows) >= 25, "the Flag ranges table lost its rows (or this parser its grip on them)"
    return rows


RANGES = documented_ranges()


def parse_error(row: dict, value: str) -> str:
    """The error the script stops with when given `value` (and an unknown flag after it)."""
    argv = ([row["sub"]] if row["sub"] else []) + [f"{row['flag']}={value}", "--no-such-flag"]
    with pytest.raises(ScriptError) as exc:
        importlib.import_module(row["script"]).main(argv)
    sub = f" {row['sub']}" if row["sub"] else ""  # where the ranges are listed
    assert exc.value.fix in (
        f"see `python3 scripts/{row['script']}.py{sub} --help`",  # the subcommand's flag
        f"see `python3 scripts/{row['script']}.py --help`",
    )  # the trailing unknown flag
    return exc.value.error


def refused(row: dict, value: str) -> bool:
    err = parse_error(row, value)
    if f"argument {row['flag']}" not in err:
        return False
    lo, hi = row["lo"], row["hi"]
    if row["kind"] == "whole number":
        expected = f"expected {lo} to {hi}"
    elif row["open"] == "(":
        expected = f"expected more than {lo} and at most {hi}"
    else:
        expected = f"expected from {lo} to {hi}"
    assert expected in err or "not a" in err, f"{row['script']} {row['flag']} names another range: {err}"
    return True


@pytest.mark.parametrize("row", RANGES, ids=lambda r: f"{r['script']}-{r['sub'] or ''}{r['flag']}")
def test_flag_takes_exactly_its_documented_range(row):
    lo, hi = int(row["lo"]), int(row["hi"])
    assert not refused(row, str(hi)), "the documented ceiling is refused"
    assert refused(row, str(hi + 1)), "one past the ceiling is accepted"
    if row["open"] == "[":
        assert not refused(row, str(lo)), "the documented floor is refused"
        assert refused(row, str(lo - 1)), "one below the floor is accepted"
    else:
        assert refused(row, str(lo)), "the excluded floor is accepted"
        assert not refused(row, str(lo + 0.5) if row["kind"] == "number" else str(lo + 1))
    for junk in ("nan", "inf", "-inf", "1e999", "", " ", "0x10", "1_0", "١٢", "１２"):
        assert refused(row, junk), f"{junk!r} is accepted"


CLIS = [
    "detect",
    "validate",
    "check_model",
    "estimate_memory",
    "cpu_tune",
    "launch",
    "kernel_proof",
    "bench",
    "setup_host_stack",
    "vllm_registry",
    "bootstrap",
]


@pytest.mark.parametrize("name", CLIS)
def test_help_opens_with_what_the_script_does(name, capsys):
    """`--help` (the one output that is not JSON: argparse's usage, exit 0) describes the script in the
    first line of its docstring, the same sentence reference.md and the README use for it."""
    module = importlib.import_module(name)
    with pytest.raises(SystemExit) as exc:
        module.main(["--help"])
    assert exc.value.code == 0
    first = module.__doc__.strip().splitlines()[0]
    assert first and " ".join(first.split()) in " ".join(capsys.readouterr().out.split())
