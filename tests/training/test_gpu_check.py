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
    check = subprocess.run([sys.executable, "-c", "import pyspark"], check=False, env=env, capture_output=True, text=True)
    assert check.returncode != 0 and "import of pyspark halted" in check.stderr  # the blocker works
    proc = subprocess.run(
        ["bash", str(SCRIPT), "both", "--work", str(work), "--train-samples", "48", "--test-samples", "32",
         "--validation-samples", "16", "--seq-len", "32", "--epochs", "2", "--batch-size", "16",
         "--device", "cpu", "--threads", "2", "--matrix", "base,fused+gpu-data"],
        check=False, env=env, capture_output=True, text=True, timeout=600)
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
    from pipelines.training.steps import build_optimizer

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
    default, _ = build_optimizer(model, config, 10)  # the loop's default: the fused kernel too (CPU and CUDA)
    assert default.defaults["fused"] is True
    base = gpu_check.make_distributed((), "cpu").optimizer_options(env)  # the check's base: torch's own default
    assert base == {"fused": None} and build_optimizer(model, config, 10, **base)[0].defaults["fused"] is None
    looped, _ = build_optimizer(model, config, 10, foreach=True)  # asking for another implementation wins
    assert looped.defaults["foreach"] is True and not looped.defaults["fused"]


