#!/usr/bin/env python3
"""Is this host ready to serve: a runtime, a zentorch-capable CPU, a compatible stack, a cache, a port?

    python3 scripts/validate.py --detect detect.json               # the CPU as detect.py saw it
    python3 scripts/validate.py --detect detect.json --python PY   # the host path's interpreter
    python3 scripts/validate.py --detect detect.json --stock       # stock vLLM CPU, after the user's OK

Without --detect (or --generation/--avx512) the CPU is read from this host. Runtime order: docker
(daemon answers) > podman (can run a container) > sudo -n docker (passwordless) > the host path
(the stack imports in --python; default: the setup_host_stack.py venv of the chosen backend).
Nothing here pulls, installs or escalates.
Exit 0 when there is no error (`ready`); exit 1 otherwise, with the errors and their fixes.
"""
from __future__ import annotations

import os
import re
import socket
import stat
import struct
import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import detect  # noqa: E402
import setup_host_stack  # noqa: E402
import vllm_registry  # noqa: E402
from serve_plan import HF_MOUNT_FIX, bind_mount, hf_mount_problem  # noqa: E402
from common import ScriptError  # noqa: E402

RUNTIME_TIMEOUT_S = 20
NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs", "9p", "lustre", "gpfs", "beegfs"}
LIB_DIRS = ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib", "/lib/x86_64-linux-gnu"]

# ---------------------------------------------------------------- pure decisions


def issue(check: str, severity: str, message: str, fix: str | None = None) -> dict:
    return {"check": check, "severity": severity, "message": message, "fix": fix}


def cpu_gate(cpu: dict, supported: list[str], stock: bool) -> list[dict]:
    """zentorch needs an AMD EPYC with AVX-512 BF16 (Zen 4 and later); vLLM activates it only on AMD.
    Without that the flow stops unless the user took the stock-vLLM offer (--stock); an AVX-512 EPYC
    outside the validated generations needs consent. `cpu` has detect.py's fields."""
    who = f"{cpu.get('cpu_model') or 'unknown CPU'} ({detect.vendor_name(cpu.get('vendor'))})"
    generation = cpu.get("epyc_generation")
    if stock:
        what = ("not an AMD EPYC, zentorch does not apply" if not cpu.get("is_amd_epyc") else
                "no zentorch acceleration (slower); verified on EPYC 7763 (Milan) with bfloat16")
        return [issue("cpu", "confirmation", f"stock vLLM CPU path on {who}: {what}",
                      "get the user's explicit OK before launching")]
    if not cpu.get("is_amd_epyc"):
        return [issue("cpu", "error", f"not an AMD EPYC: {who}; zentorch runs only on AMD EPYC",
                      "stop: this skill serves on AMD EPYC. Only on a human's explicit request, re-run "
                      "validate.py with --stock for unaccelerated stock vLLM")]
    if not cpu.get("avx512"):
        return [issue("cpu", "error", f"no AVX-512 on {who} ({generation or 'unknown generation'}): "
                      "zentorch cannot run", "offer the stock vLLM CPU path; on the user's explicit OK "
                      "re-run validate.py with --stock")]
    if not cpu.get("avx512_bf16"):
        return [issue("cpu", "error", f"AVX-512 without AVX512_BF16 on {who}: zentorch's bf16 path cannot run",
                      "offer the stock vLLM CPU path; on the user's OK re-run with --stock")]
    if generation not in supported:
        return [issue("cpu", "confirmation", f"zentorch is not validated on {generation or 'this generation'} "
                      f"(validated: {', '.join(supported)})",
                      "get the user's explicit OK to try zentorch unvalidated, or take the stock vLLM path")]
    return []


def cpu_facts(detected: dict, generation: str | None, avx512: bool | None) -> dict:
    """detect.py's facts, with the --generation / --avx512 overrides applied (an override of avx512
    to false also clears bf16; true keeps what the CPU says about bf16)."""
    out = dict(detected)
    if generation:
        out["epyc_generation"] = generation
    if avx512 is not None:
        out["avx512"] = avx512
        out["avx512_bf16"] = bool(avx512 and detected.get("avx512_bf16"))
    return out


