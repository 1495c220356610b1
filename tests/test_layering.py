"""The folders are the data flow: a stage imports only from the stages before it.

topoprof's stages in order: the shared base (errors, jsonio, probing), topology, measure, model,
report, scan (the main job), commands, cli. probes/ is the hardware and the rank side: any stage
may use it, and it may use the pure definitions of topology, measure and model (a collective's
spec, the synthetic model), never report, scan, commands or the CLI. Every import counts, also
those inside functions.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ORDER = ["base", "topology", "measure", "model", "report", "scan", "commands", "cli"]
PROBES_MAY_USE = {"base", "topology", "measure", "model"}


def _stage(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "probes":
        return "probes"
    if parts[0] != "topoprof":
        return None
    if len(parts) == 1 or parts[1] in ("errors", "jsonio", "probing"):
        return "base"
    if parts[1] in ("cli", "__main__"):
        return "cli"
    return parts[1] if parts[1] in ORDER else None


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports, anywhere in it: `from a.b import c` counts a.b.c when that is
    a module of the project, else a.b."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                as_path = ROOT / Path(*candidate.split("."))
                is_module = as_path.with_suffix(".py").exists() or (as_path / "__init__.py").exists()
                found.append((node.lineno, candidate if is_module else node.module))
    return found


def _sources() -> list[Path]:
    return sorted([*(ROOT / "topoprof").rglob("*.py"), *(ROOT / "probes").rglob("*.py")])


def _violations() -> list[str]:
    bad = []
    for path in _sources():
        here = _stage(_module_name(path))
        for line, target in _imports(path):
            there = _stage(target)
            if there is None or here is None or there == here:
                continue
            where = f"{path.relative_to(ROOT)}:{line} imports {target} ({here} -> {there})"
            if here == "probes":
                if there not in PROBES_MAY_USE:
                    bad.append(where)
            elif there != "probes" and ORDER.index(there) > ORDER.index(here):
                bad.append(where)
    return bad


def test_every_module_belongs_to_a_stage():
    unplaced = [str(p.relative_to(ROOT)) for p in _sources() if _stage(_module_name(p)) is None]
    assert unplaced == []


def test_no_stage_imports_a_later_one():
    assert _violations() == []


def test_the_check_sees_imports_inside_functions(tmp_path, monkeypatch):
    # A model module reaching up into a command, inside a function, is caught.
    bad = ROOT / "topoprof" / "model" / "_layering_probe.py"
    bad.write_text("def f():\n    from topoprof.commands.model import model\n")
    try:
        assert any("_layering_probe.py:2 imports topoprof.commands.model (model -> commands)" in v
                   for v in _violations())
    finally:
        bad.unlink()


@pytest.mark.parametrize("package", ["topology", "measure", "model", "report", "scan"])
def test_each_stage_says_what_it_takes_and_gives(package):
    doc = ast.get_docstring(ast.parse((ROOT / "topoprof" / package / "__init__.py").read_text()))
    assert doc is not None and "stage" in doc.lower() and "gives" in doc


def _probe_imports() -> dict[str, set[str]]:
    """Each probes module and the probes modules it imports (anywhere in it)."""
    modules = {_module_name(p): p for p in (ROOT / "probes").rglob("*.py")}
    return {name: {t for _, t in _imports(path) if t in modules and t != name} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, each once from the module that starts it (a depth-first walk)."""
    found, done = [], set()

    def walk(node, path):
        if node in path:
            found.append(path[path.index(node):] + [node])
            return
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            walk(nxt, path + [node])
        done.add(node)

    for start in sorted(graph):
        walk(start, [])
    return found


# training's numerics check reaches FSDP's numerics lazily, and FSDP's loop reuses training's
# step: a circle older than this check, to be broken on its own
KNOWN_CIRCLES = [["probes.fsdp", "probes.training", "probes.fsdp"]]


def test_no_two_probes_import_each_other():
    # lazily or not: a circle means neither module can be read without the other
    assert [c for c in _cycles(_probe_imports()) if c not in KNOWN_CIRCLES] == []


def test_the_circle_check_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
