#!/usr/bin/env python3
"""Detect the CPU: is this an AMD EPYC, which generation, can zentorch run, how big is it.

    python3 scripts/detect.py                    # this host
    python3 scripts/detect.py --sysroot DIR      # a captured tree (DIR/proc, DIR/sys)
    python3 scripts/detect.py --host user@box    # another host, through one ssh call

Exit 0 with the facts; exit 1 with {"error", "fix"} when the facts cannot be read.
`route` is SKILL.md's routing for this CPU (zentorch | confirm | stock_offer | stop), with the reason.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import host_spec  # noqa: E402
from common import ScriptError, Sysroot  # noqa: E402

SSH_TIMEOUT_S = 30
TARGET_FILE = "EPYC_TARGET"  # in a rendered sysroot: the described host's label, so cpu_tune names the same host

# ---------------------------------------------------------------- pure parsing


MAX_BRAND_CHARS = 256  # CPUID's brand string is 48 bytes; a hypervisor's model-id is no longer


def this_cpu() -> dict | None:
    """parse_cpuinfo of this machine's /proc/cpuinfo, or None where it cannot be read."""
    try:
        return parse_cpuinfo(common.Sysroot("/").read("proc/cpuinfo") or "")
    except ValueError:
        return None


def this_cpu_has(flag: str) -> bool:
    return flag in ((this_cpu() or {}).get("flags") or ())


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
    """'MemTotal:  24684092 kB' (also sysfs's 'Node 0 MemTotal: ...') -> bytes. Past 2**60 bytes (an
    exbibyte, no host has it) it is a ValueError, a malformed file: a figure with hundreds of digits
    overflowed every float it was sized with."""
    m = re.search(rf"{key}:\s+([0-9]{{1,20}})\s*kB", text or "")
    if not m and re.search(rf"{key}:\s+[0-9]{{21}}", text or ""):
        raise ValueError(f"{key} has more digits than any memory size")
    value = int(m.group(1)) * 1024 if m else None
    if value is not None and value >= 1 << 60:
        raise ValueError(f"{key} {m.group(1)[:30]} kB is more memory than any host has")
    return value


def parse_status_allowed(text: str | None) -> list[int] | None:
    m = re.search(r"^Cpus_allowed_list:\s*(\S+)", text or "", re.M)
    return common.parse_cpulist(m.group(1)) if m else None


def parse_cgroup_limit(text: str | None) -> int | None:
    """cgroup v2 memory.max ('max' or bytes) / v1 limit_in_bytes (huge = unlimited) -> bytes or None."""
    if text is None:
        return None
    raw = text.strip()
    if not raw or raw == "max":
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if 0 < value < (1 << 60) else None  # 0 or negative is no usable limit


