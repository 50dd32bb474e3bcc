"""Real machines reached over SSH, as launch hosts (the ``Host`` protocol of ``pipelines.platforms.contract``).

This is how ssh-based launchers (MPI's among them) start a multi-node job: the launching machine runs
one ``ssh`` per node, each starting that node's share of the job (here: its torchrun), in the
same working directory, with the environment passed on the command line. The run folder and the
project (the same venv path) must be on storage every machine sees at the same path, as for
every multi-node launch of this project::

    hosts = ssh_hosts(["node0", "root@node1:2222"], user="bench", identity_file="~/.ssh/bench")
    run_cell(config, paths, backend, 4, hosts=hosts)   # 2 ranks on each machine

``SSHHost.run(argv, env)`` starts ``ssh -T -o BatchMode=yes ... user@address '<remote command>'``
(OpenSSH client, no password prompt ever: key authentication only, host keys checked with
``StrictHostKeyChecking``, ``yes`` by default). The remote command is one shell-quoted string
(ssh hands it to the remote login shell): ``cd <cwd> && exec <python> -c <reaper> <grace>
<argv...>``. The environment never goes on a command line (any local user reads those with ``ps``
for the whole cell): the variables of ``env`` on an allow-list (``FORWARDED_PREFIXES``,
``FORWARDED_NAMES``), plus ``BENCHMARK_HOST=<name>`` so the ranks report where they ran
(``pipelines.training.distributed.placement``), go as one JSON line first on the session's stdin,
which the reaper reads byte by byte before it starts the program. The machine's network interface
(``ifname``, for gloo's and NCCL's sockets) is asked of the machine itself (``interface``): the one
that holds its address, else its default route's.

Why a remote reaper, not ``ssh -tt``: without a terminal, sshd does not signal the remote
command when the client goes away; it only closes the session's pipes. ``-tt`` would make sshd
SIGHUP the command's process group when the pty closes, but a pty merges stderr into stdout,
rewrites line endings, echoes input, and the SIGHUP reaches neither processes in other sessions
(torchrun starts every rank with ``start_new_session``) nor programs that ignore it. So the
remote command runs under a small stdlib-only Python reaper (``REAPER``): it starts the program
in its own process group, notices the session's end as a hang-up/error on its stdout/stderr
(sshd closed their other ends: the local ``ssh`` was terminated or killed, or the connection
died, found by the keep-alives) or a SIGTERM/SIGHUP/SIGINT of its own, and then SIGTERMs the
program's process group (torchrun takes its ranks down), waits ``kill_grace_s`` and SIGKILLs
what is left of the process tree it recorded (every descendant, whatever its session). The
remote program's stdin is the session's: a caller's ``stdin=PIPE`` still feeds it (the default
is ``/dev/null``, never this process's own stdin).

``link_bytes`` reads ``/sys/class/net/<ifname>/statistics/{tx,rx}_bytes`` over ssh.

``ssh_prefix`` runs the ssh client itself under a command prefix: in real deployments it is
empty; the emulated cluster's hosts (``pipelines.cluster.EmulatedCluster``) cannot be reached
from the root namespace, so its test starts the client inside a third emulated host
(``["ip", "netns", "exec", <netns>]``), the machine that plays the launcher.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

HOST_ENV = "BENCHMARK_HOST"  # = pipelines.training.host.HOST_ENV (cluster/ sits beside training/)
# what reaches the remote program's environment: the launch's own variables and what Python, torch,
# Hugging Face and the launchers read; anything else (a cloud key, a password) stays on this machine
FORWARDED_PREFIXES = ("BENCHMARK_", "OMP_", "MKL_", "TORCH", "PYTORCH_", "NCCL_", "GLOO_", "TP_", "CUDA_", "DS_",
                      "HF_", "TRANSFORMERS_", "TOKENIZERS_", "PYTHON", "DET_", "LC_", "XDG_")
FORWARDED_NAMES = frozenset({"PATH", "LANG", "HOME", "USER", "TZ", "TMPDIR", "VIRTUAL_ENV", "LD_LIBRARY_PATH",
                             "JAVA_HOME", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK",
                             "USE_TORCH_DISTRIBUTED", "SHARED_DATA"})
# this machine's own session: meaningless (or misleading) on the remote one
LOCAL_ONLY_ENV = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "HOSTNAME", "TERM", "DISPLAY", "XAUTHORITY",
                            "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK", "SSH_AGENT_PID"})
SOCKET_IFNAME_ENV = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")  # set per host here
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENTRY = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:@\s\[\]]+))(?::(?P<port>\d+))?$")

# Runs on the remote machine: python -c REAPER <grace_s> <argv...> (see the module docstring).
REAPER = r"""
import json, os, select, signal, subprocess, sys, threading, time
grace, argv = float(sys.argv[1]), sys.argv[2:]
line = b""
while not line.endswith(b"\n"):  # the environment, one JSON line; byte by byte: the rest is the program's
    byte = os.read(0, 1)
    if not byte:
        break
    line += byte
