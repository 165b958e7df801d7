"""AdamW with fp32 master weights for half-precision (bf16 / fp16) trainable parameters.

Why: AdamW moves a weight by about ``lr`` per step. A bf16 weight w has a spacing (ulp) of 2^(floor(log2|w|) - 7),
so an update smaller than half of it rounds back to w and is lost: at |w| = 0.02 that is any update below 6e-5,
i.e. at lr 1e-6 .. 1e-5 almost every update of a full fine-tune whose weights are stored in bf16 (measured: 10
AdamW steps at lr 1e-5 change 15 % of N(0, 0.02) bf16 weights, 100 % in fp32). Nothing fails; the model just
does not train.

How: the optimizer keeps an fp32 copy ("master") of every half-precision parameter and runs the ordinary
``torch.optim.AdamW`` arithmetic on it; after each step the model parameter is set to the master rounded to its
dtype. The forward / backward stay in bf16 (weights, activations, gradients: the memory and speed of bf16);
only the update is fp32, so the masters follow exactly the trajectory fp32 AdamW takes from the same gradients.
Cost: 4 bytes per trainable half-precision parameter (AdamW's moments are fp32 already, as for an fp32 model).
fp32 parameters (e.g. LoRA adapters, which peft keeps in fp32 on a bf16 base) are optimised in place, no copy.

The master is the source of truth between steps; a parameter written from outside (checkpoint load, broadcast
from rank 0, EMA ``copy_to``) no longer equals its rounded master, and its master restarts from the written
value at the next step. ``state_dict`` carries the masters, so a resume continues the fp32 trajectory exactly.

Sharded engines are out of scope: DeepSpeed's bf16 mode keeps its own fp32 masters, and FSDP2 keeps fp32
parameters with a bf16 compute policy (``mixed_precision=bf16``); their prepare step remaps the optimizer's
parameters, which must then be the model's own.
"""
from __future__ import annotations

from typing import Iterable

import torch

HALF_DTYPES = (torch.bfloat16, torch.float16)

__all__ = ["MasterWeightAdamW", "make_adamw", "HALF_DTYPES"]


class MasterWeightAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` over fp32 masters of the half-precision parameters in ``params`` (a flat iterable
    of parameters; other AdamW arguments as usual). ``model_params`` / ``masters`` are index-aligned."""

    def __init__(self, params: Iterable[torch.nn.Parameter], **kwargs):
        self.model_params = list(params)
        self.masters = [p.detach().float().clone() if p.dtype in HALF_DTYPES else p for p in self.model_params]
        super().__init__(self.masters, **kwargs)

    def _pairs(self):
        """(model parameter, its fp32 master) for the parameters that have a separate master."""
        return [(p, m) for p, m in zip(self.model_params, self.masters) if m is not p]

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("MasterWeightAdamW.step does not take a closure")
        for p, m in self._pairs():
            if not torch.equal(p, m.to(p.dtype)):  # written from outside since the last step: restart from it
                m.copy_(p)
            m.grad = None if p.grad is None else p.grad.float()
        super().step()
        for p, m in self._pairs():
            p.copy_(m)  # round to nearest in the parameter's dtype
            m.grad = None
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for p, _ in self._pairs():
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    def state_dict(self) -> dict:
        sd = super().state_dict()
        sd["fp32_masters"] = [m.detach().cpu().clone() if m is not p else None
                              for p, m in zip(self.model_params, self.masters)]
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        sd = dict(state_dict)
        masters = sd.pop("fp32_masters", None)
        super().load_state_dict(sd)
        with torch.no_grad():
            for i, (p, m) in enumerate(zip(self.model_params, self.masters)):
                if m is p:
                    continue
                saved = masters[i] if masters is not None and i < len(masters) else None
                if saved is None or tuple(saved.shape) != tuple(m.shape):
                    if masters is not None:
                        raise ValueError(f"optimizer state: fp32 master {i} is missing or has shape "
                                         f"{None if saved is None else tuple(saved.shape)}, expected {tuple(m.shape)}")
                    m.copy_(p)  # a checkpoint of plain AdamW: start the masters from the loaded weights
                else:
                    m.copy_(saved)


def make_adamw(params: Iterable[torch.nn.Parameter], master_weights: bool = True, **kwargs) -> torch.optim.Optimizer:
    """AdamW; with ``master_weights`` and any half-precision parameter, :class:`MasterWeightAdamW`."""
    params = list(params)
    if master_weights and any(p.dtype in HALF_DTYPES for p in params):
        return MasterWeightAdamW(params, **kwargs)
    return torch.optim.AdamW(params, **kwargs)
