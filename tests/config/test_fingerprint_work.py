"""The config fingerprint follows the work: engine settings that change it (ZeRO stage and
offload, elastic groups, the emulated hosts' CPU share) part runs, but only for the platforms a
run trains and only where set, so existing runs keep their fingerprints."""

from __future__ import annotations

from pipelines.config import BenchmarkConfig, load_config
from pipelines.config.work import work_identity

# computed before engine settings entered the fingerprint: runs that set none keep these
DEFAULT_FINGERPRINT = "8028f3b1575d73a0"  # BenchmarkConfig(): every default platform
SMOKE_FINGERPRINT = "1e6d56ba5cf56420"  # load_config("smoke")


def _smoke(**overrides) -> BenchmarkConfig:
    return load_config("smoke", overrides)


def test_defaults_keep_the_fingerprint_they_had():
    assert BenchmarkConfig().fingerprint() == DEFAULT_FINGERPRINT
    assert _smoke().fingerprint() == SMOKE_FINGERPRINT
    # a default value written out is no setting: ZeRO-2 is the default stage
    assert _smoke(**{"engines.deepspeed.zero_stage": 2}).fingerprint() == SMOKE_FINGERPRINT


def test_zero_3_is_not_compared_with_zero_2():
    deepspeed = ["ddp", "deepspeed"]
    zero2 = _smoke(backends=deepspeed, **{"engines.deepspeed.zero_stage": 2})
    zero3 = _smoke(backends=deepspeed, **{"engines.deepspeed.zero_stage": 3})
    assert zero2.fingerprint() != zero3.fingerprint()
    assert work_identity(zero3)["engines.deepspeed.zero_stage"] == 3
    offload = _smoke(backends=deepspeed, **{"engines.deepspeed.offload": "optimizer"})
    assert offload.fingerprint() not in (zero2.fingerprint(), zero3.fingerprint())
    # what a cell trains, its checkpoint's identity, is the same: the stage changes how, not what
    assert zero2.training_identity() == zero3.training_identity()


def test_settings_of_a_platform_the_run_does_not_train_change_nothing():
    ddp = _smoke(backends=["ddp"]).fingerprint()
    for stage in (1, 2, 3):  # a ddp-only run: its fingerprint does not follow the ZeRO stage
        assert _smoke(backends=["ddp"], **{"engines.deepspeed.zero_stage": stage}).fingerprint() == ddp
    assert _smoke(backends=["ddp"], **{"engines.ray.elastic_min_workers": 1}).fingerprint() == ddp


def test_elastic_settings_a_per_job_variant_and_the_hosts_cpu_share_count():
    for backend in ("ray", "ray_per_job"):  # the per-job variant reads engines.ray too
        assert _smoke(backends=[backend], **{"engines.ray.elastic_min_workers": 1}).fingerprint() != \
            _smoke(backends=[backend]).fingerprint(), backend
    ddp = _smoke(backends=["ddp"]).fingerprint()
    assert _smoke(backends=["ddp"], **{"engines.ddp.elastic": True}).fingerprint() != ddp
    assert _smoke(**{"cluster.cpu_per_host": 0.5}).fingerprint() != SMOKE_FINGERPRINT


def test_where_a_platform_connects_stays_out():
    """Deployment fields (masters, addresses, node ranks) are where the run is, not what it does."""
    moved = _smoke(backends=["ddp", "spark", "ray"], **{"engines.spark.master": "spark://h:7077",
                                                       "engines.ray.address": "auto",
                                                       "engines.ddp.nnodes": 2})
    assert moved.fingerprint() == _smoke(backends=["ddp", "spark", "ray"]).fingerprint()
