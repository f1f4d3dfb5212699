"""Both model scripts against a local Hub server through HF_ENDPOINT: the real huggingface_hub client
code runs, including its error mapping. No weights are downloaded."""

import time

import pytest
from hub_server import Hub
from model_fixtures import model_folder
from test_estimate_memory import QWEN3_06B_PARAMS

SECRET = "hf_secret_token_value_1234"


@pytest.fixture
def hub(tmp_path):
    h = Hub().start()
    h.add_folder("Qwen/Qwen3-0.6B", model_folder("Qwen3-0.6B", tmp_path / "m"))
    h.add_folder(
        "meta-llama/Llama-3.1-8B-Instruct",
        model_folder("Llama-3.1-8B-Instruct", tmp_path / "m"),
        gated=True,
        allowed_tokens={"hf_granted"},
    )
    h.add_folder("allenai/OLMo-2-0425-1B", model_folder("OLMo-2-0425-1B", tmp_path / "m"))
    yield h
    h.stop()


@pytest.fixture
def env(hub, tmp_path):
    e = {
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_ETAG_TIMEOUT": "3",
        "HF_HUB_DOWNLOAD_TIMEOUT": "3",
        "HF_HUB_DISABLE_XET": "1",
    }
    return e


def no_env_token(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)


def test_hub_model_checks_and_estimates_without_downloading_weights(script, hub, env, monkeypatch):
    no_env_token(monkeypatch)
    r = script("check_model.py", "--model", "Qwen/Qwen3-0.6B", "--vllm-version", "0.32.0", env=env)
    assert r.code == 0 and r.doc["source"] == "hub" and r.doc["primary_endpoint"] == "chat_completions"
    assert r.doc["gated"] is False and r.doc["warnings"] == []  # the Hub said so: no token needed on the host
    e = script("estimate_memory.py", "--model", "Qwen/Qwen3-0.6B", "--ram-gb", "24", env=env)
    assert e.code == 0 and e.doc["weight_source"] == "safetensors_metadata"
    assert e.doc["weight_bytes"] == QWEN3_06B_PARAMS * 2  # tied lm_head skipped, as from local headers
    weight_gets = [r for r in hub.requests if r[0] == "GET" and r[1].endswith(".safetensors")]
    assert weight_gets and all(rng and rng.startswith("bytes=") for *_, rng in weight_gets)


def test_float32_hub_checkpoint(script, env, monkeypatch):
    no_env_token(monkeypatch)
    from test_estimate_memory import OLMO2_1B_PARAMS

    e = script("estimate_memory.py", "--model", "allenai/OLMo-2-0425-1B", env=env)
    assert e.doc["weight_bytes"] == OLMO2_1B_PARAMS * 2


