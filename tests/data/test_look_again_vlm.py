"""The look-again benchmark on the VLM side: the crop tool on the full-resolution source, the tool-call text,
the chat template's tool turn."""
import numpy as np
import pytest

from mmgrpo.synthetic import look_again as bench
from mmgrpo.vlm.synthetic import look_again as la


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    d = tmp_path_factory.mktemp("la")
    bench.generate(str(d), n_train=4, n_val=0, n_heldout=0, seed=2)
    return la.load_split(str(d / "train.jsonl"))


def test_crop_source_on_the_cell_shows_the_answer_at_full_resolution(rows):
    for s in rows:
        res = la.run_crop(s, s["meta"]["cell_box_view"])
        assert res.ok and res.images[0].size == (112, 112)
        x1, y1 = (v * 4 for v in s["meta"]["cell_box_view"][:2])
        assert res.text.startswith(f"Crop of image 0: source pixels [{x1}, {y1}, {x1 + 112}, {y1 + 112}]")
        # 112 source px at 112 px: the crop is the source region itself
        from PIL import Image

        src = np.asarray(Image.open(la.source_path(s)))
        assert np.array_equal(np.asarray(res.images[0]), src[y1:y1 + 112, x1:x1 + 112])
        assert bench.crop_oracle(np.asarray(res.images[0])) == s["meta"]["colour"]


def test_bad_box_is_a_failed_call_not_a_crash(rows):
    res = la.run_crop(rows[0], [5, 5, 5, 5])
    assert not res.ok and "covers 0x0 source pixels" in res.text


def test_tool_call_text_parses_back():
    text = la.tool_call_text([28, 56, 56, 84])
    assert text == '<tool_call>\n{"name": "crop_source", "arguments": {"bbox_2d": [28, 56, 56, 84]}}\n</tool_call>'
    assert la.parse_tool_call(text) == ([28, 56, 56, 84], "ok")
    assert la.parse_tool_call("<answer>A</answer>") == (None, "none")
    assert la.parse_tool_call("<tool_call>\n{bad}\n</tool_call>")[1] == "bad_json"
    assert la.parse_tool_call('<tool_call>{"name": "crop_source", "arguments": {"bbox_2d": [1]}}</tool_call>')[1] \
        == "bad_args"
    assert la.parse_letter("x <answer> c </answer>") == "C"


class _Inner:
    """A rollout backend that writes ``texts[k]`` (+ <|im_end|>) on its k-th call and records the prompts."""

    def __init__(self, tok, texts):
        self.tok, self.texts, self.prompts = tok, texts, []

    def generate(self, prompts, num_generations, params, seeds=None, raw_prompts=None):
        import torch

        from mmgrpo.vlm.models.rollout import RolloutOutput

        text = self.texts[len(self.prompts)]
        self.prompts.append(prompts)
        ids = torch.tensor([self.tok(text, add_special_tokens=False)["input_ids"]
                            + [self.tok.convert_tokens_to_ids("<|im_end|>")]])
        return RolloutOutput(ids, torch.ones_like(ids), [text], torch.zeros(1, dtype=torch.bool), None,
                             torch.zeros(1, dtype=torch.long))

    def sync_weights(self, model):
        pass


def test_trace_is_token_exact_with_the_rollout_engine(rows):
    """The SFT trace's second prompt is the conversation the multi-turn engine builds after the same call."""
    import torch

    from mmgrpo.vlm.models.rollout import SamplingParams
    from mmgrpo.vlm.models.tiny import build_tiny_processor
    from mmgrpo.vlm.tools.rollout import MultiTurnBackend

    proc = build_tiny_processor("qwen2_5_vl")
    ta = la.task_adapter(proc)
    s = rows[1]
    first, second = la.trace_examples(ta, s)
    assert first.answer_text == la.tool_call_text(s["meta"]["cell_box_view"])
    inner = _Inner(proc.tokenizer, [first.answer_text, "<answer>A</answer>"])
    pp = la.prepare(ta, s, True)
    # the tiny test tokenizer spells the call and the tool turn out byte by byte: 82 + 125 tokens
    out = MultiTurnBackend(inner, proc, la.tools_options(max_total_tokens=400), "qwen2_5_vl").generate(
        [pp.item], 1, SamplingParams(max_new_tokens=64), raw_prompts=[{"sample": pp.sample, "images": pp.images}])
    assert out.turn_info[0]["tool_calls"] == 1 and out.turn_info[0]["tool_failures"] == 0
    got = inner.prompts[1][0]
    for k in ("input_ids", "mm_token_type_ids", "pixel_values", "image_grid_thw"):
        assert torch.equal(got[k], second.prompt[k]), k
    assert torch.equal(first.prompt["input_ids"], pp.item["input_ids"])
    assert second.prompt["image_grid_thw"].tolist() == [[1, 8, 8], [1, 8, 8]]


SHIPPED = bench.__file__.rsplit("/mmgrpo/", 1)[0] + "/data/checkpoints/look_again_base"


@pytest.mark.skipif(not __import__("os").path.exists(SHIPPED + "/config.json"), reason="no shipped look-again base")
def test_shipped_look_again_base_is_current_and_uses_the_tool(tmp_path):
    """The demo's base (scripts/build_look_again_base.py) was built on today's generator (its validation samples
    regenerate with the same answers from its report's seed and layout), loads, and its own validation
    report shows tool use: calls on nearly every sample, the box on the object, and accuracy with the tool well above
    the plain prompt's (which cannot beat chance: the view is the same under all answers)."""
    import json

    from scripts.demo_tools import load_base

    rep = json.loads(open(SHIPPED + "/base_report.json").read())
    lay = bench.Layout(**rep["layout"])
    ev, args = rep["eval_val"], rep["args"]
    now = bench.make_samples(args["n_val"], "val", args["seed"], lay)
    assert [s["answer"] for _, s in now] == [t["answer"] for t in ev["trajectories"]], "stale base: rebuild it"
    assert rep["params"]["total"] < 1_000_000 and args["pretrain_steps"] > 0
    assert ev["call_rate"] >= 90 and ev["cell_hit_rate"] >= 80 and ev["tools"] >= ev["plain"] + 10
    model, proc = load_base(__import__("pathlib").Path(SHIPPED))
    assert sum(p.numel() for p in model.parameters()) == rep["params"]["total"]
    assert "<tool_call>" in proc.tokenizer.get_vocab()
    # the answer is read from the crop: right after its own cell's crop, not after another cell's (no object there)
    bench.write_split(str(tmp_path), "val", 6, args["seed"], lay)
    probe = la.crop_swap_probe(model, la.task_adapter(proc), la.load_split(str(tmp_path / "val.jsonl")))
    assert probe["own"] == 100.0 and probe["other"] <= 50.0