child = subprocess.Popen(argv, start_new_session=True, env={**os.environ, **json.loads(line or b"{}")})
lock = threading.Lock()

def stat(pid):  # (ppid, start in ticks after boot), or None when gone
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return int(f[1]), int(f[19])
    except (OSError, ValueError, IndexError):
        return None

def tree(root):  # [(pid, start)] of root and its descendants: a pid with its start names one process
    kids, starts = {}, {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        s = stat(d)
        if s is not None:
            kids.setdefault(s[0], []).append(int(d))
            starts[int(d)] = s[1]
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append((pid, starts.get(pid)))
        todo += kids.get(pid, [])
    return out

def reap(*_):
    if not lock.acquire(blocking=False):
        return
    pids = tree(child.pid)
    try:
        os.killpg(child.pid, signal.SIGTERM)
    except OSError:
        pass
    deadline = time.monotonic() + grace
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid, start in pids + tree(child.pid):
        now = stat(pid)
        if now is None or now[1] != start:  # gone, or its pid reused since the snapshot: not ours
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    os._exit(128 + signal.SIGTERM)

def watch():
    poll = select.poll()
    for fd in (1, 2):
        poll.register(fd, 0)  # hang-up and error are always reported
    poll.poll()
    reap()

for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(sig, lambda *_: threading.Thread(target=reap).start())
threading.Thread(target=watch, daemon=True).start()
rc = child.wait()
if lock.locked():
    time.sleep(grace + 5)
sys.exit(rc if rc >= 0 else 128 - rc)
"""


def parse_host_entry(entry: str, user: str | None = None, port: int = 22) -> tuple[str | None, str, int]:
    """``"user@host:port"`` (user and port optional, IPv6 in brackets) -> (user, host, port),
    the defaults where the entry leaves them out."""
    match = _ENTRY.match(entry.strip())
    if not match:
        raise ValueError(f"ssh host entry must be [user@]host[:port] (IPv6: [addr]); got {entry!r}")
    return (match.group("user") or user, match.group("v6") or match.group("host"),
            int(match.group("port") or port))


@dataclass
class SSHHost:
    """A machine reached with the OpenSSH client in batch mode (``Host`` protocol: name, address,
    ``run``, ``link_bytes``); see the module docstring."""

    name: str
    address: str
    user: str | None = None
    port: int = 22
    identity_file: str | None = None
    ifname: str = ""  # the network interface for the collectives' sockets; "": asked of the machine
    ssh_prefix: list[str] = field(default_factory=list)
    strict_host_key_checking: str = "yes"
    known_hosts_file: str | None = None
    ssh_options: list[str] = field(default_factory=list)  # more ``-o K=V``, e.g. ProxyJump
    python: str = sys.executable  # the remote reaper's interpreter (the same path as the workers')
    kill_grace_s: float = 15.0  # SIGTERM -> SIGKILL on the remote side
    connect_timeout_s: int = 15
    _interface: str | None = field(default=None, repr=False)

    @property
    def target(self) -> str:
        return f"{self.user}@{self.address}" if self.user else self.address

    def ssh_command(self, remote_command: str) -> list[str]:
        """The local argv: ``[*ssh_prefix, "ssh", <options>, target, remote_command]``."""
        opts = ["BatchMode=yes", f"StrictHostKeyChecking={self.strict_host_key_checking}",
                f"ConnectTimeout={self.connect_timeout_s}", "ServerAliveInterval=10", "ServerAliveCountMax=3",
                "LogLevel=ERROR"]
        if self.known_hosts_file:
            opts.append(f"UserKnownHostsFile={self.known_hosts_file}")
        if self.identity_file:
            opts.append("IdentitiesOnly=yes")  # this key, not whatever an agent offers first
        argv = [*self.ssh_prefix, "ssh", "-T", "-p", str(self.port)]
        if self.identity_file:
            argv += ["-i", os.path.expanduser(self.identity_file)]
        for opt in [*opts, *self.ssh_options]:
            argv += ["-o", opt]
        return [*argv, "--", self.target, remote_command]

    def remote_command(self, argv: Sequence[str], cwd: str) -> str:
        """The shell-quoted command line the remote login shell runs (cd, reaper, argv): no variable."""
        words = [self.python, "-c", REAPER, repr(float(self.kill_grace_s)), *map(str, argv)]
        return f"cd {shlex.quote(cwd)} && exec " + " ".join(shlex.quote(w) for w in words)

    def forwarded_env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        """What of ``env`` reaches the remote program (the allow-list), with this host's name and
        its own interface for the collectives' sockets."""
        out = {k: v for k, v in (env or {}).items() if _ENV_NAME.match(k) and k not in LOCAL_ONLY_ENV
               and (k in FORWARDED_NAMES or k.startswith(FORWARDED_PREFIXES))}
        for name in SOCKET_IFNAME_ENV:
            if name in out:
                out[name] = self.interface()
        return {**out, HOST_ENV: self.name}

    def run(self, argv: list[str], env: dict[str, str] | None = None, **popen_kwargs) -> subprocess.Popen:
        """Start argv on the machine (popen_kwargs' ``cwd`` there, else this process's working
        directory); terminating or killing the returned Popen (the local ssh) ends it there too.
        ``stdin``: DEVNULL (the default: never this process's own) or PIPE, after the environment."""
        cwd = str(popen_kwargs.pop("cwd", None) or os.getcwd())
        stdin = popen_kwargs.pop("stdin", subprocess.DEVNULL)
        if stdin not in (subprocess.DEVNULL, subprocess.PIPE, None):
            raise ValueError("SSHHost.run: stdin must be DEVNULL or PIPE (the environment goes first on it)")
        line = json.dumps(self.forwarded_env(env)) + "\n"
        proc = subprocess.Popen(self.ssh_command(self.remote_command(argv, cwd)), stdin=subprocess.PIPE,
                                **popen_kwargs)
        text = any(popen_kwargs.get(k) for k in ("text", "universal_newlines", "encoding", "errors"))
        proc.stdin.write(line if text else line.encode())
        proc.stdin.flush()
        if stdin != subprocess.PIPE:
            proc.stdin.close()
            proc.stdin = None  # as if started with DEVNULL (communicate() then writes nothing)
        return proc

    def interface(self) -> str:
        """The machine's network interface holding its address (else its default route's), asked of
        the machine once; ``ifname`` when set explicitly."""
        if self.ifname:
            return self.ifname
        if self._interface is None:
            address = socket.gethostbyname(self.address) if not self.address.replace(".", "").isdigit() \
                else self.address
            rows = self.check(["ip", "-o", "-4", "addr", "show"]).splitlines()
            found = [r.split()[1] for r in rows if f" {address}/" in r]
            if not found:
                found = self.check(["ip", "-o", "route", "show", "default"]).split("dev ")[1:2]
                found = [found[0].split()[0]] if found else []
            if not found:
                raise RuntimeError(f"{self.name}: no interface holds {address} and no default route: set ifname")
            self._interface = found[0]
        return self._interface

    def check(self, argv: Sequence[str], timeout_s: float = 30.0) -> str:
        """Run a short command there (no reaper, no environment) and return its stdout."""
        cmd = self.ssh_command(" ".join(shlex.quote(str(a)) for a in argv))
        done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=timeout_s, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"ssh {self.target} {' '.join(map(str, argv))} failed ({done.returncode}): "
                               f"{done.stderr.strip()}")
        return done.stdout

    def link_bytes(self) -> tuple[int, int]:
        """(tx_bytes, rx_bytes) of the machine's ``ifname``, from its kernel's counters."""
        stats = f"/sys/class/net/{self.interface()}/statistics"
        tx, rx = self.check(["cat", f"{stats}/tx_bytes", f"{stats}/rx_bytes"]).split()
        return int(tx), int(rx)

    def __repr__(self) -> str:
        return f"SSHHost({self.name}, {self.target}:{self.port})"


