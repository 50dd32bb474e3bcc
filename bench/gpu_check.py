"""GPU check: the study's setting through the project's own training loop, on one device.

The study (README): BERT-tiny on IMDB, 25k/25k reviews, 20 epochs, seq 128, batch 32 per worker;
DDP on 2 GPUs took 499 s. Here the same workload runs on one device through
``pipelines.training.loop.run_training`` (nothing re-implemented) with a ``TorchDistributed``
subclass (the loop's seam) switching the speed options:

    bf16         bf16 autocast around the model (off: fp32, also on GPU; on CPU: CPU bf16)
    fused        fused AdamW (the loop's default; without it: torch's default, foreach on CUDA);
                 gpu-data: the train split on the device (same rows, same order)
    compile      ``torch.compile(model, dynamic=False)``;  dynamic: ``dynamic=True``
    cuda-graphs  ``torch.compile(mode="reduce-overhead")``: CUDA graphs (implies compile)
    whole-graph  ``pipelines.training.graph_step``: the whole step (rows, forward, loss, backward,
                 in-step lr schedule, fused capturable AdamW) in one CUDA graph per batch size,
                 eval graphed too; the loop's pieces, record, checkpoints and final test; checked
                 first against the loop's step (losses). Implies fused + gpu-data; with compile:
                 the compiled model inside the graph. On CPU the same step runs eagerly.

    python bench/gpu_check.py prepare --out runs/gpu_check/data            # CPU machine: tokenize
    python bench/gpu_check.py run --data runs/gpu_check/data --out runs/gpu_check/results \\
        --device cuda --matrix base,bf16+fused+gpu-data+cuda-graphs,bf16+whole-graph

``prepare``: token shards of the first N reviews of each seeded-shuffled IMDB split (held-out eval:
the first 2,500 test rows), tokenizer/config, ``gpu_check_data.json``. ``run``: a process per option
set; prints samples/s, s/epoch, the 20-epoch total (train + eval + checkpoint; ~: first + 19 x later
epochs), its ratio to 499 s, test accuracy, the step check; writes ``<out>/gpu_check.json`` after
each. Needs torch, transformers, pandas, pyarrow, pydantic (no pyspark, airflow, GX, mlflow, sklearn).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

STUDY_SECONDS = 499.0  # DDP, 2 GPUs, 20 epochs (the published study; README)
STUDY_EPOCHS = 20
OPTIONS = ("bf16", "fused", "gpu-data", "compile", "cuda-graphs", "dynamic", "whole-graph")
# `run` on a GPU without --matrix or flags: the way from the loop's plain steps to all options
DEFAULT_GPU_MATRIX = ("base,bf16,bf16+fused+gpu-data,bf16+fused+gpu-data+compile,"
                      "bf16+fused+gpu-data+cuda-graphs,bf16+fused+gpu-data+cuda-graphs+dynamic,"
                      "bf16+whole-graph,bf16+compile+whole-graph")
HEAVY_MODULES = ("pyspark", "airflow", "great_expectations", "mlflow", "sklearn")
RESULT_FILE = "gpu_check.json"
DATA_INFO = "gpu_check_data.json"
MODEL_FILES = ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
DEFAULT_SHARED = Path(os.environ.get("SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))


# --- option sets ----------------------------------------------------------------------------
def parse_option_set(text: str) -> tuple[str, ...]:
    """``"bf16+fused"`` -> ``("bf16", "fused")`` in canonical order; ``base`` = none."""
    names = {n.strip() for n in text.split("+") if n.strip()} - {"base"}
    unknown = names - set(OPTIONS)
    if unknown:
        raise SystemExit(f"unknown option(s) {sorted(unknown)} in {text!r} (options: base, {', '.join(OPTIONS)})")
    if names & {"cuda-graphs", "dynamic"}:
        if "whole-graph" in names:
            raise SystemExit(f"{text!r}: whole-graph captures its own graphs (no cuda-graphs / dynamic)")
        names.add("compile")
    if "whole-graph" in names:  # its step is fused AdamW over device-resident data
        names |= {"fused", "gpu-data"}
    return tuple(o for o in OPTIONS if o in names)


def option_label(options: tuple[str, ...]) -> str:
    return "+".join(options) or "base"


# --- prepare (CPU machine) -----------------------------------------------------------------------
def prepare(args) -> dict:
    import pandas as pd

    from pipelines.data.tokens import tokenize_frame
    from pipelines.runfolder.paths import RunPaths

    shared, out = Path(args.shared), Path(args.out)
    model_dir = out / "model"
    if out.exists():
        shutil.rmtree(out)
    model_dir.mkdir(parents=True)
    for name in MODEL_FILES:  # the run step builds the model (random init) from this config
        if (shared / "bert-tiny" / name).exists():
            shutil.copy2(shared / "bert-tiny" / name, model_dir / name)

    def take(split: str, n: int | None) -> pd.DataFrame:
        frame = pd.read_parquet(shared / "imdb" / f"{split}.parquet", columns=["text", "label"])
        frame = frame.sample(frac=1.0, random_state=args.seed).reset_index(drop=True)  # sorted by label
        return frame if n is None else frame.head(n).reset_index(drop=True)

    train, test = take("train", args.train_samples), take("test", args.test_samples)
    splits = {"train": train, "validation": test.head(args.validation_samples), "test": test}
    paths, info = RunPaths(out), {"splits": {}}
    for split, frame in splits.items():
        folder = paths.token_split(split)
        folder.mkdir(parents=True)
        start = time.perf_counter()
        for shard, lo in enumerate(range(0, len(frame), args.shard_rows)):
            part = frame.iloc[lo:lo + args.shard_rows]
            tokenize_frame(part, str(model_dir), args.seq_len).to_parquet(
                folder / f"part-{shard:05d}.parquet", index=False)
        counts = frame["label"].value_counts().sort_index()
        info["splits"][split] = {"rows": len(frame), "rows_per_label": {str(k): int(v) for k, v in counts.items()},
                                 "tokenize_seconds": round(time.perf_counter() - start, 2)}
        print(f"prepare: {split}: {len(frame)} reviews -> {folder}", flush=True)
    info.update(seq_len=args.seq_len, seed=args.seed, source=str(shared / "imdb"),
                labels=sorted(int(v) for v in train["label"].unique()),
                validation="the first rows of the test split (per-epoch held-out eval)")
    (out / DATA_INFO).write_text(json.dumps(info, indent=2))
    return info


# --- run-one: one option set, this process -------------------------------------------------------
def heavy_modules_loaded() -> list[str]:
    """The heavy stacks this process imported (a ``None`` in sys.modules: blocked, not imported)."""
    return sorted({name.split(".")[0] for name, module in sys.modules.items() if module is not None}
                  & set(HEAVY_MODULES))


def make_distributed(options: tuple[str, ...], device_name: str, compile_backend: str = "inductor"):
    """The loop's seam with the speed options: device, autocast, compile, loader, optimizer."""
    import torch
    from torch.utils.data import TensorDataset

    from pipelines.training.distributed import DistEnv, TorchDistributed

    class Autocast(torch.nn.Module):
        """Runs the model under bf16 autocast (on) or none (off), whatever the loop sets outside."""

        def __init__(self, model, device_type: str, enabled: bool):
            super().__init__()
            self.model, self.device_type, self.enabled = model, device_type, enabled

        def forward(self, **inputs):
            with torch.autocast(self.device_type, dtype=torch.bfloat16, enabled=self.enabled):
                return self.model(**inputs)

    class DeviceLoader:
        """The loader's batches from device tensors: its sampler and batch size (same rows, order)."""

        def __init__(self, loader, device):
            if not isinstance(loader.dataset, TensorDataset) or loader.drop_last:
                raise TypeError("gpu-data needs the loop's TensorDataset loader (drop_last=False)")
            self.sampler, self.batch_size, self.device = loader.sampler, loader.batch_size, device
            self.tensors = tuple(t.to(device) for t in loader.dataset.tensors)

        def __len__(self):
            return math.ceil(len(self.sampler) / self.batch_size)

        def __iter__(self):
            order = torch.tensor(list(self.sampler), dtype=torch.long).to(self.device, non_blocking=True)
            for lo in range(0, len(order), self.batch_size):
                rows = order[lo:lo + self.batch_size]
                yield tuple(t.index_select(0, rows) for t in self.tensors)

    class GpuCheckDistributed(TorchDistributed):
        def setup(self) -> DistEnv:  # one process, the device asked for (no process group)
            device = torch.device(device_name)
            if device.type == "cuda":
                device = torch.device("cuda", device.index or 0)
                torch.cuda.set_device(device)
                torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls on tensor cores
                torch.backends.cudnn.allow_tf32 = True
            return DistEnv(0, 1, 0, device)

        def wrap_model(self, model, env):
            wrapped = Autocast(model, env.device.type, enabled="bf16" in options)
            if "compile" in options:
                mode = {"mode": "reduce-overhead"} if "cuda-graphs" in options else {}
                wrapped = torch.compile(wrapped, backend=compile_backend, dynamic="dynamic" in options, **mode)
            return wrapped

        def prepare_loader(self, loader, env):
            return DeviceLoader(loader, env.device) if "gpu-data" in options else loader

        def optimizer_options(self, env) -> dict:
            # without "fused": torch's own default AdamW (foreach on CUDA, a loop on CPU), not the
            # loop's fused default, so the matrix still shows what the fused kernel changes
            return {"fused": True} if "fused" in options else {"fused": None}

    return GpuCheckDistributed()


