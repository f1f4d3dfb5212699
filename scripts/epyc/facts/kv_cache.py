"""What one sequence costs in vLLM's KV cache on CPU: pure functions over a model's config.json."""

from __future__ import annotations

import math

from epyc import masking
from epyc.errors import ScriptError

KV_BYTES_BY_DTYPE = {"bfloat16": 2, "float16": 2, "float32": 4}
SSM_STATE_BYTES_ON_CPU = 4
RECURRENT_PAGES = 2
SLIDING_TYPES = {"sliding_attention", "chunked_attention", "local_attention"}
FULL_TYPES = {"full_attention", "attention", "global_attention"}
NO_KV_TYPES = {"linear_attention", "mamba", "mamba2", "conv"}
LAYOUT_FIX = "the config's layer layout must describe every layer: re-download config.json (or fix the edit)"
# The model types whose KV cache vLLM keeps as one compressed latent (MLA): its is_deepseek_mla list, and Sarvam's
MLA_MODEL_TYPES = frozenset(
    "axk1 deepseek_v2 deepseek_v3 deepseek_v32 deepseek_v4 deepseek_v41 dots3_note deepseek_mtp k3_dspark glm5_next "
    "glm5_next_text glm_moe_dsa glm4_moe_lite glm4_moe_lite_mtp kimi_k2 kimi_linear longcat_flash pangu_ultra_moe "
    "pangu_ultra_moe_mtp bailing_hybrid bailing_hybrid_mtp bailing_hybrid_v3_mtp hy_v4 hy_v4_mtp sarvam_mla".split()
)
# Multimodal wrappers whose language model is one of those (vLLM's config class gives it its DeepSeek type)
MLA_WRAPPER_TYPES = {"kimi_k25", "kimi_vl", "deepseek_vl_v2", "bailing_moe_v3_vl"}
# Attention-free models (vLLM's IsAttentionFree): every layer keeps a recurrent state, none a per-token KV cache
ATTENTION_FREE_TYPES = {"mamba", "mamba2", "falcon_mamba"}
# what vLLM reads as the model's length (the smallest present wins; model_max_length, Cohere's, overrides)
MODEL_LEN_KEYS = (
    "max_position_embeddings n_positions max_seq_len seq_length model_max_length max_target_positions "
    "max_sequence_length max_seq_length seq_len"
).split()
# What the transformers config classes (5.x, as vLLM 0.32.0 installs them; ChatGLM's is vLLM's own) fill in where
# a config.json leaves out a field this sizing reads; tests/test_estimate_memory.py compares them with vLLM's.
_GEMMA_2B = {  # Gemma-2's and Gemma-3's text classes both default to the 2B shape
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_size": 2304,
    "sliding_window": 4096,
    "tie_word_embeddings": True,
}
# Llama's, Mistral's, Qwen2's (which has a vocabulary of its own)
_SEVEN_B = {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096, "vocab_size": 32000}
CLASS_DEFAULTS = {
    "gemma3_text": {**_GEMMA_2B, "vocab_size": 262208, "max_position_embeddings": 131072, "sliding_window_pattern": 6},
    "gemma2": {**_GEMMA_2B, "vocab_size": 256000, "max_position_embeddings": 8192},
    "llama": {**_SEVEN_B, "max_position_embeddings": 2048},  # llava's text_config names its length
    "mistral": {**_SEVEN_B, "num_key_value_heads": 8, "max_position_embeddings": 131072, "sliding_window": 4096},
    "qwen2": {
        **_SEVEN_B,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "use_sliding_window": False,
        "max_window_layers": 28,
    },
    "falcon": {  # falcon-7b names no length
        "num_hidden_layers": 32,
        "num_attention_heads": 71,
        "hidden_size": 4544,
        "vocab_size": 65024,
        "max_position_embeddings": 2048,
    },
    "dbrx": {"n_layers": 24, "n_heads": 16, "d_model": 2048, "vocab_size": 32000, "max_seq_len": 2048},
    "chatglm": {"num_layers": 28, "num_attention_heads": 32, "hidden_size": 4096, "seq_length": 2048},
}
CLASS_DEFAULTS["qwen3"] = CLASS_DEFAULTS["qwen2"]
# the language model's class where a multimodal config's text_config names none (transformers' default)
TEXT_TYPE_OF_PARENT = {"gemma3": "gemma3_text", "llava": "llama", "llava_next": "llama"}


