"""Spark tokenization of the validated snapshot into the shards every backend trains on.

Run as a stage (after ``validate_snapshot``) or directly::

    from pipelines.data.preprocess import preprocess
    stats = preprocess(config, paths)

Reads ``snapshot/{train,test}.parquet`` with Spark (master ``config.engine("spark").master``) and tokenizes
with ``pipelines.data.tokens.tokenize_frame``'s encoder inside ``mapInPandas`` (tokenizer from
``config.data.tokenizer_source``, fixed length ``config.data.max_seq_len``). Writes
``tokens/<split>/part-*.parquet`` (input_ids array<int>, attention_mask array<tinyint>,
label bigint) and ``tokens/preprocess.json`` (the returned stats: rows and shards per split,
seconds, and rows_per_second over the Spark jobs, which includes the Python workers' start-up
and tokenizer load: ~10 s on 2 cores, so small samples show a low rate).

Row order is the contract: shards read in file-name order (``read_token_split``) give the
snapshot's rows in the snapshot's order. Each row carries its parquet file row index; the
data is range-partitioned on it (contiguous shards, numbered in order) and sorted within
each shard before the index is dropped.

Fails before touching Spark when the snapshot did not pass validation
(``DataValidationError``). Output is written to a temporary folder and renamed into place
only when both splits succeeded, so a failed run leaves no partial ``tokens/``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path

from pipelines.config import BenchmarkConfig
from pipelines.data.manifest import SNAPSHOT_SPLITS
from pipelines.data.validate import require_valid_snapshot
from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.fileio import is_stale_temp, writer_tag
from pipelines.engines.spark import cluster as spark_cluster
from pipelines.engines.spark.cluster import master_url
from pipelines.engines.spark.session import get_spark, session_running, stop_spark

log = logging.getLogger(__name__)

TOKEN_SCHEMA = "input_ids array<int>, attention_mask array<tinyint>, label bigint, row_id bigint"


def check_tokenizer(source: str) -> None:
    """Load the tokenizer on the driver; any failure becomes one OSError naming the source."""
    from pipelines.data.tokens import load_tokenizer

    try:
        load_tokenizer(source)
    except ValueError as err:  # e.g. a folder without tokenizer files: transformers says ValueError
        raise OSError(
            f"tokenizer_source={source!r}: cannot load a tokenizer from it ({err}). Give a hub id "
            "that is reachable or cached, or a local folder with tokenizer.json/vocab.txt."
        ) from err


def _tokenizer_fn(encoder: str):
    """The function mapInPandas runs on each partition's Arrow batches (in the workers), with the
    tokenizer the driver serialized (``encoder_json``): the workers import only ``tokenizers``."""

    def tokenize_batches(batches):
        from pipelines.data.tokens import encode_frame  # imported in the worker process

        for frame in batches:
            out = encode_frame(frame, encoder)
            out["row_id"] = frame["row_id"].to_numpy()  # carried so each shard can be sorted
            yield out

    return tokenize_batches


def tokenize_split(
    spark, snapshot_file: Path, out_dir: Path, config: BenchmarkConfig, num_shards: int
) -> int:
    """Tokenize one snapshot file into ``num_shards`` ordered parquet shards; returns rows."""
    from pyspark.sql import functions as F

    from pipelines.data.tokens import encoder_json

    frame = spark.read.parquet(snapshot_file.resolve().as_uri()).select(
        # position in the file (ingest writes one file per split, so it is the snapshot order)
        "text", "label", F.col("_metadata.row_index").alias("row_id")
    )
    tokens = (
        frame.repartitionByRange(num_shards, "row_id")  # shard k holds a contiguous row range
        .sortWithinPartitions("row_id")
        .mapInPandas(_tokenizer_fn(encoder_json(config.data.tokenizer_source, config.data.max_seq_len,
                                                config.data.truncation_side)), TOKEN_SCHEMA)
        .drop("row_id")
    )
    tokens.write.mode("error").parquet(out_dir.resolve().as_uri())
    return _count_rows(out_dir)


def _count_rows(split_dir: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in sorted(split_dir.glob("part-*.parquet")))


def preprocess(config: BenchmarkConfig, paths: RunPaths) -> dict:
    """Validated snapshot -> token shards; returns rows, seconds, rows/s and shard counts. On the
    run's embedded cluster in its network namespace, the Spark driver runs there too (``in_namespace``)."""
    require_valid_snapshot(paths)  # never tokenize data that failed (or skipped) validation
    where = spark_cluster.driver_namespace(config, paths)
    if where is not None and where.prefix:
        return in_namespace(config, paths, where)
    started = time.perf_counter()
    check_tokenizer(config.data.tokenizer_source)  # fail here with one line, not in a Spark task
    quiet = {"spark.ui.showConsoleProgress": "false"}  # progress bars garble task logs
    ours = not session_running()  # a caller's session (a test's) stays; the step's own ends with it
    spark = get_spark(master_url(config, paths), app_name="preprocess", conf=quiet)
    manifest = json.loads(paths.manifest.read_text())
    for stale in paths.root.glob(".tokens.tmp-*"):  # left by a tokenization that was killed
        if is_stale_temp(stale, ".tokens.tmp-"):  # a live one's (a concurrent preprocess) is its own
            log.warning("removing %s, left by an earlier preprocess that did not finish", stale)
            shutil.rmtree(stale, ignore_errors=True)
    tmp = paths.root / f".tokens.tmp-{writer_tag()}-{uuid.uuid4().hex[:8]}"
    stats: dict = {"rows": {}, "num_shards": {}, "max_seq_len": config.data.max_seq_len,
                   "truncation_side": config.data.truncation_side,
                   "tokenizer_source": config.data.tokenizer_source}
    try:
        spark_started = time.perf_counter()
        for split in SNAPSHOT_SPLITS:
            rows = manifest["splits"][split]["rows"]
            shards = max(1, min(rows, spark.sparkContext.defaultParallelism))
            written = tokenize_split(spark, paths.snapshot_split(split), tmp / split, config, shards)
            if written != rows:
                raise RuntimeError(f"{split}: wrote {written} token rows for {rows} snapshot rows")
            stats["rows"][split] = written
            stats["num_shards"][split] = len(list((tmp / split).glob("part-*.parquet")))
        tokenize_seconds = time.perf_counter() - spark_started
        for crc in tmp.rglob(".*.crc"):  # Hadoop checksum side files: noise for readers
            crc.unlink()
        stats.update(
            seconds=round(time.perf_counter() - started, 3),
            tokenize_seconds=round(tokenize_seconds, 3),
            rows_per_second=round(sum(stats["rows"].values()) / tokenize_seconds, 1),
            snapshot_sha256={s: manifest["splits"][s]["sha256"] for s in SNAPSHOT_SPLITS},
        )
        (tmp / "preprocess.json").write_text(json.dumps(stats, indent=2))
        if paths.tokens.exists():
            shutil.rmtree(paths.tokens)
        os.replace(tmp, paths.tokens)  # both splits appear together or not at all
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if ours:
            stop_spark(jvm=True)  # no JVM of the data stage stays beside the timed cells that follow
    log.info("tokenized %s rows in %.1f s (%.0f rows/s)",
             stats["rows"], stats["seconds"], stats["rows_per_second"])
    return stats


