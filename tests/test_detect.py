"""detect.py: generation from brand or CPUID, topology, memory truth, bad input, and the live host."""

import json
import os
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    LONG_NAME,
    REAL_DUMP,
    ROOT,
    _hostile_ssh,
    _run_measuring_memory,
    load_docs,
    plan_from,
    plan_from_4,
    run_script,
)
from epyc import bundle, jsonio
from epyc.errors import ScriptError
from epyc.facts import cpuid, hostfacts, hostspec

GENS = bundle.load_epyc()["generations"]


@pytest.mark.parametrize(
    "brand,family,model,gen,arch,source",
    [
        ("AMD EPYC 7601 32-Core Processor", 23, 1, "Naples", "Zen", "model_number"),
        ("AMD EPYC 7742 64-Core Processor", 23, 49, "Rome", "Zen2", "model_number"),
        ("AMD EPYC 7763 64-Core Processor", 25, 1, "Milan", "Zen3", "model_number"),
        ("AMD EPYC 7773X 64-Core Processor", 25, 1, "Milan", "Zen3", "model_number"),
        ("AMD EPYC 9654 96-Core Processor", 25, 17, "Genoa", "Zen4", "model_number"),
        ("AMD EPYC 9684X 96-Core Processor", 25, 17, "Genoa", "Zen4", "model_number"),
        ("AMD EPYC 9754 128-Core Processor", 25, 160, "Bergamo", "Zen4c", "model_number"),
        ("AMD EPYC 9734 112-Core Processor", 25, 160, "Bergamo", "Zen4c", "model_number"),
        ("AMD EPYC 8534P 64-Core Processor", 25, 160, "Siena", "Zen4c", "model_number"),
        ("AMD EPYC 9755 128-Core Processor", 26, 2, "Turin", "Zen5", "model_number"),
        ("AMD EPYC 9965 192-Core Processor", 26, 17, "Turin", "Zen5c", "model_number"),
        ("AMD EPYC 9B45 128-Core Processor", 26, 2, "Turin", "Zen5", "model_number"),
        ("AMD EPYC 9B14 96-Core Processor", 25, 17, "Genoa", "Zen4", "model_number"),
        ("AMD EPYC 4584PX 16-Core Processor", 25, 97, "EPYC 4004", "Zen4", "model_number"),
        ("AMD EPYC 4565P 16-Core Processor", 26, 68, "EPYC 4005", "Zen5", "model_number"),
        ("AMD EPYC 9966 Processor", None, None, "Venice", "Zen6", "model_number"),
        # masked brands: CPUID decides
        ("AMD EPYC", 25, 17, "Genoa", "Zen4", "cpuid"),
        ("AMD EPYC", 26, 2, "Turin", "Zen5", "cpuid"),
        ("AMD EPYC", 26, 17, "Turin", "Zen5c", "cpuid"),
        ("AMD EPYC", 23, 49, "Rome", "Zen2", "cpuid"),
        ("AMD EPYC", 25, 1, "Milan", "Zen3", "cpuid"),
        ("AMD EPYC", 25, 0xA5, "Bergamo/Siena", "Zen4c", "cpuid"),
        ("AMD EPYC", 26, 68, "EPYC 4005", "Zen5", "cpuid"),
        ("AMD EPYC", 25, 0x30, "unknown", "unknown", "unknown"),
    ],
)
def test_classify_generation(brand, family, model, gen, arch, source):
    out = cpuid.classify_generation(brand, family, model, GENS)
    assert (out["epyc_generation"], out["zen_arch"], out["generation_source"]) == (gen, arch, source)


def test_masked_amd_brand_counts_as_epyc_only_with_cpuid_match():
    assert cpuid.is_amd_epyc("AuthenticAMD", "AMD EPYC", "unknown")
    assert cpuid.is_amd_epyc("AuthenticAMD", "AMD Eng Sample", "cpuid")
    assert not cpuid.is_amd_epyc("AuthenticAMD", "AMD Ryzen 9 7950X", "cpuid")
    assert not cpuid.is_amd_epyc("GenuineIntel", "Intel(R) Xeon(R) EPYC-lookalike", "model_number")


def test_cgroup_dirs_v1_and_v2():
    dirs = hostfacts.cgroup_dirs("4:memory:/process_api/abc\n3:cpuset:/\n0::/user.slice/x\n")
    assert dirs["memory"][0] == "/sys/fs/cgroup/user.slice/x/memory.max"
    assert "/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes" in dirs["memory"]
    assert dirs["cpuset"][0] == "/sys/fs/cgroup/user.slice/x/cpuset.cpus.effective"


@pytest.mark.parametrize(
    "text,expected",
    [("max\n", None), ("9223372036854771712", None), (str(64 * 2**30), 64 * 2**30), ("junk", None), (None, None)],
)
def test_parse_cgroup_limit(text, expected):
    assert hostfacts.parse_cgroup_limit(text) == expected


# ---- whole hosts, through the CLI, from sysroots


def test_runner_sysroot_masked_brand_and_sysfs_disagreement(script, make_sysroot):
    r = script("detect.py", "--sysroot", str(make_sysroot("runner")))
    d = r.doc
    assert r.code == 0
    assert (d["cpu_model"], d["cpu_family"], d["cpu_model_number"]) == ("AMD EPYC", 26, 2)
    assert (d["epyc_generation"], d["zen_arch"], d["generation_source"]) == ("Turin", "Zen5", "cpuid")
    assert d["is_amd_epyc"] and d["is_supported_epyc"] and d["avx512"] and d["avx512_bf16"]
    assert (d["logical_cores"], d["physical_cores"], d["socket_count"], d["numa_node_count"]) == (2, 2, 1, 1)
    assert d["ram_gb"] == 24.0 and d["node_ram_gb"] == {"0": 8.0}
    assert d["node_ram_consistent"] is False and "sysfs" in d["notes"][0]


def test_masked_genoa_is_supported_from_cpuid(script, make_sysroot):
    d = script("detect.py", "--sysroot", str(make_sysroot("masked_genoa"))).doc
    assert (d["epyc_generation"], d["zen_arch"], d["generation_source"], d["is_supported_epyc"]) == (
        "Genoa",
        "Zen4",
        "cpuid",
        True,
    )


