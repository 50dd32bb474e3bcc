"""PyTorch DDP through torchrun: the reference platform every other is compared with.

``adapter.py`` launches the shared worker with torchrun on one host, on several nodes
(``engines.ddp``), or across the run's hosts (one torchrun per host, static rendezvous; with
``engines.ddp.elastic`` torchrun's elastic c10d rendezvous: a lost host's ranks are dropped and a
returning host is taken back in).
"""

from pydantic import BaseModel, ConfigDict, Field

from pipelines.platforms.fields import deployment
from pipelines.platforms import Platform, register


class DDPSettings(BaseModel):
    """``engines.ddp``: several nodes (every node runs the same cell with its own node rank)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nnodes: int = deployment(1, flat="ddp_nnodes", ge=1)
    node_rank: int = deployment(0, flat="ddp_node_rank", ge=0)
    rdzv_endpoint: str | None = deployment(None, flat="ddp_rdzv_endpoint")  # host:port; None -> --standalone
    # across the run's hosts: torchrun's elastic mode (--nnodes MIN:MAX, c10d rendezvous on the first
    # host, --max-restarts = matrix.platform_retries): a lost host's ranks are dropped and the others
    # go on from the last checkpoint at the smaller world size; a host that comes back is taken in again
    elastic: bool = False
    elastic_min_nodes: int = Field(1, ge=1)  # the fewest hosts the cell goes on with


def _remote_ranks(config) -> str | None:  # one torchrun per node, meeting at the rendezvous endpoint
    ddp = config.engine("ddp")
    return f"engines.ddp.rdzv_endpoint={ddp.rdzv_endpoint}" if ddp.nnodes > 1 and ddp.rdzv_endpoint else None


PLATFORM = register(Platform(
    name="ddp", remote_ranks=_remote_ranks, adapter=f"{__name__}.adapter:DDPBackend", order=0, label="PyTorch DDP (torchrun)",
    colour="#1d4ed8", settings=DDPSettings, reference=True, node_rank_setting="engines.ddp.node_rank",
    coordinator_note="torchrun's rendezvous store",
    retries_note="torchrun `--max-restarts`, elastic with `engines.ddp.elastic`",
    return_agent="elastic torchrun",  # a returning host's torchrun joins the c10d rendezvous again
    process_kinds=(("torchrun", "torchrun"), ("torch.distributed.run", "torchrun")),
    # torch is every platform's: DDP adds nothing to install; across machines a torchrun per
    # machine with the rendezvous settings (engines.ddp), started by whoever runs the job. It brings
    # no orchestration feature of its own by default (--max-restarts 0: a failed attempt is the
    # project's to retry); engines.ddp.elastic uses torchrun's elastic restarts across hosts
))
