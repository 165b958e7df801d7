"""Reference reward server (stdlib ``http.server``, loopback only) for :class:`~flow_grpo.rewards.remote.RemoteReward`.

    python -m flow_grpo.rewards.server --reward jpeg_compressibility --port 18085
    python -m flow_grpo.rewards.server --reward pickscore \
        --reward-kwargs '{"model_path": "/models/PickScore_v1", "processor_path": "/models/CLIP-ViT-H-14-laion2B-s32B-b79K"}'
    python -m flow_grpo.rewards.server --reward my_pkg.rewards:build_my_reward --port 0   # any factory

On start it prints one line ``LISTENING http://HOST:PORT`` to stdout (``--port 0`` picks a free port).
Endpoints: ``GET /health`` -> ``{"reward": name, "status": "ok", "stats": {requests, scored calls / rows, failures
by status}}``; ``POST /`` or ``POST /score`` -> scores
(wire format in :mod:`flow_grpo.rewards.remote`; a video batch arrives as its frames plus ``frames_per_video``
and is scored as (B, F, H, W, 3), the pixel cap counting every frame).  Calls to the reward are serialised with a lock (models are
rarely thread-safe); ``/health`` still answers while a call runs.

Security and limits (the server runs whatever reward it was started with on the images it is sent; the request
handling is :mod:`mmgrpo.utils.score_service`, shared with the VLM front-end's judge server
:mod:`mmgrpo.vlm.rewards.server`; the transport guard is shared with the vLLM rollout server too,
:mod:`mmgrpo.utils.http_guard`, guarantees in docs/reliability.md):

* binds loopback addresses only, so only processes on this machine reach it;
* ``Host`` header: only the bound address, ``localhost``, ``127.0.0.1``, ``::1`` (any port) and names given with
  ``--allow-host`` are served, others get 400 (a web page cannot reach it through DNS rebinding);
* ``POST`` needs ``Content-Type: application/json`` (415 otherwise: a browser cannot send that cross-site without a
  CORS preflight, which this server never grants);
* token: when ``MMGRPO_REWARD_TOKEN`` is set in the server's environment, every request must be signed with it
  (HMAC; 401 otherwise) and every reply is signed back, so the client (same variable) knows it talks to this
  server; the token itself never travels;
* sizes: ``Content-Length`` is required (411), must be a positive integer (400) and at most ``--max-body-mb``
  (413, refused before reading the body); the decoded images of one request are capped at ``--max-megapixels``
  (413, checked from the image headers before decoding);
* connections: each has ``--read-timeout`` seconds to deliver its request (idle or trickling ones are closed); at
  most ``--max-connections`` are open, a new one evicting the oldest still waiting for its request.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import Any

from mmgrpo.utils.http_guard import GuardedServer, add_server_arguments

__all__ = ["make_server", "main"]

def make_server(reward: Any, host: str = "127.0.0.1", port: int = 0, max_body_mb: float = 256.0,
                verbose: bool = False, max_megapixels: float = 64.0, allowed_hosts: Iterable[str] = (),
                token: str | None = None, read_timeout: float = 30.0, max_connections: int = 64) -> GuardedServer:
    """An HTTP server scoring with ``reward`` (a reward callable); call ``serve_forever()`` on it.

    The shared score service (:func:`mmgrpo.utils.score_service.make_score_server`, also behind the VLM front-end's
    judge server) with this front-end's request: images (under the pixel cap), prompts, metadata, kwargs.
    ``allowed_hosts``: extra names accepted in the ``Host`` header. ``token``: shared secret requests are signed
    with; ``None`` reads ``MMGRPO_REWARD_TOKEN`` (unset or empty: no check). ``read_timeout`` / ``max_connections``:
    see :class:`mmgrpo.utils.http_guard.GuardedServer`. ``server.stats`` counts requests and failures."""
    from mmgrpo.utils.score_service import make_score_server

    from .base import RewardError
    from .remote import TOKEN_ENV, decode_images

    max_pixels = int(max_megapixels * 1e6)

    def decode(req: dict) -> tuple[tuple, dict, int]:
        images = decode_images(req["images"], max_pixels)
        f = req.get("frames_per_video")
        if f is not None:  # a video batch: B*F frames, video after video -> (B, F, H, W, 3)
            if type(f) is not int or f < 1 or images.shape[0] % f:
                raise ValueError(f"'frames_per_video' must be a positive integer dividing the "
                                 f"{images.shape[0]} frames, got {f!r}")
            images = images.reshape(images.shape[0] // f, f, *images.shape[1:])
        kwargs = req.get("kwargs") or {}
        if not isinstance(kwargs, dict):
            raise ValueError("'kwargs' must be an object")
        return (images, req["prompts"], req.get("metadata")), kwargs, int(images.shape[0])

    # Reward.evaluate returns numpy: numpy-only rewards never import torch here.
    score = reward.evaluate if hasattr(reward, "evaluate") else reward
    return make_score_server(score, decode, name=str(getattr(reward, "name", "reward")), host=host, port=port,
                             max_body_mb=max_body_mb, verbose=verbose, allowed_hosts=allowed_hosts, token=token,
                             token_env=TOKEN_ENV, read_timeout=read_timeout, max_connections=max_connections,
                             deterministic=(RewardError, ValueError, TypeError), log_prefix="reward-server")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flow_grpo.rewards.server",
                                description="Serve one reward over HTTP on a loopback address. Set "
                                            "MMGRPO_REWARD_TOKEN to require signed requests (HMAC; the client signs "
                                            "them, and checks this server's signed replies, when the same variable "
                                            "is set in its environment; the token never travels).")
    p.add_argument("--reward", required=True, help="registered reward name or 'package.module:factory' (imported "
                                                   "and called: any code; name only factories you trust)")
    p.add_argument("--reward-kwargs", default="{}", help="JSON object of factory kwargs")
    p.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=18085, help="port (0 = pick a free one)")
    p.add_argument("--max-megapixels", type=float, default=64.0,
                   help="largest total of decoded pixels per request (millions; default 64, e.g. 61 images of "
                        "1024x1024): larger requests get 413, checked before decoding")
    add_server_arguments(p, max_body_mb=256.0, allow_host_help="the bound address, localhost, 127.0.0.1 and ::1 "
                                                             "always are")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    from mmgrpo.utils.score_service import checked_server_args, serve_until_interrupted

    kwargs = checked_server_args(p, args)

    from .base import build_reward, check_reward_settings

    problems = check_reward_settings({args.reward: 1.0}, {args.reward: kwargs}, prefix="--reward-kwargs")
    if problems:  # before loading any weights
        p.error("; ".join(problems).replace(f"--reward-kwargs.{args.reward}.", "--reward-kwargs key "))
    reward = build_reward(args.reward, **kwargs)
    server = make_server(reward, args.host, args.port, args.max_body_mb, args.verbose,
                         max_megapixels=args.max_megapixels, allowed_hosts=args.allow_host,
                         read_timeout=args.read_timeout, max_connections=args.max_connections)
    return serve_until_interrupted(server)


if __name__ == "__main__":
    sys.exit(main())
