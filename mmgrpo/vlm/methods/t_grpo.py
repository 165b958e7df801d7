"""T-GRPO (Video-R1): a temporal bonus for groups that answer better with ordered than with shuffled frames.

``methods.t_grpo.enabled``: for every video prompt the policy also answers ``methods.t_grpo.num_shuffled`` (0 =
G/2) times on the same clip with its frames shuffled (seeded by (seed, step, position)); those rows are only scored, never
trained. :func:`temporal_bonus` (per group, Video-R1 #96) adds ``alpha`` to the correct ordered rows, as the
reward ``temporal`` (also added to ``total``). Rows whose accuracy is NaN (a failed reward call) leave the group.
"""
from __future__ import annotations

import torch
from torch import Tensor

from mmgrpo.vlm.methods.base import VLMMethod
from mmgrpo.vlm.models.rollout import make_seeds
from mmgrpo.utils.seeding import sample_seed

__all__ = ["TGRPO", "temporal_bonus"]


def temporal_bonus(acc: Tensor, group_ids: Tensor, acc_shuffled: Tensor, shuffled_group_ids: Tensor,
                   alpha: float = 0.3, mu: float = 1.0, min_accuracy: float = 0.1) -> tuple[Tensor, Tensor]:
    r"""T-GRPO (Video-R1) temporal bonus, computed PER GROUP (not over the device batch, Video-R1 #96).

    For group g with ordered accuracies :math:`a_i` and shuffled-frame accuracies :math:`\tilde a_j`:
    :math:`p_g = \text{mean}_i a_i`, :math:`\tilde p_g = \text{mean}_j \tilde a_j`. If :math:`p_g \ge \mu\,\tilde p_g`
    every ordered row with :math:`a_i > \text{min\_accuracy}` gets :math:`+\alpha`. Groups without shuffled rows
    (image prompts) get no bonus.

    Returns (bonus (N,) float32, granted (G_groups,) bool per unique group id in ascending order).
    """
    acc = torch.as_tensor(acc, dtype=torch.float64)
    gid = torch.as_tensor(group_ids)
    acc_s = torch.as_tensor(acc_shuffled, dtype=torch.float64)
    gid_s = torch.as_tensor(shuffled_group_ids)
    if acc.shape != gid.shape or acc_s.shape != gid_s.shape:
        raise ValueError("accuracies and group ids must have matching (N,) / (M,) shapes")
    uniq = torch.unique(gid)
    bonus = torch.zeros_like(acc)
    granted = torch.zeros(uniq.numel(), dtype=torch.bool)
    for k, g in enumerate(uniq.tolist()):
        ms = gid_s == g
        if not ms.any():
            continue
        m = gid == g
        p, p_s = acc[m].mean(), acc_s[ms].mean()
        if p >= mu * p_s:
            granted[k] = True
            bonus[m] = torch.where(acc[m] > min_accuracy, torch.full_like(acc[m], alpha), torch.zeros_like(acc[m]))
    return bonus.float(), granted


class TGRPO(VLMMethod):
    name = "t_grpo"
    needs_whole_groups = True

    def on_rewards(self, rb):
        run, c, step = self.run, self.cfg.methods.t_grpo, self.run.state.step
        bonus = torch.zeros(rb.n)
        acc = run.accuracy(rb.texts, [pp.reward_sample for pp in rb.prompts], rb.rewards)
        rb.valid &= torch.isfinite(acc)
        vids = [(g, rb.prompts[i]) for i, g in enumerate(rb.group_ids.tolist())  # one per group, in row order
                if (i == 0 or rb.group_ids[i - 1] != g) and rb.prompts[i].clip is not None]
        if vids:
            Gs = c.num_shuffled or max(1, self.cfg.rollout.group_size // 2)
            acc_sh, sh_gids = self._shuffled_accuracy(vids, Gs, step)
            onp = ~rb.is_offpolicy & rb.valid
            b, granted = temporal_bonus(acc[onp], rb.group_ids[onp], acc_sh, sh_gids, c.alpha, c.mu, c.min_accuracy)
            bonus[onp] = b
            ordered = torch.isin(rb.group_ids[onp], sh_gids)
            rb.info.update({"tgrpo/acc_ordered_sum": float(acc[onp][ordered].sum()),
                            "tgrpo/acc_shuffled_sum": float(acc_sh.sum()), "tgrpo/n_ordered": float(ordered.sum()),
                            "tgrpo/n_shuffled": float(len(sh_gids)),
                            "tgrpo/groups_granted": float(granted.sum()), "tgrpo/groups": float(len(vids))})
        rb.rewards["temporal"] = bonus
        rb.rewards["total"] = rb.rewards["total"] + bonus

    def _shuffled_accuracy(self, vids, Gs: int, step: int) -> tuple[Tensor, Tensor]:
        """Accuracies and group ids of Gs shuffled-frame answers per video prompt (failed rows left out)."""
        run, seed = self.run, self.cfg.run.seed
        items = [run.task.shuffled(pp, torch.Generator().manual_seed(sample_seed(seed, step, pos, 104729)))
                 for pos, pp in vids]
        seeds = [s ^ 0x5A5A5A5A for s in make_seeds(seed, step, [p for p, _ in vids], Gs)]
        with run.generation_context():
            sh = run.backend.generate(items, Gs, run.sampling, seeds=seeds)
        acc_sh = run.accuracy(sh.texts, [pp.reward_sample for _, pp in vids for _ in range(Gs)])
        gids = torch.tensor([p for p, _ in vids for _ in range(Gs)])
        ok = torch.isfinite(acc_sh)  # failed shuffled rows do not enter p~_g
        return acc_sh[ok], gids[ok]

    def end_of_step(self, rb, m):
        i = rb.info
        if "tgrpo/n_shuffled" in i:
            m["tgrpo/acc_ordered"] = i["tgrpo/acc_ordered_sum"] / max(i["tgrpo/n_ordered"], 1)
            m["tgrpo/acc_shuffled"] = i["tgrpo/acc_shuffled_sum"] / max(i["tgrpo/n_shuffled"], 1)
            m["tgrpo/bonus_group_frac"] = i["tgrpo/groups_granted"] / max(i["tgrpo/groups"], 1)
