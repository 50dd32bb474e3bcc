"""The TensorFlow platform's model and optimizer: the benchmark's shape and recipe in Keras 3.

``build_classifier``: Keras Hub's ``BertBackbone`` of the shape in the model folder's Hugging Face
config (layers, hidden size, heads, feed-forward size, dropout, positions, segments; random weights,
as Keras Hub reads no torch checkpoint) with ``BertForSequenceClassification``'s head (dropout, a
dense layer on the pooled output). ``build_optimizer``: ``pipelines.training.steps.build_optimizer``'s
recipe, AdamW without decay on biases and LayerNorm, linear warm-up then linear decay to 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import keras  # this module is imported only in the TensorFlow worker


def build_classifier(model_source: str, num_labels: int, max_seq_len: int):
    """Keras Hub's BERT backbone of the shape in ``<model_source>/config.json`` + the classifier head
    of BertForSequenceClassification (dropout, dense on the pooled output), random weights."""
    import keras_hub
    from transformers.utils import CONFIG_NAME  # the Hugging Face folder's file (no torch imported)

    shape = json.loads((Path(model_source) / CONFIG_NAME).read_text())
    init = keras.initializers.TruncatedNormal(stddev=shape.get("initializer_range", 0.02))
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=shape["vocab_size"], num_layers=shape["num_hidden_layers"],
        num_heads=shape["num_attention_heads"], hidden_dim=shape["hidden_size"],
        intermediate_dim=shape["intermediate_size"], dropout=shape.get("hidden_dropout_prob", 0.1),
        max_sequence_length=shape.get("max_position_embeddings", 512), num_segments=shape.get("type_vocab_size", 2))
    inputs = {name: keras.Input(shape=(max_seq_len,), dtype="int32", name=name)
              for name in ("token_ids", "padding_mask", "segment_ids")}
    pooled = backbone(inputs)["pooled_output"]
    pooled = keras.layers.Dropout(shape.get("hidden_dropout_prob", 0.1))(pooled)
    logits = keras.layers.Dense(num_labels, kernel_initializer=init, name="classifier")(pooled)
    return keras.Model(inputs, logits, name="bert_classifier")


def build_optimizer(cfg, total_steps: int):
    """AdamW with the shared loop's settings: no decay on biases and LayerNorm, linear warm-up
    then linear decay to 0 over the cell's steps (``pipelines.training.steps.build_optimizer``)."""
    warmup = int(cfg.training.warmup_ratio * total_steps)
    optimizer = keras.optimizers.AdamW(learning_rate=LinearWarmupDecay(cfg.training.learning_rate, warmup, total_steps),
                                       weight_decay=cfg.training.weight_decay, epsilon=1e-8)
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])  # LayerNorm's gamma/beta
    return optimizer


@keras.saving.register_keras_serializable(package="benchmark")
class LinearWarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """transformers' get_linear_schedule_with_warmup: 0 -> peak over ``warmup``, then -> 0 at ``total``."""

    def __init__(self, peak: float, warmup: int, total: int):
        self.peak, self.warmup, self.total = peak, warmup, max(total, 1)

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        up = step / max(self.warmup, 1)
        down = keras.ops.maximum(0.0, (self.total - step) / max(self.total - self.warmup, 1))
        return self.peak * keras.ops.where(step < self.warmup, up, down)

    def get_config(self):
        return {"peak": self.peak, "warmup": self.warmup, "total": self.total}
