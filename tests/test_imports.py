"""The package's import graph: no cycle, no upward import, no sys.path edits, one PROJECT_ROOT.

Walks every module's import statements (module level and inside functions) with ``ast``, so
it checks the code as written, not what one test run happens to import.
"""

from __future__ import annotations

import ast
from pathlib import Path

from pipelines.runfolder.paths import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "pipelines"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PROJECT_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """pipelines.* modules imported by this file (``from a import b`` counts a.b if a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] == "pipelines"}


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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
    graph = import_graph()
    # importing a.b runs a/__init__: a package importing its submodule is no cycle, so edges from
    # a submodule to its own parent package are left out
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    assert _cycles(graph) == []


def test_training_never_imports_backends():
    upward = {m: sorted(d for d in deps if d.startswith("pipelines.run.cells"))
              for m, deps in import_graph().items() if m.startswith("pipelines.training")}
    assert {m: d for m, d in upward.items() if d} == {}


def test_contract_and_metrics_sit_below_backends_and_training():
    graph = import_graph()
    for low in ("pipelines.training.cell", "pipelines.training.metrics", "pipelines.runfolder.results", "pipelines.runfolder.paths",
                "pipelines.runfolder.fileio", "pipelines.runfolder.summary", "pipelines.training.record"):
        assert not {d for d in graph[low] if d.startswith(("pipelines.run.cells", "pipelines.training.loop",
                                                           "pipelines.training.worker"))}, low
    assert not {d for d in graph["pipelines.training.loop"] if d == "pipelines.run.evaluation"}


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
