"""HTTP reward client: run heavy or dependency-conflicting reward models in another process/environment.

Wire format (JSON; images base64-encoded, Python's json so NaN/Infinity round-trip as tokens):

    POST <url>   {"images": [b64, ...], "image_format": "jpeg"|"png", "prompts": [...], "metadata": [...],
                  "kwargs": {...}}
    200          {"reward": "<server reward name>", "n": N, "scores": {"<key>": [float, ...], "valid": [bool]}}
    4xx          {"error": "..."}   bad request or a RewardError on the server: not retried
    5xx          {"error": "..."}   reward crashed / server busy: retried

Keys are renamed from the server's reward name to this client's ``name`` (``R -> name``, ``R/aux -> name/aux``)
so that a ``RemoteReward(name="pickscore")`` is a drop-in for a local ``pickscore`` inside :class:`MultiReward`.

JPEG transport (DDPO/Flow-GRPO style) is lossy; use ``image_format="png"`` where the exact pixels matter
(e.g. a remote JPEG-compressibility reward).  A reference server: ``python -m flow_grpo.rewards.server``.
"""
from __future__ import annotations

import base64
import io
import json
import logging
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Literal

import numpy as np

from .base import NanPolicy, Reward, RewardError

__all__ = ["RemoteReward", "encode_images", "decode_images"]

logger = logging.getLogger(__name__)


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


def decode_images(encoded: list[str]) -> np.ndarray:
    """Inverse of :func:`encode_images` (any PIL-readable format); all images must share one size."""
    from PIL import Image

    arrs = []
    for i, s in enumerate(encoded):
        try:
            a = np.asarray(Image.open(io.BytesIO(base64.b64decode(s, validate=True))).convert("RGB"))
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


def _is_loopback_ip(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RemoteReward(Reward):
    """POST images + prompts + metadata to a reward server and read back the dict of scores.

    Args:
        url: endpoint, e.g. ``"http://127.0.0.1:18085/score"``.
        timeout: seconds per socket operation (connect, each read) of one attempt.
        retries: extra attempts after a connection error, timeout or 5xx (``1 + retries`` in total), with
            exponential backoff ``backoff * 2**k`` seconds between them.  4xx answers are not retried.
        image_format / jpeg_quality: transport encoding.
        name: output key (server keys are renamed to it).

    ``last_attempts`` holds how many attempts the previous call needed.
    """

    name = "remote"

    def __init__(self, url: str, timeout: float = 60.0, retries: int = 2, backoff: float = 0.5,
                 image_format: Literal["jpeg", "png"] = "jpeg", jpeg_quality: int = 95, name: str | None = None,
                 nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if timeout <= 0 or retries < 0 or backoff < 0:
            raise ValueError("need timeout > 0, retries >= 0, backoff >= 0")
        self.url = url
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.image_format = image_format
        self.jpeg_quality = int(jpeg_quality)
        self.last_attempts = 0
        # A loopback server must never be reached through an HTTP(S)_PROXY from the environment.
        host = urllib.parse.urlsplit(url).hostname or ""
        loopback = host == "localhost" or _is_loopback_ip(host)
        self._opener = urllib.request.build_opener(*([urllib.request.ProxyHandler({})] if loopback else []))

    def _post_once(self, body: bytes) -> dict:
        req = urllib.request.Request(self.url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                return json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as e:
            try:
                msg = json.loads(e.read().decode("utf-8")).get("error", "")
            except Exception:  # noqa: BLE001 - body is best effort
                msg = ""
            if e.code >= 500 or e.code == 429:
                raise _Retryable(f"HTTP {e.code}: {msg}") from e
            raise RewardError(f"reward {self.name!r}: server {self.url} rejected the request "
                              f"(HTTP {e.code}): {msg}", self.name) from e
        except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError) as e:
            reason = getattr(e, "reason", e)
            kind = "timeout" if isinstance(reason, (socket.timeout, TimeoutError)) else "connection error"
            raise _Retryable(f"{kind}: {reason}") from e

    def score(self, images, prompts, metadata, **kwargs: Any):
        try:
            body = json.dumps({
                "images": encode_images(images, self.image_format, self.jpeg_quality),
                "image_format": self.image_format,
                "prompts": prompts,
                "metadata": [dict(m) for m in metadata],
                "kwargs": kwargs,
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

    def _rename(self, resp: Any, n: int) -> dict:
        if not isinstance(resp, dict) or not isinstance(resp.get("scores"), dict):
            raise RewardError(f"reward {self.name!r}: malformed response from {self.url}: {str(resp)[:200]}",
                              self.name)
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
