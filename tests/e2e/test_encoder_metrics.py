"""An encoder actor in a real worker encodes the same group of two twice; the node's ``/metrics``
shows its latent cache per tier, sample by sample (two misses in each, then two memory hits),
its bytes within their bounds, and what it encoded, as the actor figures of docs/METRICS.md."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from support.encoder_workers import encoder_worker
from troupe.runtime.testing.plugin import free_endpoint

pytestmark = pytest.mark.e2e


def _config(metrics: str, cache: Path) -> str:
    """A node serving ``/metrics`` at ``metrics``, with the encoder actor ``encode`` caching in
    4 MB of memory and 4 MB of disk under ``cache``."""
    node = f'[node]\nmetrics = "{metrics}"\n'
    return node + encoder_worker("encode", memory_mb=4, disk_mb=4, cache_dir=str(cache))


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _scrape(address: str) -> Samples:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _figures(samples: Samples) -> dict[str, float]:
    """The encode actor's figures by name (counters with their ``_total``)."""
    out = {}
    for (metric, labels), value in samples.items():
        ls = dict(labels)
        if ls.get("actor") != "encode" or ls.get("worker") != "w-encode":
            continue
        if metric == "troupe_actor_counter_total":
            out[f"{ls['name']}_total"] = value
        elif metric == "troupe_actor_gauge":
            out[ls["name"]] = value
    return out


def _scrape_until(address: str, wanted: dict[str, float], timeout: float = 30.0) -> dict[str, float]:
    """The figures once they include ``wanted`` (a bounded poll: the encode runs in the worker)."""
    deadline = time.monotonic() + timeout
    figures: dict[str, float] = {}
    while time.monotonic() < deadline:
        figures = _figures(_scrape(address))
        if all(figures.get(name) == value for name, value in wanted.items()):
            return figures
        time.sleep(0.1)
    raise AssertionError(f"the node's metrics never showed {wanted}; last: {figures}")


async def test_cache_hits_per_tier_on_the_nodes_metrics(troupe_cluster: Any, tmp_path: Path) -> None:
    metrics = free_endpoint().removeprefix("tcp://")
    cluster = troupe_cluster(_config(metrics, tmp_path / "latents"))
    video = torch.randint(
        0, 256, (2, 3, 4, 16, 16), generator=torch.Generator().manual_seed(1), dtype=torch.uint8
    )
    _scrape_until(metrics, {"cache_lookups_total": 0, "cache_memory_hit_rate": 0})
    async with cluster.client() as rt:
        first = await rt.ref("encode").ask("encode", {"tag": 0, "video": video}, timeout=60)
        second = await rt.ref("encode").ask("encode", {"tag": 1, "video": video}, timeout=60)
    assert first["cached"] is False and second["cached"] is True

    figures = _scrape_until(metrics, {"cache_memory_hits_total": 2})
    assert figures["cache_memory_misses_total"] == 2
    assert figures["cache_disk_hits_total"] == 0 and figures["cache_disk_misses_total"] == 2
    assert figures["cache_lookups_total"] == 4 and figures["cache_memory_hit_rate"] == 0.5
    assert figures["cache_disk_hit_rate"] == 0 and figures["cache_corrupt_total"] == 0
    assert figures["groups_total"] == 2 and figures["samples_total"] == 4
    assert figures["groups_encoded_total"] == 1 and figures["samples_encoded_total"] == 2
    assert figures["encode_seconds_total"] > 0
    assert figures["cache_memory_limit_bytes"] == 4 * 2**20 == figures["cache_disk_limit_bytes"]
    latents = first["latents"]
    assert figures["cache_memory_bytes"] == latents.numel() * latents.element_size()
    assert 0 <= figures["cache_disk_bytes"] <= figures["cache_disk_limit_bytes"]
