"""Does a smoke-sized run learn from random init? Test accuracy per seed for candidate settings.

    .venv/bin/python bench/smoke_tuning.py                       # the smoke profile's setting, 4 seeds
    .venv/bin/python bench/smoke_tuning.py --train-samples 400 --epochs 2 --seq-len 64 --truncation right

One process, one thread, the project's tokenizer call (``tokenize_frame``), model factory and
optimizer/schedule (``build_model``, ``build_optimizer``), a balanced sample of the real IMDB copy
(``--train-samples`` training reviews: the smoke profile's 1,200 minus its 10 % validation split
= 1,080), plain shuffled batches of the global batch size (what ``batch_policy=global`` gives
every worker count). BERT-tiny from random weights sits at 0.50 for a seed-dependent number of
steps before it learns; a setting is good when every seed leaves that plateau. Prints one line
per seed and the minimum. Needs ../shared/data (or SHARED_DATA).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from pipelines.runfolder.paths import PROJECT_ROOT

SHARED = Path(os.environ.get("SHARED_DATA", PROJECT_ROOT.parent / "shared" / "data"))


def sample(split: str, n: int, seed: int, seq_len: int, truncation: str, model: str):
    import numpy as np
    import pandas as pd
    import torch

    from pipelines.data.tokens import tokenize_frame

    frame = pd.read_parquet(SHARED / "imdb" / f"{split}.parquet")
    frame = pd.concat(g.sample(n // 2, random_state=seed) for _, g in frame.groupby("label"))
    tokens = tokenize_frame(frame.sample(frac=1.0, random_state=seed), model, seq_len, truncation)
    return (torch.from_numpy(np.stack(tokens["input_ids"].to_numpy())).long(),
            torch.from_numpy(np.stack(tokens["attention_mask"].to_numpy())).long(),
            torch.from_numpy(tokens["label"].to_numpy()))


def train_and_test(args, seed: int) -> tuple[float, float]:
    import torch
    import torch.nn.functional as F

    from pipelines.config import load_config
    from pipelines.training.steps import build_optimizer
    from pipelines.training.model import build_model

    ids, mask, labels = sample("train", args.train_samples, args.data_seed, args.seq_len, args.truncation, args.model)
    t_ids, t_mask, t_labels = sample("test", args.test_samples, args.data_seed, args.seq_len, args.truncation,
                                     args.model)
    config = load_config("smoke", dict(learning_rate=args.lr, epochs=args.epochs, batch_size=args.batch_size,
                                       seed=seed))
    model, _ = build_model(args.model, seed, 2)
    steps = -(-len(labels) // args.batch_size)
    optimizer, scheduler = build_optimizer(model, config, steps * args.epochs)
    order = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    start = time.perf_counter()
    for _ in range(args.epochs):
        perm = torch.randperm(len(labels), generator=order)
        for i in range(0, len(labels), args.batch_size):
            batch = perm[i:i + args.batch_size]
            loss = F.cross_entropy(model(input_ids=ids[batch], attention_mask=mask[batch]).logits, labels[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
    seconds = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        predicted = model(input_ids=t_ids, attention_mask=t_mask).logits.argmax(-1)
    return float((predicted == t_labels).float().mean()), seconds


def main() -> None:
    p = argparse.ArgumentParser(description="smoke-size learning check from random init")
    p.add_argument("--train-samples", type=int, default=1080)
    p.add_argument("--test-samples", type=int, default=400)
    p.add_argument("--seq-len", type=int, default=48)
    p.add_argument("--truncation", choices=("right", "left"), default="left")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seeds", default="42,43,44,45")
    p.add_argument("--data-seed", type=int, default=7)
    p.add_argument("--model", default=str(SHARED / "bert-tiny"))
    args = p.parse_args()

    import torch

    torch.set_num_threads(1)
    accuracies = []
    for seed in map(int, args.seeds.split(",")):
        accuracy, seconds = train_and_test(args, seed)
        accuracies.append(accuracy)
        print(json.dumps({"seed": seed, "test_accuracy": round(accuracy, 3), "train_seconds": round(seconds, 1)}),
              flush=True)
    print(f"min test accuracy over {len(accuracies)} seeds: {min(accuracies):.3f} "
          f"({args.train_samples} reviews x {args.epochs} epochs, seq {args.seq_len} {args.truncation}, "
          f"batch {args.batch_size}, lr {args.lr:g})")


if __name__ == "__main__":
    main()
