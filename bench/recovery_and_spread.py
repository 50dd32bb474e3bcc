"""Fault tolerance and run-to-run spread, measured with real processes.

    .venv/bin/python bench/recovery_and_spread.py                    # nightly-sized cells
    .venv/bin/python bench/recovery_and_spread.py --train-samples 256 --test-samples 128 \\
        --epochs 2 --seq-len 64 --batch-size 16 --repeats 2          # a quick check

1. Recovery cost per backend: each backend's cell is started through the CLI
   (``python -m pipelines train``), its rank 0 holds after the epoch-1 checkpoint (the test-only
   fault injection hook), the whole process tree is SIGKILLed, and the same command runs again
   (what an Airflow retry does). Prints, from the cell's attempts: epoch reached, training lost,
   recovery time (failure -> training again) and the whole cell's time over both attempts.
2. Spread: ``--repeats`` repeats of one cell (repeat r = seed + r), median and 95 % bootstrap
   interval of total time and test accuracy.
Writes ``<out>/recovery_and_spread.json``. Needs ../shared/data (or SHARED_DATA).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipelines.runfolder.paths import PROJECT_ROOT

SHARED = Path(os.environ.get("SHARED_DATA", PROJECT_ROOT.parent / "shared" / "data"))


def make_run(args, root: Path):
    """A run folder with config + token shards of the real IMDB copy (train/validation/test)."""
    import pandas as pd

    from pipelines.config import load_config, save_config
    from pipelines.data.tokens import tokenize_frame
    from pipelines.runfolder.fileio import atomic_write_json
    from pipelines.runfolder.paths import RunPaths

    paths = RunPaths(root / "run")
    config = load_config("nightly", dict(
        dataset_source=str(SHARED / "imdb"), model_source=str(SHARED / "bert-tiny"),
        tokenizer_source=str(SHARED / "bert-tiny"), output_root=str(root), max_seq_len=args.seq_len,
        epochs=args.epochs, batch_size=args.batch_size, train_samples=args.train_samples,
        test_samples=args.test_samples, repeats=args.repeats, spark_master="local[2]"))
    save_config(config, paths.config)
    train = pd.read_parquet(SHARED / "imdb" / "train.parquet")
    test = pd.read_parquet(SHARED / "imdb" / "test.parquet")
    n_val = max(2, args.train_samples // 10)
    per = {"train": args.train_samples // 2, "validation": n_val // 2, "test": args.test_samples // 2}
    pool = pd.concat(g.sample(per["train"] + per["validation"], random_state=1) for _, g in train.groupby("label"))
    rank = pool.groupby("label").cumcount()
    frames = {"train": pool[rank < per["train"]], "validation": pool[rank >= per["train"]],
              "test": pd.concat(g.sample(per["test"], random_state=1) for _, g in test.groupby("label"))}
    for split, frame in frames.items():
        out = paths.token_split(split)
        out.mkdir(parents=True, exist_ok=True)
        tokenize_frame(frame.sample(frac=1.0, random_state=1), str(SHARED / "bert-tiny"), args.seq_len) \
            .to_parquet(out / "part-00000.parquet")
    atomic_write_json(paths.manifest, {"labels": [0, 1], "splits": {}})
    return config, paths


def cli(paths, backend: str, workers: int, repeat: int, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines", "train", "--run-dir", str(paths.root), "--backend", backend,
         "--workers", str(workers), "--repeat", str(repeat)],
        env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def kill_after_epoch_1(paths, backend: str, workers: int) -> dict:
    from pipelines.measure.attempts import checkpoint_state
    from pipelines.runfolder.results import CellResult

    hook = {"PIPELINES_EPOCH_END_HOOK": "tests.fault_injection:hold", "FAULT_HOLD_AFTER_EPOCH": "1",
            "PYTHONPATH": str(PROJECT_ROOT)}
    cell = paths.cell(backend, workers, 90)
    proc = cli(paths, backend, workers, 90, hook)
    while checkpoint_state(cell)[0] < 1 and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(2)
    retry = cli(paths, backend, workers, 90, {})
    retry.wait()
    result = CellResult.read(cell.result)
    first, second = result.attempts[0], result.attempts[-1]
    return {"backend": backend, "workers": workers, "status": result.status,
            "attempts": len(result.attempts), "epoch_reached": first.epoch_reached,
            "lost_seconds": round(first.lost_seconds, 2), "recovery_seconds": round(second.recovery_seconds or 0, 2),
            "startup_seconds_retry": round(second.startup_seconds or 0, 2),
            "total_seconds": round(result.total_seconds, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train-samples", type=int, default=4000)
    p.add_argument("--test-samples", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--backends", default="ddp,spark,determined")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    from pipelines.evaluation import bootstrap_interval
    from pipelines.runfolder.results import CellResult

    out = Path(args.out or tempfile.mkdtemp(prefix="recovery-"))
    config, paths = make_run(args, out)
    recovery = [kill_after_epoch_1(paths, b, args.workers) for b in args.backends.split(",")]
    print("\nRecovery cost: one kill after epoch 1, retried by the same command "
          f"({args.train_samples} reviews x {args.epochs} epochs, seq {args.seq_len}, {args.workers} workers)")
    print(f"{'backend':<11}{'epoch kept':>11}{'lost s':>8}{'recovery s':>12}{'cell total s':>14}")
    for r in recovery:
        print(f"{r['backend']:<11}{r['epoch_reached']:>11}{r['lost_seconds']:>8.1f}{r['recovery_seconds']:>12.1f}"
              f"{r['total_seconds']:>14.1f}")

    totals, accuracies = [], []
    for repeat in range(args.repeats):
        cli(paths, "ddp", args.workers, repeat, {}).wait()
        result = CellResult.read(paths.cell("ddp", args.workers, repeat).result)
        totals.append(result.total_seconds)
        accuracies.append(result.test.accuracy)
    t_ci, a_ci = bootstrap_interval(totals), bootstrap_interval(accuracies)
    print(f"\nSpread over {args.repeats} repeats of ddp x{args.workers} (seed + r):")
    print(f"  total s: {[round(t, 1) for t in totals]} median {statistics.median(totals):.1f}, "
          f"95 % CI {t_ci.low:.1f}-{t_ci.high:.1f} (n={t_ci.n})")
    print(f"  test accuracy: {[round(a, 4) for a in accuracies]} median {statistics.median(accuracies):.4f}, "
          f"95 % CI {a_ci.low:.4f}-{a_ci.high:.4f}")
    (out / "recovery_and_spread.json").write_text(json.dumps(
        {"recovery": recovery, "totals": totals, "accuracies": accuracies}, indent=2))
    print(f"\nwritten: {out / 'recovery_and_spread.json'}")


if __name__ == "__main__":
    main()
