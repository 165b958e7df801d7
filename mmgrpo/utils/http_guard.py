"""Hardened HTTP for mmgrpo's two small servers and their clients: the reward server
(:mod:`flow_grpo.rewards.server`, client :class:`flow_grpo.rewards.remote.RemoteReward`) and the vLLM rollout server
(:mod:`mmgrpo.vlm.models.vllm_server`, client ``VLLMServerClient``).  Guarantees: docs/reliability.md.

Server side (:class:`GuardedServer` + :class:`GuardedHandler`):

* binds loopback addresses only, unless ``allow_remote`` (which requires a token);
* ``Host`` header allowlist (the bound address, ``localhost``, ``127.0.0.1``, ``::1`` and ``--allow-host`` names):
  a web page cannot reach the server through DNS rebinding; ``POST`` needs ``Content-Type: application/json`` (a
  browser cannot send it cross-site without a CORS preflight, which is never granted);
* ``Content-Length`` required (411), a positive integer (400), at most the body cap (413, refused before reading);
* a read deadline: a connection has ``read_timeout`` seconds from its accept (or the end of its previous reply) to
  deliver a complete request, headers and body, and as long to take a reply; idle or trickling connections are
  closed when it passes (the server's own work on a request has no deadline);
* a connection cap: a new connection beyond ``max_connections`` evicts the oldest connection that is still waiting
  for its request (idle ones first), so idle connections cannot lock a real client out; when every connection is
  busy with real work it gets 503 (retried by the clients);
* when a token is set, every request must be signed (below): 401 otherwise.

Authentication (challenge-response; the token itself never travels)::

    request  X-MMGRPO-Auth: v1 t=<unix time> n=<nonce, 32 hex> h=<sha256(body)> m=<HMAC(token, REQ)>
             REQ   = "mmgrpo-v1 request\\n<METHOD>\\n<path>\\n<t>\\n<n>\\n<h>"
    reply    X-MMGRPO-Reply-Auth: v1 m=<HMAC(token, REPLY)>
             REPLY = "mmgrpo-v1 reply\\n<n>\\n<status>\\n<sha256(reply body)>"

(HMAC-SHA256, hex.)  The server checks the request's MAC from the headers alone, before reading the body (``h`` is
covered, so the body is then checked against it), refuses ``t`` off by more than :data:`AUTH_WINDOW_S` from its
clock and a nonce it has already seen in that window (a captured request cannot be replayed).  The client uses a
2xx reply only if its MAC verifies against its own nonce: a process that took the port (e.g. while the real
server restarts) learns nothing it can reuse, and cannot supply scores, completions or a weight-transfer address.
Why not the simpler ``Authorization: Bearer <token>``: that hands the token to whoever listens on the port.
"""
from __future__ import annotations

import hashlib
import hmac
import http.client
import ipaddress
import json
import os
import secrets
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable, Optional

__all__ = ["AUTH_HEADER", "REPLY_AUTH_HEADER", "AUTH_WINDOW_S", "sign_request", "sign_reply", "reply_mac_ok",
           "GuardedServer", "GuardedHandler", "HTTPFailure", "Reply", "TooLarge", "http_request", "is_loopback",
           "read_capped", "error_text", "env_token", "add_server_arguments"]

AUTH_HEADER = "X-MMGRPO-Auth"
REPLY_AUTH_HEADER = "X-MMGRPO-Reply-Auth"
AUTH_WINDOW_S = 300.0  # accepted clock difference between client and server (multi-node servers: NTP suffices)