def choose_runtime(docker_ok: bool, podman_ok: bool, sudo_docker_ok: bool, host_ok: bool) -> str | None:
    """docker, then podman, then passwordless sudo docker, then the conda/host path ('host')."""
    for name, ok in (("docker", docker_ok), ("podman", podman_ok), ("sudo docker", sudo_docker_ok), ("host", host_ok)):
        if ok:
            return name
    return None


def stack_compatibility(stack: dict, generation: str | None, pinned_vllm: str, stock: bool,
                        vendor: str | None = "AuthenticAMD") -> dict:
    """proceed | blocked | confirmation_required, from what the serving runtime reports.

    What runs must be what was asked for: the zentorch path needs vLLM to select ZenCpuPlatform
    (it does so only on AMD CPUs), and the stock path must not quietly run zentorch. Venice is
    validated only on the pinned vLLM. An unprobed stack (image not pulled) proceeds on its tag."""
    platform = stack.get("platform") or ""
    short = platform.rsplit(".", 1)[-1]
    version = vllm_registry.normalize_version(stack.get("vllm"))
    if stock:
        if short == "ZenCpuPlatform":
            return {"status": "blocked", "message": "the stock path was asked for, but this runtime activates "
                    "zentorch (ZenCpuPlatform): use a stock vLLM runtime (setup_host_stack.py --stock)"}
        return {"status": "proceed", "message": f"stock vLLM CPU path (vLLM {version or 'from the image'}, "
                f"{short or 'platform not probed'}, no zentorch), on the user's OK"}
    if platform and short != "ZenCpuPlatform":
        why = (f"zentorch is inactive because this CPU is {detect.vendor_name(vendor)} (vLLM activates "
               "ZenCpuPlatform only on AMD CPUs)" if vendor != "AuthenticAMD" else
               "zentorch acceleration is not active in this runtime")
        return {"status": "blocked", "message": f"vLLM selected {short}, not ZenCpuPlatform: {why}"}
    if generation == "Venice" and version and version != pinned_vllm:
        return {"status": "confirmation_required", "message": f"Venice is validated on vLLM {pinned_vllm}; this "
                f"runtime has {version}. Recommend the pinned image; go on only with the user's explicit OK"}
    if not platform:
        return {"status": "proceed", "message": f"stack read from the image tag (vLLM {version}); pull the image "
                "and re-run validate.py to probe it"}
    return {"status": "proceed", "message": f"vLLM {version} on ZenCpuPlatform"}


def versions_from_tag(image: str) -> dict:
    """'..:vllm_v0.25.1_zentorch_v2.11.0.3_..' -> {'vllm': '0.25.1', 'zentorch': '2.11.0.3'}."""
    m = re.search(r"vllm_v([0-9.]+)", image)
    z = re.search(r"zentorch_v([0-9.]+?)(?:_|$)", image)
    return {"vllm": m.group(1).rstrip(".") if m else None, "zentorch": z.group(1) if z else None}


def elf_has_execstack(data: bytes) -> bool | None:
    """Does this ELF shared object ask for an executable stack (PT_GNU_STACK with PF_X)? None: not ELF."""
    if data[:4] != b"\x7fELF" or len(data) < 64:
        return None
    is64, little = data[4] == 2, data[5] == 1
    end = "<" if little else ">"
    if is64:
        phoff, = struct.unpack_from(end + "Q", data, 32)
        phentsize, phnum = struct.unpack_from(end + "HH", data, 54)
        flags_at = 4
    else:
        phoff, = struct.unpack_from(end + "I", data, 28)
        phentsize, phnum = struct.unpack_from(end + "HH", data, 42)
        flags_at = 24
    for i in range(phnum):
        off = phoff + i * phentsize
        if off + phentsize > len(data):
            return None
        p_type, = struct.unpack_from(end + "I", data, off)
        if p_type == 0x6474E551:  # PT_GNU_STACK
            p_flags, = struct.unpack_from(end + "I", data, off + flags_at)
            return bool(p_flags & 1)
    return False  # no PT_GNU_STACK: the loader's default, not flagged


