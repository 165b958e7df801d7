"""TVG timeline pictures (mmgrpo.vlm.timeline): bars at the pixel columns of their spans, the model's frames."""
import json
from pathlib import Path

import numpy as np
from PIL import Image

from mmgrpo.vlm import timeline as tl


def _cols(img, top, colour):
    """Columns of the bar row starting at pixel row ``top`` that have exactly ``colour``."""
    row = np.asarray(img)[top + tl.BAR_H // 2]
    return np.nonzero((row == np.array(colour)).all(axis=1))[0]


def test_bars_sit_at_their_spans():
    D = 12.0
    frames = [np.full((28, 28, 3), 10 * i, np.uint8) for i in range(4)]
    spans = {"ground truth": (2.25, 5.5), "before": (0.0, 12.0), "after": (3.0, 3.01)}
    img, lay = tl.draw_panel(frames, [0.0, 3.0, 6.0, 9.0], D, "when?", spans["ground truth"],
                             {"before": spans["before"], "after": spans["after"], "unparsed": None})
    colours = [tl.GT_COLOUR, tl.PRED_COLOURS[0], tl.PRED_COLOURS[1]]
    for (name, (s, e)), top, colour in zip(spans.items(), lay.bar_top, colours):
        # independent geometry: axis of 480 px from column 110, time t at 110 + round(t / D * 480)
        x0 = 110 + round(s / D * 480)
        x1 = max(110 + round(e / D * 480), x0 + 1)
        cols = _cols(img, top, colour)
        assert cols.min() == x0 and cols.max() == x1 - 1 and len(cols) == x1 - x0, name
    assert len(_cols(img, lay.bar_top[3], tl.PRED_COLOURS[2])) == 0  # unparsed: no bar ("no span" text)
    assert lay.left == 110 and lay.width == 480
    # the frames are pasted unchanged (28 px rows upscaled by 48 // 28 = 1)
    a = np.asarray(img)
    assert (a[lay.strip_top:lay.strip_top + 28, 110:138] == 0).all()
    assert (a[lay.strip_top:lay.strip_top + 28, 140:168] == 10).all()


def test_timelines_from_a_synthetic_video_and_prediction_files(tmp_path):
    from mmgrpo.vlm.synthetic.tvg import generate
    from mmgrpo.video.clip import load_video

    g = generate(tmp_path / "syn", n_train=0, n_eval=2, seed=0)
    anns = [json.loads(x) for x in Path(g["eval"]).read_text().splitlines()]
    a0 = anns[0]
    before, after = tmp_path / "b.jsonl", tmp_path / "a.jsonl"
    before.write_text("".join(json.dumps({"id": a["id"], "output": "no answer"}) + "\n" for a in anns))
    after.write_text("".join(json.dumps({"id": a["id"], "output": "<answer>1.50 to 4.00</answer>"}) + "\n"
                             for a in anns))
    video = {"fps": 2.0, "max_frames": 16, "min_pixels": 3136, "max_pixels": 4704}
    out = tl.tvg_timelines(g["eval"], {"before": before, "after": after}, tmp_path / "t.png", video, n=1)
    img = Image.open(out).convert("RGB")
    D = a0["duration"]
    (s, e), = a0["spans"]
    clip = load_video(str(tmp_path / "syn" / a0["video"]), **video)  # the frames the model gets
    frames = [f.numpy() for f in clip.frames]
    _, lay = tl.draw_panel(frames, clip.timestamps, D, "", (s, e), {"before": None, "after": (1.5, 4.0)})
    # the axis is as wide as the frame strip (thumbnails + 2 px gaps), so a bar sits under the frames it covers
    k0 = max(1, tl.THUMB_H // frames[0].shape[0])
    W = max(480, sum(f.shape[1] * k0 + 2 for f in frames) - 2)
    assert lay.width == W and W > 480  # 16 frames of 56 px: wider than the minimum axis
    for top, colour, (s0, e0) in [(lay.bar_top[0], tl.GT_COLOUR, (s, e)), (lay.bar_top[2], tl.PRED_COLOURS[1], (1.5, 4.0))]:
        cols = _cols(img, top, colour)
        assert cols.min() == 110 + round(s0 / D * W) and cols.max() == 110 + round(e0 / D * W) - 1
    # frame j starts at 110 + j * (w + 2); its time t_j = j * D / n maps within one thumbnail of that column
    n, w = len(frames), frames[0].shape[1] * k0
    for j, t in enumerate(clip.timestamps):
        assert abs(tl.x_of(t, D, width=W) - (110 + j * (w + 2))) <= w
    assert len(_cols(img, lay.bar_top[1], tl.PRED_COLOURS[0])) == 0  # "no answer" does not parse
    # the strip shows the frames the model gets: load_video with the same settings, first frame pixel for pixel
    f0 = frames[0]
    k = max(1, tl.THUMB_H // f0.shape[0])
    f0 = np.repeat(np.repeat(f0, k, 0), k, 1)
    a = np.asarray(img)
    assert (a[lay.strip_top:lay.strip_top + f0.shape[0], 110:110 + f0.shape[1]] == f0).all()
