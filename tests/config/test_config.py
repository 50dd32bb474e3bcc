"""The one typed config: profiles, layering, sections and flat aliases, and errors that name the field."""

import json
from pathlib import Path

import pytest

from pipelines.config import (PROFILES, BenchmarkConfig, ConfigError, load_config,
                              parse_set_options, read_config, save_config)


def test_profiles_exist_and_resolve():
    assert {"smoke", "nightly", "paper"} <= set(PROFILES)
    paper = load_config("paper")
    assert paper.training.epochs == 20 and paper.data.train_samples is None and paper.data.test_samples is None
    assert load_config("nightly").matrix.repeats >= 3
    smoke = load_config("smoke")
    assert smoke.data.train_samples <= 2000 and smoke.data.max_seq_len <= 128


def test_overrides_layer_on_the_profile_and_none_keeps_it():
    cfg = load_config("smoke", {"epochs": 5, "batch_size": None, "backends": ["spark", "ddp", "spark"]})
    assert cfg.training.epochs == 5 and cfg.training.batch_size == PROFILES["smoke"]["batch_size"]
    assert cfg.matrix.backends == ["spark", "ddp"]
    assert load_config("smoke", {"worker_counts": [2, 1, 2]}).matrix.worker_counts == [1, 2]


@pytest.mark.parametrize("overrides, field, hint", [
    ({"backends": ["horovod"]}, "backends", "ddp, spark, spark_per_job, determined, ray"),
    ({"ray_address": "http://head:8265"}, "ray_address", "ray://host:port"),
    ({"epochs": 0}, "epochs", "greater than or equal to 1"),
    ({"worker_counts": [0]}, "worker_counts", ">= 1"),
    ({"max_seq_len": 4096}, "max_seq_len", "less than or equal to 512"),
    ({"no_such_field": 1}, "no_such_field", "known fields"),
])
def test_bad_values_name_the_field_and_what_is_allowed(overrides, field, hint):
    with pytest.raises(ConfigError) as err:
        load_config("smoke", overrides)
    assert field in str(err.value) and hint in str(err.value)


def test_unknown_profile_lists_the_profiles():
    with pytest.raises(ConfigError, match="smoke, nightly, cluster, paper"):
        load_config("huge")


def test_set_options_and_round_trip(tmp_path):
    assert parse_set_options(["epochs=3", 'backends=["ddp"]', "dataset_source=/data/imdb"]) == {
        "epochs": 3, "backends": ["ddp"], "dataset_source": "/data/imdb"}
    with pytest.raises(ConfigError, match="key=value"):
        parse_set_options(["epochs"])
    cfg = load_config("nightly", {"seed": 7})
    save_config(cfg, tmp_path / "config.json")
    assert read_config(tmp_path / "config.json") == cfg


def test_cells_cover_every_backend_worker_repeat():
    cfg = load_config("smoke", {"repeats": 2, "backends": ["ddp", "spark"], "worker_counts": [1, 2]})
    assert len(cfg.cells()) == 8 and cfg.cells()[0] == ("ddp", "default", "local", 1, 0)
    # each repeat starts with another platform: none always pays the run's first cell's cold caches
    assert [c[0] for c in cfg.cells() if c[4] == 1] == ["spark", "spark", "ddp", "ddp"]


def test_tracking_uri_is_never_the_working_directory(monkeypatch, tmp_path):
    cfg = BenchmarkConfig(output_root=str(tmp_path))
    assert cfg.resolved_tracking_uri() == f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert cfg.resolved_tracking_uri() == f"sqlite:///{tmp_path}/mlflow.db"  # fixed once built
    assert load_config("smoke").resolved_tracking_uri() == "http://127.0.0.1:5000"  # taken at build
    assert load_config("smoke", {"mlflow_tracking_uri": "sqlite:///x.db"}).resolved_tracking_uri() == "sqlite:///x.db"


