"""Relay: a platform defined in this folder only (declaration here, ``adapter.py``, ``worker.py``).

It is how a fifth platform plugs in: nothing outside this folder names it. A run loads it with
``BENCHMARK_PLATFORMS=tests.platforms.relay`` (the registry imports the modules listed there),
or a process imports this package; its ranks find it through ``CellSpec.platform_modules``.
"""

from pydantic import BaseModel, ConfigDict

from pipelines.platforms import Platform, register

CAVEAT = "Torchrun started by the test platform itself: it measures the shared loop alone."


class RelaySettings(BaseModel):
    """``engines.relay``: one setting its preflight reads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_workers: int = 4


PLATFORM = register(Platform(
    name="relay", adapter=f"{__name__}.adapter:RelayBackend", label="Relay (a test platform)", colour="#0f766e",
    settings=RelaySettings, mode_caveats={"relay-local": CAVEAT}, study_overhead=0.5,
    process_kinds=(("tests.platforms.relay.worker", "relay_rank"),),
), package=__name__)
