"""Server mode: a separate ``vllm.LLM`` process on other GPUs, driven over HTTP; weights pushed by NCCL.

Like TRL's ``trl vllm-serve`` this is a small server around ``vllm.LLM`` (not the OpenAI-compatible ``vllm serve``,
whose chat endpoint would re-decode videos and lose mmgrpo's exact frames and fps).  Start it on the rollout GPUs::

    CUDA_VISIBLE_DEVICES=4,5,6,7 python -m mmgrpo.vlm.models.vllm_server --model PATH --tensor-parallel-size 4 --port 8000

and train with ``rollout.backend=vllm rollout.vllm_mode=server rollout.vllm_server_url=http://127.0.0.1:8000``.

Access (the same guard as the reward server, :mod:`mmgrpo.utils.http_guard`; guarantees in docs/reliability.md):
the server binds 127.0.0.1 by default.  With ``MMGRPO_VLLM_TOKEN`` set in the server's and the trainer's
environment, every request must be signed with it (HMAC, 401 otherwise) and the client uses only replies the server
signed back: the token never travels.  Serving trainers on other machines needs ``--allow-remote --host ADDR`` and
refuses to start without the token (anyone reaching the port could otherwise point the NCCL weight transfer at
itself or push weights).  ``Host`` must be the bound address, a loopback name, this machine's name or an
``--allow-host`` name; POSTs must be ``application/json`` with a ``Content-Length`` of at most ``--max-body-mb``
(refused before reading); a connection has ``--read-timeout`` s to deliver its request; at most
``--max-connections`` are open.  The client's ``timeout`` is a wall-clock deadline per call, replies above
``max_reply_mb`` are refused, redirects are never followed, and :class:`VLLMRolloutBackend` validates every
reply (token ids, log-probs, lengths).

Endpoints (JSON bodies; arrays travel as ``.npy`` bytes in base64 and are loaded with ``allow_pickle=False``, so
nothing received runs code):

=================================  =====================================================================
``GET  /health``                   ``{"status": "ok"}``
``GET  /get_world_size``           ``{"world_size": W}`` (engine workers; the NCCL group is W + 1)
``POST /generate``                 ``{"requests": [{"prompt": TokensPrompt, "sampling": SamplingParams kwargs}]}``
                                   -> ``{"outputs": [{"prompt_token_ids", "token_ids", "logprobs"}]}``
``POST /reset_prefix_cache``       drop KV blocks computed with old weights
``POST /init_weight_transfer_engine``  ``{"init_info": {...}}``  -> ``LLM.init_weight_transfer_engine``
``POST /start_weight_update``      -> ``LLM.start_weight_update()``
``POST /update_weights``           ``{"update_info": {...}}`` -> ``LLM.update_weights`` (blocks in the NCCL receive)
``POST /finish_weight_update``     ``{"weight_version": str | null}`` -> ``LLM.finish_weight_update``
=================================  =====================================================================

The four weight routes have the same paths and bodies as vLLM's own RL routes
(``vllm/entrypoints/rl/online/api_router.py``, 0.33.0), so :class:`VLLMServerClient` is a ``VLLMWeightSyncClient``
for vLLM's ``NCCLTrainerWeightTransferEngine``.  Verified against vLLM 0.33.0 source only; never run with a GPU here.
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import socket
import threading
import time
import urllib.parse
from typing import Any, Sequence

import numpy as np

from mmgrpo.utils.http_guard import (GuardedHandler, GuardedServer, HTTPFailure, add_server_arguments, env_token,
                                     error_text, http_request)

from .vllm_backend import EngineOutput, LocalEngine, default_llm_kwargs

TOKEN_ENV = "MMGRPO_VLLM_TOKEN"  # shared secret of the trainer and the rollout server (each reads it when set)


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


# ----------------------------------------------------------------------------------------------------------
# server
# ----------------------------------------------------------------------------------------------------------
def make_server(llm, host: str = "127.0.0.1", port: int = 0, sampling_params_cls=None, *,
                token: str | None = None, allow_remote: bool = False, allowed_hosts: Sequence[str] = (),
                max_body_mb: float = 2048.0, read_timeout: float = 30.0, max_connections: int = 64,
                verbose: bool = False) -> GuardedServer:
    """An HTTP server around ``llm`` (a ``vllm.LLM``, or a fake with the same methods); ``port=0`` picks one.

    ``token``: shared secret requests must be signed with (``None`` reads ``MMGRPO_VLLM_TOKEN``; unset or empty: no
    check); ``allow_remote``: bind a non-loopback ``host`` (requires the token).  The limits are
    :class:`mmgrpo.utils.http_guard.GuardedServer`'s."""
    engine = LocalEngine(llm, sampling_params_cls)
    gen_lock = threading.Lock()  # LLM.generate is not thread-safe
    token = env_token(TOKEN_ENV) if token is None else token

    def post(path: str, body: dict) -> dict:
        if path == "/generate":
            reqs = [decode_request(r) for r in body["requests"]]
            with gen_lock:
                outs = engine.run(reqs)
            return {"outputs": [{"prompt_token_ids": o.prompt_token_ids, "token_ids": o.token_ids,
                                 "logprobs": o.logprobs} for o in outs]}
        if path == "/reset_prefix_cache":
            llm.reset_prefix_cache()
        elif path == "/init_weight_transfer_engine":
            llm.init_weight_transfer_engine({"init_info": body["init_info"]})
        elif path == "/start_weight_update":
            llm.start_weight_update()
        elif path == "/update_weights":
            llm.update_weights({"update_info": body["update_info"]})
        elif path == "/finish_weight_update":
            llm.finish_weight_update(body.get("weight_version"))
        else:
            raise KeyError(path)
        return {"status": "ok"}

    class Handler(GuardedHandler):
        log_prefix = "vllm-server"

        def do_GET(self):  # noqa: N802
            if self.admit(post=False) is None:
                return
            if self.path == "/health":
                self.send_json(200, {"status": "ok"})
            elif self.path == "/get_world_size":
                self.send_json(200, {"world_size": int(llm.get_world_size())})
            else:
                self.send_json(404, {"error": f"no route {self.path}"})

        def do_POST(self):  # noqa: N802
            if self.admit(post=True) is None:
                return
            try:
                body = self.json_body()
                if not isinstance(body, dict):
                    raise ValueError("the request must be a JSON object")
                self.send_json(200, post(self.path, body))
            except KeyError as e:
                self.send_json(404 if str(e).strip("'") == self.path else 400, {"error": f"missing {e}"})
            except Exception as e:  # noqa: BLE001 - report to the trainer instead of dropping the connection
                self.send_json(500, {"error": f"{type(e).__name__}: {e}"})

    return GuardedServer((host, port), Handler, token=token, token_env=TOKEN_ENV, allowed_hosts=allowed_hosts,
                         max_body_bytes=int(max_body_mb * 2**20), read_timeout=read_timeout,
                         max_connections=max_connections, allow_remote=allow_remote, verbose=verbose)