@pytest.mark.parametrize(
    "host,gen,supported,avx512,logical,physical,sockets,tpc,nodes",
    [
        ("genoa_9654_2s_smt", "Genoa", True, True, 384, 192, 2, 2, 2),
        ("turin_9755_2s_nps4", "Turin", True, True, 256, 256, 2, 1, 8),
        ("milan_7763", "Milan", False, False, 256, 128, 2, 2, 2),
        ("bergamo_9754", "Bergamo", False, True, 256, 128, 1, 2, 1),
        ("epyc_4584px", "EPYC 4004", False, True, 32, 16, 1, 2, 1),
    ],
)
def test_epyc_hosts(script, make_sysroot, host, gen, supported, avx512, logical, physical, sockets, tpc, nodes):
    d = script("detect.py", "--sysroot", str(make_sysroot(host))).doc
    assert d["is_amd_epyc"] and d["epyc_generation"] == gen and d["generation_source"] == "model_number"
    assert d["is_supported_epyc"] is supported and d["avx512"] is avx512 and d["avx512_bf16"] is avx512
    assert (
        d["logical_cores"],
        d["physical_cores"],
        d["socket_count"],
        d["threads_per_core"],
        d["numa_node_count"],
    ) == (logical, physical, sockets, tpc, nodes)
    assert d["node_ram_consistent"] is True and d["notes"] == []


def test_intel_host_reports_amx_and_is_not_epyc(script, make_sysroot):
    d = script("detect.py", "--sysroot", str(make_sysroot("xeon_8480"))).doc
    assert d["vendor"] == "GenuineIntel" and d["amx"] is True
    assert d["is_amd_epyc"] is False and d["epyc_generation"] is None and d["is_supported_epyc"] is False


def test_cgroup_limits_cpus_and_memory(script, make_sysroot):
    d = script("detect.py", "--sysroot", str(make_sysroot("genoa_cgroup_part"))).doc
    assert d["allowed_cpus"] == "100-119,292-311"
    assert d["ram_limit_gb"] == 64.0 and d["ram_gb"] == 64.0 and d["ram_total_gb"] == 768.0


# ---- bad input


def test_missing_sysroot(script, tmp_path):
    r = script("detect.py", "--sysroot", str(tmp_path / "nope"))
    assert r.code == 1 and "not a directory" in r.doc["error"]


def test_sysroot_without_cpuinfo(script, tmp_path):
    r = script("detect.py", "--sysroot", str(tmp_path))
    assert r.code == 1 and "cpuinfo" in r.doc["error"]


@pytest.mark.parametrize(
    "rel,text,needle",
    [
        ("proc/cpuinfo", "garbage without colons\n", "cpuinfo"),
        ("proc/meminfo", "MemTotal: lots\n", "MemTotal"),
        ("sys/devices/system/cpu/online", "0-x\n", "malformed"),
        ("sys/devices/system/node/node0/cpulist", "9-1\n", "malformed"),
        ("proc/self/status", "Cpus_allowed_list:\t1-0\n", "malformed"),
    ],
)
def test_malformed_files_give_json_errors(script, make_sysroot, rel, text, needle):
    root = make_sysroot("runner")
    (root / rel).write_text(text)
    r = script("detect.py", "--sysroot", str(root))
    assert r.code == 1 and needle in r.doc["error"]


def test_unreadable_file_is_treated_as_absent(script, make_sysroot):
    root = make_sysroot("runner")
    (root / "sys/devices/system/node/node0/meminfo").unlink()
    (root / "sys/devices/system/node/node0/meminfo").mkdir()  # reading a folder fails like EACCES
    d = script("detect.py", "--sysroot", str(root)).doc
    assert d["node_ram_gb"] == {} and d["ram_gb"] == 24.0


def test_unreachable_ssh_host(script):
    r = script("detect.py", "--host", "root@127.0.0.1:1", env={"EPYC_SKILL_SSH_OPTS": "-o ConnectTimeout=3"})
    assert r.code == 1 and "ssh" in r.doc["error"] and r.doc["host"] == "root@127.0.0.1:1"


def test_sysroot_and_host_are_exclusive(script, tmp_path):
    r = script("detect.py", "--sysroot", str(tmp_path), "--host", "box")
    assert r.code == 1


def test_a_dump_never_writes_outside_its_folder(tmp_path):
    root = tmp_path / "a" / "root"  # an escape lands in this test's own tmp_path, never in a shared folder
    root.mkdir(parents=True)
    hostspec.read_dump("@@EPYC-SKILL-FILE@@ /proc/cpuinfo\nok\n", root, "box")
    assert (root / "proc/cpuinfo").read_text() == "ok\n"
    for bad in ("/../../etc/evil", "relative/path", "/proc/a\0b"):
        with pytest.raises(ScriptError, match="not a plain captured file|not an absolute path"):
            hostspec.read_dump(f"@@EPYC-SKILL-FILE@@ {bad}\nx\n", root, "box")
    assert not (tmp_path / "etc/evil").exists()


# ---- the live host (this EPYC runner in CI)


def test_live_host_matches_proc_cpuinfo(script):
    d = script("detect.py").doc
    cpu = hostfacts.parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    assert d["cpu_family"] == cpu["family"] and d["cpu_model_number"] == cpu["model"]
    assert d["avx512"] == ("avx512f" in cpu["flags"])
    expect = cpuid.classify_generation(cpu["brand"], cpu["family"], cpu["model"], GENS)
    if d["is_amd_epyc"]:
        assert d["epyc_generation"] == expect["epyc_generation"]
    assert d["logical_cores"] >= d["physical_cores"] >= 1
    assert set(hostfacts.parse_cpulist(d["allowed_cpus"])) <= set(range(d["logical_cores"] * 8))


