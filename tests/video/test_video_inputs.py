"""build_video_inputs: processor outputs carry the clip's time axis, checked down to the MRoPE positions of a tiny
random Qwen2.5-VL and the <t seconds> text of Qwen3-VL; the transformers-5.x fps=24 trap is caught."""
import re

import pytest
import torch

from mmgrpo.video import TimeAxisError, VideoClip, build_video_inputs, check_time_axis, load_video
from mmgrpo.video.testing import write_index_video
from mmgrpo.vlm.models import tiny

F2 = 28 * 28


@pytest.fixture(scope="module")
def video16(tmp_path_factory):
    # 16 s at 4 fps: fps 0.5 / 1 / 2 sample exactly 8 / 16 / 32 frames (sample_fps == fps)
    return write_index_video(tmp_path_factory.mktemp("v") / "v16.mp4", 64, 4.0, 56, 56)


@pytest.fixture(scope="module")
def qwen25():
    return tiny.build_tiny_model("qwen2_5_vl")


def _prompt(processor):
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "when?"}]}]
    return processor.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def test_check_time_axis_hand_values():
    # 20 frames at 2 fps covering 10 s: grid_T = 10 -> 10 * 2 / 2 = 10 s
    assert check_time_axis(10, 2, 2.0, 10.0, 7.5, second_per_grid_ts=1.0) == pytest.approx(10.0)
    # the 5.x trap: a raw frame array gets sampled_fps 24 -> second_per_grid_ts 2/24
    with pytest.raises(TimeAxisError, match="second_per_grid_ts"):
        check_time_axis(10, 2, 2.0, 10.0, 7.5, second_per_grid_ts=2 / 24)
    # frames padded/resampled: 11 slices would model 11 s for a 10 s clip (> one frame period of 1/7.5 s)
    with pytest.raises(TimeAxisError, match="time axis mismatch"):
        check_time_axis(11, 2, 2.0, 10.0, 7.5)
    # within one frame period is accepted
    check_time_axis(10, 2, 2.0, 10.0 + 0.9 / 7.5, 7.5)


