"""eval/generate_t2i.py ``layout=``: the folders the benchmarks' own scorers read (GenEval, DPG-Bench,
T2I-CompBench), checked on prompt lines written from each benchmark's public files and with the scorers'
discovery rules re-stated here independently (folder/regex/crop rules from their released evaluation code).
"""
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from eval import generate_t2i, t2i_layouts  # noqa: E402

torch.set_num_threads(1)
FAST = ["num_steps=2", "height=32", "width=32", "progress=false", "rewards=[brightness]", "batch_size=3"]

# two lines in the format of GenEval's prompts/evaluation_metadata.jsonl
GENEVAL_LINES = [
    '{"tag": "single_object", "include": [{"class": "bench", "count": 1}], "prompt": "a photo of a bench"}',
    '{"tag": "color_attr", "include": [{"class": "cup", "count": 1, "color": "red"}, {"class": "dog", "count": 1, '
    '"color": "blue"}], "prompt": "a photo of a red cup and a blue dog"}',
]
# DPG-Bench dpg_bench.csv: header + one row per question; the item's prompt repeats on each of its rows
DPG_CSV = (
    "item_id,text,keywords,proposition_id,dependency,category_broad,category_detailed,tuple,"
    "question_natural_language\n"
    '1,"A red truck parked on a beach at dusk.","truck",1,0,entity,whole,entity - whole (truck),Is there a truck?\n'
    '1,"A red truck parked on a beach at dusk.","red",2,1,attribute,color,"attribute - color (truck, red)",'
    "Is the truck red?\n"
    'partiprompts7,"A cat on a mat.","cat",1,0,entity,whole,entity - whole (cat),Is there a cat?\n'
)
# T2I-CompBench examples/dataset/color_val.txt: one prompt per line
T2I_LINES = "a green bench and a blue bowl\na red car and a yellow cat\t(extra field)\n\n"


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    from flow_grpo.models import save_tiny_pipeline

    return save_tiny_pipeline(str(tmp_path_factory.mktemp("layouts") / "sd3"), "sd3")


def _rows(d):
    return [json.loads(x) for x in (Path(d) / "images.jsonl").read_text().splitlines()]


def _tree(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())


def test_geneval_layout_is_the_official_tree(pipe, tmp_path):
    meta = tmp_path / "evaluation_metadata.jsonl"
    meta.write_text("\n".join(GENEVAL_LINES) + "\n")
    out = tmp_path / "run"
    assert generate_t2i.main([f"pipeline={pipe}", f"prompts={meta}", f"out_dir={out}", "layout=geneval",
                              "images_per_prompt=2", *FAST]) == 0
    g = out / "geneval"
    assert _tree(g) == ["00000/grid.png", "00000/metadata.jsonl", "00000/samples/00000.png",
                        "00000/samples/00001.png", "00001/grid.png", "00001/metadata.jsonl",
                        "00001/samples/00000.png", "00001/samples/00001.png"]
    for i, line in enumerate(GENEVAL_LINES):  # json.dump of the line's object: byte-identical, no newline
        assert (g / f"{i:05d}" / "metadata.jsonl").read_text() == line
    # evaluate_images.py's discovery: digit folders, json.load(metadata.jsonl), samples/ files matching \d+\.png
    found = []
    for sub in sorted(g.iterdir()):
        if sub.is_dir() and sub.name.isdigit():
            md = json.load(open(sub / "metadata.jsonl"))
            found += [(md["prompt"], f.name) for f in sorted((sub / "samples").iterdir())
                      if re.match(r"\d+\.png", f.name)]
    assert found == [("a photo of a bench", "00000.png"), ("a photo of a bench", "00001.png"),
                     ("a photo of a red cup and a blue dog", "00000.png"),
                     ("a photo of a red cup and a blue dog", "00001.png")]
    rows = _rows(out)
    assert [r["image"] for r in rows] == [f"geneval/{p:05d}/samples/{k:05d}.png" for p in range(2) for k in range(2)]
    assert rows[2]["metadata"] == {"tag": "color_attr", "include": json.loads(GENEVAL_LINES[1])["include"]}
    assert not (out / "images").exists()  # the samples are the images: no second copy
    m = json.loads((out / "metrics.json").read_text())
    assert m["layout"]["scorer_command"].startswith(f"python evaluation/evaluate_images.py {g}")