def test_a_host_described_by_sku_plans_like_a_real_one(script, tmp_path):
    """'A dual-socket EPYC 9654, 384 GiB per socket, NPS1' -- no hand-made sysroot: detect renders it,
    cpu_tune plans on it, and the plan's cpuset and binding follow the stated topology."""
    root = tmp_path / "s9654"
    d = script(
        "detect.py", "--spec", "9654", "--sockets", "2", "--ram-gb-per-socket", "384", "--save-sysroot", str(root)
    )
    assert d.code == 0 and d.doc["target"] == "spec:EPYC 9654 2S NPS1 SMT on"
    assert (d.doc["epyc_generation"], d.doc["physical_cores"], d.doc["logical_cores"]) == ("Genoa", 192, 384)
    assert (d.doc["socket_count"], d.doc["numa_node_count"], d.doc["ram_gb"]) == (2, 2, 768.0)
    assert d.doc["route"]["route"] == "zentorch" and d.doc["spec"]["sku"]["l3_mb"] == 384
    assert "amd.com" in d.doc["spec"]["source"] and any("numbering" in a for a in d.doc["spec"]["assumptions"])
    t = script("cpu_tune.py", "--sysroot", str(root), "--socket", "1", "--weight-gb", "1.11", "--kv-needed-gb", "0.44")
    assert t.code == 0 and t.doc["vllm_cpu_omp_threads_bind"] == "96-191"
    assert t.doc["container_cpuset"] == "--cpuset-cpus=96-191,288-383 --cpuset-mems=1"
    assert t.doc["socket_ram_gb"] == 384.0 and t.doc["kv_granted_gb"] == 190  # serving: 434 full 4k requests
    nps4 = script("detect.py", "--spec", "EPYC 9754", "--ram-gb-per-socket", "768", "--nps", "4", "--smt", "off").doc
    assert (nps4["epyc_generation"], nps4["numa_node_count"], nps4["logical_cores"]) == ("Bergamo", 4, 128)
    assert nps4["route"]["route"] == "confirm"


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--spec", "9999"], "names no EPYC part or generation"),
        (["--spec", "9654"], "--ram-gb-per-socket"),
        (["--spec", "9654", "--ram-gb-per-socket", "384", "--sysroot", "/x"], "without --sysroot"),
        (["--spec", "9654", "--ram-gb-per-socket", "-1"], "out of range"),
    ],
)
def test_bad_specs(script, args, needle):
    r = script("detect.py", *args)
    assert r.code == 1 and needle in r.doc["error"] + r.doc["fix"]


def test_capture_round_trip_gives_the_same_facts_as_live(script, tmp_path):
    """On the host: detect.py --capture FILE (standard library only); anywhere: --sysroot FILE reads
    the same facts detect and cpu_tune read live, and the login's home, where a plan for it puts its paths."""
    archive = tmp_path / "host.txt"
    c = script("detect.py", "--capture", str(archive), env={"HOME": "/home/alice"})
    assert c.code == 0 and c.doc["files"] > 5 and archive.exists()
    live = script("detect.py").doc
    captured = script("detect.py", "--sysroot", str(archive)).doc
    assert captured["target"] == f"capture:{archive}" and captured["home"] == "/home/alice" and live["home"] is None
    same = {k: v for k, v in live.items() if k not in ("target", "home")}
    assert {k: captured[k] for k in same} == same
    t_live = script("cpu_tune.py").doc
    t_cap = script("cpu_tune.py", "--sysroot", str(archive)).doc
    for k in ("vllm_cpu_omp_threads_bind", "container_cpuset", "socket_ram_gb", "kv_granted_gb", "numa_nodes"):
        assert t_cap[k] == t_live[k], k


def test_a_capture_never_writes_outside_its_folder(script, tmp_path):
    evil = tmp_path / "evil.txt"
    evil.write_text("@@EPYC-SKILL-FILE@@ /../../escape.txt\nx\n")
    r = script("detect.py", "--sysroot", str(evil))
    assert r.code == 1 and "not a plain captured file" in r.doc["error"]
    assert not (tmp_path.parent / "escape.txt").exists()


def test_the_stock_route_names_the_cpu_it_was_asked_for():
    """An explicit stock request on a CPU zentorch does not serve says which CPU, and why; unknown fields
    still give a sentence (mutation survivors of route_host)."""
    gens = bundle.load_epyc()["supported_generations"]
    intel = {"cpu_model": "Intel(R) Xeon(R) Platinum 8581C", "vendor": "GenuineIntel", "is_amd_epyc": False}
    r = cpuid.route_host(intel, gens, stock=True)
    assert r["route"] == "stock" and r["reason"].startswith(
        "zentorch does not apply to Intel(R) Xeon(R) Platinum 8581C"
    )
    r = cpuid.route_host({"is_amd_epyc": False}, gens, stock=False)
    assert r["route"] == "stop" and "unknown CPU" in r["reason"] and r["fix"].startswith("stop here")


VALIDATED = ["Genoa", "Turin"]
MILAN = {
    "cpu_model": "AMD EPYC 7763 64-Core Processor",
    "vendor": "AuthenticAMD",
    "is_amd_epyc": True,
    "avx512": False,
    "avx512_bf16": False,
    "epyc_generation": "Milan",
    "zen_arch": "Zen3",
}
BERGAMO = {
    **MILAN,
    "cpu_model": "AMD EPYC 9754",
    "avx512": True,
    "avx512_bf16": True,
    "epyc_generation": "Bergamo",
    "zen_arch": "Zen4c",
}
GENOA = {**BERGAMO, "cpu_model": "AMD EPYC", "epyc_generation": "Genoa", "zen_arch": "Zen4"}
XEON = {"cpu_model": "Intel(R) Xeon(R) Platinum 8480+", "vendor": "GenuineIntel", "is_amd_epyc": False}


@pytest.mark.parametrize(
    "facts,stock,route,reason,fix",
    [
        (GENOA, False, "zentorch", "Genoa (Zen4): the validated zentorch path", None),
        (
            BERGAMO,
            False,
            "confirm",
            "zentorch is not validated on Bergamo (validated: Genoa, Turin)",
            "get the user's explicit OK to try zentorch, or offer the stock path (--stock)",
        ),
        (
            MILAN,
            False,
            "stock_offer",
            "AMD EPYC 7763 64-Core Processor (AMD): Milan has no AVX-512 BF16, so zentorch cannot run",
            "offer the stock vLLM CPU path (slower, verified on EPYC 7763); on the user's explicit OK use --stock",
        ),
        (
            XEON,
            False,
            "stop",
            "not an AMD EPYC: Intel(R) Xeon(R) Platinum 8480+ (Intel). This skill serves on AMD EPYC CPUs",
            "stop here; only if a human explicitly asks for unaccelerated stock vLLM on this CPU, take the stock "
            "path: the same steps with --stock (validate.py --stock). To serve on an EPYC host later, plan for it "
            "from here: SKILL.md's 'Another host' (detect.py --spec SKU ...)",
        ),
        (
            XEON,
            True,
            "stock",
            "zentorch does not apply to Intel(R) Xeon(R) Platinum 8480+ (Intel): the stock vLLM CPU "
            "path (slower; verified on EPYC 7763 (Milan) with bfloat16), at the user's explicit request",
            None,
        ),
        (
            MILAN,
            True,
            "stock",
            "stock vLLM CPU (no zentorch) on AMD EPYC 7763 64-Core Processor (AMD): the stock vLLM CPU "
            "path (slower; verified on EPYC 7763 (Milan) with bfloat16), at the user's explicit request",
            None,
        ),
    ],
)
def test_each_route_says_what_to_do_in_words(facts, stock, route, reason, fix):
    """The route is what SKILL.md's agent reads aloud: the sentence and the next step, exactly."""
    assert cpuid.route_host(facts, VALIDATED, stock) == {"route": route, "reason": reason, "fix": fix}


