"""Remote reward client against the reference server, run as real subprocesses on 127.0.0.1 (ephemeral ports)."""
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

from flow_grpo.rewards import MultiReward, RewardError, build_reward
from flow_grpo.rewards.remote import RemoteReward
from flow_grpo.rewards.server import main as server_main
from flow_grpo.rewards.server import make_server

BEHAVE = textwrap.dedent('''
    """Test-only reward whose behaviour is chosen by metadata[0]["mode"]."""
    import time
    import numpy as np
    from flow_grpo.rewards.base import Reward

    SEEN = set()

    class Behave(Reward):
        name = "behave"

        def score(self, images, prompts, metadata, **kw):
            mode = metadata[0].get("mode")
            if mode == "sleep":
                time.sleep(float(metadata[0]["seconds"]))
            if mode == "fail_once" and metadata[0]["token"] not in SEEN:
                SEEN.add(metadata[0]["token"])
                raise RuntimeError("transient failure")
            mean = images.reshape(images.shape[0], -1).astype(np.float64).mean(1)
            if mode == "nan":
                mean[1] = np.nan
            return {"behave": mean, "behave/len": np.array([len(p) for p in prompts], float)}
''')


@contextmanager
def _server(args, env=None, startup_timeout=60.0):
    cmd = [sys.executable, "-m", "flow_grpo.rewards.server", "--host", "127.0.0.1", "--port", "0", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(startup_timeout)
    try:
        if not line or not line[0].startswith("LISTENING "):
            proc.kill()
            raise RuntimeError(f"server did not start: {line} {proc.stderr.read()[-2000:]}")
        url = line[0].split()[1]
        assert url.startswith("http://127.0.0.1:")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@pytest.fixture(scope="module")
def jpeg_url():
    with _server(["--reward", "jpeg_compressibility"]) as url:
        yield url


@pytest.fixture(scope="module")
def behave_url(tmp_path_factory):
    d = tmp_path_factory.mktemp("behave")
    (d / "behave_reward.py").write_text(BEHAVE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(d), os.environ.get("PYTHONPATH", "")]))
    with _server(["--reward", "behave_reward:Behave", "--reward-kwargs", '{"nan_policy": "drop"}'], env=env) as url:
        yield url


def _imgs(n=3, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, 24, 32, 3), dtype=np.uint8)


def test_health_endpoint(jpeg_url):
    import json
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # ignore any HTTP_PROXY
    with opener.open(jpeg_url + "/health", timeout=10) as r:
        h = json.loads(r.read())
    assert {k: h[k] for k in ("reward", "status")} == {"reward": "jpeg_compressibility", "status": "ok"}
    assert isinstance(h["stats"], dict)  # counted requests and failures (mmgrpo.utils.score_service)


def test_remote_png_equals_local_and_jpeg_transport_is_close(jpeg_url):
    imgs = _imgs()
    imgs[0] = 128  # one flat image: very different size from the noisy ones
    local = build_reward("jpeg_compressibility")(imgs, ["a", "b", "c"])["jpeg_compressibility"]
    remote = RemoteReward(jpeg_url + "/score", timeout=30, image_format="png", name="jpeg_compressibility")
    out = remote(imgs, ["a", "b", "c"])
    assert remote.last_attempts == 1
    assert out["jpeg_compressibility"].tolist() == local.tolist()  # lossless transport -> identical pixels
    lossy = RemoteReward(jpeg_url, timeout=30)(imgs, ["a", "b", "c"])["remote"]  # keys renamed to "remote"
    assert float(lossy[0]) == pytest.approx(float(local[0]), rel=0.05)
    assert float(lossy[0]) > float(lossy[1])


def test_remote_inside_multi_reward(jpeg_url):
    imgs = _imgs(2)
    m = MultiReward({"remote": 2.0, "brightness": 1.0},
                    reward_kwargs={"remote": {"url": jpeg_url, "image_format": "png", "timeout": 30}})
    out = m(imgs, ["a", "b"])
    local = build_reward("jpeg_compressibility")(imgs, ["a", "b"])["jpeg_compressibility"]
    np.testing.assert_allclose(out["total"].numpy(), 2.0 * local.numpy() + out["brightness"].numpy(), rtol=1e-6)


def test_client_errors_are_not_retried(jpeg_url, behave_url):
    r = RemoteReward(jpeg_url + "/no_such_path", timeout=30, retries=3, backoff=0.0)
    with pytest.raises(RewardError, match="HTTP 404"):
        r(_imgs(2), ["a", "b"])
    assert r.last_attempts == 1
    # a deterministic failure inside the reward (here: metadata the reward cannot read) -> 422, no retry
    r = RemoteReward(behave_url, timeout=30, retries=3, backoff=0.0)
    with pytest.raises(RewardError, match="HTTP 422"):
        r(_imgs(1), ["a"], [{"mode": "sleep", "seconds": "not a number"}])
    assert r.last_attempts == 1


def test_retry_after_server_error_then_success(behave_url):
    imgs = _imgs(2)
    r = RemoteReward(behave_url, timeout=30, retries=2, backoff=0.05, image_format="png", name="behave")
    out = r(imgs, ["ab", "c"], [{"mode": "fail_once", "token": "t1"}, {}])
    assert r.last_attempts == 2
    np.testing.assert_allclose(out["behave"].numpy(), imgs.reshape(2, -1).mean(1), rtol=1e-6)
    assert out["behave/len"].tolist() == [2.0, 1.0]


def test_renamed_keys_and_remote_nan_is_reported(behave_url):
    r = RemoteReward(behave_url, timeout=30, image_format="png", name="judge")
    out = r(_imgs(2), ["a", "b"])
    assert set(out) == {"judge", "judge/len"}  # an all-true "valid" from the server is not passed on
    with pytest.raises(RewardError, match=r"'judge'.*\[1\]"):
        r(_imgs(3), list("abc"), [{"mode": "nan"}, {}, {}])
    dropped = RemoteReward(behave_url, timeout=30, image_format="png", name="judge", nan_policy="drop")(
        _imgs(3), list("abc"), [{"mode": "nan"}, {}, {}])
    assert dropped["valid"].tolist() == [True, False, True]


def test_connection_refused_retries_then_fails():
    with socket.socket() as s:  # find a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = RemoteReward(f"http://127.0.0.1:{port}/score", timeout=2, retries=2, backoff=0.01)
    with pytest.raises(RewardError, match="after 3 attempt"):
        r(_imgs(1), ["a"])
    assert r.last_attempts == 3


def test_server_refuses_non_loopback():
    with pytest.raises(ValueError, match="loopback"):
        make_server(lambda *a: {}, host="0.0.0.0")
    with pytest.raises(SystemExit):
        server_main(["--reward", "brightness", "--host", "192.168.1.1"])


def test_timeout_is_reported(behave_url):  # last: leaves the server sleeping for a moment
    r = RemoteReward(behave_url, timeout=0.3, retries=1, backoff=0.0)
    t0 = time.perf_counter()
    with pytest.raises(RewardError, match="timeout"):
        r(_imgs(1), ["a"], [{"mode": "sleep", "seconds": 1.0}])
    assert r.last_attempts == 2
    assert time.perf_counter() - t0 < 3.0
