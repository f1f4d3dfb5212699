"""epyc.decisions.planner: its decisions, tested in-process."""

import json
import sys

import pytest
from conftest import PINNED, ROOT, cert_pair, facts_for, load_docs
from epyc.bundle import load_epyc
from epyc.decisions import command, plan_checks, planner
from epyc.errors import ScriptError
from epyc.facts import architectures


# ---- the EPYC Rome runner (AVX2, 2026-12-02): what vLLM does differently without AVX-512
def test_an_estimate_for_the_other_kind_of_cpu_is_a_mismatch_for_a_recurrent_model():
    """vLLM keeps the SSM state in float32 only on an AVX-512 BF16 CPU: an estimate made for the other kind
    sizes the wrong KV page, so plan names the flag that fixes it."""
    from epyc.decisions.plan_checks import mismatches

    est = {"kv_layers": {"ssm_state_dtype": "float32"}, "avx512_bf16": True}
    docs = {"detect": {"avx512_bf16": False}, "validate": {}, "check_model": {}, "estimate_memory": est, "cpu_tune": {}}
    assert any("--avx512-bf16 no" in m for m in mismatches(docs))
    docs["estimate_memory"] = {"kv_layers": {"ssm_state_dtype": None}, "avx512_bf16": True}  # no recurrent layer
    assert mismatches(docs) == []


def test_an_estimate_that_contradicts_itself_is_a_mismatch():
    """F5: avx512_bf16 edited to true on an estimate sized with a bf16 state planned a float32 CPU's sizing."""
    from epyc.decisions.plan_checks import mismatches

    est = {"kv_layers": {"ssm_state_dtype": "bfloat16"}, "avx512_bf16": True, "kv_dtype": "bfloat16"}
    docs = {"detect": {"avx512_bf16": True}, "validate": {}, "check_model": {}, "estimate_memory": est, "cpu_tune": {}}
    assert any("vLLM keeps it in float32" in m for m in mismatches(docs))


@pytest.mark.parametrize(
    "vendor,refused", [("GenuineIntel", True), ("HygonGenuine", True), ("AuthenticAMD", False), (None, True)]
)
def test_zentorch_on_a_cpu_detect_read_as_not_amd_is_a_mismatch(vendor, refused):
    """A note of the twenty-sixth audit: a validate.json that chose zentorch planned beside a detect.json of
    an Intel CPU, and the summary read "zentorch-accelerated" for a platform vLLM never picks there. (None, a
    note left since the twenty-eighth: a CPU whose vendor detect.py could not read is not called an EPYC, so
    validate.py is never ready with zentorch for it; a spec writes AuthenticAMD.)"""
    from epyc.decisions.plan_checks import mismatches

    docs = {
        "detect": {"vendor": vendor},
        "validate": {"backend": "zentorch"},
        "check_model": {},
        "estimate_memory": {},
        "cpu_tune": {},
    }
    assert any("activates only on AMD CPUs" in m for m in mismatches(docs)) == refused
    assert vendor is not None or any("detect.py read no CPU vendor" in m for m in mismatches(docs))
    docs["validate"]["backend"] = "stock"
    assert mismatches(docs) == []


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (
            lambda i: i["validate"].update(ready=False, errors=[{"message": "no runtime", "fix": "get one"}]),
            "not ready",
        ),
        (lambda i: i["check_model"].update(launchable=False, message="BertModel is pooling"), "pooling"),
        (
            lambda i: i["estimate_memory"]["fit"].update(fits=False, action="lower --max-model-len to 1024"),
            "does not fit",
        ),
    ],
)
def test_plan_refuses_inconsistent_inputs(inputs, mutate, needle):
    docs = load_docs(inputs)
    mutate(docs)
    with pytest.raises(ScriptError) as e:
        planner.build_plan(docs, {}, load_epyc(), facts_for(docs))
    assert needle in e.value.error
    with pytest.raises(ScriptError) as e:
        planner.build_plan(load_docs(inputs), {"model": "other/model"}, load_epyc(), facts_for(docs))
    assert "check_model.py ran for" in e.value.error


