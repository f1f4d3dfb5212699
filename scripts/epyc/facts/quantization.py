"""What a checkpoint's quantization is, and whether vLLM's CPU backend has a kernel for it."""

from __future__ import annotations


def describe(cfg: dict) -> dict | None:
    """The quantization a config.json (or its text_config) declares, normalised; None for an unquantized one."""
    q, text = cfg.get("quantization_config"), cfg.get("text_config")
    if not isinstance(q, dict) and isinstance(text, dict):
        q = text.get("quantization_config")
    if not isinstance(q, dict):
        return None
    method = q.get("quant_method")
    method = method.lower() if isinstance(method, str) and method.strip() else "unknown"  # a list is no method
    weights: dict = {}
    groups = q.get("config_groups")
    if isinstance(groups, dict):  # compressed-tensors: the first group's weight scheme
        first = next((g for g in groups.values() if isinstance(g, dict)), {})
        weights = first.get("weights") if isinstance(first.get("weights"), dict) else {}
    bits = weights.get("num_bits", q.get("bits", q.get("w_bit")))
    symmetric = weights.get("symmetric")
    if symmetric is None and "zero_point" in q:
        symmetric = not q["zero_point"]
    if symmetric is None and "sym" in q:
        symmetric = q["sym"]
    group = weights.get("group_size", q.get("group_size", q.get("q_group_size")))
    fmt = q.get("format")
    # no plausible value is "not said" (None), never a fact in the summary (group_size -1 is GPTQ's per-channel)
    return {
        "method": method[:64],
        "format": fmt[:64] if isinstance(fmt, str) else None,
        "bits": bits if _int_in(bits, 1, 32) else None,
        "symmetric": symmetric if isinstance(symmetric, bool) else None,
        "group_size": group if _int_in(group, -1, 1 << 20) else None,
    }


def _int_in(v, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def cpu_kernel(
    desc: dict | None,
    backend: str,
    dtype: str,
    kernels: list[dict],
    avx512: bool | None = None,
    needs_avx512: dict | None = None,
) -> dict:
    """Which kernel vLLM runs the checkpoint's linears with on `backend` (zentorch | stock), by the first matching
    row, else unknown; without AVX-512 (`avx512` False) a kernel built only for it (`needs_avx512`) is not served."""

    def found(kernel: str | None, served: bool | None, note: str | None, source: str | None) -> dict:
        return {
            "quantized": desc is not None,
            "kernel": kernel,
            "served_on_cpu": served,
            "note": note,
            "source": source,
        }

    if desc is None:
        return found(None, True, None, None)
    for row in kernels:
        if all(desc.get(k) == v for k, v in row["match"].items()):
            kernel = row.get(backend)
            note = row.get("note")
            if backend == "zentorch" and row.get("needs_dtype") and dtype != row["needs_dtype"]:
                kernel, note = row.get("otherwise"), f"served in {dtype}, not {row['needs_dtype']}: " + (note or "")
            if kernel and needs_avx512 and kernel.startswith(needs_avx512["kernel"]):
                if avx512 is False:
                    return found(None, False, needs_avx512["text"], needs_avx512["source"])
                if avx512 is None:  # check_model does not know the CPU: say where it cannot run
                    note = f"{note + '; ' if note else ''}needs AVX-512: {needs_avx512['text']}"
            return found(kernel, kernel is not None, note, row.get("source"))
    unknown = f"{desc['method']} is not in this skill's table: whether vLLM's CPU backend loads it is decided at start (verify reports it)"
    return found(None, None, unknown, None)
