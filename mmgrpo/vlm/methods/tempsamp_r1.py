"""TempSamp-R1: the ground-truth answer joins each group as an off-policy member
(``methods.tempsamp_r1.enabled``).

* sampling: the policy samples G-1 members; the G-th is the task's ground-truth completion (+ end-of-turn),
  never truncated, with rollout log-probs 0 (``is_offpolicy``);
* ``mode=shape`` (default, the release): the accuracy reward is shaped before the weighted sum,
  :math:`\\text{total} - w\\,r_k + w\\,f(r_k)` with ``core.tempsamp_shape`` f (so format / T-GRPO terms pass
  unshaped), or f(total) with ``shape_reward=total``;
* ``mode=anchor``: ``core.anchor_offpolicy_advantages`` on this process's whole groups
  (A_gt = lambda * max A_on);
* diagnostics ``tempsamp/*`` (``core.offpolicy_diagnostics``) and ``reward/shaped/mean``.
"""
from __future__ import annotations

import torch

from mmgrpo.core import anchor_offpolicy_advantages, offpolicy_diagnostics, tempsamp_shape
from mmgrpo.vlm.methods.base import Estimator, VLMMethod
from mmgrpo.utils.logging import get_logger

log = get_logger("mmgrpo.train")

__all__ = ["TempSampR1", "ground_truth_row", "shape_key", "shaped_reward", "with_ground_truth"]


def shape_key(ts, reward_weights: dict, acc_key: str, warn: bool = True) -> str:
    """The reward the shaping applies to (``methods.tempsamp_r1.shape_reward``; 'total' = the weighted total)."""
    key = acc_key if ts.shape_reward == "auto" else ts.shape_reward
    if key != "total" and key not in reward_weights:
        if ts.shape_reward != "auto":
            raise ValueError(f"methods.tempsamp_r1.shape_reward={key!r} is not a weighted reward "
                             f"(reward.weights: {sorted(reward_weights)}) nor 'total'")
        if warn and ts.enabled and ts.mode == "shape":
            log.warning("tempsamp: the accuracy reward %r is not in reward.weights; shaping the weighted total", key)
        key = "total"
    return key


def ground_truth_row(run, pp) -> dict:
    """An off-policy row holding the sample's ground-truth completion as the prompt asks for it (+ EOS, never
    truncated to max_new_tokens; sampling log-probs 0): the expert trace of TempSamp-R1, LUFFY and CHORD."""
    ids = run.tok(run.task.gt_completion(pp.sample, pp.item), add_special_tokens=False).input_ids
    ids = torch.tensor(ids + [run.eos_id])
    return dict(ids=ids, mask=torch.ones_like(ids), text=run.tok.decode(ids, skip_special_tokens=True),
                lp=torch.zeros(len(ids)), offpolicy=True, truncated=False, pp=pp)


def with_ground_truth(run, rows: list[dict], want=lambda group_rows: True) -> list[dict]:
    """``rows`` with the ground truth appended as the last member of every group (rows of a group are contiguous)
    for which ``want(the group's rows)`` holds."""
    out, cur = [], []
    for i, r in enumerate(rows):
        out.append(r)
        cur.append(r)
        if i + 1 == len(rows) or rows[i + 1]["group"] != r["group"]:
            if want(cur):
                out.append(dict(ground_truth_row(run, r["pp"]), group=r["group"]))
            cur = []
    return out


def shaped_reward(rewards: dict[str, torch.Tensor], key: str, weight: float, ts) -> torch.Tensor:
    """(N,) shaped total: f(total) for key 'total', else total - w*r_key + w*f(r_key) in float64 (as the release
    shapes f(IoU) + 0.1*format)."""
    r = rewards["total"]
    if key == "total":
        return tempsamp_shape(r, ts.tau, ts.alpha1, ts.alpha2)
    if key not in rewards:
        raise ValueError(f"methods.tempsamp_r1.shape_reward: the reward function returned no {key!r} "
                         f"(got {sorted(rewards)})")
    x = rewards[key].double()
    fx = tempsamp_shape(x, ts.tau, ts.alpha1, ts.alpha2)
    return (r.double() - weight * x + weight * fx).to(r.dtype)


class TempSampR1(VLMMethod):
    name = "tempsamp_r1"
    needs_whole_groups = True
    injected_per_group = 1  # the policy samples G-1 members; the G-th is the ground truth

    @classmethod
    def check(cls, cfg) -> None:
        """A bad ``shape_reward`` is refused even with TempSamp-R1 off."""
        from mmgrpo.vlm.rewards.registry import accuracy_key

        ts = cfg.methods.tempsamp_r1
        shape_key(ts, cfg.reward.weights, accuracy_key(cfg.reward, cfg.data.task), warn=False)

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.ts = cfg.methods.tempsamp_r1
        self.key = shape_key(self.ts, cfg.reward.weights, run.acc_key)

    def after_rollout(self, rows: list[dict]) -> list[dict]:
        """The ground truth as the last member of every group (rows of a group are contiguous)."""
        return with_ground_truth(self.run, rows)

    def advantage_estimator(self) -> Estimator:
        if self.ts.mode == "shape":
            return Estimator(shape=self._shaped)
        if self.ts.mode == "anchor":
            return Estimator(local=self._anchored)
        return Estimator()

    def _shaped(self, rb):
        w = float(self.cfg.reward.weights[self.key]) if self.key != "total" else 1.0
        return shaped_reward(rb.rewards, self.key, w, self.ts)

    def _anchored(self, rb, r, kw):
        return anchor_offpolicy_advantages(r, rb.group_ids, rb.is_offpolicy, lam=self.ts.anchor_lambda, **kw)

    def on_advantages(self, rb):
        v = rb.valid
        rb.info.update({f"tempsamp/{k}": x for k, x in offpolicy_diagnostics(
            rb.reward_used[v], rb.advantages[v], rb.group_ids[v], rb.is_offpolicy[v],
            eps=self.cfg.algo.adv_eps).items()})
        return rb

    def end_of_step(self, rb, m):
        onp = ~rb.is_offpolicy
        if rb.reward_used is not None and onp.any():
            m["reward/shaped/mean"] = float(rb.reward_used[onp].mean())
        for k, v in rb.info.items():
            if k.startswith("tempsamp/"):
                m[k] = v
