"""Property-based tests (hypothesis) over every parser at the bundle's boundaries.

The property is the contract a user relies on: any input ends as a result or as the documented
refusal (ScriptError / ValueError / argparse's type error, which the scripts turn into JSON with
`error` and `fix`), never another exception, never NaN in a document, never a hang, and never a file
written outside its folder. The table of bad-input classes and where each is tested: tests/BAD_INPUT.md.
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
from pathlib import Path

import pytest
from conftest import run_script
from epyc import argtypes, bundle, errors, jsonio, masking
from epyc.decisions import handoff
from epyc.deployments import process, serve_state
from epyc.errors import ScriptError
from epyc.facts import cpuid, hf_model, hostfacts, hostspec, kv_cache, remote_host
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FAST = settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
EPYC = bundle.load_epyc()

json_scalars = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False) | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=4),
    max_leaves=20,
)


# ---------------------------------------------------------------- host files (detect, cpu_tune)


@FAST
@given(st.text(max_size=2000))
def test_cpuinfo_parser_returns_facts_or_valueerror(text):
    try:
        cpu = hostfacts.parse_cpuinfo(text)
    except ValueError:
        return
    assert set(cpu) == {"vendor", "brand", "family", "model", "flags"}
    assert cpu["family"] is None or isinstance(cpu["family"], int)


@FAST
@given(st.text(alphabet="0123456789,- \n", max_size=60))
def test_cpulist_parser_round_trips_or_refuses(text):
    try:
        cpus = hostfacts.parse_cpulist(text)
    except ValueError:
        return
    assert cpus == sorted(set(cpus)) and all(c >= 0 for c in cpus)
    assert hostfacts.parse_cpulist(hostfacts.format_cpulist(cpus)) == cpus


@FAST
@given(st.text(max_size=300), st.text(max_size=300))
def test_meminfo_and_cgroup_parsers_never_raise(meminfo, cgroup):
    value = hostfacts.parse_meminfo_bytes(meminfo)
    assert value is None or (isinstance(value, int) and value >= 0)
    limit = hostfacts.parse_cgroup_limit(cgroup)
    assert limit is None or (isinstance(limit, int) and limit > 0)
    try:
        allowed = hostfacts.parse_status_allowed(cgroup)
    except ValueError:
        return
    assert allowed is None or all(isinstance(c, int) for c in allowed)


@FAST
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "/proc/cpuinfo",
                    "proc/cpuinfo",
                    "../escape",
                    "/etc/../../x",
                    "/sys/a/../../../b",
                    "/ok/f",
                    "",
                    "/",
                    "/a/./b",
                    "/proc",
                    "/proc/x",
                    "/p\0q",
                    "/" + "n" * 300,
                    "/a//b",
                ]
            ),
            st.text(max_size=40),
        ),
        max_size=5,
    )
)
def test_captured_dump_never_writes_outside_its_folder(tmp_path_factory, parts):
    """The ssh dump of detect.py --host is the remote host's text: written as a capture, or a clear error."""
    dest = tmp_path_factory.mktemp("unpack") / "tree"
    dest.mkdir()
    text = "\n".join(f"{hostspec.DUMP_MARK} {path}\n{body}" for path, body in parts)
    try:
        hostspec.read_dump(text, dest, "box over ssh")
    except ScriptError as exc:
        assert "box over ssh" in exc.error and exc.fix
    for p in dest.parent.rglob("*"):
        assert p == dest or dest.resolve() in p.resolve().parents


@FAST
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "cpu_model": st.text(max_size=30),
            "vendor": st.sampled_from(["AuthenticAMD", "GenuineIntel", "", None]),
            "is_amd_epyc": st.booleans(),
            "avx512": st.booleans(),
            "avx512_bf16": st.booleans(),
            "epyc_generation": st.sampled_from(["Genoa", "Turin", "Milan", "Bergamo", "unknown", None]),
        },
    ),
    st.booleans(),
)
def test_routing_always_gives_one_of_the_documented_routes(facts, stock):
    r = cpuid.route_host(facts, EPYC["supported_generations"], stock)
    assert r["route"] in ("zentorch", "confirm", "stock", "stock_offer", "stop") and r["reason"]
    if not facts.get("is_amd_epyc") and not stock:
        assert r["route"] == "stop"  # never zentorch, never a silent stock path
    if stock:
        assert r["route"] == "stock"