def test_sudo_docker_plan_is_non_interactive(inputs):
    docs = load_docs(inputs)
    docs["validate"]["runtime"] = "sudo docker"
    plan = planner.build_plan(docs, {}, load_epyc(), facts_for(docs))
    assert plan["argv"][:4] == ["sudo", "-n", "docker", "run"]
    assert plan["pre_argv"][0][:3] == ["sudo", "-n", "docker"]


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda i: i["estimate_memory"].update(model="other/model"), "estimate_memory.py for other/model"),
        (
            lambda i: i["cpu_tune"].update(weight_gb=15.0),
            "cpu_tune.py sized for 15.0 GiB of weights, estimate_memory.py says 1.11",
        ),
        (lambda i: i["cpu_tune"].update(kv_needed_gb=9.0), "KV need"),
        (
            lambda i: (
                i["estimate_memory"]["fit"].update(kv_needed_gb=300.0),
                i["cpu_tune"].update(kv_needed_gb=300.0),
            ),
            "below the 300.0 GiB needed",
        ),
        (lambda i: i["cpu_tune"].update(target="root@other-box"), "cpu_tune.py sized root@other-box"),
    ],
)
def test_plan_refuses_documents_that_describe_different_serves(inputs, mutate, needle):
    docs = load_docs(inputs)
    docs["cpu_tune"]["target"] = docs["detect"]["target"]  # the fixture's tune and detect read the same sysroot
    planner.build_plan(docs, {}, load_epyc(), facts_for(docs))  # consistent: fine
    mutate(docs)
    with pytest.raises(ScriptError) as e:
        planner.build_plan(docs, {}, load_epyc(), facts_for(docs))
    assert "do not describe one serve" in e.value.error and needle in e.value.error


@pytest.mark.parametrize(
    "sizing,bind,kv,seqs",
    [
        ("skill", "96-191", "190", True),
        ("vllm-default", None, None, False),
        ("all-cores", "96-191", None, False),
        ("unpinned", "nobind", "190", False),
        ("skill+throughput", "96-191", "190", True),
    ],
)
def test_sizing_baselines_for_the_comparison(inputs, sizing, bind, kv, seqs):
    """bench.py --compare serves the same model under each sizing: only the rules differ."""
    docs = load_docs(inputs)
    plan = planner.build_plan(docs, {"sizing": sizing}, load_epyc(), facts_for(docs))
    assert plan["env"].get("VLLM_CPU_OMP_THREADS_BIND") == bind and plan["env"].get("VLLM_CPU_KVCACHE_SPACE") == kv
    assert ("--max-num-seqs" in plan["argv"]) == seqs and plan["sizing"]["sizing_rule"] == sizing
    assert any(a.startswith("--cpuset-cpus") for a in plan["argv"]) == (sizing in ("skill", "skill+throughput"))
    assert ("TORCHINDUCTOR_FREEZING" in plan["env"]) == (sizing == "skill+throughput")
    with pytest.raises(ScriptError):
        planner.build_plan(docs, {"sizing": "magic"}, load_epyc(), facts_for(docs))


def test_throughput_flags_are_refused_on_the_stock_path(inputs):
    """Measured: on stock vLLM CPU the flags segfault the engine in onednn_mm at warm-up."""
    docs = load_docs(inputs)
    docs["validate"]["backend"] = "stock"
    for opt in ({"throughput_flags": True}, {"sizing": "skill+throughput"}):
        with pytest.raises(ScriptError, match="zentorch path only"):
            planner.build_plan(docs, opt, load_epyc(), facts_for(docs))


def test_kernel_log_turns_on_exactly_the_two_kernel_logs(inputs):
    """kernel_proof.py reads ZenDNN's API log and oneDNN's verbose lines: both, and only with --kernel-log."""
    docs = load_docs(inputs)
    with_log = planner.build_plan(docs, {"kernel_log": True}, load_epyc(), facts_for(docs))["env"]
    without = planner.build_plan(docs, {}, load_epyc(), facts_for(docs))["env"]
    assert {k: v for k, v in with_log.items() if k not in without} == {
        "ZENDNNL_API_LOG_LEVEL": "4",
        "ONEDNN_VERBOSE": "1",
    }


