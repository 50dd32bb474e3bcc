"""``cluster.trusted_network`` (``pipelines.run.preflight.trusted_network_problems``):
torch.distributed has no authentication, so a cell whose ranks meet over a real network (ssh
hosts; on this host a Spark cluster URL, a multi-node rendezvous, a Ray cluster or Determined master
elsewhere) is refused before anything starts unless the deployment states the network is
trusted; emulated hosts, one host and loopback addresses never leave this machine."""

from __future__ import annotations

import pytest

from pipelines.config import ConfigError
from pipelines.config.loading import site_defaults
from pipelines.run import preflight

SSH = {"cluster.kind": "ssh", "networks": ["ssh"], "cluster.ssh_hosts": ["root@node0", "root@node1"],
       "worker_counts": [2], "backends": ["ddp"]}


def _refusals(found: list[str]) -> list[str]:
    return [p for p in found if p.startswith("cluster.trusted_network is not set")]


def test_multi_node_ddp_over_ssh_hosts_is_refused_until_the_network_is_trusted(make_config):
    refused = _refusals(preflight.problems(make_config(**SSH)))
    assert len(refused) == 1, refused
    assert "cluster.kind=ssh runs ddp with ranks on root@node0, root@node1" in refused[0]
    assert "torch.distributed has no authentication" in refused[0]
    assert "cluster.trusted_network=true (BENCHMARK_TRUSTED_NETWORK=true)" in refused[0]
    with pytest.raises(ConfigError, match=r"cluster.trusted_network is not set"):
        preflight.check(make_config(**SSH), cells=[("ddp", "default", 2)])

    assert not _refusals(preflight.problems(make_config(**SSH, **{"cluster.trusted_network": True})))
    config = make_config(**SSH, **site_defaults({"BENCHMARK_TRUSTED_NETWORK": "true"}))  # a deployment's way
    assert config.cluster.trusted_network and not _refusals(preflight.problems(config))


@pytest.mark.parametrize(("overrides", "setting"), [
    ({"backends": ["spark"], "spark_master": "spark://spark-master:7077"},
     "spark with engines.spark.master=spark://spark-master:7077"),
    ({"backends": ["spark_dataframe"], "spark_master": "spark://10.0.0.5:7077"},
     "spark_dataframe with engines.spark.master=spark://10.0.0.5:7077"),
    ({"backends": ["ddp"], "ddp_nnodes": 2, "ddp_rdzv_endpoint": "node0:29400"},
     "ddp with engines.ddp.rdzv_endpoint=node0:29400"),
    ({"backends": ["ray"], "ray_address": "ray://head:10001"},
     "ray with engines.ray.address=ray://head:10001"),
    ({"backends": ["determined"], "determined_master": "https://det.example:8080"},
     "determined with engines.determined.master=https://det.example:8080"),
])
def test_on_this_host_a_setting_that_sends_the_ranks_elsewhere_is_refused(make_config, overrides, setting):
    refused = _refusals(preflight.trusted_network_problems(make_config(**overrides)))
    assert len(refused) == 1 and setting in refused[0], refused
    trusted = make_config(**overrides, **{"cluster.trusted_network": True})
    assert not preflight.trusted_network_problems(trusted)


@pytest.mark.parametrize("overrides", [
    {},  # one host: every backend of the smoke profile, loopback only
    {"backends": ["spark"], "spark_master": "spark://127.0.0.1:7077"},  # a cluster on this machine
    {"backends": ["spark"], "spark_master": "embedded"},
    {"backends": ["ddp"], "ddp_nnodes": 2, "ddp_rdzv_endpoint": "127.0.0.1:29400"},
    {"backends": ["ddp"], "ddp_rdzv_endpoint": "node0:29400"},  # one node: no one to meet
    {"backends": ["ray"], "ray_address": "localhost:6379"},
    {"backends": ["spark_per_job"], "spark_master": "embedded"},
    {"cluster.kind": "emulated", "networks": ["1gbit"], "backends": ["ddp", "spark"]},  # emulated hosts
])
def test_what_stays_on_this_machine_needs_no_trust(make_config, overrides):
    assert preflight.trusted_network_problems(make_config(**overrides)) == []
