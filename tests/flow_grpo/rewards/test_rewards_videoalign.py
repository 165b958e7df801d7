"""``videoalign``: the VideoAlign release's per-video output dicts read as per-dimension scores and weighted.

Golden values by hand; the release's output format (``{"VQ", "MQ", "TA", "Overall"}`` per video, the dimensions
normalised with the checkpoint's ``inference_config`` ``(x - mean) / std``, ``Overall = VQ + MQ + TA``) is the
one its ``inference.py`` documents."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flow_grpo.rewards import build_reward
from flow_grpo.rewards.videoalign import VideoAlignReward, read_videoalign_output

VIDEOS = np.zeros((3, 4, 8, 8, 3), dtype=np.uint8)
NORM = {"VQ_mean": 1.0, "VQ_std": 2.0, "MQ_mean": 0.0, "MQ_std": 0.5, "TA_mean": -1.0, "TA_std": 4.0}


def _scorer(outputs, seen=None):
    def scorer(videos, prompts, fps):
        if seen is not None:
            seen.append((videos.shape, list(prompts), list(fps)))
        return outputs
    return scorer


def test_release_format_weighted_by_hand():
    outs = [{"VQ": 0.5, "MQ": -1.0, "TA": 2.0, "Overall": 1.5}, {"VQ": 1.0, "MQ": 1.0, "TA": 1.0, "Overall": 3.0},
            {"VQ": -2.0, "MQ": 0.25, "TA": 0.0, "Overall": -1.75}]
    seen = []
    r = build_reward("videoalign", scorer=_scorer(outs, seen), weights={"VQ": 0.5, "TA": 2.0})
    out = r(VIDEOS, ["a", "b", "c"], [{"fps": 16}, {}, {}])
    # r = 0.5 VQ + 1 MQ + 2 TA
    np.testing.assert_allclose(out["videoalign"].numpy(), [0.25 - 1 + 4, 0.5 + 1 + 2, -1 + 0.25 + 0], rtol=1e-6)
    np.testing.assert_allclose(out["videoalign/overall"].numpy(), [1.5, 3.0, -1.75], rtol=1e-6)  # the release's
    np.testing.assert_allclose(out["videoalign/mq"].numpy(), [-1.0, 1.0, 0.25])
    assert out["videoalign/failed"].tolist() == [0, 0, 0] and "valid" not in out  # all valid: no key
    assert seen == [((3, 4, 8, 8, 3), ["a", "b", "c"], [16.0, 8.0, 8.0])]  # per-sample fps from the metadata


def test_normalisation_with_the_checkpoint_inference_config():
    raw = [{"VQ": 3.0, "MQ": 1.0, "TA": 3.0}]  # use_norm=False output of the release
    r = VideoAlignReward(_scorer(raw), norm=NORM)
    out = r.evaluate(VIDEOS[:1], ["a"])
    # (3 - 1)/2 = 1, (1 - 0)/0.5 = 2, (3 + 1)/4 = 1
    np.testing.assert_allclose([out["videoalign/vq"][0], out["videoalign/mq"][0], out["videoalign/ta"][0]], [1, 2, 1])
    assert out["videoalign"][0] == pytest.approx(4.0)
    with pytest.raises(ValueError, match="std > 0"):
        VideoAlignReward(_scorer(raw), norm={**NORM, "MQ_std": 0.0})


@pytest.mark.parametrize("outputs, failed", [
    ([{"VQ": 1, "MQ": 1, "TA": 1}, {"VQ": 1, "MQ": 1}, {"VQ": 1, "MQ": float("nan"), "TA": 1}], [0, 1, 1]),
    ([{"VQ": 1, "MQ": 1, "TA": 1}, "VQ=1", {"VQ": "1", "MQ": 1, "TA": 1}], [0, 1, 1]),
    ([{"VQ": True, "MQ": 1, "TA": 1}, None, {"VQ": 2, "MQ": 2, "TA": 2}], [1, 1, 0]),
    ([{"VQ": 1, "MQ": 1, "TA": 1}], [1, 1, 1]),  # wrong length: the whole call failed
    ("not a list", [1, 1, 1]), (None, [1, 1, 1]),
])
def test_malformed_outputs_are_counted_failures(outputs, failed):
    r = VideoAlignReward(_scorer(outputs))
    out = r.evaluate(VIDEOS, ["a"] * 3)
    assert out["videoalign/failed"].tolist() == failed
    assert out["valid"].tolist() == [f == 0 for f in failed]
    assert np.isfinite(out["videoalign"]).all() and (out["videoalign"][np.asarray(failed) == 1] == 0).all()
    assert r.stats == {"judged": 3, "failed": sum(failed)}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(), st.floats(allow_nan=True),
                          st.dictionaries(st.sampled_from(["VQ", "MQ", "TA", "Overall", "x"]),
                                          st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(),
                                                    st.text(), st.none()))), max_size=4))
def test_reader_never_raises(outputs):
    scores, failed = read_videoalign_output(outputs, 3)
    assert failed.shape == (3,) and all(np.isfinite(scores[d][~failed]).all() for d in scores)


def test_configuration_errors_are_clear():
    with pytest.raises(ValueError, match="scorer="):
        build_reward("videoalign")
    with pytest.raises(ValueError, match="unknown dimensions"):
        VideoAlignReward(_scorer([]), weights={"Overall": 1.0})
    with pytest.raises(ValueError, match="videos"):  # an image batch is refused
        VideoAlignReward(_scorer([])).evaluate(np.zeros((2, 8, 8, 3), dtype=np.uint8), ["a", "b"])
