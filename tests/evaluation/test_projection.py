"""Fixed versus per-epoch (pipelines.evaluation.projection): the split of a cell's wall time into what a
job pays once (provision, launch, teardown, retries) and per epoch, the total that makes for a
stated job, and the job length from which the fixed cost stays under 5 %; the config field that
states the job; what evaluation and the report make of it; and real ddp cells whose records split
into parts that give back their totals."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from pipelines.config import ConfigError
from pipelines.evaluation import evaluate_run, summary_metrics
from pipelines.evaluation.projection import FIXED_SHARE, fixed_under, project, split, steady_epoch
from pipelines.runfolder.results import CellResult, EpochMetrics
from pipelines.runfolder.summary import Job
from tests.synthetic_results import write_synthetic_run


def _cell(epochs: list[float], *, fixed: dict[str, float] | None = None, final: float = 2.0,
          resumed_from_epoch: int = 0, train: int = 400, test: int = 200) -> CellResult:
    """A finished cell whose epochs took ``epochs`` seconds, with these fixed phases and final."""
    fixed = {"launch": 6.0, "teardown": 1.0} if fixed is None else fixed
    own = sum(s for i, s in enumerate(epochs, 1) if i > resumed_from_epoch)
    return CellResult(
        backend="ddp", world_size=2, train_samples=train, test_samples=test, resumed_from_epoch=resumed_from_epoch,
        epochs=[EpochMetrics(epoch=i, train_loss=0.6, train_accuracy=0.6, eval_loss=0.6, eval_accuracy=0.6,
                             epoch_seconds=s, elapsed_seconds=s * i, samples_per_second=1.0)
                for i, s in enumerate(epochs, 1)],
        phases={**fixed, "compute": own}, total_seconds=sum(fixed.values()) + own + final)


def test_a_cell_splits_into_fixed_first_steady_and_final():
    s = split(_cell([5.0, 3.0, 3.4, 2.8], fixed={"provision": 4.0, "launch": 6.0, "teardown": 1.5}))
    assert s.fixed_seconds == 11.5  # provision + launch + teardown
    assert s.first_epoch_seconds == 5.0 and s.steady_epoch_seconds == 3.0  # median of the epochs after the first
    assert s.warmup_seconds == 2.0 and s.final_seconds == pytest.approx(2.0)
    assert s.per_sample_seconds == 3.0 / 400
    assert steady_epoch([4.0]) == 4.0 and steady_epoch([4.0, 2.0]) == 2.0


def test_a_one_epoch_cell_lets_its_first_epoch_stand_for_every_epoch():
    s = split(_cell([4.0]))
    assert s.first_epoch_seconds == s.steady_epoch_seconds == 4.0 and s.warmup_seconds == 0.0
    cell = _cell([4.0])
    assert project(s, Job(train_samples=400, epochs=3, test_samples=200)) == pytest.approx(
        cell.total_seconds + 2 * 4.0)


def test_projecting_a_cell_onto_its_own_job_gives_its_total_and_scales_with_the_job():
    cell = _cell([5.0, 3.0, 3.0])
    s = split(cell)
    assert project(s, Job(train_samples=400, epochs=3, test_samples=200)) == pytest.approx(cell.total_seconds)
    study = project(s, Job())  # 25,000 reviews x 20 epochs, tested on 25,000
    expected = 7.0 + 2.0 + 20 * 25_000 * 3.0 / 400 + 2.0 * 25_000 / 200
    assert study == pytest.approx(expected)


def test_the_fixed_cost_falls_under_five_percent_from_a_job_length():
    s = split(_cell([5.0, 3.0, 3.0], fixed={"launch": 18.0, "teardown": 2.0}))
    reviews_epochs = fixed_under(s)
    total = s.fixed_seconds + s.warmup_seconds + reviews_epochs * s.per_sample_seconds
    assert s.fixed_seconds / total == pytest.approx(FIXED_SHARE)  # the final test left out
    assert reviews_epochs == pytest.approx((20.0 * 19 - 2.0) / (3.0 / 400))
    cheap = split(_cell([3.0, 3.0], fixed={"launch": 0.01}))
    assert fixed_under(cheap) == pytest.approx((0.01 * 19) / (3.0 / 400))


def test_a_resumed_cell_counts_its_earlier_attempts_as_fixed_and_failed_cells_do_not_split():
    cell = _cell([4.0, 3.0, 3.0], fixed={"launch": 6.0, "teardown": 1.0, "retries": 9.0}, resumed_from_epoch=1)
    s = split(cell)
    assert s.fixed_seconds == 16.0 and s.final_seconds == pytest.approx(2.0)  # epoch 1 is in the retries
    assert split(cell.model_copy(update={"status": "failed"})) is None
    assert split(cell.model_copy(update={"epochs": []})) is None
    old = cell.model_copy(update={"phases": {}, "startup_seconds": 5.5})  # written before phases
    assert split(old).fixed_seconds == 5.5


def test_the_job_is_a_config_field_with_the_studys_default(make_config):
    config = make_config()
    assert config.tracking.projected_job.model_dump() == {"train_samples": 25_000, "epochs": 20,
                                                          "test_samples": 25_000}
    mine = make_config(projected_job={"train_samples": 5000, "epochs": 3})
    assert (mine.tracking.projected_job.train_samples, mine.tracking.projected_job.epochs) == (5000, 3)
    assert make_config(**{"tracking.projected_job.epochs": 7}).tracking.projected_job.epochs == 7
    for wrong in ({"epochs": 0}, {"train_samples": 0}, {"reviews": 10}):
        with pytest.raises(ConfigError, match="projected_job"):
            make_config(projected_job=wrong)
    assert mine.fingerprint() == config.fingerprint()  # how results are judged, not what a cell trains


def test_evaluation_and_the_report_project_each_platform_to_the_job(make_config):
    from pipelines.report import build_report
    from pipelines.report.projection import PROJECTION_COLUMNS

    config = make_config(backends=["ddp", "spark"], worker_counts=[2], repeats=3,
                         projected_job={"train_samples": 5000, "epochs": 3, "test_samples": 1000})
    paths, results = write_synthetic_run(config)
    summary = evaluate_run(config, paths)
    assert summary.job == Job(train_samples=5000, epochs=3, test_samples=1000)
    for agg in summary.aggregates:
        cells = [split(r) for n, r in results.items() if n.startswith(agg.key + "-r")]
        assert agg.fixed_seconds == statistics.median(s.fixed_seconds for s in cells)
        assert agg.steady_epoch_seconds == statistics.median(s.steady_epoch_seconds for s in cells)
        assert agg.projection.total_seconds == pytest.approx(
            agg.fixed_seconds + agg.first_epoch_seconds - agg.steady_epoch_seconds
            + 3 * 5000 * agg.steady_epoch_seconds / agg.train_samples + agg.final_seconds * 1000 / agg.test_samples)
        assert agg.projection.fixed_under_5pct_epochs == math.ceil(
            agg.projection.fixed_under_5pct_sample_epochs / agg.train_samples)
        assert summary_metrics(summary)[f"{agg.key}/projected_total_seconds"] == agg.projection.total_seconds
    row = next(c for c in summary.cells if c.cell == "spark-w2-r1")
    assert row.fixed_seconds == split(results["spark-w2-r1"]).fixed_seconds and row.train_samples == 400

    build_report(config, paths)
    md = paths.report_markdown.read_text()
    study = md.split("## Beside the published study")[1].split("\n## ")[0]
    assert "Projected to the configured job (5,000 reviews x 3 epochs, tested on 1,000)" in study
    assert "| " + " | ".join(PROJECTION_COLUMNS) + " |" in study
    spark = next(a for a in summary.aggregates if a.backend == "spark")
    assert f"| spark | 2 | {spark.fixed_seconds:.2f} | " in study
    assert f"{spark.projection.fixed_under_5pct_sample_epochs:,.0f} reviews x epochs" in study
    verdict = md.split("## Verdict")[1].split("\n## ")[0]
    assert "- Projected to the configured job (5,000 reviews x 3 epochs, tested on 1,000)" in verdict


@pytest.mark.slow
def test_real_cells_split_into_parts_that_project_their_own_totals(make_config, imdb_dir, bert_tiny_dir):
    """Real ddp cells (torchrun, 2 ranks) on 96 reviews at seq 32, one of 1 epoch and one of 2: each
    record splits into fixed, epoch and final parts that give back the cell's own total, and the
    1-epoch cell projected to 2 epochs adds exactly its epoch. How close that projection comes to the
    measured 2-epoch total is a timing, so it is measured by a benchmark (bench/whatif_validate.sh,
    held-out cells), not asserted here: on this shared box one launch alone varies by ~20 %; the bound
    below only catches a part counted twice or left out (the fixed part is ~75 % of these totals)."""
    from pipelines.run.cells import run_cell
    from pipelines.runfolder.paths import RunPaths
    from tests.token_shards import write_token_shards

    one = make_config(max_seq_len=32, epochs=1, batch_size=16, batch_policy="per_worker")
    two = one.model_copy(update={"training.epochs": 2})
    paths = write_token_shards(RunPaths(Path(one.tracking.output_root) / "projection"), imdb_dir, bert_tiny_dir,
                               train_per_class=48, test_per_class=16, seq_len=32, seed=7)
    short, long = run_cell(one, paths, "ddp", 2, 0), run_cell(two, paths, "ddp", 2, 1)
    assert short.status == long.status == "ok" and (len(short.epochs), len(long.epochs)) == (1, 2)
    for cell in (short, long):
        s = split(cell)
        assert s.fixed_seconds > 0 and s.first_epoch_seconds > 0 and s.final_seconds >= 0, s
        own_job = Job(train_samples=cell.train_samples, epochs=len(cell.epochs), test_samples=cell.test_samples)
        assert project(s, own_job) == pytest.approx(cell.total_seconds, rel=1e-6)
    s = split(short)
    predicted = project(s, Job(train_samples=short.train_samples, epochs=2, test_samples=short.test_samples))
    assert predicted == pytest.approx(short.total_seconds + s.first_epoch_seconds, rel=1e-6)
    print(f"1 epoch {short.total_seconds:.2f} s (fixed {s.fixed_seconds:.2f}, epoch {s.first_epoch_seconds:.2f}, "
          f"final {s.final_seconds:.2f}) -> 2 epochs predicted {predicted:.2f} s, measured {long.total_seconds:.2f} s")
    assert abs(predicted / long.total_seconds - 1) < 0.35, (predicted, long.total_seconds)
