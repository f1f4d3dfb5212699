"""Other hosts: ssh targets, capture files and --spec rows."""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from epyc import errors, jsonio, masking, subproc
from epyc.errors import ScriptError
from epyc.facts import hostfacts, hostspec
from epyc.facts.hostfacts import HostFacts, Sysroot, gather

SSH_TIMEOUT_S = 30
TARGET_FILE = "EPYC_TARGET"
CPU_NAME_CODE = (
    "import cpuinfo, json; i = cpuinfo.get_cpu_info(); "
    "print('@@CPU@@' + json.dumps({k: str(i.get(k + '_raw', i.get(k, ''))) for k in ('brand', 'vendor_id', 'arch')}))"
)


def is_another_host(target: str) -> bool:
    """Whether detect's target is another host (a spec, a capture, ssh), not this machine or a sysroot for it."""
    return target != "localhost" and not target.startswith("sysroot:")


_HOST_RE = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])"
    r"(?::(?P<port>[0-9]{1,5}))?$"
)


@dataclass(frozen=True)
class SshTarget:
    user: str | None
    host: str
    port: int | None

    @property
    def label(self) -> str:
        s = f"{self.user}@{self.host}" if self.user else self.host
        return f"{s}:{self.port}" if self.port else s


def parse_host(spec: str) -> SshTarget:
    """'[user@]box[:port]' -> SshTarget. Rejects anything ssh could read as an option."""
    m = _HOST_RE.fullmatch(spec or "")
    if not m or spec.startswith("-"):
        raise ScriptError(f"not a host: {spec!r}", "use --host [user@]hostname[:port]")
    port = int(m.group("port")) if m.group("port") else None
    if port is not None and not 0 < port < 65536:
        raise ScriptError(f"port out of range in {spec!r}", "use a port between 1 and 65535")
    return SshTarget(m.group("user"), m.group("host").strip("[]"), port)


def ssh_argv(target: SshTarget, remote_argv: Sequence[str]) -> list[str]:
    """One non-interactive ssh call; the remote command is quoted word by word."""
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "StrictHostKeyChecking=accept-new"]
    extra = os.environ.get("EPYC_SKILL_SSH_OPTS")  # e.g. "-i key -o UserKnownHostsFile=..."
    if extra:
        try:  # the user's own ssh options, written as shell words (as GIT_SSH_COMMAND is)
            argv += shlex.split(extra)
        except ValueError as exc:
            raise ScriptError(
                f"EPYC_SKILL_SSH_OPTS is not shell words ({exc})",
                "quote it as on a command line, e.g. EPYC_SKILL_SSH_OPTS='-i ~/.ssh/id_box -o Port=2222', or unset it",
            )
    if target.port:
        argv += ["-p", str(target.port)]
    argv += [f"{target.user}@{target.host}" if target.user else target.host, "--"]
    argv.append(" ".join(shlex.quote(a) for a in remote_argv))
    return argv


def gather_remote(spec: str) -> HostFacts:
    target = parse_host(spec)
    argv = ssh_argv(target, ["sh", "-c", hostspec.DUMP_SCRIPT])
    errors.log(f"detect: reading {target.label} over ssh")
    # bounded as a capture is: a host printing without end fills no memory
    res = subproc.run(argv, timeout=SSH_TIMEOUT_S, limit=hostspec.CAPTURE_LIMIT)
    if not res.ok or hostspec.DUMP_MARK not in res.stdout:
        why = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else (res.failure or "no output")
        raise ScriptError(
            f"cannot read {target.label} over ssh: {why}",
            "check that `ssh -o BatchMode=yes HOST true` works (key-based login, host reachable)",
            host=target.label,
        )
    tree = jsonio.scratch_dir("epyc-detect-")
    fix = "the host's answer is not what detect.py's remote script prints: check its shell (sh) and /proc"
    hostspec.read_dump(res.stdout, tree, f"{target.label} over ssh", fix)
    return gather(Sysroot(str(tree)), target.label, live=False)


def local() -> Sysroot:
    """This machine's files; one without /proc/cpuinfo (macOS, Windows) serves nothing: py-cpuinfo names its CPU
    (by cpuid, sysctl or the registry) and the server is planned from a description of it."""
    if (sr := Sysroot(hostfacts.LOCAL_ROOT)).read("proc/cpuinfo") is not None:
        return sr
    cpu, why = subproc.run_probe([sys.executable], CPU_NAME_CODE, "@@CPU@@", timeout=60)
    cpu = {k: masking.clip(str(v), hostfacts.MAX_BRAND_CHARS) for k, v in cpu.items()} if cpu else None
    named = f"its CPU is {cpu['brand']} ({cpu['vendor_id']}, {cpu['arch']})" if cpu else f"py-cpuinfo: {why[:200]}"
    raise ScriptError(
        f"this machine ({platform.system()}) has no /proc/cpuinfo; {named}: the bundle serves only on a Linux host it can read",
        'plan the server from here as SKILL.md\'s "Another host" says: detect.py --spec SKU ... --run NAME, '
        "detect.py --host user@server, or detect.py --capture host.txt on the server, then --sysroot host.txt here",
        cpu=cpu,
    )


