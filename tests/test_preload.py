"""epyc.facts.preload: its decisions, tested in-process."""

import pytest
from epyc.bundle import load_epyc
from epyc.errors import ScriptError
from epyc.facts import preload


# ---- the fifth audit (~840 cases, a fresh helper session on the fixes above): F1-F10
def test_ld_preload_is_only_the_pinned_libraries_even_split_on_spaces():
    """The loader splits LD_PRELOAD on spaces and colons and expands $LIB: a space let a /tmp library in."""
    libs = load_epyc()["host_stack"]["ld_preload_libs"]
    good = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
    for ok in (good, good + ".5.9", f"{good}:/opt/conda/lib/libiomp5.so"):
        assert preload.preload_value(ok, libs) == ok
    for bad in (
        f"{good} /tmp/evil/libtcmalloc_minimal.so.4",
        f"{good}\t",
        "/usr/lib//libtcmalloc.so.4",
        "/usr/lib/libtcmalloc.so.4x",
        "/usr/lib/$LIB/libtcmalloc.so.4",
        "/usr/lib/libtcmalloc.so.4.x",
        5,
    ):
        with pytest.raises(ScriptError, match="LD_PRELOAD"):
            preload.preload_value(bad, libs)


def test_preload_names_only_the_pinned_libraries():
    libs = load_epyc()["host_stack"]["ld_preload_libs"]
    ok = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.9"
    assert preload.preload_value(ok, libs) == ok
    for bad in ("/tmp/evil.so", "libtcmalloc_minimal.so.4", f"{ok}:/tmp/x.so"):
        with pytest.raises(ScriptError):
            preload.preload_value(bad, libs)
