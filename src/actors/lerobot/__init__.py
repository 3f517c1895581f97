"""lerobot: LeRobot v3.0 datasets. The asynchronous episode writer, one episode, the final
consolidation, the format, statistics, videos and the action layout; ``flaky_writer``, a Store
stage with injected disk faults that end-to-end tests name in pipelines run by real workers.

Imports the runtime (errors, the output store); nothing from datagen, except ``flaky_writer``,
which subclasses datagen's Store stage.

pyarrow and PyAV (about 75 ms of imports together) are imported in the functions that write,
read or encode, never as a module here loads: datagen's stage module imports the writer stage,
and a node's template imports that module for every worker it forks, before the first fork.
The writer stage's replicas import them in the background as they start (``DatasetDrafts``).
"""

__all__: list[str] = []
