"""Phases add up, for every platform on this host (draft)."""

from __future__ import annotations

import pytest

from pipelines.training import phases

pytestmark = pytest.mark.slow


def _report(result) -> str:
    gap = phases.unattributed(result.phases, result.total_seconds)
    parts = ", ".join(f"{k} {v:.3f}" for k, v in result.phases.items())
    return (f"{result.backend}-w{result.world_size}: total {result.total_seconds:.3f} s, phases {parts}; "
            f"unattributed {gap:+.3f} s ({gap / result.total_seconds:+.2%})")


@pytest.mark.parametrize("backend", ["ddp", "spark", "determined", "ray_per_job", "deepspeed"])
def test_probe(trained, backend):
    result = trained(backend, 2)
    assert result.status == "ok", result.error
    print("\nPHASES", _report(result))
