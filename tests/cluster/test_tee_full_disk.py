"""A process whose log cannot be written (a full disk) fails with that reason within a bounded time:
the tee stops it and drains its pipe, so neither the process nor its runner hangs. On a real tmpfs
of 64 KiB (these tests run as root, as CI does; mount refused = a failure, not a skip)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from pipelines.cluster import processes

# prints without end: only the tee's stop ends it
FLOOD = "import sys\nwhile True: print('x' * 100, flush=False)"
# the same, deaf to SIGTERM: the tee's SIGKILL after the grace ends it, the pipe drained meanwhile
STUBBORN_FLOOD = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + FLOOD
BOUND_S = 30  # at most: the stop grace (1-2 s) + stop_tree's SIGKILL wait (5 s) + the drain (10 s)


@pytest.fixture
def full_disk(tmp_path):
    """A folder on a 64 KiB tmpfs, unmounted afterwards."""
    folder = tmp_path / "small"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_run_to_end_fails_naming_enospc_and_stops_the_launcher(full_disk):
    log_path = full_disk / "cell" / "train.log"
    launched = []
    start = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        processes.run_to_end([sys.executable, "-c", FLOOD], {}, log_path, what="the flood", grace_s=2.0,
                             started=launched.append)
    assert time.monotonic() - start < BOUND_S
    assert f"the flood was stopped: no space left on device writing {log_path}" in str(raised.value)
    assert launched[0].returncode is not None and not processes.running(launched[0].pid)


def test_a_background_tee_stops_its_process_instead_of_dying(full_disk, capsys):
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN_FLOOD], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    try:
        tee = processes.Tee(proc, full_disk / "node.log", prefix="h1", stop_grace_s=1.0).start()
        proc.wait(BOUND_S)  # before: the tee thread died, the pipe filled, the process blocked for good
        tee.join(BOUND_S)
        assert not tee.thread.is_alive()
        assert tee.error == f"no space left on device writing {full_disk / 'node.log'}"
        assert proc.returncode == -signal.SIGKILL  # deaf to SIGTERM: killed after the grace
        assert tee.text().endswith(f"[tee] {tee.error}\n")  # what a caller's error shows
        assert "[h1] xxxx" in capsys.readouterr().out  # what was written was echoed as before
    finally:
        processes.stop_tree([proc], 1.0)


BAD_BYTES = ("import sys, time\nsys.stdout.buffer.write(b'ok \\xff\\xfe\\n'); sys.stdout.flush()\n"
             "time.sleep(60)")


def test_output_that_is_not_utf8_stops_a_tee_with_the_reason_and_run_to_end_shows_it(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", BAD_BYTES], stdout=subprocess.PIPE, text=True)
    try:
        tee = processes.Tee(proc, tmp_path / "bad.log", stop_grace_s=1.0).start()
        tee.join(BOUND_S)
        assert tee.error and tee.error.startswith("UnicodeDecodeError reading the output logged to ")
        assert proc.wait(5) != 0  # stopped, not left blocked on a pipe nobody reads
    finally:
        processes.stop_tree([proc], 1.0)
    # a launcher's stray byte is no reason to fail its cell: shown replaced
    quick = BAD_BYTES.replace("time.sleep(60)", "pass")
    processes.run_to_end([sys.executable, "-c", quick], {}, tmp_path / "ok.log", what="odd bytes",
                         grace_s=1.0)
    assert (tmp_path / "ok.log").read_text() == "ok \ufffd\ufffd\n"
