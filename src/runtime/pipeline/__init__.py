"""pipeline: the pipeline engine (stages of replicas joined by bounded queues), its config, its
model (meters and the scaler, pure), its sources and the stage actor.

Imports core, node's config (shared config helpers), tasks' job specs (limits) and metrics (a
run's own endpoint, ``run_metrics``); nothing from supervision, chaos or testing.
"""

__all__: list[str] = []
