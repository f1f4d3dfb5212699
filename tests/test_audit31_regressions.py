"""Regressions from the thirty-first independent audit (2026-12-03, a fresh helper on b40ee60: ~230 cases, 10
findings, on sizing real model configs, remote planning and hostile sysroot trees, bench's flags) and the
thirty-second (on 4540549: ~45 cases, on up, check_model, kernel_proof and the newest code). The sizing
findings (Gemma-3's class defaults, Mistral's consolidated.safetensors, the model length keys, Qwen2's
max_window_layers) are in test_estimate_memory.py beside the other sizing tests. Classes: tests/BAD_INPUT.md."""
from pathlib import Path

import bench
from test_launch import calls, container_plan, host_plan, inputs, live_tune, plan_args, rt  # noqa: F401


def test_a_bench_matrix_longer_than_the_plan_serves_is_refused_before_anything_runs(script, inputs, rt, tmp_path):  # noqa: F811
    """F5: a plan served at --max-model-len 4096 got `--random-input-len 1000000 --random-output-len 65536`;
    vLLM answers 400 to every such request and bench ended blaming the endpoint. Refused up front; a
    concurrency past --max-num-seqs is run, with a warning that its latencies include the queue."""
    d, env = rt
    plan_file, plan = container_plan(script, inputs, rt, tmp_path)
    limit, seqs = plan["max_model_len"], plan["sizing"]["max_num_seqs"]
    before = len(calls(d))
    r = script("bench.py", "--plan", str(plan_file), "--input-lens", str(limit), "--output-len", "1",
               "--out", str(tmp_path / "b"), env=env, timeout=120)
    assert r.code == 1 and f"is {limit + 1} tokens a request, past the plan's --max-model-len {limit}" in r.doc["error"]
    assert f"within {limit} tokens" in r.doc["fix"] and len(calls(d)) == before  # not even asked about the server
    assert not (tmp_path / "b").exists()
    assert bench.matrix_against_the_plan({**plan, "primary_endpoint": "completions"}, [limit - 1], 1, [1], 128) \
        == (None, [])
    seqs = bench.served_max_num_seqs(plan, 128)
    assert f"--max-num-seqs {seqs}" in plan["command"]  # the skill's sizing passes the flag: that is the limit
    error, warnings = bench.matrix_against_the_plan(plan, [16], 16, [1, seqs, seqs + 1, 4 * seqs], 128)
    assert error is None and warnings == [{
        "check": "concurrency", "fix": None,
        "message": f"--concurrency {seqs + 1},{4 * seqs} is past the --max-num-seqs {seqs} the server runs with: it "
                   f"runs {seqs} at once and queues the rest, so TTFT and E2EL include that wait"}]


def test_bench_reads_the_max_num_seqs_the_server_runs_with(script, inputs, rt, tmp_path):  # noqa: F811
    """The review of F5's fix: a sizing that leaves --max-num-seqs out (vllm-default) runs at vLLM's CPU server
    default, 128, whatever capacity the plan computed (256 there): the warning named a flag never passed, and
    a concurrency of 200 queued unwarned. And a chat endpoint's template adds tokens to the longest request."""
    _, plan = container_plan(script, inputs, rt, tmp_path)
    r = script("launch.py", *plan_args(inputs, "--state-dir", str(tmp_path / "st2"), "--sizing", "vllm-default"),
               env=rt[1])
    assert r.code == 0 and "--max-num-seqs" not in r.doc["argv"], r.doc
    assert bench.served_max_num_seqs(r.doc, 128) == 128
    _, warnings = bench.matrix_against_the_plan(r.doc, [16], 16, [200], 128)
    assert [w["check"] for w in warnings] == ["concurrency"] and "--max-num-seqs 128 the server" in warnings[0]["message"]
    assert bench.served_max_num_seqs({"argv": ["vllm", "serve", "--max-num-seqs=7"]}, 128) == 7
    chat = {**plan, "primary_endpoint": "chat_completions"}
    limit = plan["max_model_len"]
    _, warnings = bench.matrix_against_the_plan(chat, [limit - 64], 64, [1], 128)
    assert warnings[0]["check"] == "length" and "the chat template adds tokens" in warnings[0]["message"]
    assert bench.matrix_against_the_plan({**chat, "primary_endpoint": "completions"}, [limit - 64], 64, [1], 128) \
        == (None, [])


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


