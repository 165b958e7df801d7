"""The trainer's side of server mode (:mod:`mmgrpo.vlm.models.vllm_server`): the wire format of a request, the HTTP
client (also vLLM's ``VLLMWeightSyncClient`` for the NCCL weight push) and :class:`EngineOutput`, what an engine
returns for one request (the colocated engine of :mod:`.vllm_backend` and the server alike).

Arrays travel as ``.npy`` bytes in base64, loaded with ``allow_pickle=False``: nothing received runs code. Requests
are signed with ``MMGRPO_VLLM_TOKEN`` when it is set (:mod:`mmgrpo.utils.http_guard`; the server's side of the
guard is in :mod:`.vllm_server`).
"""
from __future__ import annotations

import base64
import io
import json
import socket
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from mmgrpo.utils.http_guard import HTTPFailure, env_token, error_text, http_request

TOKEN_ENV = "MMGRPO_VLLM_TOKEN"  # shared secret of the trainer and the rollout server (each reads it when set)


@dataclass
class EngineOutput:
    """One finished request: the engine's expanded prompt, sampled ids and their sampling log-probs."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float] | None


# ----------------------------------------------------------------------------------------------------------
# wire format
# ----------------------------------------------------------------------------------------------------------
def _arr(a) -> dict:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return {"npy": base64.b64encode(buf.getvalue()).decode("ascii")}


def _unarr(d: dict) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(d["npy"])), allow_pickle=False)


def encode_request(prompt: dict, sampling: dict) -> dict:
    """A (``TokensPrompt``, SamplingParams kwargs) pair -> JSON-able dict (images as arrays, videos as
    ``[frames, metadata]``, ``logit_bias`` keys as strings)."""
    p: dict[str, Any] = {"prompt_token_ids": [int(t) for t in prompt["prompt_token_ids"]]}
    mm = prompt.get("multi_modal_data") or {}
    if mm:
        enc: dict[str, Any] = {}
        if "image" in mm:
            enc["image"] = [_arr(np.asarray(im.convert("RGB") if hasattr(im, "convert") else im, dtype=np.uint8))
                            for im in mm["image"]]
        if "video" in mm:
            frames, meta = mm["video"]
            enc["video"] = [_arr(frames), meta]
        p["multi_modal_data"] = enc
    if prompt.get("mm_processor_kwargs"):
        p["mm_processor_kwargs"] = prompt["mm_processor_kwargs"]
    s = dict(sampling)
    if s.get("logit_bias"):
        s["logit_bias"] = {str(k): float(v) for k, v in s["logit_bias"].items()}
    return {"prompt": p, "sampling": s}


def decode_request(obj: dict) -> tuple[dict, dict]:
    """Inverse of :func:`encode_request` (images back to PIL, the video back to a ``(frames, metadata)`` tuple)."""
    from PIL import Image

    p = dict(obj["prompt"])
    if "multi_modal_data" in p:
        enc, mm = p["multi_modal_data"], {}
        if "image" in enc:
            mm["image"] = [Image.fromarray(_unarr(d)) for d in enc["image"]]
        if "video" in enc:
            mm["video"] = (_unarr(enc["video"][0]), dict(enc["video"][1]))
        p["multi_modal_data"] = mm
    s = dict(obj["sampling"])
    if s.get("logit_bias"):
        s["logit_bias"] = {int(k): float(v) for k, v in s["logit_bias"].items()}
    return p, s


def parse_outputs(res: dict, n: int, where: str) -> list[EngineOutput]:
    """The ``/generate`` reply as :class:`EngineOutput` rows, its JSON types checked (``RuntimeError`` naming the
    row and field otherwise): ``n`` outputs of integer ``prompt_token_ids`` / ``token_ids`` and numeric (or null)
    ``logprobs``.  Values (vocabulary, signs, lengths) are checked by ``VLLMRolloutBackend``."""
    outs = res.get("outputs")
    if not isinstance(outs, list) or len(outs) != n:
        got = f"{len(outs)} outputs" if isinstance(outs, list) else repr(outs)[:80]
        raise RuntimeError(f"{where}: malformed reply: {got} for {n} requests")
    rows = []
    for r, o in enumerate(outs):
        if not isinstance(o, dict):
            raise RuntimeError(f"{where}: malformed reply: outputs[{r}] is a {type(o).__name__}")
        for key in ("prompt_token_ids", "token_ids"):
            v = o.get(key)
            if not isinstance(v, list) or any(type(t) is not int for t in v):
                raise RuntimeError(f"{where}: malformed reply: outputs[{r}].{key} is not a list of integers")
        lps = o.get("logprobs")
        if lps is not None and (not isinstance(lps, list) or any(type(x) not in (int, float) for x in lps)):
            raise RuntimeError(f"{where}: malformed reply: outputs[{r}].logprobs is not a list of numbers")
        rows.append(EngineOutput(o["prompt_token_ids"], o["token_ids"],
                                 None if lps is None else [float(x) for x in lps]))
    return rows


# ----------------------------------------------------------------------------------------------------------
# client
# ----------------------------------------------------------------------------------------------------------
class VLLMServerClient:
    """HTTP client of :mod:`mmgrpo.vlm.models.vllm_server` (also a ``VLLMWeightSyncClient``).

    ``timeout``: wall-clock seconds per call (connect, server time, reading the reply: a trickled reply cannot
    stretch it); ``max_reply_mb``: largest reply read.  Requests are signed with ``MMGRPO_VLLM_TOKEN`` when it is set,
    and replies are then used only if the server signed them.  A call that fails raises ``ConnectionError``
    (unreachable, timeout) or ``RuntimeError`` (an error status, a redirect, an oversized, malformed or
    unauthenticated reply)."""

    def __init__(self, base_url: str, timeout: float = 240.0, max_reply_mb: float = 256.0):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"rollout.vllm_server_url must start with http:// or https://, got {base_url!r}")
        if not timeout > 0 or not max_reply_mb > 0:
            raise ValueError("need timeout > 0 and max_reply_mb > 0")
        self.base_url = base_url.rstrip("/")
        self.timeout = float(timeout)
        self.max_reply_bytes = int(max_reply_mb * 2**20)

    @property
    def host(self) -> str:
        return urllib.parse.urlparse(self.base_url).hostname or "127.0.0.1"

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        where = f"vLLM server {method} {self.base_url}{path}"
        try:
            reply = http_request(self.base_url + path, method, data, timeout=self.timeout,
                                 max_reply_bytes=self.max_reply_bytes, token=env_token(TOKEN_ENV), what=where)
        except HTTPFailure as e:
            if e.retryable:
                raise ConnectionError(f"vLLM server {self.base_url} unreachable ({method} {path}): {e}") from None
            raise RuntimeError(str(e)) from None  # names the call already (``what``)
        if reply.status >= 300:
            hint = f" (set {TOKEN_ENV} as on the server)" if reply.status == 401 else ""
            raise RuntimeError(f"{where}: HTTP {reply.status}: {error_text(reply)[:500]}{hint}")
        try:
            out = json.loads(reply.body) if reply.body else {}
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise RuntimeError(f"{where}: the reply is not JSON ({e}): {reply.body[:200]!r}") from None
        if not isinstance(out, dict):
            raise RuntimeError(f"{where}: the reply is a {type(out).__name__}, not a JSON object")
        return out

    def health(self) -> bool:
        try:
            return self._call("GET", "/health").get("status") == "ok"
        except ConnectionError:
            return False

    def wait_until_healthy(self, seconds: float, poll: float = 2.0) -> None:
        deadline = time.monotonic() + seconds
        while not self.health():
            if time.monotonic() > deadline:
                raise ConnectionError(f"vLLM server {self.base_url} not healthy after {seconds:.0f}s "
                                      "(rollout.vllm_server_timeout); is `python -m mmgrpo.vlm.models.vllm_server` up?")
            time.sleep(poll)

    def world_size(self) -> int:
        w = self._call("GET", "/get_world_size").get("world_size")
        if type(w) is not int or w < 1:
            raise RuntimeError(f"vLLM server {self.base_url}/get_world_size: world_size {w!r} is not a positive integer")
        return w

    def run(self, requests: Sequence[tuple[dict, dict]]) -> list[EngineOutput]:
        res = self._call("POST", "/generate", {"requests": [encode_request(p, s) for p, s in requests]})
        return parse_outputs(res, len(requests), f"vLLM server {self.base_url}/generate")

    def reset_prefix_cache(self) -> None:
        self._call("POST", "/reset_prefix_cache", {})

    # VLLMWeightSyncClient (vLLM's RL routes)
    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self._call("POST", "/init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        self._call("POST", "/start_weight_update", {})

    def update_weights(self, update_info) -> None:
        self._call("POST", "/update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._call("POST", "/finish_weight_update", {"weight_version": weight_version})


def local_address_towards(host: str, port: int = 80) -> str:
    """This machine's address on the route to ``host`` (where the server's workers reach the trainer's store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, port))  # UDP: no packet is sent
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def nccl_transfer_factory(client: VLLMServerClient, group_port: int, group_host: str = ""):
    """``(client, source) -> NCCLTrainerWeightTransferEngine``: trainer is NCCL rank 0 and hosts the rendezvous
    store at ``group_host:group_port`` (default: this machine's address towards the server); the server's W
    workers join as ranks 1..W."""

    def make(cl, source):
        from vllm.distributed.weight_transfer.nccl_engine import (NCCLTrainerInitInfo,
                                                                  NCCLTrainerWeightTransferEngine)

        info = NCCLTrainerInitInfo(master_address=group_host or local_address_towards(client.host),
                                   master_port=int(group_port), world_size=1 + client.world_size(), rank=0)
        return NCCLTrainerWeightTransferEngine.trainer_init(info, client=cl, source=source)

    return make


__all__ = ["TOKEN_ENV", "EngineOutput", "encode_request", "decode_request", "parse_outputs", "VLLMServerClient",
           "local_address_towards", "nccl_transfer_factory"]