def test_offline_uses_the_cache(script, env, monkeypatch):
    no_env_token(monkeypatch)
    assert script("check_model.py", "--model", "Qwen/Qwen3-0.6B", "--vllm-version", "0.32.0", env=env).code == 0
    off = {**env, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:1"}
    r = script("check_model.py", "--model", "Qwen/Qwen3-0.6B", "--vllm-version", "0.32.0", env=off)
    assert r.code == 0 and r.doc["source"] == "hub-cache" and r.doc["primary_endpoint"] == "chat_completions"
    e = script("estimate_memory.py", "--model", "Qwen/Qwen3-0.6B", "--weight-gb", "1.11", "--ram-gb", "8", env=off)
    assert e.code == 0 and e.doc["kv_bytes_per_token"] == 114_688
    # not cached + offline: check proceeds undetermined, estimate cannot
    r = script("check_model.py", "--model", "Qwen/Other", env=off)
    assert r.code == 0 and r.doc["kind"] == "undetermined" and r.doc["unreadable_reason"] == "offline"
    assert script("estimate_memory.py", "--model", "Qwen/Other", env=off).code == 1


def test_gated_without_token(script, env, monkeypatch):
    no_env_token(monkeypatch)
    r = script("check_model.py", "--model", "meta-llama/Llama-3.1-8B-Instruct", env=env)
    assert r.code == 0 and r.doc["kind"] == "undetermined" and r.doc["unreadable_reason"] == "gated"
    assert "HF_TOKEN" in r.doc["fix"] and r.doc["gated"] is True and "HF_TOKEN" in r.doc["warnings"][0]["fix"]
    e = script("estimate_memory.py", "--model", "meta-llama/Llama-3.1-8B-Instruct", env=env)
    assert e.code == 1 and "gated" in e.doc["error"] and "HF_TOKEN" in e.doc["fix"]


def test_gated_license_not_accepted_never_prints_the_token(script, env):
    env = {**env, "HF_TOKEN": SECRET}
    r = script("check_model.py", "--model", "meta-llama/Llama-3.1-8B-Instruct", env=env)
    assert r.code == 0 and r.doc["unreadable_reason"] == "gated" and "license" in r.doc["fix"]
    e = script("estimate_memory.py", "--model", "meta-llama/Llama-3.1-8B-Instruct", env=env)
    assert e.code == 1
    for out in (r.stdout, r.stderr, e.stdout, e.stderr):
        assert SECRET not in out


def test_gated_with_access(script, env, hub):
    env = {**env, "HF_TOKEN": "hf_granted"}
    r = script("check_model.py", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--vllm-version", "0.32.0", env=env)
    assert r.code == 0 and r.doc["kind"] == "text" and r.doc["primary_endpoint"] == "chat_completions"
    # readable with this token, and still gated: the host that downloads it needs one too
    assert r.doc["gated"] is True and "gated on the Hub" in r.doc["warnings"][0]["message"]
    assert any(auth == "Bearer hf_granted" for _, _, auth, _ in hub.requests)
    assert "hf_granted" not in r.stdout + r.stderr


def test_not_found_and_bad_revision_are_errors(script, env, monkeypatch):
    no_env_token(monkeypatch)
    r = script("check_model.py", "--model", "nobody/nothing", env=env)
    assert r.code == 1 and "no such model" in r.doc["error"]
    r = script("check_model.py", "--model", "Qwen/Qwen3-0.6B", "--revision", "v9", env=env)
    assert r.code == 1 and "revision" in r.doc["error"]


def test_server_error_is_bounded_and_named(script, env, monkeypatch):
    # huggingface_hub retries 5xx with backoff for ~90 s; the scripts' deadline bounds it and says why
    no_env_token(monkeypatch)
    t0 = time.monotonic()
    r = script("check_model.py", "--model", "err/server-error", "--hub-timeout", "4", env=env)
    assert time.monotonic() - t0 < 15
    assert r.code == 0 and r.doc["kind"] == "undetermined" and "did not answer within 4s" in r.doc["message"]
    e = script("estimate_memory.py", "--model", "err/server-error", "--hub-timeout", "4", env=env)
    assert e.code == 1 and "did not answer within 4s" in e.doc["error"]


def test_unreachable_hub(script, env, monkeypatch):
    no_env_token(monkeypatch)
    down = {**env, "HF_ENDPOINT": "http://127.0.0.1:1"}
    t0 = time.monotonic()
    r = script("check_model.py", "--model", "Qwen/Qwen3-0.6B", "--hub-timeout", "10", env=down)
    # asked once, said at once (no client retries, each with its warning), with the offline way out
    assert time.monotonic() - t0 < 8 and r.stderr.count("127.0.0.1:1") <= 1
    assert r.code == 0 and r.doc["kind"] == "undetermined" and r.doc["unreadable_reason"] == "network"
    assert "did not answer" in r.doc["message"] and "--config" in r.doc["fix"]
    e = script("estimate_memory.py", "--model", "Qwen/Qwen3-0.6B", "--hub-timeout", "10", env=down)
    assert e.code == 1 and e.doc["fix"]


def test_hanging_hub_times_out(script, env, hub, monkeypatch):
    no_env_token(monkeypatch)
    hub.hang_seconds = 30
    t0 = time.monotonic()
    r = script("check_model.py", "--model", "err/hang", "--hub-timeout", "5", env=env)
    assert time.monotonic() - t0 < 15
    assert r.code == 0 and r.doc["kind"] == "undetermined" and r.doc["unreadable_reason"] == "timeout"