def parse_cpu_quota(cpu_max: str | None, cfs_quota: str | None = None, cfs_period: str | None = None) -> float | None:
    """CPUs a cgroup may use: v2 cpu.max ('max 100000' or '400000 100000'), or v1 cfs_quota_us /
    cfs_period_us (-1 = none). None when there is no quota. A pod limited to 4 CPUs on a 192-core
    host must not get 96 OMP threads."""
    quota = period = None
    if cpu_max and cpu_max.split():
        parts = cpu_max.split()
        if parts[0] == "max":
            return None
        quota, period = parts[0], (parts[1] if len(parts) > 1 else "100000")
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
        if parts[1] == "":  # v2 unified
            cpuset.insert(0, f"/sys/fs/cgroup{path}/cpuset.cpus.effective")
            memory.insert(0, f"/sys/fs/cgroup{path}/memory.max")
            cpu_max.insert(0, f"/sys/fs/cgroup{path}/cpu.max")
        if "cpu" in ctrls:
            cfs.insert(0, f"/sys/fs/cgroup/{parts[1]}{path}")
        if "cpuset" in ctrls:
            cpuset.insert(0, f"/sys/fs/cgroup/cpuset{path}/cpuset.effective_cpus")
        if "memory" in ctrls:
            memory.insert(0, f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
    return {"cpuset": cpuset, "memory": memory, "cpu_max": cpu_max, "cfs": cfs}


_MODEL_NUMBER = re.compile(r"\bEPYC\s+(?:Embedded\s+)?([0-9])([0-9A-Z])([0-9A-Z])([0-9])([A-Z]{0,2})\b")


def epyc_model_number(brand: str) -> str | None:
    """'AMD EPYC 9654 96-Core Processor' -> '9654'; 'AMD EPYC 4584PX ...' -> '4584PX'; masked -> None."""
    m = _MODEL_NUMBER.search(brand or "")
    return "".join(m.groups()) if m else None


def generation_from_model_number(number: str) -> tuple[str, str | None] | None:
    """Model number -> (generation name, zen_arch override). The last digit is the generation;
    the first is the series (7 = 1st-3rd gen, 9 = flagship, 8 = Siena, 4 = AM5 parts)."""
    series, second, last = number[0], number[1], number[3]
    table = {("7", "1"): "Naples", ("7", "2"): "Rome", ("7", "3"): "Milan",
             ("8", "4"): "Siena", ("9", "5"): "Turin", ("9", "6"): "Venice",
             ("4", "4"): "EPYC 4004", ("4", "5"): "EPYC 4005"}
    if (series, last) == ("9", "4"):
        return ("Bergamo", None) if second == "7" else ("Genoa", None)  # 97x4 is Bergamo (Zen 4c)
    name = table.get((series, last))
    return (name, None) if name else None


def classify_generation(brand: str, family: int | None, model: int | None,
                        generations: list[dict]) -> dict:
    """Generation from the brand's model number, else from CPUID family/model, else unknown.

    Cloud guests often mask the brand to plain 'AMD EPYC'; CPUID family/model still tells the
    silicon. Bergamo and Siena share a CPUID range, so a CPUID-only answer names both."""
    number = epyc_model_number(brand)
    if number:
        hit = generation_from_model_number(number)
        if hit:
            name = hit[0]
            entries = [g for g in generations if g["name"] == name]
            dense = [g for g in entries if number[:4] in g.get("model_numbers", [])]
            entry = dense[0] if dense else next(g for g in entries if not g.get("model_numbers"))
            return {"epyc_generation": name, "zen_arch": entry["zen_arch"], "model_number": number,
                    "generation_source": "model_number", "entry": entry}
    if family is not None and model is not None:
        matches = [g for g in generations
                   if any(f == family and lo <= model <= hi for f, lo, hi in g["cpuid"])]
        if matches:
            names = "/".join(dict.fromkeys(g["name"] for g in matches))
            archs = "/".join(dict.fromkeys(g["zen_arch"] for g in matches))
            return {"epyc_generation": names, "zen_arch": archs, "model_number": number,
                    "generation_source": "cpuid", "entry": matches[0]}
    return {"epyc_generation": "unknown", "zen_arch": "unknown", "model_number": number,
            "generation_source": "unknown", "entry": None}


def is_amd_epyc(vendor: str | None, brand: str, generation_source: str) -> bool:
    """An EPYC says so in its brand string; a masked AMD brand counts when CPUID names a part."""
    if vendor != "AuthenticAMD":
        return False
    if "EPYC" in brand.upper():
        return True
    masked = not re.search(r"Ryzen|Threadripper|Athlon|Opteron", brand, re.I)
    return masked and generation_source == "cpuid"


VENDOR_NAMES = {"AuthenticAMD": "AMD", "GenuineIntel": "Intel", "HygonGenuine": "Hygon", "CentaurHauls": "Centaur"}


def vendor_name(vendor: str | None) -> str:
    """CPUID vendor id -> the name people use ('GenuineIntel' -> 'Intel'); unknown ids as they are."""
    return VENDOR_NAMES.get(vendor or "", vendor or "unknown vendor")


def route_host(facts: dict, supported: list[str], stock: bool) -> dict:
    """Which path SKILL.md takes on this CPU: zentorch | confirm | stock | stock_offer | stop.

    zentorch needs an AMD EPYC with AVX-512 BF16, and vLLM activates it only on AMD CPUs. The stock
    vLLM CPU path runs on any x86-64 CPU, but it is never taken silently: only when the user asked
    for it (`stock`). Without that, a non-EPYC host stops and a pre-Zen4 EPYC gets the offer."""
    cpu = f"{facts.get('cpu_model') or 'unknown CPU'} ({vendor_name(facts.get('vendor'))})"
    if stock:
        why = ("zentorch does not apply to " + cpu if not facts.get("is_amd_epyc") else
               "stock vLLM CPU (no zentorch) on " + cpu)
        return {"route": "stock", "reason": f"{why}: the stock vLLM CPU path, at the user's explicit request",
                "fix": None}
    if not facts.get("is_amd_epyc"):
        return {"route": "stop", "reason": f"not an AMD EPYC: {cpu}. This skill serves on AMD EPYC CPUs",
                "fix": "stop here; only if a human explicitly asks for unaccelerated stock vLLM on this CPU, "
                       "run the stock path (launch.py up --stock)"}
    if not (facts.get("avx512") and facts.get("avx512_bf16")):
        return {"route": "stock_offer",
                "reason": f"{cpu}: {facts.get('epyc_generation')} has no AVX-512 BF16, so zentorch cannot run",
                "fix": "offer the stock vLLM CPU path (slower, verified on EPYC 7763); on the user's explicit "
                       "OK use --stock"}
    if facts.get("epyc_generation") not in supported:
        return {"route": "confirm",
                "reason": f"zentorch is not validated on {facts.get('epyc_generation')} "
                          f"(validated: {', '.join(supported)})",
                "fix": "get the user's explicit OK to try zentorch, or offer the stock path (--stock)"}
    return {"route": "zentorch", "reason": f"{facts.get('epyc_generation')} ({facts.get('zen_arch')}): "
                                          "the validated zentorch path", "fix": None}


# ---------------------------------------------------------------- topology

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


MAX_PACKAGE_ID = 1023  # detect.json's bound on a socket id: no machine has a thousand sockets


def sysfs_id(text: str | None, limit: int, where: str, default: int) -> int:
    """A sysfs id: plain ASCII digits, or the default when absent or -1 (a guest without topology).
    Past `limit` it is no machine's: a ValueError naming the file, not a socket 10**30."""
    value = (text or "").strip()
    if not (value.isascii() and value.isdigit()):
        return default
    if int(value) > limit:
        raise ValueError(f"{where} is {value[:20]}, past {limit}")
    return int(value)


def sharing_packages(package: dict[int, int], core: dict[int, int], node_of_cpu: dict[int, int]) -> dict[int, int]:
    """package -> the socket it is served as. One-core packages that share a NUMA node are one socket (named
    by the lowest id): a VM's N one-core "sockets" in one node (VMware's default cores-per-socket, QEMU's
    -smp N) were served on one vCPU of N, with no locality to gain. A package of more cores is a socket of
    its own whatever its nodes say: a 2P EPYC in NPS0 (one node over both) is still served on one socket,
    as one OpenMP team across the two would be slower, and a kernel without NUMA sysfs is no sign either."""
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
        online = common.parse_cpulist(online_text)
    else:
        online = sorted(int(p.name[3:]) for p in sr.glob("sys/devices/system/cpu/cpu[0-9]*"))
    for cpu in online:
        base = f"sys/devices/system/cpu/cpu{cpu}/topology"
        pkg = sr.read(f"{base}/physical_package_id")
        core = sr.read(f"{base}/core_id")
        topo.package[cpu] = sysfs_id(pkg, MAX_PACKAGE_ID, f"{base}/physical_package_id", 0)
        topo.core[cpu] = sysfs_id(core, 1 << 20, f"{base}/core_id", cpu)
    for node_dir in sr.glob("sys/devices/system/node/node[0-9]*"):
        node = int(node_dir.name[4:])
        cpus = [c for c in common.parse_cpulist(sr.read(f"{node_dir.relative_to(sr.root)}/cpulist") or "")
                if c in topo.package]
        topo.node_cpus[node] = cpus
        for c in cpus:
            if topo.node_of_cpu.setdefault(c, node) != node:  # a kernel lists each CPU in one node
                raise ScriptError(f"CPU {c} is listed by NUMA nodes {topo.node_of_cpu[c]} and {node} "
                                  "(sys/devices/system/node/node*/cpulist): no kernel writes that",
                                  "re-capture sys/devices/system/node from the host (detect.py --capture)")
        meminfo = sr.read(f"{node_dir.relative_to(sr.root)}/meminfo") or ""
        mem, free = parse_meminfo_bytes(meminfo), parse_meminfo_bytes(meminfo, "MemFree")
        if mem is not None:
            topo.node_mem_bytes[node] = mem
        if free is not None:
            topo.node_free_bytes[node] = free
    if not topo.node_cpus:  # kernel without NUMA: one node holding everything
        topo.node_cpus[0] = topo.cpus
        topo.node_of_cpu = {c: 0 for c in topo.cpus}
    if not topo.package:
        raise ScriptError("no online CPUs found under sys/devices/system/cpu",
                          "capture /sys/devices/system/cpu (online, cpu*/topology) into the sysroot")
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
    return [f"packages {common.format_cpulist(ps)} share NUMA node(s) "
            f"{common.format_cpulist(sorted({topo.node_of_cpu[c] for c in topo.cpus if topo.package[c] == s}))}: "
            f"one-core packages of one memory domain (a VM's sockets), served as socket {s}"
            for s, ps in sorted(topo.merged.items())]


# ---------------------------------------------------------------- gathering (I/O)

@dataclass
class HostFacts:
    target: str
    cpu: dict
    topology: Topology
    mem_total_bytes: int
    allowed_cpus: list[int]
    memory_limit_bytes: int | None
    hypervisor: str | None
    sysroot: Sysroot
    cpu_quota: float | None = None


def _first_readable(sr: Sysroot, paths: list[str]) -> str | None:
    for p in paths:
        text = sr.read(p)
        if text is not None and text.strip():
            return text
    return None


def gather(sr: Sysroot, target: str, live: bool) -> HostFacts:
    """Read every fact detect and cpu_tune need from a sysroot (or this host, live=True)."""
    try:
        cpu = parse_cpuinfo(sr.read("proc/cpuinfo") or "")
    except ValueError as why:
        raise ScriptError(f"{target}: proc/cpuinfo is missing or malformed ({why})",
                          "check that /proc/cpuinfo is readable (a sysroot needs proc/cpuinfo, as the kernel "
                          "writes it)")
    try:
        topo = read_topology(sr)
        cg = cgroup_dirs(sr.read("proc/self/cgroup"))
        cpuset_text = _first_readable(sr, cg["cpuset"])
        cgroup_cpus = common.parse_cpulist(cpuset_text) if cpuset_text else None
        if live:
            import psutil
            mem_total = psutil.virtual_memory().total
            allowed = sorted(psutil.Process().cpu_affinity())
        else:
            mem_total = parse_meminfo_bytes(sr.read("proc/meminfo") or "")
            allowed = parse_status_allowed(sr.read("proc/self/status"))
    except ValueError as exc:
        raise ScriptError(f"{target}: malformed topology file: {exc}",
                          "re-capture /sys/devices/system and /proc/self/status from the host")
    if not mem_total:  # none, or 0: no host runs on no memory
        raise ScriptError(f"{target}: proc/meminfo has no MemTotal" + (" above 0" if mem_total == 0 else ""),
                          "check that /proc/meminfo is readable (a sysroot needs proc/meminfo)")
    allowed_set = set(topo.cpus if allowed is None else allowed) & set(topo.cpus)
    if cgroup_cpus is not None:
        allowed_set &= set(cgroup_cpus)
    limit = parse_cgroup_limit(_first_readable(sr, cg["memory"]))
    cfs_dir = next((d for d in cg["cfs"] if sr.read(f"{d}/cpu.cfs_quota_us") is not None), None)
    quota = parse_cpu_quota(_first_readable(sr, cg["cpu_max"]),
                            sr.read(f"{cfs_dir}/cpu.cfs_quota_us") if cfs_dir else None,
                            sr.read(f"{cfs_dir}/cpu.cfs_period_us") if cfs_dir else None)
    hyper = None
    if "hypervisor" in cpu["flags"]:
        hyper = (sr.read("sys/hypervisor/type") or sr.read("sys/class/dmi/id/sys_vendor") or "").strip() \
            or "unknown (virtualized)"
    return HostFacts(target, cpu, topo, mem_total, sorted(allowed_set), limit, hyper, sr, quota)


# The remote side of --host: print each file behind a marker, all in one ssh call.
_REMOTE_FILES = ["/" + pattern for pattern in host_spec.CAPTURE_PATTERNS]  # the shell expands the globs
_MARK = "@@EPYC-SKILL-FILE@@"
_REMOTE_SCRIPT = (
    'dump() { for f in "$@"; do [ -r "$f" ] && { printf "\\n%s %s\\n" "' + _MARK + '" "$f"; cat "$f"; }; done; }\n'
    "dump " + " ".join(_REMOTE_FILES) + "\n"
    'while IFS=: read -r _id ctl p; do [ -n "$p" ] && [ "$p" != / ] && dump '
    + " ".join(f'"/{t.format(p="$p")}"' for t in host_spec.CGROUP_FILES) + "; "
    "done < /proc/self/cgroup\n"
    "exit 0\n"
)


_MARK_LINE = re.compile("^" + re.escape(_MARK) + " (.*)$", re.M)


def split_dump(text: str) -> Iterator[tuple[str, int, int]]:
    """The marker-separated remote dump -> (absolute path as the host named it, start, end of its text),
    one file at a time: the caller checks a file's size before it copies it (a list of every line cost
    28 times the answer's size)."""
    marks = _MARK_LINE.finditer(text)
    here = next(marks, None)
    while here is not None:
        after = next(marks, None)
        yield here.group(1).strip(), here.end() + 1, after.start() if after else len(text)
        here = after


def unpack_capture(text: str, dest: Path, label: str) -> None:
    """Write the remote dump into a sysroot folder, with the checks a capture archive gets: the host's
    answer is data (a hostile or odd host could name '/', a NUL, a file and a folder at once)."""
    fix = "the host's answer is not what detect.py's remote script prints: check its shell (sh) and /proc"
    total = 0
    for count, (path, start, end) in enumerate(split_dump(text), 1):
        total += max(0, end - start)
        why = None if path.startswith("/") else f"{path[:200]!r} is not an absolute path"
        why = why or host_spec.member_problem(path[1:], max(0, end - start), count, total)
        if not why:
            data = (text[start:end].rstrip("\n") + "\n").encode("utf-8", "replace")
            why = host_spec.member_problem(path[1:], len(data), count, total)
        if why:
            raise ScriptError(f"cannot read {label} over ssh: {why}", fix, host=label)
        try:
            host_spec.write_member(dest, path[1:], data)
        except OSError as exc:  # a path both a file and a folder, a name the file system refuses
            raise ScriptError(f"cannot read {label} over ssh: {path[:200]!r}: {exc.strerror or exc}", fix,
                              host=label)


def gather_remote(spec: str) -> HostFacts:
    target = common.parse_host(spec)
    argv = common.ssh_argv(target, ["sh", "-c", _REMOTE_SCRIPT])
    common.log(f"detect: reading {target.label} over ssh")
    # bounded as a capture archive is: a host printing without end fills no memory
    res = common.run(argv, timeout=SSH_TIMEOUT_S, limit=host_spec.CAPTURE_LIMIT)
    if not res.ok or _MARK not in res.stdout:
        why = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else (res.failure or "no output")
        raise ScriptError(f"cannot read {target.label} over ssh: {why}",
                          "check that `ssh -o BatchMode=yes HOST true` works (key-based login, host reachable)",
                          host=target.label)
    tree = scratch_dir("epyc-detect-")
    unpack_capture(res.stdout, tree, target.label)
    return gather(Sysroot(str(tree)), target.label, live=False)


def scratch_dir(prefix: str) -> Path:
    """A folder for an unpacked tree, removed when the script exits (an explicit cleanup: a
    TemporaryDirectory left to its finaliser warns, a traceback under PYTHONWARNINGS=error)."""
    import atexit
    import shutil
    dest = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, dest, True)
    return dest


