"""Benchmarking an endpoint with vLLM's own `vllm bench serve` and a decode bound."""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

from epyc import bundle, cli, errors, jsonio, subproc
from epyc.decisions import command, forecast, planner
from epyc.deployments import serve_start, serve_stop, serve_verify
from epyc.errors import ScriptError
from epyc.facts import probe, runtimes, shell
from epyc.verbs import bench_report
from epyc.verbs.bench_plan import endpoint_of, matrix_against_the_plan, recorded_container, write_out
from epyc.verbs.bench_report import METRICS

RUN_TIMEOUT_S = 3600
METRIC_MAX = 1e9
COUNTS = ("completed", "failed")


def run_metrics(doc: dict) -> dict:
    """The figures of one `vllm bench serve` result; a partial or malformed one is a ValueError naming what."""
    if not isinstance(doc, dict):
        raise ValueError("a vllm bench serve result is a JSON object")
    out = {}
    for key in bench_report.FIGURES + COUNTS:
        v = doc.get(key, 0 if key == "failed" else None)
        # anything past a billion (ms, tokens/s, requests) is a broken result: a 1e308 would overflow the means
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= METRIC_MAX:
            raise ValueError(f"{key} missing or not a number in [0, {METRIC_MAX:.0e}]")
        if key in COUNTS and v != int(v):
            raise ValueError(f"{key} is {v}, not a whole number of requests")
        out[key] = float(v) if key.startswith("median_") else int(v) if key in COUNTS else v
    return out


def loopback_env(env: dict) -> dict:
    """127.0.0.1 and localhost added to NO_PROXY: the key never travels to the shell's proxy (the Hub still does)."""
    for name in ("NO_PROXY", "no_proxy"):
        have = [h for h in env.get(name, "").split(",") if h.strip()]
        env[name] = ",".join(have + [h for h in ("127.0.0.1", "localhost") if h not in have])
    return env


def read_result(raw: Path, out: Path) -> dict:
    """One `vllm bench serve` result file, read as any input is (a FIFO or a link to /dev/zero is no result)."""
    fix = "re-run the benchmark"
    try:
        return run_metrics(jsonio.parse_json_object(jsonio.read_input_text(raw, str(raw), fix), str(raw), fix))
    except (ValueError, ScriptError) as exc:
        raise ScriptError(
            f"{raw}: not a complete vllm bench serve result ({exc})",
            "re-run the benchmark (into a new --out, or none); keep the raw file for the report",
            out=str(out),
        )


def summarise_cell(runs: list[dict]) -> dict:
    """Mean of the repeats' medians, and the spread (max - min) beside each; failures are summed."""
    if not runs:
        raise ValueError("a cell needs at least one run")
    cell = {"repeats": len(runs), **{k: sum(r[k] for r in runs) for k in ("failed", "completed")}}
    for key in bench_report.FIGURES:
        values = [r[key] for r in runs]
        cell[key] = round(statistics.fmean(values), 3)
        cell[f"{key}_spread"] = round(max(values) - min(values), 3)
    return cell


def decode_bound(step_bytes: int | None, bytes_per_s: float | None, tpot_c1_ms: float | None) -> dict:
    """TPOT's floor at concurrency 1 (each step reads the weights and its KV once, at the bandwidth), the gap above."""
    if not step_bytes or not bytes_per_s:
        return {"min_tpot_ms": None, "fraction_of_bound": None, "gap_ms_per_token": None}
    floor_ms = step_bytes / bytes_per_s * 1000
    return {
        "min_tpot_ms": round(floor_ms, 3),
        "fraction_of_bound": round(floor_ms / tpot_c1_ms, 3) if tpot_c1_ms else None,
        "gap_ms_per_token": round(tpot_c1_ms - floor_ms, 3) if tpot_c1_ms else None,
    }


def step_bytes(estimate: dict, context: int) -> int | None:
    """What one decode step reads over all ranks: the weights as held (a MoE's active ones) and `context` tokens' KV."""
    weights = estimate.get("active_weight_bytes") or estimate.get("weight_bytes")
    return weights + estimate.get("kv_bytes_per_token", 0) * context if weights else None


