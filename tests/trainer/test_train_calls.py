"""``train()`` called several times on one trainer object (the flow recipe's twin:
tests/flow_grpo/test_flow_train_calls.py): the first call resumes, later calls continue from the object's state (never
from the older checkpoint on disk), and a call after the run ended writes nothing. 4 tiny steps, 2 trainers (a few
CPU seconds): it also covers a resumed object trained by ``train(steps=n)``, whose end was computed before the resume
(it trained nothing)."""
from mmgrpo.vlm import checkpoint
from mmgrpo.vlm.train.trainer import GRPOTrainer



def _ckpts(root):
    return sorted((p.name, p.stat().st_mtime_ns) for p in (root / "run" / "checkpoints").glob("step-*"))


def test_train_resumes_once_per_object_and_continues(tmp_path, tiny_dirs, th, monkeypatch):
    model = tiny_dirs("qwen2_5_vl")
    first = GRPOTrainer(th.make_cfg(tmp_path, model, "run.max_steps=1"), samples=th.image_samples(3),
                        reward_fn=th.text_reward)
    first.train()  # step 1, checkpointed
    resumes = []
    real = checkpoint.resume
    tr = GRPOTrainer(th.make_cfg(tmp_path, model, "run.max_steps=3", "run.resume_from=auto"),
                     samples=th.image_samples(3), reward_fn=th.text_reward)
    monkeypatch.setattr(checkpoint, "resume", lambda *a: resumes.append(tr.state.step) or real(*a))
    assert len(tr.train(steps=1)) == 1 and tr.state.step == 2 and resumes == [0]  # resumed at 1, one step
    # the step-1 checkpoint is still the newest on disk: a second resume would undo step 2
    assert [n for n, _ in _ckpts(tmp_path)] == ["step-00000001"]
    assert len(tr.train(steps=1)) == 1 and tr.state.step == 3 and resumes == [0]
    done = _ckpts(tmp_path)
    assert [n for n, _ in done] == ["step-00000001", "step-00000003"]  # the final checkpoint
    # the run is over: another call takes no step and writes nothing
    assert tr.train() == [] and tr.state.step == 3 and _ckpts(tmp_path) == done and resumes == [0]
