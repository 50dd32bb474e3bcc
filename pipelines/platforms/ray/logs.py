"""What Ray's own processes print for a cell: one known-benign warning kept out of its log.

Ray Train starts a detached ``PlacementGroupCleaner`` actor beside each run's controller; it asks
Ray's State API every second whether the controller is alive, and that API is served by the
dashboard, which no cell starts (``include_dashboard=False``, ``--include-dashboard=false``). So
every check fails with "Failed to query Ray Train Controller actor state ... Continuing to
monitor": 121 times in a 14-cell cluster run, 22 in the smoke run, in cells that succeeded. The
hook below, run in every worker process of the cell's Ray job (``worker_process_setup_hook``),
drops exactly that message; everything else the cleaner says (a dead controller, a placement
group it removes or fails to) still reaches the cell's log.

What the cleaner cannot do without the State API is its job: remove a placement group whose
controller died without removing it. A cell's own cluster takes its groups with it; on a standing
cluster a controller killed mid-run leaves its group until the cluster restarts (the standing
cluster's cells then wait for resources and time out, with Ray's message naming the group).
"""

from __future__ import annotations

import logging

CLEANER_LOGGER = "ray.train.v2._internal.execution.controller.placement_group_cleaner"
BENIGN = "Failed to query Ray Train Controller actor state"
SETUP_HOOK = f"{__name__}.quiet_ray_internals"  # runtime_env["worker_process_setup_hook"]


class _DropBenign(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(BENIGN)


def quiet_ray_internals() -> None:
    """Ray's ``worker_process_setup_hook`` for the cell's job: the filter on the cleaner's logger."""
    logger = logging.getLogger(CLEANER_LOGGER)
    if not any(isinstance(f, _DropBenign) for f in logger.filters):
        logger.addFilter(_DropBenign())


def job_runtime_env(env_vars: dict[str, str]) -> dict:
    """The runtime env of a cell's Ray job: the workers' variables and the hook above.

    A driver's ``ray.init`` turns the hook's name into a variable of the workers' environment
    (Ray's ``export_setup_func_module``, which a worker reads at its start); a Ray Client driver's
    (``ray://``: the compose stack's cells) leaves that to its server, which does not do it, and the
    cleaner's warning came back (measured: 11 times in a one-epoch cell). Done here, the same for
    both: ``ray.init`` finds the variable already there, equal to the hook, and keeps it."""
    from ray._private.runtime_env.setup_hook import export_setup_func_module

    return export_setup_func_module({"env_vars": dict(env_vars), "worker_process_setup_hook": SETUP_HOOK},
                                    SETUP_HOOK)
