"""detect.py: generation from brand or CPUID, topology, memory truth, bad input, and the live host."""
from pathlib import Path

import pytest

import common
import detect
from common import ScriptError

GENS = common.load_epyc()["generations"]


@pytest.mark.parametrize("brand,family,model,gen,arch,source", [
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
])
def test_classify_generation(brand, family, model, gen, arch, source):
    out = detect.classify_generation(brand, family, model, GENS)
    assert (out["epyc_generation"], out["zen_arch"], out["generation_source"]) == (gen, arch, source)


def test_masked_amd_brand_counts_as_epyc_only_with_cpuid_match():
    assert detect.is_amd_epyc("AuthenticAMD", "AMD EPYC", "unknown")
    assert detect.is_amd_epyc("AuthenticAMD", "AMD Eng Sample", "cpuid")
    assert not detect.is_amd_epyc("AuthenticAMD", "AMD Ryzen 9 7950X", "cpuid")
    assert not detect.is_amd_epyc("GenuineIntel", "Intel(R) Xeon(R) EPYC-lookalike", "model_number")


def test_cgroup_dirs_v1_and_v2():
    dirs = detect.cgroup_dirs("4:memory:/process_api/abc\n3:cpuset:/\n0::/user.slice/x\n")
    assert dirs["memory"][0] == "/sys/fs/cgroup/user.slice/x/memory.max"
    assert "/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes" in dirs["memory"]
    assert dirs["cpuset"][0] == "/sys/fs/cgroup/user.slice/x/cpuset.cpus.effective"


@pytest.mark.parametrize("text,expected", [("max\n", None), ("9223372036854771712", None),
                                           (str(64 * 2 ** 30), 64 * 2 ** 30), ("junk", None), (None, None)])
def test_parse_cgroup_limit(text, expected):
    assert detect.parse_cgroup_limit(text) == expected


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
    assert (d["epyc_generation"], d["zen_arch"], d["generation_source"], d["is_supported_epyc"]) == \
        ("Genoa", "Zen4", "cpuid", True)


@pytest.mark.parametrize("host,gen,supported,avx512,logical,physical,sockets,tpc,nodes", [
    ("genoa_9654_2s_smt", "Genoa", True, True, 384, 192, 2, 2, 2),
    ("turin_9755_2s_nps4", "Turin", True, True, 256, 256, 2, 1, 8),
    ("milan_7763", "Milan", False, False, 256, 128, 2, 2, 2),
    ("bergamo_9754", "Bergamo", False, True, 256, 128, 1, 2, 1),
    ("epyc_4584px", "EPYC 4004", False, True, 32, 16, 1, 2, 1),
])
def test_epyc_hosts(script, make_sysroot, host, gen, supported, avx512, logical, physical, sockets, tpc, nodes):
    d = script("detect.py", "--sysroot", str(make_sysroot(host))).doc
    assert d["is_amd_epyc"] and d["epyc_generation"] == gen and d["generation_source"] == "model_number"
    assert d["is_supported_epyc"] is supported and d["avx512"] is avx512 and d["avx512_bf16"] is avx512
    assert (d["logical_cores"], d["physical_cores"], d["socket_count"], d["threads_per_core"], d["numa_node_count"]) == \
        (logical, physical, sockets, tpc, nodes)
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


@pytest.mark.parametrize("rel,text,needle", [
    ("proc/cpuinfo", "garbage without colons\n", "cpuinfo"),
    ("proc/meminfo", "MemTotal: lots\n", "MemTotal"),
    ("sys/devices/system/cpu/online", "0-x\n", "malformed"),
    ("sys/devices/system/node/node0/cpulist", "9-1\n", "malformed"),
    ("proc/self/status", "Cpus_allowed_list:\t1-0\n", "malformed"),
])
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


def test_unpack_capture_refuses_path_escape(tmp_path):
    root = tmp_path / "a" / "root"  # an escape lands in this test's own tmp_path, never in a shared folder
    root.mkdir(parents=True)
    detect.unpack_capture("@@EPYC-SKILL-FILE@@ /proc/cpuinfo\nok\n", root, "box")
    assert (root / "proc/cpuinfo").read_text() == "ok\n"
    with pytest.raises(ScriptError, match="is not a plain captured file"):
        detect.unpack_capture("@@EPYC-SKILL-FILE@@ /../../etc/evil\nx\n", root, "box")
    assert not (tmp_path / "etc/evil").exists()


