"""cpu_tune.py: socket choice, core binding, KV sizing, pinning commands, env output, bad input."""

import subprocess

import cpu_tune
import pytest
from conftest import _vm
from epyc import bundle, errors
from epyc.decisions import kv_budget, sizing
from epyc.errors import ScriptError
from epyc.facts import hostfacts

# ---- pure decisions


def test_choose_socket_by_load():
    # both free -> lowest id
    assert sizing.choose_socket([0, 1], [0, 1], {0: 3.0, 1: 1.0}, 15, None)[0] == 0
    # one free -> that one, no warning
    s, reason, warn = sizing.choose_socket([0, 1], [0, 1], {0: 60.0, 1: 2.0}, 15, None)
    assert (s, warn) == (1, None) and "free" in reason
    # all busy -> least busy, with a warning
    s, reason, warn = sizing.choose_socket([0, 1], [0, 1], {0: 80.0, 1: 40.0}, 15, None)
    assert s == 1 and "busy" in warn
    # threshold is inclusive: 15% counts as busy
    assert sizing.choose_socket([0, 1], [0, 1], {0: 15.0, 1: 14.9}, 15, None)[0] == 1
    # no sample -> lowest usable, and the reason says load is unknown
    s, reason, _ = sizing.choose_socket([1], [0, 1], None, 15, None)
    assert s == 1 and "unknown" in reason
    # the only usable socket, busy: taken, and the load said (a neighbour slows every token)
    assert sizing.choose_socket([0], [0], {0: 44.0}, 15, None) == (
        0,
        "single usable socket",
        "the only usable socket (0) is 44% busy: serving will compete with that load",
    )
    assert sizing.choose_socket([0], [0], {0: 3.0}, 15, None)[2] is None


def test_choose_socket_forced_and_invalid():
    assert sizing.choose_socket([0, 1], [0, 1], {0: 90.0, 1: 0.0}, 15, 0)[:2] == (0, "forced by --socket")
    with pytest.raises(ScriptError) as e:
        sizing.choose_socket([0, 1], [0, 1], None, 15, 7)
    assert e.value.extra["valid_sockets"] == [0, 1]
    with pytest.raises(ScriptError):
        sizing.choose_socket([1], [0, 1], None, 15, 0)  # exists, but no allowed CPU there


def test_split_reserved():
    assert sizing.split_reserved([0, 1, 2, 3], 0) == ([0, 1, 2, 3], [])
    assert sizing.split_reserved([0, 1, 2, 3], 1) == ([0, 1, 2], [3])
    with pytest.raises(ScriptError, match=r"^--reserve-cores -1 is negative$") as exc:
        sizing.split_reserved([0, 1, 2, 3], -1)
    assert exc.value.fix == "use --reserve-cores 0 or more"
    with pytest.raises(
        ScriptError, match=r"^--reserve-cores 4 leaves no core to bind \(the socket has 4 usable\)$"
    ) as exc:
        sizing.split_reserved([0, 1, 2, 3], 4)
    assert exc.value.fix == "use --reserve-cores below 4"  # the flag the user typed, by its name


def test_socket_ram_takes_the_smaller_truth():
    gib = 2**30
    # sysfs says 8 GiB on the only node, MemTotal 24: vLLM checks sysfs, so 8
    assert sizing.socket_ram_bytes([0], {0: 8 * gib}, 24 * gib) == 8 * gib
    # NPS4 socket: its four nodes
    assert sizing.socket_ram_bytes([4, 5, 6, 7], {n: 192 * gib for n in range(8)}, 1536 * gib) == 768 * gib
    # a cgroup limit below the socket's RAM wins
    assert sizing.socket_ram_bytes([1], {0: 384 * gib, 1: 384 * gib}, 64 * gib) == 64 * gib
    # no sysfs node memory at all: the usable total
    assert sizing.socket_ram_bytes([0], {}, 24 * gib) == 24 * gib


