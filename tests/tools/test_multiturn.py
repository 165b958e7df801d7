"""Multi-turn tool rollouts (mmgrpo.vlm.tools.rollout): the two-turn sequence, its loss mask and log-prob sum
against an independent construction (the whole conversation rendered by the chat template and processed in one
processor call, each turn scored by the single-turn path); HF generation after a tool turn; budgets; the vLLM
request path."""
import json

import pytest
import torch

from mmgrpo.vlm.models.rollout import HFRolloutBackend, SamplingParams, collate_prompts, compute_token_logprobs
from mmgrpo.vlm.tools import ToolContext, ToolsConfig, call_tool
from mmgrpo.vlm.tools.rollout import MultiTurnBackend, ToolTurnRenderer

CALL = '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [0, 0, 56, 28]}}</tool_call>'
TURN1 = "look " + CALL
TURN2 = "<answer>B</answer>"


def _lp(t, item, ids):
    ids = torch.tensor([ids])
    with torch.no_grad():
        return compute_token_logprobs(t.model, collate_prompts([item], t.tok.pad_token_id), ids,
                                      torch.ones_like(ids), 1.0, t.suppress)[0]


def _ids(t, text):
    return t.tok(text, add_special_tokens=False)["input_ids"] + [t.tok.convert_tokens_to_ids("<|im_end|>")]


