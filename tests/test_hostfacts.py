"""epyc.facts.hostfacts: its decisions, tested in-process."""

import pytest
from epyc.facts import hostfacts
from hypothesis import given
from hypothesis import strategies as st


def test_parse_meminfo_bytes_bounds():
    from epyc.facts import hostfacts

    assert hostfacts.parse_meminfo_bytes("MemTotal:  24684092 kB") == 24684092 * 1024
    assert hostfacts.parse_meminfo_bytes("Node 0 MemTotal:       0 kB") == 0  # a memoryless node is real
    assert hostfacts.parse_meminfo_bytes("MemFree: 1 kB") is None
    for bad in ("MemTotal: " + "1" * 21 + " kB", f"MemTotal: {(1 << 50)} kB"):
        with pytest.raises(ValueError):
            hostfacts.parse_meminfo_bytes(bad)


@given(st.sets(st.integers(min_value=0, max_value=4096), max_size=300))
def test_cpulist_round_trip(cpus):
    text = hostfacts.format_cpulist(cpus)
    assert hostfacts.parse_cpulist(text) == sorted(cpus)
    # canonical: formatting the parse gives the same text back
    assert hostfacts.format_cpulist(hostfacts.parse_cpulist(text)) == text


@pytest.mark.parametrize(
    "text,expected",
    [
        ("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]),
        ("5", [5]),
        ("", []),
        (" 0-1\n", [0, 1]),
        ("3,1,2", [1, 2, 3]),
    ],
)
def test_parse_cpulist_examples(text, expected):
    assert hostfacts.parse_cpulist(text) == expected


@pytest.mark.parametrize("bad", ["a", "3-1", "1,,2", "-1", "1-", "0-99999999", "1 2"])
def test_parse_cpulist_rejects(bad):
    with pytest.raises(ValueError):
        hostfacts.parse_cpulist(bad)


@given(st.text(max_size=40))
def test_parse_cpulist_garbage_is_valueerror_or_list(text):
    try:
        out = hostfacts.parse_cpulist(text)
    except ValueError:
        return
    assert out == sorted(set(out))


def test_format_cpulist_collapses():
    assert hostfacts.format_cpulist([11, 10, 0, 1, 2, 3, 8, 3]) == "0-3,8,10-11"


def test_a_parent_cgroups_memory_limit_bounds_the_ram(tmp_path):
    """A limit on a systemd slice or a pod's parent binds a leaf without one: the tightest on the path."""
    import dataclasses

    from sysroots import HOSTS, build

    root = build(tmp_path / "sr", dataclasses.replace(HOSTS["genoa_9654_2s_smt"], cgroup_memory_max="max"))
    (root / "proc/self/cgroup").write_text("0::/kubepods.slice/pod1/ctr\n")
    for level, limit in (("kubepods.slice", "max"), ("kubepods.slice/pod1", str(64 << 30))):
        (root / "sys/fs/cgroup" / level).mkdir(parents=True, exist_ok=True)
        (root / "sys/fs/cgroup" / level / "memory.max").write_text(limit + "\n")
    (root / "sys/fs/cgroup/kubepods.slice/pod1/ctr").mkdir()
    (root / "sys/fs/cgroup/kubepods.slice/pod1/ctr/memory.max").write_text(str(128 << 30) + "\n")
    facts = hostfacts.gather(hostfacts.Sysroot(root), "sysroot:x", live=False)
    assert facts.memory_limit_bytes == 64 << 30
