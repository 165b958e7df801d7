"""Bad input through the trainer's input path (``TaskAdapter.prepare`` and ``mmgrpo.vlm.data.feed.PromptFeed.prepare``):
images of odd modes and sizes, empty and enormous prompts, a non-UTF-8 annotation file read by the trainer's loader.

Not repeated here (covered where the code lives): JSONL schema errors and the loader's per-line UTF-8 check
(tests/data/test_data_jsonl.py), missing / undecodable videos (tests/video, tests/trainer/test_trainer_loop.py).
"""
import re

import numpy as np
import pytest
import torch
from PIL import Image

from mmgrpo.vlm.config import DataConfig
from mmgrpo.vlm.data.task import BadSampleError, TaskAdapter, load_samples, to_rgb_image
from mmgrpo.vlm.train.trainer import GRPOTrainer


def mcq(sid, image, query="which colour?"):
    return {"id": sid, "task": "mcq", "query": query, "image": image, "options": ["red", "green", "blue"],
            "answer": "B"}


@pytest.fixture(scope="module")
def adapter(tiny_dirs):
    from transformers import AutoProcessor

    from mmgrpo.vlm.models.adapters import get_adapter

    proc = AutoProcessor.from_pretrained(tiny_dirs("qwen2_5_vl"))
    cfg = DataConfig(task="mcq", prompt_mode="no_think", image_min_pixels=3136, image_max_pixels=3136,
                     max_prompt_tokens=400)
    return TaskAdapter(proc, get_adapter("qwen2_5_vl"), cfg)


def _rgba_half_transparent():
    a = np.zeros((28, 56, 4), np.uint8)
    a[..., 0] = 255  # red everywhere ...
    a[:, :28, 3] = 0  # ... transparent on the left half, opaque on the right
    a[:, 28:, 3] = 255
    return Image.fromarray(a, "RGBA")


def _palette_with_transparency():
    im = Image.new("P", (30, 30), 1)
    im.putpalette([0, 0, 0, 0, 0, 255] + [0] * 762)  # index 0 black, index 1 blue
    im.paste(0, (0, 0, 15, 30))  # left half index 0 ...
    im.info["transparency"] = 0  # ... which is the transparent colour
    return im


def test_image_modes_and_sizes_are_converted(adapter, tmp_path):
    _rgba_half_transparent().save(tmp_path / "rgba.png")
    cases = {
        "gray": (Image.new("L", (56, 56), 77), (0, 0), (77, 77, 77)),
        "rgba": (_rgba_half_transparent(), (0, 0), (255, 255, 255)),  # transparent -> white, not black
        "rgba_file": (str(tmp_path / "rgba.png"), (40, 5), (255, 0, 0)),
        "palette": (_palette_with_transparency(), (3, 3), (255, 255, 255)),
        "palette_opaque": (Image.new("P", (20, 20), 0), (0, 0), (0, 0, 0)),
        "gray16": (Image.fromarray(np.full((20, 20), 4000, np.uint16)).convert("I;16"), (0, 0), (0, 0, 0)),
        "one_pixel": (Image.new("RGB", (1, 1), (9, 8, 7)), (0, 0), (9, 8, 7)),
        "very_wide": (Image.new("RGB", (2000, 20), (1, 2, 3)), (1999, 19), (1, 2, 3)),
        "array_hw": (np.full((16, 24), 200, np.uint8), (0, 0), (200, 200, 200)),
        "array_hw4": (np.dstack([np.full((16, 24, 3), 10, np.uint8), np.zeros((16, 24), np.uint8)]), (0, 0),
                      (255, 255, 255)),
        "cmyk": (Image.new("CMYK", (20, 20), (0, 0, 0, 0)), (0, 0), (255, 255, 255)),
    }
    for sid, (im, xy, rgb) in cases.items():
        pp = adapter.prepare(mcq(sid, im))
        got = pp.images[0]
        assert got.mode == "RGB" and got.getpixel(xy) == rgb, sid
        assert pp.item["pixel_values"].shape[0] > 0 and pp.item["image_grid_thw"].shape == (1, 3), sid
        n_pad = int((pp.item["input_ids"] == adapter.processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum())
        t, h, w = pp.item["image_grid_thw"][0].tolist()
        assert n_pad == t * h * w // 4, sid  # the prompt's placeholders match the (converted) image
    assert cases["one_pixel"][0].size == (1, 1)  # the caller's image is not modified
    # the 16-bit range is rescaled (a constant image -> 0), not clipped at 255
    assert to_rgb_image(Image.fromarray(np.array([[0, 60000]], np.uint16)).convert("I;16")).getpixel((1, 0)) == \
        (255, 255, 255)


def test_unusable_images_name_the_sample(adapter):
    with pytest.raises(BadSampleError, match=r"sample thin: image 0 is 4000x10 \(aspect ratio 400 > 200"):
        adapter.prepare(mcq("thin", Image.new("RGB", (4000, 10))))
    with pytest.raises(BadSampleError, match=r"sample arr: image 0: array of shape \(4, 4, 2\)"):
        adapter.prepare(mcq("arr", np.zeros((4, 4, 2), np.uint8)))
    with pytest.raises(BadSampleError, match=r"sample empty: empty query"):
        adapter.prepare(mcq("empty", Image.new("RGB", (8, 8)), query="  \n"))
    with pytest.raises(BadSampleError, match=r"sample long: prompt of \d+ tokens .*data\.max_prompt_tokens=400"):
        adapter.prepare(mcq("long", Image.new("RGB", (8, 8)), query="describe " * 300))


def test_trainer_skips_and_counts_bad_samples_or_raises(tmp_path, tiny_dirs, th):
    samples = [mcq("gray", Image.new("L", (56, 56), 30)), mcq("thin", Image.new("RGB", (4000, 10))),
               mcq("rgba", _rgba_half_transparent()), mcq("empty", Image.new("RGB", (8, 8)), query=""),
               mcq("long", Image.new("RGB", (8, 8)), query="x y " * 400), mcq("pixel", Image.new("1", (1, 1)))]
    args = ["data.task=mcq", "run.max_steps=1", "run.prompts_per_device=6", "data.shuffle=false",
            "data.max_prompt_tokens=400", "rollout.group_size=2", "rollout.max_new_tokens=3"]
    tr = GRPOTrainer(th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), *args), samples=samples,
                     reward_fn=th.text_reward)
    m = tr.train(steps=1)[-1]
    assert m["data/skipped_bad_samples"] == 3 and {s["id"] for s in tr.state.batch.samples} == {"gray", "rgba",
                                                                                                "pixel"}
    assert tr.state.batch.n == 6 and torch.isfinite(tr.state.batch.advantages).all()
    tr = GRPOTrainer(th.make_cfg(tmp_path / "e", tiny_dirs("qwen2_5_vl"), *args, "data.on_bad_sample=error"),
                     samples=samples, reward_fn=th.text_reward)
    with pytest.raises(BadSampleError, match="sample thin"):
        tr.train(steps=1)[-1]


