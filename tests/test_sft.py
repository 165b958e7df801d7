"""mmgrpo.vlm.sft (answer-only cross-entropy SFT) and the demo's tiny-VLM builder (scripts/build_tiny_vlm.py)."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("torchvision")

from mmgrpo.vlm import sft  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PROMPT_KW = dict(mode="no_think", answer_format="seconds")


def _load_builder():
    spec = importlib.util.spec_from_file_location("build_tiny_vlm", REPO / "scripts" / "build_tiny_vlm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _frames(n: int, seed: int, hw=(56, 84), red=None):
    """Grey frames; a red block on frames [red[0], red[1]) so frames differ in time."""
    f = np.full((n, hw[0], hw[1], 3), 70, np.uint8) + np.random.RandomState(seed).randint(0, 8, (n, *hw, 3),
                                                                                           dtype=np.uint8)
    if red is not None:
        f[red[0]:red[1], 10:30, 10:30] = (230, 30, 30)
    return f


# three samples with different prompt lengths (query text) and different video lengths (grid_T)
SAMPLES = [
    (dict(id="a", task="tvg", video="a.mp4", duration=4.0, query="When does the red circle appear?",
          spans=[[1.0, 2.5]]), _frames(8, 0, red=(2, 5))),
    (dict(id="b", task="tvg", video="b.mp4", duration=6.0,
          query="During which part of the video is the blue triangle visible?", spans=[[0.5, 3.25]]),
     _frames(12, 1, red=(1, 7))),
    (dict(id="c", task="tvg", video="c.mp4", duration=2.0, query="When can the cyan square be seen?",
          spans=[[0.0, 1.5]]), _frames(4, 2, red=(0, 3))),
]


def _examples(processor, family="qwen2_5_vl"):
    from mmgrpo.vlm.data import prompts

    vs = sft.VideoSettings(fps=2.0, min_frames=4, max_frames=16, min_pixels=4 * 28 * 28, max_pixels=6 * 28 * 28)
    return [sft.prepare_example(s, processor, model_family=family, video=vs, frames=fr, video_fps=2.0,
                                messages_fn=lambda x: prompts.build_messages(x, **PROMPT_KW),
                                answer_fn=lambda x: prompts.format_ground_truth_answer(x, **PROMPT_KW))
            for s, fr in SAMPLES]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One intra-op thread: on the shared 2-core machine two OpenMP threads per process made these steps 10-20x
    slower whenever other processes were running (spin-waiting threads); restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tiny():
    from mmgrpo.vlm.models.tiny import build_tiny_model

    model, processor = build_tiny_model("qwen2_5_vl", seed=0)
    return model, processor, _examples(processor)


# --------------------------------------------------------------------------------------------------- examples
def test_prompt_is_the_generation_prompt_and_answer_ends_with_im_end(tiny):
    _, processor, exs = tiny
    tok = processor.tokenizer
    for ex, (s, fr) in zip(exs, SAMPLES):
        ids = ex.prompt["input_ids"][0].tolist()
        assert tok.decode(ids).endswith("<|im_end|>\n<|im_start|>assistant\n")
        assert ex.answer_text == f"<answer>{s['spans'][0][0]:.2f} to {s['spans'][0][1]:.2f}</answer>"
        assert ex.answer_ids[-1].item() == tok.convert_tokens_to_ids("<|im_end|>")
        # the video's tokens really are in the prompt, with the Qwen2.5-VL time axis of 2 fps frames
        n_vid = sum(i == tok.convert_tokens_to_ids("<|video_pad|>") for i in ids)
        t, h, w = ex.prompt["video_grid_thw"][0].tolist()
        assert n_vid == t * h * w // 4 and t == len(fr) // 2
        assert ex.prompt["second_per_grid_ts"].tolist() == [1.0]


def test_bad_answer_is_rejected_with_sample_id(tiny):
    _, processor, _ = tiny
    s, fr = SAMPLES[0]
    with pytest.raises(ValueError, match="'a'.*special"):
        sft.prepare_example(s, processor, frames=fr, video_fps=2.0,
                            messages_fn=lambda x: [{"role": "user", "content": [{"type": "video"},
                                                                                {"type": "text", "text": "q"}]}],
                            answer_fn=lambda x: "<answer>1 to 2</answer><|im_end|>")


# ----------------------------------------------------------------------------------------------------- labels
@pytest.mark.parametrize("side", ["left", "right"])
def test_labels_keep_only_the_answer_tokens(tiny, side):
    _, processor, exs = tiny
    tok = processor.tokenizer
    batch, labels = sft.collate_sft(exs, tok.pad_token_id, padding_side=side)
    assert labels.shape == batch["input_ids"].shape
    for b, ex in enumerate(exs):
        keep = labels[b] != sft.IGNORE_INDEX
        assert torch.equal(labels[b][keep], batch["input_ids"][b][keep])
        # decoded independently of the collate code: exactly the answer text and the end-of-turn token
        assert tok.decode(labels[b][keep].tolist()) == ex.answer_text + "<|im_end|>"
        assert int(keep.sum()) == len(ex.answer_ids)
        # unmasked tokens are contiguous and sit right after the (real, attended) prompt
        pos = keep.nonzero().flatten()
        assert pos.tolist() == list(range(pos[0].item(), pos[-1].item() + 1))
        real = batch["attention_mask"][b].bool()
        assert real[pos].all()
        assert tok.decode(batch["input_ids"][b][:pos[0]].tolist()).endswith("<|im_start|>assistant\n")
        # everything else is masked: padding, system/user turns, video placeholders
        assert not keep[~real].any()
        n_prompt = ex.prompt["input_ids"].shape[-1]
        assert int(real.sum()) == n_prompt + len(ex.answer_ids)
    pads = (batch["attention_mask"] == 0)
    if side == "left":  # prompts end in one column, so every answer starts in the same column
        starts = [(labels[b] != sft.IGNORE_INDEX).nonzero()[0].item() for b in range(len(exs))]
        assert len(set(starts)) == 1
        assert pads[:, 0].any()
    else:
        assert not pads[:, 0].any()


# ------------------------------------------------------------------------------------------------------- loss
def _manual_nll(model, ex):
    """Answer NLL of one example computed by hand: unpadded sequence, log_softmax, gather."""
    full = dict(ex.prompt)
    full["input_ids"] = torch.cat([ex.prompt["input_ids"], ex.answer_ids[None]], 1)
    full["attention_mask"] = torch.ones_like(full["input_ids"])
    full["mm_token_type_ids"] = torch.cat([ex.prompt["mm_token_type_ids"],
                                           torch.zeros_like(ex.answer_ids)[None]], 1)
    with torch.no_grad():
        logits = model(**full).logits[0].float()
    P, T = ex.prompt["input_ids"].shape[-1], len(ex.answer_ids)
    lp = torch.log_softmax(logits[P - 1:P - 1 + T], -1)
    return -lp[torch.arange(T), ex.answer_ids].mean().item()


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_does_not_change_any_rows_loss(tiny, side):
    model, processor, exs = tiny
    model.eval()
    batch, labels = sft.collate_sft(exs, processor.tokenizer.pad_token_id, padding_side=side)
    with torch.no_grad():
        per = sft.per_example_loss(model, batch, labels)
    ref = torch.tensor([_manual_nll(model, ex) for ex in exs])
    assert torch.allclose(per, ref, atol=2e-5), (per, ref)
    with torch.no_grad():
        loss, n = sft.sft_loss(model, batch, labels)
    lens = torch.tensor([len(e.answer_ids) for e in exs], dtype=torch.float)
    assert n == int(lens.sum())
    assert math.isclose(loss.item(), float((ref * lens).sum() / lens.sum()), rel_tol=1e-5)


def test_left_layout_matches_the_grpo_log_prob_function(tiny):
    """The SFT loss equals minus the token-mean of mmgrpo.vlm.models.rollout.compute_token_logprobs (same layout)."""
    from mmgrpo.vlm.models.rollout import collate_prompts, compute_token_logprobs

    model, processor, exs = tiny
    pad = processor.tokenizer.pad_token_id
    T = max(len(e.answer_ids) for e in exs)
    comp = torch.full((len(exs), T), pad, dtype=torch.long)
    mask = torch.zeros((len(exs), T), dtype=torch.long)
    for i, e in enumerate(exs):
        comp[i, :len(e.answer_ids)] = e.answer_ids
        mask[i, :len(e.answer_ids)] = 1
    with torch.no_grad():
        lp = compute_token_logprobs(model, collate_prompts([e.prompt for e in exs], pad), comp, mask)
        batch, labels = sft.collate_sft(exs, pad, padding_side="left")
        loss, _ = sft.sft_loss(model, batch, labels)
    assert math.isclose(loss.item(), float(-(lp * mask).sum() / mask.sum()), rel_tol=1e-5, abs_tol=1e-6)


def test_loss_decreases_when_training(tiny):
    from mmgrpo.vlm.models.tiny import build_tiny_model

    model, processor = build_tiny_model("qwen2_5_vl", seed=1)
    exs = tiny[2]
    pad = processor.tokenizer.pad_token_id
    batch, labels = sft.collate_sft(exs, pad)
    with torch.no_grad():
        before = sft.sft_loss(model, batch, labels)[0].item()
    cfg = sft.SFTConfig(steps=12, batch_size=3, lr=3e-3, warmup_steps=0, seed=0)
    res = sft.train_sft(model, exs, cfg, pad)
    with torch.no_grad():
        after = sft.sft_loss(model, batch, labels)[0].item()
    assert res["steps_done"] == 12 and res["stopped_by"] == "steps"
    assert before > math.log(len(processor.tokenizer)) - 1.0  # random init: near uniform
    assert after < 0.7 * before, (before, after)
    losses = [h["loss"] for h in res["history"]]
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    assert not model.training


def test_vision_frozen_when_asked(tiny):
    from mmgrpo.vlm.models.tiny import build_tiny_model

    model, processor = build_tiny_model("qwen2_5_vl", seed=2)
    vis0 = {n: p.detach().clone() for n, p in model.named_parameters() if "visual" in n.split(".")}
    lm0 = model.lm_head.weight.detach().clone()
    sft.train_sft(model, tiny[2], sft.SFTConfig(steps=2, batch_size=3, lr=1e-2, warmup_steps=0, train_vision=False),
                  processor.tokenizer.pad_token_id)
    assert vis0 and all(torch.equal(p, vis0[n]) for n, p in model.named_parameters() if n in vis0)
    assert not torch.equal(model.lm_head.weight, lm0)


def test_max_seconds_guard_stops_early(tiny):
    model, processor, exs = tiny
    res = sft.train_sft(model, exs, sft.SFTConfig(steps=50, batch_size=3, lr=0.0, max_seconds=1e-9),
                        processor.tokenizer.pad_token_id)
    assert res["stopped_by"] == "max_seconds" and res["steps_done"] < 50


# ------------------------------------------------------------------------------------------- schedule / order
def test_lr_schedule_by_hand():
    cfg = sft.SFTConfig(steps=110, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert sft.lr_at(0, cfg) == pytest.approx(0.1)
    assert sft.lr_at(9, cfg) == pytest.approx(1.0)
    assert sft.lr_at(10, cfg) == pytest.approx(1.0)
    assert sft.lr_at(60, cfg) == pytest.approx(0.1 + 0.9 * 0.5)  # half way: cos(pi/2) = 0
    assert sft.lr_at(110, cfg) == pytest.approx(0.1)


def test_batch_order_is_epochs_of_permutations():
    order = sft.batch_order(n=5, steps=4, batch_size=3, seed=7)
    flat = [i for b in order for i in b]
    assert len(flat) == 12 and all(len(b) == 3 for b in order)
    assert sorted(flat[:5]) == list(range(5)) and sorted(flat[5:10]) == list(range(5))
    assert order == sft.batch_order(n=5, steps=4, batch_size=3, seed=7)
    assert order != sft.batch_order(n=5, steps=4, batch_size=3, seed=8)


# ------------------------------------------------------------------------------------------------- scoring
def test_score_tvg_outputs_by_hand():
    s = dict(id="x", task="tvg", video="x.mp4", duration=10.0, query="q", spans=[[2.0, 6.0]])
    out = sft.score_tvg_outputs(["<answer>4.00 to 8.00</answer>", "<answer>2.00 to 6.00</answer>", "no idea"],
                                [s, s, s])
    assert out["ious"] == pytest.approx([2 / 6, 1.0, 0.0])
    assert out["mIoU"] == pytest.approx(100 * (2 / 6 + 1) / 3)
    assert out["parse_rate"] == pytest.approx(200 / 3)
    assert out["R1@0.3"] == pytest.approx(200 / 3) and out["R1@0.5"] == pytest.approx(100 / 3)


def test_query_swap_probe_by_hand():
    mk = lambda i, v, sp: dict(id=i, task="tvg", video=v, duration=10.0, query="q", spans=[sp])  # noqa: E731
    samples = [mk("a", "v1", [0.0, 2.0]), mk("b", "v1", [4.0, 8.0]), mk("c", "v2", [1.0, 3.0])]
    texts = ["<answer>0.00 to 2.00</answer>", "<answer>4.00 to 6.00</answer>", "<answer>1.00 to 3.00</answer>"]
    out = sft.query_swap_probe(texts, samples)
    # v2 has one query: not compared.  own: a 1.0, b 2/4; other: a vs [4, 8] 0, b vs [0, 2] 0
    assert out["n"] == 2
    assert out["own_mIoU"] == pytest.approx(100 * (1.0 + 0.5) / 2)
    assert out["other_mIoU"] == pytest.approx(0.0)
    assert sft.query_swap_probe(texts[2:], samples[2:])["n"] == 0


def test_queries_of_one_video_share_one_pixel_tensor(tiny, tmp_path):
    """prepare_examples keeps one copy of a video's pixels for all its queries (SFT memory on 3 queries per video),
    and the shared tensor equals what each query's own processor call gives."""
    from mmgrpo.video.writer import write_video

    _, processor, _ = tiny
    write_video(str(tmp_path / "v.mp4"), list(_frames(8, 0, red=(2, 5))), 2.0, crf=10)
    write_video(str(tmp_path / "w.mp4"), list(_frames(8, 3, red=(4, 7))), 2.0, crf=10)
    mk = lambda i, v, q: dict(id=i, task="tvg", video=str(tmp_path / v), duration=4.0, query=q,  # noqa: E731
                              spans=[[1.0, 2.5]])
    samples = [mk("a", "v.mp4", "When does the red circle appear?"), mk("b", "v.mp4", "When is the blue square seen?"),
               mk("c", "w.mp4", "When does the red circle appear?")]
    vs = sft.VideoSettings(fps=2.0, min_frames=4, max_frames=16, min_pixels=4 * 28 * 28, max_pixels=6 * 28 * 28)
    shared = sft.prepare_examples(samples, processor, video=vs, **PROMPT_KW)
    alone = [sft.prepare_example(x, processor, video=vs, **PROMPT_KW) for x in samples]
    px = [e.prompt["pixel_values_videos"] for e in shared]
    assert px[0] is px[1] and px[0] is not px[2]
    for e, f in zip(shared, alone):
        assert torch.equal(e.prompt["pixel_values_videos"], f.prompt["pixel_values_videos"])
        assert torch.equal(e.prompt["input_ids"], f.prompt["input_ids"])