def test_the_cpu_facts_a_plan_is_built_on(script, make_sysroot):
    """AMX only with the AMX flags (Genoa has none), the SKU's series from the generation table, and an AMD
    EPYC whose CPUID is in no table still gets a report (generation unknown), not an internal error."""
    genoa = script("detect.py", "--sysroot", str(make_sysroot("genoa_9654_2s_smt"))).doc
    assert (genoa["amx"], genoa["avx512_bf16"], genoa["epyc_series"]) == (False, True, "9004")
    odd = script("detect.py", "--sysroot", str(make_sysroot("runner", family=25, model=0x30))).doc
    assert odd["is_amd_epyc"] and odd["epyc_generation"] == "unknown" and odd["epyc_series"] is None


def test_cpus_are_listed_from_sysfs_when_the_online_file_is_missing(script, make_sysroot):
    root = make_sysroot("genoa_9654_2s_smt")
    (root / "sys" / "devices" / "system" / "cpu" / "online").unlink()
    d = script("detect.py", "--sysroot", str(root)).doc
    assert (d["logical_cores"], d["physical_cores"], d["socket_count"]) == (384, 192, 2)


def test_a_cgroup_v1_memory_limit_caps_the_ram(script, make_sysroot):
    root = make_sysroot(
        "runner",
        extra={
            "proc/self/cgroup": "5:memory:/pod1\n",
            "sys/fs/cgroup/memory/pod1/memory.limit_in_bytes": str(6 * 2**30) + "\n",
        },
    )
    d = script("detect.py", "--sysroot", str(root)).doc
    assert d["ram_limit_gb"] == 6.0 and d["ram_gb"] == 6.0


def _tree(root, files: dict):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return hostfacts.Sysroot(str(root))


def test_topology_without_numa_or_package_ids_is_one_socket_one_node(tmp_path):
    """A kernel without NUMA (no node dirs) and a hypervisor hiding physical_package_id (or writing -1):
    every CPU is socket 0 and node 0 -- not socket 1, not a node that does not exist."""
    from epyc.facts import hostfacts

    base = "sys/devices/system/cpu"
    sr = _tree(
        tmp_path,
        {
            f"{base}/online": "0-3",
            f"{base}/cpu1/topology/physical_package_id": "-1",
            f"{base}/cpu2/topology/physical_package_id": "x",
            f"{base}/cpu3/topology/physical_package_id": "0",
            f"{base}/cpu3/topology/core_id": "7",
        },
    )
    topo = hostfacts.read_topology(sr)
    assert topo.package == {0: 0, 1: 0, 2: 0, 3: 0} and topo.core == {0: 0, 1: 1, 2: 2, 3: 7}
    assert topo.node_cpus == {0: [0, 1, 2, 3]} and topo.node_of_cpu == {0: 0, 1: 0, 2: 0, 3: 0}


def test_a_cgroup_quota_without_a_period_uses_the_kernels_default():
    from epyc.facts import hostfacts

    assert hostfacts.parse_cpu_quota("150000") == 1.5  # cpu.max with the period left out: 100000
    assert hostfacts.parse_cpu_quota(None, "250000", None) == 2.5  # v1 without cfs_period_us
    assert hostfacts.parse_cpu_quota("max 100000") is None and hostfacts.parse_cpu_quota("200000 50000") == 4.0


def test_cpuinfo_numbers_are_ascii_and_a_brand_is_as_long_as_a_cpus(script, make_sysroot):
    root = make_sysroot("masked_genoa")
    cpuinfo = root / "proc" / "cpuinfo"
    text = cpuinfo.read_text()
    cpuinfo.write_text(text.replace("cpu family\t: 25", "cpu family\t: \u0662\u0665"))  # Arabic-Indic 25
    r = script("detect.py", "--sysroot", str(root))
    assert r.code == 0 and r.doc["cpu_family"] is None and r.doc["epyc_generation"] != "Genoa", r.doc
    cpuinfo.write_text(text.replace("model name\t: AMD EPYC", "model name\t: AMD EPYC " + "a." * 30_000))
    r = script("detect.py", "--sysroot", str(root))
    assert r.code == 1 and "model name of 60,009 characters" in r.doc["error"], r.doc
    cpuinfo.write_text(text.replace("model name\t: AMD EPYC", "model name\t: AMD EPYC " + "x" * 200))
    assert script("detect.py", "--sysroot", str(root)).code == 0  # long, but a hypervisor may say so


@pytest.mark.parametrize(
    "extra,needle",
    [
        ("@@EPYC-SKILL-FILE@@ /\nx", "is not a plain captured file"),
        ("@@EPYC-SKILL-FILE@@ /proc/cpuinfo/inner\nx", "is not a plain captured file"),  # no file it reads
        (  # a file and a folder at once
            "@@EPYC-SKILL-FILE@@ /sys/fs/cgroup/cpu.max\n1\n@@EPYC-SKILL-FILE@@ /sys/fs/cgroup/cpu.max/a/cpu.max\nx",
            "Not a directory",
        ),
        ("@@EPYC-SKILL-FILE@@ /sys/fs/cgroup/" + "a/" * 40 + "cpu.max\nx", "is not a plain captured file"),
        ("@@EPYC-SKILL-FILE@@ /proc/a\x00b\nx", "is not a plain captured file"),
        ("@@EPYC-SKILL-FILE@@ /proc/" + "a" * 300 + "\nx", "is not a plain captured file"),
        ("@@EPYC-SKILL-FILE@@ proc/relative\nx", "is not an absolute path"),
    ],
)
@pytest.mark.parametrize("tool", ["detect.py", "cpu_tune.py"])
def test_a_hosts_ssh_answer_is_checked_as_a_capture_is(script, tmp_path, tool, extra, needle):
    env = _hostile_ssh(tmp_path, f"{REAL_DUMP}\nprint({extra!r})")
    r = script(tool, "--host", "root@box", env=env)
    assert r.code == 1 and "over ssh" in r.doc["error"] and needle in r.doc["error"], r.doc


