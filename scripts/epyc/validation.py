"""Is this host ready to serve: a runtime, a capable CPU, a compatible stack, a cache, a port."""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
from pathlib import Path

from . import architectures, cpuid, hoststack, runtimes, venv
from .errors import ScriptError
from .hubcache import HF_MOUNT_FIX, bind_mount, cache_listing, hf_mount_problem, resolve_hf_cache
from .preload import execstack_libs, find_libs, ld_preload_value
from .runtimes import RUNTIME_TIMEOUT_S, choose_runtime, host_runtime_ok, image_is_local, probe_runtimes

# ---------------------------------------------------------------- pure decisions


def issue(check: str, severity: str, message: str, fix: str | None = None) -> dict:
    return {"check": check, "severity": severity, "message": message, "fix": fix}


# how validate weighs detect's route (cpuid.route_host): one decision, said the same way by both
ROUTE_SEVERITY = {"stop": "error", "stock_offer": "error", "confirm": "confirmation", "stock": "confirmation"}


def cpu_gate(cpu: dict, supported: list[str], stock: bool) -> list[dict]:
    """The CPU's route as validate's finding: a host zentorch cannot serve is an error unless the user took the
    stock path (--stock), which, like an unvalidated generation, needs consent. `cpu` has detect.py's fields."""
    route = cpuid.route_host(cpu, supported, stock)
    severity = ROUTE_SEVERITY.get(route["route"])
    if severity is None:
        return []
    return [issue("cpu", severity, route["reason"], route["fix"] or "get the user's explicit OK before launching")]


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


def stack_compatibility(
    stack: dict, generation: str | None, pinned_vllm: str, stock: bool, vendor: str | None = "AuthenticAMD"
) -> dict:
    """proceed | blocked | confirmation_required, from what the serving runtime reports.

    What runs must be what was asked for: the zentorch path needs vLLM to select ZenCpuPlatform
    (it does so only on AMD CPUs), and the stock path must not quietly run zentorch. Venice is
    validated only on the pinned vLLM. An unprobed stack (image not pulled) proceeds on its tag."""
    platform = stack.get("platform") or ""
    short = platform.rsplit(".", 1)[-1]
    version = architectures.normalize_version(stack.get("vllm"))
    if stock:
        if short == "ZenCpuPlatform":
            return {
                "status": "blocked",
                "message": "the stock path was asked for, but this runtime activates "
                "zentorch (ZenCpuPlatform): use a stock vLLM runtime (setup_host_stack.py --stock)",
            }
        return {
            "status": "proceed",
            "message": f"stock vLLM CPU path (vLLM {version or 'from the image'}, "
            f"{short or 'platform not probed'}, no zentorch), on the user's OK",
        }
    if platform and short != "ZenCpuPlatform":
        why = (
            f"zentorch is inactive because this CPU is {cpuid.vendor_name(vendor)} (vLLM activates "
            "ZenCpuPlatform only on AMD CPUs)"
            if vendor != "AuthenticAMD"
            else "zentorch acceleration is not active in this runtime"
        )
        return {"status": "blocked", "message": f"vLLM selected {short}, not ZenCpuPlatform: {why}"}
    if generation == "Venice" and version and version != pinned_vllm:
        return {
            "status": "confirmation_required",
            "message": f"Venice is validated on vLLM {pinned_vllm}; this "
            f"runtime has {version}. Recommend the pinned image; go on only with the user's explicit OK",
        }
    if not platform:
        return {
            "status": "proceed",
            "message": f"stack read from the image tag (vLLM {version}); pull the image "
            "and re-run validate.py to probe it",
        }
    return {"status": "proceed", "message": f"vLLM {version} on ZenCpuPlatform"}


STACK_KEYS = ("vllm", "zentorch", "torch", "platform")


def versions_from_tag(image: str) -> dict:
    """'..:vllm_v0.25.1_zentorch_v2.11.0.3_..' -> {'vllm': '0.25.1', 'zentorch': '2.11.0.3'}."""
    m = re.search(r"(?:vllm_v|:v)([0-9.]+)", image)  # zentorch's tag names it, the stock image's is vX.Y.Z
    z = re.search(r"zentorch_v([0-9.]+?)(?:_|$)", image)
    return {"vllm": m.group(1).rstrip(".") if m else None, "zentorch": z.group(1) if z else None}


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


