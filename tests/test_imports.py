"""The package's import graph: no cycle, no upward import, no sys.path edits, one PROJECT_ROOT.

Walks every module's import statements (module level and inside functions) with ``ast``, so
it checks the code as written, not what one test run happens to import. Loads made at run time
count too: ``importlib.import_module`` / ``__import__`` with a literal name is an edge to that
module; one with a computed name must be declared in ``DYNAMIC_IMPORTS`` with the modules it
can load (read from the live registry), and ``sys.modules[<computed>]`` reads are refused. An
import of ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first: those are edges too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pipelines import engines, platforms
from pipelines.runfolder.paths import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "pipelines"
_LOADERS = {"import_module", "__import__"}


def dynamic_imports() -> dict[str, list[str]]:
    """Module -> what its computed-name loads can import (everything they can, from the registry)."""
    return {
        # the declarations: the project's packages and BENCHMARK_PLATFORMS' plug-ins
        "pipelines.platforms": [f"pipelines.platforms.{name}" for name in platforms.BUILTIN] + platforms.plugin_modules(),
        "pipelines.run.cells": [p.adapter.partition(":")[0] for p in platforms.all_platforms()],  # adapters
        "pipelines.run.driver": [p.adapter.partition(":")[0] for p in platforms.all_platforms()],  # a driver's
        "pipelines.engines": [f"pipelines.engines.{name}" for name in engines.ENGINES],  # their declarations
        "pipelines.run.services": [s.partition(":")[0] for s in engines.services()] +
                                  [s.partition(":")[0] for p in platforms.all_platforms() for s in p.services],
        # plug-in platforms' packages; PIPELINES_EPOCH_END_HOOK: a test's or a user's module, never ours
        "pipelines.training.cell": [p.package for p in platforms.all_platforms() if not platforms.is_builtin(p)],
    }


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _loads(node: ast.AST) -> tuple[str | None, bool] | None:
    """(literal module name or None, is a load) for an importlib / sys.modules call or read."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in _LOADERS and node.args:
            arg = node.args[0]
            return (arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None), True
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Attribute) \
            and node.value.attr == "modules" and getattr(node.value.value, "id", None) == "sys":
        key = node.slice
        return (key.value if isinstance(key, ast.Constant) else None), True
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, top: str, dynamic: dict[str, list[str]], module: str) -> set[str]:
    """``top``.* modules imported by this file (``from a import b`` counts a.b if a module)."""
    found = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
                   for stmt in block.body for n in ast.walk(stmt)}  # never run: no edge
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif (load := _loads(node)) is not None:
            name, _ = load
            if name is not None:
                found.add(name)
            elif module not in dynamic:
                raise AssertionError(f"{module}: a computed-name import or sys.modules read; declare what it can "
                                     "load in tests/test_imports.py DYNAMIC_IMPORTS")
            else:
                found.update(dynamic[module])
    return {name for name in found if name.split(".")[0] == top}


def import_graph(root: Path = PROJECT_ROOT, top: str = "pipelines",
                 dynamic: dict[str, list[str]] | None = None) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, statically or by a load at run time, and
    the parent packages those imports run first."""
    dynamic = dynamic_imports() if dynamic is None else dynamic
    modules = {_module_name(p, root): p for p in (root / top).rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for dep in _imports(path, top, dynamic, name):
            parts = dep.split(".")
            deps.update(".".join(parts[:k]) for k in range(2, len(parts) + 1))  # a.b.c runs a.b first
        # importing a.b runs a/__init__: a submodule's edges to its own parent packages are no cycle
        graph[name] = {d for d in deps if d in modules and d != name and not name.startswith(d + ".")}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by a depth-first search (module-level and function-level imports)."""
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    return cycles


def test_no_import_cycle():
    assert find_cycles(import_graph()) == []


def test_a_cycle_through_importlib_is_found(tmp_path):
    """The graph sees a cycle closed at run time: a imports b, b loads a by importlib."""
    pkg = tmp_path / "toy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from toy import b\n")
    (pkg / "b.py").write_text("import importlib\n\ndef late():\n    return importlib.import_module('toy.a')\n")
    assert find_cycles(import_graph(tmp_path, "toy", {})) == [["toy.a", "toy.b", "toy.a"]]
    (pkg / "b.py").write_text("import importlib\n\ndef late(name):\n    return importlib.import_module(name)\n")
    with pytest.raises(AssertionError, match="computed-name import"):
        import_graph(tmp_path, "toy", {})
    assert find_cycles(import_graph(tmp_path, "toy", {"toy.b": ["toy.a"]})) == [["toy.a", "toy.b", "toy.a"]]


# The layers, bottom first: a module imports its own layer and those below it, never one above.
# "registry": pipelines.platforms itself, its fields and each platform's declaration (its package's
# __init__), and pipelines.engines with each engine's declaration (its package's __init__: settings
# and service; a platform on an engine declares the engine's model); the adapters, the engines'
# modules and the rest of pipelines/platforms/ sit with training.
LAYERS = ({"registry", "config", "runfolder"},
          {"training", "platforms", "measure", "cluster", "data", "engines", "whatif"},
          {"evaluation"},
          {"report", "tracking"},
          {"web"},
          {"run"})


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None  # the package itself, pipelines.__main__: the entry points
    group = parts[1]
    if group == "platforms" and (len(parts) == 2 or parts[2] == "fields" or
                                 (len(parts) == 3 and parts[2] in platforms.BUILTIN)):
        group = "registry"
    if group == "engines" and (len(parts) == 2 or (len(parts) == 3 and parts[2] in engines.ENGINES)):
        group = "registry"
    found = [k for k, layer in enumerate(LAYERS) if group in layer]
    assert found or group == "__main__", f"{module}: its folder {group!r} is in no layer of LAYERS"
    return found[0] if found else None


