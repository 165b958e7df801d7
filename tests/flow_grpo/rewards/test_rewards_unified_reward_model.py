"""UnifiedReward judges run through a tiny random Qwen2.5-VL (mmgrpo.vlm.models.tiny): batched greedy generation,
the parse of what it generated, the registry entries, the trainer's win-rate wiring and the reward server.

A random model writes no verdict, so through it every judgement is a counted failure (the test of "never a
crash"); the success path of the wiring is tested with a scripted ``generate`` that writes the released format
from the pixels (brighter image wins), so the expected win rates are computed by hand."""
import threading

import numpy as np
import pytest
import torch

from flow_grpo.rewards import build_reward
from flow_grpo.rewards.unified_reward import UnifiedRewardPointwise, UnifiedRewardThinkPairwise

torch.set_num_threads(1)
PROMPTS = ["a red cube", "two cats on a table", "a door"]
MAX_NEW = 10


@pytest.fixture(scope="module")
def tiny():
    from mmgrpo.vlm.models.tiny import build_tiny_model

    model, proc = build_tiny_model("qwen2_5_vl", seed=0)
    with torch.no_grad():  # sharpen the random next-token distribution: greedy choices far from ties
        model.lm_head.weight.mul_(40.0)
    return model, proc


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(0).integers(0, 256, (3, 56, 56, 3), dtype=np.uint8)


def _unbatched_greedy(model, proc, content, pil_images):
    """Reference: one prompt, no padding, the chat written out here, HF greedy decoding with the vision tokens
    suppressed (as the VLM trainer's greedy evaluation)."""
    from mmgrpo.vlm.models.adapters import vision_token_ids

    text = proc.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                    tokenize=False)
    inp = proc(text=[text], images=pil_images, return_tensors="pt")
    tok = proc.tokenizer
    with torch.no_grad():
        out = model.generate(**{k: v for k, v in inp.items() if hasattr(v, "shape")}, do_sample=False,
                             max_new_tokens=MAX_NEW, suppress_tokens=vision_token_ids(tok),
                             eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, inp["input_ids"].shape[1]:], skip_special_tokens=True), text


def test_pointwise_generates_in_batches_equal_to_unbatched_and_counts_failures(tiny, images):
    from PIL import Image

    from flow_grpo.rewards.unified_reward_templates import POINT_IMAGE_FINAL_SCORE

    model, proc = tiny
    r = UnifiedRewardPointwise(model=model, processor=proc, batch_size=2, max_new_tokens=MAX_NEW)
    out = r(images, PROMPTS)
    assert r.judge.generate_calls == 2  # 3 prompts, 2 per generate call
    for i, p in enumerate(PROMPTS):
        q = POINT_IMAGE_FINAL_SCORE.replace("{prompt}", p)
        ref, text = _unbatched_greedy(model, proc, [{"type": "image"}, {"type": "text", "text": q}],
                                      [Image.fromarray(images[i])])
        assert text.endswith("<|vision_start|><|image_pad|><|vision_end|>" + q + "<|im_end|>\n"
                             "<|im_start|>assistant\n")
        assert r.last_texts[i] == ref  # left padding and batching change nothing
    # a random model writes no "Final Score: s": every sample a counted failure, none a crash
    expect = r.scores_from_texts(r.last_texts)
    torch.testing.assert_close(out["unified_reward"], torch.as_tensor(expect["unified_reward"], dtype=torch.float32))
    assert out["valid"].tolist() == [False] * 3 and out["unified_reward"].tolist() == [0.5] * 3
    assert r.stats["judged"] == 6 and r.stats["failed"] == 6  # scores_from_texts above counted 3 more
    first = list(r.last_texts)
    r(images, PROMPTS)  # greedy: deterministic
    assert r.last_texts == first


def test_pairwise_registry_entry_through_the_tiny_model_counts_every_failure(tiny, images):
    model, proc = tiny
    wr = build_reward("unified_reward_think_pairwise", model=model, processor=proc, batch_size=4,
                      max_new_tokens=MAX_NEW)
    out = wr(images, [PROMPTS[0]] * 3, [{"group_id": 0}] * 3)
    # symmetric: 3 pairs x 2 orders = 6 judgements in 2 generate calls; all failed -> ties -> win rate 0.5
    assert wr.scorer.judge.generate_calls == 2
    assert out["unified_reward_think_win_rate"].tolist() == [0.5] * 3
    assert out["unified_reward_think_win_rate/judge_failures"].tolist() == [4.0] * 3  # 2 pairs x 2 orders each
    assert wr.scorer.stats["judged"] == 6 and wr.scorer.stats["failed"] == 6


