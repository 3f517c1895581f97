"""codecs: codec extensions for payload types the runtime does not know (torch tensors), found
through the ``troupe.codecs`` entry point.

Imports troupe.runtime.lowlevel only.
"""

__all__: list[str] = []
