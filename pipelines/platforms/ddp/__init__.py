"""PyTorch DDP through torchrun: the reference platform every other is compared with.

``adapter.py`` launches the shared worker with torchrun on one host, on several nodes
(``engines.ddp``), or across the run's hosts (one torchrun per host, static rendezvous).
"""

from pydantic import BaseModel, ConfigDict

from pipelines.platforms.fields import deployment
from pipelines.platforms import Platform, register


class DDPSettings(BaseModel):
    """``engines.ddp``: several nodes (every node runs the same cell with its own node rank)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nnodes: int = deployment(1, flat="ddp_nnodes", ge=1)
    node_rank: int = deployment(0, flat="ddp_node_rank", ge=0)
    rdzv_endpoint: str | None = deployment(None, flat="ddp_rdzv_endpoint")  # host:port; None -> --standalone


PLATFORM = register(Platform(
    name="ddp", adapter=f"{__name__}.adapter:DDPBackend", order=0, label="PyTorch DDP (torchrun)",
    colour="#1d4ed8", settings=DDPSettings, reference=True, node_rank_setting="engines.ddp.node_rank",
    process_kinds=(("torchrun", "torchrun"), ("torch.distributed.run", "torchrun")),
    # torch is every platform's: DDP adds nothing to install; across machines a torchrun per
    # machine with the rendezvous settings (engines.ddp), started by whoever runs the job. It brings
    # no orchestration feature of its own as run here (--max-restarts 0: a failed attempt is the
    # project's to retry; torchrun's elastic restarts are not used yet)
))