def run_one(args) -> dict:
    """Train one option set with ``run_training`` in this process; writes and returns its summary."""
    import torch

    from pipelines.training.cell import CellSpec
    from pipelines.config import load_config
    from pipelines.runfolder.results import CellResult
    from pipelines.training.graph_step import run_whole_step
    from pipelines.training.loop import run_training

    options = parse_option_set(args.options)
    data, cell_dir = Path(args.data), Path(args.cell)
    info = json.loads((data / DATA_INFO).read_text())
    shutil.rmtree(cell_dir, ignore_errors=True)  # never resume from an earlier check's checkpoints
    cell_dir.mkdir(parents=True)
    config = load_config("paper", {
        "epochs": args.epochs, "batch_size": args.batch_size, "max_seq_len": info["seq_len"],
        "learning_rate": args.lr, "seed": info["seed"], "model_source": str(data / "model"),
        "tokenizer_source": str(data / "model"), "dataset_source": info["source"],
        "train_samples": info["splits"]["train"]["rows"], "test_samples": info["splits"]["test"]["rows"],
        "threads_per_worker": args.threads or max(1, len(os.sched_getaffinity(0))),
        "output_root": str(cell_dir.parent), "worker_counts": [1], "backends": ["ddp"],
    })
    spec = CellSpec(config=config, run_root=data, cell_dir=cell_dir, backend="ddp", world_size=1,
                    repeat=0, labels=info["labels"])
    spec.write()
    launch = time.time()
    distributed = make_distributed(options, args.device, args.compile_backend)
    if "whole-graph" in options:  # the whole step in one graph: pipelines.training.graph_step
        whole_step = run_whole_step(spec, launch, distributed, verify_steps=args.verify_steps)
    else:
        whole_step = run_training(spec, launch, distributed=distributed)  # None
    result = CellResult.model_validate_json(spec.cell.worker_result.read_text())
    summary = summarize(result, options, target_epochs=args.target_epochs, study_seconds=args.study_seconds)
    summary.update(whole_step=whole_step, wall_seconds=time.time() - launch,
                   heavy_modules_loaded=heavy_modules_loaded(),
                   gpu=torch.cuda.get_device_name() if result.device.startswith("cuda") else None)
    (cell_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def summarize(result, options: tuple[str, ...], *, target_epochs: int = STUDY_EPOCHS,
              study_seconds: float = STUDY_SECONDS) -> dict:
    """The check's numbers from one CellResult (its TrainingRecord epochs)."""
    epochs = result.epochs
    n = len(epochs)
    train = [e.train_seconds for e in epochs]
    epoch = [e.epoch_seconds for e in epochs]  # train + held-out eval + checkpoint
    steady = slice(1, None) if n > 1 else slice(0, None)  # epoch 1 carries warm-up / compile
    steady_epoch = sum(epoch[steady]) / len(epoch[steady])
    steady_train = sum(train[steady]) / len(train[steady])
    if n == target_epochs:
        total, train_total, projected = sum(epoch), sum(train), False
    else:
        total = epoch[0] + (target_epochs - 1) * steady_epoch
        train_total, projected = train[0] + (target_epochs - 1) * steady_train, True
    return {
        "options": option_label(options), "option_list": list(options), "device": result.device,
        "epochs": n, "batch_size": result.batch_size_per_worker, "max_seq_len": result.max_seq_len,
        "train_samples": result.train_samples, "test_samples": result.test_samples,
        "samples_per_second": result.samples_per_second,
        "steady_samples_per_second": result.train_samples / steady_train if steady_train > 0 else 0.0,
        "train_seconds_per_epoch": train, "epoch_seconds": epoch,
        "eval_seconds_per_epoch": [e.eval_seconds for e in epochs],
        "checkpoint_seconds_per_epoch": [e.checkpoint_seconds for e in epochs],
        "first_epoch_seconds": epoch[0], "steady_epoch_seconds": steady_epoch,
        "steady_train_seconds": steady_train,
        "target_epochs": target_epochs, "projected": projected,
        "total_seconds": total, "train_total_seconds": train_total,
        "study_seconds": study_seconds, "ratio_to_study": total / study_seconds,
        "train_ratio_to_study": train_total / study_seconds,
        "startup_seconds": result.startup_seconds, "final_test_accuracy": result.test.accuracy,
        "final_eval_accuracy": epochs[-1].eval_accuracy, "peak_memory_mb": result.peak_memory_mb,
        "model_source": result.model_source, "versions": result.versions,
    }


# --- run: the matrix, one process per option set ------------------------------------------------
TABLE_COLUMNS = ("options", "samples/s", "steady samples/s", "train s/epoch", "epoch s",
                 "20-ep total s", "ratio to 499 s", "train-only 20-ep s", "test acc", "step check")


def step_check(r: dict) -> str:
    """The whole step's check against the loop's step: ok / MISMATCH and the largest loss gap."""
    check = (r.get("whole_step") or {}).get("verify")
    if not check:
        return "-"
    return f"{'ok' if check['match'] else 'MISMATCH'} {check['max_loss_diff']:.1e}"


def table(rows: list[dict]) -> str:
    def cells(r):
        mark = "~" if r["projected"] else ""
        return (r["options"], f"{r['samples_per_second']:.1f}", f"{r['steady_samples_per_second']:.1f}",
                f"{r['steady_train_seconds']:.3f}", f"{r['steady_epoch_seconds']:.3f}",
                f"{mark}{r['total_seconds']:.2f}", f"{r['ratio_to_study']:.4f}",
                f"{mark}{r['train_total_seconds']:.2f}", f"{r['final_test_accuracy']:.4f}", step_check(r))

    body = [TABLE_COLUMNS] + [cells(r) for r in rows]
    widths = [max(len(row[i]) for row in body) for i in range(len(TABLE_COLUMNS))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in body]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def run_cell(args, data: Path, out: Path, label: str, seconds_left: float | None = None) -> dict:
    """One option set in its own process (``run-one``) in the time left -> its summary or failure."""
    cell = out / "cells" / label
    limit = min((t for t in (args.cell_timeout, seconds_left) if t is not None and t > 0), default=None)
    if seconds_left is not None and seconds_left < 30:
        print(f"run: {label} skipped: the time budget is spent", flush=True)
        return {"failure": {"options": label, "returncode": "no time left"}}
    print(f"run: {label} on {args.device} ...", flush=True)
    cmd = [sys.executable, os.path.abspath(__file__), "run-one", "--data", str(data), "--cell", str(cell),
           "--options", label]
    for name in ("device", "epochs", "batch_size", "lr", "target_epochs", "study_seconds", "compile_backend",
                 "threads", "verify_steps"):
        cmd += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    try:
        returncode = subprocess.run(cmd, check=False, timeout=limit).returncode
    except subprocess.TimeoutExpired:
        returncode = "timeout"
    if returncode != 0 or not (cell / "summary.json").is_file():
        print(f"run: {label} FAILED (exit {returncode})", flush=True)
        return {"failure": {"options": label, "returncode": returncode}}
    return json.loads((cell / "summary.json").read_text())


def run(args) -> dict:
    data, out = Path(args.data), Path(args.out)
    if not (data / DATA_INFO).is_file():
        raise SystemExit(f"{data / DATA_INFO} missing: run `gpu_check.sh prepare` first (on any CPU machine)")
    flags = "+".join(o for o in OPTIONS if getattr(args, o.replace("-", "_")))
    matrix = args.matrix or (flags or (DEFAULT_GPU_MATRIX if args.device.startswith("cuda") else "base"))
    labels = [option_label(parse_option_set(s)) for s in matrix.split(",")]
    out.mkdir(parents=True, exist_ok=True)
    report = {"study": {"seconds": args.study_seconds, "epochs": STUDY_EPOCHS, "gpus": 2, "backend": "ddp"},
              "device": args.device, "data": json.loads((data / DATA_INFO).read_text()),
              "results": [], "failures": []}
    rows, failures = report["results"], report["failures"]
    deadline = time.time() + args.time_budget if args.time_budget else None
    for label in labels:
        row = run_cell(args, data, out, label, deadline and deadline - time.time())
        failures.append(row["failure"]) if "failure" in row else rows.append(row)
        (out / RESULT_FILE).write_text(json.dumps(report, indent=2))  # what ran so far, if cut short
    if rows:
        print(f"\nGPU check: {rows[0]['train_samples']} train reviews, seq {rows[0]['max_seq_len']}, "
              f"batch {rows[0]['batch_size']}, {rows[0]['epochs']} epoch(s) measured on "
              f"{rows[0]['gpu'] or rows[0]['device']}; study: {args.study_seconds:g} s for {STUDY_EPOCHS} "
              f"epochs on 2 GPUs (~ = projected from the measured epochs)")
        print(table(rows))
    print(f"results: {out / RESULT_FILE}", flush=True)
    if failures:
        raise SystemExit(f"{len(failures)} option set(s) failed: {', '.join(f['options'] for f in failures)}")
    return report


# --- command line --------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="tokenize IMDB into token shards (CPU)")
    p.add_argument("--shared", default=str(DEFAULT_SHARED), help="folder with imdb/ and bert-tiny/")
    p.add_argument("--out", required=True)
    p.add_argument("--train-samples", type=int, default=None, help="default: all 25,000")
    p.add_argument("--test-samples", type=int, default=None, help="default: all 25,000")
    p.add_argument("--validation-samples", type=int, default=2500,
                   help="per-epoch held-out eval rows, taken from the test rows")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--shard-rows", type=int, default=5000)

    def train_args(q):
        q.add_argument("--data", required=True, help="the folder `prepare` wrote")
        q.add_argument("--device", default="cuda")
        q.add_argument("--epochs", type=int, default=STUDY_EPOCHS)
        q.add_argument("--batch-size", type=int, default=32, help="per GPU (the study's: 32)")
        q.add_argument("--lr", type=float, default=1e-4, help="the paper profile's")
        q.add_argument("--target-epochs", type=int, default=STUDY_EPOCHS)
        q.add_argument("--study-seconds", type=float, default=STUDY_SECONDS)
        q.add_argument("--compile-backend", default="inductor")
        q.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: all allowed cores)")
        q.add_argument("--verify-steps", type=int, default=6, help="whole-graph: steps checked against the loop's")

    r = sub.add_parser("run", help="train the option sets, print the table, write gpu_check.json")
    train_args(r)
    r.add_argument("--out", required=True)
    r.add_argument("--matrix", default="", help="comma-separated option sets, e.g. base,bf16+fused+gpu-data "
                   "(default: the flags given as one set; none on cuda: DEFAULT_GPU_MATRIX; on cpu: base)")
    for flag, *alias in (("bf16",), ("fused", "--fused-adamw"), ("gpu-data", "--data-on-gpu"), ("compile",),
                         ("cuda-graphs",), ("dynamic",), ("whole-graph",)):  # the options, as flags
        r.add_argument(f"--{flag}", *alias, dest=flag.replace("-", "_"), action="store_true")
    r.add_argument("--cell-timeout", type=float, default=0, help="seconds per option set (0: no limit)")
    r.add_argument("--time-budget", type=float, default=0, help="seconds for all option sets (0: no limit)")
    o = sub.add_parser("run-one", help=argparse.SUPPRESS)
    train_args(o)
    o.add_argument("--cell", required=True)
    o.add_argument("--options", default="base")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args)
    elif args.command == "run":
        run(args)
    else:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # export_model's shard bar
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
        run_one(args)


if __name__ == "__main__":
    main()