def test_compile_option_wraps_the_model():
    env = DistEnv(0, 1, 0, torch.device("cpu"))
    model = _tiny_model()
    ids = torch.randint(0, 1000, (2, 8))
    compiled = gpu_check.make_distributed(("compile",), "cpu", compile_backend="eager").wrap_model(model, env)
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
    assert list(compiled.parameters()) == list(model.parameters())
    assert compiled(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.shape == (2, 2)


def test_numpy_metrics_match_sklearn():
    from pipelines.training.metrics import classification_metrics

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


# --- the whole step (pipelines.training.graph_step) ------------------------------------------------
def _whole_step_case(rows=40, seq=16, seed=0):
    """A tiny model, its paper config at batch 8 and a train split with padding, on the CPU."""
    from pipelines.config import load_config

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 5000, (rows, seq), generator=g)
    mask = torch.ones_like(ids)
    mask[::3, seq * 3 // 4:] = 0  # every third review padded
    labels = torch.randint(0, 2, (rows,), generator=g)
    config = load_config("paper", {"batch_size": 8, "max_seq_len": seq})
    return _tiny_model(), config, (ids, mask, labels), torch.randperm(rows, generator=g)


@pytest.mark.slow  # trains BERT-tiny 6 steps twice
@pytest.mark.parametrize("dropout", [True, False])
def test_whole_step_losses_equal_the_loop_steps(dropout):
    """The eager whole step (fused capturable AdamW, the lr read from a device table inside the
    step) against the loop's own step sequence (default AdamW, LambdaLR stepped after each step),
    the same seed; the loop's step as it runs (no forced attention mask)."""
    from pipelines.training.graph_step import verify_whole_step

    model, config, data, order = _whole_step_case()
    before = [p.detach().clone() for p in model.parameters()]
    check = verify_whole_step(model, model, model, config, data, order, 8, torch.device("cpu"), steps=6,
                              dropout=dropout, same_masks=False, tolerance=1e-5)
    assert check["match"] and check["graphs"] is False and check["max_param_diff"] < 1e-6, check
    assert len(check["whole_step_losses"]) == 6 and len(set(check["reference_losses"])) == 6  # it trained
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the model is put back


@pytest.mark.slow  # trains BERT-tiny
def test_whole_step_check_catches_a_wrong_schedule(monkeypatch):
    from pipelines.training import graph_capture, graph_step

    model, config, data, order = _whole_step_case()
    right = graph_capture.schedule_table
    monkeypatch.setattr(graph_capture, "schedule_table", lambda o, s, n: right(o, s, n)[1:] + [0.0])  # one step early
    check = graph_step.verify_whole_step(model, model, model, config, data, order, 8, torch.device("cpu"))
    assert not check["match"] and check["max_loss_diff"] > 1e-3


def test_schedule_table_is_the_projects_scheduler():
    from pipelines.training.graph_capture import schedule_table
    from pipelines.training.steps import build_optimizer

    model, config, _, _ = _whole_step_case()
    optimizer, scheduler = build_optimizer(model, config, 50)
    table = schedule_table(optimizer, scheduler, 50)
    seen = []
    for _ in range(50):
        seen.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert table[:50] == pytest.approx(seen, rel=1e-12, abs=0) and table[0] == 0.0 and max(table) == 1e-4


def _host_syncs(fn):
    """The aten ops ``fn`` ran that read a device value on the host (.item(), bool(tensor)):
    each a sync, which a CUDA graph capture refuses."""
    from torch.utils._python_dispatch import TorchDispatchMode

    reads, hits = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default), []

    class Probe(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in reads:
                hits.append(str(func))
            return func(*args, **(kwargs or {}))

    with Probe():
        fn()
    return hits


@pytest.mark.slow  # trains BERT-tiny 4 steps
def test_whole_step_and_eval_never_read_the_device_on_the_host():
    """What a capture needs, checked on the CPU: no .item() / bool(tensor) anywhere in the step
    (transformers' mask skip does one: graph_safe_masks turns it off) or in the evaluation."""
    from pipelines.training.graph_capture import GraphEval, WholeStep, graph_safe_masks

    model, config, data, order = _whole_step_case()
    step = WholeStep(model, model, config, 10, data, 8, torch.device("cpu"))
    step.set_order(order)
    step.step(8)  # AdamW's state exists now, as after the warm-up
    assert _host_syncs(lambda: step._body(8))  # the probe sees transformers' padding_mask.all()
    with graph_safe_masks():
        assert _host_syncs(lambda: (step._body(8), step._body(8))) == []
        evaluator = GraphEval(model, data, 8, torch.device("cpu"))
        with evaluator._eval_mode():
            assert _host_syncs(lambda: evaluator._body(8)) == []
    assert step.step_count.item() == 4 and step.lr.item() == pytest.approx(step.lr_values[3])  # 4 steps ran


def test_graph_eval_equals_the_loops_evaluate():
    from pipelines.training.graph_capture import GraphEval, batch_sizes
    from pipelines.training.steps import eval_loader, evaluate

    model, _, data, _ = _whole_step_case(rows=21)
    assert batch_sizes(21, 8) == [8, 8, 5] and batch_sizes(16, 8) == [8, 8]
    loss_sum, correct, count = GraphEval(model, data, 8, torch.device("cpu")).run()
    ref_loss, ref_correct, ref_count, _, _ = evaluate(model, eval_loader(TensorDataset(*data), 8), torch.device("cpu"))
    assert (correct, count) == (ref_correct, ref_count) and loss_sum == pytest.approx(ref_loss, abs=1e-5)
    assert model.training  # evaluation leaves the mode as it was


def test_whole_graph_option_sets():
    assert gpu_check.parse_option_set("bf16+whole-graph") == ("bf16", "fused", "gpu-data", "whole-graph")
    assert gpu_check.parse_option_set("compile+whole-graph") == ("fused", "gpu-data", "compile", "whole-graph")
    with pytest.raises(SystemExit, match="own graphs"):
        gpu_check.parse_option_set("cuda-graphs+whole-graph")


@pytest.mark.slow
def test_compiled_whole_step_matches_the_loop_step():
    """The compiled variant's step (torch.compile of the model inside the whole step; aot_eager:
    AOTAutograd's forward and backward graphs without code generation) against the loop's step."""
    from pipelines.training.graph_step import verify_whole_step

    model, config, data, order = _whole_step_case()
    compiled = torch.compile(model, backend="aot_eager", dynamic=False)
    check = verify_whole_step(model, model, compiled, config, data, order, 8, torch.device("cpu"), steps=4,
                              same_masks=False, tolerance=1e-5)
    assert check["match"], check


@pytest.mark.slow
@pytest.mark.heavy  # 17 s in CI; the tiny CPU check end to end (above) stays there
def test_gpu_command_tiny_on_cpu_whole_step_trains_as_the_loop(tmp_path):
    """`gpu_check.sh gpu --tiny --device cpu`: the device command's flow (shards already there)
    with the loop's cell beside the whole-step cell; dropout off in the model config so both
    train deterministically: the same epochs' losses, the same held-out and test accuracy."""
    work = tmp_path / "work"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(_blocker(tmp_path)),
           "SHARED_DATA": str(SHARED_DATA)}
    prep = subprocess.run(["bash", str(SCRIPT), "prepare", "--tiny", "--work", str(work)],
                          check=False, env=env, capture_output=True, text=True, timeout=600)
    assert prep.returncode == 0, prep.stdout[-2000:] + prep.stderr[-2000:]
    model_config = work / "data" / "model" / "config.json"
    settings = json.loads(model_config.read_text())
    model_config.write_text(json.dumps({**settings, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}))
    proc = subprocess.run(
        ["bash", str(SCRIPT), "gpu", "--tiny", "--device", "cpu", "--threads", "2", "--work", str(work),
         "--matrix", "base,whole-graph"], check=False, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "using the shards in" in proc.stdout
    report = json.loads((work / "results" / "gpu_check.json").read_text())
    rows = {r["options"]: r for r in report["results"]}
    assert report["failures"] == [] and set(rows) == {"base", "fused+gpu-data+whole-graph"}
    loop, whole = rows["base"], rows["fused+gpu-data+whole-graph"]
    assert whole["epochs"] == loop["epochs"] == 2 and whole["train_samples"] == 72 and whole["batch_size"] == 32
    assert whole["heavy_modules_loaded"] == [] and loop["whole_step"] is None
    info = whole["whole_step"]
    assert info["batch_sizes"] == [32, 8] and info["graphs"] is False and info["compiled"] is False
    assert info["verify"]["match"] and info["verify"]["steps"] == 6
    cells = work / "results" / "cells"
    epochs = {name: json.loads((cells / name / "worker_result.json").read_text())["epochs"] for name in rows}
    for ours, theirs in zip(epochs["fused+gpu-data+whole-graph"], epochs["base"], strict=True):
        for key in ("train_loss", "train_accuracy", "eval_loss", "eval_accuracy", "learning_rate"):
            assert ours[key] == pytest.approx(theirs[key], abs=1e-5), key
    assert whole["final_test_accuracy"] == loop["final_test_accuracy"]
    assert sorted(p.name for p in (cells / "fused+gpu-data+whole-graph" / "checkpoints").glob("*.pt")) == \
        ["epoch-0001.pt", "epoch-0002.pt"]
    lines = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines() if line.startswith("| ")}
    header = [c.strip() for c in lines["options"].split("|")[1:-1]]
    assert header[-2:] == ["test acc", "step check"]
    cells_of = {name: [c.strip() for c in lines[name].split("|")[1:-1]] for name in rows}
    assert cells_of["fused+gpu-data+whole-graph"][-1].startswith("ok ") and cells_of["base"][-1] == "-"
    assert cells_of["fused+gpu-data+whole-graph"][-2] == f"{whole['final_test_accuracy']:.4f}"
    assert cells_of["base"][5] == f"~{loop['total_seconds']:.2f}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (graph capture)")
def test_captured_whole_step_matches_the_loop_step_on_cuda():
    from pipelines.training.graph_capture import GraphEval
    from pipelines.training.graph_step import verify_whole_step
    from pipelines.training.steps import eval_loader, evaluate

    model, config, data, order = _whole_step_case()
    model.cuda()
    device = torch.device("cuda", torch.cuda.current_device())
    data = tuple(t.to(device) for t in data)
    check = verify_whole_step(model, model, model, config, data, order, 8, device, steps=6, tolerance=1e-3)
    assert check["graphs"] is True and check["match"], check
    evaluator = GraphEval(model, data, 8, device)
    evaluator.prepare()
    assert evaluator.graphs  # one graph per batch size
    loss_sum, correct, count = evaluator.run()
    ref_loss, ref_correct, ref_count, _, _ = evaluate(model, eval_loader(TensorDataset(*data), 8), device)
    assert (correct, count) == (ref_correct, ref_count) and loss_sum == pytest.approx(ref_loss, rel=1e-3)
