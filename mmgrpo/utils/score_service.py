"""One scoring service for both front-ends: a reward (or judge) served over HTTP, and its client.

The flow front-end serves image rewards with it (:mod:`flow_grpo.rewards.server`, client
:class:`flow_grpo.rewards.remote.RemoteReward`); the VLM front-end serves text rewards, the model-based judge first
(:mod:`mmgrpo.vlm.rewards.server`, client :class:`mmgrpo.vlm.rewards.remote.RemoteTextReward`). The two differ only
in what a request carries (images and prompts / completions and samples), which each passes in as ``decode``; the
rest is here once:

* **server** (:func:`make_score_server`): the transport guard of :mod:`mmgrpo.utils.http_guard` (loopback only,
  ``Host`` allowlist, JSON content type, ``Content-Length`` and body cap, read deadline, connection cap, HMAC token);
  calls to the reward serialised by a lock (models are rarely thread-safe; ``/health`` still answers while a call
  runs); errors mapped to statuses the client acts on: 400 malformed request, 413 over a size cap (``TooLarge``
  from ``decode``), 422 the reward refused the input (a deterministic error: retrying cannot help), 500 the reward
  crashed (retried); every reply names the reward and the row count. **Counted failures**: ``server.stats`` (and
  ``GET /health``) holds the requests, the scored calls and rows, and the failures by status;
* **client** (:class:`ScoreClient`): one POST per attempt under a wall-clock ``timeout`` and a reply size cap, no
  redirects, a signed request when the token variable is set (and a reply used only if signed back), ``retries``
  with exponential backoff after a connection error, timeout, 429 or 5xx (never after a 4xx or a malformed reply),
  every reply validated before use (``scores`` maps names to lists of exactly N JSON numbers or ``null``,
  ``valid`` to JSON booleans, ``n`` equals N) and its keys renamed from the server's reward name to the client's.
  **Counted failures**: ``stats`` (calls, attempts, failed attempts, failed calls) and ``last_attempts``.

Wire format (JSON): ``POST /score`` (or ``/``) with the front-end's request object; ``200 {"reward": name,
"n": N, "scores": {"<key>": [N values], ...}}``; ``4xx / 5xx {"error": "..."}``. Nothing on either side unpickles
or evaluates what it receives.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
import traceback
from collections import Counter
from typing import Any, Callable, Iterable, Mapping, Optional

from .http_guard import GuardedHandler, GuardedServer, HTTPFailure, TooLarge, error_text, http_request, is_loopback

__all__ = ["make_score_server", "ScoreClient", "to_lists", "TooLarge", "checked_server_args", "serve_until_interrupted"]

logger = logging.getLogger(__name__)

Decode = Callable[[dict], "tuple[tuple, dict, int]"]


def checked_server_args(parser, args) -> dict:
    """The checks both servers' ``main`` run after parsing: ``--reward-kwargs`` is a JSON object (returned) and
    ``--host`` a loopback address; either failing is a ``parser.error`` (usage + message, exit 2)."""
    try:
        kwargs = json.loads(args.reward_kwargs)
        if not isinstance(kwargs, dict):
            raise ValueError("not an object")
    except ValueError as e:
        parser.error(f"--reward-kwargs must be a JSON object: {e}")
    if not is_loopback(args.host):
        parser.error(f"--host {args.host!r} is not a loopback address")
    return kwargs


def serve_until_interrupted(server) -> int:
    """Print ``LISTENING http://HOST:PORT`` (the line clients and tests wait for), serve until Ctrl-C, close."""
    host, port = server.server_address[:2]
    print(f"LISTENING http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def to_lists(out: Mapping[str, Any]) -> dict[str, list]:
    """A reward's output (tensors, numpy arrays or sequences per key) as JSON lists."""
    return {str(k): (v.detach().cpu().tolist() if hasattr(v, "detach") else
                     v.tolist() if hasattr(v, "tolist") else list(v)) for k, v in out.items()}


def make_score_server(score: Callable[..., Mapping[str, Any]], decode: Decode, *, name: str,
                      host: str = "127.0.0.1", port: int = 0, max_body_mb: float = 256.0, verbose: bool = False,
                      allowed_hosts: Iterable[str] = (), token: Optional[str] = None, token_env: str = "",
                      read_timeout: float = 30.0, max_connections: int = 64,
                      deterministic: tuple[type[BaseException], ...] = (ValueError, TypeError),
                      log_prefix: str = "score-server", what: str = "reward") -> GuardedServer:
    """An HTTP server answering ``POST /score`` with ``score(*args, **kwargs)`` where ``(args, kwargs, n) =
    decode(request_object)``; call ``serve_forever()`` on it.

    ``decode`` raises ``KeyError`` / ``ValueError`` / ``TypeError`` for a malformed request (400) and
    :class:`~mmgrpo.utils.http_guard.TooLarge` above a cap (413). ``score`` raising one of ``deterministic`` gives
    422, anything else 500. ``token``: the shared secret (``None`` reads ``token_env``; unset or empty: no check).
    ``server.stats`` counts requests, scored calls and rows, and failures by status."""
    if not is_loopback(host):
        raise ValueError(f"refusing to bind {host!r}: the {what} server listens on loopback addresses only")
    lock = threading.Lock()
    stats_lock = threading.Lock()
    stats: Counter = Counter()
    if token is None and token_env:
        token = os.environ.get(token_env)

    def count(key: str, k: int = 1) -> None:
        with stats_lock:
            stats[key] += k

    class Handler(GuardedHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            if self.admit(post=False) is None:
                return
            if self.path.rstrip("/") in ("/health", ""):
                with stats_lock:
                    snap = dict(stats)
                self.send_json(200, {"reward": name, "status": "ok", "stats": snap})
            else:
                self.send_json(404, {"error": f"unknown path {self.path}"})

        def fail(self, status: int, msg: str, **kw: Any) -> None:
            count(f"failed_{status}")
            self.send_json(status, {"error": msg}, **kw)

        def do_POST(self) -> None:  # noqa: N802
            if self.path.rstrip("/") not in ("", "/score"):
                self.fail(404, f"unknown path {self.path}", close=True)
                return
            if self.admit(post=True) is None:
                count("refused")  # by the guard: host, content type, size, token (its own reply was sent)
                return
            count("requests")
            try:
                req = self.json_body()
                if not isinstance(req, dict):
                    raise ValueError("the request must be a JSON object")
                args, kwargs, n = decode(req)
            except TooLarge as e:
                self.fail(413, str(e))
                return
            except (KeyError, ValueError, TypeError, RecursionError) as e:
                self.fail(400, f"bad request: {type(e).__name__}: {e}")
                return
            try:
                with lock:
                    out = score(*args, **kwargs)
                scores = to_lists(out)
            except deterministic as e:  # the reward refused this input: retrying cannot help
                self.fail(422, f"{type(e).__name__}: {e}")
                return
            except Exception as e:  # noqa: BLE001 - report, keep serving; the client may retry
                if verbose:
                    traceback.print_exc()
                self.fail(500, f"{type(e).__name__}: {e}")
                return
            count("scored_calls")
            count("scored_rows", int(n))
            self.send_json(200, {"reward": name, "n": int(n), "scores": scores})

    Handler.log_prefix = log_prefix
    srv = GuardedServer((host, port), Handler, token=token, token_env=token_env, allowed_hosts=allowed_hosts,
                        max_body_bytes=int(max_body_mb * 1024 * 1024), read_timeout=read_timeout,
                        max_connections=max_connections, verbose=verbose)
    srv.stats = stats  # type: ignore[attr-defined]
    return srv


class _Retryable(Exception):
    pass


class ScoreClient:
    """POST a request object to a score server and return its validated, renamed scores.

    Args:
        url: the endpoint, e.g. ``"http://127.0.0.1:18085/score"``.
        name: the scores' key on this side (the server's reward name ``R`` is renamed: ``R -> name``,
            ``R/aux -> name/aux``).
        timeout: wall-clock seconds one attempt may take in total (connect, send, server time, read).
        retries: extra attempts after a connection error, timeout, 429 or 5xx (``1 + retries`` in all), waiting
            ``backoff * 2**k`` seconds between them; 4xx, malformed and oversized replies are not retried.
        max_reply_mb: largest reply accepted (MiB).
        token_env: the environment variable holding the shared secret (read at every call; never stored).
        what / unit: the words error messages use for the service and its rows ("reward", "images").
        error: builds the exception a failed call raises from its message.
    """

    def __init__(self, url: str, name: str, *, timeout: float = 60.0, retries: int = 2, backoff: float = 0.5,
                 max_reply_mb: float = 64.0, token_env: str = "", what: str = "reward", unit: str = "rows",
                 error: Callable[[str], Exception] = RuntimeError):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if not timeout > 0 or retries < 0 or backoff < 0 or not max_reply_mb > 0:
            raise ValueError("need timeout > 0, retries >= 0, backoff >= 0, max_reply_mb > 0")
        self.url, self.name, self.what, self.unit = url, str(name), what, unit
        self.timeout, self.retries, self.backoff = float(timeout), int(retries), float(backoff)
        self.max_reply_mb = float(max_reply_mb)
        self.max_reply_bytes = int(max_reply_mb * 2**20)
        self.token_env = token_env
        self.error = error
        self.last_attempts = 0
        #: calls, attempts, failed attempts (each retry's cause) and failed calls (the caller got an exception)
        self.stats: Counter = Counter()

    # ------------------------------------------------------------------------------------------ one attempt
    def _post_once(self, body: bytes) -> Any:
        token = (os.environ.get(self.token_env) if self.token_env else None) or None
        try:
            reply = http_request(self.url, "POST", body, timeout=self.timeout, max_reply_bytes=self.max_reply_bytes,
                                 token=token, what=f"{self.what} server {self.url}")
        except HTTPFailure as e:
            if e.retryable:
                raise _Retryable(str(e)) from None
            cap = f" (max_reply_mb={self.max_reply_mb:g})" if "reply cap" in str(e) else ""
            raise self.error(f"{self.what} {self.name!r}: {e}{cap}") from None
        if reply.status >= 300:
            msg = error_text(reply)
            if token and not reply.authenticated:
                msg += " [unauthenticated reply]"
            if reply.status >= 500 or reply.status == 429:
                raise _Retryable(f"HTTP {reply.status}: {msg}")
            hint = ""
            if reply.status == 401 and self.token_env:
                hint = (f" (set {self.token_env} to the server's token)" if not token
                        else f" ({self.token_env} differs from the server's)")
            raise self.error(f"{self.what} {self.name!r}: server {self.url} rejected the request "
                             f"(HTTP {reply.status}): {msg}{hint}")
        try:
            return json.loads(reply.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise self.error(f"{self.what} {self.name!r}: the reply from {self.url} is not JSON ({e}): "
                             f"{reply.body[:200]!r}") from e

    # ---------------------------------------------------------------------------------------------- a call
    def post(self, payload: Mapping[str, Any], n: int) -> dict[str, list]:
        """``{key: list of n values}`` (``valid``: booleans; other keys: floats, ``null`` -> NaN) for ``payload``
        (any JSON-serialisable mapping) scoring ``n`` rows; raises ``error(...)`` when no usable reply came."""
        self.stats["calls"] += 1
        try:
            try:
                body = json.dumps(dict(payload)).encode("utf-8")
            except (TypeError, ValueError) as e:
                raise self.error(f"{self.what} {self.name!r}: the request is not JSON-serialisable ({e})") from e
            last: Exception | None = None
            for attempt in range(self.retries + 1):
                self.last_attempts = attempt + 1
                self.stats["attempts"] += 1
                try:
                    resp = self._post_once(body)
                    break
                except _Retryable as e:
                    last = e
                    self.stats["failed_attempts"] += 1
                    logger.warning("%s %r: attempt %d/%d to %s failed: %s", self.what, self.name, attempt + 1,
                                   self.retries + 1, self.url, e)
                    if attempt < self.retries:
                        time.sleep(self.backoff * (2 ** attempt))
            else:
                raise self.error(f"{self.what} {self.name!r}: POST {self.url} failed after {self.retries + 1} "
                                 f"attempt(s): {last}")
            return self.rename(resp, n)
        except Exception:
            self.stats["failed_calls"] += 1
            raise

    def check_reply(self, resp: Any, n: int) -> None:
        """Raise ``error(...)`` unless ``resp`` is a well-typed reply for ``n`` rows (module doc)."""

        def bad(what: str) -> Exception:
            return self.error(f"{self.what} {self.name!r}: malformed reply from {self.url}: {what}")

        def show(x: Any) -> str:
            return f"{x!r:.60} ({type(x).__name__})"

        if not isinstance(resp, dict) or not isinstance(resp.get("scores"), dict):
            raise bad(f"expected an object with a 'scores' object, got {str(resp)[:200]}")
        if "reward" in resp and not isinstance(resp["reward"], str):
            raise bad(f"'reward' is {show(resp['reward'])}, expected a string")
        if "n" in resp and (type(resp["n"]) is not int or resp["n"] != n):
            raise bad(f"'n' is {show(resp['n'])} for a request of {n} {self.unit}")
        for k, v in resp["scores"].items():
            if not isinstance(v, list):
                raise bad(f"scores[{k!r}] is {show(v)}, expected a list of {n} entries")
            if len(v) != n:
                raise bad(f"scores[{k!r}] has {len(v)} value(s) for a request of {n} {self.unit}")
            for i, x in enumerate(v):
                if k == "valid" and type(x) is not bool:
                    raise bad(f"scores['valid'][{i}] is {show(x)}, expected JSON true/false")
                if k != "valid" and not (x is None or type(x) in (int, float)):
                    raise bad(f"scores[{k!r}][{i}] is {show(x)}, expected a JSON number or null")

    def rename(self, resp: Any, n: int) -> dict[str, list]:
        """The checked reply's scores with the server's reward name replaced by ``name``; ``null`` -> NaN."""
        self.check_reply(resp, n)
        remote = str(resp.get("reward", self.name))
        out: dict[str, list] = {}
        for k, v in resp["scores"].items():
            if k == "valid":
                out[k] = list(v)
                continue
            if k == remote:
                k = self.name
            elif k.startswith(remote + "/"):
                k = self.name + k[len(remote):]
            out[k] = [float("nan") if x is None else float(x) for x in v]
        if self.name not in out:
            raise self.error(f"{self.what} {self.name!r}: the reply from {self.url} has keys {sorted(out)} but not "
                             f"the server reward's own key {remote!r}")
        return out
