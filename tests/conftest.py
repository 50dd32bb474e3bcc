"""Shared fixtures: the real IMDB copy and bert-tiny tokenizer from ../shared/data."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("SHARED_DATA", PROJECT_ROOT.parent / "shared" / "data")).resolve()
IMDB_DIR = SHARED_DATA / "imdb"
BERT_TINY_DIR = SHARED_DATA / "bert-tiny"

logging.getLogger("py4j").setLevel(logging.WARNING)  # its shutdown chatter hits closed streams
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub here; the hub code path is still exercised
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# --- skips under CI ------------------------------------------------------------------------------
# With CI=true (as .ci/run runs), a skipped test fails the run unless it is listed here with the
# reason its skip gives and why CI accepts it: the set-up (scripts/system_deps.sh, bootstrap.sh,
# services.sh, compose_plugin.sh) installs and starts what every other test needs, so any other
# skip is a test CI silently did not run. Tests that -m deselects are not skips.
# node id (a whole id, or one that the skipped id continues with "::" or "[") ->
#     (text the skip's reason contains, why CI accepts the skip)
ALLOWED_SKIPS: dict[str, tuple[str, str]] = {
    "tests/training/test_gpu_check.py::test_captured_whole_step_matches_the_loop_step_on_cuda": (
        "needs CUDA",
        "CI machines have no GPU; on a GPU host: pytest tests/training/test_gpu_check.py -k cuda"),
    "tests/compose/test_stack.py": (
        "BENCHMARK_COMPOSE_E2E is not 1", "the caller turned the compose stack e2e off (BENCHMARK_COMPOSE_E2E=0)"),
}
_CI = os.environ.get("CI", "").lower() == "true"
_skips: list[tuple[str, str]] = []  # (node id, reason) of every skip in this session


# The compose stack e2e last: its images build in the background while the other tests run
# (scripts/test.sh), so by then they are built and the stack test waits for nothing.
LAST = "tests/compose/test_stack.py"


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.nodeid.startswith(LAST))  # stable: the rest keeps its order


def _allowed(nodeid: str, reason: str) -> str | None:
    """Why CI accepts this skip, or None."""
    for key, (says, why) in ALLOWED_SKIPS.items():
        if (nodeid == key or nodeid.startswith((key + "::", key + "["))) and says in reason:
            return why
    return None


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        _skips.append((report.nodeid, _skip_reason(report)))


def pytest_collectreport(report):
    if report.skipped:  # a module-level skip or importorskip
        _skips.append((report.nodeid, _skip_reason(report)))


def _refused_skips() -> list[tuple[str, str]]:
    return [(nodeid, reason) for nodeid, reason in _skips if _allowed(nodeid, reason) is None]


def pytest_sessionfinish(session, exitstatus):
    if _CI and _refused_skips() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _CI or not _skips:
        return
    refused = _refused_skips()
    allowed = [(nodeid, reason, _allowed(nodeid, reason)) for nodeid, reason in _skips
               if (nodeid, reason) not in refused]
    if allowed:
        terminalreporter.write_sep("=", f"CI=true: {len(allowed)} allow-listed skips (tests/conftest.py)")
        for nodeid, reason, why in allowed:
            terminalreporter.write_line(f"SKIPPED {nodeid}: {reason} -- accepted: {why}")
    if refused:
        terminalreporter.write_sep("=", f"CI=true: {len(refused)} skips not on the allow-list: the run fails",
                                   red=True)
        for nodeid, reason in refused:
            terminalreporter.write_line(f"SKIPPED {nodeid}: {reason}", red=True)
        terminalreporter.write_line("Install or start what these tests need (scripts/system_deps.sh, bootstrap.sh, "
                                    "services.sh, compose_plugin.sh), or list them in ALLOWED_SKIPS with why.")


# --- markers that hold ---------------------------------------------------------------------------
# `slow` marks every test that trains or starts an engine, so that -m "not slow" is the fast tier.
# A test without it that starts an engine process itself (or through a fixture) fails, naming the
# command. Seen: what this interpreter spawns (subprocess, os.posix_spawn, os.exec*), not what
# its children spawn, nor training in-process (tests/platforms/test_loop_seam.py: marked by hand).
_ENGINE_PROGRAMS = {"torchrun", "java", "spark-submit", "spark-class", "ray", "raylet", "gcs_server", "det",
                    "deepspeed", "airflow", "celery", "dockerd", "containerd", "chromium", "chrome", "headless_shell"}
_ENGINE_MODULES = ("torch.distributed.run", "torch.distributed.launch", "determined.launch", "deepspeed.launcher",
                   "airflow", "celery", "ray.", "pyspark")
_SERVER_PROGRAMS = {"mlflow": ("server", "ui"), "node": ("run-driver",)}  # playwright's driver: a browser
_watched: dict = {"nodeid": None, "engines": []}


def _engine(argv) -> str | None:
    """The command line, when it starts an engine."""
    argv = [os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in argv] if isinstance(argv, (list, tuple)) \
        else str(argv).split()
    for i in range(len(argv) - 2):
        if argv[i:i + 2] == ["netns", "exec"]:  # ip netns exec NS ARGV: what an emulated host runs
            return _engine(argv[i + 3:])
    if not argv:
        return None
    program = Path(argv[0]).name
    if program.startswith("python") and "-m" in argv[:-1]:
        module = argv[argv.index("-m") + 1]
        program, argv = module.split(".")[0], [module, *argv[argv.index("-m") + 2:]]
        if module.startswith(_ENGINE_MODULES) or (module + ".").startswith(_ENGINE_MODULES):
            return " ".join(argv)[:200]
    if program in _ENGINE_PROGRAMS or any(a in argv[1:3] for a in _SERVER_PROGRAMS.get(program, ())):
        return " ".join(argv)[:200]
    return None


def _audit(event: str, args: tuple) -> None:
    if _watched["nodeid"] is None or event not in ("subprocess.Popen", "os.posix_spawn", "os.exec"):
        return
    try:
        found = _engine(args[1])
    except Exception:  # an audit hook must never break the call it watches
        return
    if found:
        _watched["engines"].append(found)


sys.addaudithook(_audit)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    slow = item.get_closest_marker("slow") is not None
    if slow:  # junit: a test that ran something (bench/heavy_table.py's "no run")
        item.user_properties.append(("slow", "1"))
    _watched.update(nodeid=None if slow else item.nodeid, engines=[])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    _watched["nodeid"] = None  # setup and call only: a module's fixtures may stop engines after its last test
    result = yield
    engines, _watched["engines"] = _watched["engines"], []
    if engines and not item.get_closest_marker("slow"):
        pytest.fail(f"{item.nodeid} starts an engine but is not marked slow (pyproject.toml's markers): "
                    + "; ".join(dict.fromkeys(engines)), pytrace=False)
    return result


@pytest.fixture(autouse=True, scope="session")
def _stop_spark_at_the_end():
    """Stop the SparkSession the tests shared, before the interpreter (and py4j) goes away."""
    yield
    if "pyspark" in sys.modules:
        from pyspark.sql import SparkSession

        session = SparkSession._instantiatedSession
        if session is not None:
            session.stop()


@pytest.fixture(autouse=True, scope="module")
def _no_tracking_uri_from_earlier_modules():
    """mlflow.set_tracking_uri() exports MLFLOW_TRACKING_URI in-process; load_config reads it.
    Module fixtures (built before function-scoped ones) must not inherit another test's store."""
    os.environ.pop("MLFLOW_TRACKING_URI", None)


