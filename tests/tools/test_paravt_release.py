"""PARA-GRPO as released (EvolvingLMMs-Lab/ParaVT @cf55249e39, paravt/rl/rewards/format.py, tool.py, utils.py,
workflow.py): the format and tool rewards on hand-computed strings, the nFrames choice per sample, and the think
prefix after every generation prompt. Expected values are worked out in the comments from the release's weights."""
import torch

from mmgrpo.vlm.methods.para_grpo import FRAME_CHOICES, paravt_format_reward, paravt_tool_reward

CALL = '<tool_call>{"name": "seek", "arguments": {"start": 1, "end": 2}}</tool_call>'


def test_format_reward_by_hand():
    # closed think of 5 characters is not substantive (< 10); answer body: 0.3 + 0.2 (answer suffix); balanced: +0.1
    assert abs(paravt_format_reward("<think>short</think><answer>B</answer>") - 0.6) < 1e-12
    # unclosed substantive think (0.2), anchoring penalty -0.3 x 0.5, unbalanced: 0.05
    assert abs(paravt_format_reward("<think>a long enough thought here") - 0.05) < 1e-12
    # default weights (no answer suffix), no anchoring: think 0.3 + think-before-tool 0.3 + balanced 0.1
    c = "<think>thinking about it</think>" + CALL
    assert abs(paravt_format_reward(c, answer_suffix=False, anchor_weight=0.0) - 0.7) < 1e-12
    # with anchoring 0.5: + 0.5 x 0.4 (closed think) = 0.9
    assert abs(paravt_format_reward(c, answer_suffix=False, anchor_weight=0.5) - 0.9) < 1e-12
    # everything: 0.2 + 0.5 + 0.5 x 0.7 + 0.3 + 0.1 = 1.45 -> capped at 1
    full = "<think>thinking about it</think>" + CALL + "<|im_end|><answer>B</answer><|im_end|>"
    assert paravt_format_reward(full) == 1.0
    # an empty answer block earns nothing, and a zero score gets no balance bonus
    assert paravt_format_reward("<answer> </answer>") == 0.0
    assert paravt_format_reward("") == 0.0


def test_tool_reward_by_hand():
    assert paravt_tool_reward("no call", 1.0) == 0.0
    assert paravt_tool_reward(CALL, 0.0) == 0.1
    assert paravt_tool_reward(CALL, 1.0) == 0.6
    assert abs(paravt_tool_reward(CALL + "<tool_response>x</tool_response>", 1.0) - 0.8) < 1e-12
    assert paravt_tool_reward("<tool_call>{}</tool_call>", 1.0) == 0.0  # no name
    assert paravt_tool_reward("<tool_call>", 1.0) == 0.0  # empty, unclosed
    assert paravt_tool_reward("<tool_code>seek(1, 2)</tool_code>", 0.0) == 0.1
    assert paravt_tool_reward("<tool_code># only a comment (x)</tool_code>", 0.0) == 0.0
    assert paravt_tool_reward('<tool_call>{"name": "seek"}', 0.0) == 0.1  # unclosed but parseable to the end


def test_frame_choice_is_fixed_per_sample():
    import types

    from mmgrpo.vlm.methods.para_grpo import ParaGRPO

    m = ParaGRPO.__new__(ParaGRPO)
    m.o = types.SimpleNamespace(frame_choices=list(FRAME_CHOICES), min_frames=0, max_frames=0)
    m.cfg = types.SimpleNamespace(run=types.SimpleNamespace(seed=3))
    ks = {s: m.frames_for(0, 0, {"id": s}, 64) for s in ("a", "b", "c", "d", "e", "f")}
    assert set(ks.values()) <= set(FRAME_CHOICES)
    assert ks == {s: m.frames_for(7, 5, {"id": s}, 64) for s in ks}  # another step, another position: same K
    assert m.frames_for(0, 0, {"id": "a"}, 3) == min(ks["a"], 3)


def test_generation_prefix_after_every_generation_prompt(tiny):
    """tools.generation_prefix ('<think>\\n', ParaVT's think prefix) follows the first prompt and each tool turn, as
    template tokens (loss 0); the policy turns are unchanged."""
    from mmgrpo.vlm.models.rollout import SamplingParams
    from mmgrpo.vlm.tools.config import ToolsConfig
    from mmgrpo.vlm.tools.rollout import MultiTurnBackend, ScriptedTurns

    turn1 = '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [0, 0, 28, 28]}}</tool_call>'
    opts = ToolsConfig(enabled=True, names=["crop"], crop_pixels=56 * 56, max_total_tokens=400, instruction="none",
                       generation_prefix="<think>\n")
    mt = MultiTurnBackend(ScriptedTurns(tiny.tok, [[turn1, "<answer>B</answer>"]]), tiny.proc, opts)
    out = mt.generate([tiny.item], 1, SamplingParams(max_new_tokens=100), seeds=None,
                      raw_prompts=[{"images": [tiny.img]}])
    tok = tiny.tok
    prompt = out.items[0]["input_ids"][0].tolist()
    assert tok.decode(prompt).endswith("<|im_start|>assistant\n<think>\n")
    n = int(out.completion_mask[0].sum())
    ids, lm = out.completion_ids[0, :n].tolist(), out.loss_mask[0, :n].tolist()
    k = lm.index(0)
    k2 = k + lm[k:].index(1)
    assert tok.decode(ids[:k]) == turn1 + "<|im_end|>"
    assert tok.decode(ids[k:k2]).endswith("<|im_start|>assistant\n<think>\n")
    assert tok.decode(ids[k2:]) == "<answer>B</answer><|im_end|>"