def _scripted(scorer):
    """Replace the model's batch generation by a script writing the released Think format: the brighter image
    wins; a pair of two dark images (both below 60) gets an unreadable answer naming both."""

    def generate_batch(conversations, images):
        texts = []
        for ims in images:
            m1, m2 = (float(np.asarray(im).mean()) for im in ims)
            s1, s2 = (int(1 + 9 * m / 255) for m in (m1, m2))
            think = (f"<think>\n1. Semantic consistency: Image 1 ({s1}/10) - ...; Image 2 ({s2}/10) - ...\n"
                     f"Total score:\nImage 1: {s1}={s1}\nImage 2: {s2}={s2}\n</think>\n")
            if max(m1, m2) < 60:
                texts.append(think + "<answer>Image 1 is better, no, Image 2 is better</answer>")
            else:
                texts.append(think + f"<answer>Image {1 if m1 > m2 else 2} is better</answer>")
        return texts, [False] * len(texts)

    scorer.judge.generate_batch = generate_batch


def _flat_images(levels):
    return np.stack([np.full((32, 32, 3), v, dtype=np.uint8) for v in levels])


def test_win_rate_from_released_verdicts_by_hand(tiny):
    model, proc = tiny
    wr = build_reward("unified_reward_think_pairwise", model=model, processor=proc, symmetric=False)
    _scripted(wr.scorer)
    imgs = _flat_images([200, 50, 40, 120])  # one group of 4
    out = wr(imgs, ["p"] * 4, [{"group_id": 7}] * 4)
    # pairs (i<j, a=i): 0>1, 0>2, 0>3, (1,2) unreadable -> tie, 3>1, 3>2
    # wins: 0: 3/3; 1: 0.5/3; 2: 0.5/3; 3: 2/3
    np.testing.assert_allclose(out["unified_reward_think_win_rate"].numpy(), [1.0, 0.5 / 3, 0.5 / 3, 2 / 3],
                               rtol=1e-6)
    assert out["unified_reward_think_win_rate/judge_failures"].tolist() == [0, 1, 1, 0]


def test_trainer_reward_stack_builds_the_think_scorer_from_config(tmp_path, tiny, images):
    """reward.mode=win_rate with reward.pairwise_scorer naming the Think scorer and its folder in kwargs."""
    from flow_grpo.config import RewardConfig
    from flow_grpo.scoring import RewardStack

    model, proc = tiny
    d = str(tmp_path / "judge")
    model.save_pretrained(d)
    proc.save_pretrained(d)
    rc = RewardConfig(weights={"brightness": 1.0}, mode="win_rate", pairwise_symmetric=True,
                      pairwise_scorer="flow_grpo.rewards.unified_reward:UnifiedRewardThinkPairwise",
                      kwargs={"win_rate": {"path": d, "batch_size": 3, "max_new_tokens": 4}})
    stack = RewardStack(rc)
    assert isinstance(stack.pairwise.fn.scorer, UnifiedRewardThinkPairwise)
    out = stack.pairwise(images, PROMPTS, [{}] * 3, group_ids=[0, 0, 0])
    assert np.asarray(out["win_rate"]).tolist() == [0.5] * 3
    assert np.asarray(out["win_rate/judge_failures"]).tolist() == [4.0] * 3


def _serve(reward):
    from flow_grpo.rewards.server import make_server

    srv = make_server(reward, host="127.0.0.1", port=0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def test_think_win_rate_and_pointwise_behind_the_reward_server(tiny, images):
    """One request carries the batch (groups in the metadata); the server's judge generates in batches of
    ``batch_size``; the scores and the failure counts come back equal to the in-process reward's."""
    from flow_grpo.rewards.remote import RemoteReward

    model, proc = tiny
    wr = build_reward("unified_reward_think_pairwise", model=model, processor=proc, symmetric=True, batch_size=3)
    _scripted(wr.scorer)
    imgs = _flat_images([200, 50, 40, 120, 90, 30])
    md = [{"group_id": 0}] * 4 + [{"group_id": 1}] * 2
    ps = ["a"] * 4 + ["b"] * 2
    srv, url = _serve(wr)
    try:
        got = RemoteReward(url, name="unified_reward_think_win_rate", retries=0)(imgs, ps, md)
    finally:
        srv.shutdown()
        srv.server_close()
    # 6 + 1 pairs, both orders: 14 judgements in ceil(7/3) = 3 calls per order
    assert wr.scorer.judge.generate_calls == 6
    local = wr(imgs, ps, md)
    for k in ("unified_reward_think_win_rate", "unified_reward_think_win_rate/judge_failures"):
        torch.testing.assert_close(got[k], local[k])
    np.testing.assert_allclose(got["unified_reward_think_win_rate"].numpy(),
                               [1.0, 0.5 / 3, 0.5 / 3, 2 / 3, 1.0, 0.0], rtol=1e-6)
    assert got["unified_reward_think_win_rate/judge_failures"].tolist() == [0, 2, 2, 0, 0, 0]

    point = UnifiedRewardPointwise(model=model, processor=proc, batch_size=2, max_new_tokens=MAX_NEW,
                                   nan_policy="drop")
    srv, url = _serve(point)
    try:
        got = RemoteReward(url, name="unified_reward", retries=0)(images, PROMPTS)
    finally:
        srv.shutdown()
        srv.server_close()
    assert point.judge.generate_calls == 2
    assert got["valid"].tolist() == [False] * 3 and got["unified_reward/parse_failed"].tolist() == [1.0] * 3