def ssh_hosts(addresses: Sequence[str], user: str | None = None, port: int = 22,
              identity_file: str | None = None, ifname: str = "", ssh_prefix: Sequence[str] | None = None,
              names: Sequence[str] | None = None, **options) -> list[SSHHost]:
    """One ``SSHHost`` per entry (``[user@]host[:port]``; ``user``/``port`` where an entry has
    none), named ``names[k]`` or its host part; ``options``: further ``SSHHost`` fields
    (``strict_host_key_checking``, ``known_hosts_file``, ``ssh_options``, ``kill_grace_s``...)."""
    if names is not None and len(names) != len(addresses):
        raise ValueError("ssh_hosts: one name per address")
    hosts = []
    for k, entry in enumerate(addresses):
        entry_user, address, entry_port = parse_host_entry(entry, user, port)
        hosts.append(SSHHost(name=names[k] if names else address, address=address, user=entry_user,
                             port=entry_port, identity_file=identity_file, ifname=ifname,
                             ssh_prefix=list(ssh_prefix or []), **options))
    if len({h.name for h in hosts}) != len(hosts):
        raise ValueError(f"ssh_hosts: host names must differ: {[h.name for h in hosts]}")
    return hosts


def hosts_from_config(config) -> list[SSHHost]:
    """``cluster.ssh_hosts`` (node 0 first) as hosts named h0, h1, ... with ``cluster.ssh_identity``;
    host keys must already be known (``StrictHostKeyChecking=yes``, as for any batch launch)."""
    entries = config.cluster.ssh_hosts
    return ssh_hosts(entries, identity_file=config.cluster.ssh_identity, names=[f"h{k}" for k in range(len(entries))])