def test_non_utf8_annotation_file_names_file_and_line(tmp_path):
    p = tmp_path / "train.jsonl"
    row = b'{"id": "%s", "task": "mcq", "query": "%s", "image": "a.png", "options": ["x", "y"], "answer": "A"}\n'
    p.write_bytes(row % (b"a", b"q?") + row % (b"b", b"caf\xe9?"))  # line 2: latin-1, not UTF-8
    with pytest.raises(ValueError, match=re.escape(f"{p}:2") + ": not valid UTF-8"):
        load_samples(str(p))


def test_a_decompression_bomb_in_the_train_file_is_dropped_or_skipped_not_fatal(tmp_path, tiny_dirs, th):
    """Issue 31, item 11: a 24 kB PNG claiming 196 megapixels raised Pillow's DecompressionBombError (not an OSError)
    in the input path and ended the run (on every resume too). Now the media check drops it when the data is loaded
    (counted as data/dropped_at_load); with media_check=exists it reaches the input path and is skipped and counted
    there (data/skipped_missing_media). Either way the step trains on the other samples."""
    import json

    Image.new("1", (14000, 14000)).save(tmp_path / "bomb.png", optimize=True)
    for k in range(3):
        Image.new("RGB", (56, 56), (80 * k, 40, 200)).save(tmp_path / f"ok{k}.png")
    rows = [mcq("ok0", "ok0.png"), mcq("bomb", "bomb.png"), mcq("ok1", "ok1.png"), mcq("ok2", "ok2.png")]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["data.task=mcq", f"data.train_file={tmp_path / 'train.jsonl'}", "run.max_steps=1",
            "run.prompts_per_device=4", "data.shuffle=false", "rollout.group_size=2", "rollout.max_new_tokens=3"]
    tr = GRPOTrainer(th.make_cfg(tmp_path / "a", tiny_dirs("qwen2_5_vl"), *args), reward_fn=th.text_reward)
    assert [s.id for s in tr.samples] == ["ok0", "ok1", "ok2"] and tr.media_report.counts == {"media_too_large": 1}
    m = tr.train(steps=1)[-1]
    assert m["data/dropped_at_load"] == 1 and m["data/skipped_missing_media"] == 0
    tr = GRPOTrainer(th.make_cfg(tmp_path / "b", tiny_dirs("qwen2_5_vl"), *args, "data.media_check=exists"),
                     reward_fn=th.text_reward)
    assert len(tr.samples) == 4
    m = tr.train(steps=1)[-1]
    assert m["data/skipped_missing_media"] == 1
    assert {getattr(s, "id", None) or s["id"] for s in tr.state.batch.samples} == {"ok0", "ok1", "ok2"}
