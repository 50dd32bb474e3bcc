"""Where a platform's name goes on one cell's path: from ``pipelines.run.stages.train_cell`` (the CLI's
and the DAG's way to train a cell), every function of the driver that receives the name as an argument,
traced on a real one-worker ddp cell. The name only goes down the layers (``tests/test_imports.py``
LAYERS): no function it reaches calls back into a higher layer with it; and the folders it crosses
from ``run`` are counted (issue 44: at most 4; before, 8 folders with run and 7 climbs back up)."""

from __future__ import annotations

import sys

import pytest

from pipelines import platforms
from pipelines.runfolder.paths import PROJECT_ROOT
from tests.test_imports import layer_of

pytestmark = pytest.mark.slow


def _trace_name(run_dir: str, backend: str) -> list[tuple[str, str | None]]:
    """(module, nearest caller's module that had the name) of each call receiving it, in order."""
    from pipelines.run import stages

    package, holders, calls = str(PROJECT_ROOT / "pipelines"), {}, []

    def profile(frame, event, arg):
        if event == "return":
            holders.pop(id(frame), None)
            return
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(package):
            return
        arguments = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if not any(frame.f_locals.get(a) == backend for a in arguments if isinstance(frame.f_locals.get(a), str)):
            return
        module = ".".join(code.co_filename[len(str(PROJECT_ROOT)) + 1:-3].split("/")).removesuffix(".__init__")
        caller = frame.f_back
        while caller is not None and id(caller) not in holders:
            caller = caller.f_back
        holders[id(frame)] = module
        calls.append((module, holders[id(caller)] if caller is not None else None))

    sys.setprofile(profile)
    try:
        stages.train_cell(run_dir, backend, 1)
    finally:
        sys.setprofile(None)
    return calls


def test_a_cells_platform_name_goes_down_from_run_into_four_folders(tmp_path, imdb_dir, bert_tiny_dir):
    from pipelines.run import stages
    from pipelines.runfolder.paths import RunPaths
    from tests.token_shards import write_token_shards

    backend = platforms.reference()
    run_dir = stages.prepare_run("smoke", dict(
        dataset_source=str(imdb_dir), tokenizer_source=str(bert_tiny_dir), model_source=str(bert_tiny_dir),
        output_root=str(tmp_path), max_seq_len=64, epochs=1, batch_size=16, spark_master="local[2]",
        backends=[backend], worker_counts=[1]), "name-path")
    write_token_shards(RunPaths(tmp_path / "name-path"), imdb_dir, bert_tiny_dir, train_per_class=32,
                       test_per_class=16, seq_len=64, seed=7)
    calls = _trace_name(run_dir, backend)
    assert calls[0] == ("pipelines.run.stages", None)
    climbs = [(caller, module) for module, caller in calls
              if caller is not None and layer_of(module) > layer_of(caller)]
    assert climbs == []
    crossed = sorted({module.split(".")[1] for module, _ in calls} - {"run"})  # run: stages, cells, services
    # platforms (the registry), config (the platform's settings), runfolder (the cell's folder),
    # tracking (the cell's MLflow run is labelled with it)
    assert crossed == ["config", "platforms", "runfolder", "tracking"], crossed
