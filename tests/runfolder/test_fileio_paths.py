"""Atomic writes, the run-folder names RunPaths owns, and a missing summary being an error."""

from __future__ import annotations

import pytest

from pipelines.runfolder.fileio import atomic_write, atomic_write_json, atomic_write_text
from pipelines.runfolder.paths import RunPaths, cell_name
from pipelines.runfolder.summary import SummaryMissing, read_summary


def test_atomic_write_replaces_whole_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / "sub" / "file.json"
    atomic_write_json(target, {"a": 1})
    atomic_write_text(target, '{"a": 2}')
    assert target.read_text() == '{"a": 2}'
    assert [p.name for p in target.parent.iterdir()] == ["file.json"]


def test_a_failing_writer_keeps_the_old_file_and_cleans_up(tmp_path):
    target = tmp_path / "result.json"
    atomic_write_text(target, "old")

    def explode(fh):
        fh.write(b"half a fi")
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, explode)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_temp_files_of_a_killed_writer_are_removed_by_the_next_write(tmp_path):
    target = tmp_path / "summary.json"
    stale = tmp_path / ".summary.json.tmp-abc123"  # what a SIGKILL mid-write leaves
    stale.write_text("partial")
    atomic_write_text(target, "{}")
    assert not stale.exists() and target.read_text() == "{}"


def test_nan_is_not_written_as_json(tmp_path):
    with pytest.raises(ValueError):
        atomic_write_json(tmp_path / "x.json", {"v": float("nan")})


def test_run_paths_own_the_layout(tmp_path):
    paths = RunPaths(tmp_path / "run")
    cell = paths.cell("ddp", 2, 1)
    assert cell.name == cell_name("ddp", 2, 1) == "ddp-w2-r1"
    assert cell.result == tmp_path / "run" / "cells" / "ddp-w2-r1" / "result.json"
    assert {cell.spec.name, cell.worker_result.name, cell.log.name} == {"cell.json", "worker_result.json",
                                                                        "train.log"}
    assert paths.summary.parent == paths.report and paths.config.name == "config.json"
    assert not RunPaths.is_run_folder(paths.root)
    atomic_write_text(paths.config, "{}")
    assert RunPaths.is_run_folder(paths.root)
    atomic_write_text(cell.result, "{}")
    assert paths.cell_results() == [cell.result]


def test_reading_a_missing_summary_is_an_error_naming_the_fix(tmp_path):
    with pytest.raises(SummaryMissing, match=r"summary.json missing: evaluate the run first \(python -m "
                                             r"pipelines report "):
        read_summary(RunPaths(tmp_path))