@pytest.mark.parametrize(
    "home,seen", [("/home/alice", "/home/alice"), ("/x; rm -rf /", None), ("/home/../etc", None), ("", None)]
)
def test_a_hosts_home_is_taken_over_ssh_only_as_a_plain_path(script, tmp_path, home, seen):
    """Issue 52: the login's $HOME is where a plan for that host puts its paths; it is the host's text, so
    anything but a plain absolute path (a shell word, a '..') is dropped, and the plan assumes root's."""
    dump = f"['sh', '-c', {hostspec.DUMP_SCRIPT!r}], env={{'HOME': {home!r}}}, timeout=60"  # this machine's files
    env = _hostile_ssh(tmp_path, f"import subprocess\nsubprocess.run({dump})")
    r = script("detect.py", "--host", "alice@box", env=env)
    assert r.code == 0 and r.doc["home"] == seen, r.doc


def test_a_host_that_prints_without_end_fills_no_memory(script, tmp_path):
    env = _hostile_ssh(tmp_path, f"{REAL_DUMP}\nblock = 'x' * (1 << 20)\nwhile True:\n    sys.stdout.write(block)")
    t0 = time.monotonic()
    r = script("detect.py", "--host", "root@box", env=env, timeout=120)
    assert r.code == 1 and "printed more than" in r.doc["error"] and time.monotonic() - t0 < 60, r.doc


@pytest.mark.parametrize("opts", ["'unclosed", '-o ProxyCommand="x', "trailing\\"])
def test_ssh_options_that_are_not_shell_words_are_a_clear_error(script, opts):
    r = script("detect.py", "--host", "root@box", env={"EPYC_SKILL_SSH_OPTS": opts})
    assert r.code == 1 and "EPYC_SKILL_SSH_OPTS is not shell words" in r.doc["error"], r.doc


def test_a_single_socket_part_is_not_planned_on_two_sockets(script):
    r = script("detect.py", "--spec", "9654P", "--sockets", "2", "--ram-gb-per-socket", "384")
    assert r.code == 1 and "single-socket part" in r.doc["error"] and "--sockets 1" in r.doc["fix"], r.doc
    assert script("detect.py", "--spec", "9654", "--sockets", "2", "--ram-gb-per-socket", "384").code == 0


def test_a_host_answer_of_short_lines_costs_no_more_than_its_size(tmp_path):

    env = _hostile_ssh(
        tmp_path, f"{REAL_DUMP}\nprint('@@EPYC-SKILL-FILE@@ /proc/big')\nsys.stdout.write('xy\\n' * (12 << 20))"
    )  # 36 MiB of 3-byte lines
    code, doc, max_rss_kb = _run_measuring_memory("detect.py", "--host", "root@box", env=env)
    assert code == 1 and "printed more than 16,777,216 bytes" in doc["error"], doc
    assert max_rss_kb < 400_000, f"{max_rss_kb} KB for a 36 MiB answer (a list of its lines took ~1 GB)"


def test_a_memory_figure_no_machine_runs_on_is_named_at_its_source(script, tmp_path):
    """F7: `--ram-gb-per-socket 0.001` (inside the flag's range then) and a cgroup memory.max of 4096 bytes
    ended in "detect.py read facts it cannot describe: field ram_gb: 0.0 ...", a fix about model files. The
    flag's range is a socket's (1 GiB and up); the cgroup figure is named where it comes from."""
    import dataclasses

    from sysroots import HOSTS, build

    r = script("detect.py", "--spec", "9654", "--ram-gb-per-socket", "0.001")
    assert r.code == 1 and "--ram-gb-per-socket: 0.001 is out of range (expected from 1 to 65536)" in r.doc["error"]
    build(tmp_path / "sr", dataclasses.replace(HOSTS["genoa_9654_2s_smt"], cgroup_memory_max="4096"))
    r = script("detect.py", "--sysroot", str(tmp_path / "sr"))
    assert r.code == 1 and r.doc["error"].startswith("usable RAM reads 4,096 bytes (the cgroup memory limit)")
    assert "memory.max" in r.doc["fix"] and "field ram_gb" not in r.doc["error"]


def test_a_cpu_two_nodes_list_is_refused(script, tmp_path):
    """F8: node1 claiming CPUs node0 lists made the later node win, and the plan bound memory to it."""
    from sysroots import HOSTS, build

    root = build(tmp_path / "sr", HOSTS["genoa_9654_2s_smt"])
    (root / "sys/devices/system/node/node1/cpulist").write_text("0-15\n")
    for name in ("detect.py", "cpu_tune.py"):
        r = script(name, "--sysroot", str(root))
        assert r.code == 1 and r.doc["error"].startswith("CPU 0 is listed by NUMA nodes 0 and 1"), r.doc
        assert "re-capture" in r.doc["fix"]


