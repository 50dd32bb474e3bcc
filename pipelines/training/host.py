"""Where a rank runs, torch-free (every platform's ranks read it, those that import no torch too): the launch
host's name and cluster interface, the bytes its link sent, and the placement a result records."""

from __future__ import annotations

import os
import re
import socket

HOST_ENV = "BENCHMARK_HOST"  # set by a launch host (EmulatedHost.run, SSHHost.run): its name
HOST_IFNAME = "eth0"  # an emulated host's cluster interface


def host_ifname() -> str:
    """The launch host's cluster interface: the one its launcher set for gloo's sockets (an SSH
    machine's own, ``SSHHost.interface``), else an emulated host's ``eth0``."""
    return os.environ.get("GLOO_SOCKET_IFNAME") or HOST_IFNAME


def host_address(ifname: str | None = None) -> str | None:
    """This process's IPv4 address on the cluster interface (seen from inside its network
    namespace), or None on a plain host."""
    import psutil

    for addr in psutil.net_if_addrs().get(ifname or host_ifname(), []):
        if addr.family == socket.AF_INET:
            return addr.address
    return None


def link_tx_bytes(ifname: str | None = None) -> int | None:
    """Bytes this launch host's cluster interface has sent (its own network namespace's counters),
    or None off a launch host (a one-host cell: no link)."""
    if not os.environ.get(HOST_ENV):
        return None
    try:
        with open(f"/sys/class/net/{ifname or host_ifname()}/statistics/tx_bytes") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return None


def placement(cwd: str | None = None, host: str | None = None, workdir: tuple[str, str] = ()) -> str:
    """Where this rank ran, for the result: ``<host>``; on a launch host ``<host> <address>``
    (its name and its own interface address, measured here); then what the working directory says
    of where the platform's launcher put the rank (``workdir``: the platform's
    ``Platform.workdir_placement``, a regex whose groups fill a format), when it matches."""
    if host is None and os.environ.get(HOST_ENV):
        address = host_address()
        host = f"{os.environ[HOST_ENV]} {address}" if address else os.environ[HOST_ENV]
    host = host or socket.gethostname()
    if not workdir:
        return host
    pattern, where = workdir
    match = re.search(pattern, cwd if cwd is not None else os.getcwd())
    return f"{host} {where.format(*match.groups())}" if match else host