# ---------------------------------------------------------------- gathering (I/O)

def docker_answers(prefix: list[str]) -> tuple[bool, str]:
    res = common.run([*prefix, "info", "--format", "{{.ServerVersion}}"], timeout=RUNTIME_TIMEOUT_S)
    if res.ok:
        return True, f"{' '.join(prefix)} daemon {res.stdout.strip()}"
    return False, common.clip((res.stderr.strip().splitlines() or [res.failure or "failed"])[-1], 200)


def podman_can_run() -> tuple[bool, str]:
    """podman counts only if it can start a container: run the host's own root as one, no image needed."""
    remote = common.remote_runtime_problem("podman", timeout=RUNTIME_TIMEOUT_S)
    if remote:
        return False, "; ".join(remote)
    res = common.run(["podman", "run", "--rm", "--network=none", "--rootfs", "/", "true"], timeout=60)
    if res.ok:
        return True, "podman runs containers"
    return False, common.clip((res.stderr.strip().splitlines() or [res.failure or "failed"])[-1], 200)


def image_is_local(runtime: str, image: str, engine: str | None = None) -> bool:
    return common.run([*common.runtime_argv(runtime, engine), "image", "inspect", image],
                      timeout=RUNTIME_TIMEOUT_S).ok


def resolve_hf_cache(env: dict) -> dict:
    """The hub cache a container mounts read-write at /root/.cache/huggingface/hub, found as huggingface_hub
    finds it: HF_HUB_CACHE (or the older HUGGINGFACE_HUB_CACHE), else HF_HOME/hub, HF_HOME defaulting to
    $XDG_CACHE_HOME/huggingface or ~/.cache/huggingface; links followed (a link would name a host path the
    container lacks), NFS flagged. Only the hub cache: the rest of HF_HOME holds other tools' files
    (Gradio's, a sandbox, tokens), none of which the server needs, and an HF_HUB_CACHE's parent could be
    anything (HF_HUB_CACHE=$HOME/hub had mounted the home)."""
    common.refuse_a_relative_hub_cache(env)
    named = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    # ~ then $VARS, as huggingface_hub's constants expand them (HF_HUB_CACHE='$HOME/hub' is the home's hub,
    # not ./$HOME): once for a named hub cache, twice for HF_HOME's (HF_HOME, then the hub path built on it)
    if named:
        hub = common.user_path(named, "HF_HUB_CACHE", expand_vars=True)
    else:
        # the client's default, not this bundle's cache_root: it takes XDG_CACHE_HOME=~/x or $VAR/x as it
        # expands, where the XDG spec (cache_root) ignores any value not already absolute
        default = os.path.join(env.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
        home = common.user_path(env.get("HF_HOME") or default, "HF_HOME", expand_vars=True)
        hub = common.user_path(home / "hub", "the Hugging Face cache (HF_HOME/hub)", expand_vars=True)
    try:
        return _hf_cache_at(hub)
    except OSError as exc:  # a path past what the file system takes (ENAMETOOLONG), a folder we may not read
        raise ScriptError(f"cannot use the Hugging Face cache {str(hub)[:200]}: {exc.strerror or exc}",
                          "export HF_HUB_CACHE (or HF_HOME) as a shorter, readable folder")


def _hf_cache_at(home: Path) -> dict:
    notes = []
    real = Path(os.path.realpath(home))
    there = next(p for p in (real, *real.parents) if p.exists())  # what is there now, or the folder it goes in
    if not there.is_dir():  # a file as the cache (or HF_HOME): the runtime cannot mount it, downloads fail
        raise ScriptError(f"the Hugging Face cache {str(home)[:300]} is not a folder ({str(there)[:300]} is "
                          f"{'a file' if there.is_file() else 'not a folder: a pipe, socket or device'})",
                          "export HF_HUB_CACHE (or HF_HOME) to a folder, or leave both unset for ~/.cache/huggingface")
    fstype = filesystem_type(real)
    nfs = fstype in NETWORK_FS
    if real != Path(os.path.abspath(home).replace("//", "/")):  # "//x" is no link: POSIX keeps a leading //
        notes.append(f"{home} is a link to {real}; the real path is mounted")
    if not real.exists():
        notes.append(f"{real} does not exist yet; it is created on first download")
    if nfs:
        notes.append(f"{real} is on {fstype}: root-squash can deny a root container; use a local folder "
                     "(HF_HOME=/local/path) if the container cannot read it")
    return {"path": str(real), "mount_subdir": "hub", "nfs": nfs, "fstype": fstype, "note": "; ".join(notes) or None}


def cache_listing(path: str) -> dict:
    """The HF cache folder as it is now, for serve_plan.hf_mount_problem: its real path and its entries
    (None: not there yet; the runtime makes it), or why it cannot be read."""
    try:
        real = os.path.realpath(path)
        if not os.path.lexists(real):
            return {"real": real, "entries": None, "error": None}
        if not os.path.isdir(real):
            return {"real": real, "entries": None, "error": "not a folder"}
        with os.scandir(real) as found:
            return {"real": real, "entries": sorted(e.name for e in found), "error": None}
    except (OSError, ValueError) as exc:  # ValueError: a NUL in a hand-edited path
        return {"real": path, "entries": None, "error": getattr(exc, "strerror", None) or str(exc)[:200]}


def filesystem_type(path: Path) -> str | None:
    import psutil
    best, fstype = "", None
    target = str(path)
    for part in psutil.disk_partitions(all=True):
        mp = part.mountpoint
        if (target == mp or target.startswith(mp.rstrip("/") + "/")) and len(mp) > len(best):
            best, fstype = mp, part.fstype
    return fstype


def find_libs(names: list[str], python: str | None) -> dict[str, str]:
    """Real paths of the allocator / OpenMP libraries worth preloading: system dirs, then the env."""
    dirs = list(LIB_DIRS)
    if python:
        env = common.real_path(python).parent.parent
        dirs += [str(env / "lib")] + [str(p) for p in (env / "lib").glob("python3*/site-packages/*/lib")]
    found: dict[str, str] = {}
    for name in names:
        for d in dirs:
            p = Path(d) / name
            if p.exists():
                found[name] = os.path.realpath(p)
                break
    return found


def ld_preload_value(found: dict[str, str]) -> tuple[str | None, str]:
    """tcmalloc (minimal preferred) + the env's Intel OpenMP when present."""
    parts = []
    tc = found.get("libtcmalloc_minimal.so.4") or found.get("libtcmalloc.so.4")
    if tc:
        parts.append(tc)
    if found.get("libiomp5.so"):
        parts.append(found["libiomp5.so"])
    note = ("tcmalloc preloaded, as vLLM's CPU install guide advises; on the 2-vCPU EPYC runner the gain was "
            "within run-to-run noise (see reference.md)" if tc else
            "tcmalloc not found: apt-get install libtcmalloc-minimal4 (vLLM's CPU install guide advises preloading it)")
    return (":".join(parts) or None), note


def execstack_libs(python: str | None) -> list[str]:
    """vLLM's compiled extensions that ask for an executable stack (some guest kernels refuse them)."""
    if not python:
        return []
    # the user's interpreter answers as any probe does: bounded, shape-checked, and only a folder's name
    found, _why = common.run_probe([python], VLLM_FOLDER_CODE, "@@VLLMDIR@@", 60, shape=VLLM_FOLDER_SHAPE)
    folder = (found or {}).get("folder")
    try:
        candidates = sorted(Path(folder).glob("_C*.so")) if folder else []
    except (OSError, ValueError):  # a folder no file system holds (or with a NUL): nothing to scan
        return []
    flagged = []
    for so in candidates:
        try:
            if not stat.S_ISREG(os.stat(so).st_mode):  # a FIFO named _C.so would block the read forever
                continue
            with open(so, "rb") as f:
                head = f.read(1 << 16)
        except OSError:  # one unreadable library: the others are still scanned
            continue
        if elf_has_execstack(head):
            flagged.append(str(so))
    return flagged


VLLM_FOLDER_CODE = ("import importlib.util as u, json; s = u.find_spec('vllm'); "
                    "print('@@VLLMDIR@@' + json.dumps({'folder': s.submodule_search_locations[0] if s else None}))")
VLLM_FOLDER_SHAPE = {"type": "object", "properties": {"folder": {"type": ["string", "null"], "maxLength": 4095}}}


def free_port(start: int, host: str = "127.0.0.1", tries: int = 200) -> int | None:
    for port in range(start, min(start + tries, 65536)):
        if port_is_free(port, host):
            return port
    return None


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens there. With --network=host a busy port is a hard failure."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) != 0


def parse_bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise ScriptError(f"not a boolean: {text!r}", "pass true or false (the avx512 field from detect.py)")


# ---------------------------------------------------------------- main

def default_python(epyc: dict, stock: bool) -> str:
    """The setup_host_stack.py venv of the chosen backend when it exists, else this interpreter."""
    venv_py = setup_host_stack.default_venv(epyc["host_stack"], stock) / "bin" / "python"
    return str(venv_py) if venv_py.exists() else sys.executable


def probe_runtimes(want: str, engine: str | None) -> tuple[dict[str, bool], dict[str, str]]:
    """Which container runtimes answer, in the documented order; each probe has a timeout. docker is
    asked on the engine this shell names (read first: a remote one is refused before it is reached)."""
    ok = {"docker": False, "podman": False, "sudo docker": False}
    detail: dict[str, str] = {}
    if want in ("auto", "docker"):
        ok["docker"], detail["docker"] = docker_answers(common.runtime_argv("docker", engine))
    if want in ("auto", "podman") and not ok["docker"]:
        ok["podman"], detail["podman"] = podman_can_run()
    if want in ("auto", "sudo docker") and not (ok["docker"] or ok["podman"]):
        remote = common.remote_runtime_problem("sudo docker", timeout=RUNTIME_TIMEOUT_S)
        ok["sudo docker"], detail["sudo docker"] = ((False, "; ".join(remote)) if remote
                                                    else docker_answers(["sudo", "-n", "docker"]))
    return ok, detail


def probe_image(runtime: str, image: str, engine: str | None = None) -> dict:
    """Is the image local, and what stack does it hold (a python3 -c run inside it, no network)."""
    if not image_is_local(runtime, image, engine):
        return {"local": False, "found": None}
    return {"local": True,
            "found": setup_host_stack.probe_stack(vllm_registry.probe_argv(None, image, runtime, engine)[0])}


def image_stack(probe: dict, image: str, pinned: bool, runtime: str) -> tuple[dict, list[dict]]:
    """The stack inside the image when it is local (probed). A pinned image not pulled yet is read
    from its tag (the tag is ours, in data/epyc.json); any other image must be local to be read."""
    found = probe["found"]
    if not probe["local"] and not pinned:
        stack = {"vllm": None, "zentorch": None, "torch": None, "platform": None, "source": f"absent:{image}"}
        return stack, [issue("image", "error", f"{image} is not a local image, so its stack cannot be read "
                             "(only the pinned images' tags are trusted)",
                             f"{' '.join(common.runtime_argv(runtime))} pull {image}, then re-run validate.py")]
    if found and not found.get("import_error"):
        return ({"vllm": found.get("vllm"), "zentorch": found.get("zentorch"), "torch": found.get("torch"),
                 "platform": found.get("platform"), "source": f"probe:image:{image}"}, [])
    stack = {**versions_from_tag(image), "torch": None, "platform": None, "source": f"tag:{image}"}
    if found:
        return stack, [issue("image", "warning", f"could not probe the stack inside {image}: "
                             f"{found['import_error']}", "check the image; the stack was read from its tag")]
    return stack, [issue("image", "advisory", f"{image} is not pulled; the stack was read from its tag",
                         "pull it (launch.py start does) and re-run validate.py to probe the real stack")]


def host_runtime_ok(host_stack: dict, stock: bool) -> bool:
    """A host env counts when vLLM imports in it, with zentorch for the zentorch path."""
    return not host_stack.get("import_error") and bool(host_stack.get("zentorch") or stock)


def stack_issues(stack: dict, compat: dict, runtime: str | None, stock: bool) -> list[dict]:
    if compat["status"] == "blocked" and runtime and not stack["source"].startswith("absent:"):
        fix = ("use a stock vLLM runtime: python3 scripts/setup_host_stack.py --stock" if stock else
               "use the pinned image / host stack from data/epyc.json (setup_host_stack.py)")
        return [issue("stack", "error", compat["message"], fix)]
    if compat["status"] == "confirmation_required":
        return [issue("stack", "confirmation", compat["message"], "ask the user for an explicit go/no-go")]
    return []


def verdict(cpu: dict, detected: dict, args, epyc: dict, gathered: dict) -> dict:
    """Everything validate.py says, from what was gathered: pure, so every rule is testable."""
    issues = cpu_gate(cpu, epyc["supported_generations"], args.stock)
    runtime, python, detail = gathered["runtime"], gathered["python"], gathered["runtime_detail"]
    if runtime is None:
        setup = "python3 scripts/setup_host_stack.py" + (" --stock" if args.stock else "")
        issues.append(issue("runtime", "error", "no usable runtime: " + "; ".join(f"{k}: {v}" for k, v in detail.items()),
                            "one-time setup: make docker usable by this user (docker group), install podman, "
                            f"or create the host env: {setup}"))
    image = gathered["image"]
    if runtime in ("docker", "podman", "sudo docker"):
        pinned_images = (epyc["container"]["image"], epyc["stock_image"]["image"])
        stack, image_issues = image_stack(gathered["image_probe"], image, image in pinned_images, runtime)
        issues += image_issues
        pinned = epyc["container"]["vllm_version"]
    elif gathered.get("deferred"):  # another host's venv: the pins setup_host_stack.py would install there
        hs = epyc["host_stack"]
        stack = {"vllm": hs["vllm_version"], "zentorch": None if args.stock else hs["zentorch_version"],
                 "torch": hs["torch_version"], "platform": None, "source": "assumed:data/epyc.json host_stack"}
        pinned = hs["vllm_version"]
    else:
        host = gathered["host_stack"]
        stack = {"vllm": host.get("vllm"), "zentorch": host.get("zentorch"), "torch": host.get("torch"),
                 "platform": host.get("platform"), "source": f"probe:python:{python}"}
        pinned = epyc["host_stack"]["vllm_version"]
    stack["zen_active"] = bool(stack.get("platform") and stack["platform"].endswith("ZenCpuPlatform"))
    compat = stack_compatibility(stack, cpu.get("epyc_generation"), pinned, args.stock, cpu.get("vendor")) \
        if runtime and not stack["source"].startswith("absent:") else \
        {"status": "blocked", "message": "no runtime to probe" if not runtime else "the image is not local"}
    issues += stack_issues(stack, compat, runtime, args.stock)
    hf_cache = gathered["hf_cache"]
    if gathered.get("hf_cache_listing"):  # a container mounts it read-write: it must be a cache, nothing else
        try:  # what plan will refuse (a system folder, a ':' in the path) is said here, not one step later
            bind_mount(hf_cache["path"], epyc["container"]["hf_cache_mount_target"] + "/hub")
            problem = hf_mount_problem(hf_cache["path"], gathered["hf_cache_listing"])
        except ScriptError as exc:
            problem = f"cannot be mounted ({exc.error})"
        if problem:
            issues.append(issue("hf_cache", "error", f"the Hugging Face hub cache {hf_cache['path'][:300]} {problem}: "
                                "it is mounted read-write into a root container", HF_MOUNT_FIX))
    if hf_cache["nfs"]:
        issues.append(issue("hf_cache", "warning", hf_cache["note"], "export HF_HOME=/a/local/folder"))
    preload, preload_note = (ld_preload_value(gathered["preload_libs"]) if runtime == "host" else (None, None))
    for so in gathered["execstack"]:
        issues.append(issue("execstack", "warning", f"{so} asks for an executable stack (GNU_STACK RWE); "
                            "some guest kernels refuse to load it", f"patchelf --clear-execstack {so}"))
    if gathered["port"] is None:
        issues.append(issue("port", "error", f"no free port from {args.port_start}", "pass --port-start elsewhere"))
    if gathered.get("deferred"):
        issues.append(issue("deferred", "advisory", f"planning for {detected.get('target')}, not this machine: "
                            f"{', '.join(gathered['deferred'])} are assumed, not probed",
                            "re-check on the host before start: run the chain there (detect.py --capture FILE, "
                            "then validate.py on the host itself)"))
    if gathered["hf_token_set"]:
        issues.append(issue("hf_token", "advisory", "HF_TOKEN is set; it is passed to the server by name only", None))
    errors = [i for i in issues if i["severity"] == "error"]
    confirmations = [i for i in issues if i["severity"] == "confirmation"]
    doc = {
        "ready": not errors,
        "requires_confirmation": bool(confirmations),
        "zentorch_capable": bool(cpu.get("is_amd_epyc") and cpu.get("avx512") and cpu.get("avx512_bf16")),
        "backend": "stock" if args.stock else "zentorch",
        "path": None if runtime is None else ("host" if runtime == "host" else "container"),
        "runtime": runtime,
        "engine": gathered.get("engine"),  # the docker daemon probed, when not the default (DOCKER_HOST)
        "runtime_detail": detail,
        "host_path_available": gathered["host_ok"],
        "python": python if runtime == "host" else None,
        "image": image if runtime not in (None, "host") else None,
        "stack": stack,
        "compatibility": compat,
        "hf_cache": hf_cache,
        "ld_preload": {"value": preload, "note": preload_note},
        "port": gathered["port"],
        "ram_gb": detected.get("ram_gb"),
        "cpu_model": cpu.get("cpu_model"),
        "vendor": cpu.get("vendor"),
        "epyc_generation": cpu.get("epyc_generation"),
        "hf_token_set": gathered["hf_token_set"],
        "errors": errors,
        "confirmations": confirmations,
        "warnings": [i for i in issues if i["severity"] == "warning"],
        "advisories": [i for i in issues if i["severity"] == "advisory"],
        # the pitfalls of the path this host takes (data/epyc.json gotchas), for the agent to keep in mind
        "target": detected.get("target", "localhost"),
        "deferred": gathered.get("deferred", []),
        "gotchas": [{"id": g["id"], "text": g["text"]} for g in epyc["gotchas"]
                    if runtime and g["applies_to"] in ("all", "host" if runtime == "host" else "container")],
    }
    if errors:  # the one contract: exit 1 carries error and fix (each issue keeps its own, too)
        doc["error"] = "not ready: " + "; ".join(e["message"] for e in errors)
        doc["fix"] = next((e["fix"] for e in errors if e["fix"]), "see errors")
    return doc


def gather(args, epyc: dict, image: str, python: str) -> dict:
    """All the probing (I/O), in the documented order; the runtime choice between the two rounds is
    the pure choose_runtime, because what to probe next depends on it."""
    engine = common.shell_docker_engine(RUNTIME_TIMEOUT_S) if args.runtime in ("auto", "docker") else None
    rt_ok, detail = probe_runtimes(args.runtime, engine)
    host_stack = setup_host_stack.probe_stack([python])
    host_ok = host_runtime_ok(host_stack, args.stock)
    detail["host"] = (f"{python}: vllm {host_stack.get('vllm')}, zentorch {host_stack.get('zentorch')}"
                      if host_ok else f"{python}: {host_stack.get('import_error') or 'zentorch missing'}")
    runtime = choose_runtime(rt_ok["docker"], rt_ok["podman"], rt_ok["sudo docker"],
                             host_ok and args.runtime in ("auto", "host"))
    container = runtime in ("docker", "podman", "sudo docker")
    hf_cache = resolve_hf_cache(dict(os.environ))
    return {
        "runtime": runtime, "engine": engine if runtime == "docker" else None,
        "runtime_detail": detail, "python": python, "host_stack": host_stack,
        "host_ok": host_ok, "image": image,
        "image_probe": probe_image(runtime, image, engine if runtime == "docker" else None) if container else None,
        "hf_cache": hf_cache,
        "hf_cache_listing": cache_listing(hf_cache["path"]) if container else None,
        "preload_libs": find_libs(epyc["host_stack"]["ld_preload_libs"], python) if runtime == "host" else {},
        "execstack": execstack_libs(python) if runtime == "host" else [],
        "port": free_port(args.port_start),
        "hf_token_set": bool(os.environ.get("HF_TOKEN")),
    }


def deferred_gather(args, epyc: dict, image: str, python: str) -> dict:
    """For another host (a spec, a capture, an ssh target): nothing on this machine says anything about
    its runtime, port, HF cache or libraries, so they are assumed and listed -- never probed here."""
    runtime = "docker" if args.runtime == "auto" else args.runtime
    return {
        "runtime": runtime, "runtime_detail": {runtime: "assumed (deferred to the host)"}, "python": python,
        "host_stack": {"import_error": "deferred"}, "host_ok": runtime == "host", "image": image,
        "image_probe": {"local": False, "found": None},
        "hf_cache": {"path": epyc["container"]["hf_cache_mount_target"] + "/hub", "mount_subdir": "hub",
                     "nfs": False, "fstype": None,
                     "note": "assumed: the host's HF cache is root's default (deferred to the host)"},
        "preload_libs": {}, "execstack": [], "port": epyc["serve"]["default_port"], "hf_token_set": False,
        "deferred": ["runtime", "image pull and its stack probe", "port", "HF cache", "LD_PRELOAD libraries"],
    }


def main(argv: Sequence[str] | None = None):
    epyc = common.load_epyc()
    p = common.JsonArgumentParser(prog="scripts/validate.py", description=__doc__.split("\n")[0])
    p.add_argument("--detect", type=common.nonempty, help="detect.py's JSON for this host (default: read the CPU here)")
    p.add_argument("--image", default=None, type=common.image_ref, help="container image (default: the pinned one, "
                   "or the stock image with --stock)")
    p.add_argument("--generation", choices=sorted({g["name"] for g in epyc["generations"]}),
                   help="override epyc_generation (default: from --detect or this host)")
    p.add_argument("--avx512", type=parse_bool, help="override avx512 (default: from --detect or this host)")
    p.add_argument("--python", type=common.nonempty, help="interpreter of the host path (default: the "
                   "setup_host_stack.py venv of the backend if it exists, else this one)")
    p.add_argument("--runtime", choices=["auto", "docker", "podman", "sudo docker", "host"], default="auto",
                   help="force a runtime instead of the detection order")
    p.add_argument("--stock", action="store_true", help="the stock vLLM CPU path (no zentorch), user confirmed")
    p.add_argument("--port-start", type=common.int_in(1, 65535), default=epyc["serve"]["default_port"])
    args = p.parse_args(argv)
    image = args.image or (epyc["stock_image"]["image"] if args.stock else epyc["container"]["image"])
    if args.python is not None:
        # absolute, as launch plans need it (another folder runs it later), but not resolved: a venv's python
        # is a link to the base interpreter, and only the link's path finds the venv's packages
        python = os.path.abspath(common.user_path(args.python, "--python"))
        if not common.is_executable(python):
            what = "does not exist" if not Path(python).exists() else "is not an executable file"
            raise ScriptError(f"--python {args.python} {what}", "pass the interpreter of the env that has "
                              "the stack (python3 scripts/setup_host_stack.py creates one; --stock for stock vLLM)")
    else:
        python = default_python(epyc, args.stock)
    if args.detect:
        detected = common.read_json_input(args.detect, "detect")
        common.check_schema(detected, "detect", f"--detect {args.detect} is not detect.py's output",
                            "pass the unmodified stdout of detect.py")
    else:
        detected = detect.report(detect.gather(common.Sysroot("/"), "localhost", live=True), epyc)
    cpu = cpu_facts(detected, args.generation, args.avx512)
    remote = common.is_another_host(detected.get("target", "localhost"))
    gathered = deferred_gather(args, epyc, image, python) if remote else gather(args, epyc, image, python)
    doc = verdict(cpu, detected, args, epyc, gathered)
    return doc, common.EXIT_OK if doc["ready"] else common.EXIT_FAIL


if __name__ == "__main__":
    sys.exit(common.run_main(main))