def arrows_up(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, deps in graph.items() for b in deps
                  if layer_of(a) is not None and layer_of(b) is not None and layer_of(b) > layer_of(a))


def test_imports_point_down_the_layers():
    assert arrows_up(import_graph()) == []


def test_an_arrow_up_is_found(tmp_path):
    """An upward import is seen, also one made at run time through importlib."""
    graph = {"pipelines.config.sections": {"pipelines.cluster.links"}, "pipelines.tracking.alerts": set(),
             "pipelines.platforms": {"pipelines.platforms.ddp.adapter"}}
    assert arrows_up(graph) == ["pipelines.config.sections -> pipelines.cluster.links",
                                "pipelines.platforms -> pipelines.platforms.ddp.adapter"]
    pkg = tmp_path / "pipelines"
    (pkg / "config").mkdir(parents=True)
    (pkg / "run").mkdir()
    for init in (pkg / "__init__.py", pkg / "config" / "__init__.py", pkg / "run" / "__init__.py", pkg / "run" / "cli.py"):
        init.write_text("")
    (pkg / "config" / "model.py").write_text("import importlib\n\ndef f():\n    importlib.import_module('pipelines.run.cli')\n")
    assert arrows_up(import_graph(tmp_path, "pipelines", {})) == ["pipelines.config.model -> pipelines.run",
                                                                  "pipelines.config.model -> pipelines.run.cli"]


def test_training_never_imports_platforms():
    """The shared loop is below every platform: a platform's training process imports it, never back."""
    upward = {m: sorted(d for d in deps if d.startswith("pipelines.platforms.") or d == "pipelines.run.cells")
              for m, deps in import_graph().items() if m.startswith("pipelines.training")}
    assert {m: d for m, d in upward.items() if d} == {}


def test_contract_and_metrics_sit_below_platforms_and_training():
    graph = import_graph()
    for low in ("pipelines.training.cell", "pipelines.training.metrics", "pipelines.runfolder.results",
                "pipelines.runfolder.paths", "pipelines.runfolder.fileio", "pipelines.runfolder.summary",
                "pipelines.training.record"):
        assert not {d for d in graph[low] if d.startswith(("pipelines.run.", "pipelines.platforms.",
                                                           "pipelines.training.loop", "pipelines.training.worker"))}, low
    assert not {d for d in graph["pipelines.training.loop"] if d == "pipelines.evaluation"}


def test_no_sys_path_edits_and_one_project_root():
    edits = [str(p.relative_to(PROJECT_ROOT)) for folder in ("dags", "plugins", "bench", "pipelines")
             for p in (PROJECT_ROOT / folder).rglob("*.py") if "sys.path.insert" in p.read_text()
             or "sys.path.append" in p.read_text()]
    assert edits == []
    definitions = [str(p.relative_to(PROJECT_ROOT)) for p in PACKAGE.rglob("*.py")
                   if any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "PROJECT_ROOT"
                                                            for t in n.targets)
                          for n in ast.walk(ast.parse(p.read_text())))]
    assert definitions == ["pipelines/runfolder/paths.py"]


def test_run_folder_file_names_are_spelled_only_in_paths():
    names = ('"result.json"', '"summary.json"', '"config.json"', '"worker_result.json"', '"cell.json"',
             '"mlflow.json"', '"mlflow_run.json"', '"manifest.json"')
    spelled = {str(p.relative_to(PROJECT_ROOT)): [n for n in names if n in p.read_text()]
               for p in PACKAGE.rglob("*.py") if p.name != "paths.py"}
    assert {k: v for k, v in spelled.items() if v} == {}


def _airflow_imports(path: Path, root: Path = PROJECT_ROOT) -> list[str]:
    """``file:line`` of every import of an ``airflow`` module in ``path`` (module level or not)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        found += [f"{path.relative_to(root)}:{node.lineno}" for n in names if n.split(".")[0] == "airflow"]
    return found


def test_the_library_imports_no_airflow(tmp_path):
    """``pipelines/`` is importable and testable without Airflow: the DAG's Params and the metadata DB
    reader (plugins/dag_failure.py) live beside the DAG."""
    assert [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in _airflow_imports(path)] == []
    planted = tmp_path / "planted.py"  # the check itself sees one inside a function
    planted.write_text("def f():\n    from airflow.sdk import Param\n")
    assert _airflow_imports(planted, root=tmp_path) == ["planted.py:2"]


def test_the_registry_imports_nothing_else_of_the_project():
    """The Platform records and their declarations (stdlib and pydantic only): everything may read them,
    and reading them loads no adapter, engine or config (the cycle an adapter -> config -> registry made)."""
    graph = import_graph()
    registry = {m for m in graph if layer_of(m) == 0 and m.startswith(("pipelines.platforms", "pipelines.engines"))}
    assert registry >= {"pipelines.platforms", "pipelines.platforms.fields", "pipelines.platforms.ddp",
                        "pipelines.engines", "pipelines.engines.spark"}
    assert {m: sorted(graph[m] - registry) for m in sorted(registry) if graph[m] - registry} == {}


def test_the_readmes_module_map_names_every_module():
    """README "Module map": every module of pipelines/ by its file name (a package by its folder)."""
    text = (PROJECT_ROOT / "README.md").read_text()
    block = text[text.index("## Module map"):]
    block = block[:block.index("\n## ", 1)] if "\n## " in block[1:] else block
    missing = [str(p.relative_to(PROJECT_ROOT)) for p in sorted(PACKAGE.rglob("*.py"))
               if f"{p.name}" not in block and not (p.name == "__init__.py" and f"{p.parent.name}/" in block)]
    assert missing == []
