"""Where each cell of a run listened, and what its launch cost: one row per cell of each run folder.

    python bench/cell_listeners.py [--medians] runs/<run> [runs/<other run> ...]

For every cell: its platform mode, launch and provision seconds (``phases``), and the TCP ports its
processes listened on (``resources.listening``) and those of the standing cluster it used
(``standing_listening``), each counted as beyond loopback, on a loopback address, or inside a
loopback-only network namespace (``pipelines.measure.listeners``; an address is classified again
here, so a run folder written before ``::ffff:127.0.0.1`` was read as loopback counts right).
``--medians``: then each cell's median launch per group of runs (a run named ``<group>-r<k>``).
bench/isolation_ab.sh runs the same cells at two commits and prints this for both.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from pipelines.measure.listeners import LOOPBACK_ONLY_NAMESPACE, is_loopback


def _address(raw: str) -> str:
    """An address as this version prints it (an older run wrote IPv4-mapped ones in full)."""
    host, _, port = raw.removesuffix(LOOPBACK_ONLY_NAMESPACE).rpartition(":")
    if host.startswith("0000:0000:0000:0000:0000:ffff:"):
        words = host.split(":")[-2:]
        host = "::ffff:" + ".".join(str(int(w[i:i + 2], 16)) for w in words for i in (0, 2))
    return f"{host}:{port}" + (LOOPBACK_ONLY_NAMESPACE if raw.endswith(LOOPBACK_ONLY_NAMESPACE) else "")


def counts(by_kind: dict[str, list[str]]) -> tuple[int, int, int]:
    """(beyond loopback, loopback address, in a loopback-only namespace) of every kind's ports."""
    found = [_address(a) for addresses in by_kind.values() for a in addresses]
    isolated = sum(a.endswith(LOOPBACK_ONLY_NAMESPACE) for a in found)
    loopback = sum(is_loopback(a) and not a.endswith(LOOPBACK_ONLY_NAMESPACE) for a in found)
    return len(found) - isolated - loopback, loopback, isolated


def rows(run: Path) -> list[dict]:
    out = []
    for result in sorted((run / "cells").glob("*/result.json")):
        r = json.loads(result.read_text())
        usage = r.get("resources") or {}
        cell, standing = counts(usage.get("listening") or {}), counts(usage.get("standing_listening") or {})
        out.append({"run": run.name, "cell": result.parent.name, "mode": r.get("platform_mode"),
                    "launch_s": r["phases"].get("launch"), "provision_s": r["phases"].get("provision", 0.0),
                    "total_s": r.get("total_seconds"), "cell_ports": cell, "standing_ports": standing,
                    "beyond": sorted({_address(a) for addresses in (usage.get("listening") or {}).values()
                                      for a in addresses if not is_loopback(_address(a))})})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--medians", action="store_true", help="each cell's median launch per group of runs")
    args = parser.parse_args()
    found = [row for run in args.runs if run.exists() for row in rows(run)]
    print("| run | cell | mode | launch s | provision s | total s | cell's ports: beyond loopback / loopback / "
          "loopback-only namespace | standing cluster's: same |")
    print("|---|---|---|---|---|---|---|---|")
    for row in found:
        c, s = row["cell_ports"], row["standing_ports"]
        print(f"| {row['run']} | {row['cell']} | {row['mode']} | {row['launch_s']:.1f} | {row['provision_s']:.1f} "
              f"| {row['total_s']:.1f} | {c[0]} / {c[1]} / {c[2]} | {s[0]} / {s[1]} / {s[2]} |")
    if args.medians:
        launches: dict[str, dict[str, list[float]]] = {}
        for row in found:
            launches.setdefault(row["cell"], {}).setdefault(row["run"].rsplit("-r", 1)[0], []).append(row["launch_s"])
        for cell, groups in sorted(launches.items()):
            print(f"{cell}: median launch " + ", ".join(f"{g} {statistics.median(v):.1f} s ({len(v)} run(s))"
                                                        for g, v in groups.items()))


if __name__ == "__main__":
    main()
