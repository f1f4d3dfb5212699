"""epyc.facts.remote_host: its decisions, tested in-process."""

import pytest
from epyc import errors
from epyc.facts import remote_host


@pytest.mark.parametrize(
    "spec,user,host,port",
    [
        ("box", None, "box", None),
        ("me@box.example:2222", "me", "box.example", 2222),
        ("root@127.0.0.1", "root", "127.0.0.1", None),
    ],
)
def test_parse_host(spec, user, host, port):
    t = remote_host.parse_host(spec)
    assert (t.user, t.host, t.port) == (user, host, port)


@pytest.mark.parametrize("bad", ["-oProxyCommand=sh", "a b", "me@", "box:99999", "box;rm", ""])
def test_parse_host_rejects_option_like_and_garbage(bad):
    with pytest.raises(errors.ScriptError):
        remote_host.parse_host(bad)


def test_ssh_argv_quotes_remote_words():
    argv = remote_host.ssh_argv(remote_host.parse_host("me@box:2222"), ["sh", "-c", "echo $HOME; cat /x"])
    assert argv[:2] == ["ssh", "-o"] and "BatchMode=yes" in argv and "-p" in argv
    assert argv[-2] == "--"
    assert argv[-1] == "sh -c 'echo $HOME; cat /x'"
