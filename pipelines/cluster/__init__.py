"""Emulated multi-host clusters on one machine (network namespaces, shaped links, cgroups).

Why: benchmark cells otherwise run on one host over loopback, where the network is free; see
``pipelines.cluster.emulated`` for the design and the network policy it follows.
"""

from pipelines.cluster.emulated import EmulatedCluster, EmulatedHost, NetworkSpec, why_unavailable
from pipelines.cluster.leftovers import sweep
from pipelines.cluster.ssh import SSHHost, parse_host_entry, ssh_hosts
from pipelines.cluster.throughput import measure_throughput

__all__ = ["EmulatedCluster", "EmulatedHost", "NetworkSpec", "SSHHost", "measure_throughput", "parse_host_entry",
           "ssh_hosts", "sweep", "why_unavailable"]