# ------------------------------------------------------------------------------------------------ helpers
def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """Host name of a ``Host`` header value without its port (``[::1]:80`` -> ``::1``), lower-cased."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:].partition("]")[0]
    return h.rpartition(":")[0] if h.count(":") == 1 else h


def _target(path_or_url: str) -> str:
    """The request target as signed: path and query (an absolute URL, as proxies see it, is reduced to them)."""
    s = urllib.parse.urlsplit(path_or_url)
    return (s.path or "/") + (f"?{s.query}" if s.query else "")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _mac(token: str, *fields: Any) -> str:
    return hmac.new(token.encode("utf-8"), "\n".join(str(f) for f in fields).encode("utf-8"),
                    hashlib.sha256).hexdigest()


# --------------------------------------------------------------------------------------------------- auth
def sign_request(token: str, method: str, path: str, body: bytes, now: Optional[float] = None) -> tuple[str, str]:
    """``(X-MMGRPO-Auth header value, nonce)`` for one request."""
    t = f"{time.time() if now is None else now:.3f}"
    n = secrets.token_hex(16)
    h = _sha(body)
    m = _mac(token, "mmgrpo-v1 request", method.upper(), _target(path), t, n, h)
    return f"v1 t={t} n={n} h={h} m={m}", n


def sign_reply(token: str, nonce: str, status: int, body: bytes) -> str:
    return f"v1 m={_mac(token, 'mmgrpo-v1 reply', nonce, int(status), _sha(body))}"


def reply_mac_ok(token: str, nonce: str, status: int, body: bytes, header: Optional[str]) -> bool:
    return bool(header) and hmac.compare_digest(header.strip(), sign_reply(token, nonce, status, body))


def _parse_auth(value: str) -> dict[str, str]:
    parts = value.split()
    if not parts or parts[0] != "v1":
        raise ValueError("not a v1 signature")
    out = dict(p.partition("=")[::2] for p in parts[1:])
    if set(out) != {"t", "n", "h", "m"}:
        raise ValueError("needs t, n, h and m")
    float(out["t"])
    return out


class _Nonces:
    """Nonces of accepted requests, kept for twice the clock window (a replay inside it is refused)."""

    def __init__(self, keep_s: float):
        self.keep_s = keep_s
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def first_use(self, nonce: str) -> bool:
        now = time.monotonic()
        with self._lock:
            if len(self._seen) > 4096:
                self._seen = {n: t for n, t in self._seen.items() if t > now}
            if self._seen.get(nonce, 0.0) > now:
                return False
            self._seen[nonce] = now + self.keep_s
            return True


# ----------------------------------------------------------------------------------------------- server
@dataclass
class _Conn:
    state: str  # idle (no request yet) | reading (headers read, body pending) | busy (being served) | writing
    since: float
    evicted: bool = False


_WAITING = ("idle", "reading")  # states under the read deadline that a new connection may evict (in this order)


class GuardedServer(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` with the limits of the module doc.  ``handler_cls`` subclasses
    :class:`GuardedHandler`.

    Args:
        token: shared secret (``None`` or empty: no authentication; required when ``allow_remote``).
        token_env: the environment variable users set the token in (named in error messages).
        allowed_hosts: extra names accepted in the ``Host`` header.
        max_body_bytes: largest request body (413 before reading).
        read_timeout: seconds a connection may take to deliver one complete request, and to take a reply.
        max_connections: open connections at most (the oldest waiting one is evicted beyond it).
        allow_remote: bind a non-loopback address (requires ``token``).
    """

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler_cls: type, *, token: Optional[str] = None,
                 token_env: str = "", allowed_hosts: Iterable[str] = (), max_body_bytes: int = 256 << 20,
                 read_timeout: float = 30.0, max_connections: int = 64, allow_remote: bool = False,
                 verbose: bool = False):
        host = address[0]
        self.check_bind(host, allow_remote, token, token_env)
        if read_timeout <= 0 or max_connections < 1 or max_body_bytes < 1:
            raise ValueError("need read_timeout > 0, max_connections >= 1, max_body_bytes >= 1")
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.token = token or None
        self.token_env = token_env
        self.max_body_bytes = int(max_body_bytes)
        self.read_timeout = float(read_timeout)
        self.max_connections = int(max_connections)
        self.verbose = verbose
        hosts = {"localhost", "127.0.0.1", "::1"} | {host_name(h) for h in allowed_hosts}
        wildcard = host in ("", "0.0.0.0", "::")
        if wildcard:  # reached by this machine's names (its addresses: --allow-host)
            hosts |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        else:
            hosts.add(host_name(host))
        self.allowed_hosts = hosts
        self.nonces = _Nonces(2 * AUTH_WINDOW_S)
        self._conns: dict[socket.socket, _Conn] = {}
        self._conns_lock = threading.Lock()
        self._closing = threading.Event()
        self.evictions = 0  # connections closed to make room or past their deadline (for tests / logs)
        super().__init__(address, handler_cls)
        self._reaper = threading.Thread(target=self._reap, name="http-guard-reaper", daemon=True)
        self._reaper.start()

    @staticmethod
    def check_bind(host: str, allow_remote: bool, token: Optional[str], token_env: str = "") -> None:
        """ValueError unless ``host`` is a loopback address, or remote access is allowed and a token is set."""
        if not is_loopback(host) and not allow_remote:
            raise ValueError(f"refusing to bind {host!r}: loopback addresses only, unless remote access is allowed "
                             "explicitly (--allow-remote, which requires a token)")
        if allow_remote and not token:
            raise ValueError(f"remote access (--allow-remote, host {host!r}) requires a token: set "
                             f"{token_env or 'the token'} in the server's and the client's environment")

    # connection table
    def set_state(self, sock: socket.socket, state: str, restart: bool = False) -> None:
        with self._conns_lock:
            c = self._conns.get(sock)
            if c is not None:
                c.state = state
                if restart:
                    c.since = time.monotonic()

    def _evict(self, sock: socket.socket, c: _Conn) -> None:
        c.evicted = True
        self.evictions += 1
        try:
            sock.shutdown(socket.SHUT_RDWR)  # the handler's blocked read / write returns at once
        except OSError:
            pass

    def process_request(self, request, client_address):
        with self._conns_lock:
            live = [(s, c) for s, c in self._conns.items() if not c.evicted]
            full = len(live) >= self.max_connections
            waiting = [(s, c) for s, c in live if c.state in _WAITING]
            if full and waiting:
                s, c = min(waiting, key=lambda sc: (_WAITING.index(sc[1].state), sc[1].since))
                self._evict(s, c)
            if not (full and not waiting):
                self._conns[request] = _Conn("idle", time.monotonic())
        if full and not waiting:
            self._refuse_busy(request)
            return
        super().process_request(request, client_address)

    def _refuse_busy(self, request) -> None:
        body = json.dumps({"error": f"server busy: {self.max_connections} connections are being served "
                                    "(--max-connections); retry"}).encode()
        try:
            request.settimeout(0.5)
            request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                            b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        except OSError:
            pass
        self.shutdown_request(request)

    def shutdown_request(self, request):
        with self._conns_lock:
            self._conns.pop(request, None)
        super().shutdown_request(request)

    def _reap(self) -> None:
        """Close connections that waited for their request (or took their reply) longer than ``read_timeout``."""
        interval = max(0.02, min(1.0, self.read_timeout / 5))
        while not self._closing.wait(interval):
            now = time.monotonic()
            with self._conns_lock:
                for s, c in list(self._conns.items()):
                    if not c.evicted and c.state != "busy" and now - c.since > self.read_timeout:
                        self._evict(s, c)

    def open_connections(self) -> int:
        with self._conns_lock:
            return sum(not c.evicted for c in self._conns.values())

    def handle_error(self, request, client_address):
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, OSError) and not self.verbose:  # a client that went away or was evicted: expected
            return
        super().handle_error(request, client_address)

    def server_close(self):
        self._closing.set()
        super().server_close()


