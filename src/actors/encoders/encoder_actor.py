"""The encoder actor: a stateless host of one frozen video encoder, with the latent cache.

Each ``encode`` ask carries one sample group and is answered as soon as that group is encoded
(or found in the cache), so a trainer keeps many asks in flight and reassembles its batches by
tag, never waiting for a whole batch. The cache holds one entry per sample, not per group: the
sampler pairs a clip with other clips every epoch, so an entry for the whole group almost never
came back (74 of 80 groups encoded where 22 clips were seen 7 times each). The samples no tier
holds are encoded together, as one batch, and cached one by one: a hit is what encoding the
sample again gives to float32 rounding, as a convolution rounds a batch of one otherwise than a
larger one (README, Decisions; encoding each alone, bit for bit, took 4 times as long). Config::

    [[workers]]
    name = "w-encode-0"

    [[workers.actors]]
    name = "encode-0"
    class = "troupe.actors.encoders.encoder_actor:EncoderActor"
    kwargs = { weights = "vae.pt", memory_mb = 512, disk_mb = 8192, cache_dir = "/var/cache/latents" }

Short encodes (under ``inline_below_ms``, the last one's time) run on the actor's event loop,
longer ones on a worker thread, so the loop keeps serving meanwhile; with no cache tier
(``memory_mb = 0`` and no disk tier), no cache key is computed.

``encode`` payload: ``{"tag": any, "video": tensor or ndarray (B, C, T, H, W), "params": {...}}``:
uint8 frames are mapped to [-1, 1] here (4x fewer bytes on the wire than float32), float ones
are taken as they are (a nan or an inf refused); ``params`` (optional, JSON data) names the
preprocessing the sender did and is part of the cache key. Reply: ``{"tag", "latents" (float32,
CPU), "cached": bool}``, ``cached`` when every sample of the group came from the cache.

The default encoder is troupe's VAE with the weights troupe ships (:data:`PRETRAINED_VAE`,
trained by ``troupe models train-vae`` on generated data; nothing is downloaded): an actor
configured with nothing encodes with trained weights. ``encoder_kwargs`` with a ``seed`` or
VAE config fields build an untrained VAE instead (tests and benchmarks of their own size).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import math
import time
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import anyio
import numpy as np
import torch
from torch import nn

from troupe.runtime import Actor, ConfigError, handles

from .latent_cache import LatentCache, cache_key, disk_bound_problem

__all__ = ["DEFAULT_ENCODER", "PRETRAINED_VAE", "EncoderActor", "load_encoder", "video_vae_encoder"]

DEFAULT_ENCODER = "troupe.actors.encoders.encoder_actor:video_vae_encoder"

PRETRAINED_VAE = Path(str(resources.files("troupe.models").joinpath("weights", "video_vae.pt")))
"""The VAE checkpoint shipped with troupe (``troupe models train-vae`` on generated data; how it
was made: src/models/weights/README.md): the default encoder's weights."""


def video_vae_encoder(weights: str | None = None, seed: int | None = None, **config: Any) -> nn.Module:
    """troupe's VAE encoder, frozen.

    - No arguments: the pretrained VAE troupe ships (:data:`PRETRAINED_VAE`), so an encoder
      actor's default encodes with trained weights, not noise;
    - ``weights``: the file ``VideoVAE.save`` wrote;
    - a ``seed`` or ``config`` (``VideoVAEConfig`` fields): a new, untrained VAE of ``config``
      whose weights ``seed`` (default 0) fixes, the same in every process (tests and ``troupe
      bench train`` use this: a size of their own, no file).
    """
    from troupe.models.video_vae import VideoVAE, VideoVAEConfig

    if weights is None and seed is None and not config:
        weights = str(PRETRAINED_VAE)
    if weights is not None:
        return VideoVAE.load(weights).frozen_encoder()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed or 0)
        return VideoVAE(VideoVAEConfig(**config)).frozen_encoder()


def _source_digest(holder: object) -> str:
    """sha256 of the source file that defines ``holder`` (a module or a class)."""
    try:
        path = inspect.getsourcefile(holder)  # type: ignore[arg-type]  # a module or a class
        return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else "no-source"
    except (OSError, TypeError):
        return "no-source"