# ---------------------------------------------------------------- main


def default_python(epyc: dict, stock: bool) -> str:
    """The setup_host_stack.py venv of the chosen backend when it exists, else this interpreter (a python3
    with vLLM of the user's), but never the bundle's own venv: it holds the scripts' libraries, not a stack."""
    venv_py = hoststack.default_venv(epyc["host_stack"], stock) / "bin" / "python"
    own = Path(sys.prefix).resolve() == venv.BUNDLE_VENV.resolve()
    return str(venv_py) if venv_py.exists() or own else sys.executable


def probe_image(runtime: str, image: str, engine: str | None = None) -> dict:
    """Is the image local, and what stack does it hold (a python3 -c run inside it, no network)."""
    if not image_is_local(runtime, image, engine):
        return {"local": False, "found": None}
    return {"local": True, "found": hoststack.probe_stack(architectures.probe_argv(None, image, runtime, engine)[0])}


def image_stack(probe: dict, image: str, pinned: bool, runtime: str) -> tuple[dict, list[dict]]:
    """The stack inside the image when it is local (probed). A pinned image not pulled yet is read
    from its tag (the tag is ours, in data/epyc.json); any other image must be local to be read."""
    found = probe["found"]
    if not probe["local"] and not pinned:
        stack = {**dict.fromkeys(STACK_KEYS), "source": f"absent:{image}"}
        return stack, [
            issue(
                "image",
                "error",
                f"{image} is not a local image, so its stack cannot be read (only the pinned images' tags are trusted)",
                f"{' '.join(runtimes.runtime_argv(runtime))} pull {image}, then re-run validate.py",
            )
        ]
    if found and not found.get("import_error"):
        return {**{k: found.get(k) for k in STACK_KEYS}, "source": f"probe:image:{image}"}, []
    stack = {**versions_from_tag(image), "torch": None, "platform": None, "source": f"tag:{image}"}
    if found:
        return stack, [
            issue(
                "image",
                "warning",
                f"could not probe the stack inside {image}: {found['import_error']}",
                "check the image; the stack was read from its tag",
            )
        ]
    return stack, [
        issue(
            "image",
            "advisory",
            f"{image} is not pulled; the stack was read from its tag",
            "pull it (launch.py start does) and re-run validate.py to probe the real stack",
        )
    ]


def stack_issues(stack: dict, compat: dict, runtime: str | None, stock: bool) -> list[dict]:
    if compat["status"] == "blocked" and runtime and not stack["source"].startswith("absent:"):
        fix = (
            "use a stock vLLM runtime: python3 scripts/setup_host_stack.py --stock"
            if stock
            else "use the pinned image / host stack from data/epyc.json (setup_host_stack.py)"
        )
        return [issue("stack", "error", compat["message"], fix)]
    if compat["status"] == "confirmation_required":
        return [issue("stack", "confirmation", compat["message"], "ask the user for an explicit go/no-go")]
    return []


def stack_for(runtime: str | None, gathered: dict, epyc: dict, stock: bool) -> tuple[dict, str, list[dict]]:
    """The stack the runtime serves with (the image's, another host's pins, or the host venv's), the pinned
    vLLM it is compared with, and what the image probe said."""
    if runtime in ("docker", "podman", "sudo docker"):
        image = gathered["image"]
        pinned_images = (epyc["container"]["image"], epyc["stock_image"]["image"])
        stack, image_issues = image_stack(gathered["image_probe"], image, image in pinned_images, runtime)
        pinned = epyc["stock_image" if image == pinned_images[1] else "container"]["vllm_version"]
        return stack, pinned, image_issues
    if gathered.get("deferred"):  # another host's venv: the pins setup_host_stack.py would install there
        hs = epyc["host_stack"]
        stack = {
            "vllm": hs["vllm_version"],
            "zentorch": None if stock else hs["zentorch_version"],
            "torch": hs["torch_version"],
            "platform": None,
            "source": "assumed:data/epyc.json host_stack",
        }
        return stack, hs["vllm_version"], []
    host = gathered["host_stack"]
    stack = {**{k: host.get(k) for k in STACK_KEYS}, "source": f"probe:python:{gathered['python']}"}
    return stack, epyc["host_stack"]["vllm_version"], []


