"""Later turns from the cache of the earlier ones (mmgrpo.vlm.models.turn_cache, tools.reuse_kv): the reusable
prefix by hand, and a two-turn HF rollout whose second turn (a new image in the tool turn) continues from the first
turn's cache: the same tokens as prefilling the whole conversation, the same sampling log-probs within float
tolerance, both equal to the trainer's recompute, and the prefill tokens saved counted."""
import torch

from mmgrpo.vlm.models.rollout import HFRolloutBackend, SamplingParams, collate_prompts, compute_token_logprobs
from mmgrpo.vlm.models.turn_cache import reusable_prefix
from mmgrpo.vlm.tools.config import ToolsConfig
from mmgrpo.vlm.tools.rollout import MultiTurnBackend

S, E, IMG, TXT = 90, 91, 92, 7  # vision start / end, image pad, a text token (values are arbitrary ids)


def test_reusable_prefix_by_hand():
    full = torch.tensor([1, 2, S, IMG, IMG, E, 3, 4, 5])
    assert reusable_prefix(torch.tensor([1, 2, S, IMG, IMG, E, 3, 9]), full, S, E) == 7  # differs at 7
    assert reusable_prefix(full, full, S, E) == 8  # at most L - 1: the last position is prefilled for its logits
    assert reusable_prefix(torch.tensor([1, 2, S, IMG]), full, S, E) == 2  # would split the image: back to its start
    assert reusable_prefix(torch.tensor([1, 2, S, IMG, IMG, E]), full, S, E) == 6  # whole block cached
    assert reusable_prefix(torch.tensor([1, 2, S, IMG, IMG]), full, S, E) == 2  # its end token not cached yet
    assert reusable_prefix(torch.tensor([9]), full, S, E) == 0


def _run(tiny, reuse: bool, seeds):
    from mmgrpo.vlm.data.templates import render_messages
    from tests.tools.test_mgpo_release import SAMPLE

    tok = tiny.tok
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    allowed = {eot} | set(tok("ab[]", add_special_tokens=False)["input_ids"])
    suppress = [i for i in range(tiny.model.config.get_text_config().vocab_size) if i not in allowed]
    backend = HFRolloutBackend(tiny.model, tiny.proc, suppress_token_ids=suppress)
    # MGPO's release format: the first turn always gets a second (here: no JSON box -> the image again)
    opts = ToolsConfig(enabled=True, names=["mgpo_crop"], call_format="mgpo", max_turns=2, max_tool_calls=1,
                       max_total_tokens=2000, answer_pattern="", reuse_kv=reuse)
    mt = MultiTurnBackend(backend, tiny.proc, opts, image_kwargs={"min_pixels": 3136, "max_pixels": 3136 * 4})
    text = tiny.proc.apply_chat_template(render_messages(SAMPLE, "mgpo"), tokenize=False, add_generation_prompt=True)
    item = {k: v for k, v in tiny.proc(text=[text], images=[tiny.img], return_tensors="pt", min_pixels=3136,
                                      max_pixels=3136 * 4).items() if isinstance(v, torch.Tensor)}
    out = mt.generate([item], 4, SamplingParams(max_new_tokens=16, temperature=1.0), seeds=seeds,
                      raw_prompts=[{"images": [tiny.img], "sample": SAMPLE}])
    return out, suppress


def test_second_turn_from_the_cache_equals_the_whole_prefill(tiny):
    seeds = [11, 12, 13, 14]
    a, suppress = _run(tiny, True, seeds)
    b, _ = _run(tiny, False, seeds)
    assert [i["turns"] for i in a.turn_info] == [2, 2, 2, 2]  # every row had a continued second turn
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.loss_mask, b.loss_mask)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=2e-5, rtol=0)
    # the trainer's recompute over the whole row (both turns, the tool turn's image included)
    with torch.no_grad():
        lp = compute_token_logprobs(tiny.model, collate_prompts(a.items, tiny.tok.pad_token_id), a.completion_ids,
                                    a.completion_mask, 1.0, suppress)
    m = a.loss_mask.bool()
    torch.testing.assert_close(lp[m], a.logprobs[m], atol=2e-5, rtol=0)
    # what was saved: the later turn prefilled only the tool turn (and at most turn 1's last token)
    for ia, ib, r in zip(a.turn_info, b.turn_info, range(4)):
        n1 = a.loss_mask[r].tolist().index(0)  # turn 1's tokens
        tool = ia["tool_tokens"]
        prompt = int(a.items[r]["input_ids"].numel())
        # the tool turn, plus turn 1's EOS when the decode loop stopped before feeding it (the row that ended last)
        assert ia["later_prefill_tokens"] in (tool, tool + 1)
        assert ia["later_reused_tokens"] + ia["later_prefill_tokens"] == prompt + n1 + tool
        assert ib["later_prefill_tokens"] == prompt + n1 + tool and ib["later_reused_tokens"] == 0


def _always_crop(text, turn):
    from mmgrpo.vlm.tools.parse import ToolCall

    return [ToolCall(name="crop", arguments={"bbox_2d": [0, 0, 28, 28]})]


