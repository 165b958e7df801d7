"""HTTP reward client: run heavy or dependency-conflicting reward models in another process/environment.

Wire format (JSON; images base64-encoded, Python's json so NaN/Infinity round-trip as tokens):

    POST <url>   {"images": [b64, ...], "image_format": "jpeg"|"png", "prompts": [...], "metadata": [...],
                  "kwargs": {...}}
                 videos (``RemoteReward(video=True)``): "images" holds the B*F frames, video after video, and
                 "frames_per_video": F; the server scores them as uint8 (B, F, H, W, 3)
    200          {"reward": "<server reward name>", "n": N, "scores": {"<key>": [float, ...], "valid": [bool]}}
    4xx          {"error": "..."}   bad request or a RewardError on the server: not retried
    5xx          {"error": "..."}   reward crashed / server busy: retried

Every reply is validated before use (a malformed one is a failed call, so ``reward.on_failure=drop`` drops its
samples): ``"scores"`` maps names to lists of exactly N entries, scores are JSON numbers or ``null`` (-> NaN),
``"valid"`` entries are JSON ``true``/``false``, and ``"n"``, when present, equals N.

Limits per attempt: ``timeout`` is a wall-clock deadline over the whole exchange (connect, send, wait, read; a
server sending one byte per second cannot stretch it), and a reply above ``max_reply_mb`` is refused (announced
size: before reading it; streamed: as soon as it passes the cap).  Redirects are never followed (a failed call).

Authentication: when the environment variable ``MMGRPO_REWARD_TOKEN`` is set, every request is signed with it and
a reply is used only if the server signed it back with the same token (HMAC challenge-response,
:mod:`mmgrpo.utils.http_guard`): the token never travels, and a process that took the server's port while it
restarted gets nothing reusable and cannot supply scores (its replies are failed calls).  The token is read from
the environment only, so it never lands in a saved config.

Keys are renamed from the server's reward name to this client's ``name`` (``R -> name``, ``R/aux -> name/aux``)
so that a ``RemoteReward(name="pickscore")`` is a drop-in for a local ``pickscore`` inside :class:`MultiReward`.

Transport: PNG by default (lossless: the server scores exactly the pixels a local reward would, so a remote reward is a
drop-in for the local one). ``image_format="jpeg"`` (the DDPO / Flow-GRPO releases' transport) is smaller on the wire
but lossy, and it **changes the scores**: on the same images a remote reward behind JPEG (quality 95) scores
differently from the same reward run locally (docs/rewards.md gives measured differences); choose it only where
bandwidth matters more than matching the local reward.  A reference server: ``python -m flow_grpo.rewards.server``.
"""
from __future__ import annotations

import base64
import io
import json
from typing import Any, Literal

import numpy as np

from mmgrpo.utils.http_guard import TooLarge
from mmgrpo.utils.score_service import ScoreClient

from .base import NanPolicy, Reward, RewardError

__all__ = ["RemoteReward", "encode_images", "decode_images", "TOKEN_ENV"]

TOKEN_ENV = "MMGRPO_REWARD_TOKEN"  # shared secret: sent by the client, checked by the server (each when set)


def encode_images(images: np.ndarray, image_format: str = "jpeg", quality: int = 95) -> list[str]:
    """uint8 (N, H, W, 3) -> list of base64 strings of JPEG/PNG files."""
    from PIL import Image

    fmt = {"jpeg": "JPEG", "jpg": "JPEG", "png": "PNG"}.get(image_format.lower())
    if fmt is None:
        raise ValueError(f"image_format must be 'jpeg' or 'png', got {image_format!r}")
    out = []
    for img in images:
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format=fmt, **({"quality": quality} if fmt == "JPEG" else {}))
        out.append(base64.b64encode(buf.getvalue()).decode("ascii"))
    return out


