"""Two-node DDP on loopback: two torchrun agents (node ranks 0 and 1, one process each) meet
at a static rendezvous on 127.0.0.1:<free port> and train one cell in a run folder both
"nodes" share; the losses must equal a single-node run with 2 processes.

Each node is its own Python process calling ``run_cell`` with its node's config, as two
machines would (``workers=2`` is the total over both nodes). Run alone:
    .venv/bin/python -m pytest tests/platforms/ddp/test_multinode_ddp.py -q
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from pipelines.runfolder.paths import RunPaths
from pipelines.runfolder.results import CellResult

pytestmark = pytest.mark.slow

# One "node": run the cell with the config given as JSON, print the result it returns.
NODE = """
import logging, sys
from pathlib import Path
from pipelines.run.cells import run_cell
from pipelines.config import BenchmarkConfig
from pipelines.runfolder.paths import RunPaths
logging.basicConfig(level=logging.INFO)
result = run_cell(BenchmarkConfig.model_validate_json(sys.argv[1]), RunPaths(Path(sys.argv[2])), "ddp", 2)
print("RESULT " + result.model_dump_json())
"""


def _start_node(config, run_root, log_path):
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, "-c", NODE, config.to_json(), str(run_root)],
                                env={**os.environ, "LOGLEVEL": "INFO"},  # torchrun: log the rendezvous
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # own process group: torchrun + ranks


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_two_nodes_train_like_one_node_with_two_processes(scaleout_config, scaleout_paths,
                                                          single_node_w2, tmp_path, free_port,
                                                          assert_same_training):
    shared = RunPaths(tmp_path / "multinode-run")
    # The shared storage of both nodes: a run folder with the same data stage outputs.
    shared.root.mkdir(parents=True)
    shared.tokens.symlink_to(scaleout_paths.tokens)  # every split's token shards
    shared.snapshot.symlink_to(scaleout_paths.snapshot)  # the manifest (label set) both nodes read
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [scaleout_config(ddp_nnodes=2, ddp_node_rank=rank, ddp_rdzv_endpoint=endpoint)
             for rank in (0, 1)]
    logs = [tmp_path / f"node{rank}.out" for rank in (0, 1)]
    procs = [_start_node(cfg, shared.root, log) for cfg, log in zip(nodes, logs)]
    try:
        for proc in procs:
            proc.wait(timeout=300)
    finally:
        for proc in procs:
            _stop(proc)
    outs = [log.read_text() for log in logs]
    for rank, (proc, out) in enumerate(zip(procs, outs)):
        assert proc.returncode == 0, f"node {rank} failed:\n{out[-4000:]}"

    # Every node returns the one result node 0 wrote; node 1 wrote no result of its own.
    returned = [CellResult.model_validate_json(out.split("RESULT ", 1)[1].splitlines()[0]) for out in outs]
    cell = shared.cell("ddp", 2, 0)
    on_disk = CellResult.read(cell.result)
    assert returned[0] == returned[1] == on_disk
    assert on_disk.status == "ok" and on_disk.world_size == 2 and on_disk.platform_mode == "torchrun-2-nodes"
    assert on_disk.total_seconds > on_disk.startup_seconds > 0

    # Two agents really met at the rendezvous: one process each, global ranks 0 and 1.
    node0_log, node1_log = cell.log.read_text(), cell.node_log(1).read_text()
    for node, text in enumerate((node0_log, node1_log)):
        for line in (f"group_rank={node}", f"global_ranks=[{node}]", "group_world_size=2"):
            assert line in text, f"node {node} log lacks {line!r}:\n{text[-2000:]}"

    assert_same_training(on_disk, single_node_w2)


def test_workers_not_divisible_by_nodes_is_refused_before_any_launch(scaleout_config, tmp_path, free_port):
    from pipelines.run.cells import run_cell

    cfg = scaleout_config(ddp_nnodes=2, ddp_node_rank=0, ddp_rdzv_endpoint=f"127.0.0.1:{free_port()}")
    paths = RunPaths(tmp_path / "run")
    with pytest.raises(ValueError, match="workers=3 cannot be split over nnodes=2"):
        run_cell(cfg, paths, "ddp", 3)
    failed = CellResult.read(paths.cell("ddp", 3, 0).result)
    assert failed.status == "failed" and "nnodes=2" in failed.error
    assert not paths.cell("ddp", 3, 0).spec.exists()