ALWAYS_CROP = None  # set in the test (a CallFormat that calls crop after every turn)


def test_third_turn_continues_from_a_continued_cache(tiny, monkeypatch):
    """Three turns, each later one from the cache the previous continuation left: equal to the whole prefill."""
    import sys

    from mmgrpo.vlm.tools.parse import CALL_FORMATS, CallFormat

    monkeypatch.setattr(sys.modules[__name__], "ALWAYS_CROP", CallFormat(_always_crop, lambda names, family: ""))
    monkeypatch.setitem(CALL_FORMATS, "always_crop", f"{__name__}:ALWAYS_CROP")
    tok = tiny.tok
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    allowed = {eot} | set(tok("xyz", add_special_tokens=False)["input_ids"])
    suppress = [i for i in range(tiny.model.config.get_text_config().vocab_size) if i not in allowed]
    outs = []
    for reuse in (True, False):
        opts = ToolsConfig(enabled=True, names=["crop"], call_format="always_crop", max_turns=3, max_tool_calls=2,
                           max_total_tokens=2000, crop_pixels=56 * 56, reuse_kv=reuse)
        mt = MultiTurnBackend(HFRolloutBackend(tiny.model, tiny.proc, suppress_token_ids=suppress), tiny.proc, opts)
        outs.append(mt.generate([tiny.item], 3, SamplingParams(max_new_tokens=12), seeds=[5, 6, 7],
                                raw_prompts=[{"images": [tiny.img]}]))
    a, b = outs
    assert [i["turns"] for i in a.turn_info] == [3, 3, 3]
    assert torch.equal(a.completion_ids, b.completion_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=2e-5, rtol=0)
    assert all(i["later_reused_tokens"] > j["later_reused_tokens"] == 0 for i, j in zip(a.turn_info, b.turn_info))


def test_qwen3_vl_turns_from_the_cache(monkeypatch):
    """Qwen3-VL (its own MRoPE layout and deepstack vision features; ParaVT's model): three turns from the cache
    equal the whole prefill and the trainer's recompute. ~8 CPU-s, most of it building the tiny model."""
    import sys

    from mmgrpo.vlm.models.tiny import build_tiny_model, synthetic_image
    from mmgrpo.vlm.tools.parse import CALL_FORMATS, CallFormat

    monkeypatch.setattr(sys.modules[__name__], "ALWAYS_CROP", CallFormat(_always_crop, lambda names, family: ""))
    monkeypatch.setitem(CALL_FORMATS, "always_crop", f"{__name__}:ALWAYS_CROP")
    torch.manual_seed(0)
    model, proc = build_tiny_model("qwen3_vl")
    tok = proc.tokenizer
    allowed = {tok.convert_tokens_to_ids("<|im_end|>")} | set(tok("xyz", add_special_tokens=False)["input_ids"])
    suppress = [i for i in range(model.config.get_text_config().vocab_size) if i not in allowed]
    img = synthetic_image(3, 128, 96)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "which colour?"}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    item = {k: v for k, v in proc(text=[text], images=[img], return_tensors="pt").items()
            if isinstance(v, torch.Tensor)}
    outs = []
    for reuse in (True, False):
        opts = ToolsConfig(enabled=True, names=["crop"], call_format="always_crop", max_turns=3, max_tool_calls=2,
                           max_total_tokens=3000, crop_pixels=64 * 64, reuse_kv=reuse, instruction="none")
        mt = MultiTurnBackend(HFRolloutBackend(model, proc, suppress_token_ids=suppress), proc, opts,
                              family="qwen3_vl")
        outs.append(mt.generate([item], 2, SamplingParams(max_new_tokens=8), seeds=[5, 6],
                                raw_prompts=[{"images": [img]}]))
    a, b = outs
    assert [i["turns"] for i in a.turn_info] == [3, 3] and all(i["later_reused_tokens"] > 0 for i in a.turn_info)
    assert torch.equal(a.completion_ids, b.completion_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=2e-5, rtol=0)
    with torch.no_grad():
        lp = compute_token_logprobs(model, collate_prompts(a.items, tok.pad_token_id), a.completion_ids,
                                    a.completion_mask, 1.0, suppress)
    m = a.loss_mask.bool()
    torch.testing.assert_close(lp[m], a.logprobs[m], atol=2e-5, rtol=0)