# ---- what the human reads: the confirmation summary and the handoff, whole (each row is a decision)
def test_the_confirmation_summary_names_every_decision_in_words(inputs):
    docs = load_docs(inputs)
    plan = planner.build_plan(docs, {}, load_epyc(), facts_for(docs, hf_token_set=True))
    model, port = plan["model"], plan["port"]
    assert plan["summary"] == [
        ["Model / kind", f"{model} -- text, endpoint chat_completions"],
        ["Backend", "zentorch-accelerated (ZenCpuPlatform)"],
        ["Path", f"container (docker, {PINNED}; the seed's image (amdih): vLLM 0.25.1 + zentorch 2.11.0.3)"],
        ["Precision", "bfloat16"],
        ["Fit", "required 3.55 GiB vs 384.0 GiB RAM"],
        ["CPU sizing", "socket 1 (forced by --socket), bind 96-191, KV 190 GiB (socket-local), memory on nodes 1"],
        [
            "KV cache",
            "holds 1,778,834 tokens = 434 requests of 4096 tokens at once; --max-num-seqs 256, "
            "--max-num-batched-tokens 2048; granted as 0.5 of the socket RAM left after OS reserve and weights "
            "(380.9 GiB); at least the need, at most what the socket has left",
        ],
        [  # a recorded Genoa planned without its stack's probe: the bandwidth from data, the clock unknown (masked)
            "Forecast",
            "one stream 3.23-11.8 ms/token = 84.6-310 tokens/s (bound 2.73 ms); 8 streams 480-1,658 tokens/s; "
            "first token of a 512-token prompt 21.6-66.3 ms; start 28.4-74.4 s reading 1.19 GB; bandwidth 461 GB/s "
            "a rank (data:forecast.memory.Genoa); likely = the bound over the efficiency measured on the runners "
            "(reference.md)",
        ],
        ["Hardware", "EPYC Genoa (Zen4), 96 cores on socket 1 (host: 2 sockets, 192 cores), AVX-512 yes"],
        ["Port", f"{port} on 127.0.0.1"],
        ["Pinning", "--cpuset-* flags in the command"],
        [
            "Environment",
            "VLLM_CPU_OMP_THREADS_BIND=96-191, VLLM_CPU_KVCACHE_SPACE=190, HF_TOKEN (from $HF_TOKEN, value not shown)",
        ],
        ["Command (exactly what start runs)", plan["command"]],
    ]
    import shlex

    assert shlex.split(plan["command"]) == plan["argv"]  # the command shown is the argv start runs
    assert plan["summary_markdown"].splitlines()[:3] == [
        "| Field | Value |",
        "|---|---|",
        f"| Model / kind | {model} -- text, endpoint chat_completions |",
    ]


def test_the_summary_of_an_exposed_quantized_baseline_says_so(inputs, monkeypatch):
    """The rows that only some plans have: the exposed port, the quantized weights and their kernel, a
    comparison sizing, the warnings and the questions the human must answer."""
    monkeypatch.setenv("MY_KEY", "sk-summary-test")
    docs = load_docs(inputs)
    docs["check_model"]["quantization"] = {
        "method": "compressed-tensors",
        "format": "pack-quantized",
        "bits": 4,
        "symmetric": True,
        "group_size": 128,
        "cpu_kernels": {},
    }
    docs["validate"]["confirmations"] = [{"check": "c", "message": "the image is not the pinned one", "fix": "f"}]
    plan = planner.build_plan(
        docs,
        {"expose": True, "plain_http": True, "api_key_env": "MY_KEY", "sizing": "all-cores"},
        load_epyc(),
        facts_for(docs, api_key_set=True),
    )
    rows = dict((k, v) for k, v in plan["summary"] if k not in ("Warning",))
    assert plan["quantization"]["kernel"].startswith("zentorch_dynamic_qlinear")
    assert rows["Precision"] == (
        "bfloat16 activations; weights compressed-tensors 4-bit, run by " + plan["quantization"]["kernel"]
    )
    assert rows["Port"] == f"{plan['port']} on 0.0.0.0 (exposed, API key required)"
    assert rows["Sizing rule"] == "all-cores (a comparison baseline, not the skill's sizing)"
    assert rows["Needs your OK"] == "the image is not the pinned one"
    assert "VLLM_API_KEY (from $MY_KEY, value not shown)" in rows["Environment"]
    assert "sk-summary-test" not in json.dumps(plan)


