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
import logging
import os
import time
from typing import Any, Literal

import numpy as np

from mmgrpo.utils.http_guard import HTTPFailure, TooLarge, error_text, http_request

from .base import NanPolicy, Reward, RewardError

__all__ = ["RemoteReward", "encode_images", "decode_images", "TOKEN_ENV"]

logger = logging.getLogger(__name__)

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


class _Retryable(Exception):
    pass


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

    ``last_attempts`` holds how many attempts the previous call needed.
    """

    name = "remote"

    def __init__(self, url: str, timeout: float = 60.0, retries: int = 2, backoff: float = 0.5,
                 image_format: Literal["png", "jpeg"] = "png", jpeg_quality: int = 95, name: str | None = None,
                 nan_policy: NanPolicy = "raise", max_reply_mb: float = 64.0, video: bool = False):
        super().__init__(name=name, nan_policy=nan_policy)
        self.accepts_video = bool(video)
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if timeout <= 0 or retries < 0 or backoff < 0 or not max_reply_mb > 0:
            raise ValueError("need timeout > 0, retries >= 0, backoff >= 0, max_reply_mb > 0")
        self.url = url
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        if str(image_format).lower() not in ("png", "jpeg", "jpg"):
            raise ValueError(f"image_format must be 'png' (lossless, default) or 'jpeg' (lossy: changes the scores), "
                             f"got {image_format!r}")
        self.image_format = image_format
        self.jpeg_quality = int(jpeg_quality)
        self.max_reply_bytes = int(max_reply_mb * 2**20)
        self.max_reply_mb = float(max_reply_mb)
        self.last_attempts = 0

    def _post_once(self, body: bytes) -> dict:
        token = os.environ.get(TOKEN_ENV) or None
        try:
            reply = http_request(self.url, "POST", body, timeout=self.timeout, max_reply_bytes=self.max_reply_bytes,
                                 token=token, what=f"reward server {self.url}")
        except HTTPFailure as e:
            if e.retryable:
                raise _Retryable(str(e)) from None
            cap = f" (max_reply_mb={self.max_reply_mb:g})" if "reply cap" in str(e) else ""
            raise RewardError(f"reward {self.name!r}: {e}{cap}", self.name) from None
        if reply.status >= 300:
            self._raise_http_error(reply, token)
        try:
            return json.loads(reply.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise RewardError(f"reward {self.name!r}: the reply from {self.url} is not JSON ({e}): "
                              f"{reply.body[:200]!r}", self.name) from e

    def _raise_http_error(self, reply, token: str | None) -> None:
        msg = error_text(reply)
        if token and not reply.authenticated:
            msg += " [unauthenticated reply]"
        if reply.status >= 500 or reply.status == 429:
            raise _Retryable(f"HTTP {reply.status}: {msg}")
        hint = ""
        if reply.status == 401:
            hint = (f" (set {TOKEN_ENV} to the server's token)" if not token
                    else f" ({TOKEN_ENV} differs from the server's)")
        raise RewardError(f"reward {self.name!r}: server {self.url} rejected the request "
                          f"(HTTP {reply.status}): {msg}{hint}", self.name)

    def score(self, images, prompts, metadata, **kwargs: Any):
        req: dict[str, Any] = {}
        frames = images
        if images.ndim == 5:  # a video batch (accepts_video): its frames, video after video
            frames = images.reshape(-1, *images.shape[2:])
            req["frames_per_video"] = int(images.shape[1])
        try:
            body = json.dumps({
                "images": encode_images(frames, self.image_format, self.jpeg_quality),
                "image_format": self.image_format,
                "prompts": prompts,
                "metadata": [dict(m) for m in metadata],
                "kwargs": kwargs,
                **req,
            }).encode("utf-8")
        except TypeError as e:
            raise RewardError(f"reward {self.name!r}: metadata/kwargs are not JSON-serialisable ({e})",
                              self.name) from e
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            self.last_attempts = attempt + 1
            try:
                resp = self._post_once(body)
                break
            except _Retryable as e:
                last = e
                logger.warning("reward %r: attempt %d/%d to %s failed: %s", self.name, attempt + 1,
                               self.retries + 1, self.url, e)
                if attempt < self.retries:
                    time.sleep(self.backoff * (2 ** attempt))
        else:
            raise RewardError(f"reward {self.name!r}: POST {self.url} failed after {self.retries + 1} "
                              f"attempt(s): {last}", self.name)
        return self._rename(resp, images.shape[0])

    def _check_reply(self, resp: Any, n: int) -> None:
        """Raise :class:`RewardError` unless ``resp`` is a well-typed reply for ``n`` images (see module doc)."""

        def bad(what: str) -> RewardError:
            return RewardError(f"reward {self.name!r}: malformed reply from {self.url}: {what}", self.name)

        def show(x: Any) -> str:
            return f"{x!r:.60} ({type(x).__name__})"

        if not isinstance(resp, dict) or not isinstance(resp.get("scores"), dict):
            raise bad(f"expected an object with a 'scores' object, got {str(resp)[:200]}")
        if "reward" in resp and not isinstance(resp["reward"], str):
            raise bad(f"'reward' is {show(resp['reward'])}, expected a string")
        if "n" in resp and (type(resp["n"]) is not int or resp["n"] != n):
            raise bad(f"'n' is {show(resp['n'])} for a request of {n} images")
        for k, v in resp["scores"].items():
            if not isinstance(v, list):
                raise bad(f"scores[{k!r}] is {show(v)}, expected a list of {n} entries")
            if len(v) != n:
                raise bad(f"scores[{k!r}] has {len(v)} value(s) for a request of {n} images")
            for i, x in enumerate(v):
                if k == "valid" and type(x) is not bool:
                    raise bad(f"scores['valid'][{i}] is {show(x)}, expected JSON true/false")
                if k != "valid" and not (x is None or type(x) in (int, float)):
                    raise bad(f"scores[{k!r}][{i}] is {show(x)}, expected a JSON number or null")

    def _rename(self, resp: Any, n: int) -> dict:
        self._check_reply(resp, n)
        remote = str(resp.get("reward", self.name))
        out = {}
        for k, v in resp["scores"].items():
            if k == "valid":
                out[k] = np.asarray(v, dtype=bool)
                continue
            if k == remote:
                k = self.name
            elif k.startswith(remote + "/"):
                k = self.name + k[len(remote):]
            out[k] = np.asarray([np.nan if x is None else x for x in v], dtype=np.float64)
        if self.name not in out:
            raise RewardError(f"reward {self.name!r}: response from {self.url} has keys {sorted(out)} but not "
                              f"the server reward's own key {remote!r}", self.name)
        return out
