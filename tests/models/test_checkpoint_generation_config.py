"""A checkpoint's generation_config.json must not reshape the sampled tokens (issue #23 item 10).

The released Qwen2.5-VL Instruct checkpoints ship ``repetition_penalty 1.05, temperature 0.1, top_p 0.001,
top_k 1, do_sample true``; ``model.generate`` merges every field our config leaves None from it.  The loss scores
the plain temperature-scaled policy, so the rollout must sample exactly that policy.  The checks replay the
sampler independently from the trainer's scored logits (``compute_token_logprobs``), they do not compare the
backend with itself.
"""
import json
import os
import shutil
import warnings

import pytest
import torch

from mmgrpo.vlm.models.adapters import load_policy
from mmgrpo.vlm.models.inputs import build_prompt_item
from mmgrpo.vlm.models.rollout import (HFRolloutBackend, SamplingParams, _generation_modules, collate_prompts,
                                   compute_token_logprobs, explicit_decoding)
from mmgrpo.vlm.models.tiny import synthetic_frames, synthetic_image

# Qwen2.5-VL-{3B,7B}-Instruct generation_config.json (decoding fields; ids are the tiny tokenizer's)
RELEASED = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.1, "top_p": 0.001, "top_k": 1}


@pytest.fixture(scope="module")
def released_policy(tiny_dirs, tmp_path_factory):
    src = tiny_dirs("qwen2_5_vl")
    dst = tmp_path_factory.mktemp("released_gc") / "m"
    shutil.copytree(src, dst)
    p = os.path.join(dst, "generation_config.json")
    with open(p) as f:
        gc = json.load(f)
    gc.update(RELEASED)
    with open(p, "w") as f:
        json.dump(gc, f)
    pol = load_policy(dst)
    assert pol.model.generation_config.repetition_penalty == 1.05  # the checkpoint field is really loaded
    return pol


def _items(pol):
    def m(kind, q):
        return [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": q}]}]

    return [
        build_prompt_item(pol.processor, pol.adapter, m("image", "12.54 to 17.83 what? 12.54 to 17.83"),
                          images=[synthetic_image(0, 84, 112)]),
        build_prompt_item(pol.processor, pol.adapter, m("video", "when does the person open the door?"),
                          video=synthetic_frames(1, 6), sample_fps=2.0),
    ]


def _scored_logits(pol, items, out, temperature):
    batch = collate_prompts([items[i] for i in out.prompt_index.tolist()], pol.tokenizer.pad_token_id)
    with torch.no_grad():
        _, logits = compute_token_logprobs(pol.model, batch, out.completion_ids, out.completion_mask, temperature,
                                           pol.suppress_token_ids, return_logits=True)
    return logits


def test_sampled_tokens_follow_the_scored_policy(released_policy):
    """Replay ``_PerRowSampler``'s draws (same seeds) from the trainer's scored distribution: every token of every
    row must be reproduced.  With the checkpoint's repetition penalty merged in, rows diverge."""
    pol = released_policy
    items = _items(pol)
    params = SamplingParams(max_new_tokens=24, temperature=0.1)  # sharp: the penalty would move draws
    seeds = list(range(10, 18))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = HFRolloutBackend(pol.model, pol.processor, pol.suppress_token_ids).generate(items, 4, params, seeds)
    logits = _scored_logits(pol, items, out, params.temperature)
    for r, seed in enumerate(seeds):
        g = torch.Generator().manual_seed(seed)
        L = int(out.completion_mask[r].sum())
        for t in range(L):
            draw = torch.multinomial(torch.softmax(logits[r, t].double(), -1).float(), 1, generator=g)
            assert int(draw) == int(out.completion_ids[r, t]), f"row {r} token {t}"


def test_greedy_is_argmax_of_the_scored_policy(released_policy):
    pol = released_policy
    items = _items(pol)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = HFRolloutBackend(pol.model, pol.processor, pol.suppress_token_ids).generate(
            items, 1, SamplingParams(max_new_tokens=24, greedy=True))
    logits = _scored_logits(pol, items, out, 1.0)
    for r in range(out.completion_ids.shape[0]):
        L = int(out.completion_mask[r].sum())
        assert torch.equal(logits[r, :L].argmax(-1), out.completion_ids[r, :L]), f"row {r}"


def test_every_shaping_field_is_neutral_inside_generate(released_policy):
    """All processors a checkpoint could switch on, set at once: inside ``explicit_decoding`` the config that
    ``generate`` really uses (after its merge) has each of them off, and the checkpoint config is restored."""
    from transformers import GenerationConfig

    pol = released_policy
    model = pol.model
    saved = model.generation_config
    model.generation_config = GenerationConfig(
        **RELEASED, no_repeat_ngram_size=2, min_new_tokens=3, bad_words_ids=[[5]], sequence_bias={(6,): -1.0},
        forced_eos_token_id=7, exponential_decay_length_penalty=(2, 1.5), begin_suppress_tokens=[8],
        encoder_repetition_penalty=1.2, renormalize_logits=True, eos_token_id=saved.eos_token_id,
        pad_token_id=saved.pad_token_id)
    try:
        with pytest.warns(UserWarning, match="repetition_penalty") as rec:
            with explicit_decoding(model, "test-once") as over:
                merged, _ = model._prepare_generation_config(GenerationConfig(max_new_tokens=2))
        assert {"repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "top_k"} <= set(over)
        for k, off in {"repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_new_tokens": 0,
                       "bad_words_ids": None, "sequence_bias": None, "forced_eos_token_id": None,
                       "exponential_decay_length_penalty": None, "begin_suppress_tokens": None,
                       "encoder_repetition_penalty": 1.0, "renormalize_logits": False, "do_sample": False,
                       "top_k": 50, "top_p": 1.0, "temperature": 1.0}.items():  # global defaults: inert
            assert getattr(merged, k) in (off, None), k
        assert merged.eos_token_id == saved.eos_token_id and merged.pad_token_id == saved.pad_token_id
        assert model.generation_config.repetition_penalty == 1.05  # restored
        assert len([w for w in rec if "generation_config" in str(w.message)]) == 1
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the same overrides warn only once
            with explicit_decoding(model, "test-once"):
                pass
    finally:
        model.generation_config = saved


def test_generation_modules_found_under_peft(tiny_dirs):
    from mmgrpo.vlm.models.adapters import LoraSpec

    pol = load_policy(tiny_dirs("qwen2_5_vl"), lora=LoraSpec(r=2))
    mods = _generation_modules(pol.model)
    assert any(m.generation_config is pol.model.get_base_model().generation_config for m in mods)