class GuardedHandler(BaseHTTPRequestHandler):
    """Base request handler of a :class:`GuardedServer`: call :meth:`admit` first in ``do_GET`` / ``do_POST``; it
    answers refused requests itself and returns the body to serve, or None.  Reply with :meth:`send_json`."""

    protocol_version = "HTTP/1.1"
    server: GuardedServer
    log_prefix = "http"

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.read_timeout)  # no single read / write blocks longer

    def handle_one_request(self) -> None:
        self._nonce, self._body = None, None
        self.server.set_state(self.connection, "idle")
        super().handle_one_request()
        self.server.set_state(self.connection, "idle", restart=True)  # the next request's deadline starts now

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if ok:
            self.server.set_state(self.connection, "reading")
        return ok

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet unless asked
        if self.server.verbose:
            import sys

            sys.stderr.write(f"{self.log_prefix}: " + (fmt % args) + "\n")

    # ------------------------------------------------------------------ replies
    def send_json(self, code: int, payload: dict, close: bool = False) -> None:
        """``close``: the request body was not read, so the connection cannot carry another request."""
        body = json.dumps(payload).encode("utf-8")
        self.server.set_state(self.connection, "writing", restart=True)
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if code == 401:
                self.send_header("WWW-Authenticate", "MMGRPO-HMAC")
            if self._nonce is not None:
                self.send_header(REPLY_AUTH_HEADER, sign_reply(self.server.token, self._nonce, code, body))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
        except OSError:  # the client gave up, timed out, or was evicted: nothing to do
            self.close_connection = True

    def _refuse(self, code: int, msg: str) -> None:
        self.send_json(code, {"error": msg}, close=True)

    # ------------------------------------------------------------------ admission
    def admit(self, post: bool) -> Optional[bytes]:
        """Host, signature (from the headers), Content-Type and Content-Length of the current request; then its body
        (``b""`` for GET), checked against the signed hash.  None if refused (already answered)."""
        srv = self.server
        got = self.headers.get("Host")
        if got is None or host_name(got) not in srv.allowed_hosts:
            self._refuse(400, f"Host header {got!r} not allowed (serving {sorted(srv.allowed_hosts)}; add names with "
                              "--allow-host)")
            return None
        signed = None
        if srv.token:
            signed = self._check_signature()
            if signed is None:
                return None
        body = b""
        if post:
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            if ctype != "application/json":
                self._refuse(415, f"Content-Type {ctype!r}: expected application/json")
                return None
            length = self._body_length()
            if length is None:
                return None
            try:
                body = self.rfile.read(length)
            except OSError:
                self.close_connection = True
                return None
            if len(body) != length:  # closed early (or evicted past the deadline)
                self.close_connection = True
                return None
        elif self.headers.get("Content-Length", "0").strip() not in ("", "0"):
            self._refuse(400, f"{self.command} with a body")
            return None
        if signed is not None and not hmac.compare_digest(_sha(body), signed["h"]):
            self._refuse(401, "the body does not match its signed hash")
            return None
        if signed is not None:
            self._nonce = signed["n"]  # replies to this request are signed
        srv.set_state(self.connection, "busy")
        self._body = body
        return body

    def json_body(self) -> Any:
        """The admitted body parsed as JSON (``ValueError`` if it is not).  Call as ``if self.admit(True) is None:
        return`` then ``self.json_body()``: the bytes are dropped before parsing, so a request costs about twice its
        size at peak (bytes + text, then text + objects), not three times."""
        raw, self._body = self._body, None
        text = raw.decode("utf-8")
        del raw
        return json.loads(text)

    def _check_signature(self) -> Optional[dict]:
        srv = self.server
        value = self.headers.get(AUTH_HEADER)
        hint = (f"the server has {srv.token_env} set; mmgrpo's client signs its requests when the same variable is "
                "set in its environment")
        if not value:
            self._refuse(401, f"missing {AUTH_HEADER} signature ({hint})")
            return None
        try:
            a = _parse_auth(value)
        except ValueError as e:
            self._refuse(401, f"malformed {AUTH_HEADER}: {e}")
            return None
        want = _mac(srv.token, "mmgrpo-v1 request", self.command.upper(), _target(self.path), a["t"], a["n"], a["h"])
        if not hmac.compare_digest(a["m"], want):
            self._refuse(401, f"wrong signature: the client's {srv.token_env} differs from the server's")
            return None
        skew = time.time() - float(a["t"])
        if abs(skew) > AUTH_WINDOW_S:
            self._refuse(401, f"signed {skew:+.0f} s away from the server's clock (window ±{AUTH_WINDOW_S:g} s)")
            return None
        if not srv.nonces.first_use(a["n"]):
            self._refuse(401, "replayed request (its nonce was already used)")
            return None
        return a

    def _body_length(self) -> Optional[int]:
        if self.headers.get("Transfer-Encoding") is not None or self.headers.get("Content-Length") is None:
            self._refuse(411, "Content-Length required (chunked bodies are not accepted)")
            return None
        raw = self.headers.get("Content-Length").strip()
        if not (raw.isascii() and raw.isdigit()) or int(raw) == 0:
            self._refuse(400, f"Content-Length {raw[:40]!r} is not a positive integer")
            return None
        if int(raw) > self.server.max_body_bytes:
            self._refuse(413, f"request of {int(raw) / 2**20:.1f} MB is above the server's cap (--max-body-mb "
                              f"{self.server.max_body_bytes / 2**20:g})")
            return None
        return int(raw)