def test_split_media_by_hand():
    """Media after the reused prefix, and a video of two frame blocks (Qwen3-VL) never split."""
    from mmgrpo.vlm.models.turn_cache import split_media

    VID = 93
    # image (2 tokens), text, a video of 2 frames (2 blocks of 1 token), text, another image (1 token)
    full = torch.tensor([S, IMG, IMG, E, TXT, S, VID, E, TXT, S, VID, E, TXT, S, IMG, E, TXT])
    item = {"image_grid_thw": torch.tensor([[1, 2, 4], [1, 2, 2]]),  # 8 and 4 patches: 2 and 1 tokens (merge 4)
            "pixel_values": torch.arange(12)[:, None].float(),
            "video_grid_thw": torch.tensor([[2, 2, 2]]), "pixel_values_videos": torch.arange(8)[:, None].float(),
            "second_per_grid_ts": torch.tensor([1.0])}
    c, m = split_media(item, full, 13, (IMG, VID), S)  # everything but the last image cached
    assert c == 13 and m["image_grid_thw"].tolist() == [[1, 2, 2]]
    assert m["pixel_values"][:, 0].tolist() == [8, 9, 10, 11]
    assert "video_grid_thw" not in m
    c, m = split_media(item, full, 9, (IMG, VID), S)  # inside the video (between its frame blocks): back to its start
    assert c == 5 and m["video_grid_thw"].tolist() == [[2, 2, 2]] and m["pixel_values_videos"].shape[0] == 8
    assert m["second_per_grid_ts"].tolist() == [1.0] and m["image_grid_thw"].tolist() == [[1, 2, 2]]
    c, m = split_media(item, full, 4, (IMG, VID), S)
    assert c == 4 and m["pixel_values"].shape[0] == 4 and m["pixel_values_videos"].shape[0] == 8


def _always_seek(text, turn):
    from mmgrpo.vlm.tools.parse import ToolCall

    return [ToolCall(name="seek", arguments={"start": 2 * turn - 1, "end": 2 * turn + 1})]


ALWAYS_SEEK = None


def _seek_rollouts(family, monkeypatch, model, proc):
    import sys

    import numpy as np

    from mmgrpo.video.clip import load_video
    from mmgrpo.video.processor import build_video_inputs
    from mmgrpo.video.testing import index_frame
    from mmgrpo.vlm.tools.parse import CALL_FORMATS, CallFormat

    monkeypatch.setattr(sys.modules[__name__], "ALWAYS_SEEK", CallFormat(_always_seek, lambda names, family: ""))
    monkeypatch.setitem(CALL_FORMATS, "always_seek", f"{__name__}:ALWAYS_SEEK")
    tok = proc.tokenizer
    allowed = {tok.convert_tokens_to_ids("<|im_end|>")} | set(tok("xyz", add_special_tokens=False)["input_ids"])
    suppress = [i for i in range(model.config.get_text_config().vocab_size) if i not in allowed]
    frames = np.stack([index_frame(i, 56, 56) for i in range(40)])  # 10 s at 4 fps
    factor = 32 if family == "qwen3_vl" else 28
    clip = load_video(frames, fps=0.5, video_fps=4.0, min_frames=2, image_factor=factor, min_pixels=784,
                      max_pixels=4096)
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "when?"}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    item = {k: v for k, v in build_video_inputs(proc, clip, text, family).items() if isinstance(v, torch.Tensor)}
    outs = []
    for reuse in (True, False):
        opts = ToolsConfig(enabled=True, names=["seek"], call_format="always_seek", seek_fps=2.0, seek_max_frames=4,
                           max_turns=3, max_tool_calls=2, max_total_tokens=3000, reuse_kv=reuse, instruction="none")
        mt = MultiTurnBackend(HFRolloutBackend(model, proc, suppress_token_ids=suppress), proc, opts, family=family)
        outs.append(mt.generate([item], 2, SamplingParams(max_new_tokens=8), seeds=[3, 4],
                                raw_prompts=[{"clip": clip, "sample": {"video": frames}}]))
    return outs, suppress


def test_seek_turns_from_the_cache_qwen2_5_vl(tiny, monkeypatch):
    """New videos (seek windows, their own fps and time axis) in the continued prefill: equal to the whole prefill."""
    (a, b), suppress = _seek_rollouts("qwen2_5_vl", monkeypatch, tiny.model, tiny.proc)
    assert [i["turns"] for i in a.turn_info] == [3, 3] and [i["tool_failures"] for i in a.turn_info] == [0, 0]
    assert torch.equal(a.completion_ids, b.completion_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=2e-5, rtol=0)
    assert all(i["later_reused_tokens"] > 0 for i in a.turn_info)


def test_seek_turns_from_the_cache_qwen3_vl(monkeypatch):
    """Qwen3-VL: a video is one vision block per frame (with its timestamp text); continued turns with new seek
    videos equal the whole prefill and the trainer's recompute."""
    from mmgrpo.vlm.models.tiny import build_tiny_model

    torch.manual_seed(0)
    model, proc = build_tiny_model("qwen3_vl")
    (a, b), suppress = _seek_rollouts("qwen3_vl", monkeypatch, model, proc)
    assert [i["turns"] for i in a.turn_info] == [3, 3] and [i["tool_failures"] for i in a.turn_info] == [0, 0]
    assert torch.equal(a.completion_ids, b.completion_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=2e-5, rtol=0)
    with torch.no_grad():
        lp = compute_token_logprobs(model, collate_prompts(a.items, proc.tokenizer.pad_token_id), a.completion_ids,
                                    a.completion_mask, 1.0, suppress)
    m = a.loss_mask.bool()
    torch.testing.assert_close(lp[m], a.logprobs[m], atol=2e-5, rtol=0)
