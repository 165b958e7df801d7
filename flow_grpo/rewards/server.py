"""Reference reward server (stdlib ``http.server``, loopback only) for :class:`~flow_grpo.rewards.remote.RemoteReward`.

    python -m flow_grpo.rewards.server --reward jpeg_compressibility --port 18085
    python -m flow_grpo.rewards.server --reward pickscore \
        --reward-kwargs '{"model_path": "/models/PickScore_v1", "processor_path": "/models/CLIP-ViT-H-14-laion2B-s32B-b79K"}'
    python -m flow_grpo.rewards.server --reward my_pkg.rewards:build_my_reward --port 0   # any factory

On start it prints one line ``LISTENING http://HOST:PORT`` to stdout (``--port 0`` picks a free port).
Endpoints: ``GET /health`` -> ``{"reward": name, "status": "ok"}``; ``POST /`` or ``POST /score`` -> scores
(wire format in :mod:`flow_grpo.rewards.remote`).  Calls to the reward are serialised with a lock (models are
rarely thread-safe); ``/health`` still answers while a call runs.

Security (the server runs whatever reward it was started with on the images it is sent):

* binds loopback addresses only, so only processes on this machine reach it;
* ``Host`` header: only the bound address, ``localhost``, ``127.0.0.1``, ``::1`` (any port) and names given with
  ``--allow-host`` are served, others get 400 (a web page cannot reach it through DNS rebinding);
* ``POST`` needs ``Content-Type: application/json`` (415 otherwise: a browser cannot send that cross-site without a
  CORS preflight, which this server never grants);
* token: when ``MMGRPO_REWARD_TOKEN`` is set in the server's environment, every request must carry
  ``Authorization: Bearer <token>`` (401 otherwise; the client sends it when the same variable is set) - use it
  when other users share the machine;
* sizes: ``Content-Length`` is required (411), must be a positive integer (400) and at most ``--max-body-mb``
  (413, refused before reading the body); the decoded images of one request are capped at ``--max-megapixels``
  (413, checked from the image headers before decoding).
"""
from __future__ import annotations

