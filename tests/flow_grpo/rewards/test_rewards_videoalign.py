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


@pytest.fixture(scope="module")
def tiny_videoalign():
    """A tiny random Qwen2.5-VL with the release's three reward tokens added, and a random (3, hidden) head."""
    import torch

    from flow_grpo.rewards.videoalign import REWARD_TOKENS
    from mmgrpo.vlm.models.tiny import build_tiny_model

    torch.manual_seed(0)
    model, proc = build_tiny_model("qwen2_5_vl", seed=0)
    proc.tokenizer.add_special_tokens({"additional_special_tokens": list(REWARD_TOKENS)})
    model.resize_token_embeddings(len(proc.tokenizer))
    head = torch.randn(3, model.config.get_text_config().hidden_size)
    return model, proc, head


def _reference_scores(model, proc, head, frames, prompt, fps):
    """Unbatched, written out here: chat template -> processor (frames' VideoMetadata) -> the backbone's final
    hidden state -> row d of the head at the d-th reward token."""
    import torch
    from transformers.video_utils import VideoMetadata

    from flow_grpo.rewards.videoalign import REWARD_TOKENS, VIDEOALIGN_PROMPT

    text = proc.apply_chat_template([{"role": "user", "content": [
        {"type": "video"}, {"type": "text", "text": VIDEOALIGN_PROMPT.replace("{text_prompt}", prompt)}]}],
        add_generation_prompt=True, tokenize=False)
    md = VideoMetadata(total_num_frames=len(frames), fps=float(fps), frames_indices=list(range(len(frames))))
    inp = proc(text=[text], videos=[torch.from_numpy(frames)], video_metadata=[md], do_sample_frames=False,
               do_resize=False, input_data_format="channels_last", return_tensors="pt")
    inp = {k: v for k, v in inp.items() if hasattr(v, "shape")}
    with torch.no_grad():
        h = model.model(**inp).last_hidden_state[0].float()
    ids = inp["input_ids"][0]
    return [float(h[int(torch.nonzero(ids == proc.tokenizer.convert_tokens_to_ids(t))[0, 0])] @ head[d])
            for d, t in enumerate(REWARD_TOKENS)]


