"""Overhead of each backend against bare torchrun, on the same model, data size and steps.

    .venv/bin/python bench/backend_overhead.py                      # full: 4k reviews, 3 epochs
    .venv/bin/python bench/backend_overhead.py --train-samples 256 --test-samples 128 \\
        --epochs 2 --seq-len 64 --batch-size 16                     # a quick check

First a bare torchrun job (this file re-run as ``--bare-worker``: plain DDP, no project code,
BERT-tiny from its config, same steps/batch/sequence length), then every backend's real cell
(``pipelines.run.cells.run_cell``) on token shards of the real IMDB copy. Prints steady-state
training time (training epochs: data loading + forward/backward/step) and its ratio to bare
torchrun and to ddp, and start-up / total wall time separately (with start-up's ratio to ddp).
``--rounds`` (default 3) repeats every path, interleaved in a rotating order; medians are
reported with the per-round ratios. ``--fresh-processes`` runs every cell in a new Python
process (``run_cell`` in ``python -c``), so no path profits from imports or engine state of an
earlier cell; the command's wall time is reported as ``process s``. Ray against ddp only:

    .venv/bin/python bench/backend_overhead.py --backends ddp,ray --fresh-processes \
        --train-samples 256 --test-samples 128 --epochs 2 --seq-len 64 --batch-size 16

Platforms as teams deploy them (``--backends`` takes these path names as well as backend names):
``spark-local`` (TorchDistributor local mode: torchrun on the driver), ``spark-cluster`` (barrier
tasks on a standalone cluster this script starts from the pyspark distribution and stops at the
end, ranks reading the token files), ``spark-cluster-dataframe`` (the same cluster, training rows
fed through Spark), ``determined-local`` (the Trainer in-process), each against ``ddp``, and
``ddp`` against bare torchrun; every path's phase breakdown (median seconds per phase,
``pipelines.training.phases``) is printed under the ratios:

    .venv/bin/python bench/backend_overhead.py --fresh-processes \
        --backends ddp,spark-local,spark-cluster,spark-cluster-dataframe,determined-local

Targets at full size: ddp <= 1.03x bare; spark <= 1.10x and determined <= 1.05x of ddp. Writes
``<out>/overhead.json``. Needs ../shared/data (or SHARED_DATA) and 2+ free cores for world size 2.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipelines.runfolder.paths import PROJECT_ROOT

SHARED = Path(os.environ.get("SHARED_DATA", PROJECT_ROOT.parent / "shared" / "data"))


def bare_worker(args) -> None:
    """Minimal DDP loop under torchrun: only torch + transformers."""
    import torch
    import torch.distributed as dist
    from transformers import AutoConfig, AutoModelForSequenceClassification

    torch.set_num_threads(args.threads)
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(args.seed)
    model = AutoModelForSequenceClassification.from_config(
        AutoConfig.from_pretrained(args.model, num_labels=2))
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    steps = math.ceil(math.ceil(args.train_samples / world) / args.batch_size)
    gen = torch.Generator().manual_seed(args.seed + rank)
    ids = torch.randint(1000, 30000, (args.batch_size, args.seq_len), generator=gen)
    mask = torch.ones_like(ids)
    labels = torch.randint(0, 2, (args.batch_size,), generator=gen)
    train = 0.0
    for _ in range(args.epochs):
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = torch.nn.functional.cross_entropy(ddp(input_ids=ids, attention_mask=mask).logits, labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        train += time.perf_counter() - t0
    if rank == 0:
        Path(args.bare_out).write_text(json.dumps({"training_seconds": train}))
    if world > 1:
        dist.destroy_process_group()


def run_bare(args, out: Path, rnd: int = 0) -> dict:
    result = out / f"bare-r{rnd}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
           "--nproc-per-node", str(args.workers), "--monitor-interval", "0.1", __file__, "--bare-worker",
           "--bare-out", str(result), *(f"--{k.replace('_', '-')}={v}" for k, v in (
               ("train_samples", args.train_samples), ("epochs", args.epochs), ("seq_len", args.seq_len),
               ("batch_size", args.batch_size), ("threads", args.threads), ("seed", args.seed),
               ("model", args.model)))]
    t0 = time.time()
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    return {**json.loads(result.read_text()), "total_seconds": time.time() - t0}


FRESH_CELL = """import sys
from pathlib import Path
from pipelines.run.cells import run_cell
from pipelines.config import read_config
from pipelines.runfolder.paths import RunPaths
run_cell(read_config(Path(sys.argv[1])), RunPaths(Path(sys.argv[2])), sys.argv[3], int(sys.argv[4]),
         int(sys.argv[5]))
