"""bench's summaries: the markdown, the comparison and the plot."""

from __future__ import annotations

import os
import time
from pathlib import Path

from epyc import jsonio
from epyc.decisions.handoff import markdown_table

METRICS = ("ttft", "tpot", "itl", "e2el")
# the figures of a run, each a cell's mean with its spread beside it
FIGURES = (*(f"median_{m}_ms" for m in METRICS), "output_throughput", "total_token_throughput")
HOST_LINE = "\nMeasured on {cpu_model}, {logical_cores} vCPUs, vLLM {vllm} ({backend}), {date}.\n"


def spread(figures: dict, key: str) -> str:
    return f"{figures[key]:.1f} ±{figures[key + '_spread']:.1f}"


def markdown(cells: list[dict]) -> str:
    head = ["input", "conc.", "TTFT ms", "TPOT ms", "ITL ms", "E2EL ms", "out tok/s", "total tok/s", "failed"]
    failed = [f"**{c['failed']}**" if c["failed"] else "0" for c in cells]
    rows = [[c["input_len"], c["concurrency"], *(spread(c, k) for k in FIGURES), f] for c, f in zip(cells, failed)]
    note = "\n\nMedians per run, mean of the repeats; ± is the spread (max - min) across repeats.\n"
    return markdown_table(head, rows) + note


def against_forecast(cells: list[dict]) -> str:
    """Each measured figure beside the plan's forecast; one outside its likely range is said in words."""
    names = {"median_tpot_ms": "TPOT ms", "median_ttft_ms": "TTFT ms", "output_throughput": "out tok/s"}
    rows, missed = [], []
    for c in cells:
        for key, f in c.get("forecast", {}).items():
            likely = "-".join(f"{v:.1f}" for v in f["likely"]) if "likely" in f else f["why"]
            rows.append([c["input_len"], c["concurrency"], names[key], f"{c[key]:.1f}", likely, f.get("ratio", "")])
            rows[-1].append({True: "yes", False: "**no**"}.get(f.get("within"), ""))
            if f.get("within") is False:
                where = f"{names[key]} at input {c['input_len']}, concurrency {c['concurrency']}"
                side = "slower" if (f["ratio"] > 1) == key.endswith("_ms") else "faster"
                missed.append(f"{where}: measured {c[key]:.1f}, {side} than its {likely} ({f['ratio']}x the middle)")
    head = ["input", "conc.", "figure", "measured", "forecast (likely)", "ratio", "within"]
    words = "".join(f"\nThe forecast missed: {m}." for m in missed) or "\nEvery figure fell within its forecast."
    return "\n\nAgainst the plan's forecast:\n\n" + markdown_table(head, rows) + "\n" + words + "\n"


def bound_and_host(doc: dict) -> str:
    """The decode bound in words (bytes per step, bandwidth, floor, gap) and the host the figures are from."""
    text = HOST_LINE.format_map(doc["host"])
    if doc.get("min_tpot_ms") is None:
        return text
    gap = doc.get("gap_ms_per_token")
    cpus = ",".join(map(str, doc["bandwidth_cpus"])) or "the server's"
    measured = (
        f"; measured {doc['min_tpot_ms'] + gap:.1f} ms, {gap:.1f} ms per token above it" if gap is not None else ""
    )
    return text + (
        f"\nDecode bound at concurrency 1: {doc['bound_bytes_per_step'] / 1e9:.2f} GB read per step (weights + KV)"
        f" at {doc['memory_bandwidth_gbs']} GB/s on CPUs {cpus} = {doc['min_tpot_ms']:.1f} ms per token{measured}.\n"
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
    """Per cell, each sizing's output throughput and median TPOT, and its ratio to the cell's best (1.0)."""
    names = list(results)
    shown = ("output_throughput", "output_throughput_spread", "median_tpot_ms", "failed")
    rows = []
    for i, cell in enumerate(results[names[0]]):
        best = max(results[n][i]["output_throughput"] for n in names) or 1.0
        sizings = {
            n: {k: results[n][i][k] for k in shown}
            | {"ratio_to_best": round(results[n][i]["output_throughput"] / best, 3)}
            for n in names
        }
        rows.append({"input_len": cell["input_len"], "concurrency": cell["concurrency"], "sizings": sizings})
    return {"sizings": names, "table": rows}


def compare_markdown(cmp: dict) -> str:
    names = cmp["sizings"]
    rows = []
    for row in cmp["table"]:
        shown = [f"{spread(s, 'output_throughput')} ({s['ratio_to_best']:.2f})" for s in map(row["sizings"].get, names)]
        rows.append([row["input_len"], row["concurrency"], *shown])
    note = "\n\nOutput tokens/s, mean of the repeats' runs ± spread; (ratio to the best sizing of the cell).\n"
    return markdown_table(["input", "conc.", *(f"{n} tok/s (ratio)" for n in names)], rows) + note


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
        band = [c.get("forecast", {}).get("output_throughput", {}).get("likely") for c in row]
        if all(band):  # the forecast's likely range beside what was measured
            a.fill_between(xs, [lo for lo, _ in band], [hi for _, hi in band], alpha=0.2, label=f"forecast, input {n}")
    a.set(xlabel="concurrency", ylabel="output tokens/s", title="Throughput")
    b.set(xlabel="concurrency", ylabel="median TPOT (ms)", title="Time per output token")
    a.legend()
    b.legend()
    fig.tight_layout()
    with os.fdopen(jsonio.open_own_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, "bench"), "wb") as f:
        fig.savefig(f, format="png")  # never through a link planted under its name
    plt.close(fig)
    return str(path)
