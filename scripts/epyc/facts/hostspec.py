"""A host that is not this machine: SKU rows, and the dump of its files that --capture and --host read."""

from __future__ import annotations

import fnmatch
import itertools
import re
from pathlib import Path, PurePosixPath

from epyc import bundle, jsonio, subproc
from epyc.errors import ScriptError
from epyc.facts import cpuid, hostfacts

SKUS_JSON = bundle.DATA_DIR / "epyc_skus.json"
# The controllers in the process's own cgroup ({p}: its path in /proc/self/cgroup), v2 then v1, for DUMP_SCRIPT.
CGROUP_FILES = (
    "sys/fs/cgroup{p}/cpuset.cpus.effective sys/fs/cgroup{p}/memory.max sys/fs/cgroup{p}/cpu.max "
    "sys/fs/cgroup/cpuset{p}/cpuset.effective_cpus sys/fs/cgroup/memory{p}/memory.limit_in_bytes "
    "sys/fs/cgroup/cpu,cpuacct{p}/cpu.cfs_quota_us sys/fs/cgroup/cpu,cpuacct{p}/cpu.cfs_period_us"
).split()
CAPTURE_PATTERNS = [
    *(
        "proc/cpuinfo proc/meminfo proc/self/status proc/self/cgroup sys/devices/system/cpu/online "
        "sys/devices/system/cpu/cpu[0-9]*/topology/physical_package_id sys/devices/system/cpu/cpu[0-9]*/topology/core_id "
        "sys/devices/system/node/node[0-9]*/cpulist sys/devices/system/node/node[0-9]*/meminfo sys/hypervisor/type "
        "sys/class/dmi/id/sys_vendor"
    ).split(),
    *(t.format(p="") for t in CGROUP_FILES),
]
ZEN_FLAGS = (
    "fpu tsc msr pae cx8 apic sep pge cmov pat clflush mmx fxsr sse sse2 ht syscall nx lm sse3 ssse3 fma "
    "cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand bmi1 avx2 bmi2 sha_ni"
)
AVX512_FLAGS = "avx512f avx512dq avx512cd avx512bw avx512vl avx512ifma avx512vbmi avx512_vnni"


def named_generation(key: str, generations: list[str]) -> str | None:
    """The generation a --spec key names without a table row ('TURIN', a series '9005', a part '9755'), or None."""
    named = next((g for g in generations if g.upper() == key), None)
    number = cpuid.epyc_model_number(f"EPYC {key}")
    return named or (cpuid.generation_from_model_number(number) if number == key else None)


def resolve_part(
    table: dict, spec: str, cores: int | None, threads: int | None, ram: float | None, generations: list[str]
) -> dict:
    """--spec's part: its row in `table` (SKUS_JSON), or the generation it names with the cores the user gave.
    Every fact only the user knows and did not give is named in one refusal (`missing`: the flags to ask for)."""
    key = spec.upper().replace("AMD", "").replace("EPYC", "").strip()
    row = next((r for r in table["skus"] if r["model"] == key), None)
    gen = row["epyc_generation"] if row else named_generation(key, generations)
    if gen is None:
        raise ScriptError(
            f"--spec {spec[:40]!r} names no EPYC part or generation (the table holds the {', '.join(sorted({r['series'] for r in table['skus']}))} series; generations: {', '.join(generations)})",
            "pass the part number (e.g. --spec 9654) or its generation with its cores (--spec Turin --cores 128), or capture the host itself (detect.py --capture FILE there, then --sysroot FILE here)",
        )
    missing = {}
    if row is None and cores is None:
        missing["--cores"] = f"its cores per socket (--cores N: a {gen} part the SKU table lacks)"
    if ram is None:
        missing["--ram-gb-per-socket"] = "the memory installed behind each socket (--ram-gb-per-socket N, in GB)"
    if missing:
        raise ScriptError(
            f"--spec {spec[:40]} needs facts only the user knows: {'; '.join(missing.values())}",
            "ask the user for them all (or state an assumption they accept), then run detect.py again with them",
            missing=list(missing),
        )
    if cores is None:
        return row
    return {
        "model": f"{gen if key.upper() == gen.upper() else key} (described)",
        "epyc_generation": gen,
        "cores_per_socket": cores,
        "threads_per_socket": threads or 2 * cores,
        "socket_support": "2P",
        "source": "user",
    }