def in_namespace(config: BenchmarkConfig, paths: RunPaths, where) -> dict:
    """``preprocess`` in a driver process of its own in ``where`` (the embedded cluster's network
    namespace, ``pipelines.cluster.netns``), its output teed to ``<run>/tokens-driver.log``; the
    stats it wrote. The config goes in a file (0600, removed afterwards): the run's, or a caller's."""
    import sys

    from pipelines.cluster.processes import run_to_end
    from pipelines.runfolder.fileio import atomic_write_text

    given = atomic_write_text(paths.root / f".preprocess-config-{uuid.uuid4().hex[:8]}.json", config.to_json())
    try:
        run_to_end([*where.prefix, sys.executable, "-m", __name__, "--run-dir", str(paths.root), "--config",
                    str(given)], os.environ, paths.root / "tokens-driver.log", what="the tokenization driver",
                   grace_s=30.0)
    finally:
        given.unlink(missing_ok=True)
    return json.loads((paths.tokens / "preprocess.json").read_text())


def main(argv: list[str] | None = None) -> None:
    import argparse
    import sys

    from pipelines.config import read_config
    from pipelines.measure.signals import end_tree_on_signal

    parser = argparse.ArgumentParser(description="the data stage's tokenization (a driver process of its own)")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--config", required=True, help="the run's config (JSON)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)
    end_tree_on_signal()
    preprocess(read_config(Path(args.config)), RunPaths(Path(args.run_dir)))


if __name__ == "__main__":
    main()
