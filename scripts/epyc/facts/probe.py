"""What the engine's cores deliver, measured in a few seconds under its pin: memory bandwidth and bf16 matmul FLOP/s."""

from __future__ import annotations

from epyc import masking, subproc
from epyc.facts import architectures, hostfacts

# bandwidth: the faster of torch's threads over one buffer and one process per CPU (which wins differs by CPU); each
# CPU's buffer is allocated after its pin, so first touch puts it on that CPU's own node; then a bf16 matmul loop
PROBE_CODE = r"""
import json, os, time
import multiprocessing as mp
cpus = %(cpus)r
def per_cpu(cpu, q):
    import numpy as np
    os.sched_setaffinity(0, {cpu})
    a = np.ones(1024 * 1024 * 1024 // 8 // len(cpus))
    a.sum()
    t0 = time.perf_counter(); n = 0
    while time.perf_counter() - t0 < 1.0:
        a.sum(); n += 1
    q.put(n * a.nbytes / (time.perf_counter() - t0))
if __name__ == "__main__":
    os.sched_setaffinity(0, set(cpus))
    import torch
    torch.set_num_threads(len(cpus))
    t = torch.ones(1024 * 1024 * 1024 // 4, dtype=torch.float32)
    t.sum()
    threads = 0.0
    for _ in range(8):
        t0 = time.perf_counter(); t.sum(); threads = max(threads, t.nbytes / (time.perf_counter() - t0))
    del t
    q = mp.Queue()
    ps = [mp.Process(target=per_cpu, args=(c, q)) for c in cpus]
    [p.start() for p in ps]
    processes = sum(q.get() for _ in ps)
    [p.join() for p in ps]
    m = torch.ones(2048, 2048, dtype=torch.bfloat16)
    m @ m
    flops = 0.0
    for _ in range(6):
        t0 = time.perf_counter(); m @ m; m @ m; flops = max(flops, 4 * 2048 ** 3 / (time.perf_counter() - t0))
    print("@@PROBE@@" + json.dumps({"bytes_per_s": max(threads, processes), "bf16_flops_per_s": flops, "cpus": cpus}))
"""
# figures a machine could measure: up to 100 TB/s (a whole Turin socket reads ~0.6 TB/s), 1 EFLOP/s
PROBE_SHAPE = {
    "type": "object",
    "required": ["bytes_per_s", "bf16_flops_per_s"],
    "properties": {
        "bytes_per_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 1e14},
        "bf16_flops_per_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 1e18},
    },
}


def measure(prefix: list[str], cpus: list[int]) -> tuple[dict | None, str]:
    """({bytes_per_s, bf16_flops_per_s}, "") of `cpus`, run as `prefix -c` (a pin and the stack's python), or
    (None, why)."""
    if not cpus:
        return None, "no CPUs to measure"
    found, why = subproc.run_probe(prefix, PROBE_CODE % {"cpus": cpus}, "@@PROBE@@", timeout=180, shape=PROBE_SHAPE)
    return (found and {k: found[k] for k in PROBE_SHAPE["required"]}), why


def for_engine(val: dict | None, tune: dict) -> dict:
    """cpu_tune's `measured`: the probe on the first rank's CPUs with its memory on that rank's node (where vLLM keeps
    an engine's memory), run by the stack validate chose; or why not."""
    if not val or not (val.get("python") or val.get("image")):
        return {"why": "not measured: no stack to run the probe (run validate.py first: its python or image runs it)"}
    cpus, node = tune["ranks"][0]["cpus"], tune["ranks"][0].get("numa_node")
    prefix, _ = architectures.probe_argv(val.get("python"), val.get("image"), val.get("runtime"), val.get("engine"))
    if val.get("image"):
        mems = [] if node is None else [f"--cpuset-mems={node}"]
        prefix[prefix.index("run") + 1 : prefix.index("run") + 1] = [f"--cpuset-cpus={cpus}", *mems]
    elif tune.get("host_pin_tool") == "numactl" and node is not None:
        prefix = ["numactl", f"--membind={node}", *prefix]
    found, why = measure(prefix, hostfacts.parse_cpulist(cpus))
    return {**found, "cpus": cpus} if found else {"why": f"not measured: {masking.clip(why, 300)}"}
