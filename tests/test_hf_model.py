"""epyc.facts.hf_model: its decisions, tested in-process."""

import json


def test_the_exit_after_an_abandoned_hub_call_happens_even_with_stderr_closed(monkeypatch, capsys):
    """A Hub call past its deadline leaves its thread: run_main must then leave by os._exit once the document
    is out (a thread in C code at teardown crashed the interpreter now and then), with the document's exit
    code, and a closed stderr (`2>&-`, sys.stderr None) neither skips that nor turns a success into exit 1."""
    import os
    import sys
    import time

    from epyc import cli, errors
    from epyc.facts import hf_model

    exits = []
    monkeypatch.setattr(os, "_exit", exits.append)
    monkeypatch.setattr(cli, "_ABANDONED", [])

    def main(argv):
        try:
            hf_model.with_deadline(lambda: time.sleep(2), 0.05)
        except hf_model.Unreadable as why:
            return {"said": why.message}, errors.EXIT_OK
        return {"said": "no deadline"}, errors.EXIT_FAIL

    monkeypatch.setattr(sys, "stderr", None)
    cli.run_main(main, [])
    doc = json.loads(capsys.readouterr().out)
    assert exits == [0] and doc["ok"] is True and "did not answer within 0.05s" in doc["said"], (exits, doc)
