"""A model's parameters from its config alone: weights, what each tensor-parallel rank keeps whole, idle experts."""

from __future__ import annotations


def weight_floor(cfg: dict) -> int:
    """The fewest bytes a checkpoint of this config can hold: its token embedding (vocab x hidden) at 4 bits,
    the narrowest a checkpoint stores it in. A 1-byte .bin or a total_size of 1 sized as "fits" otherwise."""
    vocab, hidden = cfg.get("vocab_size"), cfg.get("hidden_size") or cfg.get("d_model") or cfg.get("n_embd")
    ints = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (vocab, hidden))
    return vocab * hidden // 2 if ints else 1


def _positive(cfg: dict, *keys: str) -> int:
    return next((v for k in keys if isinstance(v := cfg.get(k), int) and not isinstance(v, bool) and v > 0), 0)


def config_params(cfg: dict) -> tuple[int, int] | None:
    """(embedding, layer) parameters of a decoder from its config alone (embedding, an untied LM head, attention, a
    gated MLP or its experts): a model planned without its checkpoint. None when a shape it needs is missing."""
    hidden, layers = _positive(cfg, "hidden_size"), _positive(cfg, "num_hidden_layers")
    vocab, heads = _positive(cfg, "vocab_size"), _positive(cfg, "num_attention_heads")
    if not (hidden and layers and vocab and heads):
        return None
    kv_heads, head_dim = _positive(cfg, "num_key_value_heads") or heads, _positive(cfg, "head_dim") or hidden // heads
    attention = hidden * head_dim * 2 * (heads + kv_heads)
    inter = _positive(cfg, "intermediate_size") or 4 * hidden
    experts = _positive(cfg, "num_experts", "num_local_experts", "n_routed_experts")
    if experts:
        expert = _positive(cfg, "moe_intermediate_size") or inter
        shared = _positive(cfg, "shared_expert_intermediate_size") + _positive(cfg, "n_shared_experts") * expert
        mlp = 3 * hidden * (experts * expert + shared) + hidden * experts  # + the router
    else:
        mlp = 3 * hidden * inter
    embedding = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    return embedding, layers * (attention + mlp + 2 * hidden)


def config_weight_bytes(cfg: dict, serve_dtype_bytes: float, bits: int | None) -> int | None:
    """config_params in bytes: layers at the checkpoint's quantized bits if any, the rest at the serving dtype."""
    params = config_params(cfg)
    if params is None:
        return None
    embedding, layers = params
    return int(embedding * serve_dtype_bytes + layers * (bits / 8 if bits else serve_dtype_bytes))


def replicated_params(cfg: dict) -> int:
    """Parameters every tensor-parallel rank holds whole: norms, an MoE router, MLA's down-projections (vLLM shards
    the rest, the vocabulary included; K/V of fewer KV heads than ranks, also replicated, are not counted)."""
    hidden, layers = _positive(cfg, "hidden_size", "d_model", "n_embd"), _positive(cfg, "num_hidden_layers")
    experts = _positive(cfg, "num_experts", "num_local_experts", "n_routed_experts")
    latent = _positive(cfg, "q_lora_rank") + _positive(cfg, "kv_lora_rank") + _positive(cfg, "qk_rope_head_dim")
    return layers * hidden * (2 + experts + latent) + hidden  # MLA's down-projections to its latents are whole


def idle_expert_params(cfg: dict) -> int:
    """Parameters of the experts a token does not route to, which an MoE decode step does not read (0 when dense)."""
    experts = _positive(cfg, "num_experts", "num_local_experts", "n_routed_experts")
    active = _positive(cfg, "num_experts_per_tok", "moe_topk")
    if not experts or not active or active >= experts:
        return 0
    layers = _positive(cfg, "num_hidden_layers") - _positive(cfg, "first_k_dense_replace")
    expert = _positive(cfg, "moe_intermediate_size") or _positive(cfg, "intermediate_size")
    return max(0, layers) * 3 * _positive(cfg, "hidden_size") * expert * (experts - active)
