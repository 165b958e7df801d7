"""Reference images of FLUX-Kontext / Wan I2V / Qwen-Image-Edit prompt files are checked when the table is built
(issue 31, item 11): a file that is not an image, a corrupt PNG or a 196-megapixel PNG of 24 kB is an error naming
the prompt file, the prompt and the image before the first step. Before, only existence was checked and the run
crashed when the prompt was first drawn (epoch 4 in the report), and again on every resume."""
import json

import pytest
from PIL import Image

from flow_grpo.models.reference import load_reference_table, to_pil


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("refs")
    Image.new("RGB", (32, 48), (200, 10, 10)).save(d / "good.png")
    Image.new("1", (14000, 14000)).save(d / "bomb.png", optimize=True)
    (d / "notes.png").write_text("this is not an image\n")
    big = Image.effect_noise((64, 64), 50).convert("RGB")
    big.save(d / "noise.png")
    data = (d / "noise.png").read_bytes()
    (d / "cut.png").write_bytes(data[: len(data) // 2])
    return d


@pytest.mark.parametrize("name,part", [("notes.png", "not a readable image (UnidentifiedImageError"),
                                       ("cut.png", "not a readable image"),
                                       ("bomb.png", "image too large to open")])
def test_unusable_reference_images_fail_when_the_table_is_built(images, name, part):
    src = images / "edits.jsonl"
    rows = [{"prompt": "make it red", "image": "good.png"}, {"prompt": "add a hat", "image": name}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError) as ei:
        load_reference_table([r["prompt"] for r in rows], rows, source=str(src))
    msg = str(ei.value)
    assert msg.startswith(f"{src}: prompt #2 'add a hat': unusable reference image: {images / name}: {part}"), msg
    table = load_reference_table(["make it red"], rows[:1], source=str(src))
    assert table == {"make it red": str(images / "good.png")}
    with pytest.raises(ValueError, match=r"32x48 = 1,536 pixels exceeds the cap of 1,000"):
        load_reference_table(["make it red"], rows[:1], source=str(src), max_pixels=1000)


def test_to_pil_reports_a_bomb_as_a_value_error(images):
    """A table set in Python (no header check) still fails with a ValueError naming the file, not
    DecompressionBombError."""
    with pytest.raises(ValueError, match=r"cannot read reference image .*bomb\.png: DecompressionBombError"):
        to_pil(str(images / "bomb.png"))
    assert to_pil(str(images / "good.png")).size == (32, 48)