def cache_issues(hf_cache: dict, gathered: dict, epyc: dict) -> list[dict]:
    """The hub cache a container mounts read-write must be a cache, nothing else; NFS is a warning."""
    issues = []
    if gathered.get("hf_cache_listing"):  # what plan will refuse is said here, not one step later
        try:
            bind_mount(hf_cache["path"], epyc["container"]["hf_cache_mount_target"] + "/hub")
            problem = hf_mount_problem(hf_cache["path"], gathered["hf_cache_listing"])
        except ScriptError as exc:
            problem = f"cannot be mounted ({exc.error})"
        if problem:
            issues.append(
                issue(
                    "hf_cache",
                    "error",
                    f"the Hugging Face hub cache {hf_cache['path'][:300]} {problem}: "
                    "it is mounted read-write into a root container",
                    HF_MOUNT_FIX,
                )
            )
    if hf_cache["nfs"]:
        issues.append(issue("hf_cache", "warning", hf_cache["note"], "export HF_HOME=/a/local/folder"))
    return issues


def host_issues(gathered: dict, detected: dict, port_start: int) -> list[dict]:
    """Executable-stack libraries, no free port, a plan for another host, a token in the shell."""
    issues = [
        issue(
            "execstack",
            "warning",
            f"{so} asks for an executable stack (GNU_STACK RWE); some guest kernels refuse to load it",
            f"patchelf --clear-execstack {so}",
        )
        for so in gathered["execstack"]
    ]
    if gathered["port"] is None:
        issues.append(issue("port", "error", f"no free port from {port_start}", "pass --port-start elsewhere"))
    if gathered.get("deferred"):
        issues.append(
            issue(
                "deferred",
                "advisory",
                f"planning for {detected.get('target')}, not this machine: "
                f"{', '.join(gathered['deferred'])} are assumed, not probed",
                "re-check on the host before start: run the chain there (detect.py --capture FILE, "
                "then validate.py on the host itself)",
            )
        )
    if gathered["hf_token_set"]:
        issues.append(issue("hf_token", "advisory", "HF_TOKEN is set; it is passed to the server by name only", None))
    return issues


def verdict(cpu: dict, detected: dict, args: argparse.Namespace, epyc: dict, gathered: dict) -> dict:
    """Everything validate.py says, from what was gathered: pure, so every rule is testable. `args` holds
    the flags it reads: stock and port_start."""
    issues = cpu_gate(cpu, epyc["supported_generations"], args.stock)
    runtime, python, detail = gathered["runtime"], gathered["python"], gathered["runtime_detail"]
    if runtime is None:
        setup = "python3 scripts/setup_host_stack.py" + (" --stock" if args.stock else "")
        issues.append(
            issue(
                "runtime",
                "error",
                "no usable runtime: " + "; ".join(f"{k}: {v}" for k, v in detail.items()),
                "one-time setup: make docker usable by this user (docker group), install podman, "
                f"or create the host env: {setup}",
            )
        )
    stack, pinned, image_issues = stack_for(runtime, gathered, epyc, args.stock)
    issues += image_issues
    stack["zen_active"] = bool(stack.get("platform") and stack["platform"].endswith("ZenCpuPlatform"))
    compat = (
        stack_compatibility(stack, cpu.get("epyc_generation"), pinned, args.stock, cpu.get("vendor"))
        if runtime and not stack["source"].startswith("absent:")
        else {"status": "blocked", "message": "no runtime to probe" if not runtime else "the image is not local"}
    )
    issues += stack_issues(stack, compat, runtime, args.stock)
    issues += cache_issues(gathered["hf_cache"], gathered, epyc)
    preload, preload_note = ld_preload_value(gathered["preload_libs"]) if runtime == "host" else (None, None)
    issues += host_issues(gathered, detected, args.port_start)
    errors = [i for i in issues if i["severity"] == "error"]
    confirmations = [i for i in issues if i["severity"] == "confirmation"]
    image = gathered["image"]
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
        "hf_cache": gathered["hf_cache"],
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
        "target": detected.get("target", "localhost"),
        "deferred": gathered.get("deferred", []),
        # the pitfalls of the path this host takes (data/epyc.json gotchas), for the agent to keep in mind
        "gotchas": [
            {"id": g["id"], "text": g["text"]}
            for g in epyc["gotchas"]
            if runtime and g["applies_to"] in ("all", "host" if runtime == "host" else "container")
        ],
    }
    if errors:  # the one contract: exit 1 carries error and fix (each issue keeps its own, too)
        doc["error"] = "not ready: " + "; ".join(e["message"] for e in errors)
        doc["fix"] = next((e["fix"] for e in errors if e["fix"]), "see errors")
    return doc


