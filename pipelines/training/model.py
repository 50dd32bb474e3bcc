"""Model factory: BERT-style sequence classifier from a hub id or a local folder.

``build_model(source, seed, num_labels)`` loads pretrained weights when the source has them, and otherwise
builds the architecture from its ``config.json`` with a seeded random init (the case for the
offline ``bert-tiny`` copy, which ships no weights). Every backend calls this one function, so
all of them start from identical parameters for the same seed. ``num_labels`` is the task's
class count, from the snapshot manifest (``pipelines.data.manifest.task_labels``).

Fails with ``OSError`` naming the source when neither weights nor a config can be found.
"""

from __future__ import annotations

from pathlib import Path

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                "pytorch_model.bin.index.json")


def has_local_weights(folder: Path) -> bool:
    return any((Path(folder) / name).exists() for name in WEIGHT_FILES)


def build_model(source: str, seed: int, num_labels: int):
    """Return ``(model, model_source)`` with model_source "pretrained" or "random_init"."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # "newly initialized head" warnings on every rank
    torch.manual_seed(seed)  # the classification head (and a random init) depend on it
    folder = Path(source)
    if folder.is_dir() and not has_local_weights(folder):
        return _from_config(source, num_labels, AutoConfig, AutoModelForSequenceClassification)
    try:
        model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=num_labels)
        return model, "pretrained"
    except OSError as err:
        if folder.is_dir():  # weights present but unreadable: do not silently fall back
            raise OSError(f"model_source={source!r}: weights found but cannot be loaded ({err})") from err
        # A hub id without reachable weights: the architecture alone may still be cached.
        torch.manual_seed(seed)
        try:
            return _from_config(source, num_labels, AutoConfig, AutoModelForSequenceClassification)
        except OSError as cfg_err:
            raise OSError(
                f"model_source={source!r}: neither weights nor config.json could be loaded "
                f"({cfg_err}). Give a reachable/cached hub id or a local folder with config.json "
                "(weights optional)."
            ) from cfg_err


def _from_config(source, num_labels, AutoConfig, AutoModelForSequenceClassification):
    try:
        config = AutoConfig.from_pretrained(source, num_labels=num_labels)
    except (OSError, ValueError) as err:  # ValueError: a folder without a usable config.json
        raise OSError(f"model_source={source!r}: no usable config.json ({err})") from err
    return AutoModelForSequenceClassification.from_config(config), "random_init"


def encoder_layers(source: str) -> int | None:
    """The model's encoder layer count from its folder's config file (``num_hidden_layers``), read
    without loading the model; None where the source is no folder with a readable config (a hub id)."""
    import json

    from transformers.utils import CONFIG_NAME

    try:
        value = json.loads((Path(source) / CONFIG_NAME).read_text()).get("num_hidden_layers")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None
