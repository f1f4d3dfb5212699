"""The probe of what the engine's cores deliver (scripts/epyc/facts/probe.py): a figure no machine has is no figure,
and a stack that cannot run it says why instead of a number. The real probe runs in the e2e chain (test_e2e.py)."""

from __future__ import annotations

from conftest import _interpreter
from epyc.facts import probe


def test_a_figure_no_machine_has_is_no_figure(tmp_path):
    bad = ('{"bytes_per_s": 1e999, "bf16_flops_per_s": 1e12}', '{"bytes_per_s": 1e15, "bf16_flops_per_s": 1e12}')
    for doc in (*bad, '{"bytes_per_s": 0, "bf16_flops_per_s": 1e12}', '{"bytes_per_s": 5e10}'):
        found, why = probe.measure([_interpreter(tmp_path, "@@PROBE@@" + doc)], [0])
        assert found is None and why, doc
    good = '{"bytes_per_s": 5e10, "bf16_flops_per_s": 2e12, "cpus": [0]}'
    assert probe.measure([_interpreter(tmp_path, "@@PROBE@@" + good)], [0]) == (
        {"bytes_per_s": 5e10, "bf16_flops_per_s": 2e12},
        "",
    )


def test_without_a_stack_to_run_it_the_plan_is_told_why(tmp_path):
    tune = {"ranks": [{"cpus": "0-1", "numa_node": 0}, {"cpus": "2-3", "numa_node": 1}], "host_pin_tool": None}
    assert probe.for_engine(None, tune)["why"].startswith("not measured: no stack to run the probe")
    broken = {"python": _interpreter(tmp_path, "no marker here"), "image": None}
    assert probe.for_engine(broken, tune) == {"why": "not measured: no output"}
    measured = {"python": _interpreter(tmp_path, '@@PROBE@@{"bytes_per_s": 5e10, "bf16_flops_per_s": 2e12}')}
    assert probe.for_engine(measured, tune) == {"bytes_per_s": 5e10, "bf16_flops_per_s": 2e12, "cpus": "0-1"}
    # numactl on the host: the probe's memory on the first rank's node, as vLLM keeps it (numactl runs for real)
    pinned = probe.for_engine(measured, {**tune, "host_pin_tool": "numactl"})
    assert pinned == {"bytes_per_s": 5e10, "bf16_flops_per_s": 2e12, "cpus": "0-1"}