def add_server_arguments(parser, max_body_mb: float, allow_host_help: str) -> None:
    """The guard's options, the same on both servers: ``--allow-host``, ``--max-body-mb``, ``--read-timeout``,
    ``--max-connections`` (read back into :class:`GuardedServer`'s arguments by the server's ``main``)."""
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help=f"extra name accepted in the Host header (repeatable); {allow_host_help}")
    parser.add_argument("--max-body-mb", type=float, default=max_body_mb,
                        help=f"largest request accepted (MiB; default {max_body_mb:g}): larger ones get 413 before "
                             "being read")
    parser.add_argument("--read-timeout", type=float, default=30.0,
                        help="seconds a connection may take to send a complete request (and to take a reply); idle "
                             "or trickling connections are closed after it (default 30)")
    parser.add_argument("--max-connections", type=int, default=64,
                        help="open connections at most; a new one evicts the oldest still waiting for its request, "
                             "and gets 503 when all are busy (default 64)")


# ----------------------------------------------------------------------------------------------- client
class TooLarge(ValueError):
    """Input above a configured size cap."""


class HTTPFailure(Exception):
    """A call that did not produce a usable reply.  ``retryable``: connection error, timeout, 5xx / 429."""

    def __init__(self, msg: str, retryable: bool = False, status: Optional[int] = None):
        super().__init__(msg)
        self.retryable = retryable
        self.status = status


