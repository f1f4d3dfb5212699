"""epyc.jsonio: its decisions, tested in-process."""

from pathlib import Path

import pytest
from epyc import errors, jsonio


def test_a_final_newline_does_not_pass_a_schema_pattern():
    """Python's `$` matches before a final newline; JSON Schema's (ECMA-262) does not. Ours reads it as
    JSON Schema does, so "96-191\\n" never reaches --env VLLM_CPU_OMP_THREADS_BIND."""
    schema = {"type": "string", "pattern": "^[0-9,-]*$"}
    assert jsonio.best_schema_error(schema, "96-191") is None
    assert jsonio.best_schema_error(schema, "96-191\n") is not None
    assert jsonio.best_schema_error({"pattern": "a\\$"}, "xa$") is None  # an escaped dollar is a dollar


def test_a_home_of_an_unknown_user_is_an_error_not_a_crash(tmp_path):
    """Path.expanduser raises RuntimeError for ~nosuchuser: every path the scripts expand goes through user_path."""
    for call in (
        lambda: jsonio.empty_output_dir("~no-such-user-here/x", "--out", "fix"),
        lambda: jsonio.output_file("~no-such-user-here/x.tar", "--capture"),
        lambda: jsonio.user_path("~no-such-user-here", "--venv"),
    ):
        with pytest.raises(errors.ScriptError, match="no such user"):
            call()
    assert jsonio.user_path("~/x") == Path.home() / "x"
