"""Mutation testing of the decision modules: does the fast suite notice when their logic changes?

    .venv/bin/python tests/tools/mutation.py                  # every module below (tens of minutes on 2 cores)
    .venv/bin/python tests/tools/mutation.py scripts/kv_cache.py

mutmut 2.5 (`pip install -e .[mutation]`) changes one thing in the file on disk (an operator, a
number, a string, a return), runs the module's tests, and puts it back. File-level mutation is why
2.5 and not 3.x: most of this suite runs the scripts as subprocesses, which an in-process mutant
(mutmut 3's trampolines) never reaches. A mutant is killed when a test fails; the score is killed /
(killed + survived + timeout). Prints one JSON document: the score per module and the survivors'
ids (inspect one with `python -m mutmut show ID`).
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
# each decision module with the tests that exercise it (fast ones: no vLLM, no container engine)
MODULES = {
    "scripts/kv_cache.py": ["tests/test_estimate_memory.py", "tests/test_quantization.py"],
    "scripts/quantization.py": ["tests/test_quantization.py"],
    "scripts/check_model.py": ["tests/test_check_model.py"],
    "scripts/cpu_tune.py": ["tests/test_cpu_tune.py"],
}
STATUSES = ("killed", "survived", "timeout", "suspicious", "skipped")


def mutmut(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "mutmut", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def run_module(module: str, tests: list[str]) -> dict:
    (ROOT / ".mutmut-cache").unlink(missing_ok=True)
    runner = shlex.join([PY, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not e2e", *tests])
    mutmut("run", "--paths-to-mutate", module, "--runner", runner, "--no-progress", timeout=4 * 3600)
    counts, survivors = {}, []
    for status in STATUSES:
        ids = mutmut("result-ids", status, timeout=120).stdout.split()
        counts[status] = len(ids)
        if status == "survived":
            survivors = ids
    judged = counts["killed"] + counts["survived"] + counts["timeout"]
    return {"module": module, "tests": tests, **counts,
            "score_pct": round(100 * counts["killed"] / judged, 1) if judged else None, "survivor_ids": survivors}


def main() -> int:
    wanted = sys.argv[1:] or list(MODULES)
    unknown = [m for m in wanted if m not in MODULES]
    if unknown:
        print(json.dumps({"ok": False, "error": f"no test list for {unknown}", "fix": f"one of {sorted(MODULES)}"}))
        return 1
    results = [run_module(m, MODULES[m]) for m in wanted]
    killed = sum(r["killed"] for r in results)
    judged = sum(r["killed"] + r["survived"] + r["timeout"] for r in results)
    print(json.dumps({"ok": True, "modules": results, "killed": killed, "judged": judged,
                      "score_pct": round(100 * killed / judged, 1) if judged else None}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
