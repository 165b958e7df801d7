"""Converters on lines in the released formats (issue #23 items 7-9): Time-R1's TimeRFT clips, TempSamp-R1's
JSONL, Video-R1 JSON naming the media ``video``, VLM-R1's REC JSONL and ActivityNet Captions JSON."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmgrpo.data import DataError, load_jsonl
from mmgrpo.data import converters as C
from mmgrpo.rewards.tasks import temporal_window

REPO = Path(__file__).resolve().parents[2]

# TimeRFT (train_2k5.json) clipped item, as released: the clip's place on the source timeline in the file name
# and video_start/video_end; duration = clip length; timestamp relative to the clip
TIMERFT_CLIP = {"video": "./dataset/timer1/videos/timerft_data/4jujhM5qhEc_00:00:39:000_00:01:24:700.mp4",
                "duration": 45.7, "timestamp": [34.9, 41.9], "sentence": "a bronze rider statue with birds on it",
                "qid": "my|internvid-vtime|4jujhM5qhEc|statue", "video_start": 39.0, "video_end": 84.7,
                "difficulty": 41.0, "pred": [37.82, 44.84]}
TIMERFT_FULL = {"video": "./dataset/timer1/videos/timerft_data/74MOEiIM4qg.mp4", "duration": 80.0,
                "timestamp": [0.0, 49.7], "sentence": "two hands hold a sheet of paper", "qid": "my|x|74MOEiIM4qg|h",
                "video_start": 0.0, "video_end": 80.0, "difficulty": 10.0, "pred": [0.0, 5.0]}


def _cli(*args):
    return subprocess.run([sys.executable, str(REPO / "data" / "convert.py"), *map(str, args)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)


# ------------------------------------------------------------------------------------------------ item 7: TimeRFT
def test_timerft_clip_is_the_file_and_timestamps_are_clip_times():
    (s, f), rep = C.convert_time_r1([TIMERFT_CLIP, TIMERFT_FULL])
    assert rep.n_out == 2 and not rep.skipped  # was rejected: video_end 84.7 > duration 45.7
    assert s.spans == [[34.9, 41.9]] and s.duration == 45.7  # not shifted: the release trains on these numbers
    assert s.video_start is None and s.video_end is None  # the whole clip file is the video
    assert (s.meta["source_start"], s.meta["source_end"]) == (39.0, 84.7)
    # the reward's window is the whole clip: a prediction of "34.9 to 41.9" (clip time, as the release's GT) is exact
    assert temporal_window(s.to_dict()) == (0.0, 45.7, 0.0)
    assert f.spans == [[0.0, 49.7]] and f.video_start is None and f.meta["source_end"] == 80.0


def test_timerft_source_videos_crop_and_shift():
    (s,), _ = C.convert_time_r1([TIMERFT_CLIP], timerft_videos="source")
    assert (s.video_start, s.video_end) == (39.0, 84.7)
    assert s.spans == [pytest.approx([73.9, 80.9])]  # 39.0 + [34.9, 41.9], on the source timeline
    assert s.duration == pytest.approx(84.7)
    lo, hi, off = temporal_window(s.to_dict())  # the model sees [39, 84.7]; its clip times get +39
    assert (lo, hi, off) == (39.0, pytest.approx(84.7), 39.0)
    with pytest.raises(ValueError, match="timerft_videos"):
        C.convert_time_r1([TIMERFT_CLIP], timerft_videos="both")


def test_timerft_bad_clip_bounds_name_the_field():
    bad = dict(TIMERFT_CLIP, video_start=90.0)
    with pytest.raises(DataError, match=r"id='my\|internvid-vtime\|4jujhM5qhEc\|statue', field 'video_start'.*video_start < video_end"):
        C.convert_time_r1([bad])


def test_timerft_cli(tmp_path):
    src = tmp_path / "train_2k5.json"
    src.write_text(json.dumps([TIMERFT_CLIP, TIMERFT_FULL]))
    r = _cli("time_r1", src, tmp_path / "a.jsonl")
    assert r.returncode == 0, r.stderr
    (s, _), _ = load_jsonl(tmp_path / "a.jsonl", check_media=False, resolve_paths=False)
    assert s.spans == [[34.9, 41.9]] and s.video_start is None
    r = _cli("time_r1", src, tmp_path / "b.jsonl", "--timerft-videos", "source")
    assert r.returncode == 0, r.stderr
    (s, _), _ = load_jsonl(tmp_path / "b.jsonl", check_media=False, resolve_paths=False)
    assert s.video_start == 39.0 and s.spans[0][0] == pytest.approx(73.9)
