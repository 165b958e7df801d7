"""The shared group-advantage core: pure torch functions, no model code.

* :mod:`mmgrpo.core.advantages` - group advantages (group / batch / no std scaling), multi-reward (GDPO),
  pairwise win rates (Pref-GRPO), TempSamp-R1 shaping, anchoring and diagnostics.
* :mod:`mmgrpo.core.losses` - policy-loss pieces: log-ratios (token, GSPO sequence), PPO's clipped surrogate
  (clip-higher, dual-clip), Reg-GRPO, loss aggregation modes, k1/k2/k3 KL; the recipes and methods compose them.
* :mod:`mmgrpo.core.step_credit` - step-level credit: TP-GRPO turning points, per-step advantages.
"""
from .advantages import (
    AdvantageOutput,
    anchor_offpolicy_advantages,
    group_advantages,
    multi_reward_advantages,
    offpolicy_diagnostics,
    pairwise_win_rate,
    tempsamp_shape,
)
from .losses import (PolicyLossOutput, aggregate_loss, clipped_surrogate, kl_penalty, log_ratio, masked_kl, masked_mean,
                     ratio_metrics, reg_grpo_loss, sequence_log_ratio)
from .step_credit import (
    StepCredit,
    balance_turning_points,
    incremental_rewards,
    step_advantages,
    turning_point_rewards,
    turning_points,
)

__all__ = [
    "AdvantageOutput", "anchor_offpolicy_advantages", "group_advantages",
    "multi_reward_advantages", "offpolicy_diagnostics", "pairwise_win_rate", "tempsamp_shape",
    "PolicyLossOutput", "aggregate_loss", "kl_penalty", "masked_mean", "log_ratio", "sequence_log_ratio",
    "clipped_surrogate", "masked_kl", "reg_grpo_loss", "ratio_metrics", "StepCredit",
    "balance_turning_points", "incremental_rewards", "step_advantages",
    "turning_point_rewards", "turning_points",
]
