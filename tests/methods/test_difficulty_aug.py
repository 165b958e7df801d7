"""DeepVideo-R1 difficulty-aware augmentation: window statistic, plan, frame perturbations and hints."""
import pytest
import torch

from mmgrpo.vlm.methods.difficulty_aug import (AugPlan, DifficultyWindow, add_frame_noise, coarse_span_hint, drop_frames,
                                           elimination_hint, mask_frames, plan_augmentation, reasoning_hint)


def test_window_difficulty_and_state():
    w = DifficultyWindow(window=2)
    assert w.difficulty(torch.tensor([0.9])).tolist() == [0.0]  # no history: no augmentation
    w.push(torch.tensor([0.0, 1.0]))  # mean 0.5
    w.push(torch.tensor([0.2, float("nan")]))  # mean 0.2 (NaN dropped)
    assert w.mean() == pytest.approx(0.35)
    w.push(torch.tensor([0.8]))  # window 2: (0.2 + 0.8) / 2
    assert w.difficulty(torch.tensor([0.9, 0.1])).tolist() == pytest.approx([0.4, -0.4])
    w2 = DifficultyWindow()
    w2.load_state_dict(w.state_dict())
    assert w2.mean() == w.mean() and w2.window == 2


def test_plan_by_hand():
    plans = plan_augmentation(torch.tensor([0.3, -0.05, -0.8, 0.1], dtype=torch.float64), threshold=0.1, scale=0.5)
    assert plans == [AugPlan("harden", pytest.approx(0.6)), AugPlan("none", 0.0), AugPlan("ease", 1.0),
                     AugPlan("none", 0.0)]


def test_mask_frames_keeps_time_axis_and_is_seeded():
    g = torch.Generator().manual_seed(0)
    fr = torch.randint(0, 256, (8, 4, 4, 3), dtype=torch.uint8, generator=g)
    out, m = mask_frames(fr, 0.25, torch.Generator().manual_seed(1))
    assert out.shape == fr.shape and out.dtype == torch.uint8 and int(m.sum()) == 2
    fill = fr.float().mean(dim=(0, 1, 2)).round().to(torch.uint8)
    assert (out[m] == fill).all() and torch.equal(out[~m], fr[~m])
    out2, m2 = mask_frames(fr, 0.25, torch.Generator().manual_seed(1))
    assert torch.equal(out, out2) and torch.equal(m, m2)
    _, m_all = mask_frames(fr, 1.0, torch.Generator().manual_seed(1))
    assert int(m_all.sum()) == 7  # one frame always kept


def test_noise_std_and_clamp():
    fr = torch.full((4, 16, 16, 3), 128.0)
    out = add_frame_noise(fr, 10.0, torch.Generator().manual_seed(0))
    assert (out - fr).std().item() == pytest.approx(10.0, rel=0.1)
    u8 = add_frame_noise(torch.full((2, 8, 8, 3), 250, dtype=torch.uint8), 50.0, torch.Generator().manual_seed(0))
    assert u8.dtype == torch.uint8 and int(u8.max()) == 255


def test_drop_frames_even_and_ordered():
    fr = torch.arange(10).view(10, 1, 1, 1).expand(10, 1, 1, 3).float()
    out, idx = drop_frames(fr, 0.5, torch.Generator().manual_seed(0))
    assert len(idx) % 2 == 0 and len(idx) == 4 and (idx[1:] > idx[:-1]).all()
    assert torch.equal(out[:, 0, 0, 0], idx.float())


def test_hints():
    txt = "<think>one two three four five six seven eight</think><answer>(B)</answer>"
    assert reasoning_hint(txt, 0.5) == "one two three four"
    assert reasoning_hint(txt, 0.0) == ""
    assert "answer" not in reasoning_hint("a b c <answer>(B)</answer>", 1.0)
    assert reasoning_hint("a b c <answer>(B)</answer>", 1.0) == "a b c"
    for seed in range(5):
        e = elimination_hint(["w", "x", "y", "z"], ["B"], 5, torch.Generator().manual_seed(seed))
        assert "B" not in e and len(e) == 2  # never the answer, one wrong option left
    for seed in range(20):
        lo, hi = coarse_span_hint((3.0, 4.0), 10.0, torch.Generator().manual_seed(seed))
        assert hi - lo == pytest.approx(5.0) and 0.0 <= lo <= 3.0 and 4.0 <= hi <= 10.0  # holds the span
    starts = {round(coarse_span_hint((3.0, 4.0), 10.0, torch.Generator().manual_seed(s))[0], 6) for s in range(20)}
    assert len(starts) > 10  # not aligned to the answer
    assert coarse_span_hint((1.0, 9.0), 10.0, torch.Generator().manual_seed(0)) == (0.0, 10.0)  # long span: all
    lo, hi = coarse_span_hint((2.0, 5.0), 10.0, torch.Generator().manual_seed(0))  # 3 s span: a 6 s window
    assert hi - lo == pytest.approx(6.0) and lo <= 2.0 and hi >= 5.0
    lo, hi = coarse_span_hint((8.0, 9.5), 10.0, torch.Generator().manual_seed(0))
    assert 4.5 <= lo <= 5.0 and hi == pytest.approx(lo + 5.0)
