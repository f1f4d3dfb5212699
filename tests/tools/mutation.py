"""Mutation testing of the decision modules: does the fast suite notice when their logic changes?

    .venv/bin/python tests/tools/mutation.py                                  # every mutant of every module (hours)
    .venv/bin/python tests/tools/mutation.py scripts/epyc/facts/kv_cache.py         # one module, every mutant
    .venv/bin/python tests/tools/mutation.py --sample 40 --seed 1             # 40 drawn per module (~30 min)

mutmut 2.5's mutation operators (in the test extra) make each mutant: one operator, number,
string, keyword or return changed. This driver writes the mutant into the file on disk, runs the module's
tests (stop at the first failure), and puts the original bytes back, also when interrupted. File-level
mutation is why: most of this suite runs the scripts as subprocesses, which an in-process mutant (mutmut
3's trampolines) never reaches. A mutant is killed when a test fails, survives when they all pass, and
times out past 3x the clean run (+30 s): a hang is a detection too (CI would not pass), so score =
(killed + timeout) / all run. A mutant that
only wraps prose in XX (a help text, note or message) is also counted apart: logic_score_pct is the
score of the others, the decisions.

Every mutant of the ~3,000 takes hours on 2 cores, so `--sample N` draws N per module (seeded, without
replacement) and reports the score with its 95 % Wilson interval. Prints one JSON document: the score
per module and every survivor as `line: original -> mutant`, to read and pin with a test.
"""

from __future__ import annotations

import json
import math
import random
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
sys.path.insert(0, str(ROOT / "scripts"))  # the epyc package: its JSON argument parser and range checks
from epyc import argtypes, cli, subproc  # noqa: E402
from epyc.errors import ScriptError  # noqa: E402

# each decision module with the tests that exercise it, fastest killers first (fast ones: no vLLM, no engine)
MODULES = {
    "scripts/epyc/facts/kv_cache.py": [
        "tests/test_quantization.py",
        "tests/test_kv_cache.py",
        "tests/test_estimate_memory.py",
    ],
    "scripts/epyc/facts/quantization.py": ["tests/test_quantization.py"],
    "scripts/epyc/decisions/estimate.py": ["tests/test_flag_ranges.py", "tests/test_estimate_memory.py"],
    "scripts/epyc/decisions/model_check.py": [
        "tests/test_flag_ranges.py",
        "tests/test_model_check.py",
        "tests/test_check_model.py",
        "tests/test_quantization.py",
    ],
    "scripts/epyc/decisions/sizing.py": [
        "tests/test_flag_ranges.py",
        "tests/test_cpu_tune.py",
        "tests/test_estimate_memory.py",
    ],
    "scripts/epyc/facts/hostfacts.py": [
        "tests/test_flag_ranges.py",
        "tests/test_hostfacts.py",
        "tests/test_detect.py",
        "tests/test_cpu_tune.py",
    ],
    "scripts/epyc/facts/cpuid.py": ["tests/test_detect.py"],
    # the plan, the smoke judge and the handoff: the verify tests (a fake server each) reach the last two
    "scripts/epyc/decisions/plan_checks.py": ["tests/test_planner.py", "tests/test_launch_plan.py"],
    "scripts/epyc/decisions/planner.py": [
        "tests/test_planner.py",
        "tests/test_launch_plan.py",
        "tests/test_command.py",
    ],
    "scripts/epyc/decisions/handoff.py": ["tests/test_handoff.py", "tests/test_launch_verify.py"],
}