def test_the_kv_grant_is_what_the_largest_batch_can_use(script, make_sysroot):
    """Qwen3-0.6B at 4096 tokens on the recorded dual Genoa: 256 sequences x 0.4375 GiB = 112 GiB is all a
    running batch can hold; + 25 % for the prefix cache = 140 GiB, not half the socket (190). A test model of
    4 MB a sequence gets 2 GiB of a 24 GiB machine. The need (--num-prompts) still wins when it is larger."""
    root = str(make_sysroot("genoa_9654_2s_smt"))
    args = ["--sysroot", root, "--weight-gb", "1.11", "--kv-needed-gb", "0.44", "--kv-per-sequence-gb", "0.4375"]
    t = script("cpu_tune.py", *args)
    assert t.code == 0 and t.doc["kv_granted_gb"] == 140 and "largest running batch" in t.doc["kv_basis"]


def test_pin_commands_fallbacks():
    both = sizing.pin_commands([0, 1, 2], [0, 1, 2, 96], [0, 1], {"numactl": True, "taskset": True})
    assert both["host_pin_prefix"] == "numactl --cpunodebind=0,1 --membind=0,1"
    assert both["container_cpuset"] == "--cpuset-cpus=0-2,96 --cpuset-mems=0,1"
    ts = sizing.pin_commands([0, 1, 2], [0, 1, 2], [0], {"numactl": False, "taskset": True})
    assert ts["host_pin_argv"] == ["taskset", "-c", "0-2"] and "numactl" in ts["pin_note"]
    none = sizing.pin_commands([0], [0], [0], {})
    assert none["host_pin_prefix"] == "" and none["host_pin_tool"] is None and "unpinned" in none["pin_note"]


# ---- whole hosts through the CLI


def test_runner(script, make_sysroot):
    d = script("cpu_tune.py", "--sysroot", str(make_sysroot("runner"))).doc
    assert d["vllm_cpu_omp_threads_bind"] == "0-1" and d["reserved_cpus"] == ""
    assert d["socket_ram_gb"] == 8.0 and d["kv_granted_gb"] == 3  # (8 - 2) x 0.5
    assert d["container_cpuset"] == "--cpuset-cpus=0-1 --cpuset-mems=0"
    assert "unknown" in d["socket_choice_reason"] and d["socket_busy_pct"] is None


def test_dual_genoa_smt_binds_physical_cores_of_one_socket(script, make_sysroot):
    root = str(make_sysroot("genoa_9654_2s_smt"))
    d = script("cpu_tune.py", "--sysroot", root).doc
    assert d["chosen_socket"] == 0 and d["vllm_cpu_omp_threads_bind"] == "0-95" and d["omp_threads"] == 96
    assert d["container_cpuset"] == "--cpuset-cpus=0-95,192-287 --cpuset-mems=0"  # siblings stay in the cpuset
    assert d["socket_ram_gb"] == 384.0 and d["kv_granted_gb"] == 191  # (384 - 2) x 0.5
    d1 = script(
        "cpu_tune.py",
        "--sysroot",
        root,
        "--socket",
        "1",
        "--reserve-cores",
        "1",
        "--weight-gb",
        "15.2",
        "--kv-needed-gb",
        "7",
    ).doc
    assert d1["chosen_socket"] == 1 and d1["socket_choice_reason"] == "forced by --socket"
    assert d1["vllm_cpu_omp_threads_bind"] == "96-190" and d1["reserved_cpus"] == "191"
    assert d1["numa_nodes"] == [1] and d1["kv_granted_gb"] == 183  # half of 384 - 2 - 15.2 (the need, 9, is the floor)
    assert (d1["weight_gb"], d1["kv_needed_gb"], d1["os_reserve_gb"]) == (15.2, 7.0, 2.0)  # the inputs it used


