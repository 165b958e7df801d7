"""MGPO as released (xinyu1205/verl branch mgpo @994efbe611, linked from EvolvingLMMs-Lab/MGPO): the first prompt,
the JSON box of the first turn and the cut after it, the validity test, the crop from the source image and its
resize, the two second-turn texts, the \\boxed{} reward. The expected strings are written here from the release's
training script and rollout (rollout.sub_image_token_prompt / ori_image_token_prompt with the sample's fields put
in by hand), not produced by the code under test."""
import torch
from PIL import Image

from mmgrpo.vlm.models.rollout import SamplingParams
from mmgrpo.vlm.tools.config import ToolsConfig
from mmgrpo.vlm.tools.rollout import MultiTurnBackend, ScriptedTurns

SAMPLE = {"id": "v1", "task": "mcq", "image": "x.png", "query": "What is the colour of the umbrella?",
          "options": ["red", "blue"], "answer": "B",
          "meta": {"problem": "<image>What is the colour of the umbrella? (A) red (B) blue",
                   "question": "What is the colour of the umbrella?", "choices": "(A) red (B) blue\n"}}
# run_qwen2_5_vl-7b_mgpo.sh: data.system_prompt, data.post_prompt; ensure_period adds the "."
RELEASE_PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant. Given an image and one question. First, identify the coordinates "
    "of the key image area relevant to solving the problem. Append the coordinates in JSON format at the end of your "
    "response and stop. This will trigger cropping of the corresponding area in the original image and enlarge it "
    "for improved clarity. Once the enlarged image is available, provide the final answer (A, B, C, D, or E) enclosed "
    "within \\boxed{}.<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is the colour of "
    "the umbrella? (A) red (B) blue. Out the coordinates of the key image area relevant to the problem in JSON "
    "format.<|im_end|>\n<|im_start|>assistant\n")
RELEASE_SUB = (
    "\n<|im_start|>user\nBased on the provided coordinates, return the sub-image:\n<|vision_start|><|image_pad|>"
    "<|vision_end|>\nQuestion: What is the colour of the umbrella? (A) red (B) blue\nCarefully analyze both the "
    "original image and the enlarged sub-image to solve the question step by step. If the sub-image does not provide "
    "sufficient information, refer to the original image to find the solution. Present your reasoning clearly, and "
    "provide the final answer (A, B, C, D, or E) enclosed within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n")
RELEASE_ORI = (
    "\n<|im_start|>user\nNot providing correct coordinates or invalid coordinate values, return the original image:\n"
    "<|vision_start|><|image_pad|><|vision_end|>\nQuestion: What is the colour of the umbrella? (A) red (B) blue\n"
    "Carefully analyze the original image to solve the question step by step. Present your reasoning clearly, and "
    "provide the final answer (A, B, C, D, or E) enclosed within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n")
BLOCK = '```json\n[{"bbox_2d": [56, 56, 280, 252], "label": "umbrella"}]\n```'


def _collapse(tok, ids):
    """Decoded text with each run of <|image_pad|> written once (the release's prompt strings hold one)."""
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    out = [t for i, t in enumerate(ids) if t != pad or i == 0 or ids[i - 1] != pad]
    return tok.decode(out)


def test_first_prompt_equals_the_release_text(tiny):
    from mmgrpo.vlm.data.templates import ground_truth, render_messages

    text = tiny.proc.apply_chat_template(render_messages(SAMPLE, "mgpo"), tokenize=False, add_generation_prompt=True)
    assert text == RELEASE_PROMPT
    assert ground_truth(SAMPLE, "mgpo") == "\\boxed{B}"
    # without the release data's fields: the problem is rebuilt (chose) and still ends with ensure_period's "."
    bare = {k: v for k, v in SAMPLE.items() if k != "meta"}
    msgs = render_messages(bare, "mgpo")
    assert msgs[1]["content"][1]["text"] == ("What is the colour of the umbrella?\n(A) red\n(B) blue. Out the "
                                             "coordinates of the key image area relevant to the problem in JSON "
                                             "format.")


def test_release_json_box_validity_and_resize():
    from mmgrpo.vlm.methods.mgpo import release_box_valid, release_cut, release_json_box, release_resize

    assert release_json_box("see " + BLOCK + " then") == [56, 56, 280, 252]
    assert release_cut("see " + BLOCK + " then", 1) == len("see " + BLOCK)
    assert release_json_box('```json\n[{"bbox_2d": [1.5, 2, 3, 4], "label": "x"}]\n```') is None  # floats
    assert release_json_box('```json\n[{"bbox_2d": [1, 2, 3, 4]}]\n```') is None  # no label
    assert release_json_box('```json\n{"bbox_2d": [1, 2, 3, 4], "label": "x"}\n```') is None  # not a list
    two = '```json\n[{"bbox_2d": [1, 2], "label": "x"}]\n```' + BLOCK  # the first block fails, the second serves
    assert release_json_box(two) == [56, 56, 280, 252]
    assert release_json_box("[10, 20, 70, 80]") is None
    W, H = 112, 84
    assert release_box_valid([10, 20, 70, 80], W, H)
    assert not release_box_valid([10, 20, 38, 80], W, H)  # width 28 is not > 28
    assert not release_box_valid([10, 20, 70, 85], W, H)  # y2 > H
    assert not release_box_valid([70, 20, 10, 80], W, H)  # x1 >= x2
    assert not release_box_valid(None, W, H)
    assert release_box_valid([0, 0, 112, 84], W, H)
    # process_image: 2000 x 1000 -> sqrt(1003520 / 2e6) = 0.70835... -> int sides 1416 x 708, nearest
    big = release_resize(Image.new("RGB", (2000, 1000)))
    assert big.size == (1416, 708)
    # 100 x 50 -> sqrt(200704 / 5000) = 6.33561... -> 633 x 316
    assert release_resize(Image.new("L", (100, 50))).size == (633, 316)
    assert release_resize(Image.new("L", (100, 50))).mode == "RGB"


