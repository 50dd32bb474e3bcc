"""The Spark dataframe feed (``spark_dataframe``) on a real embedded standalone cluster (master +
2 one-core workers): the tokenized train rows reach the ranks through TorchDistributor's barrier
stage over the DataFrame, every row to exactly one rank once per epoch, and the cell trains as
well as the files feed (``spark``) on the same cluster at the same seed."""

from __future__ import annotations

import json

import pytest
from torch.utils.data import DistributedSampler

from pipelines.cluster import netns
from pipelines.engines.spark import cluster as spark_cluster
from pipelines.measure.listeners import LOOPBACK_ONLY_NAMESPACE
from pipelines.platforms.driver import RECORD as DRIVER_RECORD
from pipelines.run import services
from pipelines.run import preflight
from pipelines.platforms.spark.adapter import SparkBackend
from pipelines.platforms.spark.dataframe import FEED_RECORD, SparkDataFrameBackend, partition_plan
from pipelines.config import ConfigError, load_config
from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.results import CellResult
from pipelines.training import phases
from tests.platforms.spark.feed_recorder import RecordingDataFrameBackend, recorded
from tests.token_shards import write_token_shards

pytestmark = pytest.mark.slow
# Big enough for BERT-tiny from random init to leave chance level within 4 epochs (the accuracy
# comparison would say nothing at 0.5), small enough for ~15 s of training per cell on 2 cores.
TRAIN_PER_CLASS, TEST_PER_CLASS, SEQ_LEN, EPOCHS = 400, 200, 64, 4
TRAIN_ROWS, TEST_ROWS = 2 * TRAIN_PER_CLASS, 2 * TEST_PER_CLASS


@pytest.fixture(scope="module")
def feed_paths(tmp_path_factory, imdb_dir, bert_tiny_dir) -> RunPaths:
    return write_token_shards(RunPaths(tmp_path_factory.mktemp("feed") / "run"), imdb_dir, bert_tiny_dir,
                              train_per_class=TRAIN_PER_CLASS, test_per_class=TEST_PER_CLASS,
                              seq_len=SEQ_LEN, seed=7, validation_per_class=32)


@pytest.fixture(scope="module")
def cluster_config(feed_paths, imdb_dir, bert_tiny_dir):
    """The run's own standalone cluster (barrier tasks on its one-core executors), started as a run
    starts it (``pipelines.run.services``): in the run's network namespace, where the cells' drivers go."""
    config = load_config("smoke", dict(
        dataset_source=str(imdb_dir), tokenizer_source=str(bert_tiny_dir), model_source=str(bert_tiny_dir),
        output_root=str(feed_paths.root.parent), max_seq_len=SEQ_LEN, epochs=EPOCHS, batch_size=16,
        batch_policy="per_worker", learning_rate=2e-3, seed=42, spark_master="embedded"))
    spark_cluster.EMBEDDED_SERVICE.start(feed_paths, config)
    yield config
    services.stop(feed_paths)
    assert not netns.running(feed_paths) and not spark_cluster.is_running(feed_paths)


@pytest.fixture(scope="module")
def dataframe_cell(cluster_config, feed_paths) -> CellResult:
    return RecordingDataFrameBackend().run(cluster_config, 2, paths=feed_paths)


@pytest.fixture(scope="module")
def files_cell(cluster_config, feed_paths) -> CellResult:
    return SparkBackend().run(cluster_config, 2, paths=feed_paths)


@pytest.mark.skipif(netns.run_problem() is not None, reason="no run network namespace here (nsenter refused)")
def test_both_feeds_drivers_and_the_cluster_listen_only_in_the_runs_namespace(dataframe_cell, files_cell, feed_paths):
    """The run's cluster and each cell's driver share the run's loopback-only network namespace: every
    port the cell (driver, JVMs, executors, torchrun's store, ranks) and the cluster listened on is there."""
    run = netns.run_state(feed_paths)
    assert run is not None and netns.running(feed_paths)
    for cell in (dataframe_cell, files_cell):
        usage, folder = cell.resources, feed_paths.cell(cell.backend, 2, 0).root
        assert json.loads((folder / DRIVER_RECORD).read_text())["netns"] == run["netns"]
        assert usage.listening.get("torchrun") and usage.listening.get("driver"), usage.listening  # not blind
        assert usage.standing_listening.get("java_master") and usage.standing_listening.get("java_worker")
        seen = [a for found in (usage.listening, usage.standing_listening) for addresses in found.values()
                for a in addresses]
        assert all(a.endswith(LOOPBACK_ONLY_NAMESPACE) for a in seen), (usage.listening, usage.standing_listening)
        assert usage.bytes_sent and usage.bytes_sent > 0  # the namespace's loopback, counted from the cell's start


