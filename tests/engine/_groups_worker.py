"""Worker for test_groups_distributed.py: launched with torchrun (2 CPU processes, gloo) via accelerate's state."""
import json
import sys

import torch
from accelerate import PartialState

from mmgrpo.core import aggregate_loss
from mmgrpo.core.losses import clipped_surrogate, log_ratio
from mmgrpo.engine.dist import global_sum
from mmgrpo.engine.groups import distributed_group_advantages


def token_mean_loss(logp, old, adv, mask, num_tokens=None):
    """PPO-clip per token, aggregated as token_mean over ``num_tokens`` (the global count) or the local one."""
    pg, _ = clipped_surrogate(log_ratio(logp, old, mask), adv, mask)
    return aggregate_loss(torch.where(mask.bool(), pg, torch.zeros_like(pg)), mask, "token_mean", num_tokens=num_tokens)


def make_batch():
    g = torch.Generator().manual_seed(123)
    n, t = 11, 6
    rewards = torch.rand(n, generator=g)
    rewards[8:11] = 0.5  # one constant group
    group_ids = torch.tensor([0, 1, 0, 2, 1, 0, 2, 1, 3, 3, 3])  # groups interleaved across the split
    logp = torch.randn(n, t, generator=g, dtype=torch.float64) * 0.1 - 1
    old = logp + torch.randn(n, t, generator=g, dtype=torch.float64) * 0.05
    lens = torch.randint(1, t + 1, (n,), generator=g)
    mask = torch.arange(t).unsqueeze(0) < lens.unsqueeze(1)
    return rewards, group_ids, logp, old, mask


def main(out_path: str) -> None:
    state = PartialState(cpu=True)
    rank, world = state.process_index, state.num_processes
    rewards, gids, logp, old, mask = make_batch()
    split = [0, 4, 11]  # uneven: 4 rows on rank 0, 7 on rank 1
    sl = slice(split[rank], split[rank + 1])
    adv = distributed_group_advantages(rewards[sl], gids[sl])
    n_tok = global_sum(mask[sl].sum())
    loss = token_mean_loss(logp[sl], old[sl], adv.advantages.double(), mask[sl], num_tokens=n_tok)
    res = {"rank": rank, "world": world, "adv": adv.advantages.tolist(), "loss": loss.item(),
           "zero_frac": adv.zero_std_fraction, "num_groups": adv.num_groups}
    with open(f"{out_path}.{rank}", "w") as f:
        json.dump(res, f)
    state.wait_for_everyone()


if __name__ == "__main__":
    main(sys.argv[1])
