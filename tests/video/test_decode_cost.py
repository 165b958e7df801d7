"""The cheaper decode path (single-threaded decoder, ``data.decode_threads=1``; contiguous frames before the resize)
gives the same frames and model inputs as before, on a real H.264 mp4 with B-frames and a texture (the kind
``eval/perf/data_prefetch.py`` times), and the setting reaches the decoder."""
import numpy as np
import pytest
import torch

from mmgrpo.video import load_video

F2 = 28 * 28
KW = dict(fps=2.0, min_frames=4, max_frames=16, min_pixels=16 * F2, max_pixels=64 * F2, total_pixels=16 * 64 * F2)


@pytest.fixture(scope="module")
def textured_mp4(tmp_path_factory):
    """3 s at 30 fps, 320x180, libx264 crf 23 veryfast (B-frames, one GOP): noise texture scrolling sideways and a
    moving square, so a resize or colour-conversion difference shows up in many pixels."""
    av = pytest.importorskip("av")
    path = tmp_path_factory.mktemp("dec") / "textured.mp4"
    W, H, n = 320, 180, 90
    rng = np.random.default_rng(0)
    base = rng.integers(0, 200, (H, W + n, 3), dtype=np.uint8)
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=30)
        s.width, s.height, s.pix_fmt = W, H, "yuv420p"
        s.options = {"crf": "23", "preset": "veryfast", "threads": "1"}
        for i in range(n):
            f = np.ascontiguousarray(base[:, i:i + W])
            f[60:100, 3 * i:3 * i + 40] = (220, 40, 30)
            for pkt in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                c.mux(pkt)
        for pkt in s.encode():
            c.mux(pkt)
    return str(path)


class _Recorder:
    """Wraps decord.VideoReader, recording the ``num_threads`` each reader was opened with."""

    def __init__(self, real):
        self.real, self.threads = real, []

    def __call__(self, *a, **kw):
        self.threads.append(kw.get("num_threads", 0))
        return self.real(*a, **kw)


def test_frames_bit_identical_to_qwen_vl_utils_and_threads_reach_decord(textured_mp4, monkeypatch):
    decord = pytest.importorskip("decord")
    qvu = pytest.importorskip("qwen_vl_utils.vision_process")
    monkeypatch.setattr(qvu, "get_video_reader_backend", lambda: "decord")
    # the reference: qwen-vl-utils' own decord reader (FFmpeg's automatic threads) and its own resize
    (ref, meta), ref_fps = qvu.fetch_video({"video": textured_mp4, **KW}, return_video_sample_fps=True,
                                           return_video_metadata=True)
    rec = _Recorder(decord.VideoReader)
    monkeypatch.setattr(decord, "VideoReader", rec)
    for threads in (1, 0):
        clip = load_video(textured_mp4, backend="decord", decode_threads=threads, **KW)
        # 90 frames at 30 fps, 2 fps -> 6 frames at round(linspace(0, 89, 6)); timestamps = index / 30
        assert clip.frame_indices == [0, 18, 36, 53, 71, 89] == list(meta["frames_indices"])
        assert clip.timestamps == pytest.approx([i / 30 for i in (0, 18, 36, 53, 71, 89)], abs=1e-12)
        assert clip.sample_fps == pytest.approx(ref_fps, rel=1e-12)
        ours = clip.frames.permute(0, 3, 1, 2).float()
        assert tuple(ours.shape) == tuple(ref.shape)
        assert torch.equal(ours, ref), f"decode_threads={threads}: frames must be bit-identical to qwen-vl-utils'"
    assert rec.threads == [1, 0]


def test_pyav_single_thread_same_frames(textured_mp4):
    pytest.importorskip("av")
    a = load_video(textured_mp4, backend="pyav", decode_threads=1, **KW)
    b = load_video(textured_mp4, backend="pyav", decode_threads=0, **KW)
    assert a.frame_indices == b.frame_indices and torch.equal(a.frames, b.frames)


def test_trainer_task_same_model_inputs(textured_mp4, monkeypatch):
    """TaskAdapter.prepare with the default data.decode_threads=1 vs 0 (the decoder's automatic threads, the path
    before): the same input_ids / pixel_values_videos / video_grid_thw / second_per_grid_ts / timestamps."""
    decord = pytest.importorskip("decord")
    from mmgrpo.vlm.models import tiny
    from mmgrpo.vlm.config import DataConfig
    from mmgrpo.vlm.models.adapters import get_adapter
    from mmgrpo.vlm.data.task import TaskAdapter

    _, processor = tiny.build_tiny_model("qwen2_5_vl")
    assert DataConfig().decode_threads == 1
    rec = _Recorder(decord.VideoReader)
    monkeypatch.setattr(decord, "VideoReader", rec)
    sample = {"id": "t0", "task": "tvg", "query": "when does the square pass?", "video": textured_mp4,
              "duration": 3.0, "spans": [[1.0, 2.0]]}
    out = {}
    for threads in (1, 0):
        cfg = DataConfig(task="tvg", prompt_mode="no_think", video_fps=2.0, min_frames=4, max_frames=16,
                         video_min_pixels=16 * F2, video_max_pixels=64 * F2, video_total_pixels=16 * 64 * F2,
                         decode_threads=threads)
        out[threads] = TaskAdapter(processor, get_adapter("qwen2_5_vl"), cfg).prepare(sample)
    assert rec.threads == [1, 0]
    a, b = out[1], out[0]
    assert a.clip.timestamps == b.clip.timestamps == pytest.approx([i / 30 for i in (0, 18, 36, 53, 71, 89)])
    for k in ("input_ids", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts"):
        assert torch.equal(a.item[k], b.item[k]), k
    assert a.item["video_grid_thw"].tolist() == [[3, a.clip.height // 14, a.clip.width // 14]]


def test_negative_decode_threads_is_a_config_error():
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.utils.config import load_config

    with pytest.raises(ValueError, match="data.decode_threads must be >= 0"):
        load_config(TrainConfig, None, ["model.path=x", "data.decode_threads=-1"])
