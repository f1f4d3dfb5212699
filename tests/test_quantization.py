"""Quantized checkpoints: what check_model.py, estimate_memory.py and the plan say about them.

The kernel table (data/epyc.json quantization.kernels) is checked here against the configs the real
tools write (AutoAWQ, GPTQ, llm-compressor's compressed-tensors); that vLLM really picks those kernels
is measured in the e2e (the server's load log names the kernel)."""

import json

import pytest
from epyc import bundle
from epyc.facts import quantization
from model_fixtures import write_header_only_safetensors

KERNELS = bundle.load_epyc()["quantization"]["kernels"]

CT_W4_SYM = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128},
        }
    },
}
CT_W4_ASYM = json.loads(json.dumps(CT_W4_SYM).replace('"symmetric": true', '"symmetric": false'))
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}
FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}


@pytest.mark.parametrize(
    "qcfg,backend,dtype,kernel",
    [
        (CT_W4_SYM, "zentorch", "bfloat16", "zentorch_dynamic_qlinear (DA8W4: int8 activations x int4 weights)"),
        (CT_W4_SYM, "zentorch", "float32", "zentorch_woq_linear (W4A16)"),  # DA8W4 rejects f32 activations
        (CT_W4_SYM, "stock", "bfloat16", "cpu_gemm_wna16 (vLLM CPUWNA16)"),
        (CT_W4_ASYM, "zentorch", "bfloat16", "zentorch_woq_linear (W4A16)"),  # DA8W4 is symmetric-only
        (AWQ, "zentorch", "bfloat16", "cpu_gemm_wna16 (vLLM CPUWNA16)"),  # AWQ's layout misses the fast path
        (GPTQ, "zentorch", "bfloat16", "cpu_gemm_wna16 (vLLM CPUWNA16)"),
    ],
)
def test_the_kernel_follows_the_layout_not_the_name(qcfg, backend, dtype, kernel):
    got = quantization.cpu_kernel(quantization.describe({"quantization_config": qcfg}), backend, dtype, KERNELS)
    assert got["quantized"] and got["kernel"] == kernel and got["served_on_cpu"] is True and got["source"]


def test_descriptions_of_the_real_formats():
    assert quantization.describe({"quantization_config": AWQ}) == {
        "method": "awq",
        "format": None,
        "bits": 4,
        "symmetric": False,
        "group_size": 128,
    }
    assert quantization.describe({"quantization_config": GPTQ})["symmetric"] is True
    assert quantization.describe({"quantization_config": CT_W4_SYM}) == {
        "method": "compressed-tensors",
        "format": "pack-quantized",
        "bits": 4,
        "symmetric": True,
        "group_size": 128,
    }
    assert quantization.describe({"num_hidden_layers": 2}) is None
    assert quantization.describe({"text_config": {"quantization_config": AWQ}})["method"] == "awq"


def test_older_autoawq_names_and_values_of_the_wrong_type():
    old = quantization.describe({"quantization_config": {"quant_method": "awq", "w_bit": 4, "q_group_size": 64}})
    assert (old["bits"], old["group_size"]) == (4, 64)
    odd = quantization.describe({"quantization_config": {"bits": True, "group_size": "128", "sym": "yes"}})
    assert odd == {"method": "unknown", "format": None, "bits": None, "symmetric": None, "group_size": None}


def test_float32_serving_says_why_the_int8_path_is_not_taken():
    got = quantization.cpu_kernel(
        quantization.describe({"quantization_config": CT_W4_SYM}), "zentorch", "float32", KERNELS
    )
    assert got["note"].startswith("served in float32, not bfloat16: the fast int4 path")


def test_a_method_the_table_does_not_know_is_unknown_not_assumed():
    got = quantization.cpu_kernel(quantization.describe({"quantization_config": FP8}), "zentorch", "bfloat16", KERNELS)
    assert got == {
        "quantized": True,
        "kernel": None,
        "served_on_cpu": None,
        "source": None,
        "note": "fp8 is not in this skill's table: whether vLLM's CPU backend loads it is decided at "
        "start (verify reports it)",
    }
    assert quantization.cpu_kernel(None, "zentorch", "bfloat16", KERNELS) == {
        "quantized": False,
        "kernel": None,
        "served_on_cpu": True,
        "note": None,
        "source": None,
    }


