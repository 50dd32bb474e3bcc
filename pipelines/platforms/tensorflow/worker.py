"""One TensorFlow rank: Keras 3 on TensorFlow, ``tf.distribute.MultiWorkerMirroredStrategy``.

    python -m pipelines.platforms.tensorflow.worker --cell-dir D --launch-time T \\
        --workers host0:port,host1:port --index K

Started by ``launcher.py``, one per rank; ``--workers``/``--index`` become this process's ``TF_CONFIG``
(set before TensorFlow is imported, as TensorFlow reads it then). The model (``model.py``) is a second
implementation of the shared loop's shape, not the same code. It trains on the same token shards, with
the same per-worker batch, learning rate (after the cell's scaling), AdamW recipe, schedule, epochs and seed.

Timing is ``pipelines.training.record``'s, as for every platform: ``data`` is the wait for the next
batch of this rank's shard; a step is three TensorFlow graphs, forward and backward (``compute``), the
ring all-reduce of the gradients as one flat buffer (``communication``, as DDP's comm hook times its
buckets), AdamW's update (``compute``). Each epoch ends with the held-out evaluation (sharded over the
ranks, summed) and a checkpoint (``save_checkpoint``); an attempt that finds one resumes from it. Rank 0
then tests every test row on its own copy of the weights and writes ``worker_result.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform as host_platform
import resource
import shutil
import socket
import time
from pathlib import Path
from types import SimpleNamespace

from pipelines.training.host import HOST_ENV, link_tx_bytes  # torch-free, as the torch ranks measure it

CHECKPOINT_DIR = "tf_checkpoint"
STATE_FILE = "record.json"  # the TrainingRecord's state beside the checkpoint
BEAT_INTERVAL_S = 0.25  # rank 0's heartbeat, as pipelines.training.process's


def tf_config(workers: list[str], index: int) -> dict:
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell-dir", required=True)
    parser.add_argument("--launch-time", type=float, required=True)
    parser.add_argument("--workers", required=True, help="host:port of every rank, comma-separated")
    parser.add_argument("--index", type=int, required=True, help="this process's rank")
    args = parser.parse_args(argv)
    workers = args.workers.split(",")
    if not 0 <= args.index < len(workers):
        raise SystemExit(f"--index {args.index} is not a rank of {len(workers)} worker(s)")
    os.environ["TF_CONFIG"] = json.dumps(tf_config(workers, args.index))
    # TensorFlow's C++ start-up chatter; on a host without a GPU also its "failed call to cuInit" ERROR line
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2" if shutil.which("nvidia-smi") else "3")
    train(Path(args.cell_dir), args.launch_time, args.index, len(workers))


def train(cell_dir: Path, launch_time: float, rank: int, world_size: int) -> None:
    from pipelines.platforms.tensorflow.model import build_classifier, build_optimizer
    from pipelines.training.cell import CellSpec, epoch_end_hook
    from pipelines.training.record import TrainingRecord

    from pipelines.measure import attempts
    from pipelines.measure.process_kinds import write_rank_pid

    write_rank_pid(cell_dir, rank)  # the resource split counts this process as a rank, not the platform's
    spec = CellSpec.read(cell_dir)
    cfg = spec.config
    if spec.world_size != world_size:
        raise SystemExit(f"cell.json says {spec.world_size} worker(s), the launch started {world_size}")

    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(cfg.training.threads_per_worker)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    keras.utils.set_random_seed(cfg.training.seed)  # every rank: the same initial weights
    strategy = tf.distribute.MultiWorkerMirroredStrategy() if world_size > 1 else tf.distribute.get_strategy()

    train_rows, validation_rows, test_rows = (_split(spec, s) for s in ("train", "validation", "test"))
    batch = cfg.training.batch_size
    # this rank's share of a seeded permutation, every epoch (the same on every rank: disjoint shards);
    # every rank takes as many steps (each step is a collective), the rows past them are left out
    steps_per_epoch = max(1, len(train_rows[2]) // world_size // batch)
    total_steps = steps_per_epoch * cfg.training.epochs

    with strategy.scope():
        model = build_classifier(spec.config.training.model_source, spec.num_labels, cfg.data.max_seq_len)
        optimizer = build_optimizer(cfg, total_steps)
        optimizer.build(model.trainable_variables)  # its slots exist before a checkpoint is read into them
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    state = _resume(checkpoint, cell_dir / CHECKPOINT_DIR)
    checkpoint_path = None
    record = TrainingRecord.from_state(state, samples_per_epoch=steps_per_epoch * batch * world_size)

    graphs = step_graphs(strategy, model, optimizer, global_batch=batch * world_size)
    step_tx, steps_trained = None, 0
    epoch_end, last_beat = epoch_end_hook(), 0.0

    def beat(epoch: int, step: int) -> None:  # rank 0: where training is (faults wait on it)
        nonlocal last_beat
        if rank == 0 and time.time() - last_beat > BEAT_INTERVAL_S:
            attempts.beat(spec.cell, epoch, step, steps_per_epoch)
            last_beat = time.time()

    for epoch in range(record.epochs_done, cfg.training.epochs):
        order = np.random.default_rng(cfg.training.seed + epoch).permutation(len(train_rows[2]))
        mine = order[rank::world_size][:steps_per_epoch * batch]
        sent = link_tx_bytes()
        with record.phase("train"):
            sums = train_epoch(graphs, record, _batches(train_rows, mine, batch, steps_per_epoch),
                               lambda step: beat(epoch + 1, step))
        if sent is not None:  # this host's link during the steps alone (no start-up, evaluation, checkpoint)
            step_tx = (step_tx or 0) + link_tx_bytes() - sent
        steps_trained += steps_per_epoch
        with record.phase("eval"):  # rank r: rows r, r+W, ... summed over the ranks
            held = evaluate_rows(graphs, _batches(validation_rows, np.arange(rank, len(validation_rows[2]), world_size),
                                                  batch))
        lr = float(optimizer.learning_rate.numpy()) if hasattr(optimizer.learning_rate, "numpy") else None
        record.end_epoch(train_loss=sums[0] / max(sums[2], 1), train_accuracy=sums[1] / max(sums[2], 1),
                         eval_loss=held[0] / max(held[2], 1), eval_accuracy=held[1] / max(held[2], 1), learning_rate=lr)
        with record.phase("checkpoint"):
            checkpoint_path = save_checkpoint(checkpoint, cell_dir, rank, record)
        print(f"rank {rank} epoch {record.epochs_done}: train loss {record.history[-1].train_loss:.4f} "
              f"eval accuracy {record.history[-1].eval_accuracy:.3f}", flush=True)
        if epoch_end is not None:  # after the checkpoint, as the shared loop calls it (tests inject faults)
            epoch_end(epoch=record.epochs_done, rank=rank, cell_dir=cell_dir)
    link = link_bytes_per_step(graphs, step_tx, steps_trained, first_on_host=_first_on_host(rank))
    if rank == 0:
        _finish(spec, record, model, test_rows, launch_time, world_size, steps_per_epoch,
                checkpoint_path, len(train_rows[2]),
                comm_bytes_per_step=graphs.payload_bytes if world_size > 1 else None, link_bytes_per_step=link)


def step_graphs(strategy, model, optimizer, *, global_batch: int):
    """A training step as three graphs, so the all-reduce is timed as the torch ranks' comm hook times
    theirs: ``compute`` (forward, backward; the gradients as one flat buffer, as DDP's buckets),
    ``all_reduce`` (a SUM over the workers' ring), ``apply`` (AdamW's update, outside the replica
    context, where Keras's optimizer does not all-reduce them again); and ``evaluate``."""
    import keras
    import numpy as np
    import tensorflow as tf

    shapes = [v.shape for v in model.trainable_variables]
    sizes = [int(np.prod(shape)) for shape in shapes]

    def local_gradients(ids, mask, labels):  # this rank's batch, nothing shared
        with tf.GradientTape() as tape:
            logits = model(_inputs(ids, mask), training=True)
            per_row = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per_row, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)  # the embeddings': IndexedSlices, made dense
        flat = tf.concat([tf.reshape(tf.convert_to_tensor(g), [-1]) for g in grads], axis=0)
        return flat, _sums(per_row, logits, labels)

    def evaluate(ids, mask, labels):
        logits = model(_inputs(ids, mask), training=False)
        return _sums(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True), logits, labels)

    def apply_flat(flat):
        grads = [tf.reshape(g, shape) for g, shape in zip(tf.split(flat, sizes), shapes)]
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    return SimpleNamespace(
        compute=tf.function(lambda ids, mask, labels: strategy.run(local_gradients, args=(ids, mask, labels))),
        all_reduce=tf.function(lambda value: strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)),
        apply=tf.function(apply_flat),
        evaluate=tf.function(lambda ids, mask, labels: strategy.run(evaluate, args=(ids, mask, labels))),
        payload_bytes=4 * sum(sizes))  # fp32 handed to the all-reduce per step


