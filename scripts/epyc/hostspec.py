"""A host that is not this machine: SKU rows, capture files and their safe unpacking."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path, PurePosixPath

from . import bundle, hostfacts
from .errors import ScriptError

SKUS_JSON = bundle.DATA_DIR / "epyc_skus.json"
CAPTURE_PATTERNS = [
    "proc/cpuinfo",
    "proc/meminfo",
    "proc/self/status",
    "proc/self/cgroup",
    "sys/devices/system/cpu/online",
    "sys/devices/system/cpu/cpu[0-9]*/topology/physical_package_id",
    "sys/devices/system/cpu/cpu[0-9]*/topology/core_id",
    "sys/devices/system/node/node[0-9]*/cpulist",
    "sys/devices/system/node/node[0-9]*/meminfo",
    "sys/hypervisor/type",
    "sys/class/dmi/id/sys_vendor",
    "sys/fs/cgroup/cpuset.cpus.effective",
    "sys/fs/cgroup/memory.max",
    "sys/fs/cgroup/cpu.max",
    "sys/fs/cgroup/cpuset/cpuset.effective_cpus",
    "sys/fs/cgroup/memory/memory.limit_in_bytes",
    "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us",
    "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us",
]
# The same controllers in the process's own cgroup ({p}: its path in /proc/self/cgroup), v2 then v1.
# One list for both ways of reading a host: the tar capture here and detect.py's one-call ssh dump.
CGROUP_FILES = [
    "sys/fs/cgroup{p}/cpuset.cpus.effective",
    "sys/fs/cgroup{p}/memory.max",
    "sys/fs/cgroup{p}/cpu.max",
    "sys/fs/cgroup/cpuset{p}/cpuset.effective_cpus",
    "sys/fs/cgroup/memory{p}/memory.limit_in_bytes",
    "sys/fs/cgroup/cpu,cpuacct{p}/cpu.cfs_quota_us",
    "sys/fs/cgroup/cpu,cpuacct{p}/cpu.cfs_period_us",
]
ZEN_FLAGS = (
    "fpu tsc msr pae cx8 apic sep pge cmov pat clflush mmx fxsr sse sse2 ht syscall nx lm sse3 ssse3 fma "
    "cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand bmi1 avx2 bmi2 sha_ni"
)
AVX512_FLAGS = "avx512f avx512dq avx512cd avx512bw avx512vl avx512ifma avx512vbmi avx512_vnni"


def load_skus(path: Path = SKUS_JSON) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ScriptError(f"cannot read {path}: {exc}", "restore data/epyc_skus.json from the repository")
    return doc


def described_part(generation: str, cores: int, threads: int | None) -> dict:
    """A part the table does not hold, as the user describes it: its generation and cores per socket."""
    return {
        "model": f"{generation} (described)",
        "epyc_generation": generation,
        "cores_per_socket": cores,
        "threads_per_socket": threads or 2 * cores,
        "socket_support": "2P",
        "source": "user",
    }


def find_sku(table: dict, model: str) -> dict:
    """'9654', 'EPYC 9654' or 'AMD EPYC 9654P' -> its row; an unknown part names what the table holds."""
    key = model.upper().replace("AMD", "").replace("EPYC", "").strip()
    for row in table["skus"]:
        if row["model"] == key:
            return row
    series = sorted({r["series"] for r in table["skus"]})
    raise ScriptError(
        f"EPYC {key} is not in data/epyc_skus.json (it holds the {', '.join(series)} series, each row with its source)",
        "describe it: --spec GENERATION --cores N (e.g. --spec Turin --cores 128; --threads N without SMT), "
        "or capture the host itself (detect.py --capture FILE there, then --sysroot FILE here)",
    )


def linux_layout(sockets: int, cores: int, threads: int, nps: int) -> list[tuple[int, int, int, int]]:
    """(cpu, socket, core, node) as Linux numbers an EPYC host: every socket's first threads, then the
    SMT siblings in the same order (cpu = thread x sockets x cores + socket x cores + core); NPSn splits
    a socket's cores into n consecutive NUMA nodes."""
    per_node = max(1, cores // nps)
    return sorted(
        (t * sockets * cores + s * cores + c, s, c, s * nps + min(c // per_node, nps - 1))
        for t in range(threads)
        for s in range(sockets)
        for c in range(cores)
    )


def spec_files(
    brand: str,
    family: int,
    model: int,
    avx512: bool,
    bf16: bool,
    sockets: int,
    cores: int,
    threads: int,
    nps: int,
    ram_gb_per_socket: float,
) -> dict[str, str]:
    """The files of a sysroot for a described host (pure): what detect and cpu_tune would read there."""
    layout = linux_layout(sockets, cores, threads, nps)
    flags = ZEN_FLAGS + (" " + AVX512_FLAGS if avx512 else "") + (" avx512_bf16" if bf16 else "")
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


def write_files(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def capture_paths(root: Path = Path("/")) -> list[str]:
    """The files detect and cpu_tune read on this host, relative to root (globs expanded, the process's
    own cgroup folders included)."""
    rels: list[str] = []
    for pattern in CAPTURE_PATTERNS:
        rels += [str(p.relative_to(root)) for p in sorted(root.glob(pattern)) if p.is_file()]
    cgroup = root / "proc/self/cgroup"
    for line in (cgroup.read_text() if cgroup.exists() else "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2] not in ("", "/"):
            for template in CGROUP_FILES:
                rel = template.format(p=parts[2])
                if (root / rel).is_file() and rel not in rels:
                    rels.append(rel)
    return rels


def capture(archive: Path, root: Path = Path("/")) -> dict:
    """A tar.gz of those files. /proc files are read as text (their stat size is 0, so tar cannot copy
    them directly)."""
    rels = capture_paths(root)
    with tarfile.open(archive, "w:gz") as tar:
        for rel in rels:
            try:
                data = (root / rel).read_bytes()
            except OSError:
                continue
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return {"capture": str(archive), "files": len(rels)}


CAPTURE_LIMIT = 256 << 20
CAPTURE_MEMBERS = 50_000
EXTENDED_HEADER_LIMIT = 64 << 10


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile reads a pax or GNU long-name header whole, before any member reaches our checks: a 6 MB
    archive declaring a 1.5 GB header took 1.5 GB of memory. Such a header is refused at its size."""

    def _proc_member(self, tarfile_):
        if (
            self.type
            in (
                tarfile.GNUTYPE_LONGNAME,
                tarfile.GNUTYPE_LONGLINK,
                tarfile.XHDTYPE,
                tarfile.XGLTYPE,
                tarfile.SOLARIS_XHDTYPE,
                tarfile.GNUTYPE_SPARSE,
            )
            and self.size > EXTENDED_HEADER_LIMIT
        ):
            raise tarfile.HeaderError(f"an extended header of {self.size:,} bytes (at most {EXTENDED_HEADER_LIMIT:,})")
        return super()._proc_member(tarfile_)

    def _proc_gnusparse_00(self, *args):  # a sparse member's map is read whole, before any cap: no capture
        raise tarfile.HeaderError("a sparse member (detect.py --capture writes none)")  # has sparse files

    _proc_gnusparse_01 = _proc_gnusparse_10 = _proc_sparse = _proc_gnusparse_00


def member_problem(name: str, size: int, count: int, total: int) -> str | None:
    """Why one file of a capture (an archive member, or a file in detect.py --host's ssh dump) is not one
    a capture of ours holds, or None: a relative path inside the tree that names a file, and sizes within
    what a capture reaches (a few hundred small text files; sysfs and proc files are read bounded too)."""
    rel = PurePosixPath(name)
    if (
        "\0" in name
        or not rel.parts
        or rel.is_absolute()
        or ".." in rel.parts
        or any(len(part.encode("utf-8", "replace")) > 255 for part in rel.parts)
        or len(name) > 4096
    ):
        return f"{name[:200]!r} is not a plain captured file"
    if size > hostfacts.SYS_FILE_LIMIT or total > CAPTURE_LIMIT or count > CAPTURE_MEMBERS:
        return (
            f"{name[:200]!r} makes the capture larger than any detect.py --capture ({size:,} bytes; at most "
            f"{hostfacts.SYS_FILE_LIMIT:,} a file, {CAPTURE_LIMIT:,} and {CAPTURE_MEMBERS:,} files in all)"
        )
    return None


def write_member(dest: Path, name: str, data: bytes) -> None:
    """Write one checked capture file under dest (a name both a file and a folder is an OSError)."""
    out = dest / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)


def unpack(archive: Path, dest: Path) -> Path:
    """Extract a capture, refusing anything but plain files under relative, non-escaping paths."""
    fix = "pass an archive made by detect.py --capture"
    total = 0
    try:
        with tarfile.open(archive, "r:*", tarinfo=_BoundedTarInfo) as tar:
            for count, member in enumerate(tar, 1):  # member by member: a bomb is refused at its header
                total += member.size
                why = (
                    f"{member.name[:200]!r} is not a plain captured file"
                    if not member.isfile()
                    else member_problem(member.name, member.size, count, total)
                )
                if why:
                    raise ScriptError(f"cannot read the capture {archive}: {why}", fix)
                write_member(dest, member.name, tar.extractfile(member).read())
    except tarfile.ReadError:  # tarfile's own words list each compression it tried: not one says what is wrong
        raise ScriptError(
            f"{archive} is neither a folder nor a capture archive (not a tar file, compressed or not, "
            "or a damaged one)",
            "pass a sysroot folder, or an archive made by detect.py --capture",
        )
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ScriptError(f"cannot read the capture {archive}: {exc}", "pass an archive made by detect.py --capture")
    except (ValueError, UnicodeError):  # a NUL in a pax path, a sparse map that is not numbers
        raise ScriptError(
            f"cannot read the capture {archive}: a header no capture has", "pass an archive made by detect.py --capture"
        )
    except RecursionError:  # tarfile follows each extended header into the next by recursion: 400 of them
        raise ScriptError(
            f"cannot read the capture {archive}: a chain of extended headers no capture has",
            "pass an archive made by detect.py --capture",
        )
    return dest