def gather_from_args(sysroot: str | None, host: str | None) -> HostFacts:
    if sysroot and host:
        raise ScriptError("--sysroot and --host are exclusive", "pass one of them")
    if host:
        return gather_remote(host)
    try:
        archive = bool(sysroot) and Path(sysroot).is_file()
    except OSError:  # a name too long: check_sysroot below says so
        archive = False
    if archive:  # an archive from detect.py --capture on the host
        dest = scratch_dir("epyc-capture-")
        host_spec.unpack(Path(sysroot), dest)
        return gather(common.check_sysroot(str(dest)), f"capture:{os.path.realpath(sysroot)}", live=False)
    if sysroot:
        sr = common.check_sysroot(sysroot)
        label = (sr.read(TARGET_FILE) or "").strip()  # a rendered spec names the host it describes
        # the target names the tree however it was spelled (./cap, /abs/cap/): plan compares targets
        return gather(sr, label if label.startswith("spec:") else f"sysroot:{os.path.realpath(sysroot)}", live=False)
    return gather(Sysroot("/"), "localhost", live=True)


def spec_host(args, epyc: dict) -> tuple[HostFacts, dict]:
    """A host described by SKU and facts, rendered as the files Linux would show (the numbering is an
    assumption, stated in the output), then read like any sysroot."""
    table = host_spec.load_skus()
    sku = host_spec.find_sku(table, args.spec)
    gen = sku["epyc_generation"]
    entry = next((g for g in epyc["generations"] if g["name"] == gen and not g.get("model_numbers")),
                 None) or next(g for g in epyc["generations"] if g["name"] == gen)
    family, model = (entry["cpuid"][0][0], entry["cpuid"][0][1]) if entry["cpuid"] else (26, 0)
    cores = sku["cores_per_socket"]
    threads = 2 if args.smt == "on" and sku["threads_per_socket"] > cores else 1
    if cores % args.nps:
        raise ScriptError(f"{cores} cores do not split into NPS{args.nps}", "pass --nps 1, 2 or 4 as the BIOS has it")
    if args.sockets > 1 and sku.get("socket_support") == "1P":  # a P part: no two-socket board takes it
        raise ScriptError(f"EPYC {sku['model']} is a single-socket part (socket support 1P in "
                          "data/epyc_skus.json)", "pass --sockets 1, or the 2P part of the same core count")
    files = host_spec.spec_files(f"AMD EPYC {sku['model']} {cores}-Core Processor", family, model,
                                 entry["avx512"], entry["avx512_bf16"], args.sockets, cores, threads,
                                 args.nps, args.ram_gb_per_socket)
    if args.save_sysroot:
        # the rendered proc/ and sys/ files go in a folder of their own, never over others
        root = common.empty_output_dir(args.save_sysroot, "--save-sysroot",
                                       "pass a new or empty folder for the rendered host files")
    else:  # read once, then gone: a spec leaves nothing behind unless asked to
        root = scratch_dir("epyc-spec-")
    target = f"spec:EPYC {sku['model']} {args.sockets}S NPS{args.nps} SMT {args.smt}"
    try:
        host_spec.write_files(root, {**files, TARGET_FILE: target + "\n"})
    except OSError as exc:  # a full disk: the rendered tree is incomplete, and read as it is it would lie
        raise common.os_error(exc, f"cannot write the rendered host files under {root}")
    facts = gather(common.check_sysroot(str(root)), target, live=False)
    spec = {"sku": sku, "source": table["sources"][sku["source"]], "sysroot": str(root) if args.save_sysroot else None,
            "assumptions": [
                "CPU numbering as Linux shows an EPYC host: each socket's first threads, then the SMT siblings "
                "(cpu = thread x sockets x cores + socket x cores + core)",
                f"NPS{args.nps}: each socket's cores split into {args.nps} consecutive NUMA node(s) with equal memory",
                f"{args.ram_gb_per_socket:g} GiB per socket, all of it usable (no cgroup limit, no other load)",
                "re-check on the host before start: detect.py --capture FILE there, then plan from --sysroot FILE"]}
    return facts, spec


