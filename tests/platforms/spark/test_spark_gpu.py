"""Spark on a GPU host: the resources TorchDistributor(use_gpu=True) needs, checked on this CPU
machine with a discovery script that reports two fake GPU addresses (real Spark, real
TorchDistributor; the GPU run itself happens on a GPU machine)."""

from __future__ import annotations

import json
import subprocess

import pytest

from pipelines.platforms.spark.distributor import DISCOVERY_SCRIPT, gpu_conf

pytestmark = pytest.mark.slow


@pytest.fixture
def fake_discovery(tmp_path):
    script = tmp_path / "fake_gpus.sh"
    script.write_text('#!/usr/bin/env bash\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n')
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def session():
    from pipelines.engines.spark.session import get_spark, stop_spark

    def start(conf: dict[str, str]):
        return get_spark("local[2]", app_name="gpu-conf", conf=conf, fresh=True)

    yield start
    stop_spark(jvm=True)  # py4j's gateway JVM too: nothing of this test beside later cells


def test_gpu_conf_local_gives_the_driver_its_gpus_cluster_one_per_task(fake_discovery):
    assert gpu_conf(True, 2, fake_discovery) == {
        "spark.driver.resource.gpu.amount": "2", "spark.driver.resource.gpu.discoveryScript": fake_discovery}
    assert gpu_conf(False, 8, fake_discovery) == {
        "spark.executor.resource.gpu.amount": "1", "spark.task.resource.gpu.amount": "1",
        "spark.executor.resource.gpu.discoveryScript": fake_discovery}
    assert gpu_conf(True, 1)["spark.driver.resource.gpu.discoveryScript"] == str(DISCOVERY_SCRIPT)


def test_shipped_discovery_script_prints_what_spark_parses(tmp_path):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text("#!/usr/bin/env bash\nprintf '0\\n1\\n2\\n'\n")
    (fake_bin / "nvidia-smi").chmod(0o755)
    out = subprocess.run(["bash", str(DISCOVERY_SCRIPT)], capture_output=True, text=True, check=True,
                         env={"PATH": f"{fake_bin}:/usr/bin:/bin"}).stdout
    assert json.loads(out) == {"name": "gpu", "addresses": ["0", "1", "2"]}


def test_torchdistributor_local_mode_accepts_the_driver_gpus(session, fake_discovery, monkeypatch):
    from pyspark.ml.torch.distributor import TorchDistributor

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    spark = session({})
    with pytest.raises(RuntimeError, match="GPUs were unable to be found on the driver"):
        TorchDistributor(num_processes=2, local_mode=True, use_gpu=True)  # what happened before

    spark = session(gpu_conf(True, 2, fake_discovery))
    assert spark.sparkContext.resources["gpu"].addresses == ["0", "1"]
    assert TorchDistributor(num_processes=2, local_mode=True, use_gpu=True).num_tasks == 2


def test_torchdistributor_cluster_mode_accepts_one_gpu_per_task(session, fake_discovery):
    from pyspark.ml.torch.distributor import TorchDistributor

    session({})
    with pytest.raises(RuntimeError, match="spark.task.resource.gpu.amount' was unset"):
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=True)
    spark = session(gpu_conf(False, 2, fake_discovery))
    assert spark.conf.get("spark.task.resource.gpu.amount") == "1"
    assert TorchDistributor(num_processes=2, local_mode=False, use_gpu=True).num_tasks == 2
