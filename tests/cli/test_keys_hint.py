"""What a command says when a peer that listens never answers: CURVE on one side only, or keys
of another cluster, are silence too, and only a keyed peer logs ``peer_refused``."""

from __future__ import annotations

import pytest

from troupe.cli import master_client


def test_a_command_with_keys_is_told_the_peer_may_run_without_any(monkeypatch: pytest.MonkeyPatch) -> None:
    """A keyed operator against a master without keys was sent to its log for a refusal it never
    logs; the hint names that case and its fix first."""
    monkeypatch.setattr(master_client, "installed", lambda: object())  # this command runs with keys
    hint = master_client.keys_hint()
    assert "it runs without CURVE keys: drop --keys" in hint
    assert "not authorised there" in hint


def test_a_command_without_keys_is_told_a_keyed_cluster_needs_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(master_client, "installed", lambda: None)
    assert master_client.keys_hint() == "; a cluster with CURVE keys answers only with --keys DIR"