def test_renderer_matches_the_template_and_the_text_convention(tiny):
    r = ToolTurnRenderer(tiny.proc, "auto")
    assert r.role == "user" and r.eot == "<|im_end|>"  # the tiny (and released Qwen2.5-VL) template: no tool branch
    from mmgrpo.vlm.tools import ToolResult

    txt = r.text([ToolResult(text="hi", images=[object()]), ToolResult(text="no")])
    assert txt == ("\n<|im_start|>user\n<tool_response>\n<|vision_start|><|image_pad|><|vision_end|>hi\n"
                   "</tool_response>\n<tool_response>\nno\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_two_turn_mask_and_logprob_sum_by_hand(tiny, scripted):
    opts = ToolsConfig(enabled=True, names=["crop"], max_turns=3, crop_pixels=56 * 56, max_total_tokens=400,
                       instruction="none")
    mt = MultiTurnBackend(scripted(tiny, [TURN1, TURN2]), tiny.proc, opts)
    out = mt.generate([tiny.item], 2, SamplingParams(max_new_tokens=64), seeds=[1, 2],
                      raw_prompts=[{"images": [tiny.img], "sample": {"id": "s"}}])
    # independent construction: the tool's result, the whole conversation through the chat template + processor
    ctx = ToolContext(images=[tiny.img], resized_sizes=[(112, 84)], options=opts)
    res = call_tool("crop", ctx, json.loads(CALL[len("<tool_call>"):-len("</tool_call>")])["arguments"])
    assert res.ok and "[0, 0, 56, 28]" in res.text  # the 112x84 image is its own model-input size
    conv = tiny.msgs + [
        {"role": "assistant", "content": [{"type": "text", "text": TURN1}]},
        {"role": "user", "content": [{"type": "text", "text": "<tool_response>\n"}, {"type": "image"},
                                     {"type": "text", "text": res.text + "\n</tool_response>"}]}]
    full_text = tiny.proc.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    ref = {k: v for k, v in tiny.proc(text=[full_text], images=[tiny.img, res.images[0]], return_tensors="pt").items()
           if isinstance(v, torch.Tensor)}
    P = tiny.item["input_ids"].shape[1]
    t1, t2 = _ids(tiny, TURN1), _ids(tiny, TURN2)
    ref_ids = ref["input_ids"][0]
    n_tool = ref_ids.numel() - P - len(t1)
    L = len(t1) + n_tool + len(t2)
    for r in range(2):
        # the row = prompt ++ turn 1 ++ tool turn ++ turn 2, token for token the template's conversation
        assert torch.equal(torch.cat([tiny.item["input_ids"][0], out.completion_ids[r, :L - len(t2)]]), ref_ids)
        assert out.completion_ids[r, L - len(t2):L].tolist() == t2
        assert out.loss_mask[r, :L].tolist() == [1] * len(t1) + [0] * n_tool + [1] * len(t2)
        assert out.completion_mask[r, :L].tolist() == [1] * L and out.completion_mask[r, L:].sum() == 0
        assert torch.equal(out.items[r]["pixel_values"], ref["pixel_values"])  # both images, token order
        assert torch.equal(out.items[r]["image_grid_thw"], ref["image_grid_thw"])
        info = out.turn_info[r]
        assert (info["turns"], info["tool_calls"], info["tool_failures"], info["stop"]) == (2, 1, 0, "answer")
        assert info["visual_tokens"] == int((ref_ids[P:] == tiny.tok.convert_tokens_to_ids("<|image_pad|>")).sum())
        assert out.texts[r] == TURN2 and info["turn_texts"] == [TURN1, TURN2]  # rewards read the answer turn
    # log-probs: the trainer's one forward over the row, summed over the loss mask, = turn 1 scored after the prompt
    # + turn 2 scored after the independently processed conversation (vision tokens and MRoPE positions included)
    with torch.no_grad():
        joint = compute_token_logprobs(tiny.model, collate_prompts(out.items[:1], tiny.tok.pad_token_id),
                                       out.completion_ids[:1, :L], out.completion_mask[:1, :L], 1.0, tiny.suppress)[0]
    want = _lp(tiny, tiny.item, t1).sum() + _lp(tiny, ref, t2).sum()
    got = (joint * out.loss_mask[0, :L]).sum()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    torch.testing.assert_close(joint[L - len(t2):], _lp(tiny, ref, t2), atol=1e-5, rtol=0)
    # the rollout's log-probs are the policy tokens' only (0 on the tool turn)
    assert out.logprobs[0, len(t1):len(t1) + n_tool].abs().sum() == 0
    torch.testing.assert_close(out.logprobs[0, :L] * out.loss_mask[0, :L], joint * out.loss_mask[0, :L],
                               atol=1e-5, rtol=0)


def test_hf_generation_after_a_tool_turn_is_on_policy_and_seeded(tiny, scripted):
    """Turn 1 scripted (a random model never calls a tool), turn 2 sampled by the HF backend from the prefilled
    conversation: its sampling log-probs equal the trainer's joint forward; same seeds, same tokens."""
    opts = ToolsConfig(enabled=True, names=["crop"], max_turns=2, crop_pixels=56 * 56, max_total_tokens=300)
    hf = HFRolloutBackend(tiny.model, tiny.proc, tiny.suppress, max_batch_size=8)
    outs = []
    for _ in range(2):
        mt = MultiTurnBackend(scripted(tiny, [TURN1], then=hf), tiny.proc, opts)
        outs.append(mt.generate([tiny.item], 2, SamplingParams(max_new_tokens=5), seeds=[7, 8],
                                raw_prompts=[{"images": [tiny.img]}]))
    a, b = outs
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.logprobs, b.logprobs)
    n1 = len(_ids(tiny, TURN1))
    assert not torch.equal(a.completion_ids[0], a.completion_ids[1])  # turn-2 seeds differ per row
    with torch.no_grad():
        joint = compute_token_logprobs(tiny.model, collate_prompts(a.items, tiny.tok.pad_token_id), a.completion_ids,
                                       a.completion_mask, 1.0, tiny.suppress)
    m = a.loss_mask.bool()
    assert int(m[:, n1:].sum()) > 0
    torch.testing.assert_close(a.logprobs[m], joint[m], atol=5e-5, rtol=0)
    assert all(i["stop"] in ("max_turns", "turn_token_limit", "no_call", "answer", "eos") for i in a.turn_info)