def test_dpgbench_layout_from_csv_and_folder(pipe, tmp_path):
    from PIL import Image

    csv = tmp_path / "dpg_bench.csv"
    csv.write_text(DPG_CSV)
    assert t2i_layouts.read_dpgbench(csv) == (["A red truck parked on a beach at dusk.", "A cat on a mat."],
                                              [{"item_id": "1"}, {"item_id": "partiprompts7"}])
    folder = tmp_path / "prompts"
    folder.mkdir()
    for iid, text in (("10", "ten"), ("2", "two\n"), ("partiprompts7", "A cat on a mat.")):
        (folder / f"{iid}.txt").write_text(text)
    assert t2i_layouts.read_dpgbench(folder) == (["two", "ten", "A cat on a mat."],
                                                 [{"item_id": "2"}, {"item_id": "10"}, {"item_id": "partiprompts7"}])
    out = tmp_path / "run"
    assert generate_t2i.main([f"pipeline={pipe}", f"prompts={csv}", f"out_dir={out}", "layout=dpgbench",
                              "images_per_prompt=4", *FAST]) == 0
    assert _tree(out / "dpgbench") == ["1.png", "partiprompts7.png"]
    rows = _rows(out)
    r = 32
    # compute_dpg_bench.py: key = name before the first dot, tiles (0,0), (R,0), (0,R), (R,R) for --pic-num 4
    boxes = [(0, 0, r, r), (r, 0, 2 * r, r), (0, r, r, 2 * r), (r, r, 2 * r, 2 * r)]
    for p, iid in enumerate(("1", "partiprompts7")):
        grid = Image.open(out / "dpgbench" / f"{iid}.png")
        assert grid.size == (2 * r, 2 * r)
        singles = [x for x in rows if x["prompt_index"] == p]
        for k, box in enumerate(boxes):
            tile = np.asarray(grid.crop(box).convert("RGB"))
            assert np.array_equal(tile, np.asarray(Image.open(out / singles[k]["image"]).convert("RGB")))
    assert json.loads((out / "metrics.json").read_text())["layout"]["scorer_command"] == \
        f"PIC_NUM=4 bash dpg_bench/dist_eval.sh {out / 'dpgbench'} 32"


def test_dpgbench_refuses_what_the_scorer_cannot_crop(tmp_path):
    with pytest.raises(ValueError, match="square"):
        t2i_layouts.check_layout("dpgbench", 4, 32, 64)
    with pytest.raises(ValueError, match="1..4"):
        t2i_layouts.check_layout("dpgbench", 5, 32, 32)
    bad = tmp_path / "bad.csv"
    bad.write_text("item_id,prompt\n1,x\n")
    with pytest.raises(ValueError, match=r"missing column.*text"):
        t2i_layouts.read_dpgbench(bad)


def test_t2icompbench_layout_names(pipe, tmp_path):
    txt = tmp_path / "color_val.txt"
    txt.write_text(T2I_LINES)
    prompts, meta = t2i_layouts.read_t2icompbench(txt)
    assert prompts == ["a green bench and a blue bowl", "a red car and a yellow cat"]  # text before the tab
    assert meta == [{"tag": "color_val", "line": 1}, {"tag": "color_val", "line": 2}]
    out = tmp_path / "run"
    assert generate_t2i.main([f"pipeline={pipe}", f"prompts={txt}", f"out_dir={out}", "layout=t2icompbench",
                              "images_per_prompt=2", *FAST]) == 0
    names = sorted((out / "t2icompbench" / "samples").iterdir(), key=lambda f: int(f.name.split("_")[-1][:-4]))
    # the release generator's running counter over prompts and images, 6 digits
    assert [f.name for f in names] == ["a green bench and a blue bowl_000000.png",
                                       "a green bench and a blue bowl_000001.png",
                                       "a red car and a yellow cat_000002.png", "a red car and a yellow cat_000003.png"]
    # BLIP_vqa.py reads the prompt back as the name before the first "_"
    assert [f.name.split("_")[0] for f in names] == [prompts[0]] * 2 + [prompts[1]] * 2
    assert [r["image"] for r in _rows(out)] == [f"t2icompbench/samples/{f.name}" for f in names]


def test_t2icompbench_refuses_unreadable_prompts(tmp_path):
    f = tmp_path / "y_val.txt"
    f.write_text("a" * 245 + "\n")
    with pytest.raises(ValueError, match=r"y_val.txt:1: prompt too long"):
        t2i_layouts.read_t2icompbench(f)
    for text, ch in (("a cat/dog", "/"), ("a snake_case cat", "_")):
        f = tmp_path / "x_val.txt"
        f.write_text(f"fine prompt\n{text}\n")
        with pytest.raises(ValueError, match=rf"x_val.txt:2: prompt contains '{ch}'"):
            t2i_layouts.read_t2icompbench(f)


def test_geneval_reader_refuses_a_blank_line(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text(GENEVAL_LINES[0] + "\n\n" + GENEVAL_LINES[1] + "\n\n")
    with pytest.raises(ValueError, match=r"m.jsonl:2: blank line"):
        t2i_layouts.read_geneval(f)
    f.write_text(GENEVAL_LINES[0] + "\n\n")  # trailing blank lines are fine
    assert t2i_layouts.read_geneval(f)[0] == ["a photo of a bench"]
