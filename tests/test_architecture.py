"""The house's shape, read from the source: four layers over the contract, no cycle, no import upward, at most 10
levels, small modules and functions, one lifecycle entry, one stop-command builder, one KV budget."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "scripts" / "epyc"
MAX_LEVELS, MAX_MODULE_LINES, MAX_FUNCTION_LINES = 10, 500, 60
ORDER = ("contract", "facts", "decisions", "deployments", "verbs")


def modules() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PKG.rglob("*.py")) if p.stem != "__init__"}


def layer_of(path: Path) -> str:
    """The layer is the folder under scripts/epyc; the package's root is the contract every layer shares."""
    folder = path.parent.relative_to(PKG).parts
    return folder[0] if folder else "contract"


@functools.cache
def graph() -> dict[str, set[str]]:
    """Each module's imports of the package's modules, wherever they stand (in a function too)."""
    mods = modules()
    deps = {}
    for name, path in mods.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "epyc"):
                found.update(part for part in (node.module or "").split(".") if part in mods)
                found.update(alias.name for alias in node.names if alias.name in mods)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "epyc":
                        found.update(part for part in alias.name.split(".") if part in mods)
        deps[name] = found - {name}
    return deps


def levels() -> dict[str, int]:
    deps = graph()

    @functools.cache
    def level(name: str, path: tuple = ()) -> int:
        assert name not in path, f"import cycle: {' -> '.join((*path, name))}"
        return 1 + max((level(d, (*path, name)) for d in deps[name]), default=0)

    return {name: level(name) for name in deps}


def test_every_module_has_a_layer():
    assert [name for name, path in modules().items() if layer_of(path) not in ORDER] == []


def test_no_cycle_and_at_most_ten_levels():
    lv = levels()
    deep = {name: n for name, n in lv.items() if n > MAX_LEVELS}
    chain = []
    name = max(lv, key=lv.get)
    while name:  # the longest chain, to say where to cut
        chain.append(name)
        name = max(graph()[name], key=lv.get, default=None)
    assert not deep, f"{len(deep)} modules past level {MAX_LEVELS}; the longest chain: {' -> '.join(chain)}"


def test_a_module_imports_only_its_layer_or_below():
    mods = modules()
    rank = {name: ORDER.index(layer_of(path)) for name, path in mods.items() if layer_of(path) in ORDER}
    upward = sorted(
        f"{name} ({layer_of(mods[name])}) -> {dep} ({layer_of(mods[dep])})"
        for name, deps in graph().items()
        for dep in deps
        if name in rank and dep in rank and rank[dep] > rank[name]
    )
    assert upward == []


def test_no_module_over_500_lines_and_no_function_over_60():
    big, long = [], []
    for path in sorted((ROOT / "scripts").rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(ROOT).as_posix()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            big.append(f"{rel}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    assert big == [] and long == []


def test_launch_verbs_enter_the_lifecycle_only_through_deployment_act():
    tree = ast.parse((ROOT / "scripts" / "launch.py").read_text())
    lifecycle = {"serve_start", "serve_stop", "serve_verify", "serve_procs", "process", "handoff"}
    imported = {
        part for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for part in (node.module or "").split(".")
    }
    imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for a in node.names}
    assert imported & lifecycle == set()
    acts = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "deployment"
        and node.attr == "act"
    ]
    assert len(acts) == 1


def test_one_stop_command_builder():
    defined = [
        f"{path.relative_to(ROOT)}"
        for path in sorted((ROOT / "scripts").rglob("*.py"))
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name == "stop_command"
    ]
    assert len(defined) == 1, defined


def test_max_num_seqs_is_computed_only_in_kv_budget():
    """Elsewhere --max-num-seqs is only read: from the grant kv_budget computed, or from a plan's argv."""
    computed = []
    for name, path in modules().items():
        if name == "kv_budget":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if any(isinstance(t, ast.Name) and t.id == "max_num_seqs" for t in targets):
                computed.append(f"{name}:{node.lineno} assigns max_num_seqs")
            if isinstance(node, ast.keyword) and node.arg == "max_num_seqs":
                computed.append(f"{name}:{node.value.lineno} passes max_num_seqs=")
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    read = any(isinstance(n, ast.Attribute) and n.attr == "max_num_seqs" for n in ast.walk(value))
                    if isinstance(key, ast.Constant) and key.value == "--max-num-seqs" and not read:
                        computed.append(f"{name}:{key.lineno} sets --max-num-seqs")
    assert computed == []