# ---------------------------------------------------------------- model files (check_model, estimate_memory)


@FAST
@given(json_values)
def test_safetensors_header_tensors_or_valueerror(header):
    try:
        tensors = hf_model.tensors_from_header(header) if isinstance(header, dict) else {}
    except ValueError:
        return
    assert all(n >= 0 for _, n in tensors.values())
    assert hf_model.weight_bytes(tensors, "bfloat16", False) >= 0


@FAST
@given(st.binary(max_size=200))
def test_safetensors_file_of_any_bytes(tmp_path_factory, data):
    f = tmp_path_factory.mktemp("st") / "x.safetensors"
    f.write_bytes(data)
    try:
        header = hf_model.read_safetensors_header(f)
    except (ValueError, struct.error):
        return
    assert isinstance(header, dict)


config_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10**7),
    st.text(max_size=5),
    st.lists(st.sampled_from(["full_attention", "sliding_attention", "linear_attention", 3]), max_size=6),
    st.floats(allow_nan=True),
    st.sampled_from(["falcon", "RefinedWeb", "chatglm", "dbrx"]),
    st.dictionaries(st.just("kv_n_heads"), st.one_of(st.integers(-2, 200), st.text(max_size=2))),
)
config_keys = [
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_size",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "max_position_embeddings",
    "sliding_window",
    "layer_types",
    "attn_layer_period",
    "attn_layer_offset",
    "full_attention_interval",
    "sliding_window_pattern",
    "use_sliding_window",
    "hybrid_override_pattern",
    "model_type",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "mamba_num_heads",
    "mamba_head_dim",
    "ssm_state_size",
    "n_groups",
    "conv_kernel",
    "mamba_expand",
    "mamba_d_state",
    "mamba_d_conv",
    "state_size",
    "expand",
    "num_kv_heads",
    "n_head_kv",
    "multi_query_group_num",
    "n_heads",
    "n_layers",
    "new_decoder_architecture",
    "multi_query_attention",
    "multi_query",
    "attn_config",
    "seq_length",
    "n_positions",
    "model_max_length",
]


@FAST
@given(st.dictionaries(st.sampled_from(config_keys), config_values, max_size=10))
def test_any_config_is_checked_then_sized_or_refused(cfg):
    """What passes the config schema is sized without another exception, with whole non-negative counts."""
    try:
        jsonio.check_schema(cfg, "model_config", "config.json", "fix it")
    except ScriptError:
        return
    try:
        layout = kv_cache.kv_layout(cfg)
    except ScriptError:
        return
    assert layout["bytes_per_token"] >= 0 and min(layout["full"], layout["sliding"], layout["none"]) >= 0
    assert layout["max_position_embeddings"] is None or layout["max_position_embeddings"] >= 16
    assert layout["recurrent_state_bytes"] is None or layout["recurrent_state_bytes"] > 0
    short, long = (kv_cache.kv_bytes_for(layout, n, 128, 2048) for n in (1024, 4096))
    assert 0 <= short <= long  # a longer context never needs less


@SLOW
@given(
    st.dictionaries(
        st.sampled_from(config_keys + ["architectures", "text_config"]), config_values | json_values, max_size=8
    )
)
def test_estimate_memory_script_on_any_config(tmp_path_factory, cfg):
    folder = tmp_path_factory.mktemp("model")
    (folder / "config.json").write_text(json.dumps(cfg))
    r = run_script("estimate_memory.py", "--model", str(folder), "--ram-gb", "24", "--weight-gb", "1", timeout=60)
    assert r.code in (0, 1)
    json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"non-finite {c} in the JSON"))  # text may quote it


# ---------------------------------------------------------------- documents between scripts (plan, state)


@FAST
@given(json_values)
def test_plan_schema_check_accepts_or_names_the_field(doc):
    try:
        jsonio.check_schema(doc, "plan", "plan", "plan again")
    except ScriptError as exc:
        assert exc.error.startswith("plan: field ")


