"""The template a one-host run starts first: it checks the stage classes as it imports them.

A run checks its stage classes before it creates anything, so that a typo is one line and
``out`` stays as it was. That check imports every class in a child process, and the node's
template imports them all again for the replicas a moment later: on the default pipeline,
0.4 s and then 1 s, one after the other. Started first, the template does both: the run waits
for its check, and the node started next forks the replicas from it (``Node(template=)``).
Where the template cannot say (it did not start, or a module ended it while importing), the
child check runs as before and says why.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio

from troupe.runtime.core.loading import check_stage_actors, stage_checks
from troupe.runtime.errors import ConfigError
from troupe.runtime.node.template_link import TemplateLink

from .config import PipelineConfig

if TYPE_CHECKING:
    from troupe.template_prestart import Prestarted

__all__ = ["early_template"]


@asynccontextmanager
async def early_template(
    cfg: PipelineConfig, node: str, source: str, ahead: Prestarted | None = None
) -> AsyncIterator[TemplateLink]:
    """A template for ``cfg``'s stage classes, started and their check passed; stopped on the
    way out unless a node stopped it first.

    Args:
        cfg: the pipeline; its stages' classes are imported and checked.
        node: the name of the node that will fork from it (its log lines say so).
        source: where the pipeline came from, for the error.
        ahead: the template the command started ahead (``template_prestart``), taken over.

    Raises:
        ConfigError: as :func:`~troupe.runtime.core.loading.check_stage_actors`.
    """
    checks = stage_checks(cfg)
    link = TemplateLink(node, [s.actor for s in cfg.stages], checks=checks, ahead=ahead)
    failure: BaseException | None = None
    async with anyio.create_task_group() as tg:
        await link.start(tg)
        try:
            found = await link.checked()
            if found is None:  # the template could not check: the child says what went wrong
                await anyio.to_thread.run_sync(check_stage_actors, cfg, source)
            elif found.failure is not None:
                where, error = found.failure
                raise ConfigError(f"{source}: {where}: {error}")
            yield link
        except BaseException as exc:  # raised below as it is, not wrapped in this group's
            failure = exc
        finally:
            with anyio.CancelScope(shield=True):
                await link.stop()
    if failure is not None:
        raise failure
