"""Is this host ready to serve: a runtime, a capable CPU, a compatible stack, a cache, a port."""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
from pathlib import Path

from epyc import argtypes
from epyc.errors import ScriptError
from epyc.facts import architectures, cpuid, hoststack, runtimes, venv
from epyc.facts.hubcache import HF_MOUNT_FIX, bind_mount, cache_listing, hf_mount_problem, resolve_hf_cache
from epyc.facts.preload import execstack_libs, find_libs, ld_preload_value
from epyc.facts.runtimes import choose_runtime, host_runtime_ok, image_is_local, probe_runtimes

CONTAINERS = ("docker", "podman", "sudo docker")
SPEC_HOME = "/root"  # a described host's home when none was read there: the container path's cache was root's
STACK_KEYS = ("vllm", "zentorch", "torch", "platform")
# how validate weighs detect's route (cpuid.route_host): one decision, said the same way by both; the stock
# route exists only when --stock asked for it, and that request is the user's OK (recorded, not asked again)
ROUTE_SEVERITY = {"stop": "error", "stock_offer": "error", "confirm": "confirmation", "stock": "confirmed"}
# each list of the document, and the severity of the issues it holds
SEVERITIES = ("error", "confirmation", "confirmed", "warning", "advisory")
SEVERITY_LISTS = dict(zip("errors confirmations confirmed warnings advisories".split(), SEVERITIES))


def issue(check: str, severity: str, message: str, fix: str | None = None) -> dict:
    return {"check": check, "severity": severity, "message": message, "fix": fix}


def cpu_facts(detected: dict, generation: str | None, avx512: bool | None) -> dict:
    """detect.py's facts with the --generation / --avx512 overrides (avx512 false clears bf16; true keeps the CPU's)."""
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
    """proceed | blocked | confirmation_required: what runs must be what was asked for (ZenCpuPlatform, which vLLM
    selects only on AMD CPUs, or stock without zentorch); Venice only on the pinned vLLM; an unprobed stack proceeds."""
    platform = stack.get("platform") or ""
    short = platform.rsplit(".", 1)[-1]
    version = argtypes.normalize_version(stack.get("vllm"))
    if stock and short == "ZenCpuPlatform":
        status = "blocked"
        message = "the stock path was asked for, but this runtime activates zentorch (ZenCpuPlatform): use a stock vLLM runtime (setup_host_stack.py --stock)"
    elif stock:
        status = "proceed"
        message = f"stock vLLM CPU path (vLLM {version or 'from the image'}, {short or 'platform not probed'}, no zentorch), on the user's OK"
    elif platform and short != "ZenCpuPlatform":
        why = "zentorch acceleration is not active in this runtime"
        if vendor != "AuthenticAMD":
            why = f"zentorch is inactive because this CPU is {cpuid.vendor_name(vendor)} (vLLM activates ZenCpuPlatform only on AMD CPUs)"
        status, message = "blocked", f"vLLM selected {short}, not ZenCpuPlatform: {why}"
    elif generation == "Venice" and version and version != pinned_vllm:
        status = "confirmation_required"
        message = f"Venice is validated on vLLM {pinned_vllm}; this runtime has {version}. Recommend the pinned image; go on only with the user's explicit OK"
    elif not platform:
        status = "proceed"
        message = f"stack read from the image tag (vLLM {version}); pull the image and re-run validate.py to probe it"
    else:
        status, message = "proceed", f"vLLM {version} on ZenCpuPlatform"
    return {"status": status, "message": message}


def versions_from_tag(image: str) -> dict:
    """'..:vllm_v0.25.1_zentorch_v2.11.0.3_..' -> {'vllm': '0.25.1', 'zentorch': '2.11.0.3'}."""
    m = re.search(r"(?:vllm_v|:v)([0-9.]+)", image)  # zentorch's tag names it, the stock image's is vX.Y.Z
    z = re.search(r"zentorch_v([0-9.]+?)(?:_|$)", image)
    return {"vllm": m.group(1).rstrip(".") if m else None, "zentorch": z.group(1) if z else None}