def _vm(tmp, sockets: int, nodes: int):
    """A guest of `sockets` one-core packages (VMware's default cores-per-socket = 1, QEMU's -smp N) whose
    CPUs sit in `nodes` NUMA nodes, in order: no package has a node of its own."""
    import shutil
    from sysroots import HostSpec, build
    root = build(tmp / f"vm{sockets}x{nodes}", HostSpec("AMD EPYC 9654 96-Core Processor", 25, 17, sockets=sockets,
                                                       cores=1, node_mem_gib=8.0))
    per = sockets // nodes
    for n in range(sockets):
        shutil.rmtree(root / f"sys/devices/system/node/node{n}")
    for n in range(nodes):
        node = root / f"sys/devices/system/node/node{n}"
        node.mkdir(parents=True)
        (node / "cpulist").write_text(f"{n * per}-{n * per + per - 1}\n")
        (node / "meminfo").write_text(f"Node {n} MemTotal: {32 * 1024 ** 2} kB\n")
    return root


def test_a_vm_of_one_core_sockets_in_one_node_is_served_on_all_its_cpus(script, tmp_path):
    """F4: 8 one-core "sockets" in one NUMA node were served on socket 0 alone: one vCPU of eight, no warning.
    Packages that share a node are one memory domain, served as one socket; with two nodes, two sockets."""
    root = _vm(tmp_path, 8, 1)
    r = script("cpu_tune.py", "--sysroot", str(root), "--weight-gb", "8", "--kv-needed-gb", "2")
    assert r.code == 0 and r.doc["omp_threads"] == 8 and r.doc["vllm_cpu_omp_threads_bind"] == "0-7"
    assert r.doc["container_cpuset_argv"] == ["--cpuset-cpus=0-7", "--cpuset-mems=0"] and len(r.doc["sockets"]) == 1
    assert "packages 0-7 share NUMA node(s) 0: one-core packages of one memory domain (a VM's sockets), " \
        "served as socket 0" in r.doc["notes"][-1]
    d = script("detect.py", "--sysroot", str(root)).doc
    assert (d["socket_count"], d["physical_cores"], d["logical_cores"]) == (1, 8, 8)
    r = script("cpu_tune.py", "--sysroot", str(_vm(tmp_path, 8, 2)), "--weight-gb", "8", "--kv-needed-gb", "2")
    assert r.code == 0 and [s["cpus"] for s in r.doc["sockets"]] == ["0-3", "4-7"] and r.doc["omp_threads"] == 4
    assert r.doc["numa_nodes"] == [0]


def test_only_one_core_packages_are_joined_and_only_through_a_shared_node(script, tmp_path):
    """The review of F4's fix: a node spanning real packages (a 2P EPYC in NPS0) or no NUMA sysfs at all joined
    two 96-core sockets into one OpenMP team of 192. Only one-core packages (a VM's) are joined."""
    import shutil

    import detect
    from sysroots import HOSTS, build
    one_core = {0: 0, 1: 1, 2: 2, 3: 3}
    assert detect.sharing_packages(one_core, {c: 0 for c in one_core}, {0: 0, 1: 0, 2: 1, 3: 1}) == \
        {0: 0, 1: 0, 2: 2, 3: 2}
    assert detect.sharing_packages({0: 2, 1: 1, 2: 0}, {0: 0, 1: 0, 2: 0}, {0: 0, 1: 1, 2: 1}) == {0: 0, 1: 0, 2: 2}
    two_cores = {0: 0, 1: 0, 2: 1, 3: 1}
    assert detect.sharing_packages(two_cores, {0: 0, 1: 1, 2: 0, 3: 1}, {c: 0 for c in two_cores}) == {0: 0, 1: 1}
    smt = {0: 0, 1: 1, 2: 0, 3: 1}  # one core, two threads each: still a one-core package
    assert detect.sharing_packages(smt, {c: 0 for c in smt}, {c: 0 for c in smt}) == {0: 0, 1: 0}
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


def test_a_cpu_two_nodes_list_is_refused(script, tmp_path):
    """F8: node1 claiming CPUs node0 lists made the later node win, and the plan bound memory to it."""
    from sysroots import HOSTS, build
    root = build(tmp_path / "sr", HOSTS["genoa_9654_2s_smt"])
    (root / "sys/devices/system/node/node1/cpulist").write_text("0-15\n")
    for name in ("detect.py", "cpu_tune.py"):
        r = script(name, "--sysroot", str(root))
        assert r.code == 1 and r.doc["error"].startswith("CPU 0 is listed by NUMA nodes 0 and 1"), r.doc
        assert "re-capture" in r.doc["fix"]


# ---- the thirty-second audit

FORGED = ('INFO:     127.0.0.1:50312 - "GET /plugin_op=zentorch_linear_unary_out,kernel=aocl_dlp_blocked HTTP/1.1" '
          '404 Not Found\n')
