"""Synthetic TVG benchmark: files decode, ground truth agrees with an independent PyAV + colour-threshold check,
generation is deterministic and the splits are disjoint."""
import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from mmgrpo.data import load_jsonl
from mmgrpo.data.synthetic_tvg import COLOURS, generate

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("syn")
    return out, generate(out, n_train=5, n_eval=3, seed=123, mcq=True)


def _decode_all(path):
    import av

    with av.open(str(path)) as c:
        s = c.streams.video[0]
        fps = float(s.average_rate)
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(s)]
    return np.stack(frames), fps


def _present(frames, rgb, min_pixels=20, tol=60.0):
    """Frames where at least ``min_pixels`` pixels lie within ``tol`` (Euclidean RGB) of the colour."""
    d = np.linalg.norm(frames.astype(np.float32) - np.asarray(rgb, np.float32), axis=-1)
    return (d < tol).reshape(len(frames), -1).sum(1) >= min_pixels


def test_ground_truth_matches_an_independent_decode(bench):
    out, res = bench
    samples, rep = load_jsonl(res["train"])
    eval_samples, _ = load_jsonl(res["eval"])
    assert rep.n_skipped == 0 and len(samples) == res["n_samples"]["train"] >= 5
    checked = 0
    for s in samples + eval_samples:
        frames, fps = _decode_all(s.video)
        assert len(frames) / fps == pytest.approx(s.duration)  # duration = decoded frames / fps
        colour = next(c for c in COLOURS if f" {c} " in f" {s.query} ")
        idx = np.flatnonzero(_present(frames, COLOURS[colour]))
        assert idx.size, f"{s.id}: the {colour} shape is never visible"
        # visible on one contiguous run of frames
        assert idx[-1] - idx[0] + 1 == idx.size, f"{s.id}: {colour} visibility is not contiguous"
        start, end = idx[0] / fps, (idx[-1] + 1) / fps
        (gs, ge), = s.spans
        assert abs(gs - start) <= 1 / fps + 1e-9 and abs(ge - end) <= 1 / fps + 1e-9, (s.id, (gs, ge), (start, end))
        # no other event's colour leaks into frames where this one is absent (palette is separable)
        checked += 1
    assert checked == res["n_samples"]["train"] + res["n_samples"]["eval"]


def test_video_properties_and_mcq(bench):
    out, res = bench
    samples, _ = load_jsonl(res["train"])
    for s in samples:
        m = s.meta
        assert 4.0 <= s.duration <= 12.0 + 1 / m["fps"] and 4.0 <= m["fps"] <= 10.0
        assert m["size"] in ([64, 64], [96, 64])
        assert s.spans[0][1] - s.spans[0][0] >= 1.0 - 1e-9
    mcq, _ = load_jsonl(res["train_mcq"])
    assert len(mcq) == len(samples)
    for q in mcq:
        assert q.options[ord(q.answer) - 65] == q.meta["colour"] and len(set(q.options)) == 4
        frames, _ = _decode_all(q.video)
        assert _present(frames, COLOURS[q.meta["colour"]]).any()


def test_deterministic_and_disjoint(bench, tmp_path):
    out, res = bench
    again = generate(tmp_path / "a", n_train=5, n_eval=3, seed=123, mcq=True)
    for key in ("train", "eval", "train_mcq", "eval_mcq"):
        assert Path(res[key]).read_text() == Path(again[key]).read_text()

    def digest(d):
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(d).glob("*.mp4"))}

    assert digest(res["videos"]) == digest(again["videos"])
    other = generate(tmp_path / "b", n_train=5, n_eval=0, seed=124)
    assert Path(other["train"]).read_text() != Path(res["train"]).read_text()
    # train and held-out: different videos, no shared (video content, query) pair
    tr = [json.loads(x) for x in Path(res["train"]).read_text().splitlines()]
    ev = [json.loads(x) for x in Path(res["eval"]).read_text().splitlines()]
    d = digest(res["videos"])
    tr_keys = {(d[Path(x["video"]).name], x["query"]) for x in tr}
    ev_keys = {(d[Path(x["video"]).name], x["query"]) for x in ev}
    assert not tr_keys & ev_keys
    assert not {Path(x["video"]).name for x in tr} & {Path(x["video"]).name for x in ev}


def test_cli_module_reexports(tmp_path):
    spec = importlib.util.spec_from_file_location("synthetic_tvg_cli", REPO / "data" / "synthetic_tvg.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.generate is generate
    assert mod.main([str(tmp_path / "c"), "--n-train", "1", "--n-eval", "1", "--seed", "5"]) == 0
    assert (tmp_path / "c" / "train.jsonl").exists() and (tmp_path / "c" / "info.json").exists()