def test_turin_nps4_sizes_one_engine_to_its_first_cores_node(script, make_sysroot):
    # vLLM 0.32's worker binds its memory to the node of its first core: the grant comes from that node alone
    d = script("cpu_tune.py", "--sysroot", str(make_sysroot("turin_9755_2s_nps4")), "--socket", "1").doc
    assert d["vllm_cpu_omp_threads_bind"] == "128-255" and d["numa_nodes"] == [4, 5, 6, 7]
    nps = [w for w in d["warnings"] if w["check"] == "nps"]
    assert d["socket_ram_gb"] == 192.0 and nps and "4, 5, 6, 7" in nps[0]["message"]
    assert "node 4's RAM" in nps[0]["message"] and "--tensor-parallel N" in nps[0]["fix"]
    assert d["container_cpuset"].endswith("--cpuset-mems=4,5,6,7") and d["ranks"][0]["numa_node"] == 4


def test_cgroup_cpuset_limits_choice_and_binding(script, make_sysroot):
    root = str(make_sysroot("genoa_cgroup_part"))
    d = script("cpu_tune.py", "--sysroot", root).doc
    assert d["chosen_socket"] == 1  # socket 0 has no CPU this process may use
    assert d["vllm_cpu_omp_threads_bind"] == "100-119"
    assert d["container_cpuset"] == "--cpuset-cpus=100-119,292-311 --cpuset-mems=1"
    assert d["socket_ram_gb"] == 64.0  # the cgroup limit, not the node's 384
    assert any("may use" in n for n in d["notes"])
    r = script("cpu_tune.py", "--sysroot", root, "--socket", "0")
    assert r.code == 1 and "no CPU this process may use" in r.doc["error"]


def test_a_socket_that_cannot_hold_the_model_is_refused(script, make_sysroot):
    r = script("cpu_tune.py", "--sysroot", str(make_sysroot("runner")), "--weight-gb", "5", "--kv-needed-gb", "4")
    assert r.code == 1 and "cannot hold" in r.doc["error"] and "--max-model-len" in r.doc["fix"]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--socket", "5"], "does not exist"),
        (["--socket", "x"], "bad arguments"),
        (["--busy-threshold", "0"], "busy-threshold"),
        (["--busy-threshold", "150"], "busy-threshold"),
        (["--busy-threshold", "nan"], "busy-threshold"),
        (["--reserve-cores", "2"], "leaves no core"),
        (["--weight-gb", "-3"], "weight-gb"),
        (["--format", "yaml"], "bad arguments"),
    ],
)
def test_bad_input(script, make_sysroot, args, needle):
    r = script("cpu_tune.py", "--sysroot", str(make_sysroot("runner")), *args)
    assert r.code == 1 and needle in r.doc["error"]
    if "--socket" in args and args[1] == "5":
        assert r.doc["valid_sockets"] == [0]


# ---- env output is what a shell evals


def _bash(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=60)


def test_env_format_evals_in_bash(make_sysroot):
    from conftest import SCRIPTS

    root = make_sysroot("genoa_9654_2s_smt")
    p = _bash(
        f'eval "$(python3 {SCRIPTS}/cpu_tune.py --format env --sysroot {root} --socket 1)" && '
        'echo "$VLLM_CPU_OMP_THREADS_BIND|$VLLM_CPU_KVCACHE_SPACE"'
    )
    assert p.returncode == 0 and p.stdout.strip().endswith("96-191|191")


def test_env_format_failure_stops_eval_and_reports_json_on_stderr(make_sysroot):
    from conftest import SCRIPTS

    root = make_sysroot("runner")
    p = _bash(f'eval "$(python3 {SCRIPTS}/cpu_tune.py --format env --sysroot {root} --socket 9)" || echo STOPPED')
    assert "STOPPED" in p.stdout and '"error"' in p.stderr and "does not exist" in p.stderr


# ---- the live host


