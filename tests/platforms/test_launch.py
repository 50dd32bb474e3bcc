"""Pure launch builders and the registry: no processes started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed.run as torchrun

from pipelines import platforms
from pipelines.platforms import torchrun as launch
from pipelines.platforms.ddp import adapter as ddp
from pipelines.run.cells import get_backend
from pipelines.platforms.determined.adapter import experiment_config, validate_experiment_config
from pipelines.platforms.spark.distributor import check_task_slots, distributor_settings


def test_single_node_is_standalone_and_parses_with_torchrun(make_config):
    cmd = launch.worker_command(make_config(), 2, Path("/r/cells/ddp-w2-r0"), 123.5, python="py")
    assert cmd[:3] == ["py", "-m", "torch.distributed.run"]
    args = torchrun.get_args_parser().parse_args(cmd[3:])
    assert args.standalone and args.nproc_per_node == "2" and args.module
    assert args.training_script == "pipelines.training.worker"
    assert args.training_script_args == ["--cell-dir", "/r/cells/ddp-w2-r0", "--launch-time", "123.5"]


def test_multi_node_flags_are_passed_through(make_config):
    cmd = launch.torchrun_command(nproc_per_node=2, nnodes=3, node_rank=2, rdzv_endpoint="node0:29400",
                                  rdzv_id="ddp-w6-r0", max_restarts=1, module="x", cell_dir=Path("/r/c"),
                                  launch_time=1.5, python="py")
    args = torchrun.get_args_parser().parse_args(cmd[3:])
    assert not args.standalone and args.max_restarts == 1 and args.training_script == "x"
    assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("3", 2, "2")
    # static rendezvous: the node rank decides the ranks, so rank 0 is on node 0
    assert (args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id) == ("static", "node0:29400", "ddp-w6-r0")


def test_the_ddp_adapter_passes_its_own_node_settings(make_config):
    """The builder reads no platform's settings: DDP hands it engines.ddp's (Determined's local
    Trainer is one node: across machines its master schedules the slots)."""
    cfg = make_config(ddp_nnodes=3, ddp_node_rank=2, ddp_rdzv_endpoint="node0:29400")
    nodes = ddp.torchrun_nodes(cfg)
    assert nodes == {"nnodes": 3, "node_rank": 2, "rdzv_endpoint": "node0:29400"}
    args = torchrun.get_args_parser().parse_args(
        launch.worker_command(cfg, 6, Path("/r/cells/ddp-w6-r0"), 1.0, **nodes)[3:])
    # workers = total processes: 6 over 3 nodes -> 2 per node; rendezvous id = the cell folder
    assert (args.nnodes, args.node_rank, args.nproc_per_node, args.rdzv_id) == ("3", 2, "2", "ddp-w6-r0")
    assert args.max_restarts == cfg.matrix.platform_retries
    assert launch.worker_command(cfg, 6, Path("/r/c"), 1.0)[3:6] == ["--standalone", "--nnodes", "1"]


def test_workers_are_the_total_over_nodes():
    assert launch.nproc_per_node(3) == 3
    assert launch.nproc_per_node(2, nnodes=2) == 1 and launch.nproc_per_node(4, nnodes=2) == 2
    for workers in (1, 3):
        with pytest.raises(ValueError, match=f"workers={workers} cannot be split over nnodes=2"):
            launch.nproc_per_node(workers, nnodes=2)


def test_bad_multi_node_settings_are_refused():
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        launch.torchrun_args(1, nnodes=2)
    with pytest.raises(ValueError, match="node_rank"):
        launch.torchrun_args(1, nnodes=2, node_rank=2, rdzv_endpoint="h:1")


def test_secondary_node_refuses_a_bad_split_before_writing(make_config, tmp_path):
    from pipelines.runfolder.paths import RunPaths

    cfg = make_config(ddp_nnodes=2, ddp_node_rank=1, ddp_rdzv_endpoint="h:1")
    with pytest.raises(ValueError, match="cannot be split"):
        get_backend("ddp").run(cfg, 3, paths=RunPaths(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_secondary_node_waits_for_a_new_result_of_node_0(tmp_path):
    from pipelines.runfolder.results import CellResult

    path = tmp_path / "result.json"
    old = CellResult(backend="ddp", world_size=2, status="failed", error="previous attempt")
    old.write(path)
    before = ddp._file_version(path)
    with pytest.raises(TimeoutError, match="node 0 wrote no new"):
        ddp.wait_for_new_result(path, before, timeout=0.3, interval=0.05)
    CellResult(backend="ddp", world_size=2).write(path)
    assert ddp.wait_for_new_result(path, before, timeout=1).status == "ok"


def test_launch_env_sets_threads_and_the_installed_package_imports_anywhere(make_config, tmp_path):
    env = launch.launch_env(make_config(threads_per_worker=3), {"X": "1", "PATH": os.environ["PATH"]})
    assert env["OMP_NUM_THREADS"] == "3" and env["X"] == "1" and "PYTHONPATH" not in env
    out = subprocess.run([sys.executable, "-c", "import pipelines; print(pipelines.__file__)"], env=env,
                         cwd=tmp_path, capture_output=True, text=True, check=True)  # no sys.path edits
    assert Path(out.stdout.strip()).parent.parent == Path(ddp.__file__).resolve().parents[3]


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
    assert conf["hyperparameters"]["global_batch_size"] == 2 * make_config().training.batch_size
    assert "determined.launch.torch_distributed" in conf["entrypoint"]
    broken = {**conf, "searcher": {**conf["searcher"], "max_length": {"weeks": 1}}}
    with pytest.raises(ValueError, match="max_length"):
        validate_experiment_config(broken)
    with pytest.raises(ValueError, match="records_per_epoch"):
        validate_experiment_config({k: v for k, v in conf.items() if k != "records_per_epoch"})


def test_registry_covers_every_backend_and_refuses_unknown():
    for backend in platforms.names():
        assert get_backend(backend).name == backend
    with pytest.raises(ValueError, match=r"unknown backend 'horovod' \(registered: ddp, spark"):
        platforms.check_name("horovod")  # strings become members once, at the CLI / DAG boundary


def test_importing_backends_is_cheap():
    code = ("import sys, pipelines.run.cells; "
            "print(sorted(m for m in ('torch', 'pyspark', 'determined', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(ddp.__file__).resolve().parents[3])
    assert out.stdout.strip() == "[]"


def test_placement_names_the_spark_executor_a_rank_ran_in():
    from pipelines.training.host import placement

    work = "/opt/spark/work/app-20261130202133-0001/3"  # <worker work dir>/<app id>/<executor id>
    executor = platforms.get("spark").workdir_placement  # the platform's, through its record
    assert placement(cwd=work, host="node7", workdir=executor) == "node7 executor app-20261130202133-0001/3"
    assert placement(cwd="/srv/runs/r1", host="node7", workdir=executor) == "node7"  # local mode
    assert placement(cwd=work, host="node7", workdir=platforms.get("ddp").workdir_placement) == "node7"


def test_one_process_per_node_ranks_are_not_pinned_to_the_same_core():
    """Spark barrier tasks start one torchrun per task: every rank is local rank 0 of 1. Two
    such ranks on one host must not both be pinned to core 0 (they would share it)."""
    import os

    from pipelines.training.distributed import pin_cpu_cores

    before = os.sched_getaffinity(0)
    try:
        assert pin_cpu_cores(0, 1, 1, world=2) == () and os.sched_getaffinity(0) == before
        if len(before) >= 2:  # torchrun with 2 local ranks: each its own core
            assert pin_cpu_cores(1, 2, 1, world=2) == (sorted(before)[1],)
    finally:
        os.sched_setaffinity(0, before)
