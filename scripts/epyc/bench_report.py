"""bench's summaries: the markdown, the comparison and the plot."""

from __future__ import annotations

import os
import time
from pathlib import Path

from . import serve_state


def markdown(cells: list[dict]) -> str:
    head = ["input", "conc.", "TTFT ms", "TPOT ms", "ITL ms", "E2EL ms", "out tok/s", "total tok/s", "failed"]
    rows = []
    for c in cells:

        def fmt(k: str, c: dict = c) -> str:
            return f"{c[k]:.1f} ±{c[k + '_spread']:.1f}"

        rows.append(
            [
                str(c["input_len"]),
                str(c["concurrency"]),
                fmt("median_ttft_ms"),
                fmt("median_tpot_ms"),
                fmt("median_itl_ms"),
                fmt("median_e2el_ms"),
                fmt("output_throughput"),
                fmt("total_token_throughput"),
                f"**{c['failed']}**" if c["failed"] else "0",
            ]
        )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return (
        "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
        + "\n\nMedians per run, mean of the repeats; ± is the spread (max - min) across repeats.\n"
    )


def bound_and_host(doc: dict) -> str:
    """The decode bound in words (bytes per step, bandwidth, floor, gap) and the host the figures are from."""
    h = doc["host"]
    text = (
        f"\nMeasured on {h['cpu_model']}, {h['logical_cores']} vCPUs, vLLM {h['vllm']} ({h['backend']}), {h['date']}.\n"
    )
    if doc.get("min_tpot_ms") is None:
        return text
    gap = doc.get("gap_ms_per_token")
    cpus = ",".join(map(str, doc["bandwidth_cpus"])) or "the server's"
    return text + (
        f"\nDecode bound at concurrency 1: {doc['bound_bytes_per_step'] / 1e9:.2f} GB read per step (weights + KV)"
        f" at {doc['memory_bandwidth_gbs']} GB/s on CPUs {cpus} = {doc['min_tpot_ms']:.1f} ms per token"
        + (
            f"; measured {doc['min_tpot_ms'] + gap:.1f} ms, {gap:.1f} ms per token above it.\n"
            if gap is not None
            else ".\n"
        )
    )


def host_record(plan: dict) -> dict:
    """Where the figures come from: measured figures name their host, versions and date."""
    return {
        "cpu_model": plan["inputs"]["detect"].get("cpu_model"),
        "logical_cores": plan["inputs"]["detect"].get("logical_cores"),
        "vllm": plan["inputs"]["validate"].get("stack", {}).get("vllm"),
        "backend": plan["backend"],
        "date": time.strftime("%Y-%m-%d"),
    }


def side_by_side(results: dict[str, list[dict]]) -> dict:
    """Per cell, each sizing's output throughput and median TPOT, with the throughput as a ratio to the
    best sizing of that cell (1.0 = the best)."""
    names = list(results)
    table = []
    for i, cell in enumerate(results[names[0]]):
        row = {"input_len": cell["input_len"], "concurrency": cell["concurrency"], "sizings": {}}
        best = max(results[n][i]["output_throughput"] for n in names) or 1.0
        for n in names:
            c = results[n][i]
            row["sizings"][n] = {
                "output_throughput": c["output_throughput"],
                "output_throughput_spread": c["output_throughput_spread"],
                "median_tpot_ms": c["median_tpot_ms"],
                "failed": c["failed"],
                "ratio_to_best": round(c["output_throughput"] / best, 3),
            }
        table.append(row)
    return {"sizings": names, "table": table}


def compare_markdown(cmp: dict) -> str:
    names = cmp["sizings"]
    head = ["input", "conc."] + [f"{n} tok/s (ratio)" for n in names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in cmp["table"]:
        cells = [
            f"{row['sizings'][n]['output_throughput']:.1f} ±{row['sizings'][n]['output_throughput_spread']:.1f}"
            f" ({row['sizings'][n]['ratio_to_best']:.2f})"
            for n in names
        ]
        lines.append("| " + " | ".join([str(row["input_len"]), str(row["concurrency"]), *cells]) + " |")
    return (
        "\n".join(lines)
        + "\n\nOutput tokens/s, mean of the repeats' runs ± spread; (ratio to the best sizing of the cell).\n"
    )


def plot(cells: list[dict], path: Path) -> str | None:
    """Throughput and TPOT against concurrency, one line per input length (matplotlib is optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for n in sorted({c["input_len"] for c in cells}):
        row = sorted((c for c in cells if c["input_len"] == n), key=lambda c: c["concurrency"])
        xs = [c["concurrency"] for c in row]
        a.plot(xs, [c["output_throughput"] for c in row], marker="o", label=f"input {n}")
        b.plot(xs, [c["median_tpot_ms"] for c in row], marker="o", label=f"input {n}")
    a.set(xlabel="concurrency", ylabel="output tokens/s", title="Throughput")
    b.set(xlabel="concurrency", ylabel="median TPOT (ms)", title="Time per output token")
    a.legend()
    b.legend()
    fig.tight_layout()
    with os.fdopen(serve_state.open_own_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, "bench"), "wb") as f:
        fig.savefig(f, format="png")  # never through a link planted under its name
    plt.close(fig)
    return str(path)