def test_live_binding_is_within_allowed_cpus(script):
    det = script("detect.py").doc
    d = script("cpu_tune.py").doc
    bind = set(hostfacts.parse_cpulist(d["vllm_cpu_omp_threads_bind"]))
    assert bind and bind <= set(hostfacts.parse_cpulist(det["allowed_cpus"]))
    assert d["socket_busy_pct"] is not None and d["kv_granted_gb"] >= 1
    assert d["socket_ram_gb"] <= det["ram_gb"]


@pytest.mark.parametrize(
    "files,quota,threads",
    [
        ({"proc/self/cgroup": "0::/pod.slice\n", "sys/fs/cgroup/pod.slice/cpu.max": "400000 100000\n"}, 4.0, 4),
        ({"proc/self/cgroup": "0::/pod.slice\n", "sys/fs/cgroup/pod.slice/cpu.max": "max 100000\n"}, None, 96),
        (
            {
                "proc/self/cgroup": "4:cpu,cpuacct:/kubepods/p1\n",
                "sys/fs/cgroup/cpu,cpuacct/kubepods/p1/cpu.cfs_quota_us": "250000\n",
                "sys/fs/cgroup/cpu,cpuacct/kubepods/p1/cpu.cfs_period_us": "100000\n",
            },
            2.5,
            2,
        ),
    ],
)
def test_a_cgroup_cpu_quota_caps_the_threads(script, make_sysroot, files, quota, threads):
    """A pod limited to 4 CPUs on a 192-core host must not get 96 OMP threads (cgroup v2 and v1)."""
    root = str(make_sysroot("genoa_9654_2s_smt", extra=files))
    det = script("detect.py", "--sysroot", root).doc
    d = script("cpu_tune.py", "--sysroot", root).doc
    assert det["cpu_quota"] == quota and d["cpu_quota"] == quota
    assert d["omp_threads"] == threads and len(hostfacts.parse_cpulist(d["vllm_cpu_omp_threads_bind"])) == threads
    assert any(w["check"] == "cpu_quota" for w in d["warnings"]) == (quota is not None)


def test_a_socket_without_its_node_meminfo_is_not_given_the_whole_hosts_ram():
    gib = 1024**3
    with pytest.raises(errors.ScriptError, match=r"node\(s\) \[1\]"):
        sizing.socket_ram_bytes([1], {0: 384 * gib}, 768 * gib)


def test_per_cpu_load_is_indexed_by_cpu_id_with_offline_cpus(make_sysroot):
    """CPUs 0-1 on socket 0 and 4-5 on socket 1, with 2-3 offline: psutil's four entries are CPUs 0,1,4,5."""
    from epyc.facts import hostfacts

    topo = hostfacts.Topology(
        package={0: 0, 1: 0, 4: 1, 5: 1},
        core={0: 0, 1: 1, 4: 0, 5: 1},
        node_of_cpu={0: 0, 1: 0, 4: 1, 5: 1},
        node_cpus={0: [0, 1], 1: [4, 5]},
    )
    busy = sizing.busy_by_socket([90.0, 90.0, 5.0, 5.0], [0, 1, 4, 5], topo, [0, 1, 4, 5])
    assert busy == {0: 90.0, 1: 5.0}


def test_equally_idle_sockets_prefer_the_one_with_clearly_more_free_memory():
    gib = 2**30
    s, reason, _ = sizing.choose_socket([0, 1], [0, 1], {0: 2.0, 1: 3.0}, 15, None, {0: 40 * gib, 1: 300 * gib})
    assert s == 1 and "most free memory" in reason
    s, reason, _ = sizing.choose_socket([0, 1], [0, 1], {0: 2.0, 1: 3.0}, 15, None, {0: 290 * gib, 1: 300 * gib})
    assert s == 0 and "lowest id" in reason  # within 10 %: no reason to move
    s, _, _ = sizing.choose_socket([0, 1], [0, 1], {0: 50.0, 1: 3.0}, 15, None, {0: 300 * gib, 1: 40 * gib})
    assert s == 1  # load first: a busy socket is not chosen for its memory


