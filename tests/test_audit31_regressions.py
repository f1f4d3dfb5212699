"""Regressions from the thirty-first independent audit (2026-12-03, a fresh helper on b40ee60: ~230 cases, 10
findings, on sizing real model configs, remote planning and hostile sysroot trees, bench's flags). The sizing
findings (Gemma-3's class defaults, Mistral's consolidated.safetensors, the model length keys, Qwen2's
max_window_layers) are in test_estimate_memory.py beside the other sizing tests. Classes: tests/BAD_INPUT.md."""
import json

import bench
from test_launch import calls, container_plan, inputs, plan_args, rt  # noqa: F401


def test_a_bench_matrix_longer_than_the_plan_serves_is_refused_before_anything_runs(script, inputs, rt, tmp_path):  # noqa: F811
    """F5: a plan served at --max-model-len 4096 got `--random-input-len 1000000 --random-output-len 65536`;
    vLLM answers 400 to every such request and bench ended blaming the endpoint. Refused up front; a
    concurrency past --max-num-seqs is run, with a warning that its latencies include the queue."""
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    limit, seqs = plan["max_model_len"], plan["sizing"]["max_num_seqs"]
    before = len(calls(d))
    r = script("bench.py", "--plan", str(plan_file), "--input-lens", str(limit), "--output-len", "1",
               "--out", str(tmp_path / "b"), env=env, timeout=120)
    assert r.code == 1 and f"is {limit + 1} tokens a request, past the plan's --max-model-len {limit}" in r.doc["error"]
    assert f"within {limit} tokens" in r.doc["fix"] and len(calls(d)) == before  # not even asked about the server
    assert not (tmp_path / "b").exists()
    assert bench.matrix_against_the_plan(plan, [limit - 1], 1, [1]) == (None, [])
    error, warnings = bench.matrix_against_the_plan(plan, [16], 16, [1, seqs, seqs + 1, 4 * seqs])
    assert error is None and warnings == [
        f"--concurrency {seqs + 1},{4 * seqs} is past the plan's --max-num-seqs {seqs}: the server runs {seqs} at "
        "once and queues the rest, so TTFT and E2EL include that wait"]
    assert bench.matrix_against_the_plan({**plan, "sizing": {"max_num_seqs": None}}, [16], 16, [10 ** 6])[1] == []


def test_a_memory_figure_no_machine_runs_on_is_named_at_its_source(script, tmp_path):
    """F7: `--ram-gb-per-socket 0.001` (inside the flag's range then) and a cgroup memory.max of 4096 bytes
    ended in "detect.py read facts it cannot describe: field ram_gb: 0.0 ...", a fix about model files. The
    flag's range is a socket's (1 GiB and up); the cgroup figure is named where it comes from."""
    import dataclasses
    from sysroots import HOSTS, build
    r = script("detect.py", "--spec", "9654", "--ram-gb-per-socket", "0.001")
    assert r.code == 1 and "--ram-gb-per-socket: 0.001 is out of range (expected from 1 to 65536)" in r.doc["error"]
    build(tmp_path / "sr", dataclasses.replace(HOSTS["genoa_9654_2s_smt"], cgroup_memory_max="4096"))
    r = script("detect.py", "--sysroot", str(tmp_path / "sr"))
    assert r.code == 1 and r.doc["error"].startswith("usable RAM reads 4,096 bytes (the cgroup memory limit)")
    assert "memory.max" in r.doc["fix"] and "field ram_gb" not in r.doc["error"]


def _vm(tmp, sockets: int, nodes: int):
    """A guest of `sockets` one-core packages (VMware's default cores-per-socket = 1, QEMU's -smp N) whose
    CPUs sit in `nodes` NUMA nodes, in order: no package has a node of its own."""
    import shutil
    from sysroots import HostSpec, build
    root = build(tmp / f"vm{sockets}x{nodes}", HostSpec("AMD EPYC 9654 96-Core Processor", 25, 17, sockets=sockets,
                                                       cores=1, node_mem_gib=8.0))
    per = sockets // nodes
    for n in range(sockets):
        shutil.rmtree(root / f"sys/devices/system/node/node{n}")
    for n in range(nodes):
        node = root / f"sys/devices/system/node/node{n}"
        node.mkdir(parents=True)
        (node / "cpulist").write_text(f"{n * per}-{n * per + per - 1}\n")
        (node / "meminfo").write_text(f"Node {n} MemTotal: {32 * 1024 ** 2} kB\n")
    return root


def test_a_vm_of_one_core_sockets_in_one_node_is_served_on_all_its_cpus(script, tmp_path):
    """F4: 8 one-core "sockets" in one NUMA node were served on socket 0 alone: one vCPU of eight, no warning.
    Packages that share a node are one memory domain, served as one socket; with two nodes, two sockets."""
    root = _vm(tmp_path, 8, 1)
    r = script("cpu_tune.py", "--sysroot", str(root), "--weight-gb", "8", "--kv-needed-gb", "2")
    assert r.code == 0 and r.doc["omp_threads"] == 8 and r.doc["vllm_cpu_omp_threads_bind"] == "0-7"
    assert r.doc["container_cpuset_argv"] == ["--cpuset-cpus=0-7", "--cpuset-mems=0"] and len(r.doc["sockets"]) == 1
    assert "packages 0-7 share NUMA node(s) 0: one memory domain, served as socket 0" in r.doc["notes"][-1]
    d = script("detect.py", "--sysroot", str(root)).doc
    assert (d["socket_count"], d["physical_cores"], d["logical_cores"]) == (1, 8, 8)
    r = script("cpu_tune.py", "--sysroot", str(_vm(tmp_path, 8, 2)), "--weight-gb", "8", "--kv-needed-gb", "2")
    assert r.code == 0 and [s["cpus"] for s in r.doc["sockets"]] == ["0-3", "4-7"] and r.doc["omp_threads"] == 4
    assert r.doc["numa_nodes"] == [0]


def test_packages_are_joined_only_through_a_shared_node():
    import detect
    two_sockets = {0: 0, 1: 0, 2: 1, 3: 1}
    assert detect.sharing_packages(two_sockets, {0: 0, 1: 0, 2: 1, 3: 1}) == {0: 0, 1: 1}  # a real 2P: apart
    assert detect.sharing_packages(two_sockets, {0: 0, 1: 1, 2: 1, 3: 2}) == {0: 0, 1: 0}  # node 1 spans both
    assert detect.sharing_packages({0: 2, 1: 1, 2: 0}, {0: 0, 1: 1, 2: 1}) == {0: 0, 1: 0, 2: 2}
    assert detect.sharing_packages({0: 0, 1: 1}, {}) == {0: 0, 1: 1}  # no NUMA sysfs read: nothing is joined


def test_a_cpu_two_nodes_list_is_refused(script, tmp_path):
    """F8: node1 claiming CPUs node0 lists made the later node win, and the plan bound memory to it."""
    from sysroots import HOSTS, build
    root = build(tmp_path / "sr", HOSTS["genoa_9654_2s_smt"])
    (root / "sys/devices/system/node/node1/cpulist").write_text("0-15\n")
    for name in ("detect.py", "cpu_tune.py"):
        r = script(name, "--sysroot", str(root))
        assert r.code == 1 and r.doc["error"].startswith("CPU 0 is listed by NUMA nodes 0 and 1"), r.doc
        assert "re-capture" in r.doc["fix"]
