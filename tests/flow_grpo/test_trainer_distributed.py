"""Several processes done right (CPU, gloo, 2 processes launched with torch.distributed.run; see _dist_worker.py).

One launch runs three cases (conftest.dist_case) while this process computes their 1-process references:
(a) after every training step the trainable weights are bit-identical on both processes (DDP), and every process
    holds its own shard of the same full weights (FSDP);
(b) 2 processes == 1 process with the same global batch and seeds, with groups split across the processes:
    final LoRA / full weights, EMA, and the logged reward / advantage / eval statistics of the gathered batch;
plus: NaN-dropped samples of a split group, Pref-GRPO win rates of split groups, resume from a sharded (FSDP)
checkpoint reproduces the weights bit for bit. Verified only on CPU (FSDP2 is forced on CPU in the worker).
"""
import json
import time

import pytest
import torch

from flow_grpo.config import load_train_config
from flow_grpo.train.trainer import FlowGRPOTrainer
from mmgrpo.utils.checkpoint import CheckpointManager

from .conftest import dist_case, make_adapter, start_dist_job


def _reference(case, out):
    ov, rewards = dist_case(case, out / case)
    tr = FlowGRPOTrainer(load_train_config(None, ov), adapter=make_adapter("flux", lora=False), reward_fn=rewards)
    hist = tr.train()
    tr.close()
    return tr, hist


def _close(a, b, rel, abs_):
    return a == pytest.approx(b, rel=rel, abs=abs_)