def test_socket_load_is_the_mean_of_its_usable_cpus_and_a_socket_with_none_counts_as_busy():
    """Mutation survivors of busy_by_socket: the mean (not max, not sum), one decimal, and 100 % for a
    socket where this process may bind no CPU (so it is never the idle choice)."""
    from epyc.facts import hostfacts

    topo = hostfacts.Topology(
        package={0: 0, 1: 0, 4: 1, 5: 1},
        core={0: 0, 1: 1, 4: 0, 5: 1},
        node_of_cpu={0: 0, 1: 0, 4: 1, 5: 1},
        node_cpus={0: [0, 1], 1: [4, 5]},
    )
    assert sizing.busy_by_socket([10.0, 40.05, 5.0, 5.0], [0, 1, 4, 5], topo, [0, 1, 4, 5]) == {0: 25.0, 1: 5.0}
    assert sizing.busy_by_socket([10.0, 40.0, 0.0, 0.0], [0, 1, 4, 5], topo, [0, 1]) == {0: 25.0, 1: 100.0}


def test_roomiest_moves_only_past_the_margin():
    """More free memory by exactly the margin is not 'clearly more'; past it is."""
    assert sizing.roomiest([0, 1], {0: 100, 1: 110}) == (0, False)
    assert sizing.roomiest([0, 1], {0: 100, 1: 111}) == (1, True)
    assert sizing.roomiest([0, 1], {0: 100, 1: 150}, margin=0.5) == (0, False)
    assert sizing.roomiest([0, 1], {0: 100}) == (0, False)  # a socket without a figure: no move
    assert sizing.roomiest([2, 3], {2: 100, 3: 100}) == (2, False)


def test_a_quota_equal_to_the_cores_bound_changes_nothing_and_says_nothing():
    assert sizing.cap_to_quota([0, 1], 2.0) == ([0, 1], None)
    assert sizing.cap_to_quota([0, 1], None) == ([0, 1], None)
    bind, warning = sizing.cap_to_quota([0, 1, 2], 2.5)
    assert bind == [0, 1] and warning["message"].endswith("binding 2 of the socket's 3 physical cores")
    assert sizing.cap_to_quota([4, 5], 0.5)[0] == [4]  # at least one core


def test_env_format_echoes_each_warning_to_stderr(make_sysroot):
    """eval'd output: the values go to the shell, a warning still reaches the human (on stderr)."""
    from conftest import SCRIPTS

    root = make_sysroot("runner")  # 8 GiB node - 2 reserve - 5.5 weights = 0.5 GiB: the 1 GiB floor
    p = _bash(
        f'eval "$(python3 {SCRIPTS}/cpu_tune.py --format env --sysroot {root} --weight-gb 5.5)" && '
        'echo "KV=$VLLM_CPU_KVCACHE_SPACE"'
    )
    assert p.returncode == 0 and p.stdout.strip().endswith("KV=1")
    assert (
        "cpu_tune warning: only 0.5 GiB left on the socket after weights and OS reserve; KV cache set to the "
        "1 GiB minimum"
    ) in p.stderr


def _plan_in_process(root, busy, **over):
    from epyc.facts import remote_host

    req = sizing.SizingRequest(busy_threshold=15.0, reserve_cores=0, os_reserve_gb=2.0, **over)
    return sizing.tune(remote_host.gather_from_args(str(root), None), bundle.load_epyc(), busy, req)