@dataclass
class Reply:
    status: int
    body: bytes
    authenticated: bool  # the reply's MAC verified (always False without a token)


class _Deadline:
    """Wall-clock limit on one HTTP exchange.

    A socket timeout applies to each read separately, so a server sending one byte per second would never trip it.
    When this deadline passes, the sockets of the exchange are shut down: any read blocked on them returns at once
    and the exchange fails (reported as a timeout because ``expired`` is set)."""

    def __init__(self, seconds: float):
        self.expired = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> "_Deadline":
        self._timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._timer.cancel()

    def watch(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._socks.append(sock)
            expired = self.expired
        if expired:
            _shutdown(sock)
        return sock

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            socks = list(self._socks)
        for sock in socks:
            _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed
        pass


def _watched(conn_cls: type, deadline: _Deadline) -> type:
    """``conn_cls`` (HTTP or HTTPS connection) whose raw socket is registered with ``deadline`` as soon as it is
    connected (before any TLS handshake, so a stalled handshake is covered too)."""

    class Conn(conn_cls):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            create = self._create_connection
            self._create_connection = lambda *a, **k: deadline.watch(create(*a, **k))

    return Conn


class _DeadlineHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline):
        super().__init__()
        self._deadline = deadline

    def http_open(self, req):
        return self.do_open(_watched(http.client.HTTPConnection, self._deadline), req)


class _DeadlineHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline):
        super().__init__()
        self._deadline = deadline

    def https_open(self, req):
        return self.do_open(_watched(http.client.HTTPSConnection, self._deadline), req, context=self._context)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Never follow a redirect: the signed request (or its data) would go to another place. The 3xx surfaces as an
    ``HTTPError`` and becomes a failed call."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def read_capped(resp: Any, cap: int, what: str) -> bytes:
    """Read the whole body of ``resp``, refusing more than ``cap`` bytes: an announced larger Content-Length is
    refused before reading; a body without one is cut off as soon as it passes the cap."""
    announced = resp.headers.get("Content-Length")
    if announced is not None and announced.strip().isdigit() and int(announced) > cap:
        raise TooLarge(f"{what} announces {int(announced)} bytes")
    parts, size = [], 0
    while True:
        chunk = resp.read1(1 << 16)  # returns after one socket read: the deadline can interrupt between reads
        if not chunk:
            break
        size += len(chunk)
        if size > cap:
            raise TooLarge(f"{what} sends more than {cap} bytes")
        parts.append(chunk)
    if getattr(resp, "length", None):  # Content-Length not reached: the connection closed early
        raise http.client.IncompleteRead(b"".join(parts), resp.length)
    return b"".join(parts)