def run_tests(tests: list[str], timeout: float) -> str:
    argv = [PY, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not e2e", *(str(ROOT / t) for t in tests)]
    # subproc.run: a session of its own, so a mutant that hangs in a script the tests started goes with its group
    res = subproc.run(argv, timeout=timeout)
    return "timeout" if res.failure == "timeout" else "survived" if res.returncode == 0 else "killed"


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
    from mutmut import Context
    from mutmut import mutate as mutmut_mutate

    mutated, count = mutmut_mutate(Context(source=source, mutation_id=mutation_id, filename=str(path)))
    if count != 1:
        raise RuntimeError(f"mutation {mutation_id} applied {count} times")
    return mutated


def run_module(module: str, tests: list[str], sample: int | None, seed: int) -> dict:
    path = ROOT / module
    source, ids = mutants(path)
    rng = random.Random(f"{seed}:{module}")  # a module's sample does not depend on which others are listed
    chosen = (
        sorted(rng.sample(ids, sample), key=lambda m: (m.line_number, m.index)) if sample and sample < len(ids) else ids
    )
    t0 = time.monotonic()
    if run_tests(tests, 3600) != "survived":
        return {
            "module": module,
            "error": f"the tests of {module} fail on the unmutated module",
            "fix": f"make `pytest -m 'not e2e' {' '.join(tests)}` pass first",
        }
    timeout = 3 * (time.monotonic() - t0) + 30
    counts = {"killed": 0, "survived": 0, "timeout": 0}
    text_only = dict.fromkeys(counts, 0)
    survivors = []
    try:
        for n, mid in enumerate(chosen, 1):
            mutated = mutate(source, path, mid)
            path.write_text(mutated)
            status = run_tests(tests, timeout)
            path.write_text(source)
            counts[status] += 1
            old_text, new_text = changed_lines(source, mutated)
            prose = is_prose(old_text, new_text)
            text_only[status] += prose
            if status != "killed":
                survivors.append(
                    f"{mid.line_number + 1}: {old_text.strip()}  ->  {new_text.strip() or '(removed)'}"
                    f"  [{status}" + (", prose]" if prose else "]")
                )
            print(
                f"mutation: {module} {n}/{len(chosen)} line {mid.line_number + 1}: {status}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        path.write_text(source)  # the original, whatever happened
    judged = sum(counts.values())
    detected = counts["killed"] + counts["timeout"]
    killed_logic = detected - text_only["killed"] - text_only["timeout"]
    judged_logic = judged - sum(text_only.values())
    return {
        "module": module,
        "tests": tests,
        "mutants_in_module": len(ids),
        "mutants_run": judged,
        **counts,
        "detected": detected,
        "score_pct": round(100 * detected / judged, 1) if judged else None,
        "interval_95_pct": wilson(detected, judged) if len(chosen) < len(ids) else None,
        "prose_mutants": sum(text_only.values()),
        "logic_killed": killed_logic,
        "logic_judged": judged_logic,
        "logic_score_pct": round(100 * killed_logic / judged_logic, 1) if judged_logic else None,
        "survivors": survivors,
    }


def changed_lines(source: str, mutated: str) -> tuple[str, str]:
    """What the mutant changed, as text: a mutant may remove or merge lines, so the line at the mutant's
    index in the mutated file is not always the mutated one."""
    import difflib

    old, new = source.splitlines(), mutated.splitlines()
    diff = [op for op in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes() if op[0] != "equal"]
    if not diff:
        return "", ""
    _, i1, i2, j1, j2 = diff[0]
    return " / ".join(x.strip() for x in old[i1:i2]), " / ".join(x.strip() for x in new[j1:j2])


def is_prose(line: str, mutated_line: str) -> bool:
    """A mutant that only wraps a string with a space in it ("some words" -> "XXsome wordsXX"): a help
    text, note or message, not a decision. Tests assert messages by a needle, which XX...XX keeps, so
    these survive by construction; they are counted apart (logic_score_pct leaves them out)."""
    if mutated_line.replace("XX", "") != line or mutated_line.count("XX") < 2:
        return False
    start = mutated_line.find("XX") + 2
    return " " in mutated_line[start : mutated_line.find("XX", start)]


def main() -> int:
    p = cli.JsonArgumentParser(prog="tests/tools/mutation.py", description=__doc__.split("\n")[0])
    p.add_argument("modules", nargs="*")
    p.add_argument("--sample", type=argtypes.int_in(1, 1 << 20), help="mutants drawn per module (default: every one)")
    p.add_argument("--seed", type=argtypes.int_in(0, 1 << 30), default=0)
    try:
        args = p.parse_args()
    except ScriptError as exc:
        print(json.dumps({"ok": False, "error": exc.error, "fix": exc.fix}))
        return 1
    wanted = args.modules or list(MODULES)
    unknown = [m for m in wanted if m not in MODULES]
    if unknown:
        print(json.dumps({"ok": False, "error": f"no test list for {unknown}", "fix": f"modules: {sorted(MODULES)}"}))
        return 1
    # SIGTERM / SIGHUP (a CI timeout, kill, a closed terminal) unwind like Ctrl-C, through run_module's
    # finally: the file is restored
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        results = [run_module(m, MODULES[m], args.sample, args.seed) for m in wanted]
    except KeyboardInterrupt:
        print(
            json.dumps(
                {
                    "ok": False,
                    "error": "interrupted: no score (the module's file is restored)",
                    "fix": "run it again; --sample N takes less time",
                }
            )
        )
        return 1
    judged = [r for r in results if "error" not in r]
    if len(judged) != len(results):
        failed = [r for r in results if "error" in r]
        print(
            json.dumps(
                {
                    "ok": False,
                    "error": "; ".join(r["error"] for r in failed),
                    "fix": failed[0]["fix"],
                    "modules": results,
                },
                indent=2,
            )
        )
        return 1
    killed, total = sum(r["detected"] for r in judged), sum(r["mutants_run"] for r in judged)
    lk, lj = sum(r["logic_killed"] for r in judged), sum(r["logic_judged"] for r in judged)
    sampled = any(r["mutants_run"] < r["mutants_in_module"] for r in judged)
    # the pooled interval treats the draws as one sample: per-module samples of equal size weigh small and
    # large modules alike, so read it as the suite's score over "a mutant of a decision module"
    print(
        json.dumps(
            {
                "ok": True,
                "sample_per_module": args.sample,
                "seed": args.seed,
                "modules": results,
                "detected": killed,
                "judged": total,
                "score_pct": round(100 * killed / total, 1) if total else None,
                "interval_95_pct": wilson(killed, total) if sampled else None,
                "logic_killed": lk,
                "logic_judged": lj,
                "logic_score_pct": round(100 * lk / lj, 1) if lj else None,
                "logic_interval_95_pct": wilson(lk, lj) if sampled else None,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
