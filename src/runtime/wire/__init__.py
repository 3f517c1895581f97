"""wire: the codec (envelopes to frames and back, every received frame validated), batch
frames (several messages in one) and error replies.

Imports troupe.runtime.errors only.
"""

__all__: list[str] = []