def test_budgets_and_failures_are_counted(tiny, scripted):
    two = CALL + CALL.replace("[0, 0, 56, 28]", "[0, 0, 28, 28]")
    bad = '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [1, 2]}}</tool_call>'

    def run(script, **kw):
        o = ToolsConfig(**{"enabled": True, "names": ["crop"], "crop_pixels": 56 * 56, "max_total_tokens": 400,
                           **kw})
        return MultiTurnBackend(scripted(tiny, script), tiny.proc, o).generate(
            [tiny.item], 1, SamplingParams(max_new_tokens=64), seeds=[1], raw_prompts=[{"images": [tiny.img]}])

    out = run([two, TURN2], max_tool_calls=1)  # the second parallel call is refused
    i = out.turn_info[0]
    assert (i["tool_calls"], i["tool_failures"], i["tools_called"]) == (1, 1, ["crop"])
    assert "budget of 1 calls" in tiny.tok.decode(out.completion_ids[0][out.loss_mask[0] == 0])
    out = run([bad, TURN2])  # bad arguments: the error is the tool turn, the rollout goes on
    i = out.turn_info[0]
    assert (i["turns"], i["tool_calls"], i["tool_failures"], i["visual_tokens"], i["stop"]) == (2, 1, 1, 0, "answer")
    assert "Error: crop: 'bbox_2d' must be a list of 4 numbers" in tiny.tok.decode(out.completion_ids[0])
    out = run([CALL, TURN2], max_visual_tokens=1)  # the crop's vision tokens exceed the budget: refused
    i = out.turn_info[0]
    assert (i["visual_tokens"], i["tool_failures"]) == (0, 1) and "visual token budget" in out.texts[0] + \
        tiny.tok.decode(out.completion_ids[0])
    out = run([CALL, CALL], max_turns=2)  # the last allowed turn calls again: the rollout ends there
    assert (out.turn_info[0]["turns"], out.turn_info[0]["stop"]) == (2, "max_turns")
    out = run([CALL, TURN2], max_total_tokens=40)  # no room for the tool turn
    assert (out.turn_info[0]["turns"], out.turn_info[0]["stop"]) == (1, "token_budget")
    out = run([TURN2])  # answers at once: the single-turn rollout
    assert out.loss_mask[0].tolist() == out.completion_mask[0].tolist() and out.turn_info[0]["turns"] == 1


