"""The folders are the data flow: a stage imports only from the stages before it.

topoprof's stages in order: the shared base (errors, jsonio, probing, progress); the definitions both the
CLI side and the rank side read (specs: a collective's spec, FSDP2's modes, the device profile's
schema; workload: layouts, presets, the synthetic model's spec); the model zoo (the torch modules
and callables); the meta-device trace; the hardware readers (probes/hardware); topology; the
workers (probes/ranks and probes/device_profile: the rank processes and the device profile);
measure, model, report, scan (the main job), commands, cli. probes/ is installed as
topoprof.probes. Every import counts, also those inside functions.
"""
from __future__ import annotations

import ast
import fcntl
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ORDER = ["base", "specs", "workload", "zoo", "trace", "hardware", "topology", "workers", "measure", "model", "report",
         "scan", "commands", "cli"]
# probes/ sits beside topoprof/ in the repository and is installed as topoprof.probes (pyproject.toml)
PROBES_PACKAGE = "topoprof.probes"


@pytest.fixture(autouse=True)
def _one_at_a_time(tmp_path_factory):
    """Some tests here write a probe module into the source tree that every other one reads:
    across pytest-xdist's workers they take turns, under one file lock."""
    lock = tmp_path_factory.getbasetemp().parent / "topoprof-layering.lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


def _stage(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "topoprof":
        return None
    if len(parts) == 1 or parts[1] in ("errors", "jsonio", "probing", "progress"):
        return "base"
    if parts[1] == "probes":
        return "hardware" if len(parts) == 2 or parts[2] == "hardware" else "workers"
    if parts[1] in ("cli", "__main__"):
        return "cli"
    return parts[1] if parts[1] in ORDER else None


def _path_of(module: str) -> Path:
    """Where a module of the project lives, without its suffix."""
    parts = module.split(".")
    if module.startswith(PROBES_PACKAGE):
        return ROOT / Path(*parts[1:])
    return ROOT / Path(*parts)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "probes":
        parts = ["topoprof", *parts]
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
                as_path = _path_of(candidate)
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
            if ORDER.index(there) > ORDER.index(here):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target} ({here} -> {there})")
    return bad


def test_nothing_imports_probes_by_its_folder_name():
    # in a checkout the folder probes/ is importable from the root as `probes`; installed, it is not
    stray = [f"{p.relative_to(ROOT)}:{line} imports {target}" for p in [*_sources(), *(ROOT / "tests").rglob("*.py")]
             for line, target in _imports(p) if target.split(".")[0] == "probes"]
    assert stray == []


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


@pytest.mark.parametrize("package", ["specs", "workload", "zoo", "trace", "topology", "measure", "model", "report",
                                     "scan"])
def test_each_stage_says_what_it_takes_and_gives(package):
    doc = ast.get_docstring(ast.parse((ROOT / "topoprof" / package / "__init__.py").read_text()))
    assert doc is not None and "stage" in doc.lower() and "gives" in doc


# The model's rooms (topoprof/model/__init__.py), each on a level: a room imports only rooms on
# lower levels (or itself). Rooms on one level are siblings and use none of each other.
MODEL_LEVELS = {"comm": 0, "compute": 1, "ddp": 2, "fsdp": 2, "memory": 2, "strategies": 3,
                "inputs": 4, "validate": 5}


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["topoprof", "model"] else None


def _room_violations() -> list[str]:
    bad = []
    for path in (ROOT / "topoprof" / "model").rglob("*.py"):
        here = _room(_module_name(path))
        if here is None:
            continue
        for line, target in _imports(path):
            there = _room(target)
            if there is None or there == here:
                continue
            if there not in MODEL_LEVELS or MODEL_LEVELS[there] >= MODEL_LEVELS[here]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target} ({here} -> {there})")
    return bad


def test_every_model_module_is_in_a_room_that_says_what_it_owns_and_may_import():
    model = ROOT / "topoprof" / "model"
    loose = sorted(p.name for p in model.glob("*.py") if p.name != "__init__.py")
    assert loose == [], "a module of the model outside its rooms"
    rooms = sorted(p.name for p in model.iterdir() if (p / "__init__.py").exists())
    assert rooms == sorted(MODEL_LEVELS)
    for room in rooms:
        doc = ast.get_docstring(ast.parse((model / room / "__init__.py").read_text()))
        assert doc and "Owns:" in doc and "May import:" in doc, room