def test_training_identity_ignores_where_a_cell_runs():
    base = load_config("smoke")
    moved = load_config("smoke", {"spark_master": "spark://10.0.0.1:7077", "ddp_rdzv_endpoint": "h:29400",
                                  "output_root": "/elsewhere", "mlflow_tracking_uri": "http://m:5000"})
    assert moved.training_identity() == base.training_identity()  # a retry may resume elsewhere
    assert load_config("smoke", {"learning_rate": 3e-4}).training_identity() != base.training_identity()


def test_each_cell_gets_its_seed_batch_and_learning_rate(make_config):
    per_worker = make_config(seed=42, batch_size=16, batch_policy="per_worker", learning_rate=1e-3,
                             lr_scaling="linear")
    cell = per_worker.for_cell(world_size=2, repeat=3)
    assert cell.training.seed == 45 and cell.training.batch_size == 16  # global batch 32
    assert cell.training.learning_rate == pytest.approx(2e-3)  # linear: x (32 / 16)
    assert per_worker.for_cell(1, 0).training.learning_rate == pytest.approx(1e-3)

    fixed = make_config(batch_size=32, batch_policy="global", lr_scaling="sqrt", learning_rate=1e-3)
    assert fixed.for_cell(2, 0).training.batch_size == 16 and fixed.for_cell(2, 0).training.learning_rate == pytest.approx(1e-3)
    with pytest.raises(ConfigError, match="cannot be split evenly over 3 workers"):
        fixed.for_cell(3, 0)


def test_fingerprint_follows_the_work_not_the_placement(make_config):
    base = make_config()
    assert base.fingerprint() == make_config(output_root="/elsewhere", spark_master="spark://h:7077",
                                             regression_time_threshold=0.5).fingerprint()
    assert base.fingerprint() != make_config(learning_rate=5e-4).fingerprint()
    assert base.fingerprint() != make_config(batch_policy="per_worker" if base.training.batch_policy == "global"
                                             else "global").fingerprint()


# --- sections, flat aliases, configs written before sections existed ------------------------------
FLAT_CONFIG = Path(__file__).parents[1] / "fixtures" / "config_before_sections.json"  # as the previous release wrote it


def test_dotted_paths_and_flat_names_set_the_same_field():
    assert load_config("smoke", {"training.epochs": 1}) == load_config("smoke", {"epochs": 1})
    config = load_config("smoke", {"engines.spark.master": "embedded", "matrix.repeats": 2})
    assert config.engine("spark").master == config.engines.spark.master == "embedded" and config.matrix.repeats == 2
    assert config.model_copy(update={"ray_address": "auto"}).engines.ray.address == "auto"
    with pytest.raises(ConfigError, match="training.nope"):
        load_config("smoke", {"training.nope": 1})


def test_a_config_written_before_sections_still_loads_and_keeps_its_fingerprint(tmp_path):
    from pipelines.config import read_config

    config = read_config(FLAT_CONFIG)
    assert config.fingerprint() == "11a5fc0551650206"  # what the previous release computed for it
    assert (config.training.epochs, config.matrix.backends, config.engine("spark").master,
            config.engine("ray").address, config.tracking.price_per_worker_hour) == (
        1, ["ddp", "spark"], "local[2]", "auto", 1.5)
    flat = json.loads(FLAT_CONFIG.read_text())
    assert {k: v for k, v in config.flat().items() if k in flat} == flat  # MLflow params keep their names


def test_an_older_run_folder_reports(tmp_path):
    """A run folder whose config.json predates sections: evaluated and reported as before."""
    from pipelines.run import stages
    from tests.synthetic_results import write_synthetic_run

    flat = json.loads(FLAT_CONFIG.read_text())
    flat["output_root"] = str(tmp_path / "runs")
    config = BenchmarkConfig.model_validate(flat)
    paths, _ = write_synthetic_run(config, name="old-run")
    paths.config.write_text(json.dumps(flat, indent=2))  # the file exactly as the old release left it
    assert stages.evaluate(str(paths.root))["cells"] == 4
    md = Path(stages.report(str(paths.root))["markdown"]).read_text()
    assert "ddp" in md and "spark" in md