def test_vllm_requests_carry_the_conversation_and_its_images(tiny, scripted):
    """The vLLM backend gets each later turn as the whole conversation: ids with vision runs collapsed, the
    prompt's and the tool's images in token order; a fake engine expanding each image as vLLM's processor would
    (grid tokens) must give back exactly the trainer's ids (check_prompt_expansion). The engine itself: not run
    (no vLLM on CPU)."""
    from mmgrpo.vlm.models.vllm_backend import VLLMRolloutBackend
    from mmgrpo.vlm.models.vllm_client import EngineOutput

    img_id = tiny.tok.convert_tokens_to_ids("<|image_pad|>")
    seen = []

    class Engine:
        def run(self, reqs):
            outs = []
            for prompt, kw in reqs:
                seen.append(prompt)
                grids = [tiny.proc.image_processor(images=[im], return_tensors="pt")["image_grid_thw"][0]
                         for im in prompt.get("multi_modal_data", {}).get("image", [])]
                ids, k = [], 0
                for t in prompt["prompt_token_ids"]:
                    if t == img_id:
                        ids += [t] * (int(grids[k].prod()) // 4)
                        k += 1
                    else:
                        ids.append(t)
                toks = _ids(tiny, TURN1 if len(seen) <= 1 else TURN2)
                outs.append(EngineOutput(ids, toks, [-0.5] * len(toks)))
            return outs

    be = VLLMRolloutBackend(Engine(), tiny.tok, suppress_token_ids=tiny.suppress)
    mt = MultiTurnBackend(be, tiny.proc, ToolsConfig(enabled=True, names=["crop"], crop_pixels=56 * 56,
                                                     max_total_tokens=400))
    out = mt.generate([tiny.item], 1, SamplingParams(max_new_tokens=100), seeds=[3],
                      raw_prompts=[{"images": [tiny.img]}])
    assert len(seen) == 2 and len(seen[1]["multi_modal_data"]["image"]) == 2
    assert seen[1]["prompt_token_ids"].count(img_id) == 2
    assert out.turn_info[0]["turns"] == 2 and out.turn_info[0]["stop"] == "answer"


def test_seek_turn_through_the_video_contract(tiny, scripted):
    """A seek's frames enter as a second video with its own fps: ids, grids and second_per_grid_ts equal the whole
    two-video conversation processed in one call, and turn 2's log-probs equal its single-turn scoring."""
    import numpy as np

    from mmgrpo.video.clip import load_video
    from mmgrpo.video.processor import build_video_inputs
    from mmgrpo.video.testing import index_frame

    frames = np.stack([index_frame(i, 56, 56) for i in range(40)])  # 10 s at 4 fps
    clip = load_video(frames, fps=0.5, video_fps=4.0, min_frames=2, image_factor=28, min_pixels=784,
                      max_pixels=3136)
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "when?"}]}]
    text = tiny.proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    item = {k: v for k, v in build_video_inputs(tiny.proc, clip, text).items() if isinstance(v, torch.Tensor)}
    call = '<tool_call>{"name": "seek", "arguments": {"start": 3, "end": 5}}</tool_call>'
    opts = ToolsConfig(enabled=True, names=["seek"], seek_fps=2.0, seek_max_frames=8, max_total_tokens=400,
                       instruction="none")
    out = MultiTurnBackend(scripted(tiny, [call, TURN2]), tiny.proc, opts).generate(
        [item], 1, SamplingParams(max_new_tokens=100), seeds=[1],
        raw_prompts=[{"clip": clip, "sample": {"video": frames}}])
    assert out.turn_info[0]["stop"] == "answer" and out.turn_info[0]["tool_failures"] == 0
    res = call_tool("seek", ToolContext(sample={"video": frames}, clip=clip, options=opts), {"start": 3, "end": 5})
    c2 = res.clips[0]
    conv = msgs + [{"role": "assistant", "content": [{"type": "text", "text": call}]},
                   {"role": "user", "content": [{"type": "text", "text": "<tool_response>\n"}, {"type": "video"},
                                                {"type": "text", "text": res.text + "\n</tool_response>"}]}]
    full = tiny.proc.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    ref = tiny.proc(text=[full], videos=[clip.frames, c2.frames], return_tensors="pt", do_sample_frames=False,
                    do_resize=False, input_data_format="channels_last", cap_pixels_per_frame=False,
                    video_metadata=[clip.video_metadata(), c2.video_metadata()])
    ref = {k: v for k, v in ref.items() if isinstance(v, torch.Tensor)}
    t2 = _ids(tiny, TURN2)
    L = int(out.completion_mask[0].sum())
    assert torch.equal(torch.cat([item["input_ids"][0], out.completion_ids[0, :L - len(t2)]]), ref["input_ids"][0])
    for k in ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts"):
        assert torch.equal(out.items[0][k], ref[k]), k
    # 4 frames over 10 s (0.4 fps) then 4 frames over 2.25 s (1.78 fps): 2 / sample_fps per grid step
    torch.testing.assert_close(out.items[0]["second_per_grid_ts"], torch.tensor([5.0, 1.125]))
    with torch.no_grad():
        joint = compute_token_logprobs(tiny.model, collate_prompts(out.items, tiny.tok.pad_token_id),
                                       out.completion_ids[:, :L], out.completion_mask[:, :L], 1.0, tiny.suppress)[0]
    torch.testing.assert_close(joint[L - len(t2):], _lp(tiny, ref, t2), atol=1e-5, rtol=0)


