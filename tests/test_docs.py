"""The docs never drift from the scripts: the skill validates, every script command in SKILL.md and
README.md uses flags the script accepts, the field names SKILL.md promises exist in the schemas, and
the README's example outputs are what the scripts print."""

import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from conftest import ROOT, SCHEMAS, run_script
from docs import commands

ALL = commands("SKILL.md") + commands("README.md")


def test_agent_skills_validator_passes(tmp_path):
    skill = tmp_path / "serving-llms-on-epyc"  # the validator wants the folder named like the skill
    skill.mkdir()
    for name in ("SKILL.md", "reference.md", "README.md", "data", "scripts"):
        (skill / name).symlink_to(ROOT / name)
    res = subprocess.run(
        [str(Path(sys.executable).parent / "agentskills"), "validate", str(skill)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_skill_md_size_and_frontmatter():
    text = (ROOT / "SKILL.md").read_text()
    assert len(text.splitlines()) < 281
    front = text.split("---")[1]
    assert "name: serving-llms-on-epyc" in front
    desc = re.search(r"description: >-\n(.*?)\n[a-z-]+:", front, re.S).group(1)
    assert len(" ".join(desc.split())) <= 1024
    for must in ("Instinct", "AVX-512", "stock"):
        assert must in desc


def test_docs_have_commands_for_every_step():
    skill = {(c.script, c.subcommand) for c in commands("SKILL.md")}
    for want in [
        ("bootstrap.py", None),
        ("setup_host_stack.py", None),
        ("detect.py", None),
        ("validate.py", None),
        ("check_model.py", None),
        ("estimate_memory.py", None),
        ("cpu_tune.py", None),
        ("launch.py", "plan"),
        ("launch.py", "start"),
        ("launch.py", "verify"),
        ("launch.py", "handoff"),
        ("launch.py", "stop"),
        ("kernel_proof.py", None),
    ]:
        assert want in skill, want


@cache
def help_text(script: str, sub: str | None) -> str:
    argv = [sys.executable, str(ROOT / "scripts" / script), *([sub] if sub else []), "--help"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


@pytest.mark.parametrize("cmd", ALL, ids=lambda c: f"{c.doc}:{c.script}:{' '.join(c.flags)}")
def test_every_documented_flag_exists(cmd):
    assert (ROOT / "scripts" / cmd.script).exists()
    text = help_text(cmd.script, cmd.subcommand)
    for flag in cmd.flags:
        assert re.search(rf"(^|[\s\[,]){re.escape(flag)}([\s=,\]]|$)", text, re.M), f"{cmd.line}: {flag} unknown"


def schema_words() -> set[str]:
    words: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "properties" and isinstance(v, dict):
                    words.update(v)
                if k in ("required", "enum") and isinstance(v, list):
                    words.update(x for x in v if isinstance(x, str))
                walk(v)
        elif isinstance(node, list):
            for x in node:
                walk(x)

    for path in SCHEMAS.glob("*.json"):
        walk(json.loads(path.read_text()))
    return words


def test_field_names_promised_by_skill_md_exist_in_the_schemas():
    text = (ROOT / "SKILL.md").read_text()
    promised = set()
    for tok in re.findall(r"`([a-z][a-z0-9_.]*)`", text):
        if "." in tok and tok.split(".")[-1] in ("json", "md", "py"):
            continue  # a file name
        promised.update(
            part
            for part in tok.split(".")
            if "_" in part or part in ("fit", "stack", "fix", "error", "phase", "env", "kind", "python")
        )
    missing = sorted(promised - schema_words())
    assert not missing, f"SKILL.md names fields no schema has: {missing}"


def test_readme_examples_print_what_the_readme_shows():
    mistral = run_script(
        "check_model.py", "--model", "tests/fixtures/models/Mistral-7B-v0.1", "--vllm-version", "0.32.0"
    ).doc
    assert (mistral["kind"], mistral["primary_endpoint"], mistral["supported_endpoints"]) == (
        "text",
        "completions",
        ["completions"],
    )
    llama = run_script(
        "estimate_memory.py",
        "--model",
        "tests/fixtures/models/Llama-3.1-8B-Instruct",
        "--ram-gb",
        "24",
        "--max-model-len",
        "131072",
    )
    f = llama.doc["fit"]
    assert llama.code == 1 and (llama.doc["weight_gb"], f["required_gb"], f["suggested_max_model_len"]) == (
        14.96,
        32.96,
        57600,
    )
    readme = (ROOT / "README.md").read_text()
    assert '"suggested_max_model_len": 57600' in readme and '"required_gb": 32.96' in readme
    det = run_script("detect.py").doc
    assert {"cpu_model", "epyc_generation", "generation_source", "allowed_cpus"} <= det.keys()
    tune = run_script("cpu_tune.py", "--weight-gb", "1.11", "--kv-needed-gb", "0.44")
    assert tune.code == 0 and tune.doc["env"]["VLLM_CPU_OMP_THREADS_BIND"] == tune.doc["vllm_cpu_omp_threads_bind"]


def test_reference_hardware_table_matches_data():
    data = json.loads((ROOT / "data" / "epyc.json").read_text())
    table = (ROOT / "reference.md").read_text()
    for g in data["generations"]:
        row = next(
            (ln for ln in table.splitlines() if ln.startswith(f"| {g['name']}") and g["zen_arch"] + " |" in ln), None
        )
        assert row, f"no reference.md row for {g['name']} {g['zen_arch']}"
        assert ("yes / yes" in row) == (g["avx512"] and g["avx512_bf16"])
        for fam, lo, _hi in g["cpuid"]:
            assert f"0x{fam:X} / 0x{lo:02X}" in row
        supported = g["name"] in data["supported_generations"]
        assert ("validated" in row and "unvalidated" not in row) == supported, row


def test_reference_lists_every_gotcha_topic():
    text = (ROOT / "reference.md").read_text()
    for needle in (
        "--device cpu",
        "TORCHINDUCTOR_FREEZING",
        "--shm-size",
        "rootless podman",
        "NFS",
        "name already in use",
        "GNU_STACK",
        "--network=host",
    ):
        assert needle in text, needle


GLOSSARY_BANNED = {
    "memory_gb",
    "weights_gb",
    "served_model",
    "model_id",
    "conda_launch_prefix",
    "conda_launch_prefix_argv",
    "conda_pin_tool",
    "conda_path_available",
    "kv_cache_gb",
    "vllm_cpu_kvcache_space_gb",
    "nps_note",
    "warning",
    "generation",
    "endpoint",
    "mount",
}


def schema_field_names() -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}

    def walk(s, where):
        if not isinstance(s, dict):
            return
        for k, v in (s.get("properties") or {}).items():
            names.setdefault(k, set()).add(where)
            walk(v, where)
        for k in s.get("required", []):
            names.setdefault(k, set()).add(where)
        for k in ("items", "additionalProperties"):
            walk(s.get(k), where)
        for k in ("oneOf", "anyOf", "allOf"):
            for sub in s.get(k, []):
                walk(sub, where)
        for sub in (s.get("$defs") or {}).values():
            walk(sub, where)

    for f in sorted(SCHEMAS.glob("*.json")):
        if f.stem not in ("epyc", "model_config"):  # the pinned facts and a model's config are not our outputs
            walk(json.loads(f.read_text()), f.stem)
    return names


def test_every_output_field_is_in_the_glossary_and_no_old_synonym_is_back():
    text = (ROOT / "reference.md").read_text().split("## Glossary: one name for one thing", 1)[1]
    rows = [ln for ln in text.splitlines() if ln.startswith("| `")]
    glossary = {n for row in rows for n in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", row.split(" | ")[0])}
    names = schema_field_names()
    missing = {n: sorted(w) for n, w in names.items() if n not in glossary}
    assert not missing, f"fields outside the glossary in reference.md: {missing}"
    assert not (set(names) & GLOSSARY_BANNED), set(names) & GLOSSARY_BANNED
    seen: dict[str, int] = {}
    for row in rows:  # one row per concept: a name is defined once
        for n in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", row.split(" | ")[0]):
            seen[n] = seen.get(n, 0) + 1
    assert not [n for n, c in seen.items() if c > 1]


def test_every_pinned_fact_is_read_by_a_script():
    """data/epyc.json is the single source: each of its keys is read by the scripts (maps whose keys are
    data -- environment variables, a pip list -- count as one key)."""
    epyc = json.loads((ROOT / "data" / "epyc.json").read_text())
    source = "\n".join(p.read_text() for p in (ROOT / "scripts").rglob("*.py"))
    keys: set[str] = set()

    def walk(x, parent=None):
        if isinstance(x, dict):
            for k, v in x.items():
                keys.add(k)
                if k != "env":  # throughput_flags.env: a map of variables, copied whole
                    walk(v, k)
        elif isinstance(x, list):
            for v in x:
                walk(v, parent)

    walk(epyc)
    # stacks: its rows' names are data (a map, like env) and their evidence is read by reference.md's table
    keys.difference_update([*epyc["stacks"], "evidence"])
    unread = sorted(k for k in keys if f'"{k}"' not in source and f"'{k}'" not in source)
    assert not unread, f"keys of data/epyc.json no script reads: {unread}"


def test_readme_example_outputs_use_the_fields_the_scripts_print():
    """Each README example's JSON (after the command that prints it) names only top-level fields its
    script's schema has: an example never shows a renamed or invented field."""
    text = (ROOT / "README.md").read_text()
    pairs = re.findall(r"```bash\npython3 scripts/([a-z_]+)\.py([^\n]*)\n```\n```json\n(.*?)\n```", text, re.S)
    assert len(pairs) >= 8
    for script, args, body in pairs:
        sub = args.split()[0] if script == "launch" else None
        schema = json.loads((SCHEMAS / f"{script}.json").read_text())
        allowed = set(schema.get("properties") or {}) | set(schema.get("required") or [])
        for alt in [*schema.get("oneOf", []), *(schema.get("$defs") or {}).values()]:
            if alt.get("title") == sub or (sub is None and alt.get("title") in ("host facts", None)):
                allowed |= set(alt.get("properties") or {}) | set(alt.get("required") or [])
        keys = set(json.loads(body))
        assert keys and keys <= allowed, (script, sorted(keys - allowed))


def test_skill_md_planning_for_another_host_runs_as_written(tmp_path):
    """SKILL.md's plan for a host that is not reachable yet, each line run by bash in a fresh shell as written
    (no variable survives between them), the user's config.json given where the line names it: the 9654
    request of the issue, with the Hub unreachable. Nothing is installed or probed here: a PATH of python3
    alone (no docker, podman, numactl), an empty home (no host stack, no router), no network. The same
    chain's fleet plan, exposed with a key that is set there, not here, names the router to install there."""
    import subprocess
    import sys

    lines = [c.line for c in commands("SKILL.md") if c.tag == "another host"]
    assert len(lines) == 6
    lines.append(
        "python3 scripts/launch.py plan --engines per-socket --expose --plain-http --api-key-env BOX_KEY --run box"
    )
    # reference.md's several hosts: a second host's chain, then the front router over both (it runs here)
    lines += [line.replace("--run box", "--run box2") for line in lines]
    lines.append(
        "BOX_KEY=0123456789abcdef python3 scripts/launch.py plan --hosts box=10.0.0.5 box2=10.0.0.6 --api-key-env BOX_KEY --run front"
    )
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").symlink_to(sys.executable)
    env = {
        "PATH": str(tmp_path / "bin"),
        "HOME": str(tmp_path / "home"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),  # where `--run box` lives
        "HF_HUB_OFFLINE": "1",
        "HF_ENDPOINT": "http://127.0.0.1:1",
    }
    config = ROOT / "tests" / "fixtures" / "models" / "Qwen3-0.6B" / "config.json"
    for line in lines:
        res = subprocess.run(
            ["/bin/bash", "-c", line.replace("config.json", str(config))],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, line + "\n" + res.stdout[-1500:] + res.stderr[-1500:]
    box = tmp_path / "cache" / "serving-llms-on-epyc" / "run" / "box"
    tune = json.loads((box / "cpu_tune.json").read_text())
    assert tune["target"].startswith("spec:EPYC 9654") and tune["vllm_cpu_omp_threads_bind"] == "0-95"
    assert json.loads((box / "estimate_memory.json").read_text())["avx512_bf16"] is True  # the 9654's
    assert json.loads((box / "validate.json").read_text())["deferred"]
    front = json.loads(res.stdout)
    assert front["kind"] == "front" and len(front["hosts"]) == 2, front
    fleet = json.loads((box / "plan.json").read_text())
    assert "there, first: python3 scripts/setup_host_stack.py --router" in fleet["summary_markdown"]
    plan = json.loads((box / "engine-0" / "plan.json").read_text())
    assert plan["deferred"] and "--cpuset-mems=0" in plan["argv"] and "--device" not in plan["argv"]
    assert plan["stop_command"].startswith("docker stop")
    # the human reads the fleet's summary: the key reaches the engines only through a start on that host
    assert "$BOX_KEY reaches the server only through launch.py start there" in fleet["summary_markdown"]


def stacks_table() -> str:
    """reference.md's table of serving stacks, rendered from data/epyc.json `stacks` (the one source)."""
    epyc, word = json.loads((ROOT / "data" / "epyc.json").read_text()), {True: "yes", False: "no", "unknown": "unknown"}
    claims = ("tensor_parallel", "fleet", "restart", "compressed-tensors", "awq", "kernel_proof")
    lines = [
        "| stack | path, backend | vLLM / zentorch | set up by | " + " | ".join(claims) + " |",
        "|---" * (4 + len(claims)) + "|",
    ]
    notes = []
    for name, row in epyc["stacks"].items():
        pins = epyc[row["pins"]]
        zentorch = pins.get("zentorch_version") if row["backend"] == "zentorch" else "-"
        seen = {**row["verified"], **{q["method"]: q for q in row["verified"]["quantization"]}}
        cells = [word[seen[c]["value"]] for c in claims]
        setup = f"`{row['setup']}`" if row["setup"] else "pulled by start"
        where = f"{row['path']}, {row['backend']}"
        lines.append(
            f"| `{name}`: {row['label']} | {where} | {pins['vllm_version']} / {zentorch} | {setup} | "
            + " | ".join(cells)
            + " |"
        )
        notes += [f"- `{name}` {c}: {word[seen[c]['value']]}, {seen[c]['evidence']}" for c in claims]
    return "\n".join(lines) + "\n\nThe evidence:\n\n" + "\n".join(notes)


def test_reference_md_lists_the_stacks_as_the_data_has_them():
    """The stacks table in reference.md is data/epyc.json's, as stacks_table() renders it."""
    assert stacks_table() in (ROOT / "reference.md").read_text()
