"""CURVE as metric families: whether this process authenticates its peers, whether it listens
without keys by ``--insecure``, and the peers its authenticator refused (unauthorised keys and
failed handshakes; the counts of this process's own sockets)."""

from __future__ import annotations

from troupe.runtime.security.process import security_status

from .families import Families, number

__all__ = ["security_families"]


def security_families(f: Families, insecure: bool) -> None:
    """Add the process's security families to ``f``; ``insecure`` as its config says."""
    status = security_status(insecure)
    f.gauge(
        "troupe_curve_enabled",
        "1 when every socket of the process uses CURVE keys.",
        float(bool(status["curve"])),
    )
    f.gauge(
        "troupe_insecure",
        "1 when the process listens off loopback without keys (--insecure).",
        float(bool(status["insecure"])),
    )
    refused = number(status, "refused_peers")
    if refused is not None:
        f.counter("troupe_refused_peers_total", "Peers the CURVE authenticator turned away.", refused)