def test_instruction_is_inserted_at_the_end_of_the_user_turn(tiny, scripted):
    opts = ToolsConfig(enabled=True, names=["crop", "seek"], max_total_tokens=400)
    mt = MultiTurnBackend(scripted(tiny, [TURN2]), tiny.proc, opts)
    assert "<tool_call>" in mt.instruction and "in pixels of the image as you see it" in mt.instruction
    out = mt.generate([tiny.item], 1, SamplingParams(max_new_tokens=64), seeds=[1],
                      raw_prompts=[{"images": [tiny.img]}])
    got = tiny.tok.decode(out.items[0]["input_ids"][0])
    want = tiny.tok.decode(tiny.item["input_ids"][0]).replace(
        "which colour?<|im_end|>", "which colour?\n" + mt.instruction + "<|im_end|>")
    assert got == want
    n = out.items[0]["input_ids"].shape[1]
    assert out.items[0]["attention_mask"].tolist() == [[1] * n] and out.items[0]["mm_token_type_ids"].shape[1] == n


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_two_turn_logprobs_other_families(family, scripted):
    """The same hand check on Qwen2-VL and Qwen3-VL (0-1000 box frame; Qwen3-VL's interleaved MRoPE)."""
    import types

    from mmgrpo.vlm.models.tiny import build_tiny_model, synthetic_image, vision_token_ids

    model, proc = build_tiny_model(family)
    img = synthetic_image(3, 96, 128)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "which colour?"}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    item = {k: v for k, v in proc(text=[text], images=[img], return_tensors="pt").items()
            if isinstance(v, torch.Tensor)}
    t = types.SimpleNamespace(model=model, proc=proc, tok=proc.tokenizer, suppress=vision_token_ids(proc.tokenizer))
    call = '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [0, 0, 500, 500]}}</tool_call>'
    opts = ToolsConfig(enabled=True, names=["crop"], max_total_tokens=400, instruction="none")
    out = MultiTurnBackend(scripted(t, [call, TURN2]), proc, opts, family=family).generate(
        [item], 1, SamplingParams(max_new_tokens=100), seeds=[1], raw_prompts=[{"images": [img]}])
    assert out.turn_info[0]["stop"] == "answer" and out.turn_info[0]["tool_failures"] == 0
    patch = proc.image_processor.patch_size
    g = item["image_grid_thw"][0]
    ctx = ToolContext(images=[img], family=family, resized_sizes=[(int(g[2]) * patch, int(g[1]) * patch)],
                      image_factor=2 * patch, options=opts)
    res = call_tool("crop", ctx, {"bbox_2d": [0, 0, 500, 500]})
    assert "[0, 0, 64, 48]" in res.text  # half of 128 x 96 on the 0-1000 grid
    conv = msgs + [{"role": "assistant", "content": [{"type": "text", "text": call}]},
                   {"role": "user", "content": [{"type": "text", "text": "<tool_response>\n"}, {"type": "image"},
                                                {"type": "text", "text": res.text + "\n</tool_response>"}]}]
    full = proc.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    ref = {k: v for k, v in proc(text=[full], images=[img, res.images[0]], return_tensors="pt").items()
           if isinstance(v, torch.Tensor)}
    t2 = _ids(t, TURN2)
    L = int(out.completion_mask[0].sum())
    assert torch.equal(torch.cat([item["input_ids"][0], out.completion_ids[0, :L - len(t2)]]), ref["input_ids"][0])
    with torch.no_grad():
        joint = compute_token_logprobs(model, collate_prompts(out.items, t.tok.pad_token_id), out.completion_ids[:, :L],
                                       out.completion_mask[:, :L], 1.0, t.suppress)[0]
    torch.testing.assert_close(joint[L - len(t2):], _lp(t, ref, t2), atol=1e-5, rtol=0)


