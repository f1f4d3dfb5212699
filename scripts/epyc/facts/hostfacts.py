"""A host's facts from /proc and /sys (or a sysroot): CPUs, topology, memory, cgroup limits."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from epyc import bundle
from epyc.errors import ScriptError

_CPULIST_ITEM = re.compile(r"^([0-9]+)(?:-([0-9]+))?$", re.ASCII)
HOME_PATH = re.compile(r"(/(?!\.\.?(/|$))[\w.@+-]+)+", re.ASCII)  # absolute, no '.' or '..', nothing a shell reads
MAX_CPU_ID = 8191
MAX_PACKAGE_ID = 1023
MAX_BRAND_CHARS = 256
SYS_FILE_LIMIT = 16 << 20
LOCAL_ROOT = "/"  # this machine's /proc and /sys (macOS and Windows have neither)


def parse_cpulist(text: str) -> list[int]:
    """ "0-3,8,10-11" -> [0, 1, 2, 3, 8, 10, 11]. Empty text is the empty set. Raises ValueError."""
    text = text.strip()
    if not text:
        return []
    cpus: set[int] = set()
    for item in text.split(","):
        m = _CPULIST_ITEM.match(item.strip())
        if not m:
            raise ValueError(f"not a cpulist item: {item!r}")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"descending range in cpulist: {item!r}")
        if hi > MAX_CPU_ID:
            raise ValueError(f"CPU {hi} in cpulist {item!r}: Linux numbers CPUs 0-{MAX_CPU_ID}")
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """[0, 1, 2, 3, 8, 10, 11] -> "0-3,8,10-11" (sorted, deduplicated, ranges collapsed)."""
    ordered = sorted(set(cpus))
    if any(c < 0 for c in ordered):
        raise ValueError("negative CPU id")
    runs = [[c for _, c in run] for _, run in itertools.groupby(enumerate(ordered), lambda ic: ic[1] - ic[0])]
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


class Sysroot:
    """Reads host files below a root: "/" for this host, a captured tree for another."""

    def __init__(self, root: str | os.PathLike = "/"):
        self.root = Path(root)

    def read(self, p: str) -> str | None:
        """File text, or None when it does not exist, cannot be read or is larger than any proc/sys file."""
        try:
            with open(self.root / p.lstrip("/"), "rb") as f:
                data = f.read(SYS_FILE_LIMIT + 1)
        except (OSError, ValueError):
            return None
        return None if len(data) > SYS_FILE_LIMIT else data.decode("utf-8", errors="replace")

    def glob(self, pattern: str) -> list[Path]:
        return sorted(self.root.glob(pattern.lstrip("/")))

    def first(self, paths: list[str]) -> str | None:
        """The text of the first of `paths` that holds more than blank space."""
        return next((text for p in paths if (text := self.read(p)) and text.strip()), None)


def check_sysroot(root: str) -> Sysroot:
    sr = Sysroot(root)
    if not os.path.isdir(sr.root):
        raise ScriptError(
            f"sysroot {root[:200]!r} is not a directory",
            "pass a folder that holds proc/ and sys/ captured from the host",
        )
    if sr.read("proc/cpuinfo") is None:
        raise ScriptError(
            f"sysroot {root!r} has no readable proc/cpuinfo",
            "capture /proc/cpuinfo, /proc/meminfo and /sys/devices/system into the sysroot",
        )
    return sr


def parse_cpuinfo(text: str) -> dict:
    """First processor block of /proc/cpuinfo -> vendor, brand, family, model, flags."""
    block: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if block:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            block.setdefault(key.strip(), value.strip())
    if not block:
        raise ValueError("no processor entries in cpuinfo")

    brand = block.get("model name", "")
    if len(brand) > MAX_BRAND_CHARS:  # it is carried into every document and the plan's summary
        raise ValueError(f"has a model name of {len(brand):,} characters (a CPU's brand string is 48)")

    def as_int(key: str) -> int | None:
        raw = block.get(key)
        try:  # ASCII only: int() would read Arabic-Indic or full-width digits no kernel writes
            return int(raw, 0) if raw is not None and raw.isascii() else None
        except ValueError:
            return None

    return {
        "vendor": block.get("vendor_id") or block.get("vendor"),
        "brand": brand,
        "family": as_int("cpu family"),
        "model": as_int("model"),
        "flags": set(block.get("flags", "").split()),
    }


def parse_meminfo_bytes(text: str, key: str = "MemTotal") -> int | None:
    """'MemTotal:  24684092 kB' (or sysfs's 'Node 0 MemTotal: ...') -> bytes; past 2**60 bytes a ValueError."""
    m = re.search(rf"{key}:\s+([0-9]{{1,20}})\s*kB", text or "")
    if not m and re.search(rf"{key}:\s+[0-9]{{21}}", text or ""):
        raise ValueError(f"{key} has more digits than any memory size")
    value = int(m.group(1)) * 1024 if m else None
    if value is not None and value >= 1 << 60:
        raise ValueError(f"{key} {m.group(1)[:30]} kB is more memory than any host has")
    return value


def parse_status_allowed(text: str | None) -> list[int] | None:
    m = re.search(r"^Cpus_allowed_list:\s*(\S+)", text or "", re.M)
    return parse_cpulist(m.group(1)) if m else None


def parse_cgroup_limit(text: str | None) -> int | None:
    """cgroup v2 memory.max ('max' or bytes) / v1 limit_in_bytes (huge = unlimited) -> bytes or None."""
    try:
        value = int((text or "").strip())
    except ValueError:
        return None
    return value if 0 < value < (1 << 60) else None


def parse_cpu_quota(cpu_max: str | None, cfs_quota: str | None = None, cfs_period: str | None = None) -> float | None:
    """CPUs a cgroup may use (v2 cpu.max, else v1 cfs_quota_us / cfs_period_us), or None without a quota."""
    quota = period = None
    if cpu_max and cpu_max.split():  # 'max 100000': no quota, not a number
        quota, period = (cpu_max.split() + ["100000"])[:2]
    elif cfs_quota is not None:
        quota, period = cfs_quota.strip(), (cfs_period or "100000").strip()
    try:
        q, per = int(quota.encode("ascii")), int(period.encode("ascii"))  # ASCII digits, as the kernel writes
    except (AttributeError, TypeError, ValueError, UnicodeEncodeError):  # None: no quota
        return None
    # a hundredth at least: '1 1000000' is a real (if useless) quota, never "0 CPUs"
    return max(round(q / per, 2), 0.01) if q > 0 and per > 0 else None


def cgroup_dirs(proc_self_cgroup: str | None) -> dict[str, list[str]]:
    """Where this process's cpuset, memory and cpu controllers live, for v2 and v1 layouts."""
    cpuset = ["/sys/fs/cgroup/cpuset.cpus.effective", "/sys/fs/cgroup/cpuset/cpuset.effective_cpus"]
    memory = ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
    cpu_max = ["/sys/fs/cgroup/cpu.max"]
    cfs = ["/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"]
    for line in (proc_self_cgroup or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or parts[2] in ("", "/"):
            continue
        ctrls, path = parts[1].split(","), parts[2]
        # a limit on any parent (a systemd slice, a pod) binds too: every level, leaf to root
        levels = [path.rsplit("/", n)[0] for n in range(path.count("/")) if path.rsplit("/", n)[0]]
        if parts[1] == "":  # v2 unified
            cpuset.insert(0, f"/sys/fs/cgroup{path}/cpuset.cpus.effective")
            memory[:0] = [f"/sys/fs/cgroup{p}/memory.max" for p in levels]
            cpu_max.insert(0, f"/sys/fs/cgroup{path}/cpu.max")
        if "cpu" in ctrls:
            cfs.insert(0, f"/sys/fs/cgroup/{parts[1]}{path}")
        if "cpuset" in ctrls:
            cpuset.insert(0, f"/sys/fs/cgroup/cpuset{path}/cpuset.effective_cpus")
        if "memory" in ctrls:
            memory[:0] = [f"/sys/fs/cgroup/memory{p}/memory.limit_in_bytes" for p in levels]
    return {"cpuset": cpuset, "memory": memory, "cpu_max": cpu_max, "cfs": cfs}


@dataclass
class Topology:
    """Online CPUs and where they sit: package (socket), core, NUMA node. `package` is the socket we serve
    on: packages whose CPUs share a NUMA node are one (sharing_packages); `hw_package` keeps sysfs's own."""

    package: dict[int, int] = field(default_factory=dict)
    core: dict[int, int] = field(default_factory=dict)
    hw_package: dict[int, int] = field(default_factory=dict)
    merged: dict[int, list[int]] = field(default_factory=dict)  # served socket -> the packages it joins
    node_of_cpu: dict[int, int] = field(default_factory=dict)
    node_cpus: dict[int, list[int]] = field(default_factory=dict)
    node_mem_bytes: dict[int, int] = field(default_factory=dict)
    node_free_bytes: dict[int, int] = field(default_factory=dict)

    @property
    def cpus(self) -> list[int]:
        return sorted(self.package)

    @property
    def sockets(self) -> list[int]:
        return sorted(set(self.package.values()))

    def physical_cores(self, cpus: Sequence[int] | None = None) -> list[int]:
        """One CPU per physical core (the lowest-numbered thread): SMT siblings dropped."""
        first: dict[tuple[int, int], int] = {}
        for cpu in sorted(self.cpus if cpus is None else cpus):
            if cpu in self.package:  # core ids repeat from one package to the next
                first.setdefault((self.hw_package.get(cpu, self.package[cpu]), self.core[cpu]), cpu)
        return sorted(first.values())

    def socket_cpus(self, socket: int) -> list[int]:
        return [c for c in self.cpus if self.package[c] == socket]

    def socket_nodes(self, socket: int) -> list[int]:
        return sorted({self.node_of_cpu[c] for c in self.socket_cpus(socket) if c in self.node_of_cpu})


def sysfs_id(sr: Sysroot, where: str, limit: int, default: int) -> int:
    """A sysfs id file's ASCII digits, else `default` (absent, or -1 in a guest); past `limit` a ValueError."""
    value = (sr.read(where) or "").strip()
    if not (value.isascii() and value.isdigit()):
        return default
    if int(value) > limit:
        raise ValueError(f"{where} is {value[:20]}, past {limit}")
    return int(value)


def sharing_packages(package: dict[int, int], core: dict[int, int], node_of_cpu: dict[int, int]) -> dict[int, int]:
    """package -> the socket it is served as: one-core packages sharing a NUMA node (a VM's "sockets") are one,
    named by the lowest id; a package of more cores is a socket of its own whatever its nodes say."""
    cores_of: dict[int, set[int]] = {}
    for cpu, p in package.items():
        cores_of.setdefault(p, set()).add(core.get(cpu, cpu))
    root = {p: p for p in cores_of}

    def find(p: int) -> int:
        while root[p] != p:
            p = root[p]
        return p

    first_in_node: dict[int, int] = {}
    for cpu, node in sorted(node_of_cpu.items()):
        if cpu not in package or len(cores_of[package[cpu]]) > 1:
            continue
        here = find(package[cpu])
        there = find(first_in_node.setdefault(node, here))
        root[max(here, there)] = min(here, there)
    return {p: find(p) for p in root}


def read_topology(sr: Sysroot) -> Topology:
    online_text = sr.read("sys/devices/system/cpu/online")
    topo = Topology()
    if online_text is not None:
        online = parse_cpulist(online_text)
    else:
        online = sorted(int(p.name[3:]) for p in sr.glob("sys/devices/system/cpu/cpu[0-9]*"))
    for cpu in online:
        base = f"sys/devices/system/cpu/cpu{cpu}/topology"
        topo.package[cpu] = sysfs_id(sr, f"{base}/physical_package_id", MAX_PACKAGE_ID, 0)
        topo.core[cpu] = sysfs_id(sr, f"{base}/core_id", 1 << 20, cpu)
    for node_dir in sr.glob("sys/devices/system/node/node[0-9]*"):
        node, rel = int(node_dir.name[4:]), node_dir.relative_to(sr.root)
        cpus = [c for c in parse_cpulist(sr.read(f"{rel}/cpulist") or "") if c in topo.package]
        topo.node_cpus[node] = cpus
        for c in cpus:
            if topo.node_of_cpu.setdefault(c, node) != node:  # a kernel lists each CPU in one node
                raise ScriptError(
                    f"CPU {c} is listed by NUMA nodes {topo.node_of_cpu[c]} and {node} (sys/devices/system/node/node*/cpulist): no kernel writes that",
                    "re-capture sys/devices/system/node from the host (detect.py --capture)",
                )
        meminfo = sr.read(f"{rel}/meminfo") or ""
        for figures, key in ((topo.node_mem_bytes, "MemTotal"), (topo.node_free_bytes, "MemFree")):
            if (value := parse_meminfo_bytes(meminfo, key)) is not None:
                figures[node] = value
    if not topo.node_cpus:  # kernel without NUMA: one node holding everything
        topo.node_cpus[0] = topo.cpus
        topo.node_of_cpu = {c: 0 for c in topo.cpus}
    if not topo.package:
        raise ScriptError(
            "no online CPUs found under sys/devices/system/cpu",
            "capture /sys/devices/system/cpu (online, cpu*/topology) into the sysroot",
        )
    served = sharing_packages(topo.package, topo.core, topo.node_of_cpu)
    if any(p != s for p, s in served.items()):
        topo.hw_package = dict(topo.package)
        topo.package = {cpu: served[p] for cpu, p in topo.package.items()}
        for p, s in sorted(served.items()):
            topo.merged.setdefault(s, []).append(p)
        topo.merged = {s: ps for s, ps in topo.merged.items() if len(ps) > 1}
    return topo


def merged_note(topo: Topology) -> list[str]:
    """What detect.py and cpu_tune.py say when packages were joined (sharing_packages)."""
    return [
        f"packages {format_cpulist(ps)} share NUMA node(s) {format_cpulist(topo.socket_nodes(s))}: one-core packages of one memory domain (a VM's sockets), served as socket {s}"
        for s, ps in sorted(topo.merged.items())
    ]


@dataclass
class HostFacts:
    target: str
    cpu: dict
    topology: Topology
    mem_total_bytes: int
    allowed_cpus: list[int]
    memory_limit_bytes: int | None
    hypervisor: str | None
    cpu_quota: float | None = None
    home: str | None = None  # another host's login home (ssh, a capture): a plain absolute path, or None

    def memory(self, tolerance: float) -> dict:
        """Usable RAM: the smaller of MemTotal and the cgroup limit. Per-node sysfs figures that do not add up to
        MemTotal are said: per-socket sizing then takes the smaller, as vLLM checks its KV cache against sysfs."""
        mem_total, limit, node_mem = self.mem_total_bytes, self.memory_limit_bytes, self.topology.node_mem_bytes
        usable = min(mem_total, limit) if limit else mem_total
        if usable < bundle.GIB // 200:  # a figure no machine runs on (it printed as 0.0 GiB of RAM)
            where = "the cgroup memory limit" if limit and limit < mem_total else "MemTotal in /proc/meminfo"
            raise ScriptError(
                f"usable RAM reads {usable:,} bytes ({where}): not the memory of a machine that runs anything",
                "check that figure: a cgroup memory.max written in bytes where GiB were meant, or a --sysroot / capture with a broken meminfo",
            )
        notes = []
        sysfs_total = sum(node_mem.values())
        consistent = bool(node_mem) and abs(sysfs_total - mem_total) <= tolerance * mem_total
        if node_mem and not consistent:
            notes.append(
                f"sysfs node meminfo sums to {bundle.gb(sysfs_total)} GiB but /proc/meminfo says {bundle.gb(mem_total)} GiB; per-socket sizing uses the smaller figure, because vLLM checks its KV cache against the node's sysfs meminfo"
            )
        if limit and limit < mem_total:
            notes.append(f"cgroup memory limit {bundle.gb(limit)} GiB is below MemTotal; using the limit")
        return {"usable_bytes": usable, "sysfs_consistent": consistent, "notes": notes}


def gather(sr: Sysroot, target: str, live: bool) -> HostFacts:
    """Read every fact detect and cpu_tune need from a sysroot (or this host, live=True)."""
    try:
        cpu = parse_cpuinfo(sr.read("proc/cpuinfo") or "")
    except ValueError as why:
        raise ScriptError(
            f"{target}: proc/cpuinfo is missing or malformed ({why})",
            "check that /proc/cpuinfo is readable (a sysroot needs proc/cpuinfo, as the kernel writes it)",
        )
    try:
        topo = read_topology(sr)
        cg = cgroup_dirs(sr.read("proc/self/cgroup"))
        cpuset_text = sr.first(cg["cpuset"])
        cgroup_cpus = parse_cpulist(cpuset_text) if cpuset_text else topo.cpus
        if live:
            import psutil

            mem_total = psutil.virtual_memory().total
            allowed = sorted(psutil.Process().cpu_affinity())
        else:
            mem_total = parse_meminfo_bytes(sr.read("proc/meminfo") or "")
            allowed = parse_status_allowed(sr.read("proc/self/status"))
    except ValueError as exc:
        raise ScriptError(
            f"{target}: malformed topology file: {exc}",
            "re-capture /sys/devices/system and /proc/self/status from the host",
        )
    if not mem_total:  # none, or 0: no host runs on no memory
        raise ScriptError(
            f"{target}: proc/meminfo has no MemTotal" + (" above 0" if mem_total == 0 else ""),
            "check that /proc/meminfo is readable (a sysroot needs proc/meminfo)",
        )
    allowed_set = set(topo.cpus if allowed is None else allowed) & set(topo.cpus) & set(cgroup_cpus)
    limit = min(filter(None, (parse_cgroup_limit(sr.read(p)) for p in cg["memory"])), default=None)
    cfs_dir = next((d for d in cg["cfs"] if sr.read(f"{d}/cpu.cfs_quota_us") is not None), None)
    cfs = [sr.read(f"{cfs_dir}/cpu.cfs_{name}_us") if cfs_dir else None for name in ("quota", "period")]
    quota = parse_cpu_quota(sr.first(cg["cpu_max"]), *cfs)
    hyper = None
    if "hypervisor" in cpu["flags"]:
        vendor = sr.read("sys/hypervisor/type") or sr.read("sys/class/dmi/id/sys_vendor") or ""
        hyper = vendor.strip() or "unknown (virtualized)"
    home = None if live else (sr.read("HOME") or "").strip()
    home = home if home and HOME_PATH.fullmatch(home) else None  # the host's text, perhaps hostile
    return HostFacts(target, cpu, topo, mem_total, sorted(allowed_set), limit, hyper, quota, home)