def train_epoch(graphs, record, batches, after_step) -> list[float]:
    """This rank's steps of one epoch -> (loss sum, correct, rows) over every rank."""
    import numpy as np
    import tensorflow as tf

    sums = np.zeros(3)
    for step, (ids, mask, labels) in enumerate(record.timed_batches(batches), start=1):
        record.training_started()
        flat, local = graphs.compute(ids, mask, labels)
        with record.communicating():
            flat = graphs.all_reduce(flat)
        graphs.apply(flat)
        sums += [float(v) for v in local]
        after_step(step)
    with record.communicating():  # the epoch's train metrics, once (as the shared loop sums them)
        return graphs.all_reduce(tf.constant(sums, tf.float32)).numpy().tolist()


def evaluate_rows(graphs, batches) -> list[float]:
    """(loss sum, correct, rows) of this rank's batches, summed over every rank."""
    import numpy as np
    import tensorflow as tf

    held = np.zeros(3)
    for ids, mask, labels in batches:
        held += [float(v) for v in graphs.evaluate(ids, mask, labels)]
    return graphs.all_reduce(tf.constant(held, tf.float32)).numpy().tolist()


def _first_on_host(rank: int) -> bool:
    """Whether ``rank`` is the first of its host's ranks in TF_CONFIG (the one that counts its link)."""
    workers = json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]
    host = workers[rank].rpartition(":")[0]
    return next(k for k, w in enumerate(workers) if w.rpartition(":")[0] == host) == rank


