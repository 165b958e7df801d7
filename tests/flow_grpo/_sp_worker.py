"""Launched by test_sequence_parallel.py: ``python -m torch.distributed.run --nproc_per_node 2 _sp_worker.py OUT``
(CPU, gloo).

1. Model level: for each tiny video kind, every rank builds the same adapter with the same LoRA, computes a rollout
   step's velocity, its SDE log-prob and the LoRA gradient of a loss on them in one process (the reference), then
   shards the transformer(s) over both ranks (Ulysses) and computes them again; the gradients are summed over the
   group. Rank 0 writes the largest differences to OUT/result.json.
2. The trainer (conftest.sp_train_case; tiny Wan2.1, LoRA, 2 epochs), dumping the trainable weights, rollout
   log-probs / rewards and history to OUT/dumps: ``sp2`` (run.sequence_parallel=2: one group of 2, DDP over both),
   ``sp1to2`` (epoch 1 at sequence_parallel=1, i.e. 2 data-parallel processes; epoch 2 resumed at 2), ``sp2to1``
   (epoch 2 resumed at 1 from sp2's epoch-1 checkpoint), ``fsdp_sp2`` (sequence_parallel=2 under FSDP2 forced on
   CPU, as _dist_worker.py does); and Wan2.2 A14B with both experts trained on 2 data-parallel processes: refused
   under DDP without ``run.ddp_find_unused_parameters``, ``ddp_wan22`` with it, ``fsdp_wan22`` under FSDP2.
"""
import importlib.util
import json
import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

import torch.distributed as dist  # noqa: E402

from flow_grpo.models import adapter_from_pipeline  # noqa: E402
from flow_grpo.models.sequence_parallel import enable_sequence_parallel, sum_gradients  # noqa: E402
from flow_grpo.models import TINY_BUILDERS  # noqa: E402
from flow_grpo.sde import sde_step  # noqa: E402

HERE = Path(__file__).parent


def _load(name):
    spec = importlib.util.spec_from_file_location(f"flow_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# kind: (size, adapter settings, sigma pair, guidance, cfg); wan22's sigmas straddle its boundary (both experts)
CASES = {
    "wan": (32, {"num_frames": 5, "max_sequence_length": 16}, [(0.9, 0.7)], 5.0, True),
    "wan22": (32, {"num_frames": 5, "max_sequence_length": 16}, [(0.95, 0.8), (0.5, 0.3)], 5.0, True),
    "hunyuan_video15": (64, {"num_frames": 5}, [(0.9, 0.7)], 6.0, True),  # our own plan (diffusers has none)
}


def run(ad, size, sigmas, gs, cfg):
    """(velocities, log-probs, LoRA grads) of SDE steps of 2 samples of one prompt at each sigma pair."""
    ad.set_resolution(size, size)
    emb = ad.encode_prompts(["a cat", "a cat"])
    x = ad.initial_noise([1, 2], size, size)
    gen = torch.Generator().manual_seed(7)
    vs, lps, loss = [], [], 0.0
    for s, s_next in sigmas:
        v = ad.predict_velocity(x, s, emb, gs, cfg)
        noise = torch.randn(x.shape, generator=gen)
        out = sde_step(v.detach(), x, s, s_next, kind="flow", noise=noise)
        lp = sde_step(v, x, s, s_next, kind="flow", prev_sample=out.prev_sample).log_prob
        vs.append(v.detach())
        lps.append(lp.detach())
        loss = loss + lp.sum() + v.square().mean()
    params = [p for p in ad.transformer.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    loss.backward()
    return torch.cat([v.flatten() for v in vs]), torch.cat(lps), params


def model_level(out: Path) -> None:
    res = {}
    for kind, (size, kw, sigmas, gs, cfg) in CASES.items():
        ad = adapter_from_pipeline(TINY_BUILDERS[kind](seed=0), **kw)
        torch.manual_seed(3)
        ad.add_lora(rank=4, alpha=8)
        with torch.no_grad():
            for n, p in ad.transformer.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)  # a non-zero LoRA: its gradients all flow
        v1, lp1, params = run(ad, size, sigmas, gs, cfg)
        g1 = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]  # unused: none
        enable_sequence_parallel(ad, 2)
        v2, lp2, params = run(ad, size, sigmas, gs, cfg)
        sum_gradients(params)
        g2 = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        res[kind] = {"velocity": float((v2 - v1).abs().max()), "v_scale": float(v1.abs().max()),
                     "log_prob": float((lp2 - lp1).abs().max()),
                     "grad": max(float((b - a).abs().max()) for a, b in zip(g1, g2)),
                     "grad_scale": max(float(a.abs().max()) for a in g1), "n_params": len(g1)}
    if dist.get_rank() == 0:
        (out / "result.json").write_text(json.dumps(res, indent=1))


def trainer_cases(out: Path) -> None:
    conf = _load("conftest")
    dw = _load("_dist_worker")
    rank = dist.get_rank()
    dumps = out / "dumps"
    dumps.mkdir(exist_ok=True)
    res = {}
    from mmgrpo.engine.errors import ConfigError

    try:  # Wan2.2 A14B, both experts, under DDP without find_unused_parameters: refused
        conf.sp_train_case(out / "refused", 1, 1, kind="wan22")
        res["wan22_refused"] = ""
    except ConfigError as exc:
        res["wan22_refused"] = str(exc)
    unused = {"run.ddp_find_unused_parameters": "true"}
    for case, sp, epochs, resume, fsdp, kw in (("sp2", 2, 2, None, False, {}),
                                              ("sp1to2", 1, 1, None, False, {}), ("sp1to2", 2, 2, "sp1to2", False, {}),
                                              ("sp2to1", 1, 2, "sp2", False, {}),
                                              ("ddp_wan22", 1, 2, None, False, {"kind": "wan22", **unused}),
                                              ("fsdp_wan22", 1, 2, None, True, {"kind": "wan22"}),
                                              ("fsdp_sp2", 2, 2, None, True, {})):
        resume_from = None if resume is None else out / resume / "checkpoints" / "epoch-00000001"
        tr, hist, calls = conf.sp_train_case(out / case, sp, epochs, resume_from,
                                             accelerator=dw.fsdp_accelerator() if fsdp else None,
                                             dump=lambda run, traj, case=case: torch.save(
                                                 {"log_probs": traj.log_probs, "rewards": traj.rewards},
                                                 dumps / f"{case}_traj_e{run.state.epoch}_r{rank}.pt"), **kw)
        w = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for n, p in tr.named_params}
        torch.save(w, dumps / f"{case}_final_r{rank}.pt")
        res[case] = {"history": hist, "reward_calls": calls, "type": type(tr.model).__name__, "world": tr.world,
                     "sharded": tr.sharded}
        tr.close()
    (out / f"trainer_r{rank}.json").write_text(json.dumps(res, default=float))


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    model_level(out)
    trainer_cases(out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