# ---- the live host (this EPYC runner in CI)


def test_live_host_matches_proc_cpuinfo(script):
    d = script("detect.py").doc
    cpu = detect.parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    assert d["cpu_family"] == cpu["family"] and d["cpu_model_number"] == cpu["model"]
    assert d["avx512"] == ("avx512f" in cpu["flags"])
    expect = detect.classify_generation(cpu["brand"], cpu["family"], cpu["model"], GENS)
    if d["is_amd_epyc"]:
        assert d["epyc_generation"] == expect["epyc_generation"]
    assert d["logical_cores"] >= d["physical_cores"] >= 1
    assert set(common.parse_cpulist(d["allowed_cpus"])) <= set(range(d["logical_cores"] * 8))


def test_a_host_described_by_sku_plans_like_a_real_one(script, tmp_path):
    """'A dual-socket EPYC 9654, 384 GiB per socket, NPS1' -- no hand-made sysroot: detect renders it,
    cpu_tune plans on it, and the plan's cpuset and binding follow the stated topology."""
    root = tmp_path / "s9654"
    d = script("detect.py", "--spec", "9654", "--sockets", "2", "--ram-gb-per-socket", "384",
               "--save-sysroot", str(root))
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


@pytest.mark.parametrize("args,needle", [
    (["--spec", "9999"], "not in data/epyc_skus.json"),
    (["--spec", "9654"], "--ram-gb-per-socket"),
    (["--spec", "9654", "--ram-gb-per-socket", "384", "--sysroot", "/x"], "without --sysroot"),
    (["--spec", "9654", "--ram-gb-per-socket", "-1"], "out of range"),
])
def test_bad_specs(script, args, needle):
    r = script("detect.py", *args)
    assert r.code == 1 and needle in r.doc["error"] + r.doc["fix"]


def test_capture_round_trip_gives_the_same_facts_as_live(script, tmp_path):
    """On the host: detect.py --capture FILE (standard library only); anywhere: --sysroot FILE reads
    the same facts detect and cpu_tune read live."""
    archive = tmp_path / "host.tar.gz"
    c = script("detect.py", "--capture", str(archive))
    assert c.code == 0 and c.doc["files"] > 5 and archive.exists()
    live = script("detect.py").doc
    captured = script("detect.py", "--sysroot", str(archive)).doc
    assert captured["target"] == f"capture:{archive}"
    same = {k: v for k, v in live.items() if k not in ("target",)}
    assert {k: captured[k] for k in same} == same
    t_live = script("cpu_tune.py").doc
    t_cap = script("cpu_tune.py", "--sysroot", str(archive)).doc
    for k in ("vllm_cpu_omp_threads_bind", "container_cpuset", "socket_ram_gb", "kv_granted_gb", "numa_nodes"):
        assert t_cap[k] == t_live[k], k