def main(argv: Sequence[str] | None = None) -> None:  # pragma: no cover - needs vLLM and GPUs
    ap = argparse.ArgumentParser(description="mmgrpo vLLM rollout server (see the module docstring). Set "
                                             f"{TOKEN_ENV} (here and in the trainer's environment) to require "
                                             "signed requests; --allow-remote requires it.")
    ap.add_argument("--model", required=True, help="model folder or hub id (the policy's starting weights)")
    ap.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (default 127.0.0.1; a non-loopback address needs --allow-remote)")
    ap.add_argument("--allow-remote", action="store_true",
                    help=f"serve trainers on other machines (bind --host ADDR or 0.0.0.0); requires {TOKEN_ENV}")
    ap.add_argument("--port", type=int, default=8000, help="HTTP port")
    # --max-body-mb 2048: a generate call carries its prompts' frames once per generation
    add_server_arguments(ap, max_body_mb=2048.0, allow_host_help="e.g. the address trainers use in "
                         "rollout.vllm_server_url; the bound address, loopback names and this machine's name always are")
    ap.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per engine (tensor parallel)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="GPU memory fraction for vLLM")
    ap.add_argument("--max-model-len", type=int, default=8192, help="max prompt + completion tokens")
    ap.add_argument("--seed", type=int, default=0, help="engine seed (requests carry their own seeds)")
    ap.add_argument("--mm-processor-kwargs", default="{}",
                    help="JSON processor kwargs, e.g. the image size the trainer uses: "
                         '\'{"size": {"shortest_edge": 3136, "longest_edge": 1003520}}\'')
    ap.add_argument("--verbose", action="store_true", help="log every request to stderr")
    a = ap.parse_args(argv)
    token = env_token(TOKEN_ENV)
    try:  # refuse a bad bind before the (minutes-long) engine start
        GuardedServer.check_bind(a.host, a.allow_remote, token, TOKEN_ENV)
    except ValueError as e:
        ap.error(str(e))
    import vllm
    from vllm import LLM

    from .vllm_backend import check_vllm_version

    check_vllm_version(vllm.__version__)
    kw = default_llm_kwargs(json.loads(a.mm_processor_kwargs), a.gpu_memory_utilization, a.max_model_len,
                            "nccl", a.seed)
    llm = LLM(model=a.model, tensor_parallel_size=a.tensor_parallel_size, **kw)
    srv = make_server(llm, a.host, a.port, token=token, allow_remote=a.allow_remote, allowed_hosts=a.allow_host,
                      max_body_mb=a.max_body_mb, read_timeout=a.read_timeout, max_connections=a.max_connections,
                      verbose=a.verbose)
    print(f"mmgrpo vLLM server on http://{a.host}:{srv.server_address[1]}"
          f"{' (signed requests only)' if token else ''}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":  # pragma: no cover
    main()


__all__ = ["TOKEN_ENV", "encode_request", "decode_request", "parse_outputs", "VLLMServerClient",
           "nccl_transfer_factory", "make_server", "local_address_towards", "main"]
