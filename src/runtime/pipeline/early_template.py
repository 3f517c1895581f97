"""The template a one-host run starts first: it checks the stage classes as it imports them.

A run checks its stage classes before it creates anything, so that a typo is one line and
``out`` stays as it was. That check imports every class in a child process, and the node's
template imports them all again for the replicas a moment later: on the default pipeline,
0.4 s and then 1 s, one after the other. Started first, the template does both: the run waits
for its check, and the node started next forks the replicas from it (``Node(template=)``).
Where the template cannot say (it did not start, or a module ended it while importing), the
child check runs as before and says why; a Ctrl-C kills that child. A template still importing
after its ``ready_s`` (two minutes) is the error itself, naming the class or module it was
importing (the template names each before its import): a child would hang in it the same way.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio

from troupe.runtime.core.loading import check_stage_actors_async, stage_checks
from troupe.runtime.errors import ConfigError
from troupe.runtime.node.template_link import READY_S, TemplateLink

from .config import PipelineConfig
from .handoff import OUTBOX_CLASS

if TYPE_CHECKING:
    from troupe.runtime.core.loading import Check
    from troupe.template_prestart import Prestarted

__all__ = ["OnImporting", "early_template"]

# Told, about every second until the classes are checked, what the template imports now (None
# once it imports nothing more, or when it said nothing yet) and the seconds since it started.
OnImporting = Callable[[str | None, float], None]
_TICK_S = 1.0


@asynccontextmanager
async def early_template(
    cfg: PipelineConfig,
    node: str,
    source: str,
    ahead: Prestarted | None = None,
    on_importing: OnImporting | None = None,
    ready_s: float = READY_S,
    installed_only: bool = False,
) -> AsyncIterator[TemplateLink]:
    """A template for ``cfg``'s stage classes, started and their check passed; stopped on the
    way out unless a node stopped it first.

    Args:
        cfg: the pipeline; its stages' classes are imported and checked.
        node: the name of the node that will fork from it (its log lines say so).
        source: where the pipeline came from, for the error.
        ahead: the template the command started ahead (``template_prestart``), taken over.
        on_importing: told what the template imports while the run waits for it (``OnImporting``).
        ready_s: how long one template's imports may take.
        installed_only: check only the classes whose module is found here (a run on
            a cluster's nodes, whose ``ahead`` template only checks: ``loading.installed_here``).

    Raises:
        ConfigError: as :func:`~troupe.runtime.core.loading.check_stage_actors`, or an import
            still going after ``ready_s`` (it would hang every replica the same way).
    """
    checks = stage_checks(cfg)
    started = time.monotonic() if ahead is None else ahead.started
    # The replicas' classes: each stage's, and with the direct data plane the outbox beside it.
    outbox = [OUTBOX_CLASS] if cfg.data_plane == "direct" else []
    link = TemplateLink(
        node,
        [*(s.actor for s in cfg.stages), *outbox],
        checks=checks,
        ahead=ahead,
        ready_s=ready_s,
        installed_only=installed_only,
    )
    failure: BaseException | None = None
    try:
        async with anyio.create_task_group() as tg:
            await link.start(tg)
            try:
                async with anyio.create_task_group() as watching:
                    if on_importing is not None:
                        watching.start_soon(_tell_importing, link, on_importing, started)
                    found = await link.checked()
                    watching.cancel_scope.cancel()
                if found is None and link.stuck is not None:
                    raise ConfigError(_stuck_message(source, checks, link.stuck, link.ready_s))
                if found is None:  # the template could not check: the child says what went wrong
                    await check_stage_actors_async(cfg, source, installed_only=installed_only)
                elif found.failure is not None:
                    where, error = found.failure
                    raise ConfigError(f"{source}: {where}: {error}")
                # Checked by its light sibling, the template may still import what the classes
                # preload: one that hangs there stops the run as a hang in a class would.
                tg.start_soon(_refuse_if_stuck, link, source, checks)
                yield link
            except BaseException as exc:  # raised below as it is, not wrapped in this group's
                failure = exc
            finally:
                with anyio.CancelScope(shield=True):
                    await link.stop()
    except* ConfigError as group:  # the template stuck in a preload (_refuse_if_stuck)
        raise group.exceptions[0] from None
    if failure is not None:
        raise failure


async def _refuse_if_stuck(link: TemplateLink, source: str, checks: list[Check]) -> None:
    """Once the first template is ready or given up: a ConfigError if it was given up in an
    import (of what a class preloads, its light sibling having checked the classes)."""
    await link.settled()
    if link.stuck is not None:
        raise ConfigError(_stuck_message(source, checks, link.stuck, link.ready_s))


async def _tell_importing(link: TemplateLink, on_importing: OnImporting, started: float) -> None:
    while True:
        await anyio.sleep(_TICK_S)
        on_importing(link.importing, time.monotonic() - started)


def _stuck_message(source: str, checks: list[Check], stuck: str, ready_s: float) -> str:
    """A template given up on in an import: which stage's class (or what a class preloads)."""
    fields = [c[0] for c in checks if stuck in (c[1], c[1].partition(":")[0])]
    where = fields[0] if fields else "stages' classes"
    what = "" if fields else f" ({stuck!r} is a module a stage's class preloads)"
    return (
        f"{source}: {where}: importing {stuck!r} took over {ready_s:g} s{what}; a module that "
        "hangs while it imports (a lock, a network call, input()) would hang every replica"
    )
