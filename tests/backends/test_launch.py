"""Pure launch builders and the registry: no processes started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed.run as torchrun

from pipelines.backends import ddp, get_backend
from pipelines.backends.determined import experiment_config, validate_experiment_config
from pipelines.backends.spark import check_task_slots, distributor_settings
from pipelines.config import Backend


def test_single_node_is_standalone_and_parses_with_torchrun(make_config):
    cmd = ddp.worker_command(make_config(), 2, Path("/r/cells/ddp-w2-r0"), 123.5, python="py")
    assert cmd[:3] == ["py", "-m", "torch.distributed.run"]
    args = torchrun.get_args_parser().parse_args(cmd[3:])
    assert args.standalone and args.nproc_per_node == "2" and args.module
    assert args.training_script == "pipelines.training.worker"
    assert args.training_script_args == ["--cell-dir", "/r/cells/ddp-w2-r0", "--launch-time", "123.5"]


def test_multi_node_flags_are_passed_through(make_config):
    cfg = make_config(ddp_nnodes=3, ddp_node_rank=2, ddp_rdzv_endpoint="node0:29400")
    args = torchrun.get_args_parser().parse_args(
        ddp.torchrun_args(cfg, 4, rdzv_id="ddp-w4-r0") + ["-m", "x"])
    assert not args.standalone
    assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("3", 2, "4")
    assert (args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id) == ("c10d", "node0:29400", "ddp-w4-r0")


def test_bad_multi_node_settings_are_refused(make_config):
    with pytest.raises(ValueError, match="ddp_rdzv_endpoint"):
        ddp.torchrun_args(make_config(ddp_nnodes=2), 1)
    with pytest.raises(ValueError, match="ddp_node_rank"):
        ddp.torchrun_args(make_config(ddp_nnodes=2, ddp_node_rank=2, ddp_rdzv_endpoint="h:1"), 1)


def test_launch_env_makes_project_importable_and_sets_threads(make_config):
    env = ddp.launch_env(make_config(threads_per_worker=3), {"PYTHONPATH": "/other", "X": "1"})
    parts = env["PYTHONPATH"].split(":")
    assert Path(parts[0]) == Path(ddp.__file__).resolve().parents[2] and "/other" in parts
    assert env["OMP_NUM_THREADS"] == "3" and env["X"] == "1"


def test_torch_distributor_settings_follow_master(make_config):
    assert distributor_settings(make_config(spark_master="local[2]"), 2, False) == {
        "num_processes": 2, "local_mode": True, "use_gpu": False}
    assert distributor_settings(make_config(spark_master="spark://h:7077"), 3, True) == {
        "num_processes": 3, "local_mode": False, "use_gpu": True}
    check_task_slots(2, 2, "spark://h:7077")
    with pytest.raises(RuntimeError, match="needs 3 concurrent Spark tasks.*offers 2"):
        check_task_slots(3, 2, "spark://h:7077")


def test_determined_experiment_config_is_valid(make_config):
    conf = experiment_config(make_config(epochs=3), 2, Path("/r/cells/determined-w2-r0"), 1.0, 400)
    validate_experiment_config(conf)
    assert conf["resources"]["slots_per_trial"] == 2
    assert conf["searcher"]["max_length"] == {"epochs": 3} and conf["records_per_epoch"] == 400
    assert conf["hyperparameters"]["global_batch_size"] == 2 * make_config().batch_size
    assert "determined.launch.torch_distributed" in conf["entrypoint"]
    broken = {**conf, "searcher": {**conf["searcher"], "max_length": {"weeks": 1}}}
    with pytest.raises(ValueError, match="max_length"):
        validate_experiment_config(broken)
    with pytest.raises(ValueError, match="records_per_epoch"):
        validate_experiment_config({k: v for k, v in conf.items() if k != "records_per_epoch"})


def test_registry_covers_every_backend_and_refuses_unknown():
    for backend in Backend:
        assert get_backend(backend).name is backend
    with pytest.raises(ValueError, match="unknown backend 'ray'.*known: ddp, spark, determined"):
        get_backend("ray")


def test_importing_backends_is_cheap():
    code = ("import sys, pipelines.backends; "
            "print(sorted(m for m in ('torch', 'pyspark', 'determined') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(ddp.__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"