def bench_argv(
    vllm: list[str],
    base_url: str,
    model: str,
    tokenizer: str,
    endpoint: str,
    input_len: int,
    output_len: int,
    concurrency: int,
    result_dir: str,
    name: str,
    seed: int,
) -> list[str]:
    """One `vllm bench serve` run of the matrix, as an argv (no shell). Each run has its own seed (a repeat's
    prompts would otherwise hit vLLM's prefix cache), and `concurrency` warm-up requests pay lazy start-up work."""
    chat = endpoint == "chat_completions"
    flags = {
        "--backend": "openai-chat" if chat else "vllm",
        "--base-url": base_url.removesuffix("/v1"),
        "--endpoint": "/v1/chat/completions" if chat else "/v1/completions",
        "--model": model,
        "--tokenizer": tokenizer,
        "--dataset-name": "random",
        "--random-input-len": input_len,
        "--random-output-len": output_len,
        "--max-concurrency": concurrency,
        "--num-prompts": 10 * concurrency,
        "--percentile-metrics": ",".join(METRICS),
        "--metric-percentiles": "50,90,99",
        "--seed": seed,
        "--num-warmups": concurrency,
        "--result-dir": result_dir,
        "--result-filename": name,
    }
    return [*vllm, "bench", "serve", "--ignore-eos", "--save-result", *(str(x) for kv in flags.items() for x in kv)]


def serving_target(plan: dict, container: str | None = None) -> dict:
    """Where `vllm bench serve` runs (the serving venv, or in container `container`) and the tokenizer it reads."""
    host = plan["path"] == "host"
    tokenizer = command.serve_args(plan["argv"], container=not host)[0]
    if snapshot := revision_snapshot(plan):  # in the hub cache: the host's, or where the container mounts it
        if host:
            tokenizer = f"{plan['inputs']['validate']['hf_cache']['path']}/{snapshot}"
        else:
            tokenizer = f"{bundle.load_epyc()['container']['hf_cache_mount_target']}/hub/{snapshot}"
    if host:
        vllm_bin = next(a for a in plan["argv"] if a.endswith("/vllm"))
        return {"vllm": [vllm_bin], "tokenizer": tokenizer, "python": str(Path(vllm_bin).parent / "python")}
    # exec passes the CLI's own OPENAI_API_KEY on by name: its value is never in an argv
    key = ["-e", "OPENAI_API_KEY"] if plan.get("api_key_env") else []
    container = container or plan["container_name"]
    vllm = [*runtimes.runtime_of(plan), "exec", *key, container, "vllm"]
    return {"vllm": vllm, "tokenizer": tokenizer, "python": None, "container": container}


def revision_snapshot(plan: dict) -> str | None:
    """The hub cache's snapshot folder (relative) of the revision served: bench serve takes no revision."""
    revision = plan.get("revision")
    if not revision or plan.get("model_dir"):
        return None
    from huggingface_hub import try_to_load_from_cache

    cache = plan["inputs"]["validate"]["hf_cache"]["path"]  # the cache the plan serves from (validate's)
    why = f"no snapshot of {plan['model']} at {revision} in {cache}"
    try:  # reads refs/<revision> and the snapshot's config.json on disk: never the network
        found = try_to_load_from_cache(plan["model"], "config.json", cache_dir=cache, revision=revision)
    except (OSError, ValueError) as exc:
        found, why = None, f"the cache's snapshot of {plan['model']} at {revision} is unreadable ({exc})"
    folder = Path(found).parent if isinstance(found, str) else None
    if folder is None or folder.parent.name != "snapshots" or not folder.is_relative_to(cache):
        errors.log(f"bench: {why}; tokenizing with the repo id (its default branch)")
        return None
    return folder.relative_to(cache).as_posix()


def run_matrix(plan: dict, args: argparse.Namespace, out: Path, env: dict) -> list[dict]:
    """Every cell of the matrix through `vllm bench serve`, raw JSON kept under out/raw."""
    (out / "raw").mkdir(parents=True, exist_ok=True)
    target = serving_target(plan, None if plan["path"] == "host" else recorded_container(plan))
    common = (target["vllm"], plan["base_url"], plan["served_model_name"], target["tokenizer"], endpoint_of(plan))
    result_dir = str(jsonio.real_path(out / "raw")) if plan["path"] == "host" else "/tmp"
    matrix = list(itertools.product(args.input_lens, args.concurrency, range(1, args.repeats + 1)))
    runs: dict[tuple[int, int], list[dict]] = {}
    for done, (input_len, conc, rep) in enumerate(matrix, 1):
        name = f"in{input_len}_c{conc}_r{rep}.json"
        errors.log(f"bench: run {done}/{len(matrix)}: input {input_len}, concurrency {conc}, repeat {rep}")
        argv = bench_argv(*common, input_len, args.output_len, conc, result_dir, name, seed=args.seed + done)
        cell = f"input {input_len}, concurrency {conc}"
        runs.setdefault((input_len, conc), []).append(run_once(plan, target, argv, env, out, name, cell))
    return [
        {"input_len": i, "concurrency": c, "num_prompts": 10 * c, **summarise_cell(cell_runs)}
        for (i, c), cell_runs in runs.items()
    ]


