"""`mmgrpo check` (issue #33 item 4): on every VLM recipe with its smoke data the ground truth written as the prompt
asks gets every weighted reward's maximum, the budget reaches the processor and a rebuilt prompt equals the rollout's;
and each kind of failure is caught: the old REC prompt against the vlm_r1 format rule, an image bound lost on the way
to the processor, a rebuilt prompt that differs from the rollout's."""
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts" / "experiments"))
import smoke  # noqa: E402

from mmgrpo.vlm.check import CheckError, check_main, check_samples, format_report, processor_task_adapter  # noqa: E402

VLM_RECIPES = sorted((REPO / "configs" / "vlm").glob("*.yaml"))


@pytest.fixture(autouse=True)
def _smoke_data(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SMOKE_DATA", str(tmp_path_factory.getbasetemp() / "smoke_data"))


def _setup(recipe: Path, *extra: str):
    from mmgrpo.vlm.data.task import load_samples
    from mmgrpo.vlm.rewards.registry import build_rewards

    cfg = smoke.load_recipe("vlm", str(recipe))
    cfg = smoke.load_recipe("vlm", str(recipe), smoke.vlm_train(cfg, Path("unused")) + list(extra))
    task, tok = processor_task_adapter(cfg.model.path, cfg.model.family, cfg.data)
    samples = load_samples(cfg.data.train_file, 0, cfg.data.media_root)
    reward_fn, _ = build_rewards(cfg.reward, cfg.data.task, task.adapter.family, tok, cfg.data.prompt_mode)
    return cfg, task, samples, reward_fn


@pytest.mark.parametrize("recipe", VLM_RECIPES, ids=lambda p: p.stem)
def test_every_recipe_passes_on_its_smoke_data(recipe):
    cfg, task, samples, reward_fn = _setup(recipe)
    n = 10 if smoke.video_r1_mix(cfg) else 2  # Video-R1's data mix: every one of the five types
    rep = check_samples(task, samples, reward_fn, n)
    assert rep.ok, format_report(rep)
    assert len(rep.samples) == n and all(s.n_visual > 0 and s.n_text > 0 for s in rep.samples)
    weighted = [k for k, w in cfg.reward.weights.items() if w and k != "length"]
    assert all(s.rewards[k] >= 0.95 for s in rep.samples for k in weighted)
    if smoke.video_r1_mix(cfg):
        kinds = {(x.meta or {}).get("problem_type", "multiple choice") for x in samples[:n]}
        assert kinds == {"multiple choice", "numerical", "OCR", "free-form", "regression"}


def test_the_old_rec_prompt_is_caught():
    """The project's REC prompt asks for [x1, y1, x2, y2]; VLM-R1's format rule pays only for a box inside braces."""
    cfg, task, samples, reward_fn = _setup(REPO / "configs/vlm/vlm_r1_refcoco.yaml", "data.prompt_template=mmgrpo")
    rep = check_samples(task, samples, reward_fn, 2)
    assert not rep.ok and all("format=0" in p and "contradict" in p for p in rep.problems), rep.problems
    with pytest.raises(CheckError, match="format=0"):
        rep.raise_if_failed()


def test_a_lost_image_bound_is_caught(monkeypatch):
    """data.image_max_pixels below the processor's own bound; the old TaskAdapter dropped a max without a min."""
    import numpy as np
    from PIL import Image

    from mmgrpo.vlm.data.task import TaskAdapter

    extra = ("data.image_min_pixels=0", "data.image_max_pixels=3136")  # 4 merged tokens of 28 x 28
    cfg, task, _, reward_fn = _setup(REPO / "configs/vlm/vlm_r1_refcoco.yaml", *extra)
    # 84 x 56 = 4704 pixels: the tiny processor's own maximum keeps it; 3136 makes smart_resize floor it to 56 x 28
    im = Image.fromarray(np.random.RandomState(0).randint(0, 255, (56, 84, 3), dtype=np.uint8))
    samples = [{"id": "big", "task": "rec", "query": "the square", "image": im, "boxes": [[10, 10, 60, 50]],
                "image_size": [84, 56]}]
    rep = check_samples(task, samples, reward_fn, 1)
    assert rep.ok and rep.samples[0].media["resized_size"] == [56, 28], format_report(rep)
    monkeypatch.setattr(TaskAdapter, "image_size_kwargs", lambda self: {})  # the budget never reaches it
    rep = check_samples(task, samples, reward_fn, 1)
    assert any("image_max_pixels=3136" in p and "did not reach" in p for p in rep.problems), rep.problems


def test_a_rebuilt_prompt_that_differs_from_the_rollout_is_caught(monkeypatch):
    import dataclasses

    from mmgrpo.vlm.data.task import TaskAdapter

    cfg, task, samples, reward_fn = _setup(REPO / "configs/vlm/time_r1_charades.yaml")

    def old_rebuild(self, prep, **kw):  # the old TaskAdapter.rebuild: the project template whatever the recipe
        from mmgrpo.vlm.data import build_messages
        from mmgrpo.video.processor import build_video_inputs
        from mmgrpo.vlm.data.task import _tensors

        text = self.processor.apply_chat_template(build_messages(prep.sample, mode=self.mode),
                                                  add_generation_prompt=True, tokenize=False)
        item = _tensors(build_video_inputs(self.processor, prep.clip, text, self.adapter.family))
        return dataclasses.replace(prep, item=item, text=text)

    monkeypatch.setattr(TaskAdapter, "rebuild", old_rebuild)
    rep = check_samples(task, samples, reward_fn, 1)
    assert any("differs from the rollout" in p for p in rep.problems), rep.problems


def test_cli_prints_what_the_model_sees_and_exits_1_on_a_contradiction(capsys):
    cfg = smoke.load_recipe("vlm", str(REPO / "configs/vlm/time_r1_charades.yaml"))
    ov = [x for x in smoke.vlm_train(cfg, Path("unused")) if x.split("=")[0].startswith(("model.", "data."))]
    assert check_main(["--config", "configs/vlm/time_r1_charades.yaml", "--samples", "1", *ov]) == 0
    out = capsys.readouterr().out
    assert "prompt template: time_r1_v1 -- xiaomi-research/time-r1" in out
    assert "prompt (as tokenised):" in out and "<|video_pad|>×" in out and "To accurately pinpoint" in out
    assert "frames (index, seconds): (0, 0)" in out and "check: OK" in out
    cfg = smoke.load_recipe("vlm", str(REPO / "configs/vlm/vlm_r1_refcoco.yaml"))
    ov = [x for x in smoke.vlm_train(cfg, Path("unused")) if x.split("=")[0].startswith(("model.", "data."))]
    assert check_main(["--config", "configs/vlm/vlm_r1_refcoco.yaml", "--samples", "1", "--quiet", *ov,
                       "data.prompt_template=mmgrpo"]) == 1
    assert "check: FAILED" in capsys.readouterr().out


def test_training_stops_before_step_1_on_a_contradiction(tmp_path):
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    cfg = smoke.load_recipe("vlm", str(REPO / "configs/vlm/vlm_r1_refcoco.yaml"))
    cfg = smoke.load_recipe("vlm", str(REPO / "configs/vlm/vlm_r1_refcoco.yaml"),
                            smoke.vlm_train(cfg, tmp_path / "run") + ["data.prompt_template=mmgrpo"])
    with pytest.raises(CheckError, match="contradict"):
        GRPOTrainer(cfg)


def test_evaluation_stops_before_generating_on_a_contradiction(tmp_path, monkeypatch, capsys):
    """eval/generate_vlm.py runs the same check before its first generation (issue #33 item 4): with a TaskAdapter
    whose rebuilt prompt is not the rollout's, it exits 1 naming the problem and writes no prediction."""
    import dataclasses

    import torch

    from eval import generate_vlm
    from mmgrpo.vlm.data.task import TaskAdapter

    cfg = smoke.load_recipe("vlm", str(REPO / "configs/vlm/time_r1_charades.yaml"))
    argv = ["--config", str(REPO / "eval/configs/charades_sta.yaml"), f"model={smoke.TINY_VLM}",
            *smoke.vlm_eval(cfg, tmp_path), "data.prompt_mode=think", "data.prompt_template=time_r1_eval",
            f"out_dir={tmp_path / 'eval'}"]
    real_rebuild = TaskAdapter.rebuild

    def other_rebuild(self, prep, **kw):  # the rollout's prompt with its first token repeated
        got = real_rebuild(self, prep, **kw)
        ids = got.item["input_ids"]
        return dataclasses.replace(got, item={**got.item, "input_ids": torch.cat([ids[:, :1], ids], dim=1)})

    monkeypatch.setattr(TaskAdapter, "rebuild", other_rebuild)
    assert generate_vlm.main(argv) == 1
    err = capsys.readouterr().err
    assert "error: mmgrpo check failed" in err and "differs from the rollout" in err, err
    assert not (tmp_path / "eval" / "predictions.jsonl").exists()


@pytest.mark.parametrize("recipe", VLM_RECIPES, ids=lambda p: p.stem)
def test_every_recipe_says_where_its_prompt_comes_from_and_is_in_the_docs_table(recipe):
    """Issue #33 items 2 and 'done when': each recipe's comments name its prompt template (and so its source, or
    why another release's prompt is used), and docs/experiments.md's "What the model sees" table has a row for it."""
    cfg = smoke.load_recipe("vlm", str(recipe))
    comments = "\n".join(ln.split("#", 1)[1] for ln in recipe.read_text().splitlines() if "#" in ln)
    assert "Prompt" in comments and cfg.data.prompt_template in comments, recipe.name
    docs = (REPO / "docs" / "experiments.md").read_text().split("## What the model sees", 1)[1].split("\n## ", 1)[0]
    row = next((ln for ln in docs.splitlines() if ln.startswith("|") and f"`{recipe.stem}`" in ln.split("|")[1]), None)
    assert row is not None, f"{recipe.stem} has no row in docs/experiments.md 'What the model sees'"
    assert f"`{cfg.data.prompt_template}`" in row or (cfg.data.prompt_template == "mmgrpo" and "`mmgrpo`" in row), row
