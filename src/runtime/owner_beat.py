"""A cluster run's beat to the master, which vouches for the run to the nodes of its workers.

A node stops the workers of a run that is gone (``node/spawn_owners.py``). It cannot ping a run
that listens on another host's loopback (every cluster run off the node's host): such a run
names itself ``master:<token>`` as its workers' owner, and beats to the master every
``OWNER_BEAT_S`` while its workers run, so that a node asks the master instead. Only a run whose
first beat the master took names itself so: a node would take an owner the master never heard of
for one gone. A beat that fails (the master restarting) is logged and tried again next time.

A pipeline's run beats for its replicas, a training run for its ranks and encoders (hence here,
not in ``pipeline``; ``owned_controls.spawn_owner`` picks the owner a spawn names).
"""

from __future__ import annotations

import uuid

import anyio

from troupe.runtime.core.runtime import Runtime
from troupe.runtime.errors import TroupeError
from troupe.runtime.library_logging import get_logger
from troupe.runtime.node.spawn_owners import MASTER_OWNER, OWNER_BEAT_S

__all__ = ["OwnerBeat"]

log = get_logger(__name__)

_BEAT_TIMEOUT_S = 5.0


class OwnerBeat:
    """The run's token (``master:<hex>``) and its beat to ``master``.

    Attributes:
        token: what the run's spawn requests name as the workers' owner.
        vouched: the master took a beat: nodes may ask it about ``token``.
    """

    def __init__(self, runtime: Runtime, master: str, worker_id: str | None = None) -> None:
        self.runtime = runtime
        self.master = master
        # The run's worker id at the master where it has one (a job's run): another run of the
        # job asks after it by that name too (master_job._other_runs).
        self.token = f"{MASTER_OWNER}{worker_id or uuid.uuid4().hex}"
        self.vouched = False

    async def run(self) -> None:
        """Beat every ``OWNER_BEAT_S`` until cancelled (the run's workers are stopped then);
        the first, before the first worker is asked for, is :meth:`beat` itself."""
        while True:
            await anyio.sleep(OWNER_BEAT_S)
            await self.beat()

    async def beat(self) -> None:
        """Tell the master the run is there (``vouched`` once it took one)."""
        try:
            beat = {"owner": self.token}
            await self.runtime.control(self.master, "owner_beat", beat, timeout=_BEAT_TIMEOUT_S)
        except TroupeError as exc:  # restarting: the nodes give the run OWNER_SILENT_S
            log.info("owner_beat_failed", master=self.master, error=str(exc))
            return
        self.vouched = True