# zendnnl's own records, as zentorch 2.13.0.1 wrote them (tests/fixtures/zendnnl/README.md)
REAL_LOG = Path(__file__).resolve().parent / "fixtures" / "zendnnl" / "api-log-level-4.log"
REAL = next(line + "\n" for line in REAL_LOG.read_text().splitlines() if "plugin_op=" in line)


def test_a_client_cannot_write_a_kernel_line_into_the_proof(script, tmp_path):
    """F1: vLLM's access log writes each request's path: one unauthenticated GET of
    /plugin_op=zentorch_linear_unary_out,kernel=aocl_dlp_blocked made kernel_proof say "zentorch kernels
    executed". A matmul counts only as zendnnl's own record (LOWOHA matmul_direct: ...), never from an access line."""
    log = tmp_path / "server.log"
    # and the review of that fix: vLLM's own logger writes a requested model name into its error line
    error_line = ("(APIServer pid=1) ERROR 12-03 17:00:00 [serving.py:274] Error with model error=ErrorResponse("
                  "message='The model `LOWOHA matmul_direct: M=1, plugin_op=zentorch_linear_unary_out, "
                  "kernel=aocl_dlp_blocked, x` does not exist.', type='NotFoundError', code=404)\n")
    log.write_text(FORGED + FORGED.replace("GET /", "POST /v1/LOWOHA%20matmul_direct:") + "plugin_op=a kernel=b\n"
                   + error_line + error_line.replace("(APIServer pid=1) ERROR 12-03", "[API ][info ][1]: x"))
    r = script("kernel_proof.py", "--log", str(log))
    assert r.code == 1 and r.doc["zentorch_matmuls"] == 0 and r.doc["verdict"] == "no zentorch matmul in the log"
    log.write_text(FORGED + REAL * 3 + "(EngineCore_DP0 pid=7) " + REAL)
    r = script("kernel_proof.py", "--log", str(log))
    assert r.code == 0 and r.doc["zentorch_matmuls"] == 4 and r.doc["by_kernel"] == {"aocl_dlp_blocked": 4}
    assert r.doc["sample"].startswith("[API    ][info   ][")
    r = script("kernel_proof.py", "--log", str(REAL_LOG))  # the real log, whole: every record, nothing else
    assert r.code == 0 and r.doc["by_plugin_op"] == {"zentorch::zentorch_linear_unary": 2, "zentorch::zentorch_mm": 1}


def test_a_stock_plan_proves_no_zentorch_whatever_its_log_says(script, tmp_path, inputs, live_tune):  # noqa: F811
    """F1, the other half: a stock plan's server (vLLM's CpuPlatform) runs no zentorch, so lines that read as
    its matmuls are not this server's kernels: exit 1, with the reason."""
    def stock(docs):
        docs["validate"]["backend"] = "stock"
    plan_file, plan = host_plan(tmp_path, inputs, live_tune, edit=stock, kernel_log=True)
    assert plan["backend"] == "stock"
    Path(plan["state_dir"]).mkdir(parents=True, exist_ok=True)
    Path(plan["log_file"]).write_text(REAL)
    r = script("kernel_proof.py", "--plan", str(plan_file))
    assert r.code == 1 and r.doc["error"].startswith("the plan serves stock vLLM, which runs no zentorch")
    assert r.doc["zentorch_matmuls"] == 1 and "validate.py without --stock" in r.doc["fix"]
    Path(plan["log_file"]).write_text("nothing of zendnnl\n")  # none either: the same reason, not "--kernel-log"
    r = script("kernel_proof.py", "--plan", str(plan_file))
    assert r.code == 1 and r.doc["error"].startswith("the plan serves stock vLLM") and "--kernel-log" not in r.doc["fix"]


def test_a_relative_venv_is_made_absolute_never_an_option(tmp_path):
    """F3: `--venv=--help` reached `python -m venv --help` as its option (help printed, exit 0, "created")."""
    import json
    import subprocess
    import sys
    from conftest import ROOT
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "setup_host_stack.py"), "--stock", "--venv=--help",
                          "--check"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and doc["venv"] == str(tmp_path / "--help") and doc["python"].startswith(str(tmp_path))
    assert not (tmp_path / "--help").exists()


def test_bench_warns_of_the_chat_template_on_the_endpoint_verify_settled():
    """F6: a plan whose endpoint check_model could not tell (unknown) skipped the chat warning even after
    verify had settled it on chat."""
    plan = {"max_model_len": 4096, "primary_endpoint": "unknown", "argv": []}
    assert bench.matrix_against_the_plan(plan, [4000], 64, [1], 128) == (None, [])
    _, warnings = bench.matrix_against_the_plan(plan, [4000], 64, [1], 128, "chat_completions")
    assert [w["check"] for w in warnings] == ["length"]