# ---------------------------------------------------------------- decision + report

def memory_truth(mem_total: int, limit: int | None, node_mem: dict[int, int], tolerance: float) -> dict:
    """Usable RAM is the smaller of MemTotal and the cgroup limit. When sysfs per-node figures do
    not add up to MemTotal (sandboxes, some hypervisors), say so: per-socket sizing then takes the
    smaller figure, because vLLM's CPU worker sizes its KV cache check from sysfs."""
    usable = min(mem_total, limit) if limit else mem_total
    if common.gb(usable) <= 0:  # a figure no machine runs on, which no document can carry as a size of RAM
        where = "the cgroup memory limit" if limit and limit < mem_total else "MemTotal in /proc/meminfo"
        raise ScriptError(f"usable RAM reads {usable:,} bytes ({where}): not the memory of a machine that runs "
                          "anything", "check that figure: a cgroup memory.max written in bytes where GiB were "
                          "meant, or a --sysroot / capture with a broken meminfo")
    notes = []
    sysfs_total = sum(node_mem.values())
    consistent = bool(node_mem) and abs(sysfs_total - mem_total) <= tolerance * mem_total
    if node_mem and not consistent:
        notes.append(f"sysfs node meminfo sums to {common.gb(sysfs_total)} GiB but /proc/meminfo says "
                     f"{common.gb(mem_total)} GiB; per-socket sizing uses the smaller figure, because "
                     "vLLM checks its KV cache against the node's sysfs meminfo")
    if limit and limit < mem_total:
        notes.append(f"cgroup memory limit {common.gb(limit)} GiB is below MemTotal; using the limit")
    return {"usable_bytes": usable, "sysfs_consistent": consistent, "notes": notes}