def test_no_model_room_imports_a_room_above_or_beside_it():
    assert _room_violations() == []


def test_the_room_check_sees_an_import_up(tmp_path):
    bad = ROOT / "topoprof" / "model" / "comm" / "_room_probe.py"
    bad.write_text("def f():\n    from topoprof.model.strategies.predict import predict\n")
    try:
        assert any("_room_probe.py:2 imports topoprof.model.strategies.predict (comm -> strategies)" in v
                   for v in _room_violations())
    finally:
        bad.unlink()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _module_graph() -> dict[str, set[str]]:
    modules = {_module_name(p) for p in _sources()}
    graph: dict[str, set[str]] = {}
    for path in _sources():
        me = _module_name(path)
        graph[me] = {t for _, t in _imports(path) if t in modules and t != me}
    return graph


def test_no_import_circles_between_files():
    assert _cycles(_module_graph()) == []


def test_the_circle_check_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_a_worker_reaching_up_into_measure_is_caught():
    bad = ROOT / "probes" / "ranks" / "_layering_probe.py"
    bad.write_text("def f():\n    from topoprof.measure.launch import launch_local\n")
    try:
        assert any("_layering_probe.py:2 imports topoprof.measure.launch (workers -> measure)" in v
                   for v in _violations())
    finally:
        bad.unlink()


def test_probes_hold_probes_alone_in_rooms_by_concern():
    loose = sorted(p.name for p in (ROOT / "probes").glob("*.py") if p.name != "__init__.py")
    assert loose == []
    rooms = sorted(p.name for p in (ROOT / "probes").iterdir() if (p / "__init__.py").exists())
    assert rooms == ["device_profile", "hardware", "ranks"]


# `topoprof model` gathers (model/inputs/gather.py: processes, files, hardware), then predicts
# from what was gathered alone: these modules, and all they import, run and read nothing.
PREDICT_STAGE = ("topoprof.model.inputs.resolve", "topoprof.model.inputs.search",
                 "topoprof.model.strategies.model_plan", "topoprof.model.strategies.model_report")
# where processes run, the hardware is read, or torch is imported
NOT_IN_PREDICT = ("topoprof.measure", "topoprof.probes", "topoprof.trace", "topoprof.topology.collect",
                  "topoprof.model.inputs.gather", "topoprof.model.inputs.traces", "topoprof.model.inputs.user_model",
                  "subprocess", "multiprocessing", "torch", "pynvml")


def _runtime_imports(path: Path) -> list[str]:
    """What a file imports when it runs: `_imports` less those under `if TYPE_CHECKING:` (types only)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                   for stmt in node.body for n in ast.walk(stmt)}
    lines = {n.lineno for n in ast.walk(tree) if id(n) in typing_only and isinstance(n, (ast.Import, ast.ImportFrom))}
    return [target for line, target in _imports(path) if line not in lines]


def _reached(start: tuple[str, ...]) -> dict[str, list[str]]:
    """Every module the `start` modules import when they run, directly or not, with each one's
    own imports (the project's and the others')."""
    sources = {_module_name(p): p for p in _sources()}
    seen: dict[str, list[str]] = {}
    todo = list(start)
    while todo:
        module = todo.pop()
        if module in seen or module not in sources:
            continue
        seen[module] = _runtime_imports(sources[module])
        todo += [t for t in seen[module] if t in sources]
    return seen


def _impure(start: tuple[str, ...]) -> list[str]:
    return sorted(f"{module} imports {target}" for module, targets in _reached(start).items() for target in targets
                  for banned in NOT_IN_PREDICT if target == banned or target.startswith(banned + "."))


def test_the_model_commands_predict_stage_runs_and_reads_nothing():
    assert _impure(PREDICT_STAGE) == []


def test_the_predict_check_sees_a_gather_reached_through_a_pure_module():
    assert "topoprof.model.inputs.gather imports topoprof.measure.runner" in _impure(("topoprof.model.inputs.gather",))
    assert any(line.startswith("topoprof.model.inputs.user_model imports topoprof.measure")
               for line in _impure(("topoprof.model.inputs.gather",)))
