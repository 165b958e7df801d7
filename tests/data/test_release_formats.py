"""Converters on lines in the released formats (issue #23 items 7-9): Time-R1's TimeRFT clips, TempSamp-R1's
JSONL, Video-R1 JSON naming the media ``video``, VLM-R1's REC JSONL and ActivityNet Captions JSON."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmgrpo.vlm.data import DataError, load_jsonl
from mmgrpo.vlm.data import converters as C
from mmgrpo.vlm.rewards.tasks import temporal_window

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
    with pytest.raises(DataError, match=r"id='my\|internvid-vtime\|4jujhM5qhEc\|statue', field 'video_start': "
                                        r"need 0 <= video_start < video_end"):
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


# ------------------------------------------------------------------------------------------------ item 8: TempSamp-R1
_PROMPT = ('<video>To accurately pinpoint the event "{q}" in the video, determine the precise time period of the '
           'event. Provide the start and end times (in seconds, precise to two decimal places) in the format "start '
           'time to end time" within <answer> </answer> tags. For example: <answer> 12.5 to 17.8 </answer>.')
TEMPSAMP_LINES = [
    {"problem": _PROMPT.format(q="When is the 'lifehacker' title card shown?"),
     "answer": "<answer> 1.0 to 3.0 </answer>",
     "problem_type": "temporal grounding", "data_type": "video", "videos": ["video_shards/cosmo_cap/a7B504PYFLk.mp4"],
     "difficulty": 0.5, "duration": 57.53, "gt_len": 2.0},
    {"problem": _PROMPT.format(q="Locate the segment where two men play drums."),
     "solution": "<answer> 23.0 to 67.0 </answer>", "problem_type": "temporal grounding", "data_type": "video",
     "videos": ["video_shards/didemo/409_4049.mp4"], "duration": 70.07},
    {"problem": "<image>Where is the red car?", "answer": "<answer> (1, 2), (3, 4) </answer>",
     "problem_type": "grounding", "data_type": "image", "images": ["x.jpg"]},
]


def test_tempsamp_jsonl(tmp_path):
    src = tmp_path / "timelens_grpo_train.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in TEMPSAMP_LINES) + "\n")
    (a, b), rep = C.convert_tempsamp(src, video_dir="/data/TimeLens")
    assert rep.n_in == 3 and rep.skipped == {"unsupported_problem_type": 1}
    assert a.query == "When is the 'lifehacker' title card shown?" and a.spans == [[1.0, 3.0]]
    assert a.video == "/data/TimeLens/video_shards/cosmo_cap/a7B504PYFLk.mp4" and a.duration == 57.53
    assert a.meta["difficulty"] == 0.5 and a.meta["problem"] == TEMPSAMP_LINES[0]["problem"]
    assert b.query == "Locate the segment where two men play drums." and b.spans == [[23.0, 67.0]]
    # the whole prompt as the query, on request
    (a, _), _ = C.convert_tempsamp(src, query_from="problem")
    assert a.query.startswith("To accurately pinpoint the event") and "<video>" not in a.query
    # TimeLens' raw layout: messages[0].content and a bare "s to e"
    (c,), _ = C.convert_tempsamp([{"messages": [{"role": "user", "content": _PROMPT.format(q="a dog runs")}],
                                   "videos": ["v.mp4"], "solution": "7.0 to 11.0", "duration": 20.0}])
    assert c.query == "a dog runs" and c.spans == [[7.0, 11.0]]


def test_tempsamp_errors_name_record_and_field(tmp_path):
    line = dict(TEMPSAMP_LINES[0], problem="<video>Find it.")
    with pytest.raises(DataError, match=r"id='0', field 'problem': no quoted event"):
        C.convert_tempsamp([line])
    with pytest.raises(DataError, match=r"field 'videos'.*one video"):
        C.convert_tempsamp([dict(TEMPSAMP_LINES[0], videos=["a.mp4", "b.mp4"])])
    with pytest.raises(DataError, match=r"field 'duration'"):
        C.convert_tempsamp([{k: v for k, v in TEMPSAMP_LINES[0].items() if k != "duration"}])
    src = tmp_path / "t.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in TEMPSAMP_LINES) + "\n")
    r = _cli("tempsamp", src, tmp_path / "o.jsonl")
    assert r.returncode == 0, r.stderr
    assert "2 samples from 3 records; skipped unsupported_problem_type: 1" in r.stdout
    samples, _ = load_jsonl(tmp_path / "o.jsonl", check_media=False, resolve_paths=False)
    assert [s.spans for s in samples] == [[[1.0, 3.0]], [[23.0, 67.0]]]


def test_video_r1_style_json_naming_the_media_video():
    recs = [{"problem_id": 1, "problem": "What is he holding?", "data_type": "video", "problem_type": "multiple choice",
             "options": ["A. a cup", "B. a phone"], "solution": "<answer>B</answer>", "video": "clips/a.mp4"},
            {"problem_id": 2, "problem": "Which shape?", "data_type": "image", "problem_type": "multiple choice",
             "options": ["A. circle", "B. square"], "solution": "<answer>A</answer>", "path": "imgs/b.png"}]
    (a, b), rep = C.convert_video_r1(recs)
    assert rep.n_out == 2 and a.video == "clips/a.mp4" and a.answer == "B" and "video" not in a.meta
    assert b.image == "imgs/b.png"
    with pytest.raises(DataError, match=r"field 'path/video'"):
        C.convert_video_r1([{k: v for k, v in recs[0].items() if k != "video"}])


# ------------------------------------------------------------------------------------------------ item 9
# VLM-R1 REC JSONL (README "For your own data" layout; RefCOCO files: the gpt turn holds the box as JSON text)
VLMR1_REC = [
    {"id": 0, "image": "train2014/COCO_train2014_000000000001.jpg",
     "conversations": [{"from": "human", "value": "<image>the bowl on the left"},
                       {"from": "gpt", "value": "[10.5, 20.0, 60.25, 45.0]"}]},
    {"id": 1, "image": ["train2014/COCO_train2014_000000000002.jpg"],
     "conversations": [{"from": "human", "value": "<image>Please provide the bounding box coordinate of the region "
                                                   "this sentence describes: man in red."},
                       {"from": "gpt", "value": "<answer> [0, 0, 30, 30] </answer>"}]},
]


def test_refcoco_vlm_r1_jsonl(tmp_path):
    from PIL import Image

    (tmp_path / "coco" / "train2014").mkdir(parents=True)
    Image.new("RGB", (80, 50)).save(tmp_path / "coco" / "train2014" / "COCO_train2014_000000000001.jpg")
    Image.new("RGB", (40, 40)).save(tmp_path / "coco" / "train2014" / "COCO_train2014_000000000002.jpg")
    src = tmp_path / "refcoco_train.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in VLMR1_REC) + "\n")
    (a, b), rep = C.convert_refcoco(src, read_sizes_from=tmp_path / "coco")
    assert rep.n_out == 2
    assert a.to_dict() == {"id": "0", "task": "rec", "query": "the bowl on the left",
                           "image": "train2014/COCO_train2014_000000000001.jpg",
                           "boxes": [[10.5, 20.0, 60.25, 45.0]], "image_size": [80, 50], "spans": [],
                           "meta": {"source": "refcoco"}}
    assert b.query == "man in red." and b.boxes == [[0.0, 0.0, 30.0, 30.0]] and b.image_size == [40, 40]
    # bbox_2d JSON answers; a malformed box names the record and field
    (c,), _ = C.convert_refcoco([{"image": "x.jpg", "width": 9, "height": 9, "conversations": [
        {"from": "human", "value": "<image>dot"}, {"from": "gpt", "value": '{"bbox_2d": [1, 2, 3, 4]}'}]}])
    assert c.boxes == [[1.0, 2.0, 3.0, 4.0]]
    with pytest.raises(DataError, match=r"id='7', field 'bbox': box must be a JSON list"):
        C.convert_refcoco([{"id": 7, "image": "x.jpg", "width": 9, "height": 9, "conversations": [
            {"from": "human", "value": "<image>dot"}, {"from": "gpt", "value": "top left"}]}])
    # CLI wiring
    r = _cli("refcoco", src, tmp_path / "rec.jsonl", "--read-sizes-from", tmp_path / "coco", "--image-dir", "coco")
    assert r.returncode == 0, r.stderr
    samples, _ = load_jsonl(tmp_path / "rec.jsonl", check_media=False, resolve_paths=False)
    assert samples[0].image == os.path.join("coco", "train2014/COCO_train2014_000000000001.jpg")
    assert samples[1].boxes == [[0.0, 0.0, 30.0, 30.0]]


# ActivityNet Captions train.json / val_1.json layout (documented at cs.stanford.edu/people/ranjaykrishna/densevid):
# {video id: {duration, timestamps [[s, e], ...], sentences [...]}}, sentences often with a leading space
ANET = {"v_QOlSCBRmfWY": {"duration": 82.73, "timestamps": [[0.83, 19.86], [17.37, 60.81], [56.26, 79.42]],
                          "sentences": ["A young woman is seen standing in a room and leads into her dancing.",
                                        " The girl dances around the room while the camera captures her movements.",
                                        " She continues dancing around the room and ends by laying on the floor."]},
        "v_ehGHCYKzyZ8": {"duration": 61.72, "timestamps": [[0, 7.41], [7.41, 64.0]],
                          "sentences": ["A man stands with a bag.", " He walks to a car and loads the bag."]}}


def test_activitynet_captions_json(tmp_path):
    src = tmp_path / "val_1.json"
    src.write_text(json.dumps(ANET))
    samples, rep = C.convert_dense_captions(src, video_dir="anet/videos")
    assert rep.n_in == rep.n_out == 5 and rep.n_clamped == 1  # 64.0 > 61.72: clamped (within 5 s)
    s = samples[1]
    assert s.id == "v_QOlSCBRmfWY_1" and s.video == "anet/videos/v_QOlSCBRmfWY.mp4" and s.duration == 82.73
    assert s.query == "The girl dances around the room while the camera captures her movements."
    assert s.spans == [[17.37, 60.81]] and s.meta == {"source": "activitynet_captions", "video_id": "v_QOlSCBRmfWY",
                                                      "index": 1}
    assert samples[4].spans == [[7.41, 61.72]] and samples[4].meta["clamped_span"] == [[7.41, 64.0]]
    r = _cli("activitynet", src, tmp_path / "anet.jsonl", "--video-dir", "anet/videos")
    assert r.returncode == 0, r.stderr
    assert "5 samples from 5 records" in r.stdout and "1 span end(s) clamped" in r.stdout
    loaded, _ = load_jsonl(tmp_path / "anet.jsonl", check_media=False, resolve_paths=False)
    assert [x.to_dict() for x in loaded] == [x.to_dict() for x in samples]
