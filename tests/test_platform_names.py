"""Each platform's knowledge lives in its package: outside it, the product code names no platform.

For every registered platform of the project, the files of ``pipelines/``, ``dags/`` and
``plugins/`` outside its package are read (as code: docstrings and comments say what they like)
for its name as a string and for imports of its package. The only places allowed are the few
named below, each with its reason (the registry finds the packages in its folder: it names none).
An engine's package (``pipelines/engines/<name>/``: the data stage's Spark engine, on which the Spark
platforms train) is that engine's own, as a platform's package is the platform's: it names its engine,
and no other platform.
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
}


def _package_of(platform: platforms.Platform) -> Path:
    return PROJECT_ROOT / Path(*platform.package.split("."))


def _own_packages(word: str) -> tuple[Path, ...]:
    """The folders where a platform's word is its own: its package, and the engine of that name."""
    return PROJECT_ROOT / "pipelines" / "platforms" / word, PROJECT_ROOT / "pipelines" / "engines" / word


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
    package = platform.package
    own = _own_packages(package.rpartition(".")[2])
    out = []
    for folder in PRODUCT:
        for path in sorted((PROJECT_ROOT / folder).rglob("*.py")):
            if any(mine in path.parents for mine in own):
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


# --- the text guard: identifiers and text, docstrings and messages included -------------------
# A platform's word (its package's folder name) as a whole word in an identifier (split on "_"), a
# string, a docstring or a message of a product file outside that package; "#" comments are free.
# "ddp" is left out: DDP is also torch's DistributedDataParallel, the shared loop's own wrapper,
# named on purpose across training/ (comm hooks, the sharding mode).
TEXT_ALLOWED = {
    ("pipelines/platforms/__init__.py", "spark"): "the registry's docstring and comments: its list and examples",
    ("pipelines/platforms/__init__.py", "ray"): "the registry's docstring and comments: its list and examples",
    ("pipelines/platforms/__init__.py", "determined"): "the registry's docstring: its list",
    ("pipelines/data/preprocess.py", "spark"): "the data stage tokenizes on the Spark engine (the mission's Spark preprocessing)",
}


def _words(path: Path) -> set[str]:
    import io
    import re
    import tokenize

    text = " ".join(t.string for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
                    if t.type in (tokenize.NAME, tokenize.STRING))
    return set(re.findall(r"[a-z0-9]+", text.lower().replace("_", " ")))


def files_saying(word: str) -> list[str]:
    own = _own_packages(word)
    return [str(path.relative_to(PROJECT_ROOT)) for folder in PRODUCT
            for path in sorted((PROJECT_ROOT / folder).rglob("*.py"))
            if not any(mine in path.parents for mine in own) and word in _words(path)]


def _platform_words() -> list[str]:
    return sorted({p.package.rpartition(".")[2] for p in platforms.all_platforms() if platforms.is_builtin(p)} - {"ddp"})


def test_no_product_text_outside_a_platforms_package_names_it():
    found = {word: [f for f in files_saying(word) if (f, word) not in TEXT_ALLOWED] for word in _platform_words()}
    assert found == {word: [] for word in found}
    unused = [key for key in TEXT_ALLOWED if key[0] not in files_saying(key[1])]
    assert unused == [], "allow-list entries no file needs any more: remove them"


def test_the_text_guard_sees_a_docstring_and_an_identifier():
    stray = PROJECT_ROOT / "pipelines" / "_stray_platform_text.py"
    stray.write_text('"""Restarts like Ray\'s nodes."""\n\nspark_master_url = None  # a determined comment is free\n')
    try:
        assert "pipelines/_stray_platform_text.py" in files_saying("ray")
        assert "pipelines/_stray_platform_text.py" in files_saying("spark")
        assert "pipelines/_stray_platform_text.py" not in files_saying("determined")
    finally:
        stray.unlink()


def test_at_most_three_product_files_name_a_platform_outside_its_own():
    """The issue's bar: outside a platform's package (and its engine's), its word is in at most 3 product
    files, the registry's list among them."""
    counts = {word: files_saying(word) for word in _platform_words()}
    assert {word: files for word, files in counts.items() if len(files) > 3} == {}
