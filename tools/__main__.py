"""``python -m troupe.cli`` runs the ``troupe`` command, as ``python -m troupe`` does."""

import runpy

runpy.run_module("troupe.__main__", run_name="__main__")