def test_event_probe_by_hand():
    mk = lambda i, v, sp: dict(id=i, task="tvg", video=v, duration=12.0, query="q", spans=[sp])  # noqa: E731
    # v1: events [1, 3], [5, 7], [9, 10]; v2: events [2, 4], [6, 8]
    samples = [mk("a", "v1", [1.0, 3.0]), mk("b", "v1", [5.0, 7.0]), mk("c", "v1", [9.0, 10.0]),
               mk("d", "v2", [2.0, 4.0]), mk("e", "v2", [6.0, 8.0])]
    texts = ["<answer>2.00 to 4.00</answer>",    # a: lands on [1, 3] (IoU 1/3), its own: hit, offsets +1 / +1
             "<answer>1.50 to 3.00</answer>",    # b: lands on [1, 3] (the earliest event), not its own
             "no answer",                        # c: unparsed
             "<answer>2.00 to 4.50</answer>",    # d: hit, IoU 2 / 2.5, offsets 0 / +0.5
             "<answer>10.00 to 11.00</answer>"]  # e: overlaps no event: lands nowhere
    out = sft.event_probe(texts, samples)
    assert out["n"] == 5
    assert out["hit"] == pytest.approx(100 * 2 / 5) and out["landed"] == pytest.approx(100 * 3 / 5)
    assert out["first"] == pytest.approx(100 * 3 / 5)  # a, b (v1's [1, 3]) and d (v2's [2, 4])
    assert out["chance"] == pytest.approx(100 * (3 * (1 / 3) + 2 * (1 / 2)) / 5)
    assert out["start_offset"] == pytest.approx((1.0 + 0.0) / 2) and out["end_offset"] == pytest.approx(0.75)
    assert out["hit_mIoU"] == pytest.approx(100 * (1 / 3 + 0.8) / 2)
    assert out["width"] == pytest.approx((2.0 + 1.5 + 2.5 + 1.0) / 4)
    # by the queried event's place: a and d ask about their video's earliest event (both hit); b, c, e about later
    # ones (no hit; b lands on the earliest event, c is unparsed, e lands nowhere)
    assert out["hit_earliest"] == 100.0 and out["hit_later"] == 0.0
    assert out["later_on_earliest"] == pytest.approx(100 / 3)
    none = sft.event_probe(["x"], samples[:1])
    assert none["hit"] == 0.0 and none["start_offset"] is None and none["width"] is None
    assert none["hit_earliest"] == 0.0 and none["hit_later"] is None and none["later_on_earliest"] is None
    with pytest.raises(ValueError):
        sft.event_probe(texts[:2], samples)