@SLOW
@given(json_values)
def test_launch_verbs_on_any_plan_document(tmp_path_factory, doc):
    d = tmp_path_factory.mktemp("plan")
    f = d / "plan.json"
    f.write_text(json.dumps(doc))
    before = sorted(p.name for p in d.iterdir())
    for verb in ("stop", "handoff"):
        r = run_script("launch.py", verb, "--plan", str(f), timeout=60)
        assert r.code in (0, 1)
    assert sorted(p.name for p in d.iterdir()) == before  # nothing written or removed beside it


def test_deeply_nested_json_is_a_clear_refusal(tmp_path):
    f = tmp_path / "deep.json"
    f.write_text("[" * 100000 + "]" * 100000)
    r = run_script("launch.py", "stop", "--plan", str(f))
    assert r.code == 1 and "nested too deeply" in r.doc["error"]


@FAST
@given(json_values)
def test_state_file_of_any_content_is_not_trusted(tmp_path_factory, doc):
    d = tmp_path_factory.mktemp("state")
    text = json.dumps(doc)
    (d / "state.json").write_text(text)
    plan = {"state_file": str(d / "state.json")}
    try:
        state = serve_state.read_state(plan)
    except errors.ScriptError as err:  # a number JSON does not have: start never writes one, so it was edited
        assert "it was edited" in err.error and ("NaN" in text or "Infinity" in text), (text, err.error)
        return
    assert state is None or isinstance(state, dict)
    if state is not None:  # whatever it says, only a live group started at its recorded time is ours
        members = process.group_members(state)
        assert members == [] or (isinstance(state.get("pgid"), int) and state["pgid"] > 1)


# ---------------------------------------------------------------- server replies (verify)


@FAST
@given(st.integers(0, 600), json_values | st.text(max_size=200), st.sampled_from(["chat_completions", "completions"]))
def test_judge_smoke_never_raises_and_never_echoes_the_key(status, body, endpoint):
    secret = "sk-property-secret-123"
    text = body if isinstance(body, str) else json.dumps(body)
    text = text.replace("x", secret)  # put the key wherever a server might reflect it
    ok, detail = handoff.judge_smoke(status, text, endpoint, [secret])
    assert isinstance(ok, bool) and isinstance(detail, str) and secret not in detail


@FAST
@given(st.text(max_size=300))
def test_redact_masks_bearer_tokens(text):
    out = masking.redact(f"{text} Authorization: Bearer sk-abc123 {text}", [])
    assert "sk-abc123" not in out


# ---------------------------------------------------------------- flags


@FAST
@given(st.text(max_size=30))
def test_numeric_flag_types_give_a_finite_value_in_range_or_refuse(text):
    for parse, lo, hi in ((argtypes.int_in(1, 65535), 1, 65535), (argtypes.float_in(0, 100), 0, 100)):
        try:
            v = parse(text)
        except argparse.ArgumentTypeError:
            continue
        assert math.isfinite(v) and lo <= v <= hi


@FAST
@given(st.text(max_size=40))
def test_names_that_reach_argv_or_shell_never_look_like_options(text):
    for check in (argtypes.image_ref, argtypes.env_name):
        try:
            v = check(text)
        except argparse.ArgumentTypeError:
            continue
        assert not v.startswith("-") and " " not in v and "$" not in v and "`" not in v
    try:
        target = remote_host.parse_host(text)
    except ScriptError:
        return
    assert not target.host.startswith("-")


@SLOW
@given(
    st.sampled_from(["--port", "--max-model-len", "--num-prompts", "--timeout"]),
    st.sampled_from(["-1", "0", "nan", "inf", "-inf", "1e99", "", "x", "0x10"]),
)
def test_up_refuses_bad_numbers_before_doing_anything(flag, value):
    r = run_script("launch.py", "up", flag, value, "--state-dir", "/nonexistent/never-created", timeout=60)
    assert r.code == 1 and r.doc["error"].startswith(f"bad arguments: argument {flag}")
    assert not Path("/nonexistent/never-created").exists()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