def decode_images(encoded: list[str], max_pixels: int | None = None) -> np.ndarray:
    """Inverse of :func:`encode_images` (any PIL-readable format); all images must share one size.

    ``max_pixels`` caps the total decoded pixels of the batch, checked from each file's header before decoding
    (a few kB of PNG can decode to gigabytes); above it :class:`TooLarge` is raised."""
    from PIL import Image

    if not isinstance(encoded, list):
        raise ValueError(f"'images' must be a list of base64 strings, got {type(encoded).__name__}")
    arrs = []
    total = 0
    for i, s in enumerate(encoded):
        try:
            im = Image.open(io.BytesIO(base64.b64decode(s, validate=True)))  # lazy: reads the header only
        except Exception as e:  # noqa: BLE001 - report which image is broken
            raise ValueError(f"images[{i}]: cannot decode ({e})") from e
        total += im.size[0] * im.size[1]
        if max_pixels is not None and total > max_pixels:
            raise TooLarge(f"images[0..{i}] decode to {total} pixels, more than the server's cap of {max_pixels} "
                           "(--max-megapixels)")
        try:
            a = np.asarray(im.convert("RGB"))
        except Exception as e:  # noqa: BLE001 - report which image is broken
            raise ValueError(f"images[{i}]: cannot decode ({e})") from e
        if arrs and a.shape != arrs[0].shape:
            raise ValueError(f"images[{i}]: shape {a.shape} differs from images[0] {arrs[0].shape}")
        arrs.append(a)
    if not arrs:
        raise ValueError("no images")
    return np.stack(arrs)


class RemoteReward(Reward):
    """POST images + prompts + metadata to a reward server and read back the dict of scores.

    Args:
        url: endpoint, e.g. ``"http://127.0.0.1:18085/score"``.
        timeout: wall-clock seconds one attempt may take in total (connect, send, server time, read).
        retries: extra attempts after a connection error, timeout or 5xx (``1 + retries`` in total), with
            exponential backoff ``backoff * 2**k`` seconds between them.  4xx answers, malformed and oversized
            replies are not retried here (the trainer's ``ResilientReward`` has its own retries).
        image_format: transport encoding, ``"png"`` (default: lossless, scores equal the local reward's) or ``"jpeg"``
            (lossy: smaller requests, but the scores change; see the module docstring).
        jpeg_quality: JPEG quality with ``image_format="jpeg"``.
        name: output key (server keys are renamed to it).
        max_reply_mb: largest reply accepted (MiB); a larger one is refused without reading it all.
        video: also send video batches (B, F, H, W, 3) (frames as images plus ``frames_per_video``), for a
            server running a video reward; off, a video batch is refused here as by any image reward.

    ``last_attempts`` holds how many attempts the previous call needed; ``stats`` counts calls, attempts, failed
    attempts and failed calls. The retries, reply checks and renaming are the shared score client's
    (:class:`mmgrpo.utils.score_service.ScoreClient`, also behind the VLM front-end's remote judge).
    """

    name = "remote"

    def __init__(self, url: str, timeout: float = 60.0, retries: int = 2, backoff: float = 0.5,
                 image_format: Literal["png", "jpeg"] = "png", jpeg_quality: int = 95, name: str | None = None,
                 nan_policy: NanPolicy = "raise", max_reply_mb: float = 64.0, video: bool = False):
        super().__init__(name=name, nan_policy=nan_policy)
        self.accepts_video = bool(video)
        if str(image_format).lower() not in ("png", "jpeg", "jpg"):
            raise ValueError(f"image_format must be 'png' (lossless, default) or 'jpeg' (lossy: changes the scores), "
                             f"got {image_format!r}")
        self.client = ScoreClient(url, self.name, timeout=timeout, retries=retries, backoff=backoff,
                                  max_reply_mb=max_reply_mb, token_env=TOKEN_ENV, what="reward", unit="images",
                                  error=lambda msg: RewardError(msg, self.name))
        self.url = url
        self.timeout, self.retries, self.backoff = self.client.timeout, self.client.retries, self.client.backoff
        self.image_format = image_format
        self.jpeg_quality = int(jpeg_quality)
        self.max_reply_mb = float(max_reply_mb)

    @property
    def last_attempts(self) -> int:
        return self.client.last_attempts

    @property
    def stats(self):
        return self.client.stats

    def score(self, images, prompts, metadata, **kwargs: Any):
        req: dict[str, Any] = {}
        frames = images
        if images.ndim == 5:  # a video batch (accepts_video): its frames, video after video
            frames = images.reshape(-1, *images.shape[2:])
            req["frames_per_video"] = int(images.shape[1])
        payload = {"images": encode_images(frames, self.image_format, self.jpeg_quality),
                   "image_format": self.image_format, "prompts": prompts,
                   "metadata": [dict(m) for m in metadata], "kwargs": kwargs, **req}
        try:
            json.dumps(payload["metadata"]), json.dumps(kwargs)
        except (TypeError, ValueError) as e:
            raise RewardError(f"reward {self.name!r}: metadata/kwargs are not JSON-serialisable ({e})",
                              self.name) from e
        self.client.name = self.name  # the key this reward answers under (a caller may rename it)
        out = self.client.post(payload, images.shape[0])
        return {k: np.asarray(v, dtype=bool if k == "valid" else np.float64) for k, v in out.items()}