def free_port(start: int, host: str = "127.0.0.1", tries: int = 200) -> int | None:
    return next((port for port in range(start, min(start + tries, 65536)) if port_is_free(port, host)), None)


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


def image_stack(probe: dict, image: str, pinned: bool, runtime: str, setup: str | None) -> tuple[dict, list[dict]]:
    """The image's stack: probed when local, else read from its tag for a pinned image (ours), else an error (whose
    fix, for an image built here, is the line that builds it)."""
    found = probe["found"]
    if not probe["local"] and not pinned:
        why = f"{image} is not a local image, so its stack cannot be read (only the pinned images' tags are trusted)"
        fix = f"{setup or ' '.join(runtimes.runtime_argv(runtime)) + ' pull ' + image}, then re-run validate.py"
        return {**dict.fromkeys(STACK_KEYS), "source": f"absent:{image}"}, [issue("image", "error", why, fix)]
    if found and not found.get("import_error"):
        return {**{k: found.get(k) for k in STACK_KEYS}, "source": f"probe:image:{image}"}, []
    stack = {**versions_from_tag(image), "torch": None, "platform": None, "source": f"tag:{image}"}
    if found:
        why = f"could not probe the stack inside {image}: {found['import_error']}"
        return stack, [issue("image", "warning", why, "check the image; the stack was read from its tag")]
    why = f"{image} is not pulled; the stack was read from its tag"
    fix = "pull it (launch.py start does) and re-run validate.py to probe the real stack"
    return stack, [issue("image", "advisory", why, fix)]


def stack_for(runtime: str | None, gathered: dict, epyc: dict, stock: bool) -> tuple[dict, str, list[dict]]:
    """The stack the runtime serves with (image, another host's pins or venv), the pinned vLLM, the image's issues."""
    if runtime in CONTAINERS:
        image = gathered["image"]
        pinned_images = (epyc["container"]["image"], epyc["stock_image"]["image"])
        setup = next((r["setup"] for r in epyc["stacks"].values() if r.get("image") == image), None)
        stack, image_issues = image_stack(gathered["image_probe"], image, image in pinned_images, runtime, setup)
        pinned = epyc["stock_image" if image == pinned_images[1] else "container"]["vllm_version"]
        return stack, pinned, image_issues
    hs = epyc["host_stack"]
    if gathered.get("deferred"):  # another host's venv: the pins setup_host_stack.py would install there
        zentorch = None if stock else hs["zentorch_version"]
        pins = {"vllm": hs["vllm_version"], "zentorch": zentorch, "torch": hs["torch_version"]}
        stack = {**dict.fromkeys(STACK_KEYS), **pins, "source": "assumed:data/epyc.json host_stack"}
    else:
        got = gathered["host_stack"]
        stack = {**{k: got.get(k) for k in STACK_KEYS}, "source": f"probe:python:{gathered['python']}"}
    return stack, hs["vllm_version"], []


def stack_findings(cpu: dict, stock: bool, epyc: dict, gathered: dict) -> tuple[dict, dict, list[dict]]:
    """The stack the runtime serves with, its compatibility, and what is wrong with either (runtime, image, stack)."""
    runtime, issues = gathered["runtime"], []
    if runtime is None:
        why = "no usable runtime: " + "; ".join(f"{k}: {v}" for k, v in gathered["runtime_detail"].items())
        setup = "python3 scripts/setup_host_stack.py" + (" --stock" if stock else "")
        fix = f"one-time setup: make docker usable by this user (docker group), install podman, or create the host env: {setup}"
        issues.append(issue("runtime", "error", why, fix))
    stack, pinned, image_issues = stack_for(runtime, gathered, epyc, stock)
    issues += image_issues
    stack["zen_active"] = bool(stack.get("platform") and stack["platform"].endswith("ZenCpuPlatform"))
    if not runtime or stack["source"].startswith("absent:"):  # unknown, not blocked: that error is the one cause
        why = "the image is not local (the image error)" if runtime else "no runtime to probe (the runtime error)"
        return stack, {"status": "unknown", "message": why}, issues
    compat = stack_compatibility(stack, cpu.get("epyc_generation"), pinned, stock, cpu.get("vendor"))
    if compat["status"] == "blocked":
        fix = "use the pinned image / host stack from data/epyc.json (setup_host_stack.py)"
        if stock:
            fix = "use a stock vLLM runtime: python3 scripts/setup_host_stack.py --stock"
        issues.append(issue("stack", "error", compat["message"], fix))
    elif compat["status"] == "confirmation_required":
        issues.append(issue("stack", "confirmation", compat["message"], "ask the user for an explicit go/no-go"))
    return stack, compat, issues


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
            why = f"the Hugging Face hub cache {hf_cache['path'][:300]} {problem}: it is mounted read-write into a root container"
            issues.append(issue("hf_cache", "error", why, HF_MOUNT_FIX))
    if hf_cache["nfs"]:
        issues.append(issue("hf_cache", "warning", hf_cache["note"], "export HF_HOME=/a/local/folder"))
    return issues