def kv_dtype_for(serve_dtype: str, default: str = "bfloat16") -> str:
    """vLLM's KV cache dtype "auto": the serving dtype where it is one (no fp8 KV on this CPU path), else `default`."""
    return serve_dtype if serve_dtype in KV_BYTES_BY_DTYPE else default


def with_class_defaults(cfg: dict, parent_type: object = None) -> dict:
    """The config as its transformers class reads it: the fields it leaves out take the class's defaults. A
    text_config without a model_type is its parent's default language model (Gemma-3's, llava's)."""
    kind = cfg.get("model_type") or TEXT_TYPE_OF_PARENT.get(str(parent_type))
    return {**CLASS_DEFAULTS.get(str(kind), {}), **cfg}


def text_config(cfg: dict) -> dict:
    """The language model's config (a multimodal one's sub-key, else the top), read with its class's defaults."""
    archs = cfg.get("architectures") if isinstance(cfg.get("architectures"), list) else []
    if cfg.get("num_hidden_layers") and archs and all(str(a).endswith("ForCausalLM") for a in archs):
        return with_class_defaults(cfg)
    for key in ("text_config", "llm_config", "language_config"):
        sub = cfg.get(key)
        sub = with_class_defaults(sub, cfg.get("model_type")) if isinstance(sub, dict) else None
        if sub and sub.get("num_hidden_layers"):
            return {**cfg, **sub}
    return with_class_defaults(cfg)


def _first_int(cfg: dict, *keys: str) -> int | None:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _req_int(cfg: dict, *keys: str) -> int:
    v = _first_int(cfg, *keys)
    if v is None:
        raise ScriptError(
            f"config.json lacks {keys[0]} (a positive integer)",
            "pass a complete transformers config, or --weight-gb plus a model with attention shapes",
        )
    return v


def kv_heads_of(cfg: dict, heads: int) -> int:
    """How many K and V heads one attention layer caches, read as vLLM's model code reads them (per family:
    Falcon, ChatGLM and DBRX name them their own way; else the first head-count key, else multi_query means one)."""
    kind = cfg.get("model_type")
    if kind in ("falcon", "RefinedWeb", "RefinedWebModel"):
        # the 40B/180B "new decoder" groups its heads (the first checkpoints' class means it by a hidden size of 8192)
        grouped = cfg.get("new_decoder_architecture") or (kind != "falcon" and cfg.get("hidden_size") == 8192)
        if grouped:
            return _first_int(cfg, "num_kv_heads", "n_head_kv") or (heads if kind == "falcon" else 1)
        return 1 if cfg.get("multi_query", True) else heads
    if kind == "chatglm":
        return (_first_int(cfg, "multi_query_group_num") or 1) if cfg.get("multi_query_attention") else heads
    if kind == "dbrx":
        attn = cfg.get("attn_config")
        return (_first_int(attn, "kv_n_heads") if isinstance(attn, dict) else None) or 1
    named = _first_int(
        cfg, "n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", "num_attention_groups"
    )
    return named or (1 if cfg.get("multi_query") else heads)


def model_len_of(cfg: dict) -> int | None:
    """The longest sequence vLLM serves this model at unasked (a longer --max-model-len fails its start): the
    smallest length key the config has (model_max_length, where set, wins); None when no limit is known."""
    cfg = with_class_defaults(cfg)
    found = [v for k in MODEL_LEN_KEYS if (v := _first_int(cfg, k))]
    return _first_int(cfg, "model_max_length") or min(found, default=None)