def link_bytes_per_step(graphs, step_tx: int | None, steps: int, *, first_on_host: bool) -> float | None:
    """What all hosts' links sent per training step (every rank joins: a collective), as the torch
    ranks report it (``CellResult.link_bytes_per_train_step``); None on one host."""
    import tensorflow as tf

    mine = [float(step_tx or 0) if first_on_host else 0.0, 0.0 if step_tx is None else 1.0]
    total, known = graphs.all_reduce(tf.constant(mine, tf.float32)).numpy().tolist()
    return total / steps if steps and known == len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]) else None


def _split(spec, split: str):
    from pipelines.data.tokens import read_token_split

    ids, mask, labels = read_token_split(spec.paths.token_split(split))
    return ids.astype("int32"), mask.astype("int32"), labels.astype("int64")


def _sums(per_row, logits, labels):
    """(loss sum, correct, rows) of one batch."""
    import tensorflow as tf

    correct = tf.reduce_sum(tf.cast(tf.argmax(logits, -1, output_type=labels.dtype) == labels, tf.float32))
    return [tf.reduce_sum(per_row), correct, tf.cast(tf.size(labels), tf.float32)]


def _inputs(ids, mask):
    import tensorflow as tf

    return {"token_ids": ids, "padding_mask": mask, "segment_ids": tf.zeros_like(ids)}


