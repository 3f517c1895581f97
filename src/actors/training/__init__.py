"""training: the trainer side of encoder offload (``inflight``: one rank's pipeline of bounded
in-flight batches, their sample groups encoded by encoder actors and reassembled by tag; its parts
``inflight_types``, ``inflight_dispatch`` and ``inflight_groups``), ranks
joining a torch.distributed group (``ranks``) and asynchronous checkpoints (``checkpoint``).

The rank itself (``trainer``: the actor a run driver starts per rank, with its config in
``train_config``, its request and state in ``rank_run`` and its model, data and train step in
``rank_session``), its data (``dataset``: clips of a LeRobot dataset or of a run still writing
one; ``sampler``: a sampler that resumes on any number of ranks), the run driver behind ``troupe
run configs/train.toml`` (``train_run``, with ``train_prepare``, ``train_cluster``,
``train_driver`` and its parts ``train_workers``, ``worker_moves`` and ``train_end``,
``train_datagen``, ``train_result`` and ``encoder_figures``) and the VAE's own training
(``vae_training``).

Imports the runtime's public API, torch and troupe.models; ``inflight``, ``ranks`` and
``checkpoint`` stay model-agnostic (a train step is given).
"""

__all__: list[str] = []
