"""Which processes import an extension's library (torch) because a peer sent one of its values.

A worker (or a user's process) does, so that an actor that receives a tensor without importing
torch itself keeps working. The master, the node, the supervisor and a CLI client host no such
actor: one 16-byte "torch" value from any peer made the master import torch on its event loop
(a 4.7 s stall, some 190 MB for good), even for an actor it does not have. They refuse it as a
bad frame instead (docs/PROTOCOL.md, section 6.2).

Whether torch gets imported is seen in a fresh interpreter: this test process may have it already.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from troupe.cli import cli_runtime as cli_runtime_module
from troupe.runtime.node import node as node_module
from troupe.runtime.node.config import NodeConfig
from troupe.runtime.supervision import supervisor
from troupe.runtime.wire.codec import Codec

# A ready-made header (the fields of docs/PROTOCOL.md section 3) whose payload is a torch value.
_PRELUDE = """
import json, sys
import msgpack
from troupe.runtime.errors import BadFrame

def frames(buffers):
    torch_value = msgpack.ExtType(2, msgpack.packb(["torch", ["float32", [4]], 0]))
    header = msgpack.packb([1, 2, 1, 0, "a", "echo", "echo", None, None, None, torch_value])
    return [header, *([b"\\0" * 16] if buffers else [])]

def outcome(codec):
    said = []
    for buffers in (True, False):  # with its buffer frame, and alone (another decoding path)
        try:
            value = codec.decode(frames(buffers)).payload
            said.append(type(value).__module__ + "." + type(value).__name__)
        except BadFrame as exc:
            said.append(str(exc))
    return {"said": said, "torch_imported": "torch" in sys.modules}
"""


def _run(body: str, *args: str) -> dict[str, object]:
    code = textwrap.dedent(_PRELUDE) + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_master_refuses_a_torch_value_without_importing_torch(tmp_path: Path) -> None:
    """The master's own codec (as its ``_bind`` makes it) refuses the value in one line."""
    got = _run(
        """
        from pathlib import Path
        from troupe.runtime.tasks.master.journal_open import open_journal
        from troupe.runtime.tasks.master.master import Master
        from troupe.runtime.tasks.master.master_config import MasterConfig
        from troupe.runtime.transports.base import MemoryHub

        journal, book = open_journal(Path(sys.argv[1]), new=True)
        try:
            master = Master(MasterConfig(), journal, book, transport=MemoryHub().transport(name="m"))
            print(json.dumps(outcome(master._bind("inproc://unused").codec)))
        finally:
            journal.close()
        """,
        str(tmp_path / "journal.db"),
    )
    assert got["torch_imported"] is False
    refused, alone = got["said"]  # type: ignore[misc]
    assert refused == (
        "this process (master) does not take 'torch' values: only a worker imports an "
        "extension's library when one arrives (docs/PROTOCOL.md, section 6.2)"
    )
    assert alone == refused  # the header alone is refused before its buffer is looked for


def test_a_worker_codec_still_imports_torch_for_a_tensor() -> None:
    """A worker's codec (the default) imports the extension when its first value arrives."""
    got = _run(
        """
        from troupe.runtime.wire.codec import Codec

        print(json.dumps(outcome(Codec())))
        """
    )
    assert got["torch_imported"] is True
    tensor, alone = got["said"]  # type: ignore[misc]
    assert tensor == "torch.Tensor" and "points at no frame" in str(alone)


def test_an_extension_whose_library_is_imported_is_taken_everywhere() -> None:
    """Where torch is already imported (a run's own process), loading it costs milliseconds:
    even a master's codec takes the tensor."""
    got = _run(
        """
        import torch
        from troupe.runtime.wire.codec import Codec

        print(json.dumps(outcome(Codec(no_extension_imports="master"))))
        """
    )
    assert got["said"][0] == "torch.Tensor"  # type: ignore[index]


def test_the_node_the_supervisor_and_the_cli_import_no_extension_for_a_peer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Their codecs are made so (the runtime that would carry them is not built: no sockets)."""
    made: list[Codec] = []

    def runtime(*_: object, codec: Codec, **__: object) -> None:
        made.append(codec)

    monkeypatch.setattr(node_module, "process_runtime", runtime)
    monkeypatch.setattr(cli_runtime_module, "process_runtime", runtime)
    node_module.Node(NodeConfig(), handle_signals=False)._bind("tcp://127.0.0.1:47650")
    cli_runtime_module.cli_runtime()
    made.append(supervisor._codec())
    assert [c.no_extension_imports for c in made] == ["node", "CLI", "supervisor"]