BOUNDS = {"min_pixels": 3136, "max_pixels": 200704}  # the run's image bounds (the release: 200,704 .. 1,003,520)


def _source():
    src = Image.new("RGB", (896, 672))
    px = src.load()
    for x in range(896):
        for y in range(672):
            px[x, y] = (x % 256, y % 256, (x * 7 + y) % 256)
    return src


def _backend(tiny, turns, src):
    opts = ToolsConfig(enabled=True, names=["mgpo_crop"], call_format="mgpo", max_turns=2, max_tool_calls=1,
                       max_total_tokens=4000, answer_pattern="", instruction="auto")
    mt = MultiTurnBackend(ScriptedTurns(tiny.tok, [turns]), tiny.proc, opts, image_kwargs=BOUNDS)
    text = tiny.proc.apply_chat_template(__import__("mmgrpo.vlm.data.templates", fromlist=["x"]).render_messages(
        SAMPLE, "mgpo"), tokenize=False, add_generation_prompt=True)
    item = {k: v for k, v in tiny.proc(text=[text], images=[src], return_tensors="pt", **BOUNDS).items()
            if isinstance(v, torch.Tensor)}
    out = mt.generate([item], 1, SamplingParams(max_new_tokens=200), seeds=None,
                      raw_prompts=[{"images": [src], "sample": SAMPLE}])
    return mt, item, out


def test_release_two_turn_rollout_crops_and_renders_the_release_turn(tiny):
    """First turn with a valid box and text after it: the turn is cut after the block (sampled tokens kept, then
    <|im_end|> with loss 0), the tool turn is the release's sub-image text, the crop is cut from the source image
    with int(x / W * W_src) and resized by process_image."""
    src = _source()
    turn1 = "The umbrella is on the left.\n" + BLOCK + "\nand more words the release drops"
    mt, item, out = _backend(tiny, [turn1, "It is blue. \\boxed{B}"], src)
    g = item["image_grid_thw"][0].tolist()
    W, H = g[2] * 14, g[1] * 14
    assert (W, H) == (504, 364)  # 896 x 672 under 200,704 pixels (smart_resize)
    info = out.turn_info[0]
    assert info["tool_calls"] == 1 and info["tool_failures"] == 0 and info["turns"] == 2
    ids = out.completion_ids[0, :int(out.completion_mask[0].sum())].tolist()
    lm = out.loss_mask[0, :len(ids)].tolist()
    tok = tiny.tok
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    n1 = lm.index(0)  # the cut first turn: policy tokens up to the block's end
    assert tok.decode(ids[:n1]) == "The umbrella is on the left.\n" + BLOCK
    assert ids[n1] == eot and info["turn_texts"][0] == "The umbrella is on the left.\n" + BLOCK
    k2 = n1 + lm[n1:].index(1)  # the second policy turn starts after the tool turn
    assert _collapse(tok, ids[n1 + 1:k2]) == RELEASE_SUB
    assert tok.decode(ids[k2:]) == "It is blue. \\boxed{B}<|im_end|>"
    # the crop, by hand: x 56..280 of 504 -> int(56/504*896) = 99 .. int(280/504*896) = 497; y 56..252 of 364 ->
    # 103 .. 465; 398 x 362 = 144,076 < 200,704 pixels -> x sqrt(200704/144076) = 1.18027 -> int: 469 x 427, nearest
    ref = src.crop((99, 103, 497, 465)).resize((469, 427), Image.Resampling.NEAREST)
    n_first = g[0] * g[1] * g[2]
    pv_tool = tiny.proc(text=["<|vision_start|><|image_pad|><|vision_end|>"], images=[ref], return_tensors="pt",
                        **BOUNDS)["pixel_values"]
    torch.testing.assert_close(out.items[0]["pixel_values"][n_first:], pv_tool, rtol=0, atol=0)


def test_release_invalid_box_shows_the_original_image_again(tiny):
    _, item, out = _backend(tiny, ["no json here [10, 20, 70, 80]", "\\boxed{A}"], _source())
    info = out.turn_info[0]
    assert info["tool_failures"] == 1 and info["turns"] == 2
    ids = out.completion_ids[0, :int(out.completion_mask[0].sum())].tolist()
    lm = out.loss_mask[0, :len(ids)].tolist()
    n1 = lm.index(0)
    k2 = n1 + lm[n1:].index(1)
    assert tiny.tok.decode(ids[:n1]) == "no json here [10, 20, 70, 80]<|im_end|>"  # no cut without a block
    assert _collapse(tiny.tok, ids[n1:k2]) == RELEASE_ORI
    assert out.items[0]["image_grid_thw"][1].tolist() == item["image_grid_thw"][0].tolist()


def test_release_reward_reads_the_last_boxed_letter():
    from mmgrpo.vlm.rewards.registry import build_reward_fn

    f = build_reward_fn({"mcq": 1.0}, "mcq", parse_mode="mgpo")
    texts = ["so \\boxed{B}", "\\boxed{B} no, \\boxed{A}", "\\boxed{\\text{b}}", "B", "\\boxed{(B)}", "\\boxed{B"]
    got = f.score(texts, [SAMPLE] * len(texts))
    assert got["mcq"] == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