def report(f: HostFacts, epyc: dict) -> dict:
    cpu, topo = f.cpu, f.topology
    gen = classify_generation(cpu["brand"], cpu["family"], cpu["model"], epyc["generations"])
    flags = cpu["flags"]
    mem = memory_truth(f.mem_total_bytes, f.memory_limit_bytes, topo.node_mem_bytes,
                       epyc["memory"]["sysfs_disagreement_tolerance"])
    physical = topo.physical_cores()
    amd_epyc = is_amd_epyc(cpu["vendor"], cpu["brand"], gen["generation_source"])
    supported = amd_epyc and gen["epyc_generation"] in epyc["supported_generations"]
    doc = {
        "target": f.target,
        "cpu_model": cpu["brand"],
        "vendor": cpu["vendor"],
        "vendor_name": vendor_name(cpu["vendor"]),
        "cpu_family": cpu["family"],
        "cpu_model_number": cpu["model"],
        "epyc_model_number": gen["model_number"],
        "is_amd_epyc": amd_epyc,
        "epyc_generation": gen["epyc_generation"] if amd_epyc else None,
        "zen_arch": gen["zen_arch"] if amd_epyc else None,
        "epyc_series": (gen["entry"] or {}).get("series") if amd_epyc else None,
        "generation_source": gen["generation_source"] if amd_epyc else "unknown",
        "is_supported_epyc": supported,
        "avx512": "avx512f" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx": bool({"amx_bf16", "amx_tile"} & flags),
        "logical_cores": len(topo.cpus),
        "physical_cores": len(physical),
        "socket_count": len(topo.sockets),
        "threads_per_core": max(1, round(len(topo.cpus) / max(1, len(physical)))),
        "numa_node_count": len(topo.node_cpus),
        "ram_total_gb": common.gb(f.mem_total_bytes),
        "ram_gb": common.gb(mem["usable_bytes"]),
        "ram_limit_gb": common.gb(f.memory_limit_bytes) if f.memory_limit_bytes else None,
        "node_ram_gb": {str(n): common.gb(b) for n, b in sorted(topo.node_mem_bytes.items())},
        "node_ram_consistent": mem["sysfs_consistent"],
        "allowed_cpus": common.format_cpulist(f.allowed_cpus),
        "cpu_quota": f.cpu_quota,
        "hypervisor": f.hypervisor,
        "notes": mem["notes"] + merged_note(topo),
    }
    doc["route"] = route_host(doc, epyc["supported_generations"], stock=False)
    return doc