def test_every_socket_busy_is_a_socket_warning_and_a_tiny_grant_a_kv_warning(make_sysroot):
    d = _plan_in_process(make_sysroot("genoa_9654_2s_smt"), {0: 60.0, 1: 40.0})
    assert d["chosen_socket"] == 1 and d["socket_choice_reason"] == "all sockets busy; least busy"
    assert d["warnings"] == [
        {
            "check": "socket",
            "message": "every socket is at least 15% busy (socket 1: 40%); serving will compete with that load",
            "fix": "pass --socket N to choose another",
        }
    ]
    assert d["socket_busy_pct"] == {"0": 60.0, "1": 40.0}
    d = _plan_in_process(make_sysroot("runner"), None, need=kv_budget.Need(weight_gb=5.5))
    assert d["warnings"] == [
        {
            "check": "kv",
            "message": "only 0.5 GiB left on the socket after weights and OS reserve; "
            "KV cache set to the 1 GiB minimum",
            "fix": "use a smaller model or a bigger socket",
        }
    ]
    assert d["kv_basis"] == "0.5 of socket RAM left after OS reserve and weights (no model need given)"


def test_the_host_pin_uses_the_best_tool_this_machine_has(script, make_sysroot):
    import shutil

    d = script("cpu_tune.py", "--sysroot", str(make_sysroot("runner"))).doc
    want = "numactl" if shutil.which("numactl") else "taskset" if shutil.which("taskset") else None
    assert d["host_pin_tool"] == want
    if want == "numactl":
        assert d["host_pin_argv"] == ["numactl", "--cpunodebind=0", "--membind=0"]


def test_a_host_without_numactl_or_taskset_is_told_its_launch_is_unpinned(make_sysroot, monkeypatch, tmp_path):
    """Both tools are installed on the runner: a PATH of folders holding neither, then only taskset, shows a
    host without them (a `.` entry never counts: start would not run a tool found there)."""
    import shutil

    bare, only_taskset = tmp_path / "bare", tmp_path / "only-taskset"
    bare.mkdir()
    only_taskset.mkdir()
    (only_taskset / "taskset").symlink_to(shutil.which("taskset"))
    monkeypatch.setenv("PATH", str(bare))
    d = _plan_in_process(make_sysroot("runner"), None)
    assert (d["host_pin_argv"], d["host_pin_prefix"], d["host_pin_tool"]) == ([], "", None)
    assert "neither numactl nor taskset found: the host launch is unpinned (install numactl)" in d["notes"]
    monkeypatch.chdir(only_taskset)
    monkeypatch.setenv("PATH", ".")
    assert _plan_in_process(make_sysroot("runner"), None)["host_pin_tool"] is None
    monkeypatch.setenv("PATH", str(only_taskset))
    d = _plan_in_process(make_sysroot("runner"), None)
    assert d["host_pin_argv"] == ["taskset", "-c", "0-1"]
    assert "numactl not found: CPU pinned with taskset, memory not bound (install numactl)" in d["notes"]


def test_the_live_load_sample_is_long_only_when_it_chooses_the_socket(make_sysroot, monkeypatch):
    """A 2-socket host sampled live: the full sample when it decides the socket, a glance when --socket already
    did (only reported then). This runner has one socket: a captured 2-socket host stands in for a live one."""
    from epyc.facts import remote_host

    two = remote_host.gather_from_args(str(make_sysroot("genoa_9654_2s_smt")), None)
    monkeypatch.setattr(remote_host, "gather_from_args", lambda sysroot, host: two)
    seconds = []
    monkeypatch.setattr(cpu_tune, "sample_busy", lambda topo, allowed, s: seconds.append(s) or {0: 1.0, 1: 1.0})
    cpu_tune.main([])
    cpu_tune.main(["--socket", "1"])
    assert seconds == [bundle.load_epyc()["cpu"]["sample_seconds"], 0.1]