"""


# path name -> (backend, config overrides); "<cluster>" is replaced by the started cluster's URL
PLATFORM_PATHS = {
    "spark-local": ("spark", {}),
    "spark-cluster": ("spark", {"spark_master": "<cluster>"}),
    "spark-cluster-dataframe": ("spark_dataframe", {"spark_master": "<cluster>"}),
    "determined-local": ("determined", {"determined_master": None}),
}


def path_plan(name: str) -> tuple[str, dict]:
    """A path name -> (backend, overrides); a plain backend name runs with the bench's config."""
    return PLATFORM_PATHS.get(name, (name, {}))


def link_run(source, target) -> None:
    """A run folder of its own for one path (cells never collide), sharing the token shards."""
    target.root.mkdir(parents=True, exist_ok=True)
    for folder in (source.tokens, source.manifest.parent):  # token shards; the manifest's folder
        link = target.root / folder.relative_to(source.root)
        if not link.exists():
            link.symlink_to(folder.resolve())


def run_fresh(config_path: Path, paths, backend: str, workers: int, rnd: int):
    """One cell in a new Python process; -> (its result, the command's wall time less the time
    it waited for the host's timing lock)."""
    from pipelines.runfolder.results import CellResult

    t0 = time.time()
    subprocess.run([sys.executable, "-c", FRESH_CELL, str(config_path), str(paths.root), backend, str(workers),
                    str(rnd)], check=True)
    result = CellResult.read(paths.cell(backend, workers, rnd).result)
    return result, time.time() - t0 - result.timed_window.lock_wait_seconds


