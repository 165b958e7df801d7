"""The real Qwen2.5-VL tokenizer / processor built offline (issue #17 item 1), and the token ids that matter for
rollouts: stop on <|im_end|> 151645, pad with <|endoftext|> 151643, answer text decoded exactly.

Expected values are the release's, written here from its public files (tokenizer_config.json added tokens, the
Qwen2-VL model card's rendered prompt) and known encodings of Qwen's vocabulary -- not from the builder."""
import pytest
import torch

RELEASED_IDS = {  # Qwen2.5-VL tokenizer_config.json, added_tokens_decoder
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|object_ref_start|>": 151646,
    "<|object_ref_end|>": 151647, "<|box_start|>": 151648, "<|box_end|>": 151649, "<|quad_start|>": 151650,
    "<|quad_end|>": 151651, "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655, "<|video_pad|>": 151656, "<tool_call>": 151657, "</tool_call>": 151658,
    "<|fim_prefix|>": 151659, "<|fim_middle|>": 151660, "<|fim_suffix|>": 151661, "<|fim_pad|>": 151662,
    "<|repo_name|>": 151663, "<|file_sep|>": 151664,
}


@pytest.fixture(scope="module")
def proc(real_qwen_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(real_qwen_dir, local_files_only=True)  # offline, whatever the env says


def test_special_token_ids_and_vocab(proc):
    tok = proc.tokenizer
    assert type(proc).__name__ == "Qwen2_5_VLProcessor"
    assert len(tok) == 151643 + 22
    assert {t: tok.convert_tokens_to_ids(t) for t in RELEASED_IDS} == RELEASED_IDS
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token, tok.pad_token_id) == ("<|im_end|>", 151645,
                                                                                  "<|endoftext|>", 151643)
    assert tok.bos_token is None and tok.unk_token is None and tok.padding_side == "left"


def test_known_encodings_and_round_trip(proc):
    tok = proc.tokenizer
    assert tok("Hello world", add_special_tokens=False).input_ids == [9707, 1879]
    assert tok("The person opens the door", add_special_tokens=False).input_ids[:2] == [785, 1697]
    # Qwen splits digits one by one: "12.54 to 17.83" -> 1 2 . 5 4 " to" " " 1 7 . 8 3
    toks = tok.convert_ids_to_tokens(tok("12.54 to 17.83", add_special_tokens=False).input_ids)
    assert toks == ["1", "2", ".", "5", "4", "Ġto", "Ġ", "1", "7", ".", "8", "3"]
    texts = ["<think>a</think><answer>12.54 to 17.83</answer>", "你好，世界 café naïve 🙂\n\n  x", "(C) 7,807 m²"]
    for s in texts:
        assert tok.decode(tok(s, add_special_tokens=False).input_ids) == s
    # special tokens are atomic; skip_special_tokens drops them but keeps the non-special added tokens
    ids = tok("<|im_start|>assistant\n<tool_call>x</tool_call><|im_end|>", add_special_tokens=False).input_ids
    assert ids[0] == 151644 and ids[-1] == 151645 and 151657 in ids and 151658 in ids
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<tool_call>x</tool_call>"


def test_rendered_chat_template_matches_the_release(proc):
    # the Qwen2-VL / Qwen2.5-VL model cards' rendered example (default system turn inserted)
    m = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe this image."}]}]
    assert proc.apply_chat_template(m, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "<|vision_start|><|image_pad|><|vision_end|>Describe this image.<|im_end|>\n<|im_start|>assistant\n")
    # own system turn, video, an assistant turn, two images with add_vision_id labels
    m = [{"role": "system", "content": "S."},
         {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "When?"}]},
         {"role": "assistant", "content": "2 to 7"},
         {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Q"}]}]
    assert proc.apply_chat_template(m, tokenize=False, add_generation_prompt=True, add_vision_id=True) == (
        "<|im_start|>system\nS.<|im_end|>\n"
        "<|im_start|>user\nVideo 1: <|vision_start|><|video_pad|><|vision_end|>When?<|im_end|>\n"
        "<|im_start|>assistant\n2 to 7<|im_end|>\n"
        "<|im_start|>user\nPicture 1: <|vision_start|><|image_pad|><|vision_end|>"
        "Picture 2: <|vision_start|><|image_pad|><|vision_end|>Q<|im_end|>\n<|im_start|>assistant\n")


def test_processor_settings_and_vision_token_counts(proc):
    import numpy as np

    ip, vp = proc.image_processor, proc.video_processor
    assert (ip.patch_size, ip.merge_size, ip.temporal_patch_size) == (14, 2, 2)
    assert (ip.size["shortest_edge"], ip.size["longest_edge"]) == (3136, 12845056)  # preprocessor_config.json
    assert (vp.size["shortest_edge"], vp.size["longest_edge"]) == (128 * 28 * 28, 768 * 28 * 28)
    img = np.zeros((224, 308, 3), np.uint8)  # multiples of 28 inside the bounds: kept as is -> 16 x 22 patches
    text = proc.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]}],
                                    tokenize=False, add_generation_prompt=True)
    out = proc(text=[text], images=[img], return_tensors="pt")
    assert out["image_grid_thw"].tolist() == [[1, 16, 22]]
    assert int((out["input_ids"] == 151655).sum()) == 16 * 22 // 4


