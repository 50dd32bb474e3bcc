"""Named profiles: the defaults a run starts from (``load_config(profile, overrides)``).

Keys are config fields by flat name or dotted path (``pipelines.config.model``); a callable value
is called when the profile loads (what the platform registry implies). A platform's own settings
for a profile (``engines.<name>``) are its record's (``Platform.profile_settings``): ``defaults``
adds them, under the profile's own keys.
"""

from __future__ import annotations

from typing import Any

from pipelines import platforms

# Learning rates: BERT-tiny from random init (no hub here) needs ~1e-3 to leave chance level
# within a few epochs (measured: 2k reviews, 4 epochs, lr 1e-3 -> 0.76 test accuracy; at 2e-4
# it stays at 0.50 after 3 epochs of 4k). `paper` keeps a fine-tuning rate for pretrained weights.
PROFILES: dict[str, dict[str, Any]] = {
    # Minutes on 2 CPU cores: the README's main command and CI use it. Sized to visibly learn
    # from random init in few steps (bench/smoke_tuning.py, 4 seeds: test accuracy 0.70-0.72 with
    # 1,080 training reviews x 3 epochs, their last 48 tokens, global batch 24, lr 2e-3: 135 steps;
    # batch 16 / lr 1e-3 needs 203 steps for 0.69-0.72; batch 32 is at 0.65-0.67 for some seeds
    # and lr 4e-3 diverges; 400-800 reviews or 2 epochs stay at 0.50 for some seeds). A global
    # batch gives 2 workers the same steps as 1. Every platform on 2 workers only (each run
    # distributed; the 1-worker cells are the nightly's): minutes, not ten.
    "smoke": dict(
        train_samples=1200, test_samples=400, max_seq_len=48, truncation_side="left", epochs=3,
        batch_size=24, batch_policy="global", learning_rate=2e-3, worker_counts=[2], repeats=1,
        target_accuracy=0.65, min_class_fraction=0.35,
        # the platforms that declare smoke=True (a callable: read when the profile loads)
        backends=platforms.smoke_names,
    ),
    # Every night: big enough for stable medians, small enough for a CPU box.
    "nightly": dict(
        train_samples=4000, test_samples=2000, max_seq_len=128, epochs=3, batch_size=32,
        learning_rate=1e-3, worker_counts=[1, 2], repeats=3, target_accuracy=0.7,
    ),
    # The nightly's work on 2 emulated hosts (network namespaces, one core each) linked at 1 Gbit/s:
    # every platform by its own multi-node path, gradients over a real (shaped) link
    "cluster": dict(
        train_samples=4000, test_samples=2000, max_seq_len=128, epochs=3, batch_size=32,
        learning_rate=1e-3, worker_counts=[1, 2], repeats=3, target_accuracy=0.7,
        **{"cluster.kind": "emulated", "cluster.hosts": 2, "networks": ["1gbit"]},
    ),
    # The published study: full IMDB, 20 epochs, up to 3 workers.
    "paper": dict(
        train_samples=None, test_samples=None, max_seq_len=128, epochs=20, batch_size=32,
        learning_rate=1e-4, worker_counts=[1, 2, 3], repeats=1, target_accuracy=0.8,
    ),
}


def defaults(profile: str) -> dict[str, Any]:
    """What ``profile`` sets, by flat name or dotted path: each platform's settings for it
    (``engines.<name>.<field>``, from its record), then the profile's own (callables called)."""
    declared = {f"engines.{p.name}.{name}": value for p in platforms.all_platforms()
                for name, value in p.profile_settings.get(profile, {}).items()}
    return {**declared, **{k: v() if callable(v) else v for k, v in PROFILES[profile].items()}}
