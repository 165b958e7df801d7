"""VLM judge on a tiny random Qwen2.5-VL (mmgrpo.vlm.models.tiny), in memory and loaded from its saved folder.

References are computed one sample at a time straight from the processor and the model (no batching, no padding,
the chat written out here), so batching / left padding / the answer-token read-out are all checked."""
import numpy as np
import pytest
import torch

from flow_grpo.rewards import build_reward
from flow_grpo.rewards.vlm_judge import VLMJudgeReward, VLMPairwiseJudge

torch.set_num_threads(1)
PROMPTS = ["a red cube", "two cats on a table", "a door"]


@pytest.fixture(scope="module")
def tiny():
    from mmgrpo.vlm.models.tiny import build_tiny_model

    model, proc = build_tiny_model("qwen2_5_vl", seed=0)
    with torch.no_grad():  # sharpen the random next-token distribution so samples' scores differ clearly
        model.lm_head.weight.mul_(40.0)
    return model, proc


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(0).integers(0, 256, (3, 56, 56, 3), dtype=np.uint8)


def _next_token_probs(model, processor, content, pil_images):
    """Unbatched: chat template -> processor -> model, softmax of the last position."""
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                         tokenize=False)
    inp = processor(text=[text], images=pil_images, return_tensors="pt")
    with torch.no_grad():
        logits = model(**{k: v for k, v in inp.items() if hasattr(v, "shape")}).logits[0, -1]
    return torch.softmax(logits.float(), -1), text


def _first_id(tok, s):
    return tok.encode(s, add_special_tokens=False)[0]


def test_pointwise_yes_no_equals_unbatched_answer_probability(tiny, images):
    from PIL import Image

    model, proc = tiny
    r = VLMJudgeReward(model=model, processor=proc, batch_size=2)
    out = r(images, PROMPTS)
    assert out["vlm_judge"].shape == (3,) and out["vlm_judge/answer_mass"].shape == (3,)
    yes, no = _first_id(proc.tokenizer, "Yes"), _first_id(proc.tokenizer, "No")
    for i, p in enumerate(PROMPTS):
        q = "Prompt: " + p + "\nDoes this image match the prompt and is it of high quality? Answer Yes or No."
        probs, text = _next_token_probs(model, proc, [{"type": "image"}, {"type": "text", "text": q}],
                                        [Image.fromarray(images[i])])
        assert text.endswith("<|vision_start|><|image_pad|><|vision_end|>" + q + "<|im_end|>\n"
                             "<|im_start|>assistant\n")
        torch.testing.assert_close(out["vlm_judge"][i], probs[yes] / (probs[yes] + probs[no]), atol=2e-5, rtol=0)
        torch.testing.assert_close(out["vlm_judge/answer_mass"][i], probs[yes] + probs[no], atol=0, rtol=1e-3)


def test_pointwise_scale_is_rescaled_expected_rating(tiny, images):
    from PIL import Image

    model, proc = tiny
    r = VLMJudgeReward(model=model, processor=proc, mode="scale", scale_max=5, batch_size=3)
    got = r(images[:2], PROMPTS[:2])["vlm_judge"]
    ids = [_first_id(proc.tokenizer, str(k)) for k in range(1, 6)]
    for i in range(2):
        q = ("Prompt: " + PROMPTS[i] + "\nRate how well this image matches the prompt and its overall quality on a "
             "scale from 1 to 5. Answer with a single digit.")
        probs, _ = _next_token_probs(model, proc, [{"type": "image"}, {"type": "text", "text": q}],
                                     [Image.fromarray(images[i])])
        p = probs[ids] / probs[ids].sum()
        torch.testing.assert_close(got[i], ((p * torch.arange(1, 6)).sum() - 1) / 4, atol=2e-5, rtol=0)
    assert ((got >= 0) & (got <= 1)).all()


def test_pairwise_judge_and_win_rate(tiny, images):
    from PIL import Image

    model, proc = tiny
    judge = VLMPairwiseJudge(model=model, processor=proc, batch_size=2)
    c = judge(images[:2], images[1:], PROMPTS[:2])
    one, two = _first_id(proc.tokenizer, "1"), _first_id(proc.tokenizer, "2")
    for k in range(2):
        q = ("\nPrompt: " + PROMPTS[k]
             + "\nWhich image matches the prompt better and is of higher quality? Answer 1 or 2.")
        content = [{"type": "text", "text": "Image 1: "}, {"type": "image"}, {"type": "text", "text": "\nImage 2: "},
                   {"type": "image"}, {"type": "text", "text": q}]
        probs, _ = _next_token_probs(model, proc, content, [Image.fromarray(images[k]), Image.fromarray(images[k + 1])])
        torch.testing.assert_close(c[k], probs[one] / (probs[one] + probs[two]), atol=2e-5, rtol=0)
    # Pref-GRPO win rate over one group of 3 (symmetric): hard wins per pair sum to 1, so the rates sum to G/2
    rw = build_reward("vlm_judge_pairwise", model=model, processor=proc, batch_size=4)
    wr = rw(images, [PROMPTS[0]] * 3, [{"group_id": 0}] * 3)["vlm_pref_win_rate"]
    assert wr.shape == (3,) and abs(float(wr.sum()) - 1.5) < 1e-6


def test_judge_loads_saved_folder_and_names_missing_files(tmp_path, tiny, images):
    model, proc = tiny
    d = str(tmp_path / "judge")
    model.save_pretrained(d)
    proc.save_pretrained(d)
    from_disk = build_reward("vlm_judge", path=d, batch_size=3)(images, PROMPTS)["vlm_judge"]
    in_mem = VLMJudgeReward(model=model, processor=proc, batch_size=3)(images, PROMPTS)["vlm_judge"]
    torch.testing.assert_close(from_disk, in_mem, atol=1e-5, rtol=1e-5)
    with pytest.raises(FileNotFoundError, match="VLM judge folder not found"):
        build_reward("vlm_judge", path=str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        build_reward("vlm_judge", path=str(tmp_path / "empty"))


def test_pairwise_judge_behind_the_reward_server_matches_in_process(tiny, images):
    """The whole batch (with its metadata group ids) crosses the wire in one request; PNG keeps pixels exact."""
    import threading

    from flow_grpo.rewards.remote import RemoteReward
    from flow_grpo.rewards.server import make_server

    model, proc = tiny
    local = build_reward("vlm_judge_pairwise", model=model, processor=proc, batch_size=4)
    md = [{"group_id": g} for g in (0, 0, 1, 1)]
    imgs = np.concatenate([images, images[:1]])
    ps = ["a red cube"] * 2 + ["a door"] * 2
    srv = make_server(local, host="127.0.0.1", port=0)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        remote = RemoteReward(url, image_format="png", name="vlm_pref_win_rate", retries=0)
        got = remote(imgs, ps, md)["vlm_pref_win_rate"]
    finally:
        srv.shutdown()
        srv.server_close()
    torch.testing.assert_close(got, local(imgs, ps, md)["vlm_pref_win_rate"])
    assert sorted(got.tolist()[:2]) == [0.0, 1.0] and sorted(got.tolist()[2:]) == [0.0, 1.0]
