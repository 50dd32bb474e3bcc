"""DeepSpeed (``pipelines/platforms/deepspeed/``): its declaration, settings and refusals, the
``deepspeed`` command lines (one host; ``--no_ssh`` per node across hosts), and real cells: ZeRO-1,
2 and 3 on this host, each trained like DDP (the parity below), a resumed attempt, the report, the
Benchmarks page's data and MLflow, and ZeRO-3 across two emulated hosts losing one, its retry the
cell across both (heavy: each stage's cell across them).

Parity tolerance: at the same seed and world size (2) a ZeRO cell sees the same model, data order,
dropout streams, optimizer (the loop's fused AdamW, as a client optimizer) and schedule as DDP. ZeRO-1
and ZeRO-2 only partition the optimizer state and the gradients: each element still gets the same
arithmetic (the average of the two ranks' gradients, a + b then / 2, exact in either order; the same
elementwise AdamW update, on a flat partition instead of per tensor). Measured: the per-epoch train
and validation losses and the test loss are bit-identical to DDP's (and so are ZeRO-3's). The test
allows ``LOSS_TOL`` = 1e-6 absolute on losses of about 0.7 (about 8 ulps of float32 at 0.7, far
below any real divergence: one different update moves them by 1e-4 or more) so that a kernel
summing in another order, e.g. gloo over more ranks, does not fail it.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipelines import platforms
from pipelines.cluster import why_unavailable
from pipelines.config import ConfigError, TrainingStrategy, parse_strategy
from pipelines.platforms.deepspeed import adapter as ds_adapter
from pipelines.platforms.deepspeed.engine import ds_config, prune
from pipelines.runfolder.paths import PROJECT_ROOT
from tests.platforms.small_runs import small_config, small_run

LOSS_TOL = 1e-6  # see the module docstring
HOSTS = [SimpleNamespace(name=f"h{k}", address=f"10.213.0.{k + 1}") for k in range(2)]
_NO_NETNS = why_unavailable()


_config = partial(small_config, backends=["ddp", "deepspeed"])
_run = partial(small_run, backends=["ddp", "deepspeed"])


# --- without training ------------------------------------------------------------------------------
def test_the_platform_is_a_builtin_with_its_settings(tmp_path, imdb_dir, bert_tiny_dir):
    platform = platforms.get("deepspeed")
    assert "deepspeed" in platforms.default_names() and "deepspeed" not in platforms.smoke_names()  # too slow for it
    assert platforms.styles()["deepspeed"] == {"label": "DeepSpeed (ZeRO)", "colour": "#0891b2"}
    assert platform.package == "pipelines.platforms.deepspeed"
    config = _config(tmp_path, imdb_dir, bert_tiny_dir)
    assert (config.engine("deepspeed").zero_stage, config.engine("deepspeed").offload) == (2, "none")
    assert config.model_copy(update={"deepspeed_zero_stage": 3}).engine("deepspeed").zero_stage == 3  # flat name
    assert config.model_copy(update={"engines.deepspeed.offload": "optimizer"}).engine("deepspeed").mode == \
        "zero2-offload-optimizer"
    with pytest.raises(ConfigError, match="needs zero_stage=3"):
        config.model_copy(update={"engines.deepspeed.offload": "optimizer+parameters"})
    with pytest.raises(ConfigError, match="zero_stage"):
        config.model_copy(update={"engines.deepspeed.zero_stage": 4})
    assert "zero2-offload-optimizer" in platform.mode_caveats and "zero2" not in platform.mode_caveats
    assert "zero3-offload-optimizer-parameters-2-hosts" in platform.mode_caveats


def test_the_trigger_form_offers_it_and_takes_its_settings():
    from pipelines.run.dag_plan import config_from_params, param_specs

    assert "deepspeed" in param_specs()["backends"]["items"]["enum"]
    config = config_from_params({"profile": "smoke", "backends": ["ddp", "deepspeed"],
                                 "overrides": {"engines.deepspeed.zero_stage": 3}}, environ={})
    assert config.matrix.backends == ["ddp", "deepspeed"] and config.engine("deepspeed").zero_stage == 3


def test_the_ddp_only_strategies_are_refused_with_the_reason():
    backend = ds_adapter.DeepSpeedBackend()

    def refusal(name):
        return backend.strategy_refusal(TrainingStrategy(**parse_strategy(name)), 2)

    for name in ("fp16", "powersgd-r2", "localsgd-4"):
        assert "DeepSpeed's engine reduces the gradients itself" in refusal(name), name
    assert "engines.deepspeed.zero_stage=3" in refusal("fsdp")
    assert refusal("default") is None and refusal("weighted_loss") is None and refusal("weighted_sampler") is None


def test_preflight_says_when_deepspeed_is_missing(tmp_path, imdb_dir, bert_tiny_dir, monkeypatch):
    config = _config(tmp_path, imdb_dir, bert_tiny_dir)
    backend = ds_adapter.DeepSpeedBackend()
    assert backend.preflight(config, [("default", 2)]) == []
    monkeypatch.setattr(ds_adapter.importlib.util, "find_spec", lambda name: None)
    assert "deepspeed package is not installed" in backend.preflight(config, [("default", 2)])[0]


def test_one_host_commands(tmp_path):
    cmd = ds_adapter.runner_command(ds_adapter.WORKER, Path("/r/cells/deepspeed-w2-r0"), 12.5, master_port=29411,
                                    slots=ds_adapter.local_slots(2, {}, gpus=0), python="py")
    assert cmd == ["py", "-m", "deepspeed.launcher.runner", "--master_port", "29411", "--num_gpus", "2",
                   "--no_local_rank", "--module", "pipelines.platforms.deepspeed.worker",
                   "--cell-dir", "/r/cells/deepspeed-w2-r0", "--launch-time", "12.5"]
    # GPU hosts: the GPUs the deployment left visible, one rank each
    assert ds_adapter.local_slots(2, {"CUDA_VISIBLE_DEVICES": "2,3,5"}, gpus=8) == ["--include", "localhost:2,3"]
    assert ds_adapter.local_slots(1, {}, gpus=2) == ["--include", "localhost:0"]
    with pytest.raises(ValueError, match="3 workers need 3 GPUs"):
        ds_adapter.local_slots(3, {}, gpus=2)
    assert ds_adapter.accelerator_env({"A": "1"}, gpus=False) == {"A": "1", "DS_ACCELERATOR": "cpu"}
    assert ds_adapter.accelerator_env({}, gpus=True)["DS_ACCELERATOR"] == "cuda"


def test_node_commands_across_hosts_are_no_ssh_with_a_hostfile():
    assert ds_adapter.hostfile_text(HOSTS, 2) == "h0 slots=2\nh1 slots=2\n"
    cmds = [ds_adapter.runner_command(ds_adapter.WORKER, Path("/r/c"), 1.5, master_port=29500, python="py",
                                      hostfile=Path("/r/c/hostfile"), node_rank=k, master_addr="10.213.0.1")
            for k in range(2)]
    for k, cmd in enumerate(cmds):
        assert cmd[:5] == ["py", "-m", "deepspeed.launcher.runner", "--master_port", "29500"]
        assert cmd[5:13] == ["--hostfile", "/r/c/hostfile", "--no_ssh", "--node_rank", str(k),
                             "--master_addr", "10.213.0.1", "--no_local_rank"]
    from deepspeed.launcher.runner import parse_args  # the launcher itself reads them as meant

    args = parse_args(cmds[1][3:])
    assert (args.no_ssh, args.node_rank, args.master_addr, args.module, args.no_local_rank) == \
        (True, 1, "10.213.0.1", True, True)
    assert args.user_script == "pipelines.platforms.deepspeed.worker"
    assert args.user_args == ["--cell-dir", "/r/c", "--launch-time", "1.5"]


def test_the_deepspeed_config_of_a_cell_and_checkpoint_pruning(tmp_path):
    cfg = ds_config(16, 2, 2, "none")
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["train_batch_size"], cfg["gradient_accumulation_steps"]) == \
        (16, 32, 1)
    assert cfg["zero_optimization"] == {"stage": 2} and cfg["gradient_clipping"] == 0.0
    assert "fp16" not in cfg and "bf16" not in cfg and "optimizer" not in cfg  # fp32 masters, the loop's AdamW
    assert cfg["comms_logger"]["enabled"] and "comms_logger" not in ds_config(16, 2, 2, "none", comms_logger=False)
    zero3 = ds_config(8, 4, 3, "optimizer+parameters")["zero_optimization"]
    assert zero3["offload_optimizer"]["device"] == zero3["offload_param"]["device"] == "cpu"
    for epoch in (1, 2, 3):
        (tmp_path / f"epoch-{epoch:04d}").mkdir()
    (tmp_path / "latest").write_text("epoch-0003")
    assert [p.name for p in prune(tmp_path, keep=2)] == ["epoch-0001"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch-0002", "epoch-0003", "latest"]


def test_platform_modes_name_the_stage_the_offload_and_the_hosts(tmp_path, imdb_dir, bert_tiny_dir):
    backend = ds_adapter.DeepSpeedBackend()
    config = _config(tmp_path, imdb_dir, bert_tiny_dir, **{"engines.deepspeed.zero_stage": 3,
                                                           "engines.deepspeed.offload": "optimizer"})
    spec = SimpleNamespace(config=config, cell_dir=tmp_path / "c")
    assert backend.platform_fields(spec) == {"platform_mode": "zero3-offload-optimizer"}
    backend._hosts_by_cell()[spec.cell_dir] = 2
    assert backend.platform_fields(spec) == {"platform_mode": "zero3-offload-optimizer-2-hosts"}


# --- real cells on this host -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, imdb_dir, bert_tiny_dir):
    """One run folder with a ddp cell and a deepspeed cell (ZeRO-2, the default) of 2 workers."""
    from pipelines.run.cells import run_cell

    root = tmp_path_factory.mktemp("deepspeed") / "runs"
    config, paths = _run(root, "ds-and-ddp", imdb_dir, bert_tiny_dir)
    ddp = run_cell(config, paths, "ddp", 2)
    zero2 = run_cell(config, paths, "deepspeed", 2)
    return SimpleNamespace(root=root, config=config, paths=paths, ddp=ddp, zero2=zero2)


def _losses(result) -> list[float]:
    return [x for e in result.epochs for x in (e.train_loss, e.eval_loss)] + [result.test.loss]


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_local_zero_cell_trains_like_ddp(stage, reference_run, imdb_dir, bert_tiny_dir):
    from pipelines.run.cells import run_cell

    ddp = reference_run.ddp
    if stage == 2:
        result, cell = reference_run.zero2, reference_run.paths.cell("deepspeed", 2, 0)
    else:
        config, paths = _run(reference_run.root, f"zero{stage}", imdb_dir, bert_tiny_dir,
                             backends=["deepspeed"], **{"engines.deepspeed.zero_stage": stage})
        result, cell = run_cell(config, paths, "deepspeed", 2), paths.cell("deepspeed", 2, 0)
    assert result.status == "ok", result.error
    assert result.platform_mode == f"zero{stage}" and result.versions["launcher"] == "deepspeed"
    assert result.phases["compute"] > 0 and result.phases["communication"] > 0 and result.phases["launch"] > 0
    assert result.comm_bytes_per_step and result.comm_bytes_per_step > 0
    assert result.resources is not None and result.resources.ranks == 2
    assert {"deepspeed_runner", "deepspeed_launch"} <= set(result.resources.platform_processes)
    assert (cell.checkpoints / "deepspeed" / "epoch-0002").is_dir()  # DeepSpeed's own, beside the loop's
    assert len(result.epochs) == 2 and result.test is not None
    # the parity (module docstring): the same losses as DDP at the same seed and world size
    assert _losses(result) == pytest.approx(_losses(ddp), abs=LOSS_TOL, rel=0)
    assert result.test.accuracy == ddp.test.accuracy


@pytest.mark.slow
@pytest.mark.heavy  # 34 s in CI: the ZeRO cells stay there; resuming a failed attempt: ddp's test in CI
def test_a_failed_attempt_resumes_from_deepspeeds_checkpoint(reference_run, imdb_dir, bert_tiny_dir, monkeypatch):
    """Rank 0 fails at the end of epoch 1 on the first try; the project's retry resumes from the
    checkpoint (DeepSpeed's load_checkpoint on every rank) and ends where an unbroken cell does."""
    from pipelines.run import stages
    from pipelines.runfolder.results import CellResult

    monkeypatch.setenv("PIPELINES_EPOCH_END_HOOK", "tests.fault_injection:fail_first_tries")
    monkeypatch.setenv("FAULT_FAIL_TRIES", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])))
    _, paths = _run(reference_run.root, "resumed", imdb_dir, bert_tiny_dir, backends=["deepspeed"],
                         cell_retries=1)
    stages.train_cell(str(paths.root), "deepspeed", 2)
    result = CellResult.read(paths.cell("deepspeed", 2, 0).result)
    assert [a.outcome for a in result.attempts] == ["failed", "ok"] and result.resumed_from_epoch == 1
    assert "fault injection: try 1" in paths.cell("deepspeed", 2, 0).log.read_text()  # rank 0, as planned
    assert _losses(result) == pytest.approx(_losses(reference_run.zero2), abs=LOSS_TOL, rel=0)