def layer_split(cfg: dict, layers: int) -> tuple[int, int, int]:
    """(full-attention, sliding-window, no-per-token-KV layers), read as vLLM does: a layer_types list first, then
    NemotronH's pattern, Jamba's attention period or Qwen3-Next's interval, then the sliding windows."""
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        kinds = FULL_TYPES | SLIDING_TYPES | NO_KV_TYPES
        check_per_layer("layer_types", types, layers, kinds, f"a layer kind this estimator knows ({sorted(kinds)})")
        full = sum(t in FULL_TYPES for t in types)
        sliding = sum(t in SLIDING_TYPES for t in types)
        return full, sliding, len(types) - full - sliding
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:  # NemotronH: one character per layer
        kinds = "one of 'M*-E' (M mamba, * attention, - MLP, E MoE)"
        check_per_layer("hybrid_override_pattern", pattern, layers, set("M*-E"), kinds)
        return pattern.count("*"), 0, pattern.count("M")
    # a period or interval that places no attention layer is a broken config: sized as "no KV", it would fit anywhere
    period, offset = cfg.get("attn_layer_period"), cfg.get("attn_layer_offset")
    interval = cfg.get("full_attention_interval")
    if isinstance(period, int) and period > 0 and isinstance(offset, int):
        attn, placed = sum(1 for i in range(layers) if i % period == offset), 0 <= offset < period <= layers
        why = (
            f"attn_layer_offset {offset} / attn_layer_period {period} place no "
            f"attention layer among {layers} (offset < period <= layers)"
        )
    elif isinstance(interval, int) and interval > 0:
        attn, placed = layers // interval, interval <= layers
        why = f"full_attention_interval {interval} is past the {layers} layers: no layer would be full attention"
    else:
        return sliding_layers(cfg, layers)
    if not placed:
        raise ScriptError(f"config.json: {why}", LAYOUT_FIX)
    return attn, 0, layers - attn


def check_per_layer(key: str, values: list | str, layers: int, known: set[str], known_text: str) -> None:
    """A per-layer list covers every layer with a kind we can size: a short one or an unknown kind, sized as
    "no KV", would plan a model that cannot fit as fitting."""
    if len(values) != layers:
        unit = "characters" if isinstance(values, str) else "entries"
        raise ScriptError(f"config.json: {key} has {len(values)} {unit} for {layers} layers", LAYOUT_FIX)
    unknown = sorted({str(v) for v in values} - known)
    if unknown:
        raise ScriptError(f"config.json: {key} holds {unknown[:3]}, not {known_text}", LAYOUT_FIX)


def sliding_layers(cfg: dict, layers: int) -> tuple[int, int, int]:
    """A model-wide sliding window (Mistral, Qwen2's max_window_layers, Gemma-2/3), else every layer full."""
    window = cfg.get("sliding_window")
    if window is True:  # a flag, not a size: read as 1 token, it halved the KV need
        raise ScriptError("config.json: sliding_window is true, not a window size in tokens", LAYOUT_FIX)
    if not window or cfg.get("use_sliding_window") is False:
        return layers, 0, 0
    if "max_window_layers" in cfg and cfg.get("use_sliding_window") is True:
        # Qwen2/Qwen3: only the layers from max_window_layers up slide (transformers' layer_types)
        below = cfg["max_window_layers"]
        if not isinstance(below, int) or isinstance(below, bool):
            raise ScriptError(
                "config.json: use_sliding_window is on and max_window_layers is not a layer count "
                f"({masking.clip(repr(below), 40)})",
                LAYOUT_FIX,
            )
        if 0 < below < layers and cfg.get("model_type") in ("qwen2", "qwen3"):
            raise ScriptError(
                f"config.json: use_sliding_window with max_window_layers {below} of {layers} slides "
                f"only the layers from {below} up, and vLLM 0.32 loads no such mix (its Qwen2 model "
                "asserts max_window_layers = num_hidden_layers)",
                "serve it with use_sliding_window false, as the published Qwen2, Qwen2.5 and Qwen3 configs set it",
            )
        sliding = layers - min(max(below, 0), layers)
        return layers - sliding, sliding, 0
    if cfg.get("model_type") == "gemma2":
        sliding = (layers + 1) // 2  # even-indexed layers are local
        return layers - sliding, sliding, 0
    every = cfg.get("sliding_window_pattern")
    if isinstance(every, int) and every > 0:
        full = layers // every
        return full, layers - full, 0
    return 0, layers, 0


