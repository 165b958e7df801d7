"""Run by test_checkpoint_reshard.py: ``python _reshard_worker.py save|load|plain WORLD DIR``.

save: WORLD processes (CPU, gloo) train a tiny FSDP2-sharded MLP (AdamW, 2 steps, an EMA of the shards), write a
checkpoint through mmgrpo.engine.checkpoint, then take one more step; rank 0 dumps the full tensors at the save and
after the extra step (``ref.pt``).
load: WORLD processes build the same MLP from another seed, shard it, load the checkpoint, dump the full tensors,
take the same extra step and dump the weights (``got_<WORLD>.pt``).
plain: one process, no process group, no sharding: the same load into a plain module (``got_plain.pt``; run after
``load 1``).
"""
import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

STEP = 2


def build(seed: int):
    torch.manual_seed(seed)
    # 5 output rows: shards of uneven size on 2 processes; a frozen tensor (a LoRA run's base) is not written
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    with torch.no_grad():
        model[0].bias.fill_(0.1)  # the same base whatever the seed, as a base read from the model path
    model[0].bias.requires_grad_(False)
    return model


def batch():
    g = torch.Generator().manual_seed(7)
    return torch.randn(6, 4, generator=g), torch.randn(6, 3, generator=g)


def train_step(model, opt):
    x, y = batch()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def full(t):
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def dump(model, opt, ema):
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    st = {"params": {n: full(p) for n, p in trained}, "optim": {}, "ema": {}}
    for n, p in trained:
        s = opt.state.get(p, {})
        st["optim"][n] = {k: full(v) for k, v in s.items()}
    for n, e in ema.items():
        st["ema"][n] = full(e)
    return st


def shard(model, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def worker(rank, mode, world, out, port):
    import torch.distributed as dist

    from mmgrpo.engine.checkpoint import load_sharded_model_optim, save_checkpoint, sharded_like, sharded_model_optim
    from mmgrpo.utils.checkpoint import CheckpointManager, safe_torch_load

    if mode != "plain":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        model = shard(build(0 if mode == "save" else 1), world)
    else:
        model = build(1)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05, weight_decay=0.1)
    mgr = CheckpointManager(out / "ckpts", keep_last=None, keep_best=False)
    if mode == "save":
        ema = {n: (p.to_local() if hasattr(p, "to_local") else p).detach().float().clone() * 0.5
               for n, p in model.named_parameters() if p.requires_grad}
        for _ in range(STEP):
            train_step(model, opt)
            for n, p in model.named_parameters():
                if n in ema:
                    ema[n].mul_(0.9).add_(p.to_local().detach(), alpha=0.1)
        params = dict(model.named_parameters())
        ema_dt = {n: sharded_like(e, params[n]) for n, e in ema.items()}
        ref = dump(model, opt, ema_dt)
        tensors, meta = sharded_model_optim(model, opt)
        from mmgrpo.engine.checkpoint import save_sharded

        save_checkpoint(mgr, STEP, lambda: {"optimizer": meta}, is_main=rank == 0,
                        sharded=lambda d: save_sharded(d, {**tensors, "extra": {"ema": ema_dt}}))
        train_step(model, opt)
        ref["after_step"] = {n: full(p) for n, p in model.named_parameters() if p.requires_grad}
        if rank == 0:
            torch.save(ref, out / "ref.pt")
    else:
        path = mgr.latest_valid()
        meta = safe_torch_load(path / "optimizer.pt")
        params = dict(model.named_parameters())
        ema = {n: torch.zeros_like(p.to_local() if hasattr(p, "to_local") else p) for n, p in params.items()
               if p.requires_grad}
        got_ema = load_sharded_model_optim(path / "state", model, opt, meta,
                                           extra={"ema": {n: sharded_like(e, params[n]) for n, e in ema.items()}})
        got = dump(model, opt, got_ema["ema"])
        train_step(model, opt)
        got["after_step"] = {n: full(p) for n, p in model.named_parameters() if p.requires_grad}
        if rank == 0:
            torch.save(got, out / f"got_{mode if mode == 'plain' else world}.pt")
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    if mode == "load" and world == 1:  # the same load into a plain module, without starting another interpreter
        worker(0, "plain", 1, out, None)


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    mode, world, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    if mode == "plain":
        worker(0, mode, 1, out, None)
    else:
        import torch.multiprocessing as mp

        mp.start_processes(worker, args=(mode, world, out, _free_port()), nprocs=world, start_method="fork")
