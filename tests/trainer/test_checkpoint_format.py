"""The VLM trainer's checkpoints (mmgrpo.engine.checkpoint, docs/checkpoints.md): the skip-and-halt count survives
a resume."""
import torch

from mmgrpo.utils.checkpoint import CheckpointManager
from mmgrpo.vlm.train.trainer import GRPOTrainer

ARGS = ["model.freeze_vision=true", "run.save_every=1", "run.keep_last=5"]


def test_skip_state_is_checkpointed_and_resumed(tmp_path, tiny_dirs, th):
    """Skipped steps in a row count across a resume (mmgrpo.engine.guard.SkipHalt, in trainer.pt)."""
    model = tiny_dirs("qwen2_5_vl")

    def nan_after_step_1(texts, samples):  # step 1 trains; steps 2 and 3 get NaN rewards -> skipped
        out = th.text_reward(texts, samples)
        if runs[-1].state.step >= 1:
            nan = torch.full((len(texts),), float("nan"))
            out = {**out, "acc": nan, "total": nan.clone()}
        return out

    runs = []
    args = [*ARGS, "run.max_consecutive_skips=3", "reward.on_nonfinite=drop"]
    runs.append(GRPOTrainer(th.make_cfg(tmp_path, model, *args, "run.max_steps=3"), samples=th.image_samples(3),
                            reward_fn=nan_after_step_1))
    tr = runs[-1]
    tr.train()
    assert tr.guard.skips.consecutive == 2 and tr.guard.consecutive_skips == 2 and tr.state.counters["skipped_steps"] == 2
    st = CheckpointManager(tmp_path / "run" / "checkpoints").load(tr.ckpt.latest_valid())
    assert st["trainer"]["consecutive_skips"] == 2 and st["trainer"]["last_skip_cause"] == tr.guard.skips.last_cause
    runs.append(GRPOTrainer(th.make_cfg(tmp_path, model, *args, "run.max_steps=4", "run.resume_from=auto"),
                            samples=th.image_samples(3), reward_fn=nan_after_step_1))
    re = runs[-1]
    assert re._start() and re.guard.skips.consecutive == 2 and re.guard.skips.last_cause == tr.guard.skips.last_cause
    assert re.guard.skips.skipped("x")  # the 3rd in a row (the 1st after the resume) reaches the limit