def recurrent_state_bytes(
    cfg: dict, conv_bytes: int, ssm_bytes: int = SSM_STATE_BYTES_ON_CPU
) -> tuple[str, int] | None:
    """(family, bytes) of the state one sequence keeps in one recurrent layer, or None when the config says too
    little; shaped as vLLM's MambaStateShapeCalculator does (conv state in `conv_bytes`, SSM state in `ssm_bytes`)."""
    hidden = _first_int(cfg, "hidden_size", "d_model")
    # Gated DeltaNet (Qwen3-Next, Qwen3.5): conv over q, k, v; a head_v x head_k state per value head
    nk, nv = _first_int(cfg, "linear_num_key_heads"), _first_int(cfg, "linear_num_value_heads")
    dk, dv = _first_int(cfg, "linear_key_head_dim"), _first_int(cfg, "linear_value_head_dim")
    kernel = _first_int(cfg, "linear_conv_kernel_dim")
    if nk and nv and dk and dv and kernel:
        conv = (dk * nk * 2 + dv * nv) * (kernel - 1)
        return "gated_deltanet", conv * conv_bytes + nv * dv * dk * ssm_bytes
    # Mamba-2 (NemotronH, Bamba, Granite-4 hybrid, Falcon-H1, Mamba2): heads x head_dim x state. A pure
    # Mamba-2 config names its SSM heads num_heads / head_dim (elsewhere those are attention heads)
    pure = ("num_heads", "head_dim") if cfg.get("model_type") == "mamba2" else ()
    heads = _first_int(cfg, "mamba_num_heads", "mamba_n_heads", *pure[:1])
    head_dim = _first_int(cfg, "mamba_head_dim", "mamba_d_head", *pure[1:])
    state = _first_int(cfg, "ssm_state_size", "mamba_d_state", "state_size")
    groups = _first_int(cfg, "n_groups", "mamba_n_groups") or 1
    kernel = _first_int(cfg, "conv_kernel", "mamba_d_conv")
    if heads and head_dim and state and kernel:
        inner = _first_int(cfg, "mamba_d_ssm") or heads * head_dim
        conv = (inner + 2 * groups * state) * (kernel - 1)
        return "mamba2", conv * conv_bytes + heads * head_dim * state * ssm_bytes
    # Mamba-1 (Jamba, Mamba): an inner x state SSM state, inner = expand x hidden
    expand = _first_int(cfg, "mamba_expand", "expand")
    inner = _first_int(cfg, "mamba_intermediate_size") or (expand * hidden if expand and hidden else None)
    if cfg.get("model_type") in ("mamba", "falcon_mamba"):
        inner = _first_int(cfg, "intermediate_size") or inner
    if inner and state and kernel:
        return "mamba1", inner * (kernel - 1) * conv_bytes + inner * state * ssm_bytes
    return None


def ssm_state_dtype(avx512_bf16: bool, kv_dtype: str) -> str:
    """The dtype vLLM keeps an SSM state in on this CPU: float32 where its AVX-512 BF16 kernels run, else the KV's."""
    return "float32" if avx512_bf16 else kv_dtype


