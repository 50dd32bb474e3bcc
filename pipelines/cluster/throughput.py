"""Measured TCP throughput between two hosts of an emulated cluster (bench/network_links.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from pipelines.cluster.emulated import EmulatedHost

_SERVER = """
import json, socket, sys, time
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2]))); srv.listen(1); print("ready", flush=True)
conn, _ = srv.accept(); n = 0
while chunk := conn.recv(1 << 20):
    n += len(chunk)
print(json.dumps({"bytes": n, "end": time.monotonic()}), flush=True)
"""
_CLIENT = """
import json, socket, sys, time
addr, port, nbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for _ in range(100):
    try:
        sock = socket.create_connection((addr, port), timeout=30); break
    except OSError:
        time.sleep(0.05)
start = time.monotonic(); block = b"x" * (1 << 20); left = nbytes
while left > 0:
    sock.sendall(block[:left]); left -= len(block)
sock.shutdown(socket.SHUT_WR); sock.recv(1); sock.close()
print(json.dumps({"start": start}), flush=True)
"""


def measure_throughput(src: EmulatedHost, dst: EmulatedHost, nbytes: int, port: int = 5201,
                       python: str | None = None, timeout_s: float = 120.0) -> dict:
    """TCP-push nbytes from src to dst; bits/s from the sender's first byte to the receiver's EOF.

    Both ends read CLOCK_MONOTONIC, which is system-wide, so the two processes' times compare.
    """
    python = python or sys.executable
    server = dst.run([python, "-c", _SERVER, dst.address, str(port)], stdout=subprocess.PIPE, text=True)
    client = None
    try:
        if server.stdout.readline().strip() != "ready":
            raise RuntimeError(f"throughput server in {dst.netns} did not start")
        client = src.run([python, "-c", _CLIENT, dst.address, str(port), str(nbytes)],
                         stdout=subprocess.PIPE, text=True)
        client_out, _ = client.communicate(timeout=timeout_s)
        server_out, _ = server.communicate(timeout=timeout_s)
    finally:
        for proc in (server, client):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    if client.returncode != 0 or server.returncode != 0:
        raise RuntimeError(f"throughput run failed: client rc {client.returncode}, "
                           f"server rc {server.returncode}")
    received = json.loads(server_out)["bytes"]
    seconds = json.loads(server_out)["end"] - json.loads(client_out)["start"]
    return {"bytes": received, "seconds": seconds, "bits_per_second": received * 8 / seconds}

