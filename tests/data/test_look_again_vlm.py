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

        src = np.asarray(Image.open(s["meta"]["source"]))
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


def test_template_renders_the_tool_turn_as_qwen25():
    from jinja2 import Template

    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q"}]},
            {"role": "assistant", "content": "CALL"}, {"role": "tool", "content": [{"type": "image"}]}]
    out = Template(la.TOOL_CHAT_TEMPLATE).render(messages=msgs, add_generation_prompt=True)
    img = "<|vision_start|><|image_pad|><|vision_end|>"
    assert out == (f"<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n{img}Q<|im_end|>\n"
                   f"<|im_start|>assistant\nCALL<|im_end|>\n<|im_start|>user\n<tool_response>\n{img}\n"
                   f"</tool_response><|im_end|>\n<|im_start|>assistant\n")