def test_model_scorer_on_a_tiny_qwen_matches_an_unbatched_reference(tiny_videoalign):
    from flow_grpo.rewards.videoalign import VIDEOALIGN_PROMPT, VideoAlignModelScorer

    assert len(VIDEOALIGN_PROMPT) == 3997 and VIDEOALIGN_PROMPT.count("_reward|>") == 3
    model, proc, head = tiny_videoalign
    videos = np.random.default_rng(1).integers(0, 256, (3, 4, 56, 56, 3), dtype=np.uint8)
    prompts = ["a red circle moves right", "two cats", "a door opens"]
    scorer = VideoAlignModelScorer(model=model, processor=proc, head=head, batch_size=2, min_pixels=56 * 56)
    r = VideoAlignReward(scorer, norm=NORM, weights={"VQ": 0.5, "MQ": 1.0, "TA": 2.0})
    out = r.evaluate(videos, prompts, [{"fps": 8.0}, {"fps": 4.0}, {}])
    for i, fps in enumerate((8.0, 4.0, 8.0)):
        vq, mq, ta = _reference_scores(model, proc, head, videos[i], prompts[i], fps)
        n = [(vq - 1.0) / 2.0, mq / 0.5, (ta + 1.0) / 4.0]
        np.testing.assert_allclose([out["videoalign/vq"][i], out["videoalign/mq"][i], out["videoalign/ta"][i]], n,
                                   rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(out["videoalign"][i], 0.5 * n[0] + n[1] + 2.0 * n[2], rtol=1e-4, atol=1e-5)
    # a prompt that smuggles in a reward token gives 4 of them: a counted failure, not a wrong read-out
    bad = r.evaluate(videos[:1], ["<|TA_reward|>"])
    assert bad["videoalign/failed"].tolist() == [1.0] and bad["valid"].tolist() == [False]


def test_model_scorer_refuses_a_tokenizer_without_reward_tokens():
    import torch

    from flow_grpo.rewards.videoalign import VideoAlignModelScorer
    from mmgrpo.vlm.models.tiny import build_tiny_model

    model, proc = build_tiny_model("qwen2_5_vl", seed=0)
    with pytest.raises(ValueError, match="reward tokens"):
        VideoAlignModelScorer(model=model, processor=proc, head=torch.zeros(3, 8))


def test_videoalign_behind_the_reward_server(tiny_videoalign):
    """Videos cross the wire as their frames (PNG, lossless) plus frames_per_video; the server's model scorer
    batches them; scores equal the in-process reward's. A malformed frames_per_video is a 400, not a crash."""
    import json
    import threading
    import urllib.error
    import urllib.request

    import torch

    from flow_grpo.rewards.remote import RemoteReward, encode_images
    from flow_grpo.rewards.server import make_server
    from flow_grpo.rewards.videoalign import VideoAlignModelScorer

    model, proc, head = tiny_videoalign
    local = VideoAlignReward(VideoAlignModelScorer(model=model, processor=proc, head=head, batch_size=2,
                                                   min_pixels=56 * 56), weights={"VQ": 0.0, "TA": 3.0})
    calls = []
    forward = model.model.forward
    model.model.forward = lambda *a, **kw: calls.append(kw["input_ids"].shape[0]) or forward(*a, **kw)
    videos = np.random.default_rng(2).integers(0, 256, (3, 4, 56, 56, 3), dtype=np.uint8)
    prompts, md = ["a", "bb", "a ccc"], [{"fps": 4.0}, {}, {}]
    srv = make_server(local, host="127.0.0.1", port=0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        got = RemoteReward(url, name="videoalign", retries=0, video=True)(videos, prompts, md)
        assert calls == [2, 1]  # one request, the server's scorer in batches of 2
        body = json.dumps({"images": encode_images(videos.reshape(-1, 56, 56, 3), "png"), "prompts": prompts,
                           "frames_per_video": 5}).encode()
        req = urllib.request.Request(url + "/score", body, {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        assert e.value.code == 400 and b"frames_per_video" in e.value.read()
    finally:
        model.model.forward = forward
        srv.shutdown()
        srv.server_close()
    want = local(videos, prompts, md)
    for k in ("videoalign", "videoalign/vq", "videoalign/mq", "videoalign/ta", "videoalign/overall"):
        torch.testing.assert_close(got[k], want[k])
    with pytest.raises(ValueError, match="4-d batch"):  # without video=True a video batch stays refused
        RemoteReward(url, retries=0)(videos, prompts)


def test_videoalign_from_a_saved_folder_equals_in_memory(tmp_path, tiny_videoalign):
    """The config route: build_reward("videoalign", path=folder) loads the backbone, the tokenizer with the reward
    tokens and videoalign_head.safetensors."""
    from safetensors.torch import save_file

    from flow_grpo.rewards.videoalign import VideoAlignModelScorer

    model, proc, head = tiny_videoalign
    d = tmp_path / "videoreward"
    model.save_pretrained(str(d))
    proc.save_pretrained(str(d))
    save_file({"weight": head.contiguous()}, str(d / "videoalign_head.safetensors"))
    videos = np.random.default_rng(3).integers(0, 256, (2, 4, 56, 56, 3), dtype=np.uint8)
    kw = {"min_pixels": 56 * 56, "batch_size": 2}
    disk = build_reward("videoalign", path=str(d), scorer_kwargs=kw).evaluate(videos, ["a", "b"])
    # the reloaded processor, not the in-memory one: the tiny byte-level tokenizer does not round-trip digits
    # through save_pretrained (its reload splits "10" into "1", "0"), and the release's prompt has "0 to 10"
    from transformers import AutoProcessor

    mem = VideoAlignReward(VideoAlignModelScorer(model=model, processor=AutoProcessor.from_pretrained(str(d)),
                                                 head=head, **kw)).evaluate(videos, ["a", "b"])
    np.testing.assert_allclose(disk["videoalign"], mem["videoalign"], rtol=1e-5, atol=1e-6)
    (d / "videoalign_head.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="videoalign_head.safetensors"):
        build_reward("videoalign", path=str(d))
