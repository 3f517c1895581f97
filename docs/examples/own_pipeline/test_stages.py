import json
from pathlib import Path

from troupe import run_pipeline

PIPELINE = Path(__file__).with_name("pipeline.toml")


async def test_every_item_is_stored_once_and_indexed(troupe_cluster, tmp_path):
    cluster = troupe_cluster("")  # a node of its own; it imports `stages` from this folder
    result = await cluster.run_pipeline(PIPELINE, tmp_path / "out", items=20)
    counts = result.counts()
    assert counts["ok"] + counts["pruned"] == 20 and counts["dead"] == 0
    index = json.loads((tmp_path / "out" / "signals" / "index.json").read_text())
    assert sorted(result.outputs) == index["items"]

    again = await run_pipeline(PIPELINE, tmp_path / "out", items=20, node=cluster.endpoint)
    assert again.already_complete  # a finished run is not run again
