"""Measured TCP throughput between two emulated hosts per link setting, side by side.

    .venv/bin/python bench/network_links.py --mib 20
    .venv/bin/python bench/network_links.py --mib 50 --rounds 3 \\
        --networks unshaped,10gbit,1gbit,250mbit,100mbit

Why: the emulated cluster (``pipelines.cluster``) shapes each host's link with ``tc tbf``; this
shows what a setting really delivers to a TCP stream (payload bits, so ~4-5 % below the nominal
rate, which counts Ethernet/IP/TCP headers too) and how settings compare. For every setting a
fresh 2-host cluster is built, ``--mib`` MiB are pushed from h0 to h1 ``--rounds`` times, and the
median is printed with its ratio to the nominal rate and to the unshaped link. Needs root.
"""

from __future__ import annotations

import argparse
import statistics
import time

from pipelines.cluster import EmulatedCluster, NetworkSpec, measure_throughput


def measure(index: int, network: str, nbytes: int, rounds: int) -> list[float]:
    """Bits/s of every round on a fresh 2-host cluster with this link setting."""
    with EmulatedCluster(f"netlinks{index}", hosts=2, network=network) as cluster:
        src, dst = cluster.hosts
        return [measure_throughput(src, dst, nbytes, port=5300 + r)["bits_per_second"] for r in range(rounds)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=20.0, help="MiB pushed per round (default 20)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds per setting; median shown")
    parser.add_argument("--networks", default="unshaped,1gbit,100mbit", help="comma-separated settings")
    args = parser.parse_args(argv)
    networks = [n.strip() for n in args.networks.split(",") if n.strip()]
    specs = [NetworkSpec.parse(n) for n in networks]  # fail on a bad setting before building anything
    nbytes = int(args.mib * (1 << 20))
    started = time.monotonic()
    medians = {}
    for index, spec in enumerate(specs):
        rates = measure(index, spec.text, nbytes, args.rounds)
        medians[spec.text] = (statistics.median(rates), rates)
    base = medians.get("unshaped", (None,))[0]
    print(f"{args.mib:g} MiB per round, {args.rounds} round(s), h0 -> h1 over the switch namespace")
    print(f"{'network':>10} {'nominal Mbit/s':>15} {'measured Mbit/s':>16} {'of nominal':>11} "
          f"{'unshaped / this':>16}  rounds (Mbit/s)")
    for spec in specs:
        median, rates = medians[spec.text]
        nominal = f"{spec.bits_per_second / 1e6:.0f}" if spec.bits_per_second else "-"
        share = f"{median / spec.bits_per_second:.1%}" if spec.bits_per_second else "-"
        ratio = f"{base / median:.1f}x" if base else "-"
        print(f"{spec.text:>10} {nominal:>15} {median / 1e6:>16.1f} {share:>11} {ratio:>16}  "
              + ", ".join(f"{r / 1e6:.1f}" for r in rates))
    print(f"total {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
