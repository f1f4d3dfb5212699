"""scripts/bootstrap.py: its contract and its decisions."""


def test_no_script_leaves_a_file_a_pipe_or_a_detached_server_to_its_finaliser(script, tmp_path):
    """PYTHONWARNINGS=error (some CI shells) turned each unclosed probe pipe into a traceback on stderr.
    conftest runs every script with ResourceWarning as an error; this is the audit's own repro."""
    r = script("bootstrap.py", "--check", env={"PYTHONWARNINGS": "error"})
    assert r.code == 0 and "Exception ignored" not in r.stderr and "ResourceWarning" not in r.stderr