def test_capture_runs_with_the_standard_library_alone(tmp_path):
    """F4: SKILL.md sends `detect.py --capture` to the host to plan for, "standard library only". It wrote the
    archive, then exit 1 "missing Python package 'jsonschema'": the receipt was checked as detect's facts.
    The bundle is copied without its venv and run with no site-packages (-S), as on a bare server."""
    import shutil
    import subprocess
    import sys

    from conftest import ROOT

    bundle = tmp_path / "bundle"
    for part in ("scripts", "data"):
        shutil.copytree(ROOT / part, bundle / part)
    archive = tmp_path / "host.txt"
    res = subprocess.run(
        [sys.executable, "-I", "-S", str(bundle / "scripts" / "detect.py"), "--capture", str(archive)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout) == {"ok": True, "capture": str(archive), "files": json.loads(res.stdout)["files"]}
    probe = subprocess.run([sys.executable, "-I", "-S", "-c", "import jsonschema"], capture_output=True, timeout=60)
    assert probe.returncode != 0  # the run above really had no jsonschema
    assert archive.stat().st_size > 0


def test_a_sysroot_file_that_is_no_capture_says_so(script, tmp_path):
    (tmp_path / "some.json").write_text("{}")
    r = script("detect.py", "--sysroot", str(tmp_path / "some.json"))
    assert r.code == 1 and "holds no captured file" in r.doc["error"], r.doc
    assert "\n" not in r.doc["error"] and "detect.py --capture" in r.doc["fix"]


# ---- F6: hangs
def test_a_fifo_as_the_capture_does_not_hang(script, tmp_path):
    os.mkfifo(tmp_path / "capture")
    r = script("detect.py", "--capture", str(tmp_path / "capture"), timeout=30)
    assert r.code == 1 and "not a regular file" in r.doc["error"]


def test_save_sysroot_writes_only_into_a_new_or_empty_folder(script, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "proc").symlink_to(tmp_path)
    r = script("detect.py", "--spec", "9654", "--ram-gb-per-socket", "384", "--save-sysroot", str(tmp_path / "full"))
    assert r.code == 1 and "not empty" in r.doc["error"]


def test_the_summary_says_what_a_host_server_takes_from_the_shell(inputs):
    docs = load_docs(inputs)
    docs["validate"].update(
        path="host", runtime="host", image=None, python=sys.executable, ld_preload={"value": None, "note": None}
    )
    plan = plan_from(docs)
    env_row = dict(plan["summary"])["Environment"]
    assert "PYTHONUNBUFFERED=1" in env_row and plan["env"]["PYTHONUNBUFFERED"] == "1"
    assert env_row.endswith(
        "; from this shell only PATH, HOME, USER, LOGNAME, LANG, LANGUAGE, TZ, TMPDIR, HF_HOME, "
        "HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, XDG_CACHE_HOME, HF_ENDPOINT, HF_HUB_ETAG_TIMEOUT, HF_HUB_DOWNLOAD_TIMEOUT, "
        "SSL_CERT_FILE, SSL_CERT_DIR, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, LC_* and the proxy "
        "variables"
    )


# ---- F11, F12, F15: flags that would be ignored, numbers that overflow, dubious values
@pytest.mark.parametrize("args", [["--host", "box.example"], ["--sysroot", "/tmp"], ["--spec", "9654"], ["--nps", "4"]])
def test_capture_takes_no_other_target(script, tmp_path, args):
    r = script("detect.py", "--capture", str(tmp_path / "c.txt"), *args)
    assert r.code == 1 and "would be ignored" in r.doc["error"] and not (tmp_path / "c.txt").exists()


def test_an_empty_value_after_an_equals_sign_is_not_this_host(script):
    r = script("detect.py", "--host=--")
    assert r.code == 1 and "expected one value" in r.doc["error"]


# ---- A1, A2, A3: internal errors on a long name, a huge index size, a 5000-digit number
@pytest.mark.parametrize("name", ["detect.py", "cpu_tune.py"])
def test_a_sysroot_name_too_long_is_a_clear_error(script, name):
    r = script(name, "--sysroot", LONG_NAME)
    assert r.code == 1 and "is not a directory" in r.doc["error"] and "sysroot" in r.doc["error"]


# ---- lower severity: silent accepts
def test_nps_takes_plain_digits_only(script):
    r = script("detect.py", "--spec", "9654", "--ram-gb-per-socket", "64", "--nps", "٤")
    assert r.code == 1 and "--nps" in r.doc["error"]
    assert script("detect.py", "--spec", "9654", "--ram-gb-per-socket", "64", "--nps", "4").code == 0


def test_capture_to_dash_writes_no_file_named_dash(script, tmp_path):
    r = script("detect.py", "--capture", "-")
    assert r.code == 1 and "stdout" in r.doc["error"]
    assert not (Path(__file__).resolve().parents[1] / "-").exists()


def test_a_capture_is_refused_at_a_file_larger_than_any_capture(script, tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("@@EPYC-SKILL-FILE@@ /proc/cpuinfo\n" + "x" * (hostfacts.SYS_FILE_LIMIT + 1) + "\n")
    r = script("detect.py", "--sysroot", str(big))
    assert r.code == 1 and "over the 16,777,216 this bundle reads" in r.doc["error"], r.doc
    with pytest.raises(ScriptError, match="larger than any detect.py --capture"):
        hostspec.read_dump("@@EPYC-SKILL-FILE@@ /proc/cpuinfo\n" + "x" * (hostfacts.SYS_FILE_LIMIT + 1), tmp_path, "x")


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("chosen_socket", 10**9, "chosen_socket"),
        ("numa_nodes", [-1], "numa_nodes"),
        ("omp_threads", 10**12, "omp_threads"),
        ("vllm_cpu_omp_threads_bind", "0--,,", "vllm_cpu_omp_threads_bind"),
        ("vllm_cpu_omp_threads_bind", "9" * 20, "vllm_cpu_omp_threads_bind"),
        ("kv_granted_gb", 65536, "on a socket of"),
        ("host_pin_argv", ["numactl", "--cpunodebind=0", "--membind=99999"], "host_pin_argv"),
    ],
)
def test_cpu_tune_numbers_no_host_has_never_reach_the_plan(inputs, field, value, needle):
    docs = load_docs(inputs)
    docs["cpu_tune"][field] = value
    with pytest.raises(ScriptError, match=needle):
        jsonio.check_schema(docs["cpu_tune"], "cpu_tune", "cpu_tune", "x")
        plan_from_4(docs)


# ---- F1: a plan of another host, checked by validate.py on this one
def test_a_plan_for_another_host_needs_validate_from_that_host(inputs):
    docs = load_docs(inputs)
    spec = "spec:EPYC 9124 (1 socket, 64 GiB a socket)"
    docs["detect"]["target"] = docs["cpu_tune"]["target"] = spec  # detect and cpu_tune agree; validate ran here
    with pytest.raises(ScriptError, match="validate.py checked sysroot:"):
        plan_from(docs)
    docs["detect"]["target"] = docs["cpu_tune"]["target"] = "localhost"  # the tree of another host, validated here
    with pytest.raises(ScriptError, match="detect.py read localhost, validate.py checked sysroot:"):
        plan_from(docs)


# ---- F6, F11: sysfs numbers no machine has
def test_cpu_ids_past_linux_limit_are_refused_not_counted(script, make_sysroot):
    root = make_sysroot("genoa_9654_2s_smt")
    (root / "sys/devices/system/cpu/online").write_text(",".join(f"{i * 70000}-{i * 70000 + 65535}" for i in range(30)))
    t0 = time.monotonic()
    r = script("detect.py", "--sysroot", str(root), timeout=60)
    assert r.code == 1 and "Linux numbers CPUs 0-8191" in r.doc["error"] and time.monotonic() - t0 < 20
    with pytest.raises(ValueError, match="0-8191"):
        hostfacts.parse_cpulist("8192")
    assert hostfacts.parse_cpulist("8190-8191") == [8190, 8191]