def test_every_field_of_a_plan_is_compared_with_a_fresh_rendering(inputs):
    """start (and every verb) refuses a plan that differs from its own inputs' rendering in any field: the
    command, its env and secrets, where it runs, and what the summary, stop command and handoff say."""
    docs = load_docs(inputs)
    plan = planner.build_plan(docs, {}, load_epyc(), facts_for(docs))
    assert {"argv", "env", "stop_command", "summary_markdown", "base_url"} <= plan.keys()
    for field in plan.keys() - {"ok"}:  # ok: the printed verdict, not a field the plan renders
        assert planner.plan_differences({**plan, field: "edited"}, plan) == [field]
    assert planner.plan_differences({**plan, "extra": 1}, plan) == ["extra"]
    assert planner.plan_differences(plan, plan) == []


def test_a_host_plan_preloads_the_library_validate_found(inputs):
    docs = load_docs(inputs)
    lib = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
    docs["validate"].update(
        path="host", runtime="host", image=None, python=sys.executable, ld_preload={"value": lib, "note": None}
    )
    assert planner.build_plan(docs, {}, load_epyc(), facts_for(docs))["env"]["LD_PRELOAD"] == lib
    assert "LD_PRELOAD" not in planner.build_plan(docs, {"sizing": "vllm-default"}, load_epyc(), facts_for(docs))["env"]


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: t.update(container_cpuset_argv=["--cpuset-cpus=96-191,288-383", "--cpuset-mems=0"]),
        lambda t: t.update(container_cpuset_argv=["--cpuset-cpus=96-191,288-383", "--cpuset-mems=99999"]),
        lambda t: t.update(container_cpuset_argv=["--cpuset-cpus=96-191,288-383", "--cpuset-mems=0-1"]),
        lambda t: t.update(container_cpuset_argv=["--cpuset-cpus=0-95", "--cpuset-mems=1"]),  # socket 0's, bind 96-191
        lambda t: t.update(host_pin_argv=["taskset", "-c", "0-95"]),
        lambda t: t.update(host_pin_argv=["numactl", "--cpunodebind=1", "--membind=0"]),
    ],
)
def test_the_container_is_pinned_to_the_nodes_and_cpus_cpu_tune_sized(inputs, edit):
    """Twenty-sixth audit, F5: `"cpus" in flag` was true for --cpuset-mems (cpuset), so a container's memory
    node was never compared with the nodes cpu_tune sized, and its CPUs never with the bind; the host's
    numactl twin was refused."""
    docs = load_docs(inputs)
    assert docs["cpu_tune"]["numa_nodes"] == [1] and docs["cpu_tune"]["vllm_cpu_omp_threads_bind"] == "96-191"
    planner.build_plan(docs, {}, load_epyc(), facts_for(docs))  # as cpu_tune made it: planned
    edit(docs["cpu_tune"])
    with pytest.raises(ScriptError) as err:
        planner.build_plan(docs, {}, load_epyc(), facts_for(docs))
    assert "cpu_tune" in err.value.error and "unmodified output of cpu_tune.py" in err.value.fix


# ---- TLS when exposed (issue 52): the pair is checked at plan time, by path, each bad one refused with a fix
def tls_plan(inputs, tmp_path, **opt):
    """An exposed, keyed plan of the test documents with these TLS options, its facts read as launch.py reads them."""
    from epyc.facts import shell

    docs = load_docs(inputs)
    opt = {"expose": True, "api_key_env": "MY_KEY", **opt}
    return planner.build_plan(
        docs, opt, load_epyc(), {**facts_for(docs, api_key_set=True), "tls": shell.tls_facts(opt, "localhost")}
    )


def test_an_exposed_plan_serves_tls_with_the_pair_by_path(inputs, tmp_path):
    import socket

    cert, key = cert_pair(tmp_path / "pair", names=(socket.gethostname(),))
    plan = tls_plan(inputs, tmp_path, tls_cert=str(cert), tls_key=str(key))
    argv, target = plan["argv"], command.TLS_TARGET  # a container: the files mounted read-only, by path
    assert (
        argv[argv.index("--ssl-certfile") + 1] == target["cert"]
        and argv[argv.index("--ssl-keyfile") + 1] == target["key"]
    )
    assert f"{cert}:{target['cert']}:ro" in argv and f"{key}:{target['key']}:ro" in argv
    assert plan["tls"] == {"cert": str(cert), "key": str(key), "ca": str(cert), "name": socket.gethostname()}
    assert plan["base_url"] == f"https://{socket.gethostname()}:{plan['port']}/v1"
    assert dict(plan["summary"])["TLS"].endswith(f"clients trust {cert}")
    assert "PRIVATE KEY" not in json.dumps(plan) and key.read_text().split("\n")[1] not in json.dumps(plan)


