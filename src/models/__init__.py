"""models: the numerical models the actors use, in torch: pinhole cameras (``camera``), the
batched ray/box renderer (``raycast``), the causal video VAE (``video_vae``) and the
flow-matching world-action model (``world_model``). Modules and functions of tensors, no actors;
the only I/O is a VAE's ``save``/``load`` of its own checkpoint.

Imports torch and numpy; nothing from troupe.runtime, troupe.actors or troupe.cli.
"""
