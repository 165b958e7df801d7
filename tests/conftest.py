"""Test-wide settings: hermetic (no hub), deterministic, CPU."""
import contextlib
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("FORCE_QWENVL_VIDEO_READER", "decord")
os.environ.setdefault("WANDB_MODE", "disabled")
# One OpenMP thread for the pytest process and every subprocess it starts, set before anything imports torch.
# Why: several tests fork (2-process trainers, SIGKILL/resume). A fork taken after a multi-thread OpenMP team has
# run can deadlock the child in libgomp (seen in CI), and on this shared 2-core machine 2 threads are slower anyway.
# A test that needs more threads sets them itself and restores them.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402


# ------------------------------------------------------------------------------ the opt-in extended tier
def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", default=False,
                     help="also run the tests marked `extended` (deselected by default: they repeat, for more "
                          "variants, a path another default test covers, or run a builder / benchmark script end to "
                          "end; `bash scripts/test.sh --full`)")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``extended`` run only with ``--full`` (or when ``-m`` names the marker): each repeats, for one
    more variant, what a default test already exercises, or runs a builder / benchmark script end to end (see the
    marker's note in pytest.ini)."""
    if config.getoption("--full") or "extended" in (config.option.markexpr or ""):
        return
    keep, drop = [], []
    for it in items:
        (drop if it.get_closest_marker("extended") else keep).append(it)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep

try:  # Property tests draw the same examples on every run: CI must not pass or fail by luck. Explore new
    # examples locally with HYPOTHESIS_PROFILE=explore (random draws, the hypothesis default).
    from hypothesis import settings as _hyp_settings

    _hyp_settings.register_profile("ci", derandomize=True)
    _hyp_settings.register_profile("explore", derandomize=False)
    _hyp_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # pragma: no cover
    pass


@pytest.fixture(autouse=True, scope="session")
def _sigint_not_ignored():
    """A shell starts background jobs (``cmd &``, nohup) with SIGINT ignored, and an ignored disposition is
    inherited across exec; the signal handlers (mmgrpo.utils.signals) deliberately respect it, so the preemption
    tests, which send SIGINT, would fail only because of how the suite was launched. Restore Python's default for
    the session: child processes then start with SIGINT at its default."""
    import signal

    old = signal.getsignal(signal.SIGINT)
    if old is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if old is signal.SIG_IGN:
        signal.signal(signal.SIGINT, old)


@pytest.fixture(autouse=True)
def _deterministic_torch():
    try:
        import torch
    except ImportError:  # pragma: no cover
        yield
        return
    torch.manual_seed(0)
    yield


@pytest.fixture
def tick_clock():
    """A fake clock for training-time budgets (``mmgrpo.utils.budget.TimeBudget(clock=...)``): every reading
    advances it by 1 s, so a trainer step / epoch (one ``start`` + one ``lap``) costs exactly 1 s."""
    state = {"t": 0.0}

    def read() -> float:
        state["t"] += 1.0
        return state["t"]

    return read


class RoundTrip:
    """Comparisons across save/load (or any change of memory layout).

    Stored values survive save/load exactly (safetensors keeps the bytes), so weights are compared bitwise. What is
    computed from loaded weights is not bitwise reproducible: ``from_pretrained`` leaves parameters as views into
    the file's buffer, not 64-byte aligned (measured: ``data_ptr() % 64 == 24`` for every loaded tensor, 0 for the
    in-memory model), so BLAS takes other code paths and rounds differently (FLUX velocities: 4.8e-7 apart). Bitwise
    claims about computed values are kept for one process and one layout (e.g. resume after SIGKILL); across
    save/load the outputs are compared with a tolerance that a real bug still exceeds (each test checks that).
    """

    # tiny-VLM logits are below 1 in magnitude: 1e-5 is ~150 float32 ulps there, while one weight element moved
    # by 1e-2 (a tenth of the weights' std) shifts them by ~1e-3 (test_tiny_adapters checks that it fails).
    LOGITS_ATOL = 1e-5

    @staticmethod
    def same_weights(a, b):
        """Two modules (or state dicts) hold the same tensors, bit for bit."""
        sa = a.state_dict() if hasattr(a, "state_dict") else a
        sb = b.state_dict() if hasattr(b, "state_dict") else b
        assert sa.keys() == sb.keys(), sorted(set(sa) ^ set(sb))[:10]
        import torch

        for k in sb:
            assert torch.equal(sa[k], sb[k]), k

    @staticmethod
    def close(x, ref, atol):
        import torch

        torch.testing.assert_close(x, ref, atol=atol, rtol=0)

    @staticmethod
    def images_close(a, b, levels=1):
        """uint8 images decoded from outputs this close differ by at most `levels` rounding steps per pixel."""
        import numpy as np

        a, b = np.asarray(a).astype(np.int16), np.asarray(b).astype(np.int16)
        assert a.shape == b.shape
        assert np.abs(a - b).max() <= levels, f"max pixel difference {np.abs(a - b).max()} > {levels}"


@pytest.fixture
def roundtrip():
    """:class:`RoundTrip`: bitwise weights, tolerant outputs, for comparisons across save/load."""
    return RoundTrip


class _WouldRun:
    """A pickled object that creates ``target`` when unpickled with a full unpickler (``__reduce__`` -> os.system)."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        import shlex

        return os.system, (f"touch {shlex.quote(self.target)}",)


@pytest.fixture
def craft_sharded_state():
    """``craft(step_dir, model, optimizer, target, extra=None, how="bytes_entry")``: write ``step_dir/state`` with
    ``torch.distributed.checkpoint`` holding every tensor a resume asks for (``sharded_model_optim(model,
    optimizer)``, plus ``extra``: e.g. the flow trainer's EMA shadows), so that DCP gets to read it, then make it
    hostile, and rewrite the manifest to match (whoever writes a folder writes its manifest):

    * ``how="bytes_entry"`` (issue 31 item 1): the first model entry is a pickled object that would create ``target``
      (DCP reads a non-tensor item with ``torch.load(weights_only=False)``); returns the entry's name;
    * ``how="rank_metadata"`` (item 2): every entry is a genuine tensor, but ``.metadata`` is gone and
      ``__0.metadata`` is a pickle that would create ``target`` (DCP falls back to it with plain ``pickle.load``);
      returns ``"__0.metadata"``."""

    def craft(step_dir, model, optimizer, target, extra=None, how="bytes_entry"):
        import hashlib
        import json
        import pickle
        import warnings

        import torch.distributed.checkpoint as dcp

        from mmgrpo.engine.checkpoint import sharded_model_optim

        assert how in ("bytes_entry", "rank_metadata"), how
        tensors, _ = sharded_model_optim(model, optimizer)
        first = next(iter(tensors["model"]))
        if how == "bytes_entry":
            tensors["model"][first] = _WouldRun(target)
        if extra:
            tensors["extra"] = dict(extra)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "no process group": a single-process save
            dcp.save(tensors, checkpoint_id=str(step_dir / "state"))
        if how == "rank_metadata":
            (step_dir / "state" / ".metadata").unlink()
            (step_dir / "state" / "__0.metadata").write_bytes(pickle.dumps(_WouldRun(target)))
        man = json.loads((step_dir / "manifest.json").read_text())
        man["files"] = {k: v for k, v in man["files"].items() if not k.startswith("state/")}
        for f in (step_dir / "state").iterdir():
            man["files"][f"state/{f.name}"] = {"size": f.stat().st_size,
                                               "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
        (step_dir / "manifest.json").write_text(json.dumps(man))
        return f"model.{first}" if how == "bytes_entry" else "__0.metadata"

    return craft


# ------------------------------------------------------------------------------ a raw HTTP peer on 127.0.0.1
def _read_http_request(conn) -> tuple[bytes, bytes]:
    """Headers and body of one HTTP request (Content-Length framing only, as the client sends)."""
    conn.settimeout(5.0)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            return buf, b""
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head, body


@contextlib.contextmanager
def _fake_http_server(reply, drip: float = 0.0, drip_from: int = 0):
    """Serve ``reply`` (bytes, or a function ``(head, body) -> bytes``) to every connection; with ``drip > 0``
    bytes from offset ``drip_from`` on are sent one at a time, ``drip`` seconds apart. Yields (url, seen heads)."""
    import socket
    import threading
    import time

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    lsock.settimeout(0.1)
    stop = threading.Event()
    heads: list[bytes] = []

    def handle(conn):
        with conn:
            try:
                head, body = _read_http_request(conn)
                heads.append(head)
                data = reply(head, body) if callable(reply) else reply
                conn.sendall(data[:drip_from] if drip else data)
                for i in range(drip_from, len(data)) if drip else ():
                    if stop.is_set():
                        return
                    conn.sendall(data[i:i + 1])
                    time.sleep(drip)
            except OSError:  # the client hung up: fine
                pass

    def serve():
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except OSError:
                continue
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{lsock.getsockname()[1]}/score", heads
    finally:
        stop.set()
        t.join(2)
        lsock.close()


def _http_reply(payload, status="200 OK", extra_headers=b"") -> bytes:
    import json

    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n").encode() + extra_headers + b"\r\n" + body


class FakeHTTP:
    """A server that sends exactly the bytes a test chooses (``serve``: a context manager yielding ``(url,
    request heads seen)``; ``reply``: an HTTP/1.1 response with a JSON body)."""

    serve = staticmethod(_fake_http_server)
    reply = staticmethod(_http_reply)


@pytest.fixture
def fake_http():
    """:class:`FakeHTTP`: a raw-socket HTTP peer for client tests (hostile or broken servers)."""
    return FakeHTTP