@pytest.mark.parametrize(
    "case,needle,fix",
    [
        ("expired", "expired on", "renew it"),
        ("not yet valid", "not valid before", "clock"),
        ("wrong key", "is not this certificate's", "the key it was made with"),
        ("wrong name", "does not name elsewhere.example", "--tls-name"),
        ("unreadable", "not a readable PEM certificate", "this user can read them"),
        ("not PEM", "not a readable PEM certificate", "this user can read them"),
    ],
)
def test_a_bad_certificate_is_refused_at_plan_time_with_a_fix(inputs, tmp_path, case, needle, fix):
    days = {"expired": (-10, -1), "not yet valid": (2, 30)}.get(case, (-1, 30))
    cert, key = cert_pair(tmp_path / "pair", names=("localhost",), days=days)
    if case == "wrong key":
        key = cert_pair(tmp_path / "other")[1]
    if case == "unreadable":
        key = tmp_path / "no-such-key.pem"
    if case == "not PEM":
        cert.write_text("not a certificate\n")
    name = "elsewhere.example" if case == "wrong name" else "localhost"
    with pytest.raises(ScriptError) as exc:
        tls_plan(inputs, tmp_path, tls_cert=str(cert), tls_key=str(key), tls_name=name)
    assert needle in exc.value.error and fix in exc.value.fix and "tls-selfsigned" in exc.value.fix
    assert "PRIVATE KEY" not in exc.value.error + exc.value.fix


def test_exposed_without_tls_is_refused_unless_plain_http_is_asked_for_by_name(inputs, tmp_path):
    with pytest.raises(ScriptError) as exc:
        tls_plan(inputs, tmp_path)
    assert "needs TLS" in exc.value.error and "--tls-cert" in exc.value.fix and "--plain-http" in exc.value.fix
    plan = tls_plan(inputs, tmp_path, plain_http=True)
    assert plan["tls"] is None and "--ssl-certfile" not in plan["argv"]
    assert "cross the network in clear" in dict(plan["summary"])["TLS"]


@pytest.mark.parametrize(
    "opt,needle",
    [
        ({"tls_key": "k.pem"}, "go together"),
        ({"tls_cert": "c", "tls_key": "k", "tls_name": "fe80::1"}, "not a host name"),
    ],
)
def test_a_key_alone_or_a_name_no_https_address_can_hold_is_refused_with_a_fix(opt, needle):
    """Review of issue 52: a key alone read '' (IsADirectoryError); an IPv6 literal broke the https base_url."""
    from epyc.facts import shell

    with pytest.raises(ScriptError) as exc:
        shell.tls_facts(opt, "localhost")
    assert needle in exc.value.error and exc.value.fix


def test_a_tls_pair_without_expose_is_refused_as_nothing_would_ask_for_the_key(inputs, tmp_path):
    """Review of issue 52: an unexposed fleet with a pair put nginx on all interfaces in front of a keyless router."""
    cert, key = cert_pair(tmp_path / "pair", names=("localhost",))
    with pytest.raises(ScriptError) as exc:
        tls_plan(inputs, tmp_path, expose=False, api_key_env=None, tls_cert=str(cert), tls_key=str(key))
    assert "without --expose" in exc.value.error and "--expose --api-key-env" in exc.value.fix