@pytest.mark.slow
def test_the_report_the_costs_the_page_and_mlflow(reference_run):
    from mlflow import MlflowClient

    from pipelines.report import build_report
    from pipelines.evaluation import evaluate_run
    from pipelines.tracking.runs import log_benchmark
    from pipelines.web.data import load_run, trends_data

    config, paths = reference_run.config, reference_run.paths
    summary = evaluate_run(config, paths)
    assert [a.backend for a in summary.aggregates] == ["ddp", "deepspeed"]
    md = Path(build_report(config, paths)["markdown"]).read_text().replace("`", "")
    sections = md.split("\n## ")[1:]
    for section in sections:  # every section that shows the ddp cell shows the deepspeed cell too
        if "| ddp" in section:
            assert "| deepspeed" in section or "deepspeed" in section, section.splitlines()[0]
    costs = md[md.index("## What each platform costs"):]
    assert "| deepspeed" in costs and "zero2" in costs

    page = trends_data(reference_run.root, profile=config.profile)
    assert page["trends"]["platforms"]["deepspeed"]["colour"] == "#0891b2"
    assert {s["backend"] for s in page["trends"]["series"]} == {"ddp", "deepspeed"}
    assert {a["backend"] for a in load_run(paths.root).summary["aggregates"]} == {"ddp", "deepspeed"}

    uri = f"sqlite:///{reference_run.root / 'mlflow.db'}"
    tracked = config.model_copy(update={"mlflow_tracking_uri": uri})
    log_benchmark(tracked, paths)
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    cell = next(r for r in runs if (r.data.tags.get("mlflow.runName") or "").startswith("deepspeed-w2-r0"))
    assert cell.data.tags["platform_mode"] == "zero2"
    assert cell.data.metrics["test_accuracy"] == pytest.approx(reference_run.zero2.test.accuracy)