def test_a_vm_of_one_core_sockets_in_one_node_is_served_on_all_its_cpus(script, tmp_path):
    """F4: 8 one-core "sockets" in one NUMA node were served on socket 0 alone: one vCPU of eight, no warning.
    Packages that share a node are one memory domain, served as one socket; with two nodes, two sockets."""
    root = _vm(tmp_path, 8, 1)
    r = script("cpu_tune.py", "--sysroot", str(root), "--weight-gb", "8", "--kv-needed-gb", "2")
    assert r.code == 0 and r.doc["omp_threads"] == 8 and r.doc["vllm_cpu_omp_threads_bind"] == "0-7"
    assert r.doc["container_cpuset_argv"] == ["--cpuset-cpus=0-7", "--cpuset-mems=0"] and len(r.doc["sockets"]) == 1
    assert (
        "packages 0-7 share NUMA node(s) 0: one-core packages of one memory domain (a VM's sockets), "
        "served as socket 0" in r.doc["notes"][-1]
    )
    d = script("detect.py", "--sysroot", str(root)).doc
    assert (d["socket_count"], d["physical_cores"], d["logical_cores"]) == (1, 8, 8)
    r = script("cpu_tune.py", "--sysroot", str(_vm(tmp_path, 8, 2)), "--weight-gb", "8", "--kv-needed-gb", "2")
    assert r.code == 0 and [s["cpus"] for s in r.doc["sockets"]] == ["0-3", "4-7"] and r.doc["omp_threads"] == 4
    assert r.doc["numa_nodes"] == [0]


def test_only_one_core_packages_are_joined_and_only_through_a_shared_node(script, tmp_path):
    """The review of F4's fix: a node spanning real packages (a 2P EPYC in NPS0) or no NUMA sysfs at all joined
    two 96-core sockets into one OpenMP team of 192. Only one-core packages (a VM's) are joined."""
    import shutil

    from epyc.facts import hostfacts
    from sysroots import HOSTS, build

    one_core = {0: 0, 1: 1, 2: 2, 3: 3}
    assert hostfacts.sharing_packages(one_core, {c: 0 for c in one_core}, {0: 0, 1: 0, 2: 1, 3: 1}) == {
        0: 0,
        1: 0,
        2: 2,
        3: 2,
    }
    assert hostfacts.sharing_packages({0: 2, 1: 1, 2: 0}, {0: 0, 1: 0, 2: 0}, {0: 0, 1: 1, 2: 1}) == {0: 0, 1: 0, 2: 2}
    two_cores = {0: 0, 1: 0, 2: 1, 3: 1}
    assert hostfacts.sharing_packages(two_cores, {0: 0, 1: 1, 2: 0, 3: 1}, {c: 0 for c in two_cores}) == {0: 0, 1: 1}
    smt = {0: 0, 1: 1, 2: 0, 3: 1}  # one core, two threads each: still a one-core package
    assert hostfacts.sharing_packages(smt, {c: 0 for c in smt}, {c: 0 for c in smt}) == {0: 0, 1: 0}
    for edit in ("nps0", "no-numa"):
        root = build(tmp_path / edit, HOSTS["genoa_9654_2s_smt"])
        if edit == "nps0":
            (root / "sys/devices/system/node/node0/cpulist").write_text("0-383\n")
            (root / "sys/devices/system/node/node0/meminfo").write_text("Node 0 MemTotal: 805306368 kB\n")
            shutil.rmtree(root / "sys/devices/system/node/node1")
        else:
            shutil.rmtree(root / "sys/devices/system/node")
        r = script("cpu_tune.py", "--sysroot", str(root), "--weight-gb", "8", "--kv-needed-gb", "2")
        assert r.code == 0 and r.doc["omp_threads"] == 96 and r.doc["vllm_cpu_omp_threads_bind"] == "0-95", edit
        assert r.doc["container_cpuset_argv"][0] == "--cpuset-cpus=0-95,192-287" and len(r.doc["sockets"]) == 2
        assert not any("one-core packages" in n for n in r.doc["notes"])


def test_a_socket_whose_nodes_list_no_cpu_is_refused(script, make_sysroot):
    root = make_sysroot("runner")
    (root / "sys/devices/system/node/node0/cpulist").write_text("")
    r = script("cpu_tune.py", "--sysroot", str(root))
    assert r.code == 1 and "no NUMA node listing its CPUs" in r.doc["error"]
