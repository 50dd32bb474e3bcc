"""The gates of tests/conftest.py, each through pytest on a few throw-away tests with the
project's conftest: under CI=true a skip fails the run unless ALLOWED_SKIPS lists the test with
the reason its skip gives (the accepted ones are printed with why); a test that starts an engine
without the `slow` marker fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CASES = '''
import pytest

def test_captured_whole_step_matches_the_loop_step_on_cuda():
    pytest.skip("needs CUDA (graph capture)")

def test_a_skip_ci_must_not_accept():
    pytest.skip("node is not installed")

@pytest.mark.skipif(True, reason="needs CUDA, but this test is not on the list")
def test_the_right_reason_on_the_wrong_test():
    pass

def test_that_runs():
    pass
'''


def _pytest(tmp_path: Path, ci: str | None, *files: tuple[str, str]) -> subprocess.CompletedProcess:
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: trains or starts engines\n")
    for name, text in files:
        path = tmp_path / "tests" / name  # a name may have a folder: "training/test_x.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
                           "-q", "tests"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def test_under_ci_a_skip_off_the_list_fails_the_run_and_listed_ones_say_why(tmp_path):
    done = _pytest(tmp_path, "true", ("training/test_gpu_check.py", CASES))
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "1 passed, 3 skipped" in out
    assert "CI=true: 1 allow-listed skips" in out
    assert ("SKIPPED tests/training/test_gpu_check.py::"
            "test_captured_whole_step_matches_the_loop_step_on_cuda: "
            "needs CUDA (graph capture) -- accepted: CI machines have no GPU") in out
    assert "CI=true: 2 skips not on the allow-list: the run fails" in out
    assert ("SKIPPED tests/training/test_gpu_check.py::test_a_skip_ci_must_not_accept: "
            "node is not installed") in out
    assert "test_the_right_reason_on_the_wrong_test: needs CUDA, but" in out


def test_under_ci_a_module_skipped_at_collection_fails_the_run(tmp_path):
    done = _pytest(tmp_path, "true", ("test_needs_a_module.py",
                                      "import pytest\npytest.importorskip('no_such_module_here')\n"),
                   ("test_fine.py", "def test_fine():\n    pass\n"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "SKIPPED tests/test_needs_a_module.py: could not import 'no_such_module_here'" in done.stdout


def test_without_ci_skips_stay_skips(tmp_path):
    done = _pytest(tmp_path, None, ("training/test_gpu_check.py", CASES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 3 skipped" in done.stdout and "CI=true" not in done.stdout


ENGINES = '''
import subprocess, sys
from pathlib import Path
import pytest

TORCHRUN = str(Path(__file__).parent / "torchrun")  # a stand-in: it only exits

def test_starts_torchrun_unmarked():
    subprocess.run([TORCHRUN, "--standalone"], check=True)

@pytest.fixture
def mlflow_server():
    subprocess.run([sys.executable, "-c", "pass", "mlflow", "server"], check=True)  # python -c: not a server
    yield subprocess.run(["sh", "-c", "exit 0", "sh", "ip", "netns", "exec", "h0", "mlflow", "server"]).returncode

def test_a_fixture_starts_a_server_on_an_emulated_host(mlflow_server):
    assert mlflow_server == 0

@pytest.mark.slow
def test_starts_torchrun_marked_slow():
    subprocess.run([TORCHRUN], check=True)

def test_runs_plain_commands():
    subprocess.run([sys.executable, "-m", "json.tool", "--help"], capture_output=True, check=True)
'''


def test_an_unmarked_test_that_starts_an_engine_fails_naming_it(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "torchrun").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "tests" / "torchrun").chmod(0o755)
    done = _pytest(tmp_path, None, ("test_engines.py", ENGINES))
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "4 passed, 2 errors" in out, out
    assert "test_starts_torchrun_unmarked starts an engine but is not marked slow" in out
    assert "torchrun --standalone" in out
    assert "test_a_fixture_starts_a_server_on_an_emulated_host starts an engine" in out and "mlflow server" in out
    assert "ERROR tests/test_engines.py::test_starts_torchrun_marked_slow" not in out
    assert "ERROR tests/test_engines.py::test_runs_plain_commands" not in out