def host_issues(gathered: dict, detected: dict, port_start: int) -> list[dict]:
    """Executable-stack libraries, no free port, a plan for another host, a token in the shell."""
    why = "asks for an executable stack (GNU_STACK RWE); some guest kernels refuse to load it"
    issues = [
        issue("execstack", "warning", f"{so} {why}", f"patchelf --clear-execstack {so}") for so in gathered["execstack"]
    ]
    if gathered["port"] is None:
        issues.append(issue("port", "error", f"no free port from {port_start}", "pass --port-start elsewhere"))
    if gathered.get("deferred"):
        why = f"planning for {detected.get('target')}, not this machine: {', '.join(gathered['deferred'])} are assumed, not probed"
        fix = "re-check on the host before start: run the chain there (detect.py --capture FILE, then validate.py on the host itself)"
        issues.append(issue("deferred", "advisory", why, fix))
    if gathered["hf_token_set"]:
        issues.append(issue("hf_token", "advisory", "HF_TOKEN is set; it is passed to the server by name only"))
    return issues


def verdict(cpu: dict, detected: dict, args: argparse.Namespace, epyc: dict, gathered: dict) -> dict:
    """Everything validate.py says from what was gathered, pure so every rule is testable (args: stock, port_start)."""
    route = cpuid.route_host(cpu, epyc["supported_generations"], args.stock)
    severity = ROUTE_SEVERITY.get(route["route"])
    fix = route["fix"] or "get the user's explicit OK before launching"
    issues = [issue("cpu", severity, route["reason"], fix)] if severity else []
    stack, compat, stack_issues = stack_findings(cpu, args.stock, epyc, gathered)
    issues += stack_issues + cache_issues(gathered["hf_cache"], gathered, epyc)
    issues += host_issues(gathered, detected, args.port_start)
    said = {name: [i for i in issues if i["severity"] == severity] for name, severity in SEVERITY_LISTS.items()}
    runtime = gathered["runtime"]
    preload, preload_note = ld_preload_value(gathered["preload_libs"]) if runtime == "host" else (None, None)
    path = "host" if runtime == "host" else "container"
    doc = {
        "ready": not said["errors"],
        "requires_confirmation": bool(said["confirmations"]),
        "zentorch_capable": bool(cpu.get("is_amd_epyc") and cpu.get("avx512") and cpu.get("avx512_bf16")),
        "backend": "stock" if args.stock else "zentorch",
        "path": None if runtime is None else path,
        "runtime": runtime,
        "engine": gathered.get("engine"),  # the docker daemon probed, when not the default (DOCKER_HOST)
        "runtime_detail": gathered["runtime_detail"],
        "host_path_available": gathered["host_ok"],
        "python": gathered["python"] if runtime == "host" else None,
        "image": gathered["image"] if runtime in CONTAINERS else None,
        "stack": stack,
        "compatibility": compat,
        "hf_cache": gathered["hf_cache"],
        "ld_preload": {"value": preload, "note": preload_note},
        "port": gathered["port"],
        "ram_gb": detected.get("ram_gb"),
        **{k: cpu.get(k) for k in ("cpu_model", "vendor", "epyc_generation")},
        "hf_token_set": gathered["hf_token_set"],
        "home": gathered.get("home"),  # another host's, which its plan's paths are under; None here
        **said,
        "target": detected.get("target", "localhost"),
        "deferred": gathered.get("deferred", []),
        # the pitfalls of the path this host takes (data/epyc.json gotchas), for the agent to keep in mind
        "gotchas": [
            {"id": g["id"], "text": g["text"]} for g in epyc["gotchas"] if runtime and g["applies_to"] in ("all", path)
        ],
    }
    if said["errors"]:  # the one contract: exit 1 carries error and fix (each issue keeps its own, too)
        doc["error"] = "not ready: " + "; ".join(e["message"] for e in said["errors"])
        doc["fix"] = next((e["fix"] for e in said["errors"] if e["fix"]), "see errors")
    return doc


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


