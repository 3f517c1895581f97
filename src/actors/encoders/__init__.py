"""encoders: the encoder actors of training (``encoder_actor``: a frozen video encoder serving
tagged sample groups), their two-level latent cache (``latent_cache``: memory, then local disk)
and ``light``, a light encoder for tests and benchmarks.

Imports the runtime's public API, and troupe.models (the VAE) when the default encoder is built.
"""

__all__: list[str] = []