def run_once(plan: dict, target: dict, argv: list[str], env: dict, out: Path, name: str, cell: str) -> dict:
    """One run of `vllm bench serve` and its result's figures; an endpoint that answers nothing ends the matrix."""
    res = subproc.run(argv, timeout=RUN_TIMEOUT_S, env=env, progress="bench: vllm bench serve")
    raw = out / "raw" / name
    if plan["path"] != "host" and res.ok:  # written inside the container, read back bounded as every document
        cat = [*runtimes.runtime_of(plan), "exec", target["container"], "cat", f"/tmp/{name}"]
        write_out(raw, subproc.run(cat, timeout=60, limit=jsonio.MAX_INPUT_BYTES).stdout)
    if not res.ok or not raw.exists():
        raise ScriptError(
            f"vllm bench serve failed at {cell}",
            "check that the endpoint still verifies (launch.py verify) and report the lines above",
            log_tail=(res.stderr or res.stdout or res.failure or "").strip().splitlines()[-15:],
            out=str(out),
        )
    run = read_result(raw, out)
    if run["failed"]:
        errors.log(f"bench: !!! {run['failed']} FAILED requests in {name}")
    if not run["completed"]:  # the endpoint is gone: the rest of the matrix would fail too
        raise ScriptError(
            f"no request completed at {cell} ({run['failed']} failed): the endpoint is not answering",
            "check the server (launch.py verify --plan <plan.json>, its log), "
            "then re-run the benchmark (into a new --out, or none)",
            out=str(out),
        )
    return run