def gather(args: argparse.Namespace, epyc: dict, image: str, python: str) -> dict:
    """All the probing (I/O) in the documented order; the pure choose_runtime between two rounds picks what is next."""
    engine = runtimes.shell_docker_engine() if args.runtime in ("auto", "docker") else None
    rt_ok, detail = probe_runtimes(args.runtime, engine)
    host_stack = hoststack.probe_stack([python])
    host_ok = host_runtime_ok(host_stack, args.stock)
    if host_ok:
        detail["host"] = f"{python}: vllm {host_stack.get('vllm')}, zentorch {host_stack.get('zentorch')}"
    elif not os.path.exists(python):
        detail["host"] = f"no host stack venv at {Path(python).parent.parent} yet"
    else:
        detail["host"] = f"{python}: {host_stack.get('import_error') or 'zentorch missing'}"
    runtime = choose_runtime(*(rt_ok[r] for r in CONTAINERS), host_ok and args.runtime in ("auto", "host"))
    engine = engine if runtime == "docker" else None
    hf_cache = resolve_hf_cache(dict(os.environ))
    return {
        "runtime": runtime,
        "engine": engine,
        "runtime_detail": detail,
        "python": python,
        "host_stack": host_stack,
        "host_ok": host_ok,
        "image": image,
        "image_probe": probe_image(runtime, image, engine) if runtime in CONTAINERS else None,
        "hf_cache": hf_cache,
        "hf_cache_listing": cache_listing(hf_cache["path"]) if runtime in CONTAINERS else None,
        "preload_libs": find_libs(epyc["host_stack"]["ld_preload_libs"], python) if runtime == "host" else {},
        "execstack": execstack_libs(python) if runtime == "host" else [],
        "port": free_port(args.port_start),
        "hf_token_set": bool(os.environ.get("HF_TOKEN")),
    }


def deferred_gather(args: argparse.Namespace, epyc: dict, image: str, python: str | None, home: str) -> dict:
    """Another host's (spec, capture, ssh) runtime, port, HF cache and libraries: assumed and listed, never probed
    here; its paths under its `home` (its host stack venv unless --python named one)."""
    runtime = "docker" if args.runtime == "auto" else args.runtime
    python = python or str(hoststack.default_venv(epyc["host_stack"], args.stock, home) / "bin" / "python")
    cache = {"path": f"{home}/.cache/huggingface/hub", "mount_subdir": "hub", "nfs": False, "fstype": None}
    cache["note"] = f"assumed: the host's HF cache is the default under its home {home} (deferred to the host)"
    return {
        "home": home,
        "runtime": runtime,
        "runtime_detail": {runtime: "assumed (deferred to the host)"},
        "python": python,
        "host_stack": {"import_error": "deferred"},
        "host_ok": runtime == "host",
        "image": image,
        "image_probe": {"local": False, "found": None},
        "hf_cache": cache,
        "preload_libs": {},
        "execstack": [],
        "port": epyc["serve"]["default_port"],
        "hf_token_set": False,
        "deferred": ["runtime", "image pull and its stack probe", "port", "HF cache", "LD_PRELOAD libraries"],
    }