def test_the_result_shows_the_cluster_mode_the_feed_and_the_executors(dataframe_cell, files_cell, feed_paths):
    result = dataframe_cell
    assert result.status == "ok" and result.backend == "spark_dataframe" and result.world_size == 2
    assert (result.platform_mode, result.data_feed) == ("cluster", "dataframe")
    assert (files_cell.platform_mode, files_cell.data_feed) == ("cluster", "files")
    assert len(result.placements) == 2 and all(" executor app-" in p for p in result.placements)
    assert len(set(result.placements)) == 2  # one barrier task per executor (1 core each)
    assert result.versions["launcher"] == "TorchDistributor._train_on_dataframe"
    assert result.train_samples == TRAIN_ROWS and [e.epoch for e in result.epochs] == [1, 2, 3, 4]
    assert result.startup_seconds > 0 and result.training_seconds > 0
    for cell in (result, files_cell):  # barrier tasks on executors: the same phases, adding up
        assert tuple(cell.phases) == phases.PHASES and cell.phases["communication"] > 0
        assert abs(phases.unattributed(cell.phases, cell.total_seconds)) <= 0.02 * cell.total_seconds
    feed = json.loads((feed_paths.cell("spark_dataframe", 2, 0).root / FEED_RECORD).read_text())
    assert (feed["rows"], feed["rows_per_rank"], feed["padded_rows"], feed["spark_partitions"]) == (
        TRAIN_ROWS, TRAIN_ROWS // 2, 0, 2)


def test_every_training_row_reaches_exactly_one_rank_once_per_epoch(dataframe_cell, feed_paths):
    seen = recorded(feed_paths.cell("spark_dataframe", 2, 0).root)
    assert sorted(seen) == [(rank, epoch) for rank in (0, 1) for epoch in range(EPOCHS)]
    for epoch in range(EPOCHS):
        rows = seen[0, epoch] + seen[1, epoch]
        assert sorted(rows) == list(range(TRAIN_ROWS)), f"epoch {epoch}: a row missed, or trained twice"
    for rank in (0, 1):
        # the plan: the files feed's first epoch (DistributedSampler), in its order
        assert seen[rank, 0] == list(DistributedSampler(range(TRAIN_ROWS), num_replicas=2, rank=rank, seed=42))
        for epoch in range(1, EPOCHS):
            assert sorted(seen[rank, epoch]) == sorted(seen[rank, 0])  # a rank keeps its Spark partition
            assert seen[rank, epoch] != seen[rank, epoch - 1]  # and reshuffles it every epoch


def test_the_dataframe_feed_trains_as_well_as_the_files_feed(dataframe_cell, files_cell):
    frame, files = dataframe_cell, files_cell
    # epoch 1: the same rows in the same order on each rank -> the same numbers (as ddp vs spark)
    assert frame.epochs[0].train_loss == pytest.approx(files.epochs[0].train_loss, abs=1e-6)
    assert frame.epochs[0].eval_loss == pytest.approx(files.epochs[0].eval_loss, abs=1e-6)
    # later epochs differ in the order of the rows only (a rank reshuffles its own partition; the
    # files feed reshuffles all rows across ranks), which moves a model this small by a few points.
    # Tolerance: two accuracies near 0.65 on 400 test reviews differ by binomial noise alone with a
    # standard error of ~0.034; 0.08 is ~2.4 of them. Both must have learned (0.6 is ~4 standard
    # errors above chance), or the comparison would say nothing.
    assert frame.test.accuracy > 0.6 and files.test.accuracy > 0.6
    assert frame.test.accuracy == pytest.approx(files.test.accuracy, abs=0.08)
    assert frame.test_samples == files.test_samples == TEST_ROWS and frame.train_samples == files.train_samples


def test_a_local_master_is_refused_before_the_cell_starts(bench_config, run_paths):
    cell = run_paths.cell("spark_dataframe", 2, 7)
    with pytest.raises(ConfigError, match=r"spark_master='local\[2\]'.*'embedded'.*spark://host:7077"):
        SparkDataFrameBackend().run(bench_config, 2, paths=run_paths, cell=cell)
    assert not cell.attempts.exists() and not cell.spec.exists()  # nothing started
    asked = bench_config.model_copy(update={"backends": ["spark_dataframe"]})
    assert any("cannot run the spark_dataframe backend" in p for p in preflight.problems(asked))
    with pytest.raises(ConfigError, match="spark_dataframe"):
        preflight.check(asked)


def test_profiles_with_a_cluster_include_the_feed_and_smoke_does_not():
    assert "spark_dataframe" not in load_config("smoke").matrix.backends  # local[*]
    for profile in ("nightly", "paper"):  # the embedded cluster
        config = load_config(profile)
        assert config.engines.spark.master == "embedded" and "spark_dataframe" in config.matrix.backends


def test_the_plan_pads_uneven_rows_like_distributed_sampler():
    plan = partition_plan(rows=7, world_size=2, seed=3)
    per_rank = plan.groupby("rank")["row_id"].apply(list)
    assert [len(rows) for rows in per_rank] == [4, 4]  # equal step counts on every rank
    assert sorted(set(plan["row_id"])) == list(range(7)) and len(plan) - 7 == 1  # one row padded twice
    for rank in (0, 1):
        assert per_rank[rank] == list(DistributedSampler(range(7), num_replicas=2, rank=rank, seed=3))
        assert list(plan[plan["rank"] == rank]["position"]) == [0, 1, 2, 3]
