"""MGPO (mmgrpo.vlm.methods.mgpo) and PARA-GRPO (mmgrpo.vlm.methods.para_grpo): the grounding call, the
well-formedness rule, structure-token masks, the structure-token loss term (value and gradient by hand), the frame
budget, and both methods through one trainer step."""


import numpy as np
import pytest
import torch

from mmgrpo.vlm.methods.mgpo import grounding_box, mgpo_calls
from mmgrpo.vlm.methods.para_grpo import frame_budget, structure_mask, structure_term, subsample_clip, well_formed
from mmgrpo.vlm.tools.rollout import turn_spans

CALL = '<tool_call>{"name": "seek", "arguments": {"start": 1, "end": 2}}</tool_call>'


def test_mgpo_first_turn_box_is_the_crop_call():
    assert grounding_box("the cup is at [12, 30.5, 80, 96] I think") == [12.0, 30.5, 80.0, 96.0]
    assert grounding_box("[1, 2, 3]") is None
    c = mgpo_calls("region [10, 20, 30, 40]", 1)
    assert [(x.name, x.arguments) for x in c] == [("crop", {"bbox_2d": [10.0, 20.0, 30.0, 40.0]})]
    c = mgpo_calls('<tool_call>{"name": "crop", "arguments": {"bbox_2d": [1, 2, 3, 4]}}</tool_call> [5, 6, 7, 8]', 1)
    assert c[0].arguments == {"bbox_2d": [1, 2, 3, 4]}  # an explicit crop call wins
    assert mgpo_calls("no box here", 1)[0].error and mgpo_calls("[1, 2, 3, 4]", 2) == []


def test_mgpo_check_names_what_is_missing():
    from mmgrpo.utils.config import load_config
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.vlm.methods import check_config

    cfg = load_config(TrainConfig, None, ["methods.mgpo.enabled=true", "tools.enabled=true"])
    with pytest.raises(ValueError, match="tools.call_format=mgpo"):
        check_config(cfg)
    check_config(load_config(TrainConfig, None, ["methods.mgpo.enabled=true", "tools.enabled=true",
                                                 "tools.call_format=mgpo_plain"]))


def test_well_formed_rollouts():
    assert well_formed(["<answer>B</answer>"])
    assert well_formed([CALL + CALL, "ok <answer>3.5</answer>"])  # parallel calls, then one answer
    assert not well_formed([CALL])  # no answer
    assert not well_formed(["<tool_call>{bad}</tool_call>", "<answer>B</answer>"])
    assert not well_formed([CALL + "<answer>A</answer>", "<answer>B</answer>"])
    assert not well_formed(["<answer>A</answer><answer>B</answer>"])
    assert not well_formed([CALL, "<answer>B</answer>" + CALL])
    assert not well_formed([])


def test_turn_spans_and_structure_mask_by_hand():
    assert turn_spans(torch.tensor([1, 1, 0, 0, 1, 0, 1])) == [(0, 2), (4, 5), (6, 7)]
    pieces = ["ab", "<tool", "_call>", "{x}", "</tool_call>", "x", "<answer>B", "</answer>"]

    class Tok:
        def decode(self, ids):
            return pieces[ids[0]]

    ids = torch.arange(len(pieces))
    got = structure_mask(ids, [(0, 5), (6, 8)], Tok(), ["<tool_call>", "</tool_call>", "<answer>", "</answer>"])
    assert got.tolist() == [False, True, True, False, True, False, True, True]
    # outside the spans nothing is marked
    assert structure_mask(ids, [(0, 1)], Tok(), ["<tool_call>"]).sum() == 0


def test_structure_term_value_and_gradient_by_hand():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.1]], requires_grad=True)
    old = logp.detach().clone()
    old[0, 1] = -2.5  # ratio e^{0.5} at (0, 1)
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[True, True, False], [False, True, False]])
    term = structure_term(logp, old, adv, mask, n_total=4.0)
    want = -(1.0 * 1.0 + 1.0 * np.exp(0.5) + (-2.0) * 1.0) / 4.0
    assert abs(float(term) - want) < 1e-6
    term.backward()
    g = torch.zeros(2, 3)
    g[0, 0], g[0, 1], g[1, 1] = -1.0 / 4, -np.exp(0.5) / 4, 2.0 / 4  # d/dlogp of -A * e^{logp-old} / N
    torch.testing.assert_close(logp.grad, g)


