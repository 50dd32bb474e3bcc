"""Where a BERT-tiny training step goes on CPU, and what the AdamW implementation changes.

    .venv/bin/python bench/optimizer_step.py                    # batch 8 (the smoke's per-rank batch), seq 48
    .venv/bin/python bench/optimizer_step.py --batch 16 --seq-len 128 --steps 40

One process, one thread (a rank's budget), the project's model factory (random init from the
bert-tiny config, 4.39M parameters of which 3.9M are the word embeddings, all dense). The three
torch AdamW implementations run side by side in one process on the same batches: the
per-parameter loop (torch's CPU default), ``foreach`` and ``fused``. Prints forward, backward and
optimizer-step milliseconds per step (mean over the timed steps, after warm-up) and each
implementation's step time as a ratio of the default's. ``pipelines.training.steps.build_optimizer``
uses the fused kernel.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from pipelines.runfolder.paths import PROJECT_ROOT

SHARED = Path(os.environ.get("SHARED_DATA", PROJECT_ROOT.parent / "shared" / "data"))
IMPLEMENTATIONS = {"for-loop (default)": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def time_steps(model, options: dict, ids, mask, labels, warmup: int, steps: int) -> dict[str, float]:
    import torch
    import torch.nn.functional as F

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, **options)
    spent = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(input_ids=ids, attention_mask=mask).logits, labels)
        t1 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        t3 = time.perf_counter()
        if i >= warmup:
            for name, seconds in zip(spent, (t1 - t0, t2 - t1, t3 - t2)):
                spent[name] += seconds
    return {name: seconds / steps * 1e3 for name, seconds in spent.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=48)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--model", default=str(SHARED / "bert-tiny"))
    args = p.parse_args()

    import torch

    from pipelines.training.model import build_model

    torch.set_num_threads(1)
    model, _ = build_model(args.model, 42, 2)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (args.batch, args.seq_len), generator=generator)
    mask = torch.ones_like(ids)
    labels = torch.randint(0, 2, (args.batch,), generator=generator)
    results = {name: time_steps(model, options, ids, mask, labels, args.warmup, args.steps)
               for name, options in IMPLEMENTATIONS.items()}
    base = sum(results["for-loop (default)"].values())
    print(f"BERT-tiny, batch {args.batch}, seq {args.seq_len}, 1 thread, {args.steps} timed steps (ms per step)")
    for name, ms in results.items():
        total = sum(ms.values())
        print(f"{name:20s} forward {ms['forward']:6.1f}  backward {ms['backward']:6.1f}  "
              f"optimizer {ms['optimizer']:6.1f}  step {total:6.1f}  = {total / base:.2f}x the default's step")


if __name__ == "__main__":
    main()
