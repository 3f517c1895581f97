"""``troupe bench messaging --curve``: the same figures with CURVE on both sides, as ratios."""

from __future__ import annotations

import pytest

from support.bench_cli import bench_json

pytestmark = pytest.mark.e2e


def test_bench_messaging_with_curve_reports_every_figure_against_its_curve_ceiling() -> None:
    """A quick, single-run pass: this checks the command, not the machine's speed."""
    fig = bench_json("messaging", "--quick", "--repeat", "1", "--curve", timeout=300)
    assert fig["curve"] is True and fig["runs"] == 1
    for key in ("tell_small", "tell_large", "ask1", "ask64"):
        raw, troupe = fig[f"raw_{key}_per_s"], fig[f"troupe_{key}_per_s"]
        assert raw > 0 and troupe > 0
        assert fig[f"{key}_ratio"] == pytest.approx(troupe / raw)
    # speed is the benchmark's figure, not a test's bound
    assert fig["startup_s"] > 0 and fig["idle_processes"] == 4 and type(fig["idle_processes"]) is int


def test_the_raw_ceiling_really_uses_curve() -> None:
    """A raw CURVE sink admits the bench's client pair, and a plain client gets nothing through."""
    import multiprocessing as mp

    import zmq

    from troupe.cli.bench.raw import raw_one_way

    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    assert raw_one_way(200, "small", (server_public, server_secret, client_public, client_secret)) > 0
    with zmq.Context() as ctx, ctx.socket(zmq.ROUTER) as sink, ctx.socket(zmq.DEALER) as plain:
        sink.curve_publickey, sink.curve_secretkey, sink.curve_server = server_public, server_secret, True
        port = sink.bind_to_random_port("tcp://127.0.0.1")
        plain.setsockopt(zmq.LINGER, 0)
        plain.connect(f"tcp://127.0.0.1:{port}")
        try:
            plain.send(b"x", zmq.NOBLOCK)
        except zmq.Again:  # the failed handshake already dropped the pipe: nothing can go
            pass
        assert not sink.poll(500)  # refused at the handshake (waits a bounded moment; no speed bound)
    assert mp.active_children() == []
