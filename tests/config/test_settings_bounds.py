"""No setting dropped or accepted in silence: every cluster and fault setting has a range, a bad
value is refused with the field and the range named before any host or engine starts, and an
explicit null override reaches the config."""

from __future__ import annotations

import pytest

from pipelines.config import SET_NULL, ConfigError, load_config, parse_set_options

EMULATED = {"cluster.kind": "emulated"}
# (overrides, what the message must name: the field, and the accepted range or values)
BAD = [
    ({"cluster.hosts": 0}, ["cluster.hosts", "greater than or equal to 1"]),
    ({"cluster.hosts": 17}, ["cluster.hosts", "less than or equal to 16"]),
    ({"cluster.cores_per_host": 2}, ["cluster.cores_per_host", "less than or equal to 1"]),
    ({"cluster.memory_mb_per_host": 100}, ["cluster.memory_mb_per_host", "greater than or equal to 256"]),
    ({"cluster.memory_mb_per_host": 10**9}, ["cluster.memory_mb_per_host", "less than or equal to 4194304"]),
    ({"cluster.kind": "cloud"}, ["cluster.kind", "'local', 'emulated' or 'ssh'"]),
    ({"networks": ["0.5mbit"]}, ["matrix.networks", "from 1mbit to 100gbit", "0.5 Mbit/s"]),
    ({"networks": ["200gbit"]}, ["matrix.networks", "from 1mbit to 100gbit"]),
    ({"networks": ["fast"]}, ["matrix.networks", "'unshaped', '10gbit'"]),
    ({"networks": ["local"]}, ["matrix.networks", "link rates"]),
    ({"training.threads_per_worker": 65}, ["training.threads_per_worker", "less than or equal to 64"]),
    ({"fault": "meteor"}, ["matrix.fault", "'none', 'host_loss', 'host_return', 'slow_host' or 'slow_link'"]),
    ({"fault": "slow_host", "slow_fraction": 1.5}, ["matrix.slow_fraction", "less than 1"]),
    ({"fault": "host_return", "fault_victim": "moon"}, ["matrix.fault_victim", "'worker' or 'coordinator'"]),
    ({"fault": "host_loss", "fault_epoch": 0}, ["matrix.fault_epoch", "greater than or equal to 1"]),
    ({"fault": "host_loss", "fault_epoch": 4, "epochs": 3}, ["matrix.fault_epoch", "from 1 to 3"]),
    ({"fault": "host_loss", "recovery_deadline_s": 0}, ["matrix.recovery_deadline_s", "greater than 0"]),
    ({"fault": "host_loss", "recovery_deadline_s": 4000}, ["matrix.recovery_deadline_s", "less than or equal to 3600"]),
    ({"platform_retries": 11}, ["matrix.platform_retries", "less than or equal to 10"]),
    ({"fault": "host_loss", "cluster.hosts": 1}, ["matrix.fault", "at least 2 hosts", "1 host(s)"]),
    ({"fault": "host_loss", "worker_counts": [1]}, ["matrix.fault", "at least 2 workers"]),
]


@pytest.mark.parametrize("overrides, named", BAD, ids=[",".join(o) for o, _ in BAD])
def test_a_bad_cluster_or_fault_setting_names_the_field_and_the_range(overrides, named):
    with pytest.raises(ConfigError) as err:
        load_config("smoke", {**EMULATED, **overrides})
    for text in named:
        assert text in str(err.value), str(err.value)


def test_host_loss_on_one_machine_is_refused():
    with pytest.raises(ConfigError, match=r"matrix.fault .*needs an emulated cluster of at least 2 hosts .*"
                                          r"cluster.kind=local"):
        load_config("smoke", {"fault": "host_loss"})
    with pytest.raises(ConfigError, match=r"matrix.fault .*cluster.kind=ssh"):
        load_config("smoke", {"fault": "host_loss", "cluster.kind": "ssh", "networks": ["ssh"],
                              "cluster.ssh_hosts": ["root@a", "root@b"]})


def test_the_bounds_hold_at_their_edges():
    config = load_config("smoke", {**EMULATED, "networks": ["1mbit", "100gbit"], "training.threads_per_worker": 64,
                                   "fault": "host_loss", "fault_epoch": 3, "epochs": 3, "cluster.hosts": 2})
    assert config.matrix.networks == ["1mbit", "100gbit"] and config.matrix.fault_epoch == 3


def test_an_explicit_null_override_reaches_the_config():
    """--set data.test_samples=null means all rows; a None from an empty form field keeps the default."""
    assert parse_set_options(["data.test_samples=null", "epochs=2"]) == {"data.test_samples": SET_NULL, "epochs": 2}
    assert load_config("smoke", parse_set_options(["data.test_samples=null"])).data.test_samples is None
    assert load_config("smoke", parse_set_options(["test_samples=null"])).data.test_samples is None  # flat name
    assert load_config("smoke", {"test_samples": None}).data.test_samples == 400  # not given: the profile's
    with pytest.raises(ConfigError, match="training.epochs"):
        load_config("smoke", parse_set_options(["epochs=null"]))  # a field that cannot be None says so