def kv_layout(
    cfg: dict, kv_dtype_bytes: int = KV_BYTES_BY_DTYPE["bfloat16"], ssm_bytes: int = SSM_STATE_BYTES_ON_CPU
) -> dict:
    """KV bytes per token per attention layer, the layers that hold it, and a recurrent layer's state per sequence."""
    tc = text_config(cfg)
    layers = _req_int(tc, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    kind = tc.get("model_type")
    if kind in ATTENTION_FREE_TYPES:
        (attention, per_layer, heads, kv_heads), (full, sliding, none) = ("none", 0, None, None), (0, 0, layers)
    else:
        (attention, per_layer, heads, kv_heads) = attention_shape(tc, kv_dtype_bytes)
        full, sliding, none = layer_split(tc, layers)
    state = recurrent_state_bytes(tc, kv_dtype_bytes, ssm_bytes) if none else None
    if state is None and kind in ATTENTION_FREE_TYPES:
        raise ScriptError(
            f"config.json: a {kind} model whose recurrent state this config does not size (it "
            "needs the state size, conv kernel and inner size or heads)",
            LAYOUT_FIX,
        )
    return {
        "attention": attention,
        "heads": heads,
        "kv_heads": kv_heads,
        "bytes_per_token_per_layer": per_layer,
        "full": full,
        "sliding": sliding,
        "none": none,
        "sliding_window": tc.get("sliding_window") if sliding else None,
        "bytes_per_token": per_layer * (full + sliding),
        "recurrent_family": state[0] if state else None,
        "recurrent_state_bytes": state[1] if state else None,
        "max_position_embeddings": model_len_of(tc),
    }


def attention_shape(tc: dict, kv_dtype_bytes: int) -> tuple[str, int, int, int]:
    """(mla | mha | gqa, KV bytes per token in one attention layer, attention heads, KV heads cached). MLA
    caches one latent (one KV head); another kv_lora_rank config (MiniCPM3) K and V of every head."""
    kind = tc.get("model_type")
    if tc.get("kv_lora_rank"):
        heads = _req_int(tc, "num_attention_heads")
        if kind in MLA_MODEL_TYPES | MLA_WRAPPER_TYPES:
            return "mla", (int(tc["kv_lora_rank"]) + int(tc.get("qk_rope_head_dim") or 0)) * kv_dtype_bytes, heads, 1
        width = (_first_int(tc, "qk_nope_head_dim") or 0) + (_first_int(tc, "qk_rope_head_dim") or 0)
        if not width:
            raise ScriptError(
                "config.json: a kv_lora_rank without qk_nope_head_dim / qk_rope_head_dim: the width "
                "of the heads vLLM caches is unknown",
                LAYOUT_FIX,
            )
        return "mha", 2 * heads * width * kv_dtype_bytes, heads, heads
    heads = _req_int(tc, "num_attention_heads", "n_head", "num_heads", "n_heads")
    kv_heads = kv_heads_of(tc, heads)
    if kv_heads > heads or heads % kv_heads:  # each KV head serves a whole group of query heads
        raise ScriptError(
            f"config.json: {kv_heads} KV heads do not divide the {heads} attention heads",
            "check the config: no model has such heads, and vLLM refuses to load it",
        )
    head_dim = tc.get("head_dim") or (_req_int(tc, "hidden_size", "n_embd", "d_model") // heads)
    if head_dim < 1:  # more heads than hidden units: a KV cache of 0 bytes would "fit" anything
        raise ScriptError(
            f"config.json: hidden_size / num_attention_heads ({heads}) is below 1: no attention head has a dimension",
            "set head_dim, or check num_attention_heads",
        )
    kind = "gqa" if kv_heads < heads else "mha"
    return kind, 2 * int(kv_heads) * int(head_dim) * kv_dtype_bytes, heads, kv_heads


def rank_layout(layout: dict, ranks: int) -> dict | None:
    """The KV one of `ranks` tensor-parallel ranks holds, or None when vLLM cannot split the model that many ways
    (KV heads split, or replicated when fewer; a recurrent layer's state split with its heads)."""
    heads, kv = layout["heads"], layout["kv_heads"]
    if heads and (heads % ranks or (kv % ranks if kv >= ranks else ranks % kv)):
        return None
    per = layout["bytes_per_token_per_layer"] * max(1, kv // ranks) // kv if heads else 0
    state = layout["recurrent_state_bytes"]
    return {
        **layout,
        "bytes_per_token_per_layer": per,
        "bytes_per_token": per * (layout["full"] + layout["sliding"]),
        "recurrent_state_bytes": state // ranks if state else state,
    }


def page_block(layout: dict, block: int) -> int:
    """Tokens per KV page. A hybrid model's attention block grows (in steps of `block`) until one
    attention page holds a recurrent layer's state, as vLLM's _align_hybrid_block_size does."""
    state = layout.get("recurrent_state_bytes")
    per = layout["bytes_per_token_per_layer"]
    if not state or not layout["none"] or not (layout["full"] + layout["sliding"]):
        return block
    return block * max(1, math.ceil(state / (block * per)))


def kv_bytes_for(layout: dict, seq_len: int, block: int, batched_tokens: int) -> int:
    """KV bytes one sequence of seq_len tokens takes in whole pages, as vLLM reserves them."""
    block = page_block(layout, block)
    page = layout["bytes_per_token_per_layer"] * block
    full_pages = math.ceil(seq_len / block)
    sliding_pages = 0
    if layout["sliding"]:
        window = layout["sliding_window"] or seq_len
        sliding_pages = math.ceil(min(window - 1 + batched_tokens, seq_len) / block) + 1
    state = layout.get("recurrent_state_bytes") or 0
    recurrent = layout["none"] * RECURRENT_PAGES * (page if state and (layout["full"] + layout["sliding"]) else state)
    return page * (layout["full"] * full_pages + layout["sliding"] * sliding_pages) + recurrent
