"""The VLM trainer's checkpoints (mmgrpo.engine.checkpoint, docs/checkpoints.md): checkpoints written by the code
before the one format -- replicated entries with rank 0's RNG inside ``trainer.pt`` (``run.grad_sync=manual``), and
``accelerator.save_state`` in ``accelerate/`` (``run.grad_sync=accelerate``) -- still resume, to exactly the state a
resume from the new format gives; and the skip-and-halt count survives a resume."""
import pytest
import torch

from mmgrpo.vlm.train.trainer import GRPOTrainer
from mmgrpo.utils.checkpoint import CheckpointManager, capture_rng_state
from mmgrpo.utils.config import config_to_dict

ARGS = ["model.freeze_vision=true", "run.save_every=1", "run.keep_last=5"]


def _old_save(tr, root):
    """The save of the code before the one format (kept here verbatim in substance, to write its checkpoints)."""
    import shutil

    mgr = CheckpointManager(root, keep_last=None, keep_best=False)
    extra = {}
    if tr.grad_sync == "accelerate":
        staging = root / f".staging-step-{tr.step:08d}"
        shutil.rmtree(staging, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
        tr.accelerator.save_state(str(staging))
        extra["accelerate"] = lambda p: staging.rename(p)
        opt = sch = {}
    else:
        opt, sch = tr.optimizer.state_dict(), tr.scheduler.state_dict()
    state = {"policy": tr.policy.trainable_state_dict(), "optimizer": opt, "scheduler": sch, "trainer": {
        "step": tr.step, "stream": tr.stream.state_dict(), "counters": dict(tr.counters),
        "consecutive_skips": tr.consecutive_skips, "rng": capture_rng_state(), "config": config_to_dict(tr.cfg),
        "world_size": tr.world, "reference": {"kind": "lora_disabled", "model_path": tr.cfg.model.path,
                                              "kl_coef": tr.cfg.algo.kl_coef},
        "selection": None, "budget": tr.budget.state_dict(), "methods": {}}}
    return mgr.save(tr.step, state, extra_files=extra)


def _state(tr):
    opt = tr.optimizer.state_dict()
    return tr.policy.trainable_state_dict(), opt["state"], tr.scheduler.state_dict(), tr.stream.state_dict()


def _assert_equal(a, b):
    (pa, oa, sa, da), (pb, ob, sb, db) = a, b
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)
    assert oa.keys() == ob.keys() and all(torch.equal(oa[i][k], ob[i][k]) for i in oa for k in oa[i])
    assert sa == sb and da == db


@pytest.mark.parametrize("grad_sync", ["manual", "accelerate"])
def test_checkpoints_of_the_earlier_formats_resume_exactly(tmp_path, tiny_dirs, th, grad_sync):
    model = tiny_dirs("qwen2_5_vl")
    args = [*ARGS, f"run.grad_sync={grad_sync}"]
    a = GRPOTrainer(th.make_cfg(tmp_path / "a", model, *args, "run.max_steps=1"), samples=th.image_samples(3),
                    reward_fn=th.text_reward)
    a.train()  # step 1, saved in the new format ...
    new = a.ckpt.latest_valid()
    old = _old_save(a, tmp_path / "old")  # ... and in the old one, from the same state
    assert (old / "accelerate").is_dir() == (grad_sync == "accelerate") and not (old / "rng.pt").exists()
    assert (new / "rng.pt").is_file() and not (new / "accelerate").exists()
    finals = []
    for name, path in (("from_new", new), ("from_old", old)):
        tr = GRPOTrainer(th.make_cfg(tmp_path / name, model, *args, "run.max_steps=2", f"run.resume_from={path}"),
                         samples=th.image_samples(3), reward_fn=th.text_reward)
        tr.train()
        assert tr.step == 2
        finals.append(_state(tr))
    _assert_equal(*finals)


def test_skip_state_is_checkpointed_and_resumed(tmp_path, tiny_dirs, th):
    """Skipped steps in a row count across a resume (mmgrpo.engine.checkpoint.SkipHalt, in trainer.pt)."""
    model = tiny_dirs("qwen2_5_vl")

    def nan_after_step_1(texts, samples):  # step 1 trains; steps 2 and 3 get NaN rewards -> skipped
        out = th.text_reward(texts, samples)
        if runs[-1].step >= 1:
            nan = torch.full((len(texts),), float("nan"))
            out = {**out, "acc": nan, "total": nan.clone()}
        return out

    runs = []
    args = [*ARGS, "run.max_consecutive_skips=3", "reward.on_nonfinite=drop"]
    runs.append(GRPOTrainer(th.make_cfg(tmp_path, model, *args, "run.max_steps=3"), samples=th.image_samples(3),
                            reward_fn=nan_after_step_1))
    tr = runs[-1]
    tr.train()
    assert tr.skips.consecutive == 2 and tr.consecutive_skips == 2 and tr.counters["skipped_steps"] == 2
    st = CheckpointManager(tmp_path / "run" / "checkpoints").load(tr.ckpt.latest_valid())
    assert st["trainer"]["consecutive_skips"] == 2 and st["trainer"]["last_skip_cause"] == tr.skips.last_cause
    runs.append(GRPOTrainer(th.make_cfg(tmp_path, model, *args, "run.max_steps=4", "run.resume_from=auto"),
                            samples=th.image_samples(3), reward_fn=nan_after_step_1))
    re = runs[-1]
    assert re.resume() and re.skips.consecutive == 2 and re.skips.last_cause == tr.skips.last_cause
    assert re.skips.skipped("x")  # the 3rd in a row (the 1st after the resume) reaches the limit
