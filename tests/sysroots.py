"""Build sysroot trees (proc/ + sys/) for the hosts the scripts must handle.

Each host is a compact spec turned into the real files the kernel would expose, numbered the way
Linux numbers them (all first threads across sockets, then the SMT siblings), so detect.py and
cpu_tune.py read them exactly as they read a live host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

ZEN4_FLAGS = "fpu sse sse2 avx avx2 fma hypervisor avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512_vnni"
ZEN3_FLAGS = "fpu sse sse2 avx avx2 fma"
SPR_FLAGS = "fpu sse sse2 avx avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile amx_int8"


@dataclass
class HostSpec:
    brand: str
    family: int
    model: int
    flags: str = ZEN4_FLAGS
    vendor: str = "AuthenticAMD"
    sockets: int = 1
    cores: int = 2  # per socket
    threads: int = 1  # per core
    nodes_per_socket: int = 1
    node_mem_gib: float = 8.0
    memtotal_gib: float | None = None  # default: the sum of the nodes
    allowed: str | None = None  # Cpus_allowed_list (None: every CPU)
    cgroup_cpuset: str | None = None  # cgroup v2 cpuset.cpus.effective for the process's cgroup
    cgroup_memory_max: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def ncpu(self) -> int:
        return self.sockets * self.cores * self.threads


def cpu_layout(spec: HostSpec) -> list[tuple[int, int, int, int]]:
    """(cpu, socket, core_id, node) in Linux order: thread-major, then socket, then core."""
    out = []
    per_node = spec.cores // spec.nodes_per_socket
    for t in range(spec.threads):
        for s in range(spec.sockets):
            for c in range(spec.cores):
                cpu = t * spec.sockets * spec.cores + s * spec.cores + c
                node = s * spec.nodes_per_socket + min(c // per_node, spec.nodes_per_socket - 1)
                out.append((cpu, s, c, node))
    return sorted(out)


def _cpulist(ids) -> str:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from epyc.facts.hostfacts import format_cpulist

    return format_cpulist(ids)


def build(root: Path, spec: HostSpec) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    layout = cpu_layout(spec)
    w = lambda rel, text: (root / rel).parent.mkdir(parents=True, exist_ok=True) or (root / rel).write_text(text)  # noqa: E731
    blocks = []
    for cpu, s, c, _ in layout:
        blocks.append(
            f"processor\t: {cpu}\nvendor_id\t: {spec.vendor}\ncpu family\t: {spec.family}\n"
            f"model\t\t: {spec.model}\nmodel name\t: {spec.brand}\nphysical id\t: {s}\n"
            f"core id\t\t: {c}\nflags\t\t: {spec.flags}\n"
        )
    w("proc/cpuinfo", "\n".join(blocks) + "\n")
    nnodes = spec.sockets * spec.nodes_per_socket
    total_kb = int((spec.memtotal_gib if spec.memtotal_gib is not None else spec.node_mem_gib * nnodes) * 1024 * 1024)
    w("proc/meminfo", f"MemTotal:       {total_kb} kB\nMemFree:        {total_kb // 2} kB\n")
    allowed = spec.allowed or _cpulist([x[0] for x in layout])
    w("proc/self/status", f"Name:\tcat\nCpus_allowed_list:\t{allowed}\n")
    w("proc/self/cgroup", "0::/test.slice\n" if (spec.cgroup_cpuset or spec.cgroup_memory_max) else "0::/\n")
    if spec.cgroup_cpuset:
        w("sys/fs/cgroup/test.slice/cpuset.cpus.effective", spec.cgroup_cpuset + "\n")
    if spec.cgroup_memory_max:
        w("sys/fs/cgroup/test.slice/memory.max", spec.cgroup_memory_max + "\n")
    w("sys/devices/system/cpu/online", _cpulist([x[0] for x in layout]) + "\n")
    for cpu, s, c, _ in layout:
        base = f"sys/devices/system/cpu/cpu{cpu}/topology"
        w(f"{base}/physical_package_id", f"{s}\n")
        w(f"{base}/core_id", f"{c}\n")
    node_kb = int(spec.node_mem_gib * 1024 * 1024)
    for node in range(nnodes):
        cpus = [x[0] for x in layout if x[3] == node]
        w(f"sys/devices/system/node/node{node}/cpulist", _cpulist(cpus) + "\n")
        w(
            f"sys/devices/system/node/node{node}/meminfo",
            f"Node {node} MemTotal:       {node_kb} kB\nNode {node} MemFree:        {node_kb // 2} kB\n",
        )
    for rel, text in spec.extra.items():
        w(rel, text)
    return root


HOSTS: dict[str, HostSpec] = {
    # This runner as it really reads: masked brand, CPUID 0x1A/0x02, sysfs node0 far below MemTotal.
    "runner": HostSpec("AMD EPYC", 26, 2, cores=2, node_mem_gib=8.0, memtotal_gib=24.0),
    # The same masking on a Genoa guest (CPUID 0x19/0x11).
    "masked_genoa": HostSpec("AMD EPYC", 25, 17, cores=2, node_mem_gib=8.0, memtotal_gib=24.0),
    "genoa_9654_2s_smt": HostSpec(
        "AMD EPYC 9654 96-Core Processor", 25, 17, sockets=2, cores=96, threads=2, node_mem_gib=384.0
    ),
    "turin_9755_2s_nps4": HostSpec(
        "AMD EPYC 9755 128-Core Processor", 26, 2, sockets=2, cores=128, nodes_per_socket=4, node_mem_gib=192.0
    ),
    "milan_7763": HostSpec(
        "AMD EPYC 7763 64-Core Processor", 25, 1, flags=ZEN3_FLAGS, sockets=2, cores=64, threads=2, node_mem_gib=256.0
    ),
    "bergamo_9754": HostSpec("AMD EPYC 9754 128-Core Processor", 25, 160, cores=128, threads=2, node_mem_gib=768.0),
    "epyc_4584px": HostSpec("AMD EPYC 4584PX 16-Core Processor", 25, 97, cores=16, threads=2, node_mem_gib=128.0),
    "xeon_8480": HostSpec(
        "Intel(R) Xeon(R) Platinum 8480+",
        6,
        143,
        flags=SPR_FLAGS,
        vendor="GenuineIntel",
        sockets=2,
        cores=56,
        threads=2,
        node_mem_gib=512.0,
    ),
    # Dual Genoa, but this process's cgroup holds only part of socket 1 (cores 100-119 + siblings)
    # and 64 GiB of memory.
    "genoa_cgroup_part": HostSpec(
        "AMD EPYC 9654 96-Core Processor",
        25,
        17,
        sockets=2,
        cores=96,
        threads=2,
        node_mem_gib=384.0,
        cgroup_cpuset="100-119,292-311",
        cgroup_memory_max=str(64 * 1024**3),
    ),
}
