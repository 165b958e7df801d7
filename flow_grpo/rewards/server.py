"""Reference reward server (stdlib ``http.server``, loopback only) for :class:`~flow_grpo.rewards.remote.RemoteReward`.

    python -m flow_grpo.rewards.server --reward jpeg_compressibility --port 18085
    python -m flow_grpo.rewards.server --reward pickscore --reward-kwargs '{"path": "/models/pickscore"}'
    python -m flow_grpo.rewards.server --reward my_pkg.rewards:build_my_reward --port 0   # any factory

On start it prints one line ``LISTENING http://HOST:PORT`` to stdout (``--port 0`` picks a free port).
Endpoints: ``GET /health`` -> ``{"reward": name, "status": "ok"}``; ``POST /`` or ``POST /score`` -> scores
(wire format in :mod:`flow_grpo.rewards.remote`).  Calls to the reward are serialised with a lock (models are
rarely thread-safe); ``/health`` still answers while a call runs.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import socket
import sys
import threading
import traceback
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


def make_server(reward: Any, host: str = "127.0.0.1", port: int = 0, max_body_mb: float = 256.0,
                verbose: bool = False) -> ThreadingHTTPServer:
    """An HTTP server scoring with ``reward`` (a reward callable); call ``serve_forever()`` on it."""
    if not _is_loopback(host):
        raise ValueError(f"refusing to bind {host!r}: the reward server listens on loopback addresses only")
    from .base import RewardError
    from .remote import decode_images

    lock = threading.Lock()
    name = str(getattr(reward, "name", "reward"))
    max_body = int(max_body_mb * 1024 * 1024)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet unless asked
            if verbose:
                sys.stderr.write("reward-server: " + (fmt % args) + "\n")

        def _send(self, code: int, payload: dict) -> None:
            body = json.dumps(payload).encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # client gave up (timeout); nothing to do
                pass

        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            if self.path.rstrip("/") in ("/health", ""):
                self._send(200, {"reward": name, "status": "ok"})
            else:
                self._send(404, {"error": f"unknown path {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path.rstrip("/") not in ("", "/score"):
                self._send(404, {"error": f"unknown path {self.path}"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length <= 0 or length > max_body:
                self._send(413 if length > max_body else 400,
                           {"error": f"Content-Length {length} not in (0, {max_body}]"})
                return
            try:
                req = json.loads(self.rfile.read(length).decode("utf-8"))
                images = decode_images(req["images"])
                prompts = req["prompts"]
                metadata = req.get("metadata")
                kwargs = req.get("kwargs") or {}
                if not isinstance(kwargs, dict):
                    raise ValueError("'kwargs' must be an object")
            except (KeyError, ValueError, TypeError) as e:
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
                                description="Serve one reward over HTTP on a loopback address.")
    p.add_argument("--reward", required=True, help="registered reward name or 'package.module:factory'")
    p.add_argument("--reward-kwargs", default="{}", help="JSON object of factory kwargs")
    p.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=18085, help="port (0 = pick a free one)")
    p.add_argument("--max-body-mb", type=float, default=256.0)
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

    from .base import build_reward

    reward = build_reward(args.reward, **kwargs)
    server = make_server(reward, args.host, args.port, args.max_body_mb, args.verbose)
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