def quantized_folder(tmp_path, qcfg):
    """A Qwen3 config with the quantization_config and the safetensors header a CT int4 checkpoint has."""
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "num_hidden_layers": 1,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 512,
        "vocab_size": 1000,
        "tie_word_embeddings": True,
        "quantization_config": qcfg,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    write_header_only_safetensors(
        tmp_path / "model.safetensors",
        {
            "model.embed_tokens.weight": ("BF16", [1000, 256]),
            "model.layers.0.mlp.down_proj.weight_packed": ("I32", [256, 64]),  # 512 inputs / 8 per int32
            "model.layers.0.mlp.down_proj.weight_scale": ("BF16", [256, 4]),  # 512 / group 128
            "model.layers.0.mlp.down_proj.weight_shape": ("I64", [2]),
        },
    )
    return tmp_path


def test_check_model_and_estimate_report_the_quantization_and_the_bytes_read(script, tmp_path):
    folder = quantized_folder(tmp_path, CT_W4_SYM)
    chk = script("check_model.py", "--model", str(folder), "--vllm-version", "0.32.0")
    assert chk.code == 0 and chk.doc["quantization"]["method"] == "compressed-tensors"
    assert chk.doc["quantization"]["cpu_kernels"]["zentorch"]["kernel"].startswith("zentorch_dynamic_qlinear")
    est = script("estimate_memory.py", "--model", str(folder), "--dtype", "float32")
    assert est.code == 0 and est.doc["quantization"]["bits"] == 4
    # integers as stored, floats at the serving dtype: 1000*256*4 + 256*64*4 + 256*4*4 + 2*8
    assert est.doc["weight_bytes"] == 1000 * 256 * 4 + 256 * 64 * 4 + 256 * 4 * 4 + 2 * 8
    assert (
        "compressed-tensors 4-bit checkpoint: integer tensors count as stored (packed), float ones (scales, "
        "embeddings, norms) at the serving dtype -- the bytes a decode step reads"
    ) in est.doc["notes"]


@pytest.mark.parametrize(
    "avx512,served,kernel", [(True, True, "cpu_gemm_wna16"), (False, False, None), (None, True, "cpu_gemm_wna16")]
)
def test_an_int4_kernel_vllm_builds_only_for_avx512_is_not_served_without_it(avx512, served, kernel):
    """vLLM 0.32.0's AVX2 library (_C_AVX2) has no cpu_gemm_wna16 (measured on an EPYC Rome guest,
    2026-12-02): on a CPU without AVX-512 the checkpoint is quantized and not served; with the CPU
    unknown (check_model) it is served, with the need named."""
    needs = bundle.load_epyc()["quantization"]["stock_needs_avx512"]
    got = quantization.cpu_kernel({"method": "awq", "bits": 4}, "stock", "bfloat16", KERNELS, avx512, needs)
    assert got["quantized"] is True and got["served_on_cpu"] is served
    assert (got["kernel"] or "").startswith(kernel or "") and (got["kernel"] is None) == (kernel is None)
    assert ("_C_AVX2" in got["note"]) == (avx512 is not True)
    assert got["source"] == (
        needs["source"] if avx512 is False else next(r for r in KERNELS if r["match"] == {"method": "awq"})["source"]
    )


def test_check_model_says_an_int4_kernel_needs_avx512(script, tmp_path):
    """F7: check_model called AWQ served on the stock path where plan (rightly) refuses it on an AVX2 CPU."""
    from epyc.bundle import load_epyc
    from epyc.facts import quantization

    epyc = load_epyc()
    got = quantization.cpu_kernel(
        {"method": "awq", "bits": 4},
        "stock",
        "bfloat16",
        epyc["quantization"]["kernels"],
        None,
        epyc["quantization"]["stock_needs_avx512"],
    )
    assert got["served_on_cpu"] and "needs AVX-512" in got["note"] and "_C_AVX2" in got["note"]


def test_a_quantization_value_no_checkpoint_has_is_not_said():
    q = quantization.describe(
        {"quantization_config": {"quant_method": "gptq", "bits": 10**9, "group_size": -1, "format": {"a": 1}}}
    )
    assert (q["bits"], q["group_size"], q["format"]) == (None, -1, None)
    assert (
        quantization.describe({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": -2}})[
            "group_size"
        ]
        is None
    )
