"""Emulated multi-host clusters on one machine (network namespaces, shaped links, cgroups).

Why: benchmark cells otherwise run on one host over loopback, where the network is free; see
``pipelines.cluster.emulated`` for the design and the network policy it follows.
"""

from pipelines.cluster.emulated import (
    EmulatedCluster,
    EmulatedHost,
    NetworkSpec,
    measure_throughput,
    sweep,
    why_unavailable,
)

__all__ = ["EmulatedCluster", "EmulatedHost", "NetworkSpec", "measure_throughput", "sweep", "why_unavailable"]