# --- across two emulated hosts (root) --------------------------------------------------------------
def _assert_across_two_hosts(result, cell, stage: int) -> None:
    """The cluster profile's path: the run's emulated hosts, a shaped 1 Gbit/s link, one
    ``deepspeed --no_ssh`` per host; the ranks' traffic crosses the link."""
    assert result.platform_mode == f"zero{stage}-2-hosts" and result.network == "1gbit"
    assert result.placements == ["h0 10.213.0.1", "h1 10.213.0.2"]
    assert (cell.root / "hostfile").read_text() == "h0 slots=1\nh1 slots=1\n"
    assert set(result.link_bytes) == {"h0", "h1"}
    if stage == 3:  # at least this rank's share of the parameters crosses the link every step (4.4 M fp32 / 2)
        assert result.link_bytes_per_step > 4.4e6 * 4 / 2
    assert result.phases["communication"] > 0


@pytest.mark.slow
@pytest.mark.heavy  # CI trains ZeRO-3 across the hosts in the host-loss test below (its retry): these repeat it
@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_cell_across_two_emulated_hosts(stage, tmp_path, imdb_dir, bert_tiny_dir):
    from pipelines.cluster import lifecycle
    from pipelines.run import stages
    from pipelines.runfolder.results import CellResult

    config, paths = _run(tmp_path / "runs", f"hosts{stage}", imdb_dir, bert_tiny_dir, backends=["deepspeed"],
                         epochs=1, **{"cluster.kind": "emulated", "networks": ["1gbit"],
                                      "engines.deepspeed.zero_stage": stage})
    with lifecycle.run_cluster(paths, config):
        stages.train_cell(str(paths.root), "deepspeed", 2, network="1gbit")
    cell = paths.cell("deepspeed", 2, 0, network="1gbit")
    result = CellResult.read(cell.result)
    assert result.status == "ok", result.error
    _assert_across_two_hosts(result, cell, stage)


