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
(``vllm/entrypoints/rl/online/api_router.py``, 0.33.0), so :class:`~mmgrpo.vlm.models.vllm_client.VLLMServerClient` is a ``VLLMWeightSyncClient``
for vLLM's ``NCCLTrainerWeightTransferEngine``.  Verified against vLLM 0.33.0 source only; never run with a GPU here.
"""
from __future__ import annotations

import argparse
import json
import threading
from typing import Sequence

from mmgrpo.utils.http_guard import GuardedHandler, GuardedServer, add_server_arguments, env_token

from .vllm_backend import LocalEngine, default_llm_kwargs
from .vllm_client import TOKEN_ENV, decode_request

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


__all__ = ["make_server", "main"]