@pytest.mark.timeout(600)
def test_two_processes_equal_one_process_ddp_and_fsdp(tmp_path):
    job = start_dist_job()  # normally already running since collection
    refs = {case: _reference(case, tmp_path) for case in ("ddp", "win_rate", "fsdp")}
    try:
        rc = job["proc"].wait(timeout=max(30.0, 540 - (time.time() - job["t0"])))
    except Exception:
        rc = None
    log = (job["out"] / "launch.log").read_bytes().decode(errors="replace")
    assert rc == 0, log[-4000:]
    out = job["out"]
    res = [json.loads((out / f"result_r{r}.json").read_text()) for r in (0, 1)]
    dumps = out / "dumps"

    def load(name):
        return torch.load(dumps / name, weights_only=False)

    # ---------------------------------------------------------------- DDP (LoRA, NaN group split, KL, eval)
    tr, hist = refs["ddp"]
    assert res[0]["ddp"]["world"] == 2 and res[0]["ddp"]["type"] == "DistributedDataParallel"
    init = load("ddp_init_r0.pt")
    for e in (0, 1):
        w0, w1 = load(f"ddp_e{e}_r0.pt"), load(f"ddp_e{e}_r1.pt")
        assert all(torch.equal(w0[n], w1[n]) for n in w0), f"epoch {e}: processes hold different weights"  # (a)
        assert any(not torch.equal(w0[n], init[n]) for n in w0)
    final = load("ddp_e1_r0.pt")
    for n, p in tr.named_params:                                                                      # (b)
        torch.testing.assert_close(final[n], p.detach(), rtol=1e-4, atol=1e-7, msg=n)
    st = CheckpointManager(out / "ddp" / "checkpoints").load(out / "ddp" / "checkpoints" / "epoch-00000002")
    for s_dist, s_ref in zip(st["ema"]["shadow"], tr.ema.shadow):
        torch.testing.assert_close(s_dist, s_ref, rtol=1e-4, atol=1e-7)
    assert len(st["rng"]["per_rank"]) == 2 and st["trainer"]["world"] == 2
    # the group split across processes lost both members to NaN: both counts describe the gathered batch
    t0, t1 = load("ddp_traj_e0_r0.pt"), load("ddp_traj_e0_r1.pt")
    assert t0["gids"].tolist() == [0, 0, 1] and t1["gids"].tolist() == [1, 2, 2]
    assert t0["rewards"]["valid"].tolist() == [True, True, False] and t1["rewards"]["valid"].tolist()[0] is False
    for e, (hd, hr) in enumerate(zip(res[0]["ddp"]["history"], hist)):
        exact = e == 0  # epoch 0 sees bit-identical images; later epochs differ by float order in the weights
        for k in ("reward/total/mean", "reward/total/std", "reward/block/mean", "reward/invalid", "adv/groups_empty",
                  "adv/groups_singleton", "adv/mean_abs", "actual_batch_size", "train/ratio_mean", "train/kl",
                  "grad_norm", "eval/reward/total/mean", "eval/reward/block/mean"):
            assert _close(hd[k], hr[k], 1e-5 if exact else 1e-3, 1e-7 if exact else 1e-4), (e, k, hd[k], hr[k])
    assert res[0]["ddp"]["history"][0]["reward/invalid"] == 2 and res[0]["ddp"]["history"][0]["adv/groups_empty"] == 1

    # ---------------------------------------------------------------- win rates of groups split across processes
    tr, hist = refs["win_rate"]
    t0, t1 = load("win_rate_traj_e0_r0.pt"), load("win_rate_traj_e0_r1.pt")
    assert t0["gids"].tolist() == [0, 0, 0, 0, 1, 1] and t1["gids"].tolist() == [1, 1, 2, 2, 2, 2]
    wr = torch.cat([t0["rewards"]["total"], t1["rewards"]["total"]])
    assert torch.equal(wr, tr.state.last_traj.rewards["total"])
    final = load("win_rate_e0_r0.pt")
    assert all(torch.equal(final[n], load("win_rate_e0_r1.pt")[n]) for n in final)
    for n, p in tr.named_params:
        torch.testing.assert_close(final[n], p.detach(), rtol=1e-4, atol=1e-7, msg=n)

    # ---------------------------------------------------------------- FSDP2 full fine-tune (forced on CPU)
    tr, hist = refs["fsdp"]
    assert res[0]["fsdp"]["sharded"] and res[0]["fsdp"]["world"] == 2 and res[0]["fsdp"]["type"].startswith("FSDP")
    s0, s1 = load("fsdp_e1_r0.pt"), load("fsdp_e1_r1.pt")
    ref = dict(tr.named_params)
    n_sharded = 0
    for n in s0:
        full = torch.cat([s0[n], s1[n]]) if s0[n].shape != ref[n].shape else s0[n]
        n_sharded += s0[n].shape != ref[n].shape
        torch.testing.assert_close(full.reshape(ref[n].shape), ref[n].detach(), rtol=1e-4, atol=1e-6, msg=n)
    assert n_sharded > 0  # the processes really held different shards
    from safetensors.torch import load_file

    # the export gathered from the shards: the trained weights, and their EMA beside them (issue 32 item 1)
    exported = load_file(str(out / "fsdp" / "transformer_final" / "diffusion_pytorch_model.safetensors"))
    for n, p in tr.unwrapped.named_parameters():
        torch.testing.assert_close(exported[n], p.detach(), rtol=1e-4, atol=1e-6, msg=n)
    assert tr.ema.num_updates > 0
    exported = load_file(str(out / "fsdp" / "transformer_final_ema" / "diffusion_pytorch_model.safetensors"))
    with tr.ema.swapped_in():
        for n, p in tr.unwrapped.named_parameters():
            torch.testing.assert_close(exported[n], p.detach(), rtol=1e-4, atol=1e-6, msg=n)
    for k in ("reward/total/mean", "adv/mean_abs", "grad_norm", "actual_batch_size"):
        assert _close(res[0]["fsdp"]["history"][0][k], hist[0][k], 1e-5, 1e-7), k
    assert res[0]["fsdp"]["resume_equal"] and res[1]["fsdp"]["resume_equal"] and res[0]["fsdp"]["resume_ema_equal"]
    # the one checkpoint format (mmgrpo.engine.checkpoint): shards of weights, AdamW moments and EMA in state/ (DCP)
    ck = out / "fsdp" / "checkpoints" / "epoch-00000001"
    assert (ck / "state" / ".metadata").is_file() and not (ck / "shards").exists()
    # ... which one process resumes (unsharded): the weights the two processes held after the 1st epoch, bit for bit
    ov, rewards = dist_case("fsdp", tmp_path / "one")
    one = FlowGRPOTrainer(load_train_config(None, ov + [f"run.resume_from={ck}"]),
                          adapter=make_adapter("flux", lora=False), reward_fn=rewards)
    assert one.resume() == ck and one.state.epoch == 1 and not one.sharded
    e0 = load("fsdp_e0_r0.pt"), load("fsdp_e0_r1.pt")  # dumped at the end of epoch index 0 = checkpoint 1
    for n, p in one.named_params:
        full = torch.cat([e0[0][n], e0[1][n]]) if e0[0][n].shape != p.shape else e0[0][n]
        assert torch.equal(full.reshape(p.shape), p.detach()), n
    one.close()