def test_a_capture_never_writes_outside_its_folder(script, tmp_path):
    import io
    import tarfile
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("../../escape.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    r = script("detect.py", "--sysroot", str(evil))
    assert r.code == 1 and "not a plain captured file" in r.doc["error"]
    assert not (tmp_path.parent / "escape.txt").exists()


def test_the_stock_route_names_the_cpu_it_was_asked_for():
    """An explicit stock request on a CPU zentorch does not serve says which CPU, and why; unknown fields
    still give a sentence (mutation survivors of route_host)."""
    gens = common.load_epyc()["supported_generations"]
    intel = {"cpu_model": "Intel(R) Xeon(R) Platinum 8581C", "vendor": "GenuineIntel", "is_amd_epyc": False}
    r = detect.route_host(intel, gens, stock=True)
    assert r["route"] == "stock" and r["reason"].startswith("zentorch does not apply to Intel(R) Xeon(R) Platinum 8581C")
    r = detect.route_host({"is_amd_epyc": False}, gens, stock=False)
    assert r["route"] == "stop" and "unknown CPU" in r["reason"] and r["fix"].startswith("stop here")


VALIDATED = ["Genoa", "Turin"]
MILAN = {"cpu_model": "AMD EPYC 7763 64-Core Processor", "vendor": "AuthenticAMD", "is_amd_epyc": True,
         "avx512": False, "avx512_bf16": False, "epyc_generation": "Milan", "zen_arch": "Zen3"}
BERGAMO = {**MILAN, "cpu_model": "AMD EPYC 9754", "avx512": True, "avx512_bf16": True, "epyc_generation": "Bergamo",
           "zen_arch": "Zen4c"}
GENOA = {**BERGAMO, "cpu_model": "AMD EPYC", "epyc_generation": "Genoa", "zen_arch": "Zen4"}
XEON = {"cpu_model": "Intel(R) Xeon(R) Platinum 8480+", "vendor": "GenuineIntel", "is_amd_epyc": False}


@pytest.mark.parametrize("facts,stock,route,reason,fix", [
    (GENOA, False, "zentorch", "Genoa (Zen4): the validated zentorch path", None),
    (BERGAMO, False, "confirm", "zentorch is not validated on Bergamo (validated: Genoa, Turin)",
     "get the user's explicit OK to try zentorch, or offer the stock path (--stock)"),
    (MILAN, False, "stock_offer", "AMD EPYC 7763 64-Core Processor (AMD): Milan has no AVX-512 BF16, so zentorch "
     "cannot run", "offer the stock vLLM CPU path (slower, verified on EPYC 7763); on the user's explicit OK use --stock"),
    (XEON, False, "stop", "not an AMD EPYC: Intel(R) Xeon(R) Platinum 8480+ (Intel). This skill serves on AMD EPYC CPUs",
     "stop here; only if a human explicitly asks for unaccelerated stock vLLM on this CPU, run the stock path "
     "(launch.py up --stock)"),
    (XEON, True, "stock", "zentorch does not apply to Intel(R) Xeon(R) Platinum 8480+ (Intel): the stock vLLM CPU "
     "path, at the user's explicit request", None),
    (MILAN, True, "stock", "stock vLLM CPU (no zentorch) on AMD EPYC 7763 64-Core Processor (AMD): the stock vLLM CPU "
     "path, at the user's explicit request", None),
])
def test_each_route_says_what_to_do_in_words(facts, stock, route, reason, fix):
    """The route is what SKILL.md's agent reads aloud: the sentence and the next step, exactly."""
    assert detect.route_host(facts, VALIDATED, stock) == {"route": route, "reason": reason, "fix": fix}


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
    root = make_sysroot("runner", extra={
        "proc/self/cgroup": "5:memory:/pod1\n",
        "sys/fs/cgroup/memory/pod1/memory.limit_in_bytes": str(6 * 2 ** 30) + "\n"})
    d = script("detect.py", "--sysroot", str(root)).doc
    assert d["ram_limit_gb"] == 6.0 and d["ram_gb"] == 6.0


def _tree(root, files: dict):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return common.Sysroot(str(root))


def test_topology_without_numa_or_package_ids_is_one_socket_one_node(tmp_path):
    """A kernel without NUMA (no node dirs) and a hypervisor hiding physical_package_id (or writing -1):
    every CPU is socket 0 and node 0 -- not socket 1, not a node that does not exist."""
    import detect
    base = "sys/devices/system/cpu"
    sr = _tree(tmp_path, {f"{base}/online": "0-3", f"{base}/cpu1/topology/physical_package_id": "-1",
                          f"{base}/cpu2/topology/physical_package_id": "x",
                          f"{base}/cpu3/topology/physical_package_id": "0", f"{base}/cpu3/topology/core_id": "7"})
    topo = detect.read_topology(sr)
    assert topo.package == {0: 0, 1: 0, 2: 0, 3: 0} and topo.core == {0: 0, 1: 1, 2: 2, 3: 7}
    assert topo.node_cpus == {0: [0, 1, 2, 3]} and topo.node_of_cpu == {0: 0, 1: 0, 2: 0, 3: 0}


def test_a_cgroup_quota_without_a_period_uses_the_kernels_default():
    import detect
    assert detect.parse_cpu_quota("150000") == 1.5  # cpu.max with the period left out: 100000
    assert detect.parse_cpu_quota(None, "250000", None) == 2.5  # v1 without cfs_period_us
    assert detect.parse_cpu_quota("max 100000") is None and detect.parse_cpu_quota("200000 50000") == 4.0