import argparse
import hmac
import ipaddress
import json
import os
import socket
import sys
import threading
import traceback
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["make_server", "main"]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """Host name of a ``Host`` header value without its port (``[::1]:80`` -> ``::1``), lower-cased."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:].partition("]")[0]
    return h.rpartition(":")[0] if h.count(":") == 1 else h


def make_server(reward: Any, host: str = "127.0.0.1", port: int = 0, max_body_mb: float = 256.0,
                verbose: bool = False, max_megapixels: float = 64.0, allowed_hosts: Iterable[str] = (),
                token: str | None = None) -> ThreadingHTTPServer:
    """An HTTP server scoring with ``reward`` (a reward callable); call ``serve_forever()`` on it.

    ``allowed_hosts``: extra names accepted in the ``Host`` header. ``token``: shared secret required as
    ``Authorization: Bearer <token>``; ``None`` reads ``MMGRPO_REWARD_TOKEN`` (unset or empty: no check)."""
    if not _is_loopback(host):
        raise ValueError(f"refusing to bind {host!r}: the reward server listens on loopback addresses only")
    from .base import RewardError
    from .remote import TOKEN_ENV, TooLarge, decode_images

    lock = threading.Lock()
    name = str(getattr(reward, "name", "reward"))
    max_body = int(max_body_mb * 1024 * 1024)
    max_pixels = int(max_megapixels * 1e6)
    hosts = {_host_name(host), "localhost", "127.0.0.1", "::1"} | {_host_name(h) for h in allowed_hosts}
    token = os.environ.get(TOKEN_ENV) if token is None else token
    expected_auth = f"Bearer {token}".encode() if token else None

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet unless asked
            if verbose:
                sys.stderr.write("reward-server: " + (fmt % args) + "\n")

        def _send(self, code: int, payload: dict, close: bool = False) -> None:
            """``close``: the request body was not read, so the connection cannot carry another request."""
            body = json.dumps(payload).encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if code == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # client gave up (timeout); nothing to do
                pass

        def _refused(self) -> bool:
            """Check the Host header and the token; answer and return True if the request is refused."""
            got = self.headers.get("Host")
            if got is None or _host_name(got) not in hosts:
                self._send(400, {"error": f"Host header {got!r} not allowed (serving {sorted(hosts)}; "
                                          "add names with --allow-host)"}, close=True)
                return True
            auth = (self.headers.get("Authorization") or "").encode("utf-8", "replace")
            if expected_auth is not None and not hmac.compare_digest(auth, expected_auth):
                self._send(401, {"error": f"missing or wrong 'Authorization: Bearer <token>' (the server has "
                                          f"{TOKEN_ENV} set)"}, close=True)
                return True
            return False

        def _body_length(self) -> int | None:
            """The request's Content-Length if acceptable; otherwise answer 400/411/413 and return None."""
            if self.headers.get("Transfer-Encoding") is not None or self.headers.get("Content-Length") is None:
                self._send(411, {"error": "Content-Length required (chunked bodies are not accepted)"}, close=True)
                return None
            raw = self.headers.get("Content-Length").strip()
            if not (raw.isascii() and raw.isdigit()) or int(raw) == 0:
                self._send(400, {"error": f"Content-Length {raw[:40]!r} is not a positive integer"}, close=True)
                return None
            if int(raw) > max_body:
                self._send(413, {"error": f"request of {int(raw) / 2**20:.1f} MB is above the server's cap "
                                          f"(--max-body-mb {max_body_mb:g})"}, close=True)
                return None
            return int(raw)

        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            if self._refused():
                return
            if self.path.rstrip("/") in ("/health", ""):
                self._send(200, {"reward": name, "status": "ok"})
            else:
                self._send(404, {"error": f"unknown path {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            if self._refused():
                return
            if self.path.rstrip("/") not in ("", "/score"):
                self._send(404, {"error": f"unknown path {self.path}"}, close=True)
                return
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            if ctype != "application/json":
                self._send(415, {"error": f"Content-Type {ctype!r}: expected application/json"}, close=True)
                return
            length = self._body_length()
            if length is None:
                return
            try:
                req = json.loads(self.rfile.read(length).decode("utf-8"))
                if not isinstance(req, dict):
                    raise ValueError("the request must be a JSON object")
                images = decode_images(req["images"], max_pixels)
                prompts = req["prompts"]
                metadata = req.get("metadata")
                kwargs = req.get("kwargs") or {}
                if not isinstance(kwargs, dict):
                    raise ValueError("'kwargs' must be an object")
            except TooLarge as e:
                self._send(413, {"error": str(e)})
                return
            except (KeyError, ValueError, TypeError, RecursionError) as e:
                self._send(400, {"error": f"bad request: {type(e).__name__}: {e}"})
                return
            try:
                with lock:
                    # Reward.evaluate returns numpy: numpy-only rewards never import torch here.
                    out = (reward.evaluate if hasattr(reward, "evaluate") else reward)(
                        images, prompts, metadata, **kwargs)
            except (RewardError, ValueError, TypeError) as e:  # deterministic: retrying cannot help
                self._send(422, {"error": f"{type(e).__name__}: {e}"})
                return
            except Exception as e:  # noqa: BLE001 - report, keep serving; client may retry
                if verbose:
                    traceback.print_exc()
                self._send(500, {"error": f"{type(e).__name__}: {e}"})
                return
            scores = {k: (v.detach().cpu().tolist() if hasattr(v, "detach") else
                          v.tolist() if hasattr(v, "tolist") else list(v)) for k, v in out.items()}
            self._send(200, {"reward": name, "n": int(images.shape[0]), "scores": scores})

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    return Server((host, port), Handler)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flow_grpo.rewards.server",
                                description="Serve one reward over HTTP on a loopback address. Set "
                                            "MMGRPO_REWARD_TOKEN to require 'Authorization: Bearer <token>' (the "
                                            "client sends it when the same variable is set in its environment).")
    p.add_argument("--reward", required=True, help="registered reward name or 'package.module:factory' (imported "
                                                   "and called: any code; name only factories you trust)")
    p.add_argument("--reward-kwargs", default="{}", help="JSON object of factory kwargs")
    p.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=18085, help="port (0 = pick a free one)")
    p.add_argument("--max-body-mb", type=float, default=256.0,
                   help="largest request accepted (MiB; default 256): larger ones get 413 before being read")
    p.add_argument("--max-megapixels", type=float, default=64.0,
                   help="largest total of decoded pixels per request (millions; default 64, e.g. 61 images of "
                        "1024x1024): larger requests get 413, checked before decoding")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="extra name accepted in the Host header (repeatable); the bound address, localhost, "
                        "127.0.0.1 and ::1 always are")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    try:
        kwargs = json.loads(args.reward_kwargs)
        if not isinstance(kwargs, dict):
            raise ValueError("not an object")
    except ValueError as e:
        p.error(f"--reward-kwargs must be a JSON object: {e}")
    if not _is_loopback(args.host):
        p.error(f"--host {args.host!r} is not a loopback address")

    from .base import build_reward, check_reward_settings

    problems = check_reward_settings({args.reward: 1.0}, {args.reward: kwargs}, prefix="--reward-kwargs")
    if problems:  # before loading any weights
        p.error("; ".join(problems).replace(f"--reward-kwargs.{args.reward}.", "--reward-kwargs key "))
    reward = build_reward(args.reward, **kwargs)
    server = make_server(reward, args.host, args.port, args.max_body_mb, args.verbose,
                         max_megapixels=args.max_megapixels, allowed_hosts=args.allow_host)
    host, port = server.server_address[:2]
    print(f"LISTENING http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