def http_request(url: str, method: str = "POST", body: Optional[bytes] = None, *, timeout: float,
                 max_reply_bytes: int, token: Optional[str] = None, what: str = "the server") -> Reply:
    """One HTTP exchange under a wall-clock ``timeout`` (connect, send, server time, read), a reply size cap, no
    redirects, no proxy for loopback hosts, and, with ``token``, a signed request (module doc).

    Returns the reply of any status; raises :class:`HTTPFailure` when there is none to use: timeout / connection
    error (retryable), a redirect, a reply above ``max_reply_bytes``, or (with ``token``) a 2xx reply whose MAC
    does not verify."""
    headers = {}
    if body is not None:
        headers["Content-Type"] = "application/json"
    nonce = None
    if token:
        headers[AUTH_HEADER], nonce = sign_request(token, method, url, body or b"")
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    deadline = _Deadline(timeout)
    handlers = [_DeadlineHTTPHandler(deadline), _DeadlineHTTPSHandler(deadline), _NoRedirect()]
    if is_loopback(urllib.parse.urlsplit(url).hostname or ""):  # never through an HTTP(S)_PROXY of the environment
        handlers.append(urllib.request.ProxyHandler({}))
    opener = urllib.request.build_opener(*handlers)
    with deadline:  # also bounds reading an error body
        try:
            try:
                with opener.open(req, timeout=timeout) as resp:
                    status, raw, got = resp.status, read_capped(resp, max_reply_bytes, "the reply"), resp.headers
            except urllib.error.HTTPError as e:
                if 300 <= e.code < 400:
                    raise HTTPFailure(f"{what} answered HTTP {e.code} redirecting to {e.headers.get('Location')!r}: "
                                      "redirects are never followed (the request would go elsewhere)",
                                      status=e.code) from None
                try:
                    raw = read_capped(e, min(max_reply_bytes, 1 << 16), "the error reply")
                except (TooLarge, OSError, http.client.HTTPException):
                    raw = b""
                status, got = e.code, e.headers
        except TooLarge as e:
            raise HTTPFailure(f"{what}: {e}, above the reply cap of {max_reply_bytes} bytes") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
            if deadline.expired:
                raise HTTPFailure(f"timeout: no complete reply within {timeout:g} s", retryable=True) from None
            reason = getattr(e, "reason", e)
            kind = "timeout" if isinstance(reason, (socket.timeout, TimeoutError)) else "connection error"
            raise HTTPFailure(f"{kind}: {type(reason).__name__}: {reason}", retryable=True) from None
    authenticated = bool(token) and reply_mac_ok(token, nonce, status, raw, got.get(REPLY_AUTH_HEADER))
    if token and 200 <= status < 300 and not authenticated:
        how = "a wrong" if got.get(REPLY_AUTH_HEADER) else "no"
        raise HTTPFailure(f"{what} sent a reply that is not authenticated ({how} {REPLY_AUTH_HEADER}): refused. "
                          "The process on that port does not hold the same token (its token is unset or differs, or "
                          "another program took the port)")
    return Reply(int(status), raw, authenticated)


def error_text(reply: Reply) -> str:
    """The ``"error"`` of a JSON error reply (best effort), marked when the reply was not authenticated."""
    try:
        msg = str(json.loads(reply.body.decode("utf-8")).get("error", ""))
    except Exception:  # noqa: BLE001 - body is best effort
        msg = reply.body[:200].decode("utf-8", "replace")
    return msg


def env_token(name: str) -> Optional[str]:
    return os.environ.get(name) or None