@pytest.fixture(scope="module")
def crafted(real_qwen_dir, tmp_path_factory):
    """The real-vocab tiny model edited so greedy decoding writes "2 to 7" then <|im_end|> after any prompt
    (attention / MLP outputs zeroed: the last hidden state is the current token's embedding, and lm_head maps
    each chain token's one-hot embedding to the next token)."""
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    proc = AutoProcessor.from_pretrained(real_qwen_dir)
    tok = proc.tokenizer
    m = Qwen2_5_VLForConditionalGeneration.from_pretrained(real_qwen_dir)
    chain = [tok("\n", add_special_tokens=False).input_ids[-1]] + tok("2 to 7", add_special_tokens=False).input_ids
    assert chain == [198, 17, 311, 220, 22]  # "\n" "2" " to" " " "7" in Qwen's vocabulary
    nxt = chain[1:] + [151645]
    lm = m.model.language_model
    with torch.no_grad():
        for layer in lm.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        lm.norm.weight.fill_(1.0)
        m.lm_head.weight.zero_()
        for j, (t, n) in enumerate(zip(chain, nxt)):
            lm.embed_tokens.weight[t] = 0.0
            lm.embed_tokens.weight[t, j] = 8.0
            m.lm_head.weight[n, j] = 1.0
    d = tmp_path_factory.mktemp("real_crafted") / "m"
    m.save_pretrained(d)
    proc.save_pretrained(d)
    return str(d)


def test_rollout_stops_on_im_end_pads_with_endoftext_and_parses(crafted):
    from mmgrpo.vlm.models.adapters import load_policy
    from mmgrpo.vlm.models.inputs import build_prompt_item
    from mmgrpo.vlm.models.rollout import HFRolloutBackend, SamplingParams
    from mmgrpo.vlm.models.tiny import synthetic_frames
    from mmgrpo.vlm.rewards.tasks import ParseConfig, prepare_temporal, span_iou

    pol = load_policy(crafted)
    assert pol.suppress_token_ids == [151652, 151653, 151654, 151655, 151656]
    assert pol.model.generation_config.eos_token_id == [151645, 151643]  # as released
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "When does it happen?"}]}]
    item = build_prompt_item(pol.processor, pol.adapter, msgs, video=synthetic_frames(0, 4, 56, 56), sample_fps=2.0)
    ids = item["input_ids"][0]
    assert ids[-3:].tolist() == [151644, 77091, 198]  # "<|im_start|>assistant\n"
    assert int((ids == 151656).sum()) == int(item["video_grid_thw"].prod()) // 4
    out = HFRolloutBackend(pol.model, pol.processor, pol.suppress_token_ids).generate(
        [item], 2, SamplingParams(max_new_tokens=8, greedy=True))
    assert out.completion_ids.tolist() == [[17, 311, 220, 22, 151645]] * 2  # stops right after <|im_end|>
    assert out.completion_mask.tolist() == [[1] * 5] * 2 and not out.truncated.any()
    assert out.texts == ["2 to 7"] * 2
    longer = HFRolloutBackend(pol.model, pol.processor, pol.suppress_token_ids).generate(
        [item, item], 1, SamplingParams(max_new_tokens=3, greedy=True))  # cut before EOS: truncated, no pad
    assert longer.truncated.all() and longer.texts == ["2 to "] * 2
    sample = {"id": "x", "duration": 10.0, "spans": [[2.0, 7.0]]}
    tp = prepare_temporal(out.texts[0], sample, ParseConfig(fallback_to_text=True))
    assert span_iou(tp) == 1.0