def test_a_socket_id_or_quota_past_the_schema_never_leaves_detect(script, make_sysroot):
    root = make_sysroot("genoa_9654_2s_smt")
    (root / "sys/devices/system/cpu/cpu0/topology/physical_package_id").write_text("5000\n")
    r = script("detect.py", "--sysroot", str(root))
    assert r.code == 1 and "physical_package_id is 5000, past 1023" in r.doc["error"]
    from epyc.facts import hostfacts

    assert hostfacts.parse_cpu_quota("1 1000000") == 0.01 and hostfacts.parse_cpu_quota("400000 100000") == 4.0
    assert hostfacts.parse_cpu_quota("\u0664\u0660\u0660\u0660\u0660\u0660 100000") is None  # Arabic-Indic digits


def test_detect_names_a_tree_however_it_was_spelled(script, make_sysroot):
    root = make_sysroot("genoa_9654_2s_smt")
    a = script("detect.py", "--sysroot", os.path.relpath(root, bundle.ROOT)).doc["target"]  # scripts run in ROOT
    b = script("detect.py", "--sysroot", str(root) + "/").doc["target"]
    assert a == b == f"sysroot:{os.path.realpath(root)}"


def test_output_paths_are_checked_before_any_work(script, tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    for args, needle in (
        (["--capture", str(tmp_path / "adir")], "not a regular file"),
        (["--spec", "9654", "--ram-gb-per-socket", "64", "--save-sysroot", str(tmp_path / "afile")], "not a folder"),
    ):
        r = script("detect.py", *args)
        assert r.code == 1 and needle in r.doc["error"], r.doc


def test_a_spec_leaves_no_temporary_tree_behind(script, tmp_path):
    before = set(Path("/tmp").glob("epyc-spec-*"))
    assert script("detect.py", "--spec", "9654", "--sockets", "2", "--ram-gb-per-socket", "384").code == 0
    assert set(Path("/tmp").glob("epyc-spec-*")) == before


def test_a_plan_for_another_host_shows_its_assumptions_and_never_starts_here(script, tmp_path):
    """The 9654 request from the issue, with the skill's own commands only: spec -> validate (deferred)
    -> estimate from a config file -> cpu_tune on the rendered host -> plan. The plan shows the exact
    container command and what was assumed; start refuses to run it on this machine."""
    root = tmp_path / "s9654"
    det = run_script(
        "detect.py", "--spec", "9654", "--sockets", "2", "--ram-gb-per-socket", "384", "--save-sysroot", str(root)
    )
    files = {"detect": tmp_path / "d.json"}
    files["detect"].write_text(det.stdout)
    val = run_script("validate.py", "--detect", str(files["detect"]))
    cfg = ROOT / "tests" / "fixtures" / "models" / "Qwen3-0.6B" / "config.json"
    est = run_script(
        "estimate_memory.py",
        "--model",
        "Qwen/Qwen3-0.6B",
        "--config",
        str(cfg),
        "--weight-gb",
        "1.11",
        "--ram-gb",
        "384",
        "--max-model-len",
        "4096",
        env={"HF_HUB_OFFLINE": "1"},
    )
    chk = run_script("check_model.py", "--model", str(cfg.parent), "--vllm-version", "0.25.1")
    # the folder holds the same config as the Hub id: the document check_model gives for that id
    chk_doc = {**chk.doc, "model": "Qwen/Qwen3-0.6B", "source": "hub", "model_dir": None}
    tune = run_script(
        "cpu_tune.py",
        "--sysroot",
        str(root),
        "--weight-gb",
        str(est.doc["weight_gb"]),
        "--kv-needed-gb",
        str(est.doc["fit"]["kv_needed_gb"]),
    )
    for name, r in (("validate", val), ("estimate", est), ("tune", tune)):
        assert r.code == 0, r.doc
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(r.stdout)
    files["check"] = tmp_path / "check.json"
    files["check"].write_text(json.dumps(chk_doc))
    plan = run_script(
        "launch.py", "plan", *[f"--{k}={v}" for k, v in files.items()], "--state-dir", str(tmp_path / "st")
    )
    assert plan.code == 0, plan.doc
    p = plan.doc
    assert p["target"].startswith("spec:EPYC 9654") and "port" in p["deferred"]
    assert "--cpuset-cpus=0-95,192-287" in p["argv"] and "VLLM_CPU_OMP_THREADS_BIND=0-95" in p["argv"]
    assert p["sizing"]["kv_full_length_requests"] >= 64  # a 384 GiB socket serves many 4k requests at once
    assert "| Planned for | spec:EPYC 9654" in p["summary_markdown"]
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan.stdout)
    r = run_script("launch.py", "start", "--plan", str(plan_file), "--confirm")
    assert r.code == 1 and "not this machine" in r.doc["error"]


def test_a_part_the_table_lacks_is_described_by_generation_and_cores(script, tmp_path):
    r = script("detect.py", "--spec", "Turin", "--cores", "128", "--sockets", "2", "--ram-gb-per-socket", "768")
    assert r.code == 0 and r.doc["epyc_generation"] == "Turin" and r.doc["route"]["route"] == "zentorch"
    assert (r.doc["physical_cores"], r.doc["logical_cores"], r.doc["socket_count"]) == (256, 512, 2)
    assert r.doc["cpu_model"] == "AMD EPYC Turin (described) 128-Core Processor"
    assert "described by the user" in r.doc["spec"]["source"]
    r = script("detect.py", "--spec", "9999", "--ram-gb-per-socket", "64")
    assert r.code == 1 and "--spec Turin --cores 128" in r.doc["fix"]
    r = script("detect.py", "--spec", "Zen9", "--cores", "8", "--ram-gb-per-socket", "64")
    assert r.code == 1 and "names no EPYC part or generation" in r.doc["error"]
    r = script("detect.py", "--spec", "Turin", "--threads", "8", "--ram-gb-per-socket", "64")
    assert r.code == 1 and "--threads goes with --cores" in r.doc["error"]


@pytest.mark.parametrize(
    "spec,generation,missing",
    [
        (["--spec", "9755", "--sockets", "2"], "Turin", ["--cores", "--ram-gb-per-socket"]),
        (["--spec", "Genoa", "--ram-gb-per-socket", "384"], "Genoa", ["--cores"]),
        (["--spec", "9004", "--ram-gb-per-socket", "384"], "Genoa", ["--cores"]),
        (["--spec", "9654"], None, ["--ram-gb-per-socket"]),
    ],
)
def test_a_spec_names_every_missing_fact_at_once(script, spec, generation, missing):
    """Facts only the user knows come back in one refusal, each named by its flag: the agent asks for them
    all; a part number or series the table lacks already says its generation and asks only for the cores."""
    r = script("detect.py", *spec)
    assert r.code == 1 and r.doc["missing"] == missing and "ask the user" in r.doc["fix"]
    assert generation is None or f"a {generation} part" in r.doc["error"]


