"""The remote reward is a drop-in for the local one: its default transport is lossless (PNG), so the server scores the
very pixels a local reward scores; JPEG is an explicit option that changes the scores (issue 32 item 3)."""
import threading

import numpy as np
import pytest
import torch

from flow_grpo.rewards import build_reward
from flow_grpo.rewards.remote import RemoteReward
from flow_grpo.rewards.server import make_server
from flow_grpo.rewards.tiny import save_tiny_pickscore

PROMPTS = ["a red cube", "two dogs", "a blue sky", "a green apple"]


@pytest.fixture(scope="module")
def pickscore(tmp_path_factory):
    kw = save_tiny_pickscore(str(tmp_path_factory.mktemp("pick")), seed=3)
    return build_reward("pickscore", **kw, batch_size=4)


@pytest.fixture(scope="module")
def url(pickscore):
    srv = make_server(pickscore, "127.0.0.1", 0)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/score"
    srv.shutdown()


def _images() -> np.ndarray:
    # textured images (JPEG is lossy on texture; a flat image would survive it)
    rng = np.random.RandomState(0)
    return rng.randint(0, 256, (len(PROMPTS), 48, 48, 3), dtype=np.uint8)


def test_default_transport_is_lossless_and_matches_the_local_reward(pickscore, url):
    imgs = _images()
    local = pickscore(imgs, PROMPTS)["pickscore"]
    remote = RemoteReward(url, name="pickscore", timeout=30)
    assert remote.image_format == "png"
    got = remote(imgs, PROMPTS)["pickscore"]
    assert torch.equal(torch.as_tensor(got, dtype=local.dtype), local)  # the same pixels, the same function


def test_jpeg_is_explicit_and_changes_the_scores(pickscore, url):
    imgs = _images()
    local = pickscore(imgs, PROMPTS)["pickscore"].double()
    jpeg = torch.as_tensor(RemoteReward(url, name="pickscore", timeout=30, image_format="jpeg")(imgs, PROMPTS)
                           ["pickscore"]).double()
    assert (jpeg - local).abs().max() > 1e-4


def test_unknown_transport_is_refused():
    with pytest.raises(ValueError, match="'png' \\(lossless, default\\) or 'jpeg'"):
        RemoteReward("http://127.0.0.1:1/score", image_format="webp")