def test_frame_budget_and_subsampled_time_axis():
    from mmgrpo.video.clip import load_video
    from mmgrpo.video.processor import build_video_inputs
    from mmgrpo.vlm.models.tiny import build_tiny_processor, synthetic_frames

    g = torch.Generator().manual_seed(0)
    draws = {frame_budget(g, 2, 6, 8) for _ in range(50)}
    assert draws == {2, 4, 6}
    assert frame_budget(g, 3, 0, 4) == 4 and frame_budget(g, 10, 12, 8) == 8  # nothing in range: all frames
    clip = load_video(synthetic_frames(0, 16, 56, 56), fps=2.0, video_fps=2.0, min_frames=2, image_factor=28,
                      min_pixels=784, max_pixels=3136)  # 16 frames over 8 s
    sub = subsample_clip(clip, 4)
    assert sub.frame_indices == [0, 5, 10, 15] and sub.sample_fps == 0.5  # 4 / 16 frames x 2 fps
    proc = build_tiny_processor("qwen2_5_vl")
    out = build_video_inputs(proc, sub, "<|vision_start|><|video_pad|><|vision_end|>x")  # checks the time axis
    assert float(out["second_per_grid_ts"][0]) == 4.0  # 2 / 0.5 fps: two grid steps cover the 8 s


def test_para_grpo_and_mgpo_in_a_trainer_step(tmp_path, tiny_dir, forced, kit):
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    cfg, samples, reward = kit.cfg, kit.samples, kit.reward

    c = cfg(tmp_path, tiny_dir, "methods.para_grpo.enabled=true", "methods.para_grpo.format_coef=1.0",
            "run.max_steps=1")
    tr = GRPOTrainer(c, samples=samples(2), reward_fn=reward)
    first = ['<tool_call>{"name": "crop", "arguments": {"bbox_2d": [0, 0, 28, 28]}}</tool_call>',
             "<answer>B</answer>"]
    tr.backend.inner = forced(tr.backend.inner, tr.policy, first)
    hist = tr.train()
    m = hist[-1]
    # rows alternate: a call whose random second turn does not answer (0), a direct answer (1)
    assert m["reward/format_structure/mean"] == 0.5 and m["para_grpo/format_rate"] == 0.5
    assert m["para_grpo/structure_tokens"] > 0
    # the release's format reward on the policy tokens: "<answer>B</answer><|im_end|>" = 0.3 + 0.2 + 0.1 (balanced);
    # a bare call then a random turn: 0 (no think, no answer)
    assert abs(m["reward/paravt_format/mean"] - 0.3) < 1e-6
    # MGPO: its first-turn box is the crop
    c = cfg(tmp_path / "m", tiny_dir, "methods.mgpo.enabled=true", "tools.call_format=mgpo_plain", "run.max_steps=1",
            "methods.turn_shaping.enabled=true", "tools.max_total_tokens=600")
    tr = GRPOTrainer(c, samples=samples(2), reward_fn=reward)
    tr.backend.inner = forced(tr.backend.inner, tr.policy, ["[0, 0, 28, 28]", "nothing"])
    m = tr.train()[-1]
    assert m["mgpo/grounded"] == 0.5 and m["reward/tools/tool_calls/mean"] == 0.5
    assert m["reward/tools/tool_failures/mean"] == 0.5  # no box: a counted failure, not a call
    assert m["turn_shaping/penalised_turns"] == 4.0  # the 4 rows without a box (2 prompts x G/2)


def test_turn_shaping_by_hand():
    from mmgrpo.vlm.methods.turn_shaping import shaping_values, token_pg_term, turn_failures

    # tokens: turn 1 (0-1), tool turn with two failures (2), turn 2 (3-4), tool turn ok (5), turn 3 (6), padding (7)
    pieces = ["a", "b", "Error: x Error: y", "c", "d", "fine", "e", "<pad>"]
    ids = torch.arange(8)
    loss = torch.tensor([1, 1, 0, 1, 1, 0, 1, 0])
    comp = torch.tensor([1, 1, 1, 1, 1, 1, 1, 0])
    turns = turn_failures(ids, loss, comp, lambda xs: "".join(pieces[i] for i in xs))
    assert turns == [((0, 2), 2), ((3, 5), 0), ((6, 7), 0)]
    v = shaping_values(turns, 8, 0.5)
    assert v.tolist() == [-1.0, -1.0, 0, 0, 0, 0, 0, 0]
    logp = torch.full((1, 8), -1.0, requires_grad=True)
    term = token_pg_term(logp, logp.detach(), v[None], loss[None], n_total=5.0)
    assert abs(float(term) - 2 * 1.0 / 5.0) < 1e-7  # -(1/5) * (-1 -1)
    term.backward()
    # d/dlogp of -v * e^{logp-old} / N
    torch.testing.assert_close(logp.grad, torch.tensor([[0.2, 0.2, 0, 0, 0, 0, 0, 0]]))


def test_single_turn_token_methods_are_refused_with_tools():
    from mmgrpo.utils.config import load_config
    from mmgrpo.vlm.config import TrainConfig

    for m in ("tw_grpo", "entropy", "seed_grpo", "kimi_length", "dapo_overlong"):
        with pytest.raises(ValueError, match=f"'{m}'.*tool-turn tokens"):
            load_config(TrainConfig, None, ["tools.enabled=true", f"methods.{m}.enabled=true"])
    with pytest.raises(ValueError, match="single-turn"):
        load_config(TrainConfig, None, ["tools.enabled=true", "methods.t_grpo.enabled=true"])
