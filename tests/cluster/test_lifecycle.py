"""The run's emulated cluster (``pipelines.cluster.lifecycle``): the keeper starts it, any process
reaches its hosts through the run folder, the links are shaped per cell, and nothing is left
after ``stop``, after the CLI that started it is SIGKILLed, or after a SIGTERMed cluster run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pipelines.cluster import why_unavailable
from pipelines.cluster import measure_throughput
from pipelines.cluster.leftovers import find_cgroups, list_netns, owner_pid
from pipelines.runfolder.paths import RunPaths

PROJECT_ROOT = Path(__file__).resolve().parents[2]
_NO_NETNS = why_unavailable()
pytestmark = pytest.mark.skipif(_NO_NETNS is not None, reason=str(_NO_NETNS))


def _left_of(keeper_pid: int) -> list[str]:
    ours = lambda name: owner_pid(name) == keeper_pid  # noqa: E731 - bmc<pid>s<start>-...
    return [ns for ns in list_netns() if ours(ns)] + [str(c) for c in find_cgroups() if ours(c.name)]


def _emulated(make_config, **overrides):
    return make_config(**{"cluster.kind": "emulated", "cluster.hosts": 2, "networks": ["unshaped", "100mbit"],
                          "backends": ["ddp"], "worker_counts": [1, 2], **overrides})


def test_cluster_config_is_checked_before_any_work(make_config):
    from pipelines.config import ConfigError
    from pipelines.run.preflight import problems

    with pytest.raises(ConfigError, match="need an emulated cluster"):
        make_config(networks=["100mbit"])
    with pytest.raises(ConfigError, match="network must be"):
        _emulated(make_config, networks=["fast"])
    with pytest.raises(ConfigError, match="ssh_hosts"):
        make_config(**{"cluster.kind": "ssh"})
    config = _emulated(make_config, worker_counts=[2, 3])
    assert config.networks() == ["unshaped", "100mbit"]
    assert [c for c in config.cells() if c[3] == 2] == [("ddp", "default", n, 2, 0) for n in ("unshaped", "100mbit")]
    assert any("3 cannot be spread over 2 emulated host" in p for p in problems(config))
    assert make_config().networks() == ["local"] and make_config().cells()[0][2] == "local"


def test_start_attach_shape_stop(tmp_path, make_config):
    from pipelines.cluster import lifecycle

    paths = RunPaths(tmp_path / "run")
    config = _emulated(make_config)
    state = lifecycle.start(paths, config)
    try:
        assert lifecycle.start(paths, config)["keeper_pid"] == state["keeper_pid"]  # idempotent
        one = lifecycle.hosts_for_cell(paths, config, 1, "unshaped")
        two = lifecycle.hosts_for_cell(paths, config, 2, "100mbit")
        assert [h.name for h in one] == ["h0"] and [h.name for h in two] == ["h0", "h1"]
        two.prepare()  # what TrainingBackend.run does under the host lock
        slow = measure_throughput(two[0], two[1], 4 * 2**20)["bits_per_second"]
        one.prepare()
        fast = measure_throughput(two[0], two[1], 16 * 2**20)["bits_per_second"]
        assert 70e6 < slow < 110e6 and fast > 5 * slow, (slow, fast)
    finally:
        lifecycle.stop(paths)
    assert not psutil.pid_exists(state["keeper_pid"]) and _left_of(state["keeper_pid"]) == []
    with pytest.raises(RuntimeError, match="not running"):
        lifecycle.hosts_for_cell(paths, config, 2, "100mbit")


_OWNER = """
import sys, time
from pipelines.cluster import lifecycle
from pipelines.config import read_config
from pipelines.runfolder.paths import RunPaths
from pathlib import Path
paths = RunPaths(Path(sys.argv[1]))
print(lifecycle.start(paths, read_config(paths.config), tied_to_caller=True)["keeper_pid"], flush=True)
time.sleep(300)
"""


def test_a_sigkilled_cli_takes_its_cluster_with_it(tmp_path, make_config):
    from pipelines.config import save_config

    paths = RunPaths(tmp_path / "run")
    save_config(_emulated(make_config), paths.config)
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(paths.root)], stdout=subprocess.PIPE, text=True)
    keeper = int(owner.stdout.readline())
    assert _left_of(keeper)
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 30
    while (psutil.pid_exists(keeper) or _left_of(keeper)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not psutil.pid_exists(keeper) and _left_of(keeper) == []


@pytest.mark.slow
@pytest.mark.heavy  # 40 s in CI: the SIGKILLed CLI's cluster (above) and every platform's SIGTERM cases stay there
def test_sigterm_during_a_cluster_run_exits_143_and_leaves_nothing(tmp_path, imdb_dir, bert_tiny_dir):
    from tests import fault_injection

    env = {**os.environ, **fault_injection.env(1, PROJECT_ROOT)}
    argv = [sys.executable, "-m", "pipelines", "run", "--profile", "cluster", "--output", str(tmp_path / "runs"),
            "--run-id", "term", "--set", f"dataset_source={imdb_dir}", "--set", f"tokenizer_source={bert_tiny_dir}",
            "--set", f"model_source={bert_tiny_dir}", "--set", "train_samples=200", "--set", "test_samples=100",
            "--set", "max_seq_len=32", "--set", "epochs=2", "--set", "allow_small_data=true",
            "--set", 'backends=["ddp"]', "--set", "worker_counts=[2]", "--set", "repeats=1",
            "--set", "spark_master=local[2]"]
    cli = subprocess.Popen(argv, env=env, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    state_path = tmp_path / "runs" / "term" / "cluster" / "cluster.json"
    heartbeat = tmp_path / "runs" / "term" / "cells" / "ddp-1gbit-w2-r0" / "checkpoints"
    deadline = time.monotonic() + 600
    while not (heartbeat.exists() and any(heartbeat.iterdir())) and cli.poll() is None and time.monotonic() < deadline:
        time.sleep(1)
    assert cli.poll() is None, cli.stdout.read()[-3000:]
    keeper = json.loads(state_path.read_text())["keeper_pid"]
    ranks = [p for p in psutil.process_iter(["cmdline"])  # this run's ranks only (other runs may train too)
             if "pipelines.training.worker" in (cmd := " ".join(p.info["cmdline"] or [])) and str(tmp_path) in cmd]
    assert ranks, "the cell's ranks should be training (held after epoch 1)"
    cli.send_signal(signal.SIGTERM)
    out, _ = cli.communicate(timeout=120)
    assert cli.returncode == 143, out[-3000:]
    assert not psutil.pid_exists(keeper) and _left_of(keeper) == []
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks)