@pytest.fixture(autouse=True, scope="module")
def _no_spark_jvm_left_by_a_module(request):
    """A module that leaves py4j's gateway JVM running (a SparkSession stopped without
    ``stop_spark(jvm=True)``) would put a JVM beside every later test's timed cell: it fails here,
    named. tests/data shares one session across its modules (its package fixture ends it)."""
    yield
    if "pyspark" not in sys.modules or "tests/data/" in request.node.nodeid:
        return
    from pyspark import SparkContext

    if SparkContext._gateway is not None:
        from pipelines.engines.spark.session import stop_spark

        stop_spark(jvm=True)  # end it: the next module starts clean
        pytest.fail(f"{request.node.nodeid} leaves py4j's gateway JVM running: stop its SparkSession with "
                    "pipelines.engines.spark.session.stop_spark(jvm=True)", pytrace=False)


@pytest.fixture(autouse=True)
def _no_leaked_tracking_uri(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture(scope="session")
def imdb_dir() -> Path:
    assert (IMDB_DIR / "train.parquet").exists(), (
        f"real IMDB copy missing at {IMDB_DIR}: a checkout with no ../shared/data beside it (a clone under /tmp) "
        "sets SHARED_DATA to the folder holding imdb/ and bert-tiny/")
    return IMDB_DIR


@pytest.fixture(scope="session")
def bert_tiny_dir() -> Path:
    assert (BERT_TINY_DIR / "vocab.txt").exists(), (
        f"bert-tiny tokenizer missing at {BERT_TINY_DIR}: set SHARED_DATA to the folder holding imdb/ and bert-tiny/")
    return BERT_TINY_DIR


@pytest.fixture
def make_config(tmp_path, imdb_dir, bert_tiny_dir):
    """``make_config(**overrides)`` -> smoke-profile BenchmarkConfig on the local real data."""
    from pipelines.config import load_config

    def _make(profile: str = "smoke", **overrides):
        base = dict(
            dataset_source=str(imdb_dir),
            tokenizer_source=str(bert_tiny_dir),
            model_source=str(bert_tiny_dir),
            output_root=str(tmp_path / "runs"),
        )
        base.update(overrides)
        return load_config(profile, base)

    return _make