def make_shards(args, paths) -> None:
    import pandas as pd

    from pipelines.data.tokens import tokenize_frame
    from pipelines.runfolder.fileio import atomic_write_json

    atomic_write_json(paths.manifest, {"labels": [0, 1], "source": str(SHARED / "imdb"), "splits": {}})
    # the loop evaluates a validation split every epoch: a tenth as many reviews, other train rows
    n_validation = max(4, args.train_samples // 10)
    train = pd.read_parquet(SHARED / "imdb" / "train.parquet")
    frames = {}
    for split, source, n in (("train", train, args.train_samples),
                             ("test", pd.read_parquet(SHARED / "imdb" / "test.parquet"), args.test_samples)):
        frames[split] = pd.concat(g.sample(n // 2, random_state=args.seed) for _, g in source.groupby("label"))
    rest = train.drop(frames["train"].index)
    frames["validation"] = pd.concat(g.sample(n_validation // 2, random_state=args.seed)
                                     for _, g in rest.groupby("label"))
    for split, frame in frames.items():
        out = paths.token_split(split)
        out.mkdir(parents=True, exist_ok=True)
        tokenize_frame(frame.sample(frac=1.0, random_state=args.seed), args.model, args.seq_len) \
            .to_parquet(out / "part-00000.parquet")


def main() -> None:
    p = argparse.ArgumentParser(description="backend overhead vs bare torchrun")
    p.add_argument("--train-samples", type=int, default=4000)
    p.add_argument("--test-samples", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--backends", default="ddp,spark,determined,ray")
    p.add_argument("--fresh-processes", action="store_true",
                   help="run every cell in a new Python process (whole-process start-up included)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved repetitions (medians reported)")
    p.add_argument("--model", default=str(SHARED / "bert-tiny"))
    p.add_argument("--out", default=None, help="output folder (default: a temp folder)")
    p.add_argument("--bare-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--bare-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.bare_worker:
        return bare_worker(args)

    from pipelines import platforms
    from pipelines.runfolder.paths import RunPaths

    out = Path(args.out or tempfile.mkdtemp(prefix="overhead-"))
    paths = RunPaths(out / "run")
    make_shards(args, paths)
    names = ["bare", *args.backends.split(",")]
    plans = {name: path_plan(name) for name in names[1:]}
    for name, (backend, _) in plans.items():
        platforms.check_name(backend)  # an unknown path or backend fails here, before anything runs
    cluster_url = None
    if any(o.get("spark_master") == "<cluster>" for _, o in plans.values()):
        from pipelines.engines.spark import cluster as spark_cluster

        cluster_url = spark_cluster.start(paths, workers=args.workers)  # stopped in the finally below
    try:
        _bench(args, out, paths, names, plans, cluster_url)
    finally:
        if cluster_url:
            spark_cluster.stop(paths)


def _bench(args, out: Path, paths, names: list[str], plans: dict, cluster_url: str | None) -> None:
    from pipelines.run.cells import run_cell
    from pipelines.config import load_config, save_config
    from pipelines.runfolder.paths import RunPaths

    config = load_config("nightly", dict(
        model_source=args.model, tokenizer_source=args.model, output_root=str(out),
        max_seq_len=args.seq_len, epochs=args.epochs, batch_size=args.batch_size,
        threads_per_worker=args.threads, seed=args.seed, spark_master=f"local[{max(2, args.workers)}]",
        train_samples=args.train_samples, test_samples=args.test_samples))
    save_config(config, out / "config.json")
    path_configs, path_runs = {}, {}
    for name, (backend, overrides) in plans.items():
        overrides = {k: (cluster_url if v == "<cluster>" else v) for k, v in overrides.items()}
        path_configs[name] = config.model_copy(update=overrides)
        path_runs[name] = RunPaths(out / f"run-{name}")
        link_run(paths, path_runs[name])
        save_config(path_configs[name], out / f"config-{name}.json")
    # Rounds interleave the paths (rotating their order) so drift on a shared machine hits all
    # alike; ratios are of the medians over rounds, with the per-round spread shown.
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for rnd in range(args.rounds):
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:
            if name == "bare":
                runs[name].append(run_bare(args, out, rnd))
                continue
            backend = plans[name][0]
            if args.fresh_processes:
                r, process_seconds = run_fresh(out / f"config-{name}.json", path_runs[name], backend,
                                               args.workers, rnd)
            else:
                t0 = time.time()
                r = run_cell(path_configs[name], path_runs[name], backend, args.workers, rnd)
                process_seconds = time.time() - t0 - r.timed_window.lock_wait_seconds
            runs[name].append({"training_seconds": r.training_seconds, "startup_seconds": r.startup_seconds,
                               "evaluation_seconds": r.evaluation_seconds, "total_seconds": r.total_seconds,
                               "process_seconds": process_seconds, "platform_mode": r.platform_mode,
                               **{f"phase_{k}": v for k, v in r.phases.items()}})
    rows = {name: {key: statistics.median(run[key] for run in rs) for key in rs[0] if key != "platform_mode"}
            for name, rs in runs.items()}
    train = {name: [run["training_seconds"] for run in rs] for name, rs in runs.items()}
    bare, ddp = rows["bare"]["training_seconds"], rows.get("ddp", {}).get("training_seconds")
    ddp_startup = rows.get("ddp", {}).get("startup_seconds")
    print(f"\n{args.workers} worker(s), {args.train_samples} reviews x {args.epochs} epochs, "
          f"batch {args.batch_size}/worker, seq {args.seq_len}; median of {args.rounds} round(s)"
          f"{', every cell in a fresh process' if args.fresh_processes else ''}")
    print(f"{'path':<24}{'train s':>9}{'x bare':>8}{'x ddp':>7}{'x ddp per round':>22}"
          f"{'start-up s':>12}{'x ddp':>7}{'total s':>9}{'process s':>11}")
    nan = float("nan")
    for name, row in rows.items():
        row["x_bare"] = row["training_seconds"] / bare
        row["x_ddp"] = row["training_seconds"] / ddp if ddp else None
        row["x_ddp_per_round"] = [t / d for t, d in zip(train[name], train["ddp"])] if ddp else []
        row["startup_x_ddp"] = row["startup_seconds"] / ddp_startup if ddp_startup and "startup_seconds" in row \
            else None
        spread = " ".join(f"{x:.3f}" for x in row["x_ddp_per_round"])
        print(f"{name:<24}{row['training_seconds']:>9.2f}{row['x_bare']:>8.3f}"
              f"{row['x_ddp'] or nan:>7.3f}{spread:>22}"
              f"{row.get('startup_seconds', nan):>12.2f}{row['startup_x_ddp'] or nan:>7.3f}"
              f"{row['total_seconds']:>9.2f}{row.get('process_seconds', nan):>11.2f}")
    print_phases(rows, runs)
    (out / "overhead.json").write_text(json.dumps({"args": vars(args), "rows": rows, "runs": runs}, indent=2))
    print(f"written {out / 'overhead.json'}")


def print_phases(rows: dict, runs: dict) -> None:
    """Where each path's time goes: median seconds per phase (bare torchrun records none)."""
    from pipelines.training.phases import PHASES

    print(f"\nphases, median s (pipelines/training/phases.py){'':<4}" + "".join(f"{p:>14}" for p in PHASES)
          + f"{'mode':>16}")
    for name, row in rows.items():
        if not any(k.startswith("phase_") for k in row):
            continue
        mode = runs[name][0].get("platform_mode") or ""
        print(f"{name:<52}" + "".join(f"{row.get('phase_' + p, 0.0):>14.2f}" for p in PHASES) + f"{mode:>16}")


if __name__ == "__main__":
    main()
