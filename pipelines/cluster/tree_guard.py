"""A launcher's guard: its whole process tree stops with it, for a launcher that does not pass a stop on.

    python -m pipelines.cluster.tree_guard --grace-s 35 -- <launcher's command>

Why: a driver killed outright (SIGKILL, the OOM killer) has its launcher signalled by the kernel
(``run_to_end``'s PR_SET_PDEATHSIG), and most launchers stop their ranks then (torchrun does). One that
dies of the SIGTERM without passing it on leaves its own launch processes and ranks training on, orphans
(a platform's package says when it uses the guard; tests/platforms/test_sigkill.py checks each).

The guard runs the command as its child and is what the kernel signals instead. On SIGTERM, SIGINT or
SIGHUP it signals every process of the tree at once (the launch process stops its ranks on SIGTERM) and
kills what is left after ``--grace-s``. It is a child subreaper (PR_SET_CHILD_SUBREAPER), so a process
whose parent died is still in its tree; and when the command exits by itself, whatever it left running
is stopped too. Exit status: the command's, or 128 + the signal's number when the guard was stopped.
"""

from __future__ import annotations

import argparse
import ctypes
import signal
import subprocess
import sys

import psutil

from pipelines.cluster.processes import stop_tree

PR_SET_CHILD_SUBREAPER = 36


def _tree() -> list[psutil.Process]:
    """The guard's live descendants (an exited orphan is a zombie of the guard's until reaped)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.cluster.tree_guard", description=__doc__.split("\n")[0])
    parser.add_argument("--grace-s", type=float, required=True, help="SIGTERM to SIGKILL of what is left")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the launcher's command")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command to guard: give it after --")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"tree_guard: PR_SET_CHILD_SUBREAPER failed (errno {ctypes.get_errno()}): an orphan of the "
              "launcher would escape the guard", file=sys.stderr, flush=True)

    stopped_by: list[int] = []

    def stop(signum, _frame) -> None:
        if stopped_by:
            return  # a second signal while stopping: the stop already under way goes on
        stopped_by.append(signum)
        stop_tree(_tree(), args.grace_s, tree=False)  # every process at once: the orphans' parents may be gone

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    with subprocess.Popen(cmd) as proc:
        code = proc.wait()
    left = _tree()
    if left and not stopped_by:
        print(f"tree_guard: {cmd[0]} exited ({code}) leaving {len(left)} process(es) running: stopping them",
              file=sys.stderr, flush=True)
        stop_tree(left, args.grace_s, tree=False)
    return 128 + stopped_by[0] if stopped_by else code


if __name__ == "__main__":
    sys.exit(main())