@pytest.mark.slow
@pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))
def test_losing_a_host_fails_the_attempt_and_the_projects_retry_recovers_it(tmp_path, imdb_dir, bert_tiny_dir,
                                                                            record_property):
    """ZeRO-3 across two hosts (35 s alone on a quiet 2-core box): DeepSpeed's launcher restarts nothing, so the
    attempt fails when h1 goes, and the retry resumes from DeepSpeed's checkpoint of epoch 1 (each rank's shard
    of parameters and optimizer state) as the platform's cell across both hosts, checked as such."""
    from pipelines.cluster import lifecycle
    from pipelines.run import stages
    from pipelines.runfolder.results import CellResult

    config, paths = _run(tmp_path / "runs", "loss", imdb_dir, bert_tiny_dir, backends=["deepspeed"], epochs=2,
                         fault="host_loss", fault_epoch=2, cell_retries=1,
                         **{"cluster.kind": "emulated", "networks": ["1gbit"], "engines.deepspeed.zero_stage": 3})
    with lifecycle.run_cluster(paths, config) as state:
        stages.train_cell(str(paths.root), "deepspeed", 2, network="1gbit")
        assert lifecycle.attach(state).hosts[1].pids() == []
    cell = paths.cell("deepspeed", 2, 0, network="1gbit")
    result = CellResult.read(cell.result)
    assert result.status == "ok" and len(result.epochs) == 2, result.error
    assert [a.outcome for a in result.attempts] == ["failed", "ok"]
    _assert_across_two_hosts(result, cell, 3)
    record_property("also_checks", "across hosts")
    fault = result.fault
    assert fault["host"] == "h1" and fault["recovered_by"] == "project" and fault["resumed_from_epoch"] == 1, fault
