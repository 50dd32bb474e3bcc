"""scripts/gpu_check.sh (bench/gpu_check.py): the study's setting through the project's loop.

End to end on CPU with a tiny setting (prepare + run, two option sets) in a Python where the
heavy stacks (pyspark, airflow, great_expectations, mlflow) and scikit-learn cannot be imported,
as on a bare GPU image; and the speed options' pieces (device loader, autocast, compile, fused
AdamW, the metrics stand-in) on their own.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from pipelines.training.distributed import DistEnv
from tests.conftest import BERT_TINY_DIR, PROJECT_ROOT, SHARED_DATA

SCRIPT = PROJECT_ROOT / "scripts" / "gpu_check.sh"
BLOCKED = ("pyspark", "airflow", "great_expectations", "mlflow", "sklearn")


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", PROJECT_ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_check = _gpu_check()


def _blocker(tmp_path):
    """A sitecustomize that makes the heavy packages unimportable (as if not installed)."""
    folder = tmp_path / "blocker"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        "import sys\n"
        f"for _name in {BLOCKED!r}:\n"
        "    sys.modules[_name] = None  # import raises ImportError; find_spec says: not installed\n")
    return folder


@pytest.mark.slow
def test_tiny_cpu_check_end_to_end_without_heavy_packages(tmp_path):
    work = tmp_path / "work"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(_blocker(tmp_path)),
           "SHARED_DATA": str(SHARED_DATA)}
    check = subprocess.run([sys.executable, "-c", "import pyspark"], env=env, capture_output=True, text=True)
    assert check.returncode != 0 and "import of pyspark halted" in check.stderr  # the blocker works
    proc = subprocess.run(
        ["bash", str(SCRIPT), "both", "--work", str(work), "--train-samples", "48", "--test-samples", "32",
         "--validation-samples", "16", "--seq-len", "32", "--epochs", "2", "--batch-size", "16",
         "--device", "cpu", "--threads", "2", "--matrix", "base,fused+gpu-data"],
        env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    report = json.loads((work / "results" / "gpu_check.json").read_text())
    assert report["failures"] == [] and report["study"]["seconds"] == 499.0
    assert report["data"]["splits"]["train"]["rows"] == 48 and report["data"]["seq_len"] == 32
    rows = {r["options"]: r for r in report["results"]}
    assert set(rows) == {"base", "fused+gpu-data"}
    assert rows["fused+gpu-data"]["option_list"] == ["fused", "gpu-data"] and rows["base"]["option_list"] == []
    for r in rows.values():
        assert r["device"] == "cpu" and r["epochs"] == 2 and r["train_samples"] == 48
        assert r["batch_size"] == 16 and r["max_seq_len"] == 32
        assert r["heavy_modules_loaded"] == []  # scikit-learn included: the metrics are numpy
        assert r["samples_per_second"] > 0 and r["steady_samples_per_second"] > 0
        assert len(r["train_seconds_per_epoch"]) == len(r["epoch_seconds"]) == 2
        assert all(t > 0 for t in r["train_seconds_per_epoch"])
        assert all(e >= t for e, t in zip(r["epoch_seconds"], r["train_seconds_per_epoch"]))
        # 2 of 20 epochs measured: projected as epoch 1 + 19 x the later epochs' mean
        assert r["projected"] is True and r["target_epochs"] == 20
        assert r["total_seconds"] == pytest.approx(r["epoch_seconds"][0] + 19 * r["epoch_seconds"][1])
        assert r["train_total_seconds"] == pytest.approx(
            r["train_seconds_per_epoch"][0] + 19 * r["train_seconds_per_epoch"][1])
        assert r["ratio_to_study"] == pytest.approx(r["total_seconds"] / 499.0)
        assert r["steady_samples_per_second"] == pytest.approx(48 / r["train_seconds_per_epoch"][1])
        assert 0.0 <= r["final_test_accuracy"] <= 1.0 and r["model_source"] == "random_init"
        # the project's loop wrote its own record of the cell
        worker = json.loads((work / "results" / "cells" / r["options"] / "worker_result.json").read_text())
        assert worker["samples_per_second"] == pytest.approx(r["samples_per_second"])
        assert [e["epoch_seconds"] for e in worker["epochs"]] == pytest.approx(r["epoch_seconds"])
    # the printed table: one line per option set with the JSON's numbers
    lines = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines() if line.startswith("| ")}
    assert "options" in lines and set(lines) - {"options"} == set(rows)
    for name, r in rows.items():
        cells = [c.strip() for c in lines[name].split("|")[1:-1]]
        assert cells[5] == f"~{r['total_seconds']:.2f}" and cells[6] == f"{r['ratio_to_study']:.4f}"
        assert float(cells[1]) == pytest.approx(r["samples_per_second"], abs=0.06)


def test_option_sets_parse_and_imply_compile():
    assert gpu_check.parse_option_set("base") == ()
    assert gpu_check.parse_option_set("gpu-data+bf16") == ("bf16", "gpu-data")
    assert gpu_check.parse_option_set("cuda-graphs") == ("compile", "cuda-graphs")
    assert gpu_check.parse_option_set("dynamic") == ("compile", "dynamic")
    with pytest.raises(SystemExit, match="unknown option"):
        gpu_check.parse_option_set("bf16+turbo")


def test_device_loader_yields_the_dataloaders_batches():
    data = TensorDataset(torch.arange(37).view(37, 1), torch.arange(37) % 2)
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, num_replicas=1, rank=0, seed=5))
    env = DistEnv(0, 1, 0, torch.device("cpu"))
    device_loader = gpu_check.make_distributed(("gpu-data",), "cpu").prepare_loader(loader, env)
    for epoch in (0, 1):
        loader.sampler.set_epoch(epoch)  # the loop sets the epoch on loader.sampler: the same object
        assert device_loader.sampler is loader.sampler and len(device_loader) == len(loader) == 5
        for ours, theirs in zip(device_loader, loader, strict=True):
            assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    assert gpu_check.make_distributed((), "cpu").prepare_loader(loader, env) is loader


def _tiny_model():
    from pipelines.training.model import build_model

    return build_model(str(BERT_TINY_DIR), seed=0, num_labels=2)[0]


def test_autocast_and_fused_adamw_options():
    from pipelines.config import load_config
    from pipelines.training.loop import build_optimizer

    model = _tiny_model()
    ids = torch.randint(0, 1000, (2, 8))
    mask = torch.ones_like(ids)
    distributed = gpu_check.make_distributed(("bf16",), "cpu")
    env = distributed.setup()
    assert env.device == torch.device("cpu") and env.world_size == 1
    assert distributed.wrap_model(model, env)(input_ids=ids, attention_mask=mask).logits.dtype == torch.bfloat16
    plain = gpu_check.make_distributed((), "cpu").wrap_model(model, env)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # off means off, whatever the loop sets outside
        assert plain(input_ids=ids, attention_mask=mask).logits.dtype == torch.float32
    assert list(plain.parameters()) == list(model.parameters())

    config = load_config("smoke")
    fused = gpu_check.make_distributed(("fused",), "cpu")
    assert fused.optimizer_options(env) == {"fused": True}
    optimizer, _ = build_optimizer(model, config, 10, **fused.optimizer_options(env))
    assert optimizer.defaults["fused"] is True
    default, _ = build_optimizer(model, config, 10)  # the loop's default: AdamW as before
    assert default.defaults["fused"] is None and gpu_check.make_distributed((), "cpu").optimizer_options(env) == {}


def test_compile_option_wraps_the_model():
    env = DistEnv(0, 1, 0, torch.device("cpu"))
    model = _tiny_model()
    ids = torch.randint(0, 1000, (2, 8))
    compiled = gpu_check.make_distributed(("compile",), "cpu", compile_backend="eager").wrap_model(model, env)
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
    assert list(compiled.parameters()) == list(model.parameters())
    assert compiled(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.shape == (2, 2)


def test_numpy_metrics_match_sklearn():
    from pipelines.metrics import classification_metrics

    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    y_true, y_pred = rng.integers(0, 3, 200), rng.integers(0, 3, 200)
    y_pred[y_pred == 2] = 1  # class 2 never predicted: zero_division path
    labels = [0, 1, 2, 3]  # class 3 in neither
    ours = classification_metrics(y_true, y_pred, 0.5, labels)
    assert ours.accuracy == sk.accuracy_score(y_true, y_pred)
    assert np.array_equal(ours.confusion_matrix, sk.confusion_matrix(y_true, y_pred, labels=labels))
    precision, recall, f1, support = sk.precision_recall_fscore_support(
        y_true, y_pred, labels=labels, average=None, zero_division=0)
    for a, b in zip(([c.precision for c in ours.per_class], [c.recall for c in ours.per_class],
                     [c.f1 for c in ours.per_class], [c.support for c in ours.per_class]),
                    (precision, recall, f1, support)):
        np.testing.assert_allclose(a, b)
    np.testing.assert_allclose([ours.precision, ours.recall, ours.f1], [precision.mean(), recall.mean(), f1.mean()])


def test_summary_sums_twenty_measured_epochs_and_projects_fewer():
    from types import SimpleNamespace

    def result(n):
        epochs = [SimpleNamespace(train_seconds=2.0 + (i == 0), eval_seconds=0.5, checkpoint_seconds=0.25,
                                  epoch_seconds=2.75 + (i == 0), eval_accuracy=0.5) for i in range(n)]
        return SimpleNamespace(epochs=epochs, device="cuda:NVIDIA H200", batch_size_per_worker=32, max_seq_len=128,
                               train_samples=25000, test_samples=25000, samples_per_second=25000 * n / (2.0 * n + 1),
                               startup_seconds=1.0, test=SimpleNamespace(accuracy=0.5), peak_memory_mb=1.0,
                               model_source="random_init", versions={})

    full = gpu_check.summarize(result(20), ("bf16",))
    assert full["projected"] is False and full["total_seconds"] == pytest.approx(20 * 2.75 + 1)
    assert full["train_total_seconds"] == pytest.approx(41.0)
    assert full["ratio_to_study"] == pytest.approx(56.0 / 499) and full["steady_samples_per_second"] == 12500
    few = gpu_check.summarize(result(3), ())
    assert few["projected"] is True and few["total_seconds"] == pytest.approx(3.75 + 19 * 2.75)