@pytest.mark.parametrize("runtime", ["docker", "host"])
def test_a_plan_for_another_host_prints_only_that_hosts_paths_and_the_line_that_plans_it_there(
    runtime, inputs, tmp_path, monkeypatch
):
    """Issue 52: every command a plan for another host prints runs there as printed. Its home (read over ssh, or
    in its capture) differs from this machine's: the HF cache, the state dir and its secrets mount, the host
    venv are under it, no path of this machine is in any command, and the one line that renders the plan on the
    host from a copy of the bundle carries the plan's flags."""
    import validate as validate_cli
    from epyc.deployments.runs import DEFAULT
    from epyc.facts import shell

    here = tmp_path / "here"
    monkeypatch.setenv("HOME", str(here))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    docs = load_docs(inputs)
    docs["detect"].update(target="alice@box", home="/home/alice")
    docs["cpu_tune"]["target"] = "alice@box"
    docs["check_model"].update(model="Qwen/Qwen3-0.6B", model_dir=None)  # a folder here is item 3's
    docs["estimate_memory"].update(model="Qwen/Qwen3-0.6B", model_dir=None)
    (tmp_path / "d.json").write_text(json.dumps(docs["detect"]))
    args = ["--detect", str(tmp_path / "d.json"), "--runtime", runtime, "--run", str(tmp_path / DEFAULT)]
    docs["validate"], code = validate_cli.main(args)  # nothing probed: another host's facts are assumed
    assert code == 0 and docs["validate"]["home"] == "/home/alice"
    docs["check_model"]["vllm_version"] = docs["validate"]["stack"]["vllm"]  # the host path's pinned vLLM
    opts = {
        "model": "Qwen/Qwen3-0.6B",
        "expose": True,
        "api_key_env": "BOX_KEY",
        "max_model_len": 4096,
        "plain_http": True,
    }
    plan = planner.build_plan(docs, opts, load_epyc(), facts_for(docs, api_key_set=True))
    printed = [plan["command"], *map(" ".join, plan["pre_argv"]), plan["stop_command"], plan["on_host_command"]]
    for text in [*printed, plan["summary_markdown"]]:
        assert str(tmp_path) not in text and str(here) not in text and str(ROOT) not in text, text
    cache = "/home/alice/.cache"
    assert plan["state_dir"] == f"{cache}/serving-llms-on-epyc/run/up"  # where the one line (up) keeps it there
    if runtime == "docker":
        assert f"{cache}/huggingface/hub:/root/.cache/huggingface/hub" in plan["argv"]
        assert f"{cache}/serving-llms-on-epyc/run/up/secrets:/run/secrets/serving-llms-on-epyc:ro" in plan["argv"]
    else:
        assert plan["argv"][3] == f"{cache}/serving-llms-on-epyc/venv-vllm-0.32.0/bin/vllm"
    line = "python3 scripts/launch.py up --model Qwen/Qwen3-0.6B --max-model-len 4096 --expose --api-key-env BOX_KEY"
    assert plan["on_host_command"].startswith(line)
    assert ("--python " in plan["on_host_command"]) is (runtime == "host")  # the host path's venv there
    assert f"| On the host | {plan['on_host_command']} |" in plan["summary_markdown"]
    # TLS there: the pair is that host's, by its absolute paths, read and checked there by up, never here
    tls = {**opts, "plain_http": None, "tls_cert": "/home/alice/tls/cert.pem", "tls_key": "/home/alice/tls/key.pem"}
    tls["tls_name"] = "box.example"
    facts = {**facts_for(docs, api_key_set=True), "tls": shell.shell_facts(tls, docs)["tls"]}
    plan = planner.build_plan(docs, tls, load_epyc(), facts)
    assert plan["tls"] == {
        "cert": "/home/alice/tls/cert.pem",
        "key": "/home/alice/tls/key.pem",
        "ca": None,
        "name": "box.example",
    }
    for text in [plan["command"], plan["on_host_command"], plan["summary_markdown"]]:
        assert str(tmp_path) not in text and str(here) not in text and str(ROOT) not in text, text
    assert "--tls-cert /home/alice/tls/cert.pem --tls-key /home/alice/tls/key.pem" in plan["on_host_command"]
    assert ("/home/alice/tls/key.pem:/run/secrets/serving-llms-on-epyc-tls/key.pem:ro" in plan["argv"]) is (
        runtime == "docker"
    )
    assert "the TLS pair (checked there by launch.py up) are assumed" in dict(plan["summary"])["Planned for"]
    with pytest.raises(ScriptError) as exc:
        shell.shell_facts({**tls, "tls_key": "~/key.pem"}, docs)
    assert "must be absolute" in exc.value.error


