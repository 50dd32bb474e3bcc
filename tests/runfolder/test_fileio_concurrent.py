"""atomic_write removes only the temp files of writers that are gone: a concurrent writer's
in-flight temp file survives another write of the same path (real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from pipelines.runfolder.fileio import FOREIGN_STALE_S, atomic_write_text

# writes half a file into its temp, says so, then finishes when told (a line on stdin)
SLOW_WRITER = """
import sys
from pathlib import Path
from pipelines.runfolder.fileio import atomic_write

def write(fh):
    fh.write(b"from the slow writer")
    fh.flush()
    print("writing", flush=True)
    sys.stdin.readline()

atomic_write(Path(sys.argv[1]), write)
"""


def _slow_writer(target) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(target)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "writing\n"  # its temp file is in place, half written
    return proc


def _temps(target) -> list:
    return sorted(target.parent.glob(f".{target.name}.tmp-*"))


def test_a_concurrent_writers_temp_survives_another_write(tmp_path):
    target = tmp_path / "summary.json"
    writer = _slow_writer(target)
    try:
        (theirs,) = _temps(target)
        assert f"-{writer.pid}-" in theirs.name  # the temp names its writer
        atomic_write_text(target, "from this process")
        assert _temps(target) == [theirs] and target.read_text() == "from this process"
        writer.communicate("go\n", timeout=30)  # it finishes its own write as it would have
        assert writer.returncode == 0 and target.read_text() == "from the slow writer" and not _temps(target)
    finally:
        writer.kill()
        writer.wait(10)


def test_a_dead_writers_temp_is_removed_by_the_next_write(tmp_path):
    target = tmp_path / "summary.json"
    writer = _slow_writer(target)
    writer.send_signal(signal.SIGKILL)  # killed mid-write: its temp stays behind
    writer.wait(10)
    assert len(_temps(target)) == 1
    atomic_write_text(target, "{}")
    assert not _temps(target) and target.read_text() == "{}"


def test_a_temp_from_another_machine_is_left_until_a_day_old(tmp_path):
    target = tmp_path / "summary.json"
    # written on shared storage by a writer this host cannot look up (another boot or pid namespace)
    fresh = tmp_path / f".summary.json.tmp-otherboot.1-{os.getpid()}-1-abc"
    old = tmp_path / ".summary.json.tmp-otherboot.1-77-1-def"
    neighbour = tmp_path / ".summary.json.tmp-x.tmp-otherboot.1-77-1-ghi"  # file "summary.json.tmp-x"'s
    for temp in (fresh, old, neighbour):
        temp.write_text("partial")
    day_ago = time.time() - FOREIGN_STALE_S - 60
    os.utime(old, (day_ago, day_ago))
    atomic_write_text(target, "{}")
    assert _temps(target) == sorted([fresh, neighbour])
