"""Isolation fails closed at launch (``pipelines.cluster.netns``): where a cell's network namespace
cannot be made, the cell fails with the reason, unless ``cluster.allow_unisolated_cells``; then it
runs and its result says it was not isolated. A host without ``unshare`` / ``nsenter`` on PATH (a
worker image without util-linux) is the real case here: the tools are taken off PATH, nothing else.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipelines.cluster import isolation, netns
from pipelines.engines.spark import cluster as spark_cluster
from pipelines.run.cells import run_cell
from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.results import CellResult
from tests.token_shards import write_token_shards

pytestmark = pytest.mark.skipif(netns.run_problem() is not None, reason="needs working network namespaces here")


def _path_without(tool: str, farm: Path) -> str:
    """This PATH with no ``tool`` on it: each folder holding it replaced by ``farm``, links to the
    rest of that folder."""
    farm.mkdir(exist_ok=True)
    out = []
    for folder in os.environ["PATH"].split(os.pathsep):
        if not (Path(folder) / tool).exists():
            out.append(folder)
            continue
        for entry in Path(folder).iterdir():
            if entry.name != tool and not (farm / entry.name).exists():
                (farm / entry.name).symlink_to(entry)
        out += [] if str(farm) in out else [str(farm)]
    return os.pathsep.join(out)


def _ddp_cell(tmp_path, make_config, imdb_dir, bert_tiny_dir, **settings):
    paths = write_token_shards(RunPaths(tmp_path / "runs" / "closed"), imdb_dir, bert_tiny_dir, train_per_class=16,
                               test_per_class=8, seq_len=32, seed=3)
    config = make_config(epochs=1, max_seq_len=32, batch_size=16, backends=["ddp"], worker_counts=[1], **settings)
    return paths, config


def test_a_cell_whose_namespace_cannot_be_made_fails_with_the_reason(tmp_path, make_config, imdb_dir, bert_tiny_dir,
                                                                     monkeypatch):
    paths, config = _ddp_cell(tmp_path, make_config, imdb_dir, bert_tiny_dir)
    monkeypatch.setenv("PATH", _path_without("unshare", tmp_path / "bin"))
    assert "unshare" in netns.own_problem()
    with pytest.raises(isolation.NotIsolated, match="unshare not installed"):
        run_cell(config, paths, "ddp", 1)  # refused before torchrun starts: no rank ran exposed
    result = CellResult.read(paths.cell("ddp", 1, 0).result)
    assert result.status == "failed" and "NotIsolated" in result.error and "unshare not installed" in result.error
    assert "cluster.allow_unisolated_cells" in result.error and result.isolation is None
    ranks = paths.cell("ddp", 1, 0).root / "ranks"
    assert not ranks.exists() or not any(ranks.iterdir())
    monkeypatch.undo()
    assert netns.own_problem() is None  # a refusal is not kept: the fixed host isolates again


@pytest.mark.slow  # trains a 1-rank ddp cell (~20 s)
def test_with_allow_unisolated_cells_it_runs_and_says_it_was_not_isolated(tmp_path, make_config, imdb_dir,
                                                                          bert_tiny_dir, monkeypatch):
    paths, config = _ddp_cell(tmp_path, make_config, imdb_dir, bert_tiny_dir,
                              **{"cluster.allow_unisolated_cells": True})
    monkeypatch.setenv("PATH", _path_without("unshare", tmp_path / "bin"))
    result = run_cell(config, paths, "ddp", 1)
    assert result.status == "ok" and result.isolation == isolation.NONE == "none (allow_unisolated_cells)"
    assert CellResult.read(paths.cell("ddp", 1, 0).result).isolation == isolation.NONE
    monkeypatch.undo()
    isolated = make_config(epochs=1, max_seq_len=32, batch_size=16, backends=["ddp"], worker_counts=[1])
    assert run_cell(isolated, paths, "ddp", 1, repeat=1).isolation == isolation.OWN == "own-netns"


def test_the_runs_namespace_and_its_spark_cluster_are_refused_without_nsenter(tmp_path, make_config, monkeypatch):
    paths = RunPaths(tmp_path / "run")
    monkeypatch.setenv("PATH", _path_without("nsenter", tmp_path / "bin"))
    with pytest.raises(isolation.NotIsolated, match="nsenter not installed"):
        netns.ensure_run(paths)
    config = make_config(spark_master="embedded")
    with pytest.raises(isolation.NotIsolated, match="nsenter not installed.*allow_unisolated_cells"):
        spark_cluster.EMBEDDED_SERVICE.start(paths, config)  # before any JVM starts
    assert not paths.engine_cluster_info("spark").exists() and netns.run_state(paths) is None
    with isolation.isolating(allow_unisolated=True) as placed:  # a cell that allows it: this host's, said so
        where = netns.ensure_run(paths)
    assert (where.kind, where.prefix, where.isolation) == ("host", (), isolation.NONE)
    assert "nsenter not installed" in where.not_isolated and isolation.isolation_of(placed) == isolation.NONE


def test_where_a_cells_processes_go_is_recorded(tmp_path):
    paths = RunPaths(tmp_path / "run")
    try:
        with isolation.isolating(allow_unisolated=False) as placed:
            netns.ensure_run(paths)  # a standing cluster's and its drivers' place
            netns.own("torchrun")  # a one-host launcher's
            netns.host()  # a driver reaching a cluster elsewhere
        assert placed == [isolation.RUN, isolation.OWN, isolation.HOST]
        assert isolation.isolation_of(placed) == "run-netns, own-netns, host-netns"
        assert isolation.isolation_of([isolation.OWN, isolation.NONE]) == isolation.NONE  # anything exposed: said
        netns.own("outside any cell")  # no cell being run: nothing recorded
        assert placed == [isolation.RUN, isolation.OWN, isolation.HOST]
    finally:
        netns.stop_run(paths)