# ---- the stack a plan serves on (data/epyc.json `stacks`): one known to meet its needs, or it says what is not
def test_an_architecture_only_the_measured_stack_lists_is_planned_on_its_local_image(inputs):
    """ExaoneMoeForCausalLM is in vLLM 0.32's registry, not 0.25.1's: the container plan goes to the locally built
    image of the measured stack, says why, and names the one command that builds it."""
    docs, epyc = load_docs(inputs), load_epyc()
    docs["check_model"]["architectures"] = ["ExaoneMoeForCausalLM"]
    plan = planner.build_plan(docs, {}, epyc, facts_for(docs))
    local = epyc["stacks"]["local_image"]["image"]
    assert plan["stack"]["name"] == "local_image" and plan["image"] == local and local in plan["argv"]
    assert PINNED not in plan["argv"] and plan["vllm_version"] == epyc["host_stack"]["vllm_version"]
    assert plan["pre_argv"][1][-3:] == ["image", "inspect", local]  # built here: looked for, never pulled
    why = "the seed's image (amdih) is not known to run ExaoneMoeForCausalLM (not in vLLM 0.25.1's registry)"
    assert plan["stack"]["why"] == why + "; this one is" and plan["stack"]["unverified"] == []
    path = dict(plan["summary"])["Path"]
    assert (
        "vLLM 0.32.0 + zentorch 2.13.0.1" in path
        and "set it up first: python3 scripts/setup_host_stack.py --image" in path
    )
    (warn,) = [w for w in plan["warnings"] if w["check"] == "stack"]
    assert warn["fix"] == "python3 scripts/setup_host_stack.py --image"


def test_the_local_image_is_chosen_only_for_docker_whose_store_holds_it(inputs):
    """With podman the image built into docker's store is invisible: the plan keeps validate's image, says what it
    is not known to run, and names the local image (for docker) as what would."""
    docs, epyc = load_docs(inputs), load_epyc()
    docs["check_model"]["architectures"], docs["validate"]["runtime"] = ["ExaoneMoeForCausalLM"], "podman"
    stack = planner.build_plan(docs, {}, epyc, facts_for(docs))["stack"]
    assert stack["name"] == "seed_image" and stack["unverified"] and stack["why"] is None
    assert stack["instead"].startswith(epyc["stacks"]["local_image"]["label"] + " is known to (docker): python3 ")
    assert "setup_host_stack.py --image" in stack["instead"]


def test_a_need_no_stack_of_the_path_is_known_to_meet_is_said_with_the_one_that_is(inputs):
    """An AWQ checkpoint on the container path: neither image was seen to serve AWQ; the seed's image is kept, the
    plan says so and names the host stack (seen to), and a stack nothing is known of is never swapped."""
    docs, epyc = load_docs(inputs), load_epyc()
    docs["check_model"]["quantization"] = {"method": "awq"}
    plan = planner.build_plan(docs, {}, epyc, facts_for(docs))
    assert plan["stack"]["name"] == "seed_image" and plan["image"] == PINNED
    assert plan["stack"]["unverified"] == ["awq checkpoints"] and "host venv" in plan["stack"]["instead"]
    docs["validate"]["image"] = "registry.example/own:1"  # the user's own image: kept, every need unverified
    docs["validate"]["stack"]["vllm"] = docs["check_model"]["vllm_version"] = "0.30.0"
    own = planner.build_plan(docs, {}, epyc, facts_for(docs))["stack"]
    assert own["name"] is None and own["image"] == "registry.example/own:1" and own["unverified"] == ["awq checkpoints"]


def test_a_host_venv_of_other_versions_is_no_row_of_the_stacks(inputs, tmp_path):
    """The host path's row is matched by the pins the probe read: a venv of another vLLM claims nothing."""
    docs, epyc = load_docs(inputs), load_epyc()
    docs["validate"].update(path="host", runtime="host", image=None, python=sys.executable)
    docs["validate"]["stack"]["vllm"] = docs["check_model"]["vllm_version"] = "0.30.0"
    assert plan_checks.stack_found(docs["validate"], [architectures.stack_row(epyc, n) for n in epyc["stacks"]]) == {
        "name": None,
        "label": f"the venv of {sys.executable}",
        "image": None,
        "vllm": "0.30.0",
    }
    docs["validate"]["stack"].update(
        vllm=epyc["host_stack"]["vllm_version"], zentorch=epyc["host_stack"]["zentorch_version"]
    )
    rows = [architectures.stack_row(epyc, n) for n in epyc["stacks"]]
    assert plan_checks.stack_found(docs["validate"], rows)["name"] == "host_stack"