def test_the_cli_refuses_before_anything_starts_and_touches_no_other_run(tmp_path):
    """A bad fault setting through `python -m pipelines run`: exit code 2 with the field named, no run
    folder written, another run's folder as it was, and no engine or host started (no process left)."""
    import os
    import subprocess
    import sys

    from pipelines.runfolder.paths import PROJECT_ROOT

    out = tmp_path / "runs"
    other = out / "an-earlier-run"
    other.mkdir(parents=True)
    (other / "config.json").write_text("{}")
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    done = subprocess.run([sys.executable, "-m", "pipelines", "run", "--profile", "cluster", "--output", str(out),
                           "--run-id", "bad", "--set", "fault=host_loss", "--set", "fault_epoch=9"],
                          cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "matrix.fault_epoch" in done.stderr and "from 1 to 3" in done.stderr, done.stderr[-2000:]
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before  # nothing written, nothing touched
    assert "emulated cluster" not in done.stderr and "SparkSession" not in done.stderr


def test_a_cgroup_v2_only_machine_is_refused_in_preflight_with_the_reason(tmp_path, monkeypatch, make_config):
    """The emulated hosts need cgroup v1 cpuset, memory, cpuacct and cpu: on a unified-hierarchy machine
    preflight says so before any host is built (the keeper crashed on it before)."""
    from pipelines.cluster import emulated
    from pipelines.run import preflight

    root = tmp_path / "sys-fs-cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")  # what cgroup v2 mounts
    own = tmp_path / "proc-self-cgroup"
    own.write_text("0::/user.slice/session-1.scope\n")
    monkeypatch.setattr(emulated, "CGROUP_ROOT", root)
    monkeypatch.setattr(emulated, "PROC_CGROUP", own)
    monkeypatch.setattr(emulated.os, "geteuid", lambda: 0)  # checked after root (not root says that first)
    assert emulated.missing_cgroup_controllers() == ["cpuset", "memory", "cpuacct", "cpu"]
    problems = preflight.problems(make_config(**{"cluster.kind": "emulated", "networks": ["1gbit"]}))
    assert any("cgroup v1 controllers cpuset, memory, cpuacct, cpu" in p and "cgroup v2 only" in p for p in problems), problems
    # this machine (cgroup v1): nothing missing
    monkeypatch.undo()
    assert emulated.missing_cgroup_controllers() == []


def test_spark_and_ray_across_ssh_machines_are_refused_up_front_with_why(make_config):
    """Their daemons would stay on the machines without a secret (Spark) or without the token
    anywhere but here (Ray): refused before anything starts, each with its reason."""
    from pipelines.run import preflight

    ssh = {"cluster.kind": "ssh", "networks": ["ssh"], "cluster.ssh_hosts": ["root@a", "root@b"],
           "worker_counts": [2]}
    problems = preflight.problems(make_config(**ssh, backends=["ddp", "spark", "spark_dataframe", "ray"]))
    assert any(p.startswith("cluster.kind=ssh: spark is refused: ") and "authentication secret" in p for p in problems)
    assert any(p.startswith("cluster.kind=ssh: spark_dataframe is refused") for p in problems)
    assert any(p.startswith("cluster.kind=ssh: ray is refused: ") and "token" in p for p in problems)
    assert not any("ddp is refused" in p for p in problems)


def test_a_host_that_cannot_isolate_the_cells_refuses_them_unless_allowed(monkeypatch, make_config):
    """Without a loopback-only namespace a one-host cell's ports listen on every interface: refused
    in preflight with why and the setting that runs them all the same; the run's own namespace (for
    its standing clusters) is asked for only when the run keeps one on this host."""
    from pipelines.cluster import netns
    from pipelines.run import preflight

    assert not [p for p in preflight.problems(make_config()) if "network namespace" in p]  # this machine: fine
    monkeypatch.setattr(netns, "own_problem", lambda: "unshare --user --net (a user namespace: not root) was "
                                                      "refused: Operation not permitted")
    problems = [p for p in preflight.problems(make_config(backends=["ddp"])) if "network namespace" in p]
    assert len(problems) == 1 and "Operation not permitted" in problems[0]
    assert "cluster.allow_unisolated_cells=true" in problems[0] and "BENCHMARK_ALLOW_UNISOLATED_CELLS" in problems[0]
    allowed = make_config(backends=["ddp"], **{"cluster.allow_unisolated_cells": True})
    assert not [p for p in preflight.problems(allowed) if "network namespace" in p]

    monkeypatch.undo()  # cells may have their own; the run's cannot be entered (a seccomp profile refusing setns)
    monkeypatch.setattr(netns, "run_problem", lambda: "nsenter into a namespace of this user's was refused: "
                                                      "Operation not permitted")
    assert not [p for p in preflight.problems(make_config(backends=["ddp"])) if "network namespace" in p]
    standing = [p for p in preflight.problems(make_config(backends=["ddp", "ray"])) if "network namespace" in p]
    assert len(standing) == 1 and "nsenter" in standing[0]
    embedded = make_config(backends=["ddp"], spark_master="embedded")  # the data stage uses it: a standing cluster
    assert [p for p in preflight.problems(embedded) if "network namespace" in p]
