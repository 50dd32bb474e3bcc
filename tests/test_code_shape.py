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