def _code_hash(home: ModuleType, module: nn.Module) -> str:
    """sha256 of the code that decides what ``module`` computes besides its weights: the source
    file of the factory's module ``home`` (a stride, a layer or an activation chosen there), those
    of the classes in ``module``'s tree that are not torch's own, and the tree's repr (torch's own
    layers' arguments: kernel, stride, padding, whatever file set them). README, Decisions."""
    users = {type(m) for m in module.modules() if type(m).__module__.split(".")[0] != "torch"}
    files = {_source_digest(home)} | {_source_digest(c) for c in users}
    return hashlib.sha256("\0".join([*sorted(files), repr(module)]).encode()).hexdigest()


def _weights_hash(module: nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def load_encoder(path: str, kwargs: dict[str, Any], weights: str | None) -> tuple[nn.Module, str]:
    """The module that ``path`` ("package.module:factory_or_class") builds, and its fingerprint.

    A factory that takes ``weights`` gets the file itself; otherwise the file is a state dict
    (or ``{"state_dict": ...}``) loaded into the module. The fingerprint covers ``path``, the
    kwargs, the weights (the module's own ``fingerprint()`` where it has one) and the code
    (:func:`_code_hash`: the factory's file, the module's classes' files, its layers' arguments).

    Raises:
        ConfigError: ``path`` does not import, or does not build a torch module.
    """
    module_name, _, attr = path.partition(":")
    try:
        home = importlib.import_module(module_name)
        factory: Any = home
        for part in attr.split(".") if attr else ():
            factory = getattr(factory, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"encoder: cannot import {path!r}: {exc}") from exc
    if not attr or not callable(factory):
        raise ConfigError(f"encoder: {path!r} must name a class or factory as 'package.module:name'")
    takes_weights = "weights" in inspect.signature(factory).parameters
    try:
        module = factory(**kwargs, **({"weights": weights} if takes_weights and weights else {}))
    except TypeError as exc:  # encoder_kwargs that do not fit its signature
        raise ConfigError(f"encoder: cannot build {path!r} with encoder_kwargs {kwargs}: {exc}") from exc
    if not isinstance(module, nn.Module):
        raise ConfigError(f"encoder: {path!r} built a {type(module).__name__}, not a torch module")
    if weights is not None and not takes_weights:
        state = torch.load(weights, map_location="cpu", weights_only=True)
        module.load_state_dict(state.get("state_dict", state) if isinstance(state, dict) else state)
    from troupe.models.video_vae import non_finite

    bad = non_finite(module.state_dict())
    if bad:
        raise ConfigError(
            f"encoder: {weights or path}: {len(bad)} weight tensor(s) hold nan or inf (e.g. {bad[0]}): "
            "saved from a training that diverged, or damaged; every latent would be nan"
        )
    own = getattr(module, "fingerprint", None)
    weights_part = str(own()) if callable(own) else _weights_hash(module)
    parts = [path, json.dumps(kwargs, sort_keys=True, default=str), weights_part, _code_hash(home, module)]
    return module, hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _video_tensor(video: Any) -> torch.Tensor:
    if isinstance(video, np.ndarray):
        video = torch.from_numpy(video if video.flags.writeable else video.copy())
    if not isinstance(video, torch.Tensor):
        raise ValueError(f"encode: 'video' must be a tensor or ndarray, got {type(video).__name__}")
    if video.ndim != 5:
        raise ValueError(f"encode: 'video' must be (B, C, T, H, W), got shape {tuple(video.shape)}")
    if video.dtype != torch.uint8 and not video.dtype.is_floating_point:
        raise ValueError(f"encode: 'video' must be uint8 or floating point, got {video.dtype}")
    if video.dtype.is_floating_point:  # nan latents, cached, would be a trainer's nan loss, its blame
        bad = int((~torch.isfinite(video)).sum())
        if bad:
            raise ValueError(f"encode: 'video' holds nan or inf ({bad} of {video.numel()} values)")
    return video


class EncoderActor(Actor):
    """Encodes sample groups with one frozen encoder, through a two-level latent cache.

    Args:
        encoder: "package.module:factory_or_class" of a torch module mapping a video batch to
            latents, each sample's its own along the first axis, computed apart from the others
            (each is cached alone); its ``encode`` method where it has one, else its forward;
            troupe's VAE encoder by default.
        encoder_kwargs: keyword arguments of that factory.
        weights: a weights file (see :func:`load_encoder`).
        device: "cpu", "cuda", "cuda:1"...; None: the GPU where there is one.
        compile, cudnn_benchmark, bf16: torch.compile of the encoder, cuDNN autotuning, bf16
            autocast; each applies on a GPU only (on CPU they are off).
        memory_mb, disk_mb, cache_dir: the latent cache's bounds in MiB, and its disk tier's folder
            (shared by the encoder processes of a host that name it); no ``cache_dir`` or
            ``disk_mb = 0``: no disk tier.
        threads: torch's CPU threads in this process (several encoder processes share a host's
            cores); None: torch's default.
        inline_below_ms: while encoding a group takes less than this (the last one encoded),
            groups are encoded on the event loop, saving the hop to a worker thread and
            back, two thread wake-ups per group that cost as much as a small group's messaging;
            a longer one goes to a worker thread, so that the loop keeps serving (control
            messages, replies) meanwhile. The first group goes to a thread. 0: always a thread.
    """

    mailbox_capacity = 256  # many groups of many trainer ranks in flight

    def __init__(
        self,
        encoder: str = DEFAULT_ENCODER,
        encoder_kwargs: dict[str, Any] | None = None,
        weights: str | None = None,
        device: str | None = None,
        compile: bool = False,
        cudnn_benchmark: bool = True,
        bf16: bool = False,
        memory_mb: float = 256,
        disk_mb: float = 1024,
        cache_dir: str | None = None,
        threads: int | None = None,
        inline_below_ms: float = 50.0,
    ) -> None:
        if memory_mb < 0 or disk_mb < 0:
            raise ConfigError(f"memory_mb and disk_mb must be >= 0, got {memory_mb} and {disk_mb}")
        too_small = disk_bound_problem(disk_mb * 2**20) if cache_dir is not None else None
        if too_small:
            raise ConfigError(f"disk_mb = {disk_mb}: {too_small}")
        if not inline_below_ms >= 0:
            raise ConfigError(f"inline_below_ms must be >= 0, got {inline_below_ms!r}")
        self.inline_below_s = inline_below_ms / 1000
        self._last_encode_s = math.inf  # none yet: the first group goes to a thread
        if threads is not None:
            if threads < 1:
                raise ConfigError(f"threads must be >= 1, got {threads}")
            torch.set_num_threads(threads)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        on_gpu = self.device.type == "cuda"
        self.switches = {"compile": compile and on_gpu, "cudnn_benchmark": cudnn_benchmark and on_gpu,
                         "bf16": bf16 and on_gpu}  # fmt: skip
        module, fingerprint = load_encoder(encoder, dict(encoder_kwargs or {}), weights)
        self.module = module.to(self.device).eval().requires_grad_(False)
        self.fingerprint = fingerprint
        if self.switches["cudnn_benchmark"]:
            torch.backends.cudnn.benchmark = True
        fn = getattr(self.module, "encode", None)
        self._encode_fn = fn if callable(fn) else self.module
        if self.switches["compile"]:
            self._encode_fn = torch.compile(self._encode_fn, dynamic=False)
        # What changes the numbers beyond the input and the weights: part of every cache key.
        self._params = {"device": self.device.type, **self.switches}
        self.cache = LatentCache(int(memory_mb * 2**20), int(disk_mb * 2**20), cache_dir)
        self.counts = {"groups": 0, "samples": 0, "encoded": 0, "samples_encoded": 0, "encode_s": 0.0,
                       "inline": 0}  # fmt: skip

    def encode_frames(self, video: torch.Tensor) -> torch.Tensor:
        """Latents of one batch as the ``encode`` handler computes them, cache aside (benchmarks
        time this path): the handler encodes a group's samples that the cache did not hold."""
        x = video.to(self.device)
        x = x.float() / 127.5 - 1.0 if x.dtype == torch.uint8 else x.float()
        with torch.no_grad(), torch.autocast(self.device.type, torch.bfloat16, enabled=self.switches["bf16"]):
            latents = self._encode_fn(x)
        if not isinstance(latents, torch.Tensor):
            raise TypeError(f"the encoder returned a {type(latents).__name__}, not a tensor")
        if latents.ndim == 0 or latents.shape[0] != video.shape[0]:
            raise ValueError(
                f"the encoder returned latents of shape {tuple(latents.shape)} for {video.shape[0]} samples: "
                "it must map each sample of a batch to latents of its own, along the first axis"
            )
        return latents.float().cpu()

    def _encode_group(self, video: torch.Tensor, params: dict[str, Any]) -> tuple[torch.Tensor, bool]:
        """The group's latents, and whether the cache held every sample of it.

        Each sample is looked up alone, keyed as a group of one (so a cache filled with
        ``group_size = 1`` still answers); the samples no tier holds are encoded as one batch.
        """
        samples = list(video.split(1))
        keys: list[str | None] = [None] * len(samples)
        found: list[torch.Tensor | None] = [None] * len(samples)
        if self.cache.enabled:  # with no tier to look in, no key to hash
            key_params = {**params, **self._params}
            for i, sample in enumerate(samples):
                keys[i] = key = cache_key(sample, key_params, self.fingerprint)
                found[i] = self.cache.get(key)
        missing = [i for i, latents in enumerate(found) if latents is None]
        if len(missing) == len(samples):  # the whole group: no copy to make
            return self._encode_samples(video, keys), False
        if missing:
            encoded = self._encode_samples(video[missing], [keys[i] for i in missing])
            for i, latents in zip(missing, encoded.split(1), strict=True):
                found[i] = latents
        return torch.cat(cast(list[torch.Tensor], found)), not missing

    def _encode_samples(self, video: torch.Tensor, keys: list[str | None]) -> torch.Tensor:
        """``video``'s latents, encoded as one batch, timed, and cached sample by sample under
        ``keys`` (None: not cached)."""
        start = time.perf_counter()
        try:
            encoded = self.encode_frames(video)
        finally:
            self._last_encode_s = time.perf_counter() - start
        self.counts["encode_s"] += self._last_encode_s
        self.counts["encoded"] += 1
        self.counts["samples_encoded"] += len(keys)
        for key, latents in zip(keys, encoded.split(1), strict=True):
            if key is not None:
                self.cache.put(key, latents)
        return encoded

    @handles("encode")
    async def encode(self, payload: Any) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise ValueError(f"encode: the payload must be a map, got {type(payload).__name__}")
        if "video" not in payload:
            raise ValueError(f"encode: the payload has no 'video' (keys: {sorted(map(str, payload))})")
        video = _video_tensor(payload["video"])
        params = payload.get("params") or {}
        if not isinstance(params, dict):
            raise ValueError(f"encode: 'params' must be a map, got {type(params).__name__}")
        try:
            json.dumps(params)  # the cache key holds it as JSON
        except (TypeError, ValueError) as exc:
            raise ValueError(f"encode: 'params' must be JSON data: {exc}") from None
        if self._last_encode_s < self.inline_below_s:
            self.counts["inline"] += 1
            latents, cached = self._encode_group(video, params)
        else:  # on a thread: the event loop goes on serving while it encodes
            latents, cached = await anyio.to_thread.run_sync(self._encode_group, video, params)
        self.counts["groups"] += 1
        self.counts["samples"] += int(video.shape[0])
        return {"tag": payload.get("tag"), "latents": latents, "cached": cached}

    @handles("stats")
    def stats(self, _: Any) -> dict[str, Any]:
        return {**self.counts, "device": str(self.device), "switches": dict(self.switches),
                "fingerprint": self.fingerprint, "cache": self.cache.stats()}  # fmt: skip

    def metrics(self) -> dict[str, float]:
        """The node exports these (docs/METRICS.md): the latent cache per tier, and the encoding.

        A lookup goes to memory first, then to disk: a memory miss is a disk lookup when there
        is a disk tier. Hit rates are of all lookups, as in :meth:`LatentCache.stats`.
        """
        c = self.cache.stats()
        disk = c["disk"]
        return {
            "cache_lookups_total": c["lookups"],
            "cache_memory_hits_total": c["memory_hits"],
            "cache_memory_misses_total": c["disk_hits"] + c["misses"],
            "cache_disk_hits_total": c["disk_hits"],
            "cache_disk_misses_total": c["misses"] if disk["enabled"] else 0,
            "cache_misses_total": c["misses"],
            "cache_memory_hit_rate": c["memory_hit_rate"],
            "cache_disk_hit_rate": c["disk_hit_rate"],
            "cache_corrupt_total": c["corrupt"],
            "cache_disk_writes_total": c["disk_writes"],
            "cache_disk_writes_skipped_total": c["disk_writes_skipped"],
            "cache_disk_writes_too_big_total": c["disk_writes_too_big"],
            "cache_disk_errors_total": c["disk_errors"],
            "cache_disk_busy_total": c["disk_busy"],
            "cache_memory_bytes": c["memory"]["bytes"],
            "cache_memory_limit_bytes": c["memory"]["limit_bytes"],
            "cache_disk_bytes": disk.get("bytes", 0),
            "cache_disk_limit_bytes": disk["limit_bytes"],
            "groups_total": self.counts["groups"],
            "samples_total": self.counts["samples"],
            "groups_encoded_total": self.counts["encoded"],
            "samples_encoded_total": self.counts["samples_encoded"],
            "encode_seconds_total": self.counts["encode_s"],
        }

    async def stopping(self) -> None:
        self.cache.close()
