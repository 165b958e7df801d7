"""Two processes (gloo, CPU) == one process, with a group split across the processes -- runs by default.

One launch of two forked worker processes (fork: the ~15 s torch/transformers import is not paid again on the
loaded 2-core machine) trains the same 3-prompt x G=4 global batch (12 rows -> 6 per process, so prompt 1's group
is split 2 + 2) two ways:

* ``manual``: the trainer sums gradients itself (``run.grad_sync=manual``, the default without FSDP / DeepSpeed);
* ``fsdp2``: ``accelerator.prepare`` + forwards through the prepared module + ``accelerator.backward`` +
  ``no_sync`` + ``accelerator.clip_grad_norm_`` with the parameters sharded by FSDP2 (accelerate refuses FSDP
  without GPUs, so the worker sets the FSDP2 plugin on accelerate's state by hand -- the only CPU stand-in
  available; the trainer code is the one a GPU run takes); it also checkpoints through ``accelerator.save_state``
  after step 1 and resumes from it in a new trainer for step 2.  (``run.grad_sync=accelerate`` on plain DDP takes
  the same prepared path minus sharding; not run here to stay within the time budget.)

Each must end with the weights (and, where the weights are replicated, identically on both processes) of one
process training the same global batch with the same seeds: global loss normalisers, summed gradients, gathered
advantages.  DeepSpeed is not installed here: its branch is wired through the same prepare path but unverified.
"""
import json
import os
import signal
import socket
import sys
import time

import pytest
import torch

ARGS = ["run.prompts_per_step=3", "rollout.group_size=4", "rollout.max_new_tokens=4", "run.max_steps=2",
        "run.micro_batch_size=8", "data.task=mcq", "optim.max_grad_norm=1.0", "model.freeze_vision=true"]
RUNS = {"manual": ["run.grad_sync=manual", "run.max_steps=1"], "fsdp2": []}  # fsdp2: step 1, resume, step 2


def _worker(rank, port, model, root, th):
    # OMP_NUM_THREADS=1: otherwise accelerate raises the thread count of this forked child, and an OpenMP team
    # inherited from the parent deadlocks the first parallel op (libgomp is not fork-safe)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
                      LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    from accelerate.state import AcceleratorState, GradientState

    from mmgrpo.vlm.train.trainer import GRPOTrainer

    AcceleratorState._reset_state(reset_partial_state=True)  # the parent's single-process state
    GradientState._reset_state()

    def trainer(name, *extra):
        return GRPOTrainer(th.make_cfg(root / name, model, *ARGS, *RUNS[name], *extra),
                           samples=th.image_samples(3), reward_fn=th.text_reward)

    for name in RUNS:
        if name == "fsdp2":
            from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

            import accelerate

            plugin = FullyShardedDataParallelPlugin(
                fsdp_version=2, auto_wrap_policy="transformer_based_wrap", reshard_after_forward=True,
                cpu_ram_efficient_loading=False, state_dict_type="SHARDED_STATE_DICT")
            init = accelerate.Accelerator.__init__

            def fsdp_init(self, *a, **k):  # what Accelerator() sets up under `accelerate launch --use_fsdp`
                init(self, *a, **k)
                from accelerate.state import PartialState

                PartialState().distributed_type = DistributedType.FSDP  # AcceleratorState re-reads it
                self.state.distributed_type = DistributedType.FSDP
                self.state.fsdp_plugin = plugin

            accelerate.Accelerator.__init__ = fsdp_init
            tr = trainer(name, "run.max_steps=1")
            assert tr.grad_sync == "accelerate" and tr.sharded and tr.logprob_impl == "naive"
            tr.train()  # step 1, then a checkpoint via accelerator.save_state (sharded)
            tr = trainer(name, "run.resume_from=auto")
            tr.train()  # resumes from the sharded checkpoint, step 2
            assert tr.state.step == 2
            sd = tr.accelerator.get_state_dict(tr.model)
            names = {n for n, p in tr.unwrapped.named_parameters() if p.requires_grad}
            w = {k: v for k, v in sd.items() if k in names}
        else:
            tr = trainer(name)
            tr.train()
            w = tr.policy.trainable_state_dict()
        torch.save({"w": w, "rows": tr.state.batch.n, "groups": tr.state.batch.group_ids.tolist()},
                   root / f"{name}-rank{rank}.pt")


def _fork(fn):
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fn()
            code = 0
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def test_two_processes_equal_one_process_with_split_group(tmp_path, tiny_dirs, th):
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    model = tiny_dirs("qwen2_5_vl")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pids = [_fork(lambda r=r: _worker(r, port, model, tmp_path, th)) for r in range(2)]
    try:
        # meanwhile: one process, the same global batch (3 prompts x 4) and seeds
        one = GRPOTrainer(th.make_cfg(tmp_path / "one", model, *ARGS, "run.save_every=1"),
                          samples=th.image_samples(3), reward_fn=th.text_reward)
        w0 = one.policy.trainable_state_dict()
        one.train()
        assert one.world == 1 and not one.split_groups and one.state.batch.n == 12
        refs = {2: one.policy.trainable_state_dict(),
                1: torch.load(tmp_path / "one" / "run" / "checkpoints" / "step-00000001" / "policy.pt")}
        t0, status = time.time(), {}
        while len(status) < 2 and time.time() - t0 < 400:
            for p in pids:
                if p not in status:
                    done, st = os.waitpid(p, os.WNOHANG)
                    if done:
                        status[p] = st
            time.sleep(0.05)
    finally:
        for p in pids:
            if p not in status:
                os.kill(p, signal.SIGKILL)
                os.waitpid(p, 0)
    assert all(os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0 for st in status.values()), status

    m1 = [json.loads(x) for x in (tmp_path / "one" / "run" / "metrics.jsonl").read_text().splitlines()]
    for name in RUNS:
        r0 = torch.load(tmp_path / f"{name}-rank0.pt")
        # rows 0-5 on rank 0 and 6-11 on rank 1: the second prompt's group (id 1 in step 1, 4 in step 2) is split
        r1 = torch.load(tmp_path / f"{name}-rank1.pt")
        steps = 1 if name == "manual" else 2
        ref = refs[steps]
        assert r0["rows"] == r1["rows"] == 6 and r0["groups"][-2:] == r1["groups"][:2] == [3 * steps - 2] * 2, name
        if name != "fsdp2":  # replicated weights: bit-identical on both processes
            assert all(torch.equal(r0["w"][k], r1["w"][k]) for k in r0["w"]), name
        assert r0["w"].keys() == ref.keys(), name
        # AdamW moves every weight by ~lr (0.01) in its first steps whatever the gradient's size, so a
        # float-summation difference in a ~0 gradient element shows up at up to ~1e-3 of the update; a wrong
        # gradient flips signs (errors ~1e-2).  The gradient scale (invisible to Adam) is checked by the norm below.
        for k in ref:
            torch.testing.assert_close(r0["w"][k], ref[k], atol=1e-4, rtol=0, msg=f"{name}: {k}")
        m2 = [json.loads(x) for x in (tmp_path / name / "run" / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in m2] == list(range(1, steps + 1)), name
        for a, b in zip(m1, m2):  # metrics reduced over processes; a split group is counted once
            assert a["data/groups"] == b["data/groups"] == 3, name
            assert b["train/grad_norm"] == pytest.approx(a["train/grad_norm"], rel=1e-5), name
            assert b["reward/acc/mean"] == pytest.approx(a["reward/acc/mean"], rel=1e-6), name
    assert max(float((refs[1][k] - w0[k]).abs().max()) for k in w0) > 1e-3  # it did train