def test_ground_truth_answers_score_100(tiny):
    _, _, exs = tiny
    out = sft.score_tvg_outputs([e.answer_text for e in exs], [e.sample for e in exs])
    assert out["mIoU"] == pytest.approx(100.0) and out["parse_rate"] == 100.0


# --------------------------------------------------------------------------------- the demo model builder
@pytest.fixture(scope="module")
def builder():
    return _load_builder()


def test_tokenizer_makes_answers_cheap(builder):
    from mmgrpo.vlm.data import prompts

    corpus = [prompts.build_messages(s, **PROMPT_KW)[1]["content"][1]["text"] for s, _ in SAMPLES] * 20
    tok = builder.build_tokenizer(corpus, vocab_size=300)
    ids = tok("<answer>3.50 to 17.05</answer>", add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["<answer>", "3", ".50", "Ġto", "Ġ", "17", ".05", "</answer>"]
    for a, b in [(0.0, 1.5), (9.99, 12.34), (45.6, 99.01)]:
        text = f"<answer>{a:.2f} to {b:.2f}</answer>"
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert len(ids) == 8 and tok.decode(ids, skip_special_tokens=True) == text
    # special tokens keep Qwen's ids; the number tokens are not special (kept when decoding completions)
    assert tok.convert_tokens_to_ids("<|im_end|>") == 2 and tok.eos_token == "<|im_end|>"
    assert "<answer>" not in tok.all_special_tokens


def test_built_model_saves_and_reloads_identically(builder, tmp_path, roundtrip):
    from transformers import AutoProcessor

    from mmgrpo.vlm.data import prompts
    from mmgrpo.vlm.models.adapters import load_policy

    corpus = [prompts.build_messages(s, **PROMPT_KW)[1]["content"][1]["text"] for s, _ in SAMPLES] * 20
    tok = builder.build_tokenizer(corpus, vocab_size=300)
    processor = builder.build_processor(tok, 4 * 28 * 28, 6 * 28 * 28)
    model = builder.build_model(tok, seed=0, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128,
                                vision_hidden=32, vision_depth=2)
    exs = _examples(processor)
    sft.train_sft(model, exs, sft.SFTConfig(steps=2, batch_size=3, lr=1e-2, warmup_steps=0),
                  tok.pad_token_id)  # weights no longer at their init
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()

    proc2 = AutoProcessor.from_pretrained(tmp_path)
    exs2 = _examples(proc2)
    for a, b in zip(exs, exs2):
        assert a.prompt_text == b.prompt_text
        for k in a.prompt:
            assert torch.equal(a.prompt[k], b.prompt[k]), k
        assert torch.equal(a.answer_ids, b.answer_ids)
    policy = load_policy(tmp_path, dtype="float32")  # the trainer's loading path (from_pretrained inside)
    assert policy.family == "qwen2_5_vl"
    policy.model.eval()
    model.eval()
    batch, _ = sft.collate_sft(exs, tok.pad_token_id)
    roundtrip.same_weights(policy.model, model)  # stored values: bit for bit
    with torch.no_grad():  # computed from another memory layout: to a tolerance (conftest.RoundTrip)
        roundtrip.close(policy.model(**batch).logits, model(**batch).logits, atol=roundtrip.LOGITS_ATOL)
    from mmgrpo.vlm.models.tiny import vision_token_ids

    gc = policy.model.generation_config
    assert set(vision_token_ids(tok)) <= set(gc.suppress_tokens or [])
    assert gc.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")


SHIPPED = REPO / "data" / "checkpoints" / "tiny_vlm"  # where scripts/demo.py looks for it


@pytest.mark.skipif(not (SHIPPED / "config.json").exists(), reason="no shipped demo checkpoint")
def test_shipped_checkpoint_is_current_and_loads(builder):
    """The shipped demo VLM was built from today's prompt templates and synthetic generator, and loads like any
    Qwen2.5-VL checkpoint.  If this fails after a change to mmgrpo/vlm/data/prompts.py or synthetic_tvg.py, rebuild:
    python scripts/build_tiny_vlm.py --out runs/tiny_vlm --seconds 240 --seed 0 --ship data/checkpoints/tiny_vlm"""
    import json

    from mmgrpo.vlm.models.adapters import load_policy

    report = json.loads((SHIPPED / "sft_report.json").read_text())
    assert report["fingerprint"] == builder.fingerprint(), (
        "the shipped checkpoint is stale (prompt templates or synthetic generator changed); rebuild with: "
        "python scripts/build_tiny_vlm.py --out runs/tiny_vlm --seconds 240 --seed 0 --ship data/checkpoints/tiny_vlm")
    assert report["sft"]["stopped_by"] == "steps" and report["reload_max_abs_logit_diff"] == 0.0
    assert report["eval_heldout"]["parse_rate"] >= 90.0
    policy = load_policy(SHIPPED, dtype="float32")
    assert policy.family == "qwen2_5_vl"
    tok = policy.tokenizer
    assert len(tok("<answer>12.54 to 17.83</answer>", add_special_tokens=False)["input_ids"]) == 8
    exs = _examples(policy.processor)
    batch, labels = sft.collate_sft(exs, tok.pad_token_id)
    policy.model.eval()
    with torch.no_grad():
        loss, _ = sft.sft_loss(policy.model, batch, labels)
    assert math.isfinite(loss.item()) and loss.item() < math.log(len(tok))  # trained: far below uniform


@pytest.mark.parametrize("side", ["left", "right"])
def test_chunked_head_same_loss_and_gradients(tiny, side):
    """SFTConfig.logprob_chunk_size: the head on answer positions only, a few at a time == full logits."""
    model, processor, exs = tiny
    batch, labels = sft.collate_sft(exs, processor.tokenizer.pad_token_id, padding_side=side)
    out = {}
    for chunk in (0, 3):
        model.zero_grad(set_to_none=True)
        loss, n = sft.sft_loss(model, batch, labels, chunk_size=chunk)
        loss.backward()
        out[chunk] = (loss.detach(), n, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
    (la, na, ga), (lb, nb, gb) = out[0], out[3]
    assert na == nb and abs(float(la - lb)) <= 1e-6 * max(1.0, abs(float(la)))
    assert set(ga) == set(gb) and ga
    for k in ga:
        assert float((ga[k] - gb[k]).abs().max()) <= 1e-5 * max(float(ga[k].abs().max()), 1e-12), k
    model.zero_grad(set_to_none=True)


# --------------------------------------------------------------------------------------- vision tagging stage
def test_block_tags_by_hand():
    from mmgrpo.vlm.synthetic.grounding import TAG_CLASSES, block_tags

    rows = [{"meta": {"colour": "red", "shape": "circle", "frames": [3, 7]}},
            {"meta": {"colour": "blue", "shape": "square", "frames": [10, 10]}}]
    # 8 sampled frames -> 4 blocks of 2: (0, 2) (4, 6) (8, 10) (12, 14)
    tags = block_tags(rows, [0, 2, 4, 6, 8, 10, 12, 14])
    red, blue = TAG_CLASSES.index("red circle"), TAG_CLASSES.index("blue square")
    assert len(tags) == 4 and all(len(t) == len(TAG_CLASSES) == 18 for t in tags)
    on = [{i for i, v in enumerate(t) if v} for t in tags]
    # red visible on frames 3..7: sampled frames 4 and 6 (block 1) only; frame 2 < 3 so block 0 is empty
    assert on == [set(), {red}, {blue}, set()]


def test_pretrain_vision_tags_learns_and_touches_only_the_vision_tower(tiny):
    model, _, exs = tiny
    model = __import__("copy").deepcopy(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    # label: block shows the red block (frames of SAMPLES' red ranges), one class; a second class never present
    items = []
    for (s, fr), e in zip(SAMPLES, exs):
        t = int(e.prompt["video_grid_thw"][0, 0])
        red = (fr[:, 10:30, 10:30] == (230, 30, 30)).all(-1).any((1, 2))
        items.append((e.prompt, [[float(red[2 * i] or red[2 * i + 1]), 0.0] for i in range(t)]))
    res = sft.pretrain_vision_tags(model, items, 2, steps=30, batch_size=3, lr=1e-2, seed=0)
    losses = [h["loss"] for h in res["history"]]
    assert res["steps_done"] == 30 and res["stopped_by"] == "steps"
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    assert res["history"][-1]["recall"] == 1.0 and res["history"][-1]["false_pos"] < 0.2
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".visual." in f".{n}." for n in changed)


GROUNDING = REPO / "data" / "checkpoints" / "tiny_vlm_grounding"  # the base that reads the query (issue #16)


@pytest.mark.skipif(not (GROUNDING / "config.json").exists(), reason="no shipped grounding base")
def test_shipped_grounding_base_is_current_grounds_and_lags(builder):
    """The demo's grounding base (benchmark version 2) was built from today's generator and templates by the five
    stages of scripts/build_grounding_base.py: a vision tagging stage and a frozen tower (stage 1); a clean base whose
    own report shows the query deciding the answer on validation (stage 4: own-query mIoU at least 10 above another
    query's span of the same video, and 15 above the video-blind span); then answers 1 s late (stage 5), which
    costs mIoU but keeps some grounding (own > other). Rebuild: docs/demo_models.md, "Round 4"."""
    import json

    from mmgrpo.vlm.models.adapters import load_policy

    report = json.loads((GROUNDING / "sft_report.json").read_text())
    stages = [json.loads((GROUNDING / f"sft_report_stage{k}_{n}.json").read_text())
              for k, n in enumerate(("W1", "W1b", "S1", "S2"), start=1)]
    assert report["fingerprint"] == builder.fingerprint("grounding"), "stale grounding base: rebuild it"
    assert stages[0]["args"]["vision_pretrain_steps"] > 0
    assert all(r["args"]["freeze_vision"] and r["args"]["eval_split"] == "val" for r in stages + [report])
    assert all(r["args"]["init"] for r in stages[1:]) and report["args"]["init"] == stages[3]["args"]["out"]
    assert [r["args"]["label_shift"] for r in stages[2:]] == [0.0, 0.0] and report["args"]["label_shift"] == 1.0
    assert report["prompt"]["query_position"] == "before" and report["reload_max_abs_logit_diff"] == 0.0
    clean, lag = stages[3]["eval_heldout"], report["eval_heldout"]
    blind = report["video_blind_baselines"]["duration_relative_span"]["mIoU"]
    assert clean["query_swap"]["own_mIoU"] - clean["query_swap"]["other_mIoU"] >= 10.0 and clean["mIoU"] >= blind + 15
    assert clean["mIoU"] - lag["mIoU"] >= 10.0  # the designed weakness is large
    assert lag["query_swap"]["own_mIoU"] > lag["query_swap"]["other_mIoU"]  # and the lagged base still grounds a little
    policy = load_policy(GROUNDING, dtype="float32")
    assert policy.family == "qwen2_5_vl" and policy.model.config.vision_config.hidden_size == 32
