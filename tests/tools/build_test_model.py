"""Build a small model with random weights, offline, for the end-to-end tests (Qwen3 unless the shape says).

    VENV/bin/python tests/tools/build_test_model.py --shape tiny       --out DIR
    VENV/bin/python tests/tools/build_test_model.py --shape qwen3-0.6b --out DIR   # Qwen3-0.6B's exact shapes
    VENV/bin/python tests/tools/build_test_model.py --shape headdim16  --out DIR   # loads, then the first request fails
    VENV/bin/python tests/tools/build_test_model.py --shape sliding    --out DIR   # Llama, sliding-window layers
    VENV/bin/python tests/tools/build_test_model.py --shape hybrid     --out DIR   # Qwen3-Next, linear attention
    VENV/bin/python tests/tools/build_test_model.py --shape qwen3-0.6b --quant awq --out DIR  # AWQ int4 linears
    VENV/bin/python tests/tools/build_test_model.py --shape qwen3-0.6b --quant ct-w4 --out DIR  # compressed-tensors

Runs in the host-stack venv (transformers, tokenizers, torch). No hub: the byte-level BPE tokenizer is
trained here on generated text, and a ChatML chat template is attached, so the model serves
/v1/chat/completions. Weights are random bf16: the output is noise, the shapes and the compute are real.
Idempotent: an existing complete folder is kept. Prints one JSON line: the folder and its facts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SHAPES = {
    # head_dim 64: vLLM's CPU attention accepts 64/128, rejects 16
    "tiny": dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=2048,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
    "qwen3-0.6b": dict(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
    ),
    "headdim16": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=2048,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
    # Llama with per-layer sliding windows (vLLM's llama.py reads layer_types): KV sizing of local layers
    "sliding": dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=2048,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        sliding_window=256,
        layer_types=["sliding_attention", "full_attention"] * 2,
    ),
    # Qwen3-Next: gated-DeltaNet (linear attention) layers with a recurrent state, every 4th layer full attention
    "hybrid": dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=2048,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        full_attention_interval=4,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_conv_kernel_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
        decoder_sparse_step=1,
    ),
}
ARCH = {"sliding": ("LlamaConfig", "LlamaForCausalLM"), "hybrid": ("Qwen3NextConfig", "Qwen3NextForCausalLM")}
CHATML = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def corpus(lines: int = 4000):
    words = (
        "the a model serves tokens on one socket of an epyc host with zentorch kernels and vllm "
        "memory cache batch prompt answer question hello world cpu core thread numa node fast slow "
        "small large request response stream chat completion time first token latency throughput"
    ).split()
    for i in range(lines):
        yield " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12 + i % 9)) + "."


AWQ_GROUP = 128
AWQ_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def awq_tensors(n_out: int, n_in: int, group: int) -> dict:
    """AutoAWQ's on-disk format (GEMM, 4-bit, zero point): qweight int32 [in, out/8] packed along the output
    dim, qzeros int32 [in/group, out/8], scales fp16 [in/group, out]."""
    import torch

    return {
        "qweight": torch.randint(-(2**31), 2**31 - 1, (n_in, n_out // 8), dtype=torch.int32),
        "qzeros": torch.full((n_in // group, n_out // 8), 0x88888888 - 2**32, dtype=torch.int32),
        "scales": (torch.rand(n_in // group, n_out) * 0.002).to(torch.float16),
    }


def ct_w4_tensors(n_out: int, n_in: int, group: int) -> dict:
    """compressed-tensors "pack-quantized" int4, symmetric, group-wise (llm-compressor's W4A16 output):
    weight_packed int32 [out, in/8] packed along the input dim, weight_scale bf16 [out, in/group], weight_shape.
    On the zentorch platform this layout is the one zentorch repacks for its DA8W4 (int8 x int4) kernel."""
    import torch

    return {
        "weight_packed": torch.randint(-(2**31), 2**31 - 1, (n_out, n_in // 8), dtype=torch.int32),
        "weight_scale": (torch.rand(n_out, n_in // group) * 0.002).to(torch.bfloat16),
        "weight_shape": torch.tensor([n_out, n_in], dtype=torch.int64),
    }


def quantization_config(quant: str, group: int) -> dict:
    if quant == "awq":
        return {
            "quant_method": "awq",
            "bits": 4,
            "group_size": group,
            "zero_point": True,
            "version": "gemm",
            "modules_to_not_convert": None,
        }
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "input_activations": None,
                "output_activations": None,
                "weights": {
                    "num_bits": 4,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "group",
                    "group_size": group,
                    "dynamic": False,
                    "actorder": None,
                    "observer": "minmax",
                },
            }
        },
    }


QUANT_TENSORS = {"awq": awq_tensors, "ct-w4": ct_w4_tensors}


def to_quantized(model, out: Path, quant: str, group: int) -> None:
    """Rewrite the saved checkpoint with each decoder linear stored as int4 in `quant`'s on-disk format, with
    random values; embeddings, norms and lm_head stay bf16. What vLLM loads is a real checkpoint of that format."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(1)
    tensors = {}
    for name, t in model.state_dict().items():
        if name.endswith(".weight") and any(f".{n}." in name for n in AWQ_LINEARS):
            base = name[: -len(".weight")]
            n_out, n_in = t.shape
            tensors.update({f"{base}.{k}": v for k, v in QUANT_TENSORS[quant](n_out, n_in, group).items()})
        else:
            tensors[name] = t.contiguous()
    if "lm_head.weight" in tensors and model.config.tie_word_embeddings:
        del tensors["lm_head.weight"]
    for f in out.glob("model*.safetensors*"):
        f.unlink()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = quantization_config(quant, group)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def build(shape: str, out: Path, quant: str | None = None) -> dict:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    dims = SHAPES[shape]
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(dims["vocab_size"], 1024),
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None
    )
    fast.chat_template = CHATML
    fast.save_pretrained(out)

    torch.manual_seed(0)
    config_cls, model_cls = (getattr(transformers, n) for n in ARCH.get(shape, ("Qwen3Config", "Qwen3ForCausalLM")))
    cfg = config_cls(
        **dims,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        attention_bias=False,
        eos_token_id=tok.token_to_id("<|im_end|>"),
        bos_token_id=tok.token_to_id("<|endoftext|>"),
        pad_token_id=tok.token_to_id("<|endoftext|>"),
        torch_dtype="bfloat16",
    )
    model = model_cls(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    if quant:
        to_quantized(model, out, quant, AWQ_GROUP)
    (out / "BUILD.json").write_text(json.dumps({"shape": shape, "quant": quant, "parameters": params}) + "\n")
    return {"folder": str(out), "shape": shape, "quant": quant, "parameters": params}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--quant",
        choices=sorted(QUANT_TENSORS),
        help="store the decoder's linear layers as int4: AutoAWQ "
        "(awq) or compressed-tensors pack-quantized symmetric (ct-w4); random values",
    )
    args = ap.parse_args()
    out = Path(args.out)
    done = out / "BUILD.json"
    if (
        done.exists()
        and json.loads(done.read_text()).get("shape") == args.shape
        and json.loads(done.read_text()).get("quant") == args.quant
    ):
        print(json.dumps({"folder": str(out), **json.loads(done.read_text()), "reused": True}))
        return 0
    print(json.dumps(build(args.shape, out, args.quant)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
