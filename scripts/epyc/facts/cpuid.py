"""Which CPU this is: vendor, EPYC generation, and the serving route it gets."""

from __future__ import annotations

import re

from epyc import bundle
from epyc.facts import hostfacts
from epyc.facts.hostfacts import HostFacts, merged_note, parse_cpuinfo

_MODEL_NUMBER = re.compile(r"\bEPYC\s+(?:Embedded\s+)?([0-9])([0-9A-Z])([0-9A-Z])([0-9])([A-Z]{0,2})\b")
VENDOR_NAMES = {"AuthenticAMD": "AMD", "GenuineIntel": "Intel", "HygonGenuine": "Hygon", "CentaurHauls": "Centaur"}


def this_cpu() -> dict | None:
    """parse_cpuinfo of this machine's /proc/cpuinfo, or None where it cannot be read."""
    try:
        return parse_cpuinfo(hostfacts.Sysroot(hostfacts.LOCAL_ROOT).read("proc/cpuinfo") or "")
    except ValueError:
        return None


def this_cpu_has(flag: str) -> bool:
    return flag in ((this_cpu() or {}).get("flags") or ())


def epyc_model_number(brand: str) -> str | None:
    """'AMD EPYC 9654 96-Core Processor' -> '9654'; 'AMD EPYC 4584PX ...' -> '4584PX'; masked -> None."""
    m = _MODEL_NUMBER.search(brand or "")
    return "".join(m.groups()) if m else None


def generation_from_model_number(number: str) -> str | None:
    """Model number -> generation name, by its series (the first digit) and generation (the last)."""
    series, second, last = number[0], number[1], number[3]
    if (series, last) == ("9", "4"):
        return "Bergamo" if second == "7" else "Genoa"  # 97x4 is Bergamo (Zen 4c)
    table = {
        ("7", "1"): "Naples",
        ("7", "2"): "Rome",
        ("7", "3"): "Milan",
        ("8", "4"): "Siena",
        ("9", "5"): "Turin",
        ("9", "6"): "Venice",
        ("4", "4"): "EPYC 4004",
        ("4", "5"): "EPYC 4005",
    }
    return table.get((series, last))


def classify_generation(brand: str, family: int | None, model: int | None, generations: list[dict]) -> dict:
    """Generation from the brand's model number, else from CPUID family/model (a cloud guest may mask its brand
    to 'AMD EPYC'), else unknown. Bergamo and Siena share a CPUID range: a CPUID-only answer names both."""
    number = epyc_model_number(brand)
    name = generation_from_model_number(number) if number else None
    matches: list[dict] = []
    if name:
        entries = [g for g in generations if g["name"] == name]
        dense = [g for g in entries if number[:4] in g.get("model_numbers", [])]
        matches = dense[:1] or [next(g for g in entries if not g.get("model_numbers"))]
    elif family is not None and model is not None:
        matches = [g for g in generations if any(f == family and lo <= model <= hi for f, lo, hi in g["cpuid"])]
    return {
        "epyc_generation": "/".join(dict.fromkeys(g["name"] for g in matches)) or "unknown",
        "zen_arch": "/".join(dict.fromkeys(g["zen_arch"] for g in matches)) or "unknown",
        "model_number": number,
        "generation_source": ("model_number" if name else "cpuid") if matches else "unknown",
        "entry": matches[0] if matches else None,
    }


def is_amd_epyc(vendor: str | None, brand: str, generation_source: str) -> bool:
    """An EPYC says so in its brand string; a masked AMD brand counts when CPUID names a part."""
    masked = generation_source == "cpuid" and not re.search(r"Ryzen|Threadripper|Athlon|Opteron", brand, re.I)
    return vendor == "AuthenticAMD" and ("EPYC" in brand.upper() or masked)


def vendor_name(vendor: str | None) -> str:
    """CPUID vendor id -> the name people use ('GenuineIntel' -> 'Intel'); unknown ids as they are."""
    return VENDOR_NAMES.get(vendor or "", vendor or "unknown vendor")


def _route(route: str, reason: str, fix: str | None = None) -> dict:
    return {"route": route, "reason": reason, "fix": fix}


def route_host(facts: dict, supported: list[str], stock: bool) -> dict:
    """SKILL.md's path on this CPU: zentorch | confirm | stock | stock_offer | stop; stock only when asked for."""
    cpu = f"{facts.get('cpu_model') or 'unknown CPU'} ({vendor_name(facts.get('vendor'))})"
    if stock:
        why = "stock vLLM CPU (no zentorch) on" if facts.get("is_amd_epyc") else "zentorch does not apply to"
        slower = "slower; verified on EPYC 7763 (Milan) with bfloat16"
        return _route("stock", f"{why} {cpu}: the stock vLLM CPU path ({slower}), at the user's explicit request")
    if not facts.get("is_amd_epyc"):
        return _route(
            "stop",
            f"not an AMD EPYC: {cpu}. This skill serves on AMD EPYC CPUs",
            "stop here; only if a human explicitly asks for unaccelerated stock vLLM on this CPU, take the stock path: the same steps with --stock (validate.py --stock). To serve on an EPYC host later, plan for it from here: SKILL.md's 'Another host' (detect.py --spec SKU ...)",
        )
    if not (facts.get("avx512") and facts.get("avx512_bf16")):
        return _route(
            "stock_offer",
            f"{cpu}: {facts.get('epyc_generation') or 'this generation'} has no AVX-512 BF16, so zentorch cannot run",
            "offer the stock vLLM CPU path (slower, verified on EPYC 7763); on the user's explicit OK use --stock",
        )
    if facts.get("epyc_generation") not in supported:
        return _route(
            "confirm",
            f"zentorch is not validated on {facts.get('epyc_generation') or 'this generation'} (validated: {', '.join(supported)})",
            "get the user's explicit OK to try zentorch, or offer the stock path (--stock)",
        )
    return _route("zentorch", f"{facts.get('epyc_generation')} ({facts.get('zen_arch')}): the validated zentorch path")


def report(f: HostFacts, epyc: dict) -> dict:
    cpu, topo = f.cpu, f.topology
    gen = classify_generation(cpu["brand"], cpu["family"], cpu["model"], epyc["generations"])
    flags = cpu["flags"]
    mem = f.memory(epyc["memory"]["sysfs_disagreement_tolerance"])
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
        "ram_total_gb": bundle.gb(f.mem_total_bytes),
        "ram_gb": bundle.gb(mem["usable_bytes"]),
        "ram_limit_gb": bundle.gb(f.memory_limit_bytes) if f.memory_limit_bytes else None,
        "node_ram_gb": {str(n): bundle.gb(b) for n, b in sorted(topo.node_mem_bytes.items())},
        "node_ram_consistent": mem["sysfs_consistent"],
        "allowed_cpus": hostfacts.format_cpulist(f.allowed_cpus),
        "cpu_quota": f.cpu_quota,
        "hypervisor": f.hypervisor,
        "home": f.home,
        "notes": mem["notes"] + merged_note(topo),
    }
    doc["route"] = route_host(doc, epyc["supported_generations"], stock=False)
    return doc
