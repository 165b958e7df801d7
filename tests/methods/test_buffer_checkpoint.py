"""The buffers of the replay methods (Prompt Replay's prompts, the selective sample buffer's groups, ReLIFT's
hardest prompts) go into checkpoints: a run interrupted with a non-empty buffer and resumed ends with the same
weights, bit for bit, as the same run uninterrupted (without the buffer in the checkpoint the resumed run replays
nothing at its first step and the weights differ)."""
import dataclasses

import pytest
import torch

from mmgrpo.utils.checkpoint import CheckpointManager
from mmgrpo.vlm.data.batch import RolloutBatch
from mmgrpo.vlm.data.buffer_state import TENSOR_FIELDS


def test_every_batch_field_is_written():
    written = set(TENSOR_FIELDS) | {"texts", "rewards", "info", "prompts", "items", "samples"}
    assert {f.name for f in dataclasses.fields(RolloutBatch)} == written


def _step_reward(th, first_step, kind):
    """A deterministic reward of (step, sample, text); ``first_step``: the step of this trainer's first call (a
    resumed trainer starts at the checkpoint's), so the interrupted and the straight run see the same rewards."""
    step = [first_step]

    def reward(texts, samples):
        out = th.text_reward(texts, samples)  # varies within a group
        s = step[0]
        step[0] += 1
        if kind == "sample_buffer" and s >= 1:  # from step 2 on every answer scores the same: zero advantages
            out["acc"] = torch.full_like(out["acc"], 0.5)
        if kind == "relift":  # i0 fails every answer at step 1, i1 at step 2: the buffer holds i0 in between
            hard = torch.tensor([x["id"] == ("i0" if s == 0 else "i1") for x in samples])
            out["acc"] = torch.where(hard, torch.zeros_like(out["acc"]), 0.5 + out["acc"] / 2)
        out["total"] = out["acc"].clone()
        return out

    return reward


CASES = {  # method -> (its options, the metric that shows the buffer used at step 2, samples)
    # 4 samples: step 2 draws the two that step 1 did not, so step 1's are replayable
    "prompt_replay": (["methods.prompt_replay.fraction=0.5", "methods.prompt_replay.cooldown=0"],
                      "prompt_replay/replayed", 4),
    "sample_buffer": (["methods.sample_buffer.max_share=1.0"], "sample_buffer/replayed", 2),
    "relift": (["methods.relift.sft_batch=2", "methods.relift.sft_coef=0.5"], "relift/sft_rows", 2),
}


@pytest.mark.parametrize("method", list(CASES))
def test_resume_with_a_full_buffer_is_exact(tmp_path, tiny_dirs, th, method):
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    opts, used, n = CASES[method]

    def trainer(folder, steps, first_step, *more):
        cfg = th.make_cfg(tmp_path / folder, tiny_dirs("qwen2_5_vl"), f"run.max_steps={steps}",
                          "reward.accuracy_key=acc", "data.check_samples=0", f"methods.{method}.enabled=true",
                          *opts, *more)
        return GRPOTrainer(cfg, samples=th.image_samples(n), reward_fn=_step_reward(th, first_step, method))

    straight = trainer("a", 2, 0)
    hist = straight.train()
    assert hist[1][used] > 0  # step 2 draws on the buffer
    trainer("b", 1, 0).train()  # the same run stopped after step 1 (its final checkpoint)
    ckpts = CheckpointManager(tmp_path / "b" / "run" / "checkpoints")
    saved = ckpts.load(ckpts.resolve("auto"))["trainer"]["methods_per_process"]
    assert saved["world"] == 1
    state = saved["per_rank"][0][method]
    assert len(state.get("entries", state.get("buffer"))) > 0  # the buffer was not empty at the checkpoint
    resumed = trainer("b", 2, 1, "run.resume_from=auto")
    hist_r = resumed.train()
    assert resumed.state.step == 2 and hist_r[0][used] == hist[1][used]
    a, b = straight.policy.trainable_state_dict(), resumed.policy.trainable_state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = straight.state.batch, resumed.state.batch  # the last step's batch, replayed rows included
    assert sa.texts == sb.texts and torch.equal(sa.advantages, sb.advantages)


class _Local:
    """A method with a per-process state (what the trainer's checkpointing sees of it)."""
    name, state_per_process = "buf", True

    def __init__(self, sd=None):
        self.sd, self.loaded = sd, None

    def state_dict(self):
        return self.sd

    def load_state_dict(self, sd):
        self.loaded = sd


def test_per_process_states_are_gathered_and_each_process_resumes_its_own(monkeypatch, caplog):
    from types import SimpleNamespace

    from mmgrpo.engine import dist
    from mmgrpo.vlm import checkpoint

    # two processes' buffers, as all_gather_object returns them on either process
    monkeypatch.setattr(dist, "all_gather_object", lambda obj: [{"buf": {"entries": [0]}}, obj])
    saved = checkpoint.gather_local_states([_Local({"entries": [1, 2]})])
    assert saved == {"per_rank": [{"buf": {"entries": [0]}}, {"buf": {"entries": [1, 2]}}], "world": 2}
    for rank in (0, 1):
        m = _Local()
        checkpoint._load_local_states([m], saved, SimpleNamespace(world=2, rank=rank))
        assert m.loaded == saved["per_rank"][rank]["buf"]
    m = _Local()  # another process count: the buffers start empty, logged
    checkpoint._load_local_states([m], saved, SimpleNamespace(world=3, rank=0))
    assert m.loaded is None and "start empty" in caplog.text


def test_a_stop_inside_the_rollout_rolls_the_buffer_back(tmp_path, tiny_dirs, th, monkeypatch):
    """A stop requested while step 2 collects its rollouts abandons the step: its checkpoint (step 1) must hold the
    buffer as step 1 left it, not with step 2's replays and prompts, so the resumed run equals the straight one."""
    import mmgrpo.vlm.train.trainer as tm
    from mmgrpo.engine.errors import TrainingStopped
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    opts, used, n = CASES["prompt_replay"]

    def trainer(folder, first_step, *more):
        cfg = th.make_cfg(tmp_path / folder, tiny_dirs("qwen2_5_vl"), "run.max_steps=2", "reward.accuracy_key=acc",
                          "data.check_samples=0", "methods.prompt_replay.enabled=true", *opts, *more)
        return GRPOTrainer(cfg, samples=th.image_samples(n), reward_fn=_step_reward(th, first_step, "prompt_replay"))

    straight = trainer("a", 0)
    assert straight.train()[1][used] > 0
    stopped = trainer("b", 0)
    collect = tm.collect

    def collect_then_stop(run, step):
        rb = collect(run, step)
        if step == 1:  # step 2's rollouts are in (its prompts replayed, its groups in the buffer)
            run.guard.request_stop("test")
        return rb

    monkeypatch.setattr(tm, "collect", collect_then_stop)
    with pytest.raises(TrainingStopped):
        stopped.train()
    monkeypatch.setattr(tm, "collect", collect)
    assert stopped.state.step == 1
    resumed = trainer("b", 1, "run.resume_from=auto")
    resumed.train()
    a, b = straight.policy.trainable_state_dict(), resumed.policy.trainable_state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
