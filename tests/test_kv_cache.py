"""epyc.facts.kv_cache: its decisions, tested in-process."""

import pytest
from conftest import CODESTRAL, MINICPM3, estimate
from epyc import errors
from epyc.errors import ScriptError
from epyc.facts import kv_cache


def test_minicpm3_caches_every_heads_k_and_v_not_a_latent(script, tmp_path):
    """F2: any kv_lora_rank was sized as DeepSeek's MLA latent (576 B a token and layer). vLLM 0.32 keeps the
    latent only for its MLA model types; MiniCPM3's model decompresses it and caches K and V of its 40 heads,
    96 wide: 27x the bytes. A 4B model at 32k context "fit" in 24 GiB needing 39."""
    r = estimate(script, tmp_path, "MiniCPM3-4B", MINICPM3, "--weight-gb", "7.6", "--max-model-len", "32768")
    assert r.code == 1 and r.doc["error"].startswith("does not fit: 38.66 GiB required"), r.doc
    assert r.doc["kv_attention"] == "mha" and r.doc["kv_bytes_per_token"] == 2 * 40 * 96 * 2 * 62
    # a DeepSeek type with the same fields is still the latent: kv_lora_rank + qk_rope_head_dim
    lay = kv_cache.kv_layout({**MINICPM3, "model_type": "deepseek_v3"})
    assert (lay["attention"], lay["bytes_per_token_per_layer"]) == ("mla", (256 + 32) * 2)
    # a kv_lora_rank with no head widths is refused, never sized as 0 bytes
    with pytest.raises(errors.ScriptError, match="kv_lora_rank without qk_nope_head_dim"):
        kv_cache.kv_layout({k: v for k, v in MINICPM3.items() if not k.startswith("qk_")})


def test_the_review_of_the_sizing_fixes(script, tmp_path):
    """The review: a multimodal wrapper whose text_config names no model_type (Kimi-K2.5's shape) is read
    under the parent's type, and vLLM gives its language model the DeepSeek type: the latent, not 85x more.
    A Mamba model's notes speak of no attention page it does not have."""
    kimi = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": {
            "num_hidden_layers": 61,
            "num_attention_heads": 64,
            "hidden_size": 7168,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 128,
            "max_position_embeddings": 262144,
        },
    }
    lay = kv_cache.kv_layout(kimi)
    assert (lay["attention"], lay["bytes_per_token_per_layer"]) == ("mla", (512 + 64) * 2)
    r = estimate(script, tmp_path, "Mamba-Codestral-7B-v0.1", CODESTRAL, "--weight-gb", "14.6")
    note = next(n for n in r.doc["notes"] if "mamba2 layers keep a recurrent state" in n)
    assert note.endswith("no attention layer: nothing grows with the length") and "attention pages" not in note


def test_a_layer_layout_that_does_not_describe_every_layer_is_an_error():
    base = {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128}
    with pytest.raises(ScriptError, match="1 entries for 28 layers"):
        kv_cache.kv_layout({**base, "layer_types": ["full_attention"]})
    with pytest.raises(ScriptError, match="'x'"):
        kv_cache.kv_layout({**base, "layer_types": ["x"] * 28})
    with pytest.raises(ScriptError, match="3 characters for 28 layers"):
        kv_cache.kv_layout({**base, "hybrid_override_pattern": "M*M"})
    ok = kv_cache.kv_layout({**base, "layer_types": ["full_attention"] * 27 + ["conv"]})
    assert (ok["full"], ok["sliding"], ok["none"]) == (27, 0, 1)


@pytest.mark.parametrize(
    "layout,needle",
    [
        ({"hybrid_override_pattern": "X" * 28}, "'X'"),
        ({"hybrid_override_pattern": "Ｍ" * 28}, "hybrid_override_pattern"),
        ({"attn_layer_period": 4, "attn_layer_offset": 7}, "place no attention layer"),
        ({"attn_layer_period": 100000, "attn_layer_offset": 0}, "place no attention layer"),
        ({"full_attention_interval": 1048576}, "past the 28 layers"),
    ],
)
def test_a_layout_that_accounts_for_no_layer_is_an_error(layout, needle):
    base = {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128}
    with pytest.raises(ScriptError, match=needle):
        kv_cache.kv_layout({**base, **layout})
    fine = kv_cache.kv_layout({**base, "attn_layer_period": 4, "attn_layer_offset": 3})
    assert (fine["full"], fine["none"]) == (7, 21)
    assert kv_cache.kv_layout({**base, "hybrid_override_pattern": "M*-E" * 7})["full"] == 7


# ---- F10: configs that size little or no KV cache
def test_configs_that_would_size_no_kv_cache_are_errors():
    base = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 4,
        "hidden_size": 1,
        "num_attention_heads": 1 << 20,
    }
    with pytest.raises(ScriptError, match="below 1"):
        kv_cache.kv_layout(base, 2)
    sliding = {**base, "hidden_size": 512, "num_attention_heads": 8, "sliding_window": True}
    with pytest.raises(ScriptError, match="sliding_window is true"):
        kv_cache.kv_layout(sliding, 2)
    stray = {
        **base,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "text_config": {"num_hidden_layers": 1, "hidden_size": 8, "num_attention_heads": 8},
    }
    assert kv_cache.kv_layout(stray, 2)["bytes_per_token"] == 4 * 2 * 8 * 64 * 2  # the model's own 4 layers
    vlm = {**stray, "architectures": ["LlavaForConditionalGeneration"]}
    assert kv_cache.kv_layout(vlm, 2)["bytes_per_token"] == 1 * 2 * 8 * 1 * 2  # a VLM's language model
