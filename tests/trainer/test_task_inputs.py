"""What reaches the model from TaskAdapter (issue #33 items 2 and 4): a prompt rebuilt by a method keeps the
rollout's layout (query_position, prompt template), and each configured image bound reaches the processor on its own."""
import numpy as np
import pytest

from mmgrpo.vlm.config import DataConfig
from mmgrpo.vlm.models.adapters import get_adapter
from mmgrpo.vlm.data.task import TaskAdapter

TINY = "data/checkpoints/tiny_vlm"


@pytest.fixture(scope="module")
def tiny_proc():
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(TINY, local_files_only=True)


def _video_sample():
    frames = np.random.RandomState(0).randint(0, 255, (8, 56, 56, 3), dtype=np.uint8)
    return {"id": "v", "task": "tvg", "query": "the red circle appears", "video": frames, "duration": 4.0,
            "spans": [[1.0, 2.0]], "meta": {"video_fps": 2.0}}


def _cfg(**kw):
    base = dict(task="tvg", prompt_mode="no_think", video_fps=2.0, min_frames=4, max_frames=8,
                video_min_pixels=3136, video_max_pixels=3136, video_total_pixels=3136 * 8)
    base.update(kw)
    return DataConfig(**base)


@pytest.mark.parametrize("kw", [dict(query_position="before"), dict(prompt_template="time_r1_v1",
                                                                   prompt_mode="think")])
def test_rebuild_keeps_the_rollout_prompt(tiny_proc, kw):
    """TaskAdapter.rebuild (hybrid CoT, difficulty augmentation) used to render with the defaults: the text after
    the video whatever data.query_position said, and always the project template."""
    task = TaskAdapter(tiny_proc, get_adapter("qwen2_5_vl"), _cfg(**kw))
    prep = task.prepare(_video_sample())
    again = task.rebuild(prep)
    assert again.text == prep.text
    assert (again.item["input_ids"] == prep.item["input_ids"]).all()
    hinted = task.rebuild(prep, hint="look at the start")
    assert hinted.text.count("\nHint: look at the start") == 1


def test_rebuild_refuses_another_mode_on_a_release_template(tiny_proc):
    task = TaskAdapter(tiny_proc, get_adapter("qwen2_5_vl"), _cfg(prompt_template="time_r1_v1", prompt_mode="think"))
    prep = task.prepare(_video_sample())
    with pytest.raises(ValueError, match="one prompt mode"):
        task.rebuild(prep, mode="no_think")


@pytest.fixture(scope="module")
def real_proc():
    import importlib.util

    pytest.importorskip("tiktoken")
    if importlib.util.find_spec("dashscope") is None:
        pytest.skip("dashscope (ships qwen.tiktoken) not installed")
    from mmgrpo.vlm.models.real_tokenizer import build_qwen2_5_vl_processor

    return build_qwen2_5_vl_processor()


@pytest.mark.parametrize("lo, hi", [(0, 200704), (3136, 200704), (0, 0)])
def test_image_max_pixels_reaches_the_processor_without_a_min(real_proc, lo, hi):
    """data.image_max_pixels was dropped unless image_min_pixels > 0: Video-R1's 256*28*28 images went up to the
    processor's own 12,845,056. A 1000 x 800 image: 280 x 22 x 28 patches of 14 would be 1,003,520 pixels."""
    from PIL import Image

    task = TaskAdapter(real_proc, get_adapter("qwen2_5_vl"), DataConfig(task="mcq", image_min_pixels=lo,
                                                                         image_max_pixels=hi))
    im = Image.fromarray(np.zeros((800, 1000, 3), np.uint8))
    prep = task.prepare({"id": "i", "task": "mcq", "query": "q?", "image": im, "options": ["a", "b"], "answer": "A"})
    _, gh, gw = (int(x) for x in prep.item["image_grid_thw"][0])
    px = gh * gw * 14 * 14
    if hi:
        # smart_resize: floor to multiples of 28 inside sqrt(200704 / 800000) * (800, 1000) = (400.7, 500.9)
        assert (gh * 14, gw * 14) == (392, 476) and px <= hi
    else:  # no bound configured: the processor's own (the image fits: rounded to multiples of 28)
        assert (gh * 14, gw * 14) == (812, 1008)
