"""The data stage's engine owns its run service (``pipelines.engines``): the embedded Spark cluster is
started at set-up from the engine's declaration, whatever platforms are installed, and a platform that
trains on the engine lists the same service (one cluster, not two)."""

from __future__ import annotations

from pipelines import engines, platforms
from pipelines.config import load_config
from pipelines.run import services


def test_the_engines_service_is_declared_without_any_platform_on_it():
    engine_services = engines.services()
    assert engine_services, "the Spark engine declares its embedded cluster"
    users = [p for p in platforms.all_platforms() if set(engine_services) & set(p.services)]
    assert users, "the Spark platforms use the engine's cluster as their standing one"
    for platform in users:
        platforms.unregister(platform.name)
    try:
        declared = services.declared()
        assert set(engine_services) <= set(declared)
        embedded, local = load_config("smoke", {"spark_master": "embedded"}), load_config("smoke", {"spark_master": "local[2]"})
        service = declared[engine_services[0]]
        assert service.at_setup(embedded) and not service.at_setup(local)
    finally:
        for platform in users:
            platforms.register(platform, platform.package)
    assert [p.name for p in platforms.all_platforms() if set(engine_services) & set(p.services)] == [p.name for p in users]
    assert list(services.declared()).count(engine_services[0]) == 1  # listed by the engine and its platforms: once
