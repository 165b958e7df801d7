"""Flow credit methods as a table (see :mod:`flow_grpo.methods.base`): a credit, a sampling plan or a train-mask
function is one module here plus its registry entry; the trainer and the sampler look them up by config value
and never branch on method names. Adding one: CONTRIBUTING.md, "How to add a flow credit function"."""
from .base import (CREDITS, PLANS, TRAIN_MASKS, AdvOptions, Credit, CreditInputs, CreditOutput, TrainMask,
                   active_train_masks, advantage_stats, apply_train_masks, credit_name, get_credit, group_stats,
                   local_gather, register_credit, register_plan, register_train_mask)
from .plans import StepPlan, fraction_train_count, make_step_plan, sliding_window, window_bounds

# importing a module registers its entries (in this order: train masks apply in registration order)
from . import outcome, tp_grpo, g2rpo, masks, best_of_n, vgpo, nft, b2_diffurl, branch_grpo, adv_grpo  # noqa: E402,F401,E501  isort:skip

__all__ = ["CREDITS", "PLANS", "TRAIN_MASKS", "AdvOptions", "Credit", "CreditInputs", "CreditOutput", "StepPlan",
           "TrainMask", "active_train_masks", "advantage_stats", "apply_train_masks", "credit_name",
           "fraction_train_count", "get_credit", "group_stats", "local_gather", "make_step_plan", "register_credit",
           "register_plan", "register_train_mask", "sliding_window", "window_bounds"]
