"""Media checked when the data is loaded (issue 31, items 11-12; issue 32, item 4): a 24 kB PNG that claims 196
megapixels (Pillow's DecompressionBombError, not an OSError, used to end the run when its batch came up, and again on
every resume), a file that is not an image, a truncated PNG, a video whose header claims huge frames and an annotated
duration that disagrees with the video's are found before the model loads: skipped and counted, or one error listing
file:line, id and field, per the data config's policies (mmgrpo.vlm.data.media)."""
import json
import re
import time

import numpy as np
import pytest
from PIL import Image

from mmgrpo.utils.media_check import MediaProblem, inspect_image, inspect_video
from mmgrpo.vlm.config import DataConfig
from mmgrpo.vlm.data import DataError
from mmgrpo.vlm.data.media import MediaScreen, durations_disagree
from mmgrpo.vlm.data.task import MissingMediaError, TaskAdapter, load_samples


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    from mmgrpo.video import write_video

    d = tmp_path_factory.mktemp("media")
    Image.new("RGB", (40, 30), (10, 200, 30)).save(d / "good.png")
    Image.new("1", (14000, 14000)).save(d / "bomb.png", optimize=True)  # 196 MP in ~24 kB
    (d / "text.png").write_text("not an image\n")
    full = (d / "good.png").read_bytes()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8)).save(d / "big.png")
    big = (d / "big.png").read_bytes()
    (d / "trunc.png").write_bytes(big[: len(big) // 2])  # header intact, a chunk cut short
    frames = [np.full((32, 48, 3), 12 * k, np.uint8) for k in range(20)]
    write_video(str(d / "clip.mp4"), iter(frames), 10.0)  # 20 frames at 10 fps: 2.0 s
    # a header that claims 16000 x 9000 frames (144 MP) in a 1 kB file
    (d / "huge.y4m").write_bytes(b"YUV4MPEG2 W16000 H9000 F25:1 Ip A1:1 C420jpeg\nFRAME\n" + b"\x80" * 1000)
    assert len(full) < 1000 and (d / "bomb.png").stat().st_size < 30_000
    return d


def _mcq(sid, image):
    return {"id": sid, "task": "mcq", "query": "which colour?", "image": image, "options": ["red", "green"],
            "answer": "B"}


def _tvg(sid, video, duration, **kw):
    return {"id": sid, "task": "tvg", "query": "when?", "video": video, "duration": duration,
            "spans": [[0.2, 0.8]], **kw}


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_inspect_image_and_video(media):
    h = inspect_image(media / "good.png")
    assert (h.width, h.height, h.format) == (40, 30, "PNG")
    for name, kind, part in [("bomb.png", "too_large", "196000000 pixels"), ("text.png", "unreadable",
                                                                            "UnidentifiedImageError"),
                             ("trunc.png", "unreadable", "not a readable image"), ("nope.png", "missing",
                                                                                   "file not found")]:
        with pytest.raises(MediaProblem, match=re.escape(part)) as ei:
            inspect_image(media / name)
        assert ei.value.kind == kind and ei.value.path == str(media / name)
    with pytest.raises(MediaProblem, match=r"40x30 = 1,200 pixels exceeds the cap of 1,000"):
        inspect_image(media / "good.png", max_pixels=1000)
    head = inspect_video(media / "clip.mp4")
    assert (head.width, head.height, head.fps) == (48, 32, 10.0) and head.duration == pytest.approx(2.0, abs=0.11)
    with pytest.raises(MediaProblem, match=r"16000x9000 = 144,000,000 pixels exceed the decode cap") as ei:
        inspect_video(media / "huge.y4m")
    assert ei.value.kind == "too_large"
    with pytest.raises(MediaProblem) as ei:
        inspect_video(media / "text.png")
    assert ei.value.kind == "unreadable"


def test_durations_disagree_rule():
    # |d_a - d_v| > max(2 s, 5 % of d_v): the 100 s annotation on a 19.8 s video, and the edges
    assert durations_disagree(100.0, 19.8, 2.0, 0.05)
    assert not durations_disagree(21.8, 19.8, 2.0, 0.05) and durations_disagree(21.81, 19.8, 2.0, 0.05)
    assert not durations_disagree(126.0, 120.0, 2.0, 0.05) and durations_disagree(126.01, 120.0, 2.0, 0.05)
    assert not durations_disagree(10.0, 100.0, 2.0, 0.05, clipped=True)  # a clip's duration may be a lower bound
    assert durations_disagree(110.0, 100.0, 2.0, 0.05, clipped=True)


def test_loading_skips_and_counts_with_file_line_id_and_field(media, tmp_path):
    rows = [_mcq("ok_img", str(media / "good.png")), _mcq("bomb", str(media / "bomb.png")),
            _mcq("text", str(media / "text.png")), _mcq("trunc", str(media / "trunc.png")),
            _mcq("gone", str(media / "nope.png")), _tvg("ok_vid", str(media / "clip.mp4"), 2.0),
            _tvg("close", str(media / "clip.mp4"), 3.9), _tvg("long", str(media / "clip.mp4"), 100.0),
            _tvg("huge", str(media / "huge.y4m"), 1.0),
            _tvg("clip_short", str(media / "clip.mp4"), 1.5, video_start=0.0, video_end=1.0),
            _tvg("clip_long", str(media / "clip.mp4"), 9.0, video_start=0.0, video_end=1.0)]
    f = _write(tmp_path / "train.jsonl", rows)
    samples, rep = load_samples(f, screen=MediaScreen.from_config(DataConfig()), with_report=True)
    assert [s.id for s in samples] == ["ok_img", "ok_vid", "close", "clip_short"]
    assert rep.counts == {"media_too_large": 2, "unreadable_media": 2, "missing_media": 1, "duration_mismatch": 2}
    assert rep.n_dropped == 7 and rep.n_files == 7 and rep.n_samples == 11
    msg = {e.sample_id: str(e) for e in rep.problems}
    assert msg["bomb"].startswith(f"{f}:2, id='bomb', field 'image': image too large to open")
    assert msg["text"].startswith(f"{f}:3, id='text', field 'image': not a readable image")
    assert msg["long"].startswith(f"{f}:8, id='long', field 'duration': annotated duration 100 s but the video "
                                  "lasts 2.00 s")
    assert msg["huge"].startswith(f"{f}:9, id='huge', field 'video': frames of 16000x9000")
    assert msg["clip_long"].startswith(f"{f}:11, id='clip_long', field 'duration'")
    # warn keeps the mismatched samples (counted); error refuses the file, every problem listed in one message
    samples, rep = load_samples(f, screen=MediaScreen(on_duration_mismatch="warn"), with_report=True)
    assert [s.id for s in samples] == ["ok_img", "ok_vid", "close", "long", "clip_short", "clip_long"]
    assert rep.counts["duration_mismatch"] == 2 and rep.n_dropped == 5
    with pytest.raises(DataError) as ei:
        load_samples(f, screen=MediaScreen(on_missing_media="error"))
    text = str(ei.value)
    assert text.startswith(f"{f}:2, field 'image': 5 of 11 sample(s) refused by the media check")
    for sid, ln in [("bomb", 2), ("text", 3), ("trunc", 4), ("gone", 5), ("huge", 9)]:
        assert f"{f}:{ln}, id='{sid}'" in text
    with pytest.raises(DataError, match=r"(?s)1 of 1 sample\(s\) .*train1\.jsonl:1, id='long', field 'duration'"):
        load_samples(_write(tmp_path / "train1.jsonl", [rows[7]]), screen=MediaScreen(on_duration_mismatch="error"))
    # exists: the old check (only the missing file); nothing left: an error, not an empty run
    samples, rep = load_samples(f, screen=MediaScreen(check="exists"), with_report=True)
    assert len(samples) == 10 and rep.counts == {"missing_media": 1}
    with pytest.raises(DataError, match="no sample left after the media check"):
        load_samples(_write(tmp_path / "bad.jsonl", rows[1:3]), screen=MediaScreen())
    # eval keeps unusable media (their outputs are written as null) but still drops duration skips if asked
    samples, _ = load_samples(f, screen=MediaScreen(drop=False), with_report=True)
    assert len(samples) == 9


def test_the_check_costs_little_per_file(media, tmp_path):
    """The header check of 200 distinct small PNGs and a few videos stays far below decoding them."""
    for k in range(200):
        Image.new("RGB", (64, 48), (k, 0, 0)).save(tmp_path / f"{k}.png")
    rows = [_mcq(f"i{k}", str(tmp_path / f"{k}.png")) for k in range(200)]
    f = _write(tmp_path / "many.jsonl", rows)
    t0 = time.perf_counter()
    samples, rep = load_samples(f, screen=MediaScreen(), with_report=True)
    assert len(samples) == 200 and rep.n_files == 200 and not rep.counts
    assert time.perf_counter() - t0 < 20  # ~0.1-1 ms per file on an idle core; generous for a loaded machine


def test_run_time_image_errors_are_media_errors_not_crashes(media):
    """With media_check=exists (or a file replaced after loading) the bomb reaches the trainer's input path: a
    MissingMediaError (skipped and counted under data.on_missing_media), not DecompressionBombError."""
    ta = TaskAdapter(None, None, DataConfig(task="mcq"))
    with pytest.raises(MissingMediaError, match=r"sample bomb: cannot read image .*bomb\.png: DecompressionBombError"):
        ta._load_images(_mcq("bomb", str(media / "bomb.png")))
    with pytest.raises(MissingMediaError, match=r"sample text: cannot read image .*UnidentifiedImageError"):
        ta._load_images(_mcq("text", str(media / "text.png")))
    small = TaskAdapter(None, None, DataConfig(task="mcq", max_image_pixels=1000))
    with pytest.raises(MissingMediaError, match=r"40x30 pixels exceeds data\.max_image_pixels=1,000"):
        small._load_images(_mcq("ok", str(media / "good.png")))
    assert ta._load_images(_mcq("ok", str(media / "good.png")))[0].size == (40, 30)