def test_completion_masks_with_the_released_eos_pair():
    """<|endoftext|> is both the pad id and the released config's second EOS: the mask ends at the first of
    either, and a padded tail never extends a row."""
    from mmgrpo.vlm.models.rollout import completion_mask_from_ids

    ids = torch.tensor([[17, 151645, 151643, 151643], [17, 311, 151643, 151643], [17, 311, 220, 22]])
    mask, trunc = completion_mask_from_ids(ids, [151645, 151643])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]] and trunc.tolist() == [False, False, True]


def test_sft_target_is_the_released_templates_assistant_turn(proc):
    """SFT tokenises the prompt (generation prompt) and the answer separately: with the real BPE the result must be
    the tokenisation of the whole conversation rendered by the released template (assistant turn included), so
    the model is trained on exactly the token sequence it will see and produce; labels cover the answer only."""
    from mmgrpo.vlm import sft
    from mmgrpo.vlm.data import prompts
    from mmgrpo.vlm.models.tiny import synthetic_frames

    tok = proc.tokenizer
    sample = dict(id="a", task="tvg", video="a.mp4", duration=4.0, query="When is the red circle visible?",
                  spans=[[1.0, 2.5]])
    vs = sft.VideoSettings(fps=2.0, min_frames=4, max_frames=8, min_pixels=4 * 28 * 28, max_pixels=6 * 28 * 28)
    for mode in ("no_think", "think"):
        ex = sft.prepare_example(sample, proc, model_family="qwen2_5_vl", video=vs, mode=mode,
                                 frames=synthetic_frames(0, 8, 56, 56), video_fps=2.0)
        msgs = prompts.build_messages(sample, mode=mode) + [{"role": "assistant", "content": ex.answer_text}]
        full = proc.apply_chat_template(msgs, tokenize=False)
        assert full == ex.prompt_text + ex.answer_text + "<|im_end|>\n"
        ids = tok(full, add_special_tokens=False).input_ids
        assert ids == tok(ex.prompt_text, add_special_tokens=False).input_ids + ex.answer_ids.tolist() + [198]
        assert ex.answer_ids[-1].item() == 151645
        _, labels = sft.collate_sft([ex], tok.pad_token_id)
        assert labels[labels != sft.IGNORE_INDEX].tolist() == ex.answer_ids.tolist()


def test_prefix_grouping_with_real_ids_and_vocabulary(real_qwen_dir):
    """Shared-prefix scoring on the real vocabulary (151,936 logits) and real vision ids (the MRoPE index finds
    <|vision_start|> 151652 and the pads by the config's ids): equal to the naive per-row path."""
    from mmgrpo.vlm.models.adapters import load_policy
    from mmgrpo.vlm.models.inputs import build_prompt_item
    from mmgrpo.vlm.models.prefix_group import grouped_rows_token_logprobs
    from mmgrpo.vlm.models.rollout import collate_prompts, compute_token_logprobs
    from mmgrpo.vlm.models.tiny import synthetic_frames, synthetic_image

    pol = load_policy(real_qwen_dir)

    def item(kind, q, **kw):
        m = [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": q}]}]
        return build_prompt_item(pol.processor, pol.adapter, m, **kw)

    items = [item("video", "When?", video=synthetic_frames(1, 4, 56, 56), sample_fps=2.0),
             item("image", "Where is the red box?", images=[synthetic_image(0, 56, 84)])]
    rows = [items[0]] * 3 + [items[1]] * 3
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 151643, (6, 7), generator=g)
    ids[:, -1] = 151645
    lens = torch.tensor([7, 4, 2, 7, 5, 1])
    mask = (torch.arange(7)[None] < lens[:, None]).long()
    ids = ids.masked_fill(mask == 0, 151643)
    with torch.no_grad():
        naive = compute_token_logprobs(pol.model, collate_prompts(rows, 151643), ids, mask, 0.9,
                                       pol.suppress_token_ids)
        grouped = grouped_rows_token_logprobs(pol.model, rows, ids, mask, 151643, 0.9, pol.suppress_token_ids,
                                              fallback=False)
    torch.testing.assert_close(grouped, naive, atol=1e-5, rtol=0)
    assert (naive[mask.bool()] < 0).all() and (naive[~mask.bool()] == 0).all()