def finish(plan: dict, args: argparse.Namespace, out: Path, cells: list[dict]) -> tuple[dict, int]:
    """The summary document, table and plot of one served configuration."""
    target = serving_target(plan)
    bind = command.bound_cpus(plan["env"].get("VLLM_CPU_OMP_THREADS_BIND")) or []
    pin = plan["argv"][: plan["argv"].index(target["vllm"][0])] if plan["path"] == "host" else []
    found = probe.measure([*pin, target["python"]], bind)[0] if target["python"] and not args.no_bandwidth else None
    bw = found and found["bytes_per_s"]
    epyc, engines = bundle.load_epyc(), plan.get("engines_behind", 1)
    for c in cells:  # the plan's forecast at this cell's lengths and concurrency, held to the measured figures
        work = {"prompt_tokens": c["input_len"], "output_tokens": args.output_len, "concurrency": (c["concurrency"],)}
        c["forecast"] = forecast.against(forecast.plan_forecast(plan["inputs"], epyc, engines, **work), c)
    est = plan["inputs"]["estimate_memory"]
    weights = est.get("weight_bytes")
    best = min((c for c in cells if c["concurrency"] == 1), key=lambda c: c["median_tpot_ms"], default=None)
    read = step_bytes(est, best["input_len"] + args.output_len // 2) if best else weights  # mid-decode context
    figures = {
        "seed": args.seed,
        "cells": cells,
        "failed": sum(c["failed"] for c in cells),
        "memory_bandwidth_gbs": round(bw / 1e9, 2) if bw else None,
        "bandwidth_cpus": bind,
        "weight_bytes": weights,
        "bound_bytes_per_step": read,
        **decode_bound(read, bw, best["median_tpot_ms"] if best else None),
    }
    doc = summary_doc(plan, args, out, **figures)
    write_out(out / "summary.json", json.dumps(doc, indent=2) + "\n")
    write_out(
        out / "summary.md",
        bench_report.markdown(cells) + bench_report.against_forecast(cells) + bench_report.bound_and_host(doc),
    )
    doc["plot"] = bench_report.plot(cells, out / "plot.png")
    fix = "a failed request makes the figures meaningless: check the server log (launch.py verify) and run again"
    return settled(doc, "the benchmark", fix)


def summary_doc(plan: dict, args: argparse.Namespace, out: Path, **figures) -> dict:
    """A benchmark's or a comparison's document: what both hold around their own figures."""
    return {
        "out": str(out),
        "base_url": plan["base_url"],
        "served_model_name": plan["served_model_name"],
        "output_len": args.output_len,
        "repeats": args.repeats,
        **figures,
        "host": bench_report.host_record(plan),
        "warnings": args.warnings,
    }


def settled(doc: dict, what: str, fix: str) -> tuple[dict, int]:
    """The document and exit code: a failed request fails the run (its figures do not count)."""
    if doc["failed"]:
        doc.update(error=f"{doc['failed']} requests FAILED during {what}", fix=fix)
        return doc, errors.EXIT_FAIL
    return doc, errors.EXIT_OK


def compare(plan: dict, args: argparse.Namespace, out: Path, env: dict) -> tuple[dict, int]:
    """Serve the plan's model once per sizing on the plan's port, bench each, stop each, side by side."""
    epyc = bundle.load_epyc()
    args.warnings = [w for w in args.warnings if w["check"] == "length"]  # each sizing's server its own seqs
    done = {name: bench_sizing(plan, name, args, out / name, env, epyc) for name in planner.SIZINGS}
    results = {name: cells for name, (cells, _) in done.items() if cells is not None}
    not_run = {name: why for name, (_, why) in done.items() if why is not None}
    if not results:
        raise ScriptError(
            "no sizing could be served", "see not_run: " + "; ".join(f"{k}: {v}" for k, v in not_run.items())
        )
    cmp = {**bench_report.side_by_side(results), "not_run": not_run}
    failed = sum(c["failed"] for cells in results.values() for c in cells)
    doc = summary_doc(plan, args, out, failed=failed, comparison=cmp)
    write_out(out / "compare.json", json.dumps(doc, indent=2) + "\n")
    md = bench_report.compare_markdown(cmp) + "".join(f"\n{k}: not run -- {v}\n" for k, v in not_run.items())
    write_out(out / "compare.md", md)
    fix = "the figures of a sizing with failed requests do not count: check its server log and rerun"
    return settled(doc, "the comparison", fix)


def bench_sizing(
    plan: dict, name: str, args: argparse.Namespace, sub: Path, env: dict, epyc: dict
) -> tuple[list[dict] | None, str | None]:
    """One sizing of --compare planned, served, benched and stopped: (its cells, why it was not run)."""
    opts = {**plan["options"], "sizing": name, "state_dir": str(jsonio.real_path(sub / "run"))}
    try:  # a sizing that cannot be planned or served is reported, and the comparison goes on
        variant = planner.build_plan(plan["inputs"], opts, epyc, shell.shell_facts(opts, plan["inputs"]))
    except ScriptError as exc:
        errors.log(f"bench: --compare: sizing {name}: not run: {exc.error}")
        return None, exc.error
    _, own = matrix_against_the_plan(
        variant, args.input_lens, args.output_len, args.concurrency, epyc["serve"]["vllm_cpu_default_max_num_seqs"]
    )
    # the lengths are the plan's, warned of once
    args.warnings += [{**w, "message": f"sizing {name}: {w['message']}"} for w in own if w["check"] != "length"]
    (sub / "run").mkdir(parents=True, exist_ok=True, mode=0o700)
    write_out(sub / "plan.json", json.dumps(variant, indent=2) + "\n")
    errors.log(f"bench: --compare: sizing {name}: starting")
    cells = why = None
    try:
        serve_start.start(variant, confirm=True)  # rendered just above: nothing to compare it with
        serve_verify.verify(variant, epyc["serve"]["health_timeout_s"], epyc["serve"]["smoke_timeout_s"])
        cells = run_matrix(variant, args, sub, env)
        write_out(sub / "summary.md", bench_report.markdown(cells))
    except ScriptError as exc:
        if exc.extra.get("interrupted"):  # the user's Ctrl-C, held by start: stop this server, run no more
            raise KeyboardInterrupt from exc
        why = exc.error
        errors.log(f"bench: --compare: sizing {name}: FAILED: {exc.error}")
    finally:  # a second signal (`timeout`, a double Ctrl-C) waits until the server is stopped
        with cli.signals_deferred():
            try:
                serve_stop.stop(variant)
            except ScriptError as exc:  # not this sizing's to stop (another plan's container on the port)
                if cells is None:
                    why = f"{'not served' if why is None else why}; its stop: {exc.error}"
                errors.log(f"bench: --compare: sizing {name}: stop refused: {exc.error}")
    return cells, why