@pytest.mark.parametrize("fps, n, spg, step", [(0.5, 8, 4.0, 8), (1.0, 16, 2.0, 4), (2.0, 32, 1.0, 2)])
def test_mrope_temporal_positions_qwen2_5_vl(video16, qwen25, fps, n, spg, step):
    """Consecutive temporal grid slices step by second_per_grid_ts * tokens_per_second (= 2 in the tiny config):
    hand values 4*2, 2*2, 1*2 for 0.5 / 1 / 2 fps."""
    model, processor = qwen25
    assert model.config.vision_config.tokens_per_second == 2
    clip = load_video(video16, fps=fps, min_pixels=4 * F2, max_pixels=4 * F2)
    assert clip.num_frames == n and clip.sample_fps == pytest.approx(fps)
    inputs = build_video_inputs(processor, clip, _prompt(processor), "qwen2_5_vl")
    assert inputs["second_per_grid_ts"].tolist() == pytest.approx([spg])
    t, h, w = inputs["video_grid_thw"][0].tolist()
    assert (t, h, w) == (n // 2, 4, 4)
    pos, _ = model.model.get_rope_index(
        inputs["input_ids"], inputs["mm_token_type_ids"], video_grid_thw=inputs["video_grid_thw"],
        second_per_grid_ts=inputs["second_per_grid_ts"], attention_mask=inputs["attention_mask"])
    vid = inputs["input_ids"][0] == processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    tpos = pos[0, 0][vid].view(t, (h // 2) * (w // 2))
    assert bool((tpos == tpos[:, :1]).all()), "one temporal position per grid slice"
    steps = (tpos[1:, 0] - tpos[:-1, 0]).tolist()
    assert steps == [step] * (t - 1)
    # the last slice starts at (T-1) * spg seconds after the clip start: positions encode seconds * tps
    assert int(tpos[-1, 0] - tpos[0, 0]) == round((t - 1) * spg * 2)
    # model-ready: one forward pass
    with torch.no_grad():
        out = model(**inputs)
    assert out.logits.shape[:2] == inputs["input_ids"].shape


def test_naive_processor_call_has_the_fps24_trap(video16, qwen25):
    """What build_video_inputs protects against: frames without video_metadata get second_per_grid_ts 2/24."""
    _, processor = qwen25
    clip = load_video(video16, fps=1.0, min_pixels=4 * F2, max_pixels=4 * F2)
    naive = processor(text=[_prompt(processor)], videos=[clip.frames], return_tensors="pt")
    assert float(naive["second_per_grid_ts"][0]) == pytest.approx(2 / 24)
    with pytest.raises(TimeAxisError):
        check_time_axis(int(naive["video_grid_thw"][0, 0]), 2, clip.sample_fps, clip.covered_duration,
                        clip.video_fps, float(naive["second_per_grid_ts"][0]))


def test_clip_time_axis_qwen2_5_vl(video16, qwen25):
    """A clip [3 s, 9.1 s] at 1 fps: frames 12..36 (N = 25), 6 frames, sample_fps = 6/25*4 = 0.96."""
    _, processor = qwen25
    clip = load_video(video16, fps=1.0, video_start=3.0, video_end=9.1, min_pixels=4 * F2, max_pixels=4 * F2)
    assert clip.clip_frames == (12, 36) and clip.num_frames == 6
    assert clip.sample_fps == pytest.approx(6 / 25 * 4)
    inputs = build_video_inputs(processor, clip, _prompt(processor), "qwen2_5_vl")
    assert float(inputs["second_per_grid_ts"][0]) == pytest.approx(2 / (6 / 25 * 4))
    assert int(inputs["video_grid_thw"][0, 0]) * float(inputs["second_per_grid_ts"][0]) == pytest.approx(
        clip.covered_duration) == pytest.approx(25 / 4)


def test_qwen3_vl_timestamps_are_absolute(video16):
    processor = tiny.build_tiny_processor("qwen3_vl")
    clip = load_video(video16, fps=1.0, video_start=4.0, min_pixels=4 * 32 * 32, max_pixels=4 * 32 * 32,
                      image_factor=32)
    inputs = build_video_inputs(processor, clip, _prompt(processor), "qwen3_vl")
    text = processor.tokenizer.decode(inputs["input_ids"][0])
    got = [float(x) for x in re.findall(r"<([0-9.]+) seconds>", text)]
    ts = clip.timestamps  # absolute: frames 16.. at 4 fps
    assert ts[0] == pytest.approx(4.0)
    want = [round((ts[2 * k] + ts[2 * k + 1]) / 2, 1) for k in range(len(ts) // 2)]
    assert got == pytest.approx(want, abs=1e-9)
    assert int(inputs["video_grid_thw"][0, 0]) == clip.num_frames // 2  # not re-sampled by the processor


def test_qwen2_vl_and_batch(video16):
    processor = tiny.build_tiny_processor("qwen2_vl")
    c1 = load_video(video16, fps=0.5, min_pixels=4 * F2, max_pixels=4 * F2)
    c2 = load_video(video16, fps=1.0, video_end=8.0, min_pixels=4 * F2, max_pixels=4 * F2)
    p = _prompt(processor)
    inputs = build_video_inputs(processor, [c1, c2], [p, p], "qwen2_vl")
    assert inputs["video_grid_thw"][:, 0].tolist() == [c1.num_frames // 2, c2.num_frames // 2]
    assert inputs["input_ids"].shape[0] == 2 and "second_per_grid_ts" not in inputs


def test_contract_errors(video16, qwen25):
    _, processor = qwen25
    clip = load_video(video16, fps=1.0, min_pixels=4 * F2, max_pixels=4 * F2)
    with pytest.raises(ValueError, match="model_family"):
        build_video_inputs(processor, clip, _prompt(processor), "llava")
    with pytest.raises(ValueError, match="Qwen2_5_VLProcessor"):
        build_video_inputs(processor, clip, _prompt(processor), "qwen3_vl")
    with pytest.raises(ValueError, match="exactly one"):
        build_video_inputs(processor, clip, "no placeholder here", "qwen2_5_vl")
    with pytest.raises(ValueError, match="one prompt per video"):
        build_video_inputs(processor, [clip, clip], [_prompt(processor)], "qwen2_5_vl")
    q3 = load_video(video16, fps=1.0, min_pixels=4 * 1024, max_pixels=4 * 1024, image_factor=32)
    with pytest.raises(ValueError, match="image_factor=28"):
        build_video_inputs(processor, q3, _prompt(processor), "qwen2_5_vl")
    odd = VideoClip(frames=clip.frames[:3], frame_indices=clip.frame_indices[:3], timestamps=clip.timestamps[:3],
                    sample_fps=1.0, video_fps=4.0, total_frames=64, duration=16.0, clip_start=0.0, clip_end=3.0,
                    clip_frames=(0, 11))
    with pytest.raises(ValueError, match="temporal_patch_size"):
        build_video_inputs(processor, odd, _prompt(processor), "qwen2_5_vl")
    # chat messages are rendered with the processor's template
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "when?"}]}]
    a = build_video_inputs(processor, clip, msgs, "qwen2_5_vl")
    b = build_video_inputs(processor, clip, _prompt(processor), "qwen2_5_vl")
    assert torch.equal(a["input_ids"], b["input_ids"])
    # a family this module does not know by name (one registered with the VLM adapters) passes its time contract
    c = build_video_inputs(processor, clip, _prompt(processor), "my_vl", video_time="second_per_grid_ts")
    assert c.keys() == b.keys() and all(torch.equal(c[k], b[k]) for k in b)
    with pytest.raises(ValueError, match="video_time must be one of"):
        build_video_inputs(processor, clip, _prompt(processor), "my_vl", video_time="fps")
    with pytest.raises(ValueError, match="'timestamps'.*Qwen2_5_VLProcessor"):  # the contract of another processor
        build_video_inputs(processor, clip, _prompt(processor), "my_vl", video_time="timestamps")


def test_end_to_end_synthetic_sample(tmp_path, qwen25):
    """JSONL sample -> build_messages -> chat template -> load_video (clip) -> build_video_inputs -> forward."""
    from mmgrpo.vlm.data import build_messages, load_jsonl
    from mmgrpo.vlm.synthetic.tvg import generate

    model, processor = qwen25
    res = generate(tmp_path, n_train=1, n_eval=0, seed=3)
    (s, *_), _ = load_jsonl(res["train"])
    s.video_start, s.video_end = 0.5, s.duration - 0.5
    msgs = build_messages(s, "think", "seconds")
    text = processor.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text.count("<|video_pad|>") == 1 and s.query in text
    item = msgs[1]["content"][0]
    clip = load_video(item["video"], fps=2.0, video_start=item["video_start"], video_end=item["video_end"],
                      min_pixels=4 * F2, max_pixels=4 * F2)
    assert clip.clip_start >= 0.5 and clip.clip_end <= s.duration - 0.5 + 1 / clip.video_fps
    inputs = build_video_inputs(processor, clip, text, "qwen2_5_vl")
    assert float(inputs["second_per_grid_ts"][0]) == pytest.approx(2 / clip.sample_fps)
    with torch.no_grad():
        assert torch.isfinite(model(**inputs).logits).all()


def test_per_frame_cap_flag_is_set_when_the_processor_knows_it(video16, qwen25):
    """transformers 5.x warns unless ``cap_pixels_per_frame`` is passed; we pass False (frames are pre-sized and the
    processor's resize is off) exactly when the video processor has the option, and the output is unchanged."""
    _, processor = qwen25
    clip = load_video(video16, fps=1.0, min_pixels=4 * F2, max_pixels=4 * F2)
    seen: dict = {}

    class Spy:
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

        def __call__(self, **kw):
            seen.update(kw)
            return self._inner(**kw)

    spy = Spy(processor)
    inputs = build_video_inputs(spy, clip, _prompt(processor), "qwen2_5_vl")
    if hasattr(processor.video_processor, "cap_pixels_per_frame"):
        assert seen["cap_pixels_per_frame"] is False
    else:
        assert "cap_pixels_per_frame" not in seen
    plain = processor(text=[_prompt(processor)], videos=[clip.frames], return_tensors="pt", padding=True,
                      **{k: v for k, v in seen.items() if k not in ("text", "videos", "return_tensors", "padding",
                                                                   "cap_pixels_per_frame")})
    assert torch.equal(inputs["pixel_values_videos"], plain["pixel_values_videos"])
    assert inputs["video_grid_thw"].tolist() == plain["video_grid_thw"].tolist()
