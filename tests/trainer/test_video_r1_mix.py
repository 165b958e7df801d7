"""The Video-R1 recipe trains on its data mix (issue #33 item 3): one optimizer step of configs/vlm/video_r1_tgrpo.yaml
(T-GRPO, length bonus, Video-R1 parse mode) on the smoke data's five problem types, each prompt rendered with its
type's instruction and scored by its type's accuracy rule."""
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "experiments"))
import smoke  # noqa: E402


class _Recorder:
    """The trainer's reward function, recording which samples (and texts) it scored."""

    def __init__(self, fn):
        self.fn, self.seen = fn, []

    def __call__(self, completions, samples):
        self.seen += [(s.get("task"), (s.get("meta") or {}).get("problem_type", "multiple choice")) for s in samples]
        return self.fn(completions, samples)

    def __getattr__(self, name):
        return getattr(self.fn, name)


def test_one_step_on_the_five_problem_types(tmp_path, monkeypatch):
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    monkeypatch.setenv("SMOKE_DATA", str(tmp_path / "data"))
    recipe = str(REPO / "configs/vlm/video_r1_tgrpo.yaml")
    cfg = smoke.load_recipe("vlm", recipe)
    cfg = smoke.load_recipe("vlm", recipe, smoke.vlm_train(cfg, tmp_path / "run") + [
        "run.max_steps=1", "run.prompts_per_device=5", "data.shuffle=false", "rollout.group_size=2",
        "rollout.max_new_tokens=8", "run.micro_batch_size=4", "data.prefetch=0"])
    tr = GRPOTrainer(cfg)
    texts = [tr.task.prepare(tr.samples[i]).text for i in range(5)]
    assert "Please provide only the single option letter" in texts[0]
    assert "Please transcribe text from the image/video clearly" in texts[2]
    assert sum("Please provide the numerical value (e.g., 42 or 3.14)" in t for t in texts) == 2  # numerical, regr.
    rec = _Recorder(tr.scorer.reward_fn)
    tr.scorer.reward_fn = rec
    hist = tr.train()
    assert len(hist) == 1 and tr.state.step == 1
    assert {p for _, p in rec.seen} == {"multiple choice", "numerical", "OCR", "free-form", "regression"}
    assert {t for t, _ in rec.seen} == {"mcq", "qa"}
