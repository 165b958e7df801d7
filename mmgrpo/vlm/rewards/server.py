"""Serve a text reward of ``mmgrpo train`` -- the model-based judge first -- over HTTP on a loopback address.

    python -m mmgrpo.vlm.rewards.server --reward judge --port 18090 \
        --reward-kwargs '{"model": "/models/Qwen2.5-7B-Instruct", "batch_size": 16, "device": "cuda"}'
    python -m mmgrpo.vlm.rewards.server --reward my_pkg.rewards:caption_f1 --port 0     # any open reward factory

and train against it with the ``remote`` open reward (:class:`mmgrpo.vlm.rewards.remote.RemoteTextReward`)::

    mmgrpo train ... 'reward.weights={remote: 1.0}' 'reward.kwargs={remote: {url: "http://127.0.0.1:18090/score"}}'

On start it prints ``LISTENING http://HOST:PORT`` (``--port 0`` picks a free port). ``--reward`` is an open reward
of :mod:`mmgrpo.vlm.rewards.open`: ``judge`` or an import path (imported and called: any code; name only factories
you trust), built with ``--reward-kwargs`` as ``reward.kwargs.<name>`` would build it in the trainer.

Request ``POST /score``: ``{"completions": [str | null, ...], "samples": [{...}, ...]}`` (N of each; a sample is
the canonical sample's JSON fields the reward reads, e.g. ``query`` and ``answer`` for the judge). Reply:
``{"reward": name, "n": N, "scores": {name: [N floats], "<name>/<key>": [N floats], ...}}`` (the reward's
diagnostics under its name, e.g. ``judge/parse_failed``).

The request handling is the flow front-end reward server's (:mod:`mmgrpo.utils.score_service`): loopback only,
``Host`` allowlist, JSON content type, body cap (``--max-body-mb``, default 16), read deadline, connection cap,
``MMGRPO_REWARD_TOKEN`` HMAC signing, one reward call at a time, 400 / 413 / 422 / 500 errors the client acts on,
counted failures on ``GET /health``. Limits of this front-end: at most ``--max-rows`` completions per request
and ``--max-chars`` characters per completion and per sample (413 above them). Loading the judge runs no code
from its folder: safetensors weights only, no ``trust_remote_code`` (:class:`mmgrpo.vlm.rewards.judge.JudgeReward`).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Iterable, Mapping, Optional

from mmgrpo.utils.http_guard import GuardedServer, TooLarge, add_server_arguments

__all__ = ["make_text_server", "decode_text_request", "main", "TOKEN_ENV"]

TOKEN_ENV = "MMGRPO_REWARD_TOKEN"  # the same secret as the flow front-end's reward server


def decode_text_request(req: Mapping[str, Any], max_rows: int, max_chars: int) -> tuple[list, list, int]:
    """(completions, samples, N) of a request, checked: lists of equal length N <= ``max_rows`` (413 above),
    completions strings or null of at most ``max_chars`` characters, samples JSON objects of at most ``max_chars``
    characters when re-encoded (413 above). Raises ``KeyError`` / ``ValueError`` (400) or ``TooLarge`` (413)."""
    comps, samples = req["completions"], req["samples"]
    if not isinstance(comps, list) or not isinstance(samples, list):
        raise ValueError("'completions' and 'samples' must be lists")
    if len(comps) != len(samples):
        raise ValueError(f"{len(comps)} completions but {len(samples)} samples")
    if not comps:
        raise ValueError("no completions")
    if len(comps) > max_rows:
        raise TooLarge(f"{len(comps)} completions in one request, more than the server's cap of {max_rows} "
                       "(--max-rows)")
    for i, (c, s) in enumerate(zip(comps, samples)):
        if c is not None and not isinstance(c, str):
            raise ValueError(f"completions[{i}] is {type(c).__name__}, expected a string or null")
        if not isinstance(s, dict):
            raise ValueError(f"samples[{i}] is {type(s).__name__}, expected an object")
        if c is not None and len(c) > max_chars:
            raise TooLarge(f"completions[{i}] has {len(c)} characters, more than the cap of {max_chars} (--max-chars)")
        if len(json.dumps(s)) > max_chars:
            raise TooLarge(f"samples[{i}] is over {max_chars} characters (--max-chars)")
    return comps, samples, len(comps)


def _as_scores(name: str, raw: Any, n: int) -> dict[str, list]:
    """An open reward's output as the wire's scores: ``{name: N floats, "<name>/<key>": N floats}``."""
    from .open import _scores

    vals, extra = _scores(name, raw, n)
    return {name: vals, **{(k if k.startswith(f"{name}/") else f"{name}/{k}"): v for k, v in extra.items()}}


def make_text_server(reward: Callable, name: str, host: str = "127.0.0.1", port: int = 0, *,
                     max_body_mb: float = 16.0, max_rows: int = 4096, max_chars: int = 100_000,
                     verbose: bool = False, allowed_hosts: Iterable[str] = (), token: Optional[str] = None,
                     read_timeout: float = 30.0, max_connections: int = 64) -> GuardedServer:
    """An HTTP server scoring with ``reward(completions, samples)`` (an open reward); call ``serve_forever()``.
    ``token`` ``None`` reads ``MMGRPO_REWARD_TOKEN``; ``server.stats`` counts requests and failures."""
    from mmgrpo.utils.score_service import make_score_server

    if int(max_rows) < 1 or int(max_chars) < 1:
        raise ValueError("max_rows and max_chars must be >= 1")

    def decode(req: dict) -> tuple[tuple, dict, int]:
        comps, samples, n = decode_text_request(req, int(max_rows), int(max_chars))
        return (comps, samples), {}, n

    def score(completions: list, samples: list) -> dict[str, list]:
        return _as_scores(name, reward(completions, samples), len(completions))

    return make_score_server(score, decode, name=name, host=host, port=port, max_body_mb=max_body_mb,
                             verbose=verbose, allowed_hosts=allowed_hosts, token=token, token_env=TOKEN_ENV,
                             read_timeout=read_timeout, max_connections=max_connections,
                             deterministic=(ValueError, TypeError), log_prefix="text-reward-server")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mmgrpo.vlm.rewards.server",
                                description="Serve one text reward of mmgrpo train (the judge, or a reward by import "
                                            "path) over HTTP on a loopback address. Set MMGRPO_REWARD_TOKEN to "
                                            "require signed requests (HMAC; the token never travels).")
    p.add_argument("--reward", required=True, help="'judge' or 'package.module:factory' (imported and called: any "
                                                   "code; name only factories you trust)")
    p.add_argument("--reward-kwargs", default="{}", help="JSON object: the reward's options (reward.kwargs.<name>)")
    p.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=18090, help="port (0 = pick a free one)")
    p.add_argument("--max-rows", type=int, default=4096, help="completions per request at most (413 above)")
    p.add_argument("--max-chars", type=int, default=100_000,
                   help="characters per completion and per sample at most (413 above)")
    add_server_arguments(p, max_body_mb=16.0, allow_host_help="the bound address, localhost, 127.0.0.1 and ::1 "
                                                            "always are")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    from mmgrpo.utils.score_service import checked_server_args, serve_until_interrupted

    kwargs = checked_server_args(p, args)
    from .open import build_open_rewards, is_open_reward

    if not is_open_reward(args.reward):
        p.error(f"--reward {args.reward!r}: give 'judge' or an import path 'package.module:factory'")
    try:
        reward = build_open_rewards([args.reward], {args.reward: kwargs})[args.reward]
    except ValueError as e:
        p.error(str(e).replace(f"reward.kwargs.{args.reward}", "--reward-kwargs"))
    name = "judge" if args.reward == "judge" else args.reward.rpartition(":")[2]
    server = make_text_server(reward, name, args.host, args.port, max_body_mb=args.max_body_mb,
                              max_rows=args.max_rows, max_chars=args.max_chars, verbose=args.verbose,
                              allowed_hosts=args.allow_host, read_timeout=args.read_timeout,
                              max_connections=args.max_connections)
    return serve_until_interrupted(server)


if __name__ == "__main__":
    sys.exit(main())