def gather(args: argparse.Namespace, epyc: dict, image: str, python: str) -> dict:
    """All the probing (I/O), in the documented order; the runtime choice between the two rounds is
    the pure choose_runtime, because what to probe next depends on it."""
    engine = runtimes.shell_docker_engine(RUNTIME_TIMEOUT_S) if args.runtime in ("auto", "docker") else None
    rt_ok, detail = probe_runtimes(args.runtime, engine)
    host_stack = hoststack.probe_stack([python])
    host_ok = host_runtime_ok(host_stack, args.stock)
    detail["host"] = (
        f"{python}: vllm {host_stack.get('vllm')}, zentorch {host_stack.get('zentorch')}"
        if host_ok
        else f"no host stack venv at {Path(python).parent.parent} yet"
        if not os.path.exists(python)
        else f"{python}: {host_stack.get('import_error') or 'zentorch missing'}"
    )
    runtime = choose_runtime(
        rt_ok["docker"], rt_ok["podman"], rt_ok["sudo docker"], host_ok and args.runtime in ("auto", "host")
    )
    container = runtime in ("docker", "podman", "sudo docker")
    hf_cache = resolve_hf_cache(dict(os.environ))
    return {
        "runtime": runtime,
        "engine": engine if runtime == "docker" else None,
        "runtime_detail": detail,
        "python": python,
        "host_stack": host_stack,
        "host_ok": host_ok,
        "image": image,
        "image_probe": probe_image(runtime, image, engine if runtime == "docker" else None) if container else None,
        "hf_cache": hf_cache,
        "hf_cache_listing": cache_listing(hf_cache["path"]) if container else None,
        "preload_libs": find_libs(epyc["host_stack"]["ld_preload_libs"], python) if runtime == "host" else {},
        "execstack": execstack_libs(python) if runtime == "host" else [],
        "port": free_port(args.port_start),
        "hf_token_set": bool(os.environ.get("HF_TOKEN")),
    }


def deferred_gather(args: argparse.Namespace, epyc: dict, image: str, python: str) -> dict:
    """For another host (a spec, a capture, an ssh target): nothing on this machine says anything about
    its runtime, port, HF cache or libraries, so they are assumed and listed -- never probed here."""
    runtime = "docker" if args.runtime == "auto" else args.runtime
    return {
        "runtime": runtime,
        "runtime_detail": {runtime: "assumed (deferred to the host)"},
        "python": python,
        "host_stack": {"import_error": "deferred"},
        "host_ok": runtime == "host",
        "image": image,
        "image_probe": {"local": False, "found": None},
        "hf_cache": {
            "path": epyc["container"]["hf_cache_mount_target"] + "/hub",
            "mount_subdir": "hub",
            "nfs": False,
            "fstype": None,
            "note": "assumed: the host's HF cache is root's default (deferred to the host)",
        },
        "preload_libs": {},
        "execstack": [],
        "port": epyc["serve"]["default_port"],
        "hf_token_set": False,
        "deferred": ["runtime", "image pull and its stack probe", "port", "HF cache", "LD_PRELOAD libraries"],
    }
