"""VLM judge over video on a tiny random Qwen2.5-VL: the frames and their fps reach the processor as the VLM
trainer's path sends them (video_metadata -> second_per_grid_ts = 2 / fps), scores equal an unbatched reference
computed straight from the processor and the model."""
import numpy as np
import pytest
import torch

from flow_grpo.rewards import build_reward
from flow_grpo.rewards.vlm_judge_video import QUESTION_VIDEO_YES_NO, VLMVideoJudgeReward

torch.set_num_threads(1)
PROMPTS = ["a red circle moves from left to right", "two yellow circles move up", "a door"]


@pytest.fixture(scope="module")
def tiny():
    from mmgrpo.vlm.models.tiny import build_tiny_model

    model, proc = build_tiny_model("qwen2_5_vl", seed=0)
    with torch.no_grad():  # sharpen the random next-token distribution so scores differ clearly
        model.lm_head.weight.mul_(40.0)
    return model, proc


@pytest.fixture(scope="module")
def videos():  # 56 = 2 x 28: load_video keeps the size with min_pixels = 56 * 56
    return np.random.default_rng(0).integers(0, 256, (3, 4, 56, 56, 3), dtype=np.uint8)


def _reference(model, proc, frames, prompt, fps):
    """Unbatched: chat template -> processor with the frames' VideoMetadata -> model; softmax of the last row."""
    from transformers.video_utils import VideoMetadata

    q = "Prompt: " + prompt + "\n" + QUESTION_VIDEO_YES_NO
    text = proc.apply_chat_template([{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": q}]}],
                                    add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|vision_start|><|video_pad|><|vision_end|>" + q + "<|im_end|>\n<|im_start|>assistant\n")
    md = VideoMetadata(total_num_frames=len(frames), fps=float(fps), frames_indices=list(range(len(frames))))
    inp = proc(text=[text], videos=[torch.from_numpy(frames)], video_metadata=[md], do_sample_frames=False,
               do_resize=False, input_data_format="channels_last", return_tensors="pt")
    inp = {k: v for k, v in inp.items() if hasattr(v, "shape")}
    with torch.no_grad():
        logits = model(**inp).logits[0, -1]
    return torch.softmax(logits.float(), -1), inp


def test_video_judge_matches_unbatched_reference_and_sends_fps(tiny, videos, monkeypatch):
    model, proc = tiny
    r = VLMVideoJudgeReward(model=model, processor=proc, batch_size=2, min_pixels=56 * 56)
    seen = []
    forward = model.forward

    def spy(*a, **kw):
        seen.append((kw["video_grid_thw"].clone(), kw["second_per_grid_ts"].clone()))
        return forward(*a, **kw)

    monkeypatch.setattr(model, "forward", spy)
    md = [{"fps": 8.0}, {"fps": 4.0}, {}]  # the third uses the default fps=8
    out = r(videos, PROMPTS, md)
    assert out["vlm_judge_video"].shape == (3,) and out["vlm_judge_video/answer_mass"].shape == (3,)
    grid = torch.cat([g for g, _ in seen])
    spg = torch.cat([s for _, s in seen])
    assert grid.tolist() == [[2, 4, 4]] * 3  # 4 frames / temporal patch 2; 56 px / 14
    torch.testing.assert_close(spg, torch.tensor([2 / 8.0, 2 / 4.0, 2 / 8.0]))
    monkeypatch.setattr(model, "forward", forward)
    tok = proc.tokenizer
    yes, no = (tok.encode(s, add_special_tokens=False)[0] for s in ("Yes", "No"))
    for i, (p, fps) in enumerate(zip(PROMPTS, (8.0, 4.0, 8.0))):
        probs, inp = _reference(model, proc, videos[i], p, fps)
        torch.testing.assert_close(inp["second_per_grid_ts"], torch.tensor([2 / fps]))
        torch.testing.assert_close(out["vlm_judge_video"][i], probs[yes] / (probs[yes] + probs[no]),
                                   atol=2e-5, rtol=0)
    # the time axis matters: the same frames at another fps are another video to the judge
    other = r(videos[:1], PROMPTS[:1], [{"fps": 2.0}])["vlm_judge_video"]
    assert abs(float(other[0]) - float(out["vlm_judge_video"][0])) > 1e-6


def test_video_judge_registry_sampling_and_scale_mode(tiny, videos):
    model, proc = tiny
    r = build_reward("vlm_judge_video", model=model, processor=proc, fps=8.0, sample_fps=4.0, min_pixels=56 * 56)
    clip = r.clip(np.concatenate([videos[0], videos[0]]), 8.0)  # 8 frames at 8 fps judged at 4 fps: 4 frames
    # qwen-vl-utils rules by hand: n = floor2(min(8 / 8 * 4, 8)) = 4, indices round(linspace(0, 7, 4))
    assert clip.frame_indices == [0, 2, 5, 7] and clip.sample_fps == 4.0
    assert clip.timestamps == [0.0, 0.25, 0.625, 0.875] and clip.second_per_grid_ts(2) == 0.5
    s = build_reward("vlm_judge_video", model=model, processor=proc, mode="scale", scale_max=5, min_pixels=56 * 56)
    out = s(videos[:2].transpose(0, 1, 4, 2, 3).astype(np.float32) / 255.0, PROMPTS[:2])  # (B, F, 3, H, W)
    v = out["vlm_judge_video"].numpy()
    assert v.shape == (2,) and ((v >= 0) & (v <= 1)).all()
    assert "1 to 5" in s.question and "video" in s.question


def test_qwen3_vl_judge_prompt_carries_the_frame_times():
    """Qwen3-VL writes `<t seconds>` per temporal slice, t = mean time of its 2 frames: for 6 frames at 4 fps
    (0, 0.25, ..., 1.25 s) that is 0.125, 0.625, 1.125 s, printed with one decimal."""
    from mmgrpo.vlm.models.tiny import build_tiny_model

    model, proc = build_tiny_model("qwen3_vl", seed=0)
    r = VLMVideoJudgeReward(model=model, processor=proc, min_pixels=64 * 64, max_pixels=64 * 64)
    seen = []
    forward = model.forward
    model.forward = lambda *a, **kw: (seen.append(kw["input_ids"]), forward(*a, **kw))[1]
    vids = np.random.default_rng(0).integers(0, 256, (1, 6, 64, 64, 3), dtype=np.uint8)
    assert r(vids, ["x"], [{"fps": 4.0}])["vlm_judge_video"].shape == (1,)
    text = proc.tokenizer.decode(seen[0][0])
    stamps = [t for t in ("<0.1 seconds>", "<0.6 seconds>", "<1.1 seconds>") if t in text]
    assert stamps == ["<0.1 seconds>", "<0.6 seconds>", "<1.1 seconds>"] and text.count(" seconds>") == 3
