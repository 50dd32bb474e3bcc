"""DeepSpeed: the shared loop with DeepSpeed's engine (ZeRO) doing backward and the optimizer step,
its ranks started by DeepSpeed's own launcher (the ``deepspeed`` command).

``adapter.py`` launches a cell on one host (``deepspeed --num_gpus N``) or across the run's hosts
(a hostfile and one ``deepspeed --no_ssh --node_rank k`` per host); ``worker.py`` is the
training process (its ``Distributed`` seam, ZeRO-3's runtime), ``engine.py`` the engine and the
DeepSpeed config built from the cell.

How much ZeRO shards is this platform's own setting, ``engines.deepspeed.zero_stage`` (1: optimizer
state, 2: + gradients, 3: + parameters), with ``engines.deepspeed.offload`` (ZeRO-Offload of the
optimizer state, and at stage 3 of the parameters too, to host memory). They are not training
strategies: a strategy (``matrix.strategies``) is what every platform runs through the shared
loop (DDP comm hooks, local SGD, FSDP, class imbalance), while ZeRO is DeepSpeed's own way of
reducing gradients; DeepSpeed refuses the DDP-only strategies instead (``strategy_refusal``).
A run trains one ZeRO stage; a stage per run (``--set engines.deepspeed.zero_stage=3``, or the
trigger form's overrides) compares them, and the result says which one (``platform_mode``).
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipelines.platforms import Platform, register

OFFLOADS = ("none", "optimizer", "optimizer+parameters")


class DeepSpeedSettings(BaseModel):
    """``engines.deepspeed``: the ZeRO stage and what ZeRO-Offload moves to host memory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # 1: optimizer state partitioned over the ranks; 2: + gradients; 3: + parameters
    zero_stage: int = Field(2, ge=1, le=3)
    # "optimizer": optimizer state and step on the CPU (ZeRO-Offload); "optimizer+parameters": the
    # parameters too (ZeRO-3 only)
    offload: Literal["none", "optimizer", "optimizer+parameters"] = "none"

    @model_validator(mode="after")
    def _offload_fits_the_stage(self) -> "DeepSpeedSettings":
        if self.offload == "optimizer+parameters" and self.zero_stage != 3:
            raise ValueError(f"offload={self.offload!r} needs zero_stage=3 (only ZeRO-3 partitions the "
                             f"parameters, so only it can offload them); got zero_stage={self.zero_stage}")
        return self

    @property
    def mode(self) -> str:
        """``zero<stage>`` with the offload, e.g. ``zero3-offload-optimizer``: the result's mode."""
        suffix = "" if self.offload == "none" else "-offload-" + self.offload.replace("+", "-")
        return f"zero{self.zero_stage}{suffix}"


_OFFLOAD_CAVEAT = ("ZeRO-Offload keeps the optimizer state in host memory and runs its step on the CPU: on a GPU "
                   "host it trades PCIe copies and CPU time for GPU memory; on a CPU-only host there is nothing "
                   "to offload from, so the cell measures the offload path's bookkeeping, not a memory saving.")


def _caveats() -> dict[str, str]:
    """The report's caveat of every mode with an offload (local and across hosts)."""
    out = {}
    for stage in (1, 2, 3):
        for offload in OFFLOADS[1:]:
            if offload == "optimizer+parameters" and stage != 3:
                continue
            mode = DeepSpeedSettings(zero_stage=stage, offload=offload).mode
            out[mode] = _OFFLOAD_CAVEAT
            for hosts in range(2, 9):
                out[f"{mode}-{hosts}-hosts"] = _OFFLOAD_CAVEAT
    return out


PLATFORM = register(Platform(
    name="deepspeed", adapter=f"{__name__}.adapter:DeepSpeedBackend", order=40, label="DeepSpeed (ZeRO)",
    colour="#0891b2", settings=DeepSpeedSettings, mode_caveats=_caveats(),
    # its cell takes 32-49 s at ZeRO-2 on the smoke's data against ddp's 21-27 s (bench/RESULTS.md):
    # the smoke DAG run would pass its 150 s goal; the nightly and named runs train it
    smoke=False,
    distributions=("deepspeed",),
    cluster_files=("hostfile: one line per machine, 'host slots=N' (written from cluster.hosts here)",),
    features={"fault tolerance": (
        "a failed attempt resumes from DeepSpeed's own checkpoint (every rank's shard; the project's retry "
        "relaunches it)", "tests/platforms/deepspeed/test_deepspeed.py::test_a_failed_attempt_resumes_from_deepspeeds_checkpoint")},
    # the ranks are known by their pid files; these are DeepSpeed's launcher processes
    process_kinds=(("deepspeed.launcher.runner", "deepspeed_runner"), ("bin/deepspeed", "deepspeed_runner"),
                   ("deepspeed.launcher.launch", "deepspeed_launch")),
))