def test_scripted_turns_make_training_rows_from_written_traces(tiny):
    """Written tool traces -> rows (e.g. SFT targets): the tools run, the loss mask covers the written turns."""
    from mmgrpo.vlm.tools.rollout import ScriptedTurns

    opts = ToolsConfig(enabled=True, names=["crop"], crop_pixels=56 * 56, max_total_tokens=400, instruction="none")
    traces = [[TURN1, TURN2], [TURN2]]
    mt = MultiTurnBackend(ScriptedTurns(tiny.tok, traces), tiny.proc, opts)
    out = mt.generate([tiny.item, tiny.item], 2, SamplingParams(max_new_tokens=100), seeds=None,
                      raw_prompts=[{"images": [tiny.img]}] * 2)
    assert [i["turn_texts"] for i in out.turn_info] == [[TURN1, TURN2]] * 2 + [[TURN2]] * 2
    assert [i["tool_calls"] for i in out.turn_info] == [1, 1, 0, 0]
    n1, n2 = len(_ids(tiny, TURN1)), len(_ids(tiny, TURN2))
    assert out.loss_mask.sum(1).tolist() == [n1 + n2] * 2 + [n2] * 2
    assert out.items[0]["image_grid_thw"].shape[0] == 2 and out.items[2]["image_grid_thw"].shape[0] == 1


def test_a_template_with_a_tool_role_renders_tool_messages():
    """tools.tool_role=auto picks the template's own tool branch when it has one (a Qwen3-style ChatML here)."""
    from mmgrpo.vlm.tools import ToolResult

    class Proc:
        chat_template = "has 'tool'"

        def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=False):
            out = ""
            for m in msgs:
                body = "".join("<|vision_start|><|image_pad|><|vision_end|>" if c["type"] == "image" else c["text"]
                               for c in m["content"])
                if m["role"] == "tool":
                    out += f"<|im_start|>user\n<tool_response>\n{body}\n</tool_response><|im_end|>\n"
                else:
                    out += f"<|im_start|>{m['role']}\n{body}<|im_end|>\n"
            return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    r = ToolTurnRenderer(Proc(), "auto")
    assert r.role == "tool"
    assert r.text([ToolResult(text="ok", images=[object()])]) == (
        "\n<|im_start|>user\n<tool_response>\n<|vision_start|><|image_pad|><|vision_end|>ok\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n")


def test_each_row_generates_within_its_own_budget(tiny, scripted):
    """Later turns: a row's token limit is its own budget's (rows with less room do not cut the others)."""
    long_call = "look closely here " + CALL
    # the probe run measures the tool turn with a budget that binds neither row (one call for turn 2)
    opts = ToolsConfig(enabled=True, names=["crop"], crop_pixels=56 * 56, instruction="none", max_total_tokens=10_000)
    probe = scripted(tiny, [lambda r: [CALL, long_call][r], TURN2])
    mt = MultiTurnBackend(probe, tiny.proc, opts)
    n_short, n_long = len(_ids(tiny, CALL)), len(_ids(tiny, long_call))
    out = mt.generate([tiny.item], 2, SamplingParams(max_new_tokens=100), seeds=[1, 2],
                      raw_prompts=[{"images": [tiny.img]}])
    tool = int((out.loss_mask[0] == 0)[:int(out.completion_mask[0].sum())].sum())
    # a budget that leaves the short row 30 tokens and the long row 30 - (n_long - n_short) for turn 2
    budget = n_short + tool + 30
    opts.max_total_tokens = budget
    probe = scripted(tiny, [lambda r: [CALL, long_call][r], TURN2, TURN2])
    MultiTurnBackend(probe, tiny.proc, opts).generate([tiny.item], 2, SamplingParams(max_new_tokens=100),
                                                      seeds=[1, 2], raw_prompts=[{"images": [tiny.img]}])
    limits = sorted(c[2].max_new_tokens for c in probe.calls[1:])
    assert limits == [30 - (n_long - n_short), 30]
