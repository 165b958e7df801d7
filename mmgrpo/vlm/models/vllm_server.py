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
(``vllm/entrypoints/rl/online/api_router.py``, 0.33.0), so :class:`~mmgrpo.vlm.models.vllm_client.VLLMServerClient` is a ``VLLMWeightSyncClient``
for vLLM's ``NCCLTrainerWeightTransferEngine``.  Verified against vLLM 0.33.0 source only; never run with a GPU here.
"""
from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Sequence

from .vllm_backend import LocalEngine, default_llm_kwargs
from .vllm_client import decode_request


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


__all__ = ["make_server", "main"]
