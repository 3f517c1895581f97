"""Trainer ranks on two hosts form their gloo group (report dt 1).

Two network namespaces (tests/support/netns.py) are two hosts whose host name resolves to
loopback, as Debian and Ubuntu map it (``127.0.1.1 host``) and as a namespace sees this
machine's own name: gloo, left to derive its address from the host name, gave its peer
127.0.0.1, and the rank on the other host connected to its own loopback until the group timed
out; every restart of a training run failed the same way. Each host runs one rank of
tests/actors/training/test_ranks.py (3 DDP steps, a checkpoint of both ranks at step 2) with
rank 0's address as ``MASTER_ADDR``.

Skipped, saying why, only where namespaces cannot be made (not root, no ``ip``, a kernel that
refuses). The ranks are killed by their pids whatever happens, then the namespaces deleted.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from support.netns import lan, netns_unavailable
from support.rank_processes import run_ranks
from troupe.actors.training.checkpoint import checkpoint_path, latest, verify

_WHY_NOT = netns_unavailable()
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")]

TESTS_DIR = Path(__file__).resolve().parents[1]
RANK_SCRIPT = TESTS_DIR / "actors" / "training" / "test_ranks.py"
RENDEZVOUS_PORT = 45901  # in its own namespace: nothing else listens there
# A bound on the ranks' exits, which the test polls for (not a speed bound): each imports torch
# first, 68 s of the 90 this was on a loaded two-core box, and was killed in its teardown after
# its checkpoint. Under the test's pytest timeout, so the ranks' logs are reported.
CHILD_TIMEOUT_S = 240


@pytest.mark.timeout(CHILD_TIMEOUT_S + 60)
def test_ranks_on_two_hosts_form_their_group_and_checkpoint(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "MASTER_PORT": str(RENDEZVOUS_PORT),
        "WORLD_SIZE": "2",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")])),
    }
    env.pop("GLOO_SOCKET_IFNAME", None)  # the ranks find their interface themselves
    logs = [tmp_path / f"rank{r}.log" for r in range(2)]
    with lan(2, tag="r") as net:
        env["MASTER_ADDR"] = net.hosts[0].address
        codes = run_ranks(
            [sys.executable, str(RANK_SCRIPT), str(tmp_path)],
            env,
            logs,
            CHILD_TIMEOUT_S,
            hosts=[host.command for host in net.hosts],
        )
    assert codes == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)
    # Both ranks' parts of the checkpoint (the namespaces share this file system), committed.
    assert latest(tmp_path) == checkpoint_path(tmp_path, 2)
    verify(checkpoint_path(tmp_path, 2))
