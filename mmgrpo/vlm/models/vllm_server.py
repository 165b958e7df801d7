"""Server mode: a separate ``vllm.LLM`` process on other GPUs, driven over HTTP; weights pushed by NCCL.

Like TRL's ``trl vllm-serve`` this is a small server around ``vllm.LLM`` (not the OpenAI-compatible ``vllm serve``,
whose chat endpoint would re-decode videos and lose mmgrpo's exact frames and fps).  Start it on the rollout GPUs::

    CUDA_VISIBLE_DEVICES=4,5,6,7 python -m mmgrpo.vlm.models.vllm_server --model PATH --tensor-parallel-size 4 --port 8000

and train with ``rollout.backend=vllm rollout.vllm_mode=server rollout.vllm_server_url=http://HOST:8000``.

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
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Sequence

import numpy as np

from .vllm_backend import EngineOutput, LocalEngine, default_llm_kwargs


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


# ----------------------------------------------------------------------------------------------------------
# client
# ----------------------------------------------------------------------------------------------------------
class VLLMServerClient:
    """HTTP client of :mod:`mmgrpo.vlm.models.vllm_server` (also a ``VLLMWeightSyncClient``)."""

    def __init__(self, base_url: str, timeout: float = 240.0):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"rollout.vllm_server_url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout = float(timeout)

    @property
    def host(self) -> str:
        return urllib.parse.urlparse(self.base_url).hostname or "127.0.0.1"

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"vLLM server {method} {self.base_url}{path}: HTTP {e.code}: "
                               f"{e.read()[:500].decode(errors='replace')}") from e
        except (urllib.error.URLError, OSError) as e:
            raise ConnectionError(f"vLLM server {self.base_url} unreachable ({method} {path}): {e}") from e
        return json.loads(raw) if raw else {}

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
        return int(self._call("GET", "/get_world_size")["world_size"])

    def run(self, requests: Sequence[tuple[dict, dict]]) -> list[EngineOutput]:
        res = self._call("POST", "/generate", {"requests": [encode_request(p, s) for p, s in requests]})
        return [EngineOutput(o["prompt_token_ids"], o["token_ids"], o["logprobs"]) for o in res["outputs"]]

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
def make_server(llm, host: str = "127.0.0.1", port: int = 0, sampling_params_cls=None) -> ThreadingHTTPServer:
    """An HTTP server around ``llm`` (a ``vllm.LLM``, or a fake with the same methods); ``port=0`` picks one."""
    engine = LocalEngine(llm, sampling_params_cls)
    gen_lock = threading.Lock()  # LLM.generate is not thread-safe

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

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, obj: dict) -> None:
            raw = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):  # noqa: N802
            if self.path == "/health":
                self._send(200, {"status": "ok"})
            elif self.path == "/get_world_size":
                self._send(200, {"world_size": int(llm.get_world_size())})
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def do_POST(self):  # noqa: N802
            try:
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n) or b"{}")
                self._send(200, post(self.path, body))
            except KeyError as e:
                self._send(404 if str(e).strip("'") == self.path else 400, {"error": f"missing {e}"})
            except Exception as e:  # report to the trainer instead of dropping the connection
                self._send(500, {"error": f"{type(e).__name__}: {e}"})

        def log_message(self, *args):  # quiet
            pass

    return ThreadingHTTPServer((host, port), Handler)


def main(argv: Sequence[str] | None = None) -> None:  # pragma: no cover - needs vLLM and GPUs
    ap = argparse.ArgumentParser(description="mmgrpo vLLM rollout server (see the module docstring)")
    ap.add_argument("--model", required=True, help="model folder or hub id (the policy's starting weights)")
    ap.add_argument("--host", default="0.0.0.0", help="address to listen on")
    ap.add_argument("--port", type=int, default=8000, help="HTTP port")
    ap.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per engine (tensor parallel)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="GPU memory fraction for vLLM")
    ap.add_argument("--max-model-len", type=int, default=8192, help="max prompt + completion tokens")
    ap.add_argument("--seed", type=int, default=0, help="engine seed (requests carry their own seeds)")
    ap.add_argument("--mm-processor-kwargs", default="{}",
                    help="JSON processor kwargs, e.g. the image size the trainer uses: "
                         '\'{"size": {"shortest_edge": 3136, "longest_edge": 1003520}}\'')
    a = ap.parse_args(argv)
    import vllm
    from vllm import LLM

    from .vllm_backend import check_vllm_version

    check_vllm_version(vllm.__version__)
    kw = default_llm_kwargs(json.loads(a.mm_processor_kwargs), a.gpu_memory_utilization, a.max_model_len,
                            "nccl", a.seed)
    llm = LLM(model=a.model, tensor_parallel_size=a.tensor_parallel_size, **kw)
    srv = make_server(llm, a.host, a.port)
    print(f"mmgrpo vLLM server on http://{a.host}:{srv.server_address[1]}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":  # pragma: no cover
    main()


__all__ = ["encode_request", "decode_request", "VLLMServerClient", "nccl_transfer_factory", "make_server",
           "local_address_towards", "main"]