def linux_layout(sockets: int, cores: int, threads: int, nps: int) -> list[tuple[int, int, int, int]]:
    """(cpu, socket, core, node) as Linux numbers an EPYC host: each socket's first threads, then the SMT
    siblings in the same order; NPSn splits a socket's cores into n consecutive NUMA nodes."""
    per_node = max(1, cores // nps)
    return sorted(
        (t * sockets * cores + s * cores + c, s, c, s * nps + min(c // per_node, nps - 1))
        for t in range(threads)
        for s in range(sockets)
        for c in range(cores)
    )


def spec_files(
    brand: str, entry: dict, sockets: int, cores: int, threads: int, nps: int, ram_gb_per_socket: float
) -> dict[str, str]:
    """The sysroot files detect and cpu_tune would read on a described host; `entry` is its generation's row."""
    layout = linux_layout(sockets, cores, threads, nps)
    family, model = (entry["cpuid"][0][0], entry["cpuid"][0][1]) if entry["cpuid"] else (26, 0)
    flags = (
        ZEN_FLAGS + (" " + AVX512_FLAGS if entry["avx512"] else "") + (" avx512_bf16" if entry["avx512_bf16"] else "")
    )
    cpus = [x[0] for x in layout]
    node_kb = int(ram_gb_per_socket / nps * 1024 * 1024)
    files = {
        "proc/cpuinfo": (
            f"processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\nmodel\t\t: {model}\n"
            f"model name\t: {brand}\nflags\t\t: {flags}\n"
        ),
        "proc/meminfo": f"MemTotal:       {node_kb * nps * sockets} kB\n",
        "proc/self/status": f"Cpus_allowed_list:\t{hostfacts.format_cpulist(cpus)}\n",
        "proc/self/cgroup": "0::/\n",
        "sys/devices/system/cpu/online": hostfacts.format_cpulist(cpus) + "\n",
    }
    for cpu, s, c, _ in layout:
        files[f"sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id"] = f"{s}\n"
        files[f"sys/devices/system/cpu/cpu{cpu}/topology/core_id"] = f"{c}\n"
    for node in range(sockets * nps):
        files[f"sys/devices/system/node/node{node}/cpulist"] = (
            hostfacts.format_cpulist([x[0] for x in layout if x[3] == node]) + "\n"
        )
        files[f"sys/devices/system/node/node{node}/meminfo"] = f"Node {node} MemTotal:       {node_kb} kB\n"
    return files


# What both --host (one ssh call) and --capture print: each file behind a marker line, own cgroup folders included.
DUMP_MARK = "@@EPYC-SKILL-FILE@@"
DUMP_SCRIPT = (
    'dump() { for f in "$@"; do [ -r "$f" ] && { printf "\\n%s %s\\n" "' + DUMP_MARK + '" "$f"; cat "$f"; }; done; }\n'
    "dump " + " ".join("/" + pattern for pattern in CAPTURE_PATTERNS) + "\n"
    'while IFS=: read -r _id ctl p; do [ -n "$p" ] && [ "$p" != / ] && dump '
    + " ".join(f'"/{t.format(p="$p")}"' for t in CGROUP_FILES)
    + "; "
    "done < /proc/self/cgroup\n"
    'printf "\\n%s /HOME\\n%s\\n" "' + DUMP_MARK + '" "$HOME"\n'  # the login's home: where its plan's paths go
    "exit 0\n"
)
_MARK_LINE = re.compile("^" + re.escape(DUMP_MARK) + " (.*)$", re.M)
CAPTURE_LIMIT = 16 << 20  # a 384-CPU host's dump is under 1 MB
CAPTURE_MEMBERS = 20_000  # two topology files a CPU, at most 8192 CPUs, and the nodes
CGROUP_LEAVES = {t.rsplit("/", 1)[1] for t in CGROUP_FILES}
CGROUP_MEMBERS, CGROUP_DEPTH = 64, 32
NOT_A_DUMP = "pass a file made by detect.py --capture on the host"


def capture(path: Path) -> dict:
    """--capture: this machine's dump, written to `path` (sh and cat only: nothing else to install)."""
    res = subproc.run(["sh", "-c", DUMP_SCRIPT], timeout=60, limit=CAPTURE_LIMIT)
    if not res.ok:
        raise ScriptError(
            f"sh could not read this machine's files: {res.failure or res.stderr[-200:]}",
            "run it where /bin/sh and cat work (any Linux host)",
        )
    path.write_bytes(res.stdout.encode("utf-8", "replace"))
    return {"capture": str(path), "files": res.stdout.count(DUMP_MARK)}


def captured_shape(name: str) -> str | None:
    """'cgroup' or 'fixed' for a path the dump script reads (relative to the root), else None."""
    if any(fnmatch.fnmatchcase(name, p) and name.count("/") == p.count("/") for p in (*CAPTURE_PATTERNS, "HOME")):
        return "fixed"
    if name.startswith("sys/fs/cgroup/") and name.rsplit("/", 1)[1] in CGROUP_LEAVES:
        return "cgroup" if name.count("/") < CGROUP_DEPTH else None
    return None


def member_problem(name: str, size: int, count: int, total: int) -> str | None:
    """Why one file of a dump is not one a capture holds (its path, or its size), or None."""
    rel = PurePosixPath(name)
    if "\0" in name or rel.is_absolute() or ".." in rel.parts or len(name) > 4096 or not captured_shape(name):
        return f"{name[:200]!r} is not a plain captured file"
    if size > hostfacts.SYS_FILE_LIMIT or total > CAPTURE_LIMIT or count > CAPTURE_MEMBERS:
        return f"{name[:200]!r} makes the capture larger than any detect.py --capture ({size:,} bytes; at most {hostfacts.SYS_FILE_LIMIT:,} a file, {CAPTURE_LIMIT:,} and {CAPTURE_MEMBERS:,} files in all)"
    return None


def read_dump(text: str, dest: Path, where: str, fix: str = NOT_A_DUMP) -> Path:
    """Write a dump into a sysroot folder, each path and size checked first: its text is data, perhaps hostile."""
    if DUMP_MARK not in text:
        raise ScriptError(f"{where} holds no captured file (not what detect.py --capture writes)", fix)
    total = cgroups = 0
    for count, (here, after) in enumerate(itertools.pairwise(itertools.chain(_MARK_LINE.finditer(text), [None])), 1):
        path, start, end = here.group(1).strip(), here.end() + 1, after.start() if after else len(text)
        total += max(0, end - start)
        why = None if path.startswith("/") else f"{path[:200]!r} is not an absolute path"
        why = why or member_problem(path[1:], max(0, end - start), count, total)
        cgroups += not why and captured_shape(path[1:]) == "cgroup"
        if not why and cgroups > CGROUP_MEMBERS:
            why = f"more than {CGROUP_MEMBERS} cgroup files (a process has at most a dozen)"
        if why:
            raise ScriptError(f"cannot read {where}: {why}", fix)
        out = dest / path[1:]
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes((text[start:end].rstrip("\n") + "\n").encode("utf-8", "replace"))
        except OSError as exc:  # a path both a file and a folder, a name the file system refuses
            raise ScriptError(f"cannot read {where}: {path[:200]!r}: {exc.strerror or exc}", fix)
    return dest


def unpack(capture_file: Path, dest: Path) -> Path:
    """A file from detect.py --capture, read (bounded) into a sysroot folder."""
    raw = jsonio.read_input_bytes(capture_file, "the capture", NOT_A_DUMP, CAPTURE_LIMIT)
    return read_dump(raw.decode("utf-8", "replace"), dest, f"the capture {capture_file}")
