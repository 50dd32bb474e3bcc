"""Model factory: random init from a config-only folder, pretrained from a folder with weights."""

from __future__ import annotations

import shutil

import pytest
import torch

from pipelines.training.model import build_model, has_local_weights


def _params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_config_only_folder_gives_seeded_random_init(bert_tiny_dir):
    assert not has_local_weights(bert_tiny_dir)
    a, source_a = build_model(str(bert_tiny_dir), seed=1, num_labels=2)
    b, _ = build_model(str(bert_tiny_dir), seed=1, num_labels=2)
    c, _ = build_model(str(bert_tiny_dir), seed=2, num_labels=2)
    assert source_a == "random_init"
    assert a.config.num_labels == 2 and a.config.hidden_size == 128
    assert torch.equal(_params(a), _params(b))
    assert not torch.equal(_params(a), _params(c))


def test_folder_with_weights_loads_pretrained(tmp_path, bert_tiny_dir):
    model, _ = build_model(str(bert_tiny_dir), seed=3, num_labels=2)
    model.save_pretrained(tmp_path / "weights")
    loaded, source = build_model(str(tmp_path / "weights"), seed=99, num_labels=2)
    assert source == "pretrained"
    assert torch.equal(_params(model), _params(loaded))  # the seed does not touch loaded weights


def test_unusable_source_names_it(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(OSError, match="empty"):
        build_model(str(empty), seed=0, num_labels=2)
    shutil.rmtree(empty)
    with pytest.raises(OSError, match="no-such-org/no-such-model"):
        build_model("no-such-org/no-such-model", seed=0, num_labels=2)