def _batches(rows, index, batch: int, steps: int | None = None):
    """Batches of ``rows`` (ids, mask, labels) at ``index``; ``steps``: the first that many."""
    count = steps if steps is not None else -(-len(index) // batch)
    for k in range(count):
        at = index[k * batch:(k + 1) * batch]
        yield rows[0][at], rows[1][at], rows[2][at]


def save_checkpoint(checkpoint, cell_dir: Path, rank: int, record) -> str | None:
    """Every rank writes (MultiWorkerMirroredStrategy's save is collective), rank 0 the one kept:
    ``<cell>/tf_checkpoint/ckpt-<epoch>``, then ``record.json`` naming it (written whole, last: a kill
    in between leaves the previous epoch's pair), then the older ones go; the others' copies are
    deleted. -> rank 0's checkpoint prefix."""
    from pipelines.runfolder.fileio import atomic_write_json
    from pipelines.runfolder.paths import CellPaths

    folder = cell_dir / CHECKPOINT_DIR if rank == 0 else cell_dir / CHECKPOINT_DIR / f"rank-{rank}"
    name = f"ckpt-{record.epochs_done}"
    checkpoint.write(str(folder / name))
    if rank > 0:
        shutil.rmtree(folder, ignore_errors=True)
        return None
    atomic_write_json(folder / STATE_FILE, {"checkpoint": name, "record": record.state()})
    for old in folder.glob("ckpt-*"):
        if old.name.partition(".")[0] != name:
            old.unlink(missing_ok=True)
    # the epochs it holds: the attempts' lost-work measure reads it (as Determined's marker)
    atomic_write_json(CellPaths(cell_dir).platform_checkpoint, {"epochs": record.epochs_done})
    return str(folder / name)


def _resume(checkpoint, folder: Path) -> dict | None:
    """The record's state of the newest checkpoint (``record.json``), its weights and optimizer
    state read into ``checkpoint``; None: there is none."""
    try:
        saved = json.loads((folder / STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    checkpoint.read(str(folder / saved["checkpoint"])).expect_partial()
    print(f"resuming from {folder / saved['checkpoint']} after epoch {len(saved['record']['history'])}", flush=True)
    return saved["record"]


def _finish(spec, record, model, test_rows, launch_time: float, world_size: int, steps_per_epoch: int,
            checkpoint_path: str, train_samples: int, comm_bytes_per_step: float | None,
            link_bytes_per_step: float | None) -> None:
    """Rank 0: every test row on this rank's weights, the exported model, ``worker_result.json``."""
    import keras
    import numpy as np
    import tensorflow as tf

    from pipelines.platforms.tensorflow.model import build_classifier
    from pipelines.runfolder.results import CellResult
    from pipelines.training.metrics import classification_metrics

    cfg = spec.config
    start = time.perf_counter()
    local = build_classifier(cfg.training.model_source, spec.num_labels, cfg.data.max_seq_len)  # outside the strategy
    local.set_weights(model.get_weights())
    ids, mask, labels = test_rows
    logits = local.predict(_inputs(tf.constant(ids), tf.constant(mask)), batch_size=cfg.training.batch_size, verbose=0)
    loss = float(np.mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)))
    test = classification_metrics(labels, logits.argmax(-1), loss, spec.labels)
    test_seconds = time.perf_counter() - start
    start = time.perf_counter()
    model_path = spec.cell.root / "model.keras"
    local.save(model_path)
    export_seconds = time.perf_counter() - start
    host = os.environ.get(HOST_ENV) or socket.gethostname()
    gpus = tf.config.list_logical_devices("GPU")  # TensorFlow places the model on the first, where it finds one
    device = f"gpu:{gpus[0].name}" if gpus else "cpu"
    result = CellResult(
        backend=spec.backend, world_size=world_size, repeat=spec.repeat, device=device,
        model_source="random_init", model_name=cfg.training.model_source, train_samples=train_samples,
        test_samples=len(labels), max_seq_len=cfg.data.max_seq_len, num_labels=spec.num_labels,
        batch_size_per_worker=cfg.training.batch_size, global_batch_size=cfg.training.batch_size * world_size,
        batch_policy=cfg.training.batch_policy, lr_scaling=cfg.training.lr_scaling,
        learning_rate=cfg.training.learning_rate, seed=cfg.training.seed,
        devices=[device] * world_size, epochs=record.history, test=test,
        **record.timings(launch_time, test_seconds),
        phases=record.cell_phases(launch_time, final_test_seconds=test_seconds, export_seconds=export_seconds),
        work_end=time.time(), peak_memory_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        checkpoint_path=checkpoint_path, model_path=str(model_path), resumed_from_epoch=record.resumed_from_epoch,
        versions=_versions(), host=host, **cfg.strategy().result_fields(), steps_per_epoch=steps_per_epoch,
        comm_bytes_per_step=comm_bytes_per_step, link_bytes_per_train_step=link_bytes_per_step, rank_steps=[record.rank_steps(0, host)],
    )
    result.write(spec.cell.worker_result)
    print(f"test accuracy {test.accuracy:.3f} (rank 0 of {world_size})", flush=True)


def _versions() -> dict[str, str]:
    import keras
    import keras_hub
    import tensorflow as tf

    return {"python": host_platform.python_version(), "tensorflow": tf.__version__, "keras": keras.__version__,
            "keras_hub": keras_hub.__version__, "strategy": "MultiWorkerMirroredStrategy"}


if __name__ == "__main__":
    main()
