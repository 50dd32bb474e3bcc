"""What the run's cells ran on (the summary's ``Hardware``): device kinds, the CPU, the driver's
host and, across hosts, the machines the ranks ran on.

``hardware_class`` is what makes timings comparable (runs compare only within one: the regression
check's reference runs share it). Across hosts its host count is the cluster's machines (the
ranks' placements and the hosts whose links were counted), named with the cluster kind:
"2 host(s) (emulated)"; locally, the driver's host: "1 host(s)", as before clusters existed.
"""

from __future__ import annotations

import os

from pipelines.runfolder.results import CellResult
from pipelines.runfolder.summary import Hardware

LOCAL = "local"


def cell_hosts(result: CellResult) -> list[str]:
    """The machines a cell's ranks ran on across hosts: each placement's host ("h0 10.213.0.1",
    "h1 executor app/1" -> h0, h1) and every host whose link was counted; [] for a local cell."""
    if result.cluster == LOCAL:
        return []
    hosts = [p.split(" ", 1)[0] for p in result.placements if p.strip()]
    return sorted({*hosts, *(result.link_bytes or {})})


def cluster_hosts(results: list[CellResult]) -> list[str]:
    """The cluster's machines over every cell that ran across hosts."""
    return sorted({h for r in results for h in cell_hosts(r)})


def hardware_class(results: list[CellResult]) -> str:
    """What makes timings comparable: device kind and count, CPU model and count, hosts (the
    cluster's machines and kind across hosts; else the driver's hosts)."""
    kinds = sorted({r.device for r in results}) or ["unknown"]
    gpus = len({d for r in results for d in r.devices if d.startswith("cuda")})
    machines = cluster_hosts(results)
    clusters = sorted({r.cluster for r in results if r.cluster != LOCAL})
    hosts = (f"{len(machines)} host(s) ({'/'.join(clusters)})" if machines
             else f"{len({r.host for r in results if r.host}) or 1} host(s)")
    return f"{'+'.join(kinds)}; {gpus} gpu(s); cpu {_cpu_model()} x{os.cpu_count()}; {hosts}"


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def hardware(results: list[CellResult]) -> Hardware:
    """The summary's Hardware of the finished cells."""
    return Hardware(
        hardware_class=hardware_class(results),
        devices=sorted({r.device for r in results}),
        hosts=sorted({r.host for r in results if r.host}),
        cluster_hosts=cluster_hosts(results),
        cpu_count=os.cpu_count(),
        # library versions over all cells (each backend adds its own library)
        versions={k: ", ".join(sorted({r.versions[k] for r in results if k in r.versions}))
                  for k in sorted({k for r in results for k in r.versions})},
    )
