"""The code stays readable in an afternoon: modules of at most 400 lines, functions of at most
80, and a DAG file that only wires (at most 150 lines)."""

from __future__ import annotations

import ast

from pipelines.runfolder.paths import PROJECT_ROOT

MODULE_LINES, FUNCTION_LINES, DAG_LINES = 400, 80, 150
FOLDERS = ("pipelines", "dags", "plugins")


def _python_files():
    for folder in FOLDERS:
        yield from sorted((PROJECT_ROOT / folder).rglob("*.py"))


def test_modules_stay_short():
    long = {str(p.relative_to(PROJECT_ROOT)): n for p in _python_files()
            if (n := len(p.read_text().splitlines())) > MODULE_LINES}
    assert long == {}


def test_functions_stay_short():
    long = {}
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES:
                    long[f"{path.relative_to(PROJECT_ROOT)}:{node.lineno} {node.name}"] = lines
    assert long == {}


def test_the_dag_file_only_wires():
    assert len((PROJECT_ROOT / "dags" / "imdb_benchmark.py").read_text().splitlines()) <= DAG_LINES


ARCHITECTURE_GUARDS = {"test_imports.py", "test_platform_names.py", "test_code_shape.py", "test_conftest_gates.py"}


def test_the_test_tree_mirrors_the_package():
    """tests/<package>/ for each package of pipelines/, tests/platforms/<platform>/ for each platform;
    at the top of tests/ only conftest.py, helpers and the architecture guards."""
    tests = PROJECT_ROOT / "tests"
    assert sorted(p.name for p in tests.glob("test_*.py") if p.name not in ARCHITECTURE_GUARDS) == []

    def packages(folder):
        return sorted(p.name for p in folder.iterdir() if (p / "__init__.py").exists())

    untested = [name for name in packages(PROJECT_ROOT / "pipelines") if not any((tests / name).rglob("test_*.py"))]
    untested += [f"platforms/{name}" for name in packages(PROJECT_ROOT / "pipelines" / "platforms")
                 if not any((tests / "platforms" / name).rglob("test_*.py"))]
    untested += [f"engines/{name}" for name in packages(PROJECT_ROOT / "pipelines" / "engines")
                 if not any((tests / "engines" / name).rglob("test_*.py"))]
    assert untested == []