def main(argv: Sequence[str] | None = None):
    p = common.JsonArgumentParser(prog="scripts/detect.py", description=__doc__.split("\n")[0])
    p.add_argument("--sysroot", type=common.nonempty, help="read DIR/proc and DIR/sys instead of this host's")
    p.add_argument("--host", type=common.nonempty, help="[user@]host[:port]: read another host through one ssh call")
    p.add_argument("--capture", type=common.nonempty, metavar="FILE",
                   help="on the host to plan for: write the files detect and cpu_tune read to FILE (.tar.gz)")
    spec = p.add_argument_group("a host you cannot reach yet (--spec)")
    spec.add_argument("--spec", type=common.nonempty, metavar="SKU", help="EPYC model number, e.g. 9654")
    spec.add_argument("--sockets", type=common.int_in(1, 2), default=1)
    spec.add_argument("--ram-gb-per-socket", type=common.float_in(1, 1 << 16),  # no EPYC socket has less
                      help="GiB of memory behind each socket (1 to 65536)")
    spec.add_argument("--nps", type=common.int_in(1, 4), choices=[1, 2, 4], help="NUMA nodes per socket (default 1)")
    spec.add_argument("--smt", choices=["on", "off"], help="simultaneous multithreading (default on)")
    spec.add_argument("--save-sysroot", type=common.nonempty, metavar="DIR",
                      help="keep the rendered files in DIR (cpu_tune.py --sysroot DIR plans on them)")
    args = p.parse_args(argv)
    epyc = common.load_epyc()
    if args.capture:
        others = [f for f, v in (("--sysroot", args.sysroot), ("--host", args.host), ("--spec", args.spec),
                                 ("--save-sysroot", args.save_sysroot), ("--ram-gb-per-socket", args.ram_gb_per_socket),
                                 ("--nps", args.nps), ("--smt", args.smt), ("--sockets", args.sockets != 1)) if v]
        if others:
            raise ScriptError(f"--capture archives this machine's files: {', '.join(others)} would be ignored",
                              "run detect.py --capture FILE alone, on the host to plan for")
        target = common.output_file(args.capture, "--capture")
        try:
            return host_spec.capture(target), common.EXIT_OK
        except OSError as exc:
            raise ScriptError(f"cannot write the capture to {args.capture!r}: {exc.strerror or exc}",
                              "pass a path on a writable file system with free space")
    spec_only = [f for f, v in (("--sockets", args.sockets != 1), ("--ram-gb-per-socket", args.ram_gb_per_socket),
                                ("--nps", args.nps), ("--smt", args.smt), ("--save-sysroot", args.save_sysroot)) if v]
    if spec_only and not args.spec:
        raise ScriptError(f"{', '.join(spec_only)} describe a host given by --spec: without --spec they would be "
                          "ignored", "add --spec SKU, or drop them to read this host")
    args.nps, args.smt = args.nps or 1, args.smt or "on"
    if args.spec:
        if args.sysroot or args.host:
            raise ScriptError("--spec describes a host: it goes without --sysroot and --host", "pass one of them")
        host_spec.find_sku(host_spec.load_skus(), args.spec)  # an unknown part is the first thing to say
        if args.ram_gb_per_socket is None:
            raise ScriptError("--spec needs --ram-gb-per-socket (the memory behind each socket)",
                              "e.g. --ram-gb-per-socket 384 for 768 GB on two sockets")
        facts, described = spec_host(args, epyc)
        return {**report(facts, epyc), "spec": described}, common.EXIT_OK
    facts = gather_from_args(args.sysroot, args.host)
    return report(facts, epyc), common.EXIT_OK


if __name__ == "__main__":
    sys.exit(common.run_main(main))
