"""training: the trainer side of encoder offload (``inflight``: one rank's pipeline of bounded
in-flight batches, their sample groups encoded by encoder actors and reassembled by tag), ranks
joining a torch.distributed group (``ranks``) and asynchronous checkpoints (``checkpoint``).

Imports the runtime's public API and torch; never the models (a train step is given).
"""

__all__: list[str] = []
