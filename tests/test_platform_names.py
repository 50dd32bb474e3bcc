"""Each platform's knowledge lives in its package: outside it, the product code names no platform.

For every registered platform of the project, the files of ``pipelines/``, ``dags/`` and
``plugins/`` outside its package are read (as code: docstrings and comments say what they like)
for its name as a string and for imports of its package. The only places allowed are the few
named below, each with its reason (the registry finds the packages in its folder: it names none).
So adding a platform (DeepSpeed, the fifth) touches no product file outside its package: the
rest it needs is ``requirements.txt``, the image build, docs and tests. ``bench/`` and ``scripts/``
measure named platforms on purpose and are not checked; ``tests/`` and docs neither.
"""

from __future__ import annotations

import ast
from pathlib import Path

from pipelines import platforms
from pipelines.runfolder.paths import PROJECT_ROOT

PRODUCT = ("pipelines", "dags", "plugins")
ALLOWED = {
    # "ddp" as a sharding mode (torch's DistributedDataParallel wrapper vs FSDP), not the platform
    ("pipelines/config/strategy.py", "ddp"): "sharding mode",
    ("pipelines/runfolder/results.py", "ddp"): "sharding mode",
    ("pipelines/platforms/determined/adapter.py", "ddp"): "sharding mode (the strategies it refuses)",
    # the Spark engine is shared by the data stage and the Spark platforms: it owns its settings
    # (engines.spark, declared in pipelines.engines; the platforms declare that model as theirs)
    # and reads its master URL (engines.spark.master) where it starts
    ("pipelines/engines/__init__.py", "spark"): "the engine's settings entry, engines.spark",
    ("pipelines/engines/spark_cluster.py", "spark"): "engines.spark.master",
}


def _package_of(platform: platforms.Platform) -> Path:
    return PROJECT_ROOT / Path(*platform.package.split("."))


def _strings_and_imports(path: Path) -> set[str]:
    """String constants that are not docstrings, and the modules imported, of one file."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found.add(node.value)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def files_naming(platform: platforms.Platform) -> list[str]:
    """Files of the product outside the platform's package that name it."""
    own, package = _package_of(platform), platform.package
    out = []
    for folder in PRODUCT:
        for path in sorted((PROJECT_ROOT / folder).rglob("*.py")):
            if own in path.parents:
                continue
            found = _strings_and_imports(path)
            if platform.name in found or any(s == package or s.startswith(package + ".") for s in found):
                out.append(str(path.relative_to(PROJECT_ROOT)))
    return out


def test_no_product_file_outside_a_platforms_package_names_it():
    named = {p.name: [f for f in files_naming(p) if (f, p.name) not in ALLOWED]
             for p in platforms.all_platforms() if platforms.is_builtin(p)}
    assert named == {name: [] for name in named}


def test_the_check_sees_a_platform_named_outside_its_package(tmp_path, monkeypatch):
    """A module that spells a platform's name is caught (the check is not blind)."""
    stray = PROJECT_ROOT / "pipelines" / "_stray_platform_name.py"
    stray.write_text('BACKEND = "ray"\n')
    try:
        assert "pipelines/_stray_platform_name.py" in files_naming(platforms.get("ray"))
    finally:
        stray.unlink()
