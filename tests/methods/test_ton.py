"""TON: the think / skip classification and its format reward on hand-written completions, the per-mode statistics
by hand, and the trainer logging them (a base that never thinks: think ratio 0); the think-or-not task's SFT targets
(thought dropout) and forced-mode prompts."""
import pytest
import torch

from mmgrpo.vlm.methods.ton import group_stats, mode_stats, thought_mode, ton_format
from mmgrpo.vlm.train.trainer import GRPOTrainer


@pytest.mark.parametrize("text,mode,fmt", [
    ("<think>the ball moves at 3 s</think><answer>3 to 5</answer>", "think", 1.0),
    ("<think>\n\n</think><answer>3 to 5</answer>", "skip", 1.0),
    ("<think></think> <answer>3 to 5</answer>", "skip", 1.0),
    ("<answer>3 to 5</answer>", "skip", 1.0),
    ("3 to 5", "skip", 0.0),
    ("<think>x</think>", "think", 0.0),
    ("<answer>3 to 5</answer><think>late</think>", "think", 0.0),
    ("<think>a</think><answer><answer>1</answer>", "think", 0.0),
])
def test_mode_and_format(text, mode, fmt):
    assert thought_mode(text) == mode
    assert ton_format(text) == fmt


def test_direct_answer_is_malformed_without_direct_is_skip():
    assert ton_format("<answer>3 to 5</answer>", direct_is_skip=False) == 0.0
    assert ton_format("<think> </think><answer>3 to 5</answer>", direct_is_skip=False) == 1.0


def test_mode_stats_by_hand():
    m = mode_stats(["think", "skip", "think", "skip"], torch.tensor([10, 2, 20, 4]), torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert m == {"ton/think_ratio": 0.5, "ton/length_think": 15.0, "ton/acc_think": 0.5, "ton/length_skip": 3.0,
                 "ton/acc_skip": 0.5}
    assert mode_stats(["skip"], torch.tensor([3]), torch.tensor([1.0]))["ton/length_think"] == -1.0


def test_group_stats_by_hand():
    m = group_stats(["think", "skip", "think", "think"], torch.tensor([10, 2, 20, 4]),
                    torch.tensor([1.0, 0.0, 0.0, 1.0]), ["hard", "easy", "hard", "easy"])
    assert m == {"ton/easy/think_ratio": 0.5, "ton/easy/length": 3.0, "ton/easy/acc": 0.5,
                 "ton/hard/think_ratio": 1.0, "ton/hard/length": 15.0, "ton/hard/acc": 0.5}


def test_trainer_logs_the_split_and_adds_the_format(tmp_path, tiny_dirs, th):
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "reward.accuracy_key=acc",
                      "methods.ton.enabled=true", "methods.ton.format_weight=0.25", "methods.ton.threshold=0.5",
                      "methods.ton.group_by=kind")
    samples = [dict(s, meta={"kind": k}) for s, k in zip(th.image_samples(2), ("easy", "hard"))]
    tr = GRPOTrainer(cfg, samples=samples, reward_fn=th.text_reward)
    hist = tr.train()
    rb = tr.state.batch
    fmt = torch.tensor([ton_format(t) for t in rb.texts])
    torch.testing.assert_close(rb.rewards["total"], rb.rewards["acc"] + 0.25 * fmt)
    modes = [thought_mode(t) for t in rb.texts]
    want = mode_stats(modes, rb.completion_mask.sum(1), (rb.rewards["acc"] >= 0.5).float())
    kinds = [s["meta"]["kind"] if isinstance(s, dict) else s.meta["kind"] for s in rb.samples]
    want.update(group_stats(modes, rb.completion_mask.sum(1), (rb.rewards["acc"] >= 0.5).float(), kinds))
    assert {"ton/easy/think_ratio", "ton/hard/length"} <= set(want)
    for k, v in want.items():
        assert hist[-1][k] == pytest.approx(v)


def test_think_or_not_targets_dropout_and_forced_prefix(tiny_dirs):
    import torch
    from transformers import AutoProcessor

    from mmgrpo.vlm.synthetic import think_or_not as vt

    from mmgrpo.synthetic import think_or_not as ton

    s = ton.make_samples(2, "val", seed=0)
    for x in s:
        assert vt.target_text(x, True) == f"<think>{x['meta']['thought']}</think><answer>{x['answer']}</answer>"
        assert vt.target_text(x, False) == f"<think>\n\n</think><answer>{x['answer']}</answer>"
        assert thought_mode(vt.target_text(x, True)) == "think" and thought_mode(vt.target_text(x, False)) == "skip"
        assert ton_format(vt.target_text(x, True)) == ton_format(vt.target_text(x, False)) == 1.0
    for x in s:  # the image path is resolved by the loader; an in-memory image here
        from mmgrpo.vlm.models.tiny import synthetic_image
        x["image"] = synthetic_image(0, 56, 56)
    proc = AutoProcessor.from_pretrained(tiny_dirs("qwen2_5_vl"))
    ta = vt.task_adapter(proc)
    tok = proc.tokenizer
    plain, _ = vt.prepare(ta, s[0])
    forced, text = vt.prepare(ta, s[0], vt.SKIP_THOUGHT)
    extra = tok(vt.SKIP_THOUGHT, add_special_tokens=False)["input_ids"]
    assert torch.equal(forced["input_ids"][0], torch.cat([plain["input_ids"][0], torch.tensor(extra)]))
    assert forced["mm_token_type_ids"].shape == forced["input_ids"].shape and text.endswith(vt.SKIP_THOUGHT)
    # dropout 0 keeps every thought, 1 drops every one; the examples follow vt.dropped
    assert [thought_mode(e.answer_text) for e in vt.sft_examples(ta, s, 0.0)] == ["think", "think"]
    assert [thought_mode(e.answer_text) for e in vt.sft_examples(ta, s, 1.0)] == ["skip", "skip"]
    d = vt.dropped(2000, 0.5, seed=3)
    assert 900 <= sum(d) <= 1100 and d == vt.dropped(2000, 0.5, seed=3) != vt.dropped(2000, 0.5, seed=4)
    nl = vt.newline_token_ids(tok)  # forced think: these are suppressed after "<think>"
    assert tok("\n", add_special_tokens=False)["input_ids"][0] in nl
    assert all("\n" in tok.decode([i]) for i in nl) and tok.convert_tokens_to_ids("</think>") not in nl
    e = vt.sft_examples(ta, s[:1], 0.0)[0]
    assert tok.decode(e.answer_ids) == e.answer_text + "<|im_end|>"
    with pytest.raises(ValueError, match="dropout"):
        vt.sft_examples(ta, s[:1], 1.5)