def gather_from_args(sysroot: str | None, host: str | None) -> HostFacts:
    if sysroot and host:
        raise ScriptError("--sysroot and --host are exclusive", "pass one of them")
    if host:
        return gather_remote(host)
    if sysroot and os.path.isfile(sysroot):  # a file from detect.py --capture on the host
        dest = hostspec.unpack(Path(sysroot), jsonio.scratch_dir("epyc-capture-"))
        return gather(hostfacts.check_sysroot(str(dest)), f"capture:{os.path.realpath(sysroot)}", live=False)
    if sysroot:
        sr = hostfacts.check_sysroot(sysroot)
        label = (sr.read(TARGET_FILE) or "").strip()  # a rendered spec names the host it describes
        # the target names the tree however it was spelled (./cap, /abs/cap/): plan compares targets
        return gather(sr, label if label.startswith("spec:") else f"sysroot:{os.path.realpath(sysroot)}", live=False)
    return gather(local(), "localhost", live=True)


def spec_host(args: argparse.Namespace, epyc: dict) -> tuple[HostFacts, dict]:
    """A host described by SKU and facts, rendered as the files Linux would show, then read like any sysroot."""
    names = list(dict.fromkeys(g["name"] for g in epyc["generations"]))
    table = json.loads(hostspec.SKUS_JSON.read_text())
    sku = hostspec.resolve_part(table, args.spec, args.cores, args.threads, args.ram_gb_per_socket, names)
    gen = sku["epyc_generation"]
    rows = [g for g in epyc["generations"] if g["name"] == gen]
    entry = next((g for g in rows if not g.get("model_numbers")), rows[0])
    cores = sku["cores_per_socket"]
    threads = 2 if args.smt == "on" and sku["threads_per_socket"] > cores else 1
    if cores % args.nps:
        raise ScriptError(f"{cores} cores do not split into NPS{args.nps}", "pass --nps 1, 2 or 4 as the BIOS has it")
    if args.sockets > 1 and sku.get("socket_support") == "1P":  # a P part: no two-socket board takes it
        raise ScriptError(
            f"EPYC {sku['model']} is a single-socket part (socket support 1P in data/epyc_skus.json)",
            "pass --sockets 1, or the 2P part of the same core count",
        )
    brand = f"AMD EPYC {sku['model']} {cores}-Core Processor"
    files = hostspec.spec_files(brand, entry, args.sockets, cores, threads, args.nps, args.ram_gb_per_socket)
    if args.save_sysroot:
        # the rendered proc/ and sys/ files go in a folder of their own, never over others
        root = jsonio.empty_output_dir(
            args.save_sysroot, "--save-sysroot", "pass a new or empty folder for the rendered host files"
        )
    else:  # read once, then gone: a spec leaves nothing behind unless asked to
        root = jsonio.scratch_dir("epyc-spec-")
    target = f"spec:EPYC {sku['model']} {args.sockets}S NPS{args.nps} SMT {args.smt}"
    try:
        for rel, text in {**files, TARGET_FILE: target + "\n"}.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    except OSError as exc:  # a full disk: the rendered tree is incomplete, and read as it is it would lie
        raise errors.os_error(exc, f"cannot write the rendered host files under {root}")
    facts = gather(hostfacts.check_sysroot(str(root)), target, live=False)
    spec = {
        "sku": sku,
        "source": table["sources"].get(sku["source"], "described by the user (--spec ... --cores N)"),
        "sysroot": str(root) if args.save_sysroot else None,
        "assumptions": [
            "CPU numbering as Linux shows an EPYC host: each socket's first threads, then the SMT siblings (cpu = thread x sockets x cores + socket x cores + core)",
            f"NPS{args.nps}: each socket's cores split into {args.nps} consecutive NUMA node(s) with equal memory",
            f"{args.ram_gb_per_socket:g} GB installed per socket (memory sizes are binary: {args.ram_gb_per_socket:g} GiB), all of it usable (no cgroup limit, no other load)",
            "re-check on the host before start: detect.py --capture FILE there, then plan from --sysroot FILE",
        ],
    }
    return facts, spec