def test_an_unlisted_part_number_is_its_generation_with_the_cores_given(script):
    r = script("detect.py", "--spec", "EPYC 9755", "--cores", "128", "--sockets", "2", "--ram-gb-per-socket", "384")
    assert r.code == 0 and (r.doc["epyc_generation"], r.doc["physical_cores"]) == ("Turin", 256)
    assert r.doc["spec"]["sku"]["model"] == "9755 (described)"
    assert any("384 GB installed per socket" in a for a in r.doc["spec"]["assumptions"])


# ---- a machine without /proc/cpuinfo (macOS, Windows): detect names its CPU and the "Another host" chain plans
ANOTHER_HOST = [  # SKILL.md's chain for a server planned from here: a --capture made on it, then the five steps
    ["validate.py"],
    ["check_model.py", "--model", "Qwen/Qwen3-0.6B", "--config", "CONFIG"],
    ["estimate_memory.py", "--config", "CONFIG", "--max-model-len", "4096"],
    ["cpu_tune.py"],
    ["launch.py", "plan"],
]
NO_PROC_ENV = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:1"}


def without_proc(tmp_path: Path) -> list[str] | None:
    """An argv prefix running a command in a mount namespace whose /proc is an empty folder (this machine as the
    bundle sees macOS or Windows: no /proc/cpuinfo); None where unprivileged user namespaces are not allowed."""
    import subprocess

    (tmp_path / "empty-proc").mkdir(exist_ok=True)
    prefix = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", 'mount --bind "$0" /proc && exec "$@"']
    prefix.append(str(tmp_path / "empty-proc"))
    try:
        res = subprocess.run([*prefix, "test", "!", "-e", "/proc/cpuinfo"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return prefix if res.returncode == 0 else None


def test_without_proc_detect_names_the_cpu_and_the_another_host_chain_plans(tmp_path):
    """/proc unreadable for real: every command runs in a mount namespace whose /proc is an empty folder. detect
    names the CPU through py-cpuinfo and points to "Another host"; the chain from a capture of the server (made
    here, outside the namespace, as on the server) and from --spec plans there."""
    import subprocess

    prefix = without_proc(tmp_path)
    if prefix is None:
        pytest.skip("no unprivileged user namespace here (unshare -Urm): the boundary test below covers detect")
    config = str(ROOT / "tests" / "fixtures" / "models" / "Qwen3-0.6B" / "config.json")

    def run(*args: str) -> tuple[int, dict]:
        argv = [*prefix, sys.executable, str(ROOT / "scripts" / args[0]), *args[1:]]
        res = subprocess.run(
            argv, capture_output=True, text=True, timeout=180, cwd=ROOT, env={**os.environ, **NO_PROC_ENV}
        )
        assert "Traceback" not in res.stderr, res.stderr[-2000:]
        return res.returncode, json.loads(res.stdout)

    code, doc = run("detect.py")
    here = hostfacts.parse_cpuinfo(Path("/proc/cpuinfo").read_text())  # what Linux calls this CPU, outside
    assert code == 1 and doc["cpu"]["brand"] == here["brand"] and doc["cpu"]["vendor_id"] == here["vendor"], doc
    assert f"its CPU is {here['brand']}" in doc["error"] and '"Another host"' in doc["fix"]
    code, doc = run("validate.py", "--run", str(tmp_path / "nothing-detected"))  # no detect.json: reads this host
    assert code == 1 and doc["cpu"]["brand"] == here["brand"]
    archive = tmp_path / "host.txt"
    assert run_script("detect.py", "--capture", str(archive)).code == 0
    firsts = {
        "captured": ["detect.py", "--sysroot", str(archive)],
        "spec": ["detect.py", "--spec", "9654", "--sockets", "2", "--ram-gb-per-socket", "384"],
    }
    for name, first in firsts.items():
        box = str(tmp_path / name)
        for step in [first, *ANOTHER_HOST]:
            code, doc = run(*[config if a == "CONFIG" else a for a in step], "--run", box)
            assert code == 0, (name, step, doc)
        assert doc["deferred"] and doc["primary_endpoint"] == "chat_completions", doc
        assert any(w["check"] == "gated" for w in doc["warnings"])  # planned offline: gated unknown, HF_TOKEN named


def test_on_a_machine_without_proc_cpuinfo_detect_names_its_cpu_through_py_cpuinfo(tmp_path, monkeypatch, capsys):
    """The platform faked at the boundary, where user namespaces are not allowed: this machine's root
    (hostfacts.LOCAL_ROOT) is a folder without proc/, as on macOS and Windows; py-cpuinfo runs for real."""
    import check_model
    import cpu_tune
    import detect
    import estimate_memory
    import launch
    import validate
    from epyc import cli

    here = hostfacts.parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    monkeypatch.setattr(hostfacts, "LOCAL_ROOT", str(tmp_path / "a-mac"))
    for k, v in NO_PROC_ENV.items():
        monkeypatch.setenv(k, v)
    assert cli.run_main(detect.main, []) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["cpu"] == {"brand": here["brand"], "vendor_id": here["vendor"], "arch": "X86_64"}, doc
    assert "has no /proc/cpuinfo" in doc["error"] and "--spec" in doc["fix"] and '"Another host"' in doc["fix"]
    config = str(ROOT / "tests" / "fixtures" / "models" / "Qwen3-0.6B" / "config.json")
    mains = {"validate.py": validate, "check_model.py": check_model, "estimate_memory.py": estimate_memory}
    mains |= {"cpu_tune.py": cpu_tune, "launch.py": launch, "detect.py": detect}
    box = str(tmp_path / "box")
    for step in [["detect.py", "--spec", "9654", "--sockets", "2", "--ram-gb-per-socket", "384"], *ANOTHER_HOST]:
        args = [config if a == "CONFIG" else a for a in step[1:]] + ["--run", box]
        assert cli.run_main(mains[step[0]].main, args) == 0, (step, capsys.readouterr().out[-1500:])
        doc = json.loads(capsys.readouterr().out)
    assert doc["deferred"] and doc["primary_endpoint"] == "chat_completions"
