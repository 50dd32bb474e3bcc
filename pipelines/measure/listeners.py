"""Which TCP ports processes listen on, read from /proc (proc(5)): a process's sockets are the
``socket:[inode]`` links under ``/proc/<pid>/fd``; its network namespace's listening sockets
are the rows of ``/proc/<pid>/net/tcp`` and ``tcp6`` in state 0A (LISTEN). Reading through the
process's own ``/proc/<pid>/net`` sees its namespace, so a rank in a private namespace or on an
emulated host is read as well as one beside us. Unreadable processes (gone, another user's) are
left out: this is a measure, it never raises."""

from __future__ import annotations

import os
from collections.abc import Iterable

LISTEN = "0A"


def _address(hex_address: str) -> str:
    """``0100007F:1F90`` -> ``127.0.0.1:8080``; IPv6 ``::``-any as ``::``, loopback as ``::1``, an
    IPv4-mapped one as ``::ffff:a.b.c.d`` (a JVM's IPv4 bind, seen on its IPv6 socket)."""
    import ipaddress

    host, _, port = hex_address.partition(":")
    if len(host) == 8:
        ip = str(ipaddress.IPv4Address(bytes(reversed(bytes.fromhex(host)))))
    else:  # four 32-bit words, each in host (little-endian) order
        raw = b"".join(bytes.fromhex(host[i:i + 8])[::-1] for i in range(0, 32, 8))
        v6 = ipaddress.IPv6Address(raw)
        ip = f"::ffff:{v6.ipv4_mapped}" if v6.ipv4_mapped else str(v6)
    return f"{ip}:{int(port, 16)}"


def _listening_sockets(pid: int) -> dict[int, str]:
    """inode -> "address:port" of every listening TCP socket in ``pid``'s network namespace."""
    out = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = open(f"/proc/{pid}/net/{table}").read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == LISTEN:
                out[int(cols[9])] = _address(cols[1])
    return out


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        with os.scandir(f"/proc/{pid}/fd") as fds:
            for fd in fds:
                try:
                    link = os.readlink(fd.path)
                except OSError:
                    continue
                if link.startswith("socket:["):
                    inodes.add(int(link[8:-1]))
    except OSError:
        pass
    return inodes


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


# A listener in a network namespace whose only interface is loopback (a cell's private namespace,
# pipelines/platforms/torchrun.py) is reachable from that namespace alone, whatever address it bound.
LOOPBACK_ONLY_NAMESPACE = " (loopback-only namespace)"


def _only_loopback(pid: int) -> bool:
    """Is ``pid``'s network namespace one with no interface but ``lo``?"""
    try:
        rows = open(f"/proc/{pid}/net/dev").read().splitlines()[2:]
    except OSError:
        return False
    return bool(rows) and all(row.split(":")[0].strip() == "lo" for row in rows)


def listening(pids: Iterable[int]) -> dict[int, set[str]]:
    """pid -> the "address:port"s it listens on (TCP), for each of ``pids`` that listens on any;
    in a namespace with loopback only, each followed by LOOPBACK_ONLY_NAMESPACE."""
    tables: dict[str | None, dict[int, str]] = {}
    private: dict[str, bool] = {}
    out = {}
    for pid in pids:
        ns = _netns(pid)
        if ns is None:
            continue
        if ns not in tables:
            tables[ns], private[ns] = _listening_sockets(pid), _only_loopback(pid)
        if not tables[ns]:
            continue
        mark = LOOPBACK_ONLY_NAMESPACE if private[ns] else ""
        ports = {tables[ns][i] + mark for i in _socket_inodes(pid) if i in tables[ns]}
        if ports:
            out[pid] = ports
    return out


def is_loopback(address: str) -> bool:
    """Reachable from loopback only: bound to a loopback address, or in a loopback-only namespace."""
    if address.endswith(LOOPBACK_ONLY_NAMESPACE):
        return True
    host = address.rpartition(":")[0].removeprefix("::ffff:")
    return host.startswith("127.") or host == "::1"
