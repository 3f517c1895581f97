"""lerobot: LeRobot v3.0 datasets. The asynchronous episode writer, one episode, the final
consolidation, the format, statistics, videos and the action layout; ``flaky_writer``, a Store
stage with injected disk faults that end-to-end tests name in pipelines run by real workers.

Imports the runtime (errors, the output store); nothing from datagen, except ``flaky_writer``,
which subclasses datagen's Store stage.
"""

__all__: list[str] = []
