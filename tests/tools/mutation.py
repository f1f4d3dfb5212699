"""Mutation testing of the decision modules: does the fast suite notice when their logic changes?

    .venv/bin/python tests/tools/mutation.py                                  # every mutant of every module (hours)
    .venv/bin/python tests/tools/mutation.py scripts/kv_cache.py              # one module, every mutant
    .venv/bin/python tests/tools/mutation.py --sample 40 --seed 1             # 40 drawn per module (~30 min)

mutmut 2.5's mutation operators (in the test extra) make each mutant: one operator, number,
string, keyword or return changed. This driver writes the mutant into the file on disk, runs the module's
tests (stop at the first failure), and puts the original bytes back, also when interrupted. File-level
mutation is why: most of this suite runs the scripts as subprocesses, which an in-process mutant (mutmut
3's trampolines) never reaches. A mutant is killed when a test fails, survives when they all pass, and
times out past 3x the clean run (+30 s); score = killed / (killed + survived + timeout).

Every mutant of the ~3,000 takes hours on 2 cores, so `--sample N` draws N per module (seeded, without
replacement) and reports the score with its 95 % Wilson interval. Prints one JSON document: the score
per module and every survivor as `line: original -> mutant`, to read and pin with a test.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
# each decision module with the tests that exercise it, fastest killers first (fast ones: no vLLM, no engine)
MODULES = {
    "scripts/kv_cache.py": ["tests/test_quantization.py", "tests/test_estimate_memory.py"],
    "scripts/quantization.py": ["tests/test_quantization.py"],
    "scripts/estimate_memory.py": ["tests/test_estimate_memory.py"],
    "scripts/check_model.py": ["tests/test_check_model.py"],
    "scripts/cpu_tune.py": ["tests/test_cpu_tune.py"],
    "scripts/detect.py": ["tests/test_detect.py"],
    # the plan's decisions; the start/verify/stop tests (a fake server each) belong to serve_life.py
    "scripts/serve_plan.py": ["tests/test_launch.py", "-k", "plan or preload or needs_device or entrypoint "
                              "or sizing or handoff or sudo or throughput or judge"],
}


def run_tests(tests: list[str], timeout: float) -> str:
    argv = [PY, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not e2e", *tests]
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    return "survived" if done.returncode == 0 else "killed"


def wilson(k: int, n: int, z: float = 1.96) -> list[float] | None:
    """95 % interval of a proportion measured on a sample: honest about what 40 mutants can say."""
    if not n:
        return None
    p, d = k / n, 1 + z * z / n
    mid, half = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [round(max(0.0, 100 * (mid - half)), 1), round(min(100.0, 100 * (mid + half)), 1)]


def mutants(path: Path) -> tuple[str, list]:
    from mutmut import Context, list_mutations
    source = path.read_text()
    return source, list_mutations(Context(source=source, filename=str(path)))


def mutate(source: str, path: Path, mutation_id) -> str:
    from mutmut import Context, mutate as mutmut_mutate
    mutated, count = mutmut_mutate(Context(source=source, mutation_id=mutation_id, filename=str(path)))
    if count != 1:
        raise RuntimeError(f"mutation {mutation_id} applied {count} times")
    return mutated


def run_module(module: str, tests: list[str], sample: int | None, rng: random.Random) -> dict:
    path = ROOT / module
    source, ids = mutants(path)
    chosen = sorted(rng.sample(ids, sample), key=lambda m: (m.line_number, m.index)) if sample and sample < len(ids) \
        else ids
    t0 = time.monotonic()
    if run_tests(tests, 3600) != "survived":
        return {"module": module, "error": "the tests fail on the unmutated module", "fix": "make them pass first"}
    timeout = 3 * (time.monotonic() - t0) + 30
    counts = {"killed": 0, "survived": 0, "timeout": 0}
    survivors = []
    try:
        for n, mid in enumerate(chosen, 1):
            mutated = mutate(source, path, mid)
            path.write_text(mutated)
            status = run_tests(tests, timeout)
            path.write_text(source)
            counts[status] += 1
            if status != "killed":
                new_line = mutated.splitlines()[mid.line_number]
                survivors.append(f"{mid.line_number + 1}: {mid.line.strip()}  ->  {new_line.strip()}  [{status}]")
            print(f"mutation: {module} {n}/{len(chosen)} line {mid.line_number + 1}: {status}", file=sys.stderr,
                  flush=True)
    finally:
        path.write_text(source)  # the original, whatever happened
    judged = sum(counts.values())
    return {"module": module, "tests": tests, "mutants_in_module": len(ids), "mutants_run": judged, **counts,
            "score_pct": round(100 * counts["killed"] / judged, 1) if judged else None,
            "interval_95_pct": wilson(counts["killed"], judged) if len(chosen) < len(ids) else None,
            "survivors": survivors}


def main() -> int:
    p = argparse.ArgumentParser(prog="tests/tools/mutation.py", description=__doc__.split("\n")[0])
    p.add_argument("modules", nargs="*")
    p.add_argument("--sample", type=int, help="mutants drawn per module (default: every one)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    wanted = args.modules or list(MODULES)
    unknown = [m for m in wanted if m not in MODULES]
    if unknown or (args.sample is not None and args.sample < 1):
        print(json.dumps({"ok": False, "error": f"no test list for {unknown}" if unknown else "--sample must be >= 1",
                          "fix": f"modules: {sorted(MODULES)}; --sample N with N >= 1"}))
        return 1
    # SIGTERM (a CI timeout, kill) unwinds like Ctrl-C, through run_module's finally: the file is restored
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    rng = random.Random(args.seed)
    try:
        results = [run_module(m, MODULES[m], args.sample, rng) for m in wanted]
    except KeyboardInterrupt:
        print(json.dumps({"ok": False, "error": "interrupted: no score (the module's file is restored)",
                          "fix": "run it again; --sample N takes less time"}))
        return 1
    judged = [r for r in results if "error" not in r]
    killed, total = sum(r["killed"] for r in judged), sum(r["mutants_run"] for r in judged)
    print(json.dumps({"ok": len(judged) == len(results), "sample_per_module": args.sample, "seed": args.seed,
                      "modules": results, "killed": killed, "judged": total,
                      "score_pct": round(100 * killed / total, 1) if total else None,
                      "interval_95_pct": wilson(killed, total) if args.sample else None}, indent=2))
    return 0 if len(judged) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
