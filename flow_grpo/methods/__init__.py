"""Flow methods as modules: one file per method (the math as pure functions, a :class:`FlowMethod` subclass whose
hooks wire it to the rollout) and this registry.

``REGISTRY`` lists every method in the order the recipe calls their hooks (the train-mask methods narrow the trained
(sample, step) pairs before a credit's own ``on_advantages`` does). Each entry names the method, where its class
lives (imported only when enabled: the registry itself does not import torch), when it is on and its options: a
dataclass declared here, next to its entry, which becomes the config section ``methods.<name>`` (``flow_grpo train
--help`` lists every option without importing torch).

Two kinds of entries:

* **credits** (``credit=True``): exactly one is on, the one ``sample.credit`` names (``outcome`` under
  ``reward.mode=per_reward`` is ``per_reward``); it provides the advantages (``advantage_estimator()``), and may
  score intermediate states (``step_rewards``), own a sampling plan (``plan``: the ``sample.step_mode`` value that
  selects it), replace the policy loss (``loss()``), sample with other weights (``rollout_context()``) and keep
  state across epochs (``state_dict``);
* **train masks and other switches** (``enabled(cfg)``): e.g. ``optim.drop_zero_adv``, ``optim.best_of_n``.

Adding a method: write ``flow_grpo/methods/<name>.py``, add its options and one ``MethodSpec`` here, and a test (see
CONTRIBUTING.md).
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field, make_dataclass
from typing import Any, Callable, Literal, Optional

__all__ = ["GENERIC_PLANS", "MethodSpec", "FlowMethodsConfig", "REGISTRY", "build_methods", "check_config",
           "credit_class", "credit_method", "credit_of", "credit_names", "enabled_names", "plan_names"]


def _h(text: str) -> dict:
    return {"help": text}


# ------------------------------------------------------------------------------------------- options
@dataclass
class G2RPOOptions:
    granularities: list[int] = field(default_factory=lambda: [1, 2], metadata=_h(
        "ODE completion strides after the SDE step (1 = the trajectory itself); flow_grpo.methods.g2rpo"))

    def __post_init__(self):
        if not self.granularities or any(int(g) < 1 for g in self.granularities):
            raise ValueError(f"methods.g2rpo.granularities must be strides >= 1, got {self.granularities}")


@dataclass
class VGPOOptions:
    gamma: float = field(default=1.0, metadata=_h(
        "discount of the temporal cumulative reward G_k = sum_j gamma^(j-k) (V_j - V_{j-1}); 1 = R - V_{k-1} (our "
        "choice, the paper gives no code); flow_grpo.methods.vgpo"))
    tau: float = field(default=0.1, metadata=_h(
        "reward scale of the dual advantage: absolute term (G - anchor)/tau, weight exp(-group_std/tau) (1 for a "
        "group without spread, where GRPO gives 0)"))
    anchor: str = field(default="0", metadata=_h(
        "absolute anchor b: a number, or 'batch' (batch mean of each step column)"))

    def __post_init__(self):
        if not 0.0 <= self.gamma <= 1.0 or self.tau <= 0:
            raise ValueError(f"methods.vgpo.gamma must be in [0, 1] and methods.vgpo.tau > 0, got {self.gamma}, "
                             f"{self.tau}")
        if str(self.anchor).strip() != "batch":
            try:
                float(self.anchor)
            except ValueError:
                raise ValueError(f"methods.vgpo.anchor must be a number or 'batch', got {self.anchor!r}") from None


@dataclass
class NFTOptions:
    beta: float = field(default=1.0, metadata=_h(
        "beta of the implicit policies v+ = b v + (1-b) v_old, v- = (1+b) v_old - b v (release 1.0; 0.1 for OCR / "
        "multi-reward); flow_grpo.methods.nft"))
    timestep_fraction: float = field(default=0.99, metadata=_h(
        "each sample trains int(K * f) of the K sampling timesteps, a random subset per sample (release 0.99: 9 of "
        "10)"))
    decay_type: Literal[0, 1, 2] = field(default=1, metadata=_h(
        "schedule of the old adapter's EMA after each epoch, d = min((step - flat) * uprate, uphold) of the "
        "optimizer step: 0 = copy (d = 0), 1 = (0, 1e-3, 0.5), 2 = (75, 7.5e-3, 0.999)"))
    adv_mode: Literal["all", "positive_only", "negative_only", "one_only", "binary"] = field(default="all", metadata=_h(
        "all | positive_only | negative_only | one_only | binary (release adv_mode)"))

    def __post_init__(self):
        if not self.beta > 0:
            raise ValueError(f"methods.nft.beta must be > 0, got {self.beta}")


@dataclass
class BranchGRPOOptions:
    split_points: list[int] = field(default_factory=lambda: [0, 3, 6, 9], metadata=_h(
        "steps at which every node splits into `branching` children; data.group_size must be branching^len (16); "
        "flow_grpo.methods.branch_grpo"))
    branching: int = field(default=2, metadata=_h("children per split"))
    depth_pruning: list[int] = field(default_factory=list, metadata=_h(
        "child depths (= step + 1) whose transitions are not trained (sampling and rewards unchanged); [] = none"))
    depth_slide: bool = field(default=False, metadata=_h(
        "the pruned depths move up by epoch // slide_interval, until the shallowest reaches stop_depth (the release "
        "counts optimizer steps)"))
    slide_interval: int = field(default=30, metadata=_h("epochs between moves of the pruned depths"))
    stop_depth: int = field(default=-1, metadata=_h("shallowest pruned depth of the slide; -1 = the last split point"))
    width_pruning: Literal[0, 1, 2] = field(default=0, metadata=_h(
        "after the advantages, of the edges after the last split train 0 = all, 1 = the best int(n * ratio) (>= 1) "
        "of each leaf's chain, 2 = the best and worst max(2, int(n * ratio)) of the tree"))
    width_ratio: float = field(default=0.5, metadata=_h("fraction kept by width_pruning"))

    def __post_init__(self):
        if not 0 < self.width_ratio <= 1:
            raise ValueError(f"methods.branch_grpo.width_ratio must be in (0, 1], got {self.width_ratio}")


@dataclass
class B2DiffuRLOptions:
    num_stages: int = field(default=100, metadata=_h(
        "training stages; stage = epoch // epochs_per_stage; flow_grpo.methods.b2_diffurl"))
    epochs_per_stage: int = field(default=1, metadata=_h("epochs (rollout + update) per stage"))
    split_left: int = field(default=14, metadata=_h(
        "trailing steps s branched and trained at stage 0 (K - s = branch step)"))
    split_right: int = field(default=20, metadata=_h(
        "trailing steps at the last stage; stage i uses left + i * (right - left + 1) // num_stages, capped at K "
        "(the training segment grows toward the start)"))
    history: int = field(default=8, metadata=_h(
        "z-scores per prompt over this many previous epochs' rewards of the prompt plus the current ones (release "
        "history_cnt 8; checkpointed); 0 = current only"))
    pos_threshold: float = field(default=0.5, metadata=_h("the best branch of a trunk is trained if its z >= this"))
    neg_threshold: float = field(default=-0.5, metadata=_h("the worst branch of a trunk is trained if its z < this"))

    def __post_init__(self):
        if self.history < 0:
            raise ValueError(f"methods.b2_diffurl.history must be >= 0, got {self.history}")


@dataclass
class AdvGRPOOptions:
    reward: str = field(default="adv_dino", metadata=_h(
        "name of the reward component (a reward.weights key) whose head is trained adversarially: reference images "
        "positive, the epoch's samples negative; flow_grpo.methods.adv_grpo"))
    schedule: Literal["alternate", "interleave"] = field(default="alternate", metadata=_h(
        "alternate (the release: epoch e updates the reward model only, no policy step, unless (e+1) % every == 0, "
        "when it updates the policy only) | interleave (the policy trains every epoch; the reward model is updated "
        "after epochs with (e+1) % every == 0, on that epoch's samples)"))
    every: int = field(default=10, metadata=_h("k of the schedule (the release's d_times = 10)"))
    lr: float = field(default=1e-4, metadata=_h("Adam learning rate of the reward head (the release's d_lr = 1e-4)"))
    betas: tuple[float, float] = field(default=(0.5, 0.999), metadata=_h(
        "Adam betas of the reward head (the release's (0.5, 0.999))"))
    steps: int = field(default=1, metadata=_h(
        "reward-model optimizer steps per update, each on the whole epoch (the release: 1)"))
    patch_weight: float = field(default=0.3, metadata=_h(
        "weight of the patch-token hinge loss added to the CLS hinge loss (the release's patch_loss_weight 0.3; 0 = "
        "CLS only)"))
    n_patches: int = field(default=64, metadata=_h("patch tokens drawn per image for the patch hinge loss (the "
                                                   "release: 64)"))
    train_on_raw_features: bool = field(default=False, metadata=_h(
        "true = the release's train_dino, which feeds the head unnormalised DINO tokens while the reward feeds it "
        "L2-normalised ones; false = normalised in both"))

    def __post_init__(self):
        for name, v in (("every", self.every), ("steps", self.steps), ("n_patches", self.n_patches)):
            if v < 1:
                raise ValueError(f"methods.adv_grpo.{name} must be >= 1, got {v}")
        if not (math.isfinite(self.lr) and self.lr > 0) or not (math.isfinite(self.patch_weight)
                                                               and self.patch_weight >= 0):
            raise ValueError(f"methods.adv_grpo.lr must be > 0 and patch_weight >= 0, got {self.lr}, "
                             f"{self.patch_weight}")
        if not all(math.isfinite(b) and 0 <= b < 1 for b in self.betas):
            raise ValueError(f"methods.adv_grpo.betas must be two numbers in [0, 1), got {list(self.betas)}")


@dataclass
class PositiveOnlyOptions:
    enabled: bool = field(default=False, metadata=_h(
        "only samples with a positive advantage get a gradient (RAFT-style filter); flow_grpo.methods.positive_only"))


@dataclass
class GRPOGuardOptions:
    enabled: bool = field(default=False, metadata=_h(
        "GRPO-Guard: the per-step log-ratio normalised (bias removed, scaled by the step's std) before PPO's clip; "
        "flow_grpo.methods.grpo_guard"))


@dataclass
class GARDOOptions:
    enabled: bool = field(default=False, metadata=_h(
        "GARDO: KL to a periodically reset copy of the policy, on the uncertain samples only; "
        "flow_grpo.methods.gardo"))
    aux_rewards: list[str] = field(default_factory=list, metadata=_h(
        "reward components whose ranks define the uncertainty rank(total) - mean rank(aux) (release: aesthetic, "
        "imagereward); they must be in reward.weights (weight 0: scored, not trained on)"))
    beta: float = field(default=0.04, metadata=_h("KL coefficient (release train.beta 0.04)"))
    kl_thres: float = field(default=3e-4, metadata=_h(
        "an optimizer step whose mean gated KL exceeds this resets the reference to the policy (release 3e-4)"))
    reset_freq: int = field(default=15, metadata=_h("epochs after which the reference is reset anyway (release 15)"))
    p_base: float = field(default=0.1, metadata=_h("initial gated fraction of the u >= 0 samples (release 0.1)"))
    alpha: float = field(default=0.1, metadata=_h("multiplicative step of the gated fraction (release 0.1)"))
    p_min: float = field(default=0.02, metadata=_h("lower bound of the gated fraction (release 0.02)"))
    p_max: float = field(default=0.2, metadata=_h("upper bound of the gated fraction (release 0.2)"))

    def __post_init__(self):
        if not (self.beta >= 0 and self.kl_thres > 0 and self.reset_freq >= 1):
            raise ValueError(f"methods.gardo: beta >= 0, kl_thres > 0, reset_freq >= 1 required, got {self.beta}, "
                             f"{self.kl_thres}, {self.reset_freq}")
        if not 0 < self.p_min <= self.p_base <= self.p_max <= 1 or not 0 <= self.alpha < 1:
            raise ValueError(f"methods.gardo: need 0 < p_min <= p_base <= p_max <= 1 and 0 <= alpha < 1, got "
                             f"{self.p_min}, {self.p_base}, {self.p_max}, {self.alpha}")


@dataclass
class RewardEnsembleOptions:
    members: list[str] = field(default_factory=list, metadata=_h(
        "reward components (in reward.weights) forming the ensemble; [] = off; flow_grpo.methods.reward_ensemble"))
    mode: Literal["worst_case", "uncertainty"] = field(default="worst_case", metadata=_h(
        "worst_case: min_k r_k (WCO) | uncertainty: mean_k r_k - lam var_k r_k (UWO)"))
    lam: float = field(default=1.0, metadata=_h("UWO's variance coefficient lam"))
    normalize: bool = field(default=False, metadata=_h(
        "standardise each member with its mean / std over the run's first batch (the initial policy) first"))

    def __post_init__(self):
        if not self.lam >= 0:
            raise ValueError(f"methods.reward_ensemble.lam must be >= 0, got {self.lam}")
        if len(self.members) == 1:
            raise ValueError("methods.reward_ensemble.members: an ensemble needs at least two members")


@dataclass
class PAROptions:
    enabled: bool = field(default=False, metadata=_h(
        "PAR: the reward becomes sigmoid((r - r_ref) / tau), r_ref the prompt's first group mean; "
        "flow_grpo.methods.par"))
    tau: float = field(default=1.0, metadata=_h("temperature (the paper: 1)"))

    def __post_init__(self):
        if not self.tau > 0:
            raise ValueError(f"methods.par.tau must be > 0, got {self.tau}")


@dataclass
class LogTamedOptions:
    enabled: bool = field(default=False, metadata=_h(
        "PaCo log-tamed aggregation: components with a coefficient of variation > delta become log(1 + R); "
        "flow_grpo.methods.log_tamed"))
    delta: str = field(default="mean", metadata=_h("threshold: a number (paper example 0.2) or 'mean' of the h_k"))
    components: list[str] = field(default_factory=list, metadata=_h(
        "components aggregated ([] = those of reward.weights with a non-zero weight)"))


# ------------------------------------------------------------------------------------------- the registry
@dataclass(frozen=True)
class MethodSpec:
    name: str
    target: Any  # "module:Class" (imported when the method is on), or the class itself
    help: str = ""
    credit: bool = False  # a credit: on when sample.credit names it (see credit_of)
    enabled: Optional[Callable[[Any], bool]] = None  # other methods: TrainConfig -> on / off
    options: Optional[type] = None  # a dataclass: the config section methods.<name>
    plan: str = ""  # the sample.step_mode value of the method's own sampling plan


REGISTRY: tuple[MethodSpec, ...] = (
    MethodSpec("drop_zero_adv", "flow_grpo.methods.masks:DropZeroAdv",
               "leave out trajectories whose advantage is 0 at every step (optim.drop_zero_adv)",
               enabled=lambda c: bool(c.optim.drop_zero_adv)),
    MethodSpec("best_of_n", "flow_grpo.methods.best_of_n:BestOfN",
               "DanceGRPO best-of-n: train the n/2 best and n/2 worst samples of each group (optim.best_of_n)",
               enabled=lambda c: c.optim.best_of_n != 0),
    MethodSpec("outcome", "flow_grpo.methods.outcome:Outcome",
               "Flow-GRPO / DanceGRPO / MixGRPO outcome credit (sample.credit=outcome)", credit=True),
    MethodSpec("per_reward", "flow_grpo.methods.outcome:PerReward",
               "GDPO per-reward normalisation (sample.credit=outcome, reward.mode=per_reward)", credit=True),
    MethodSpec("tp_grpo", "flow_grpo.methods.tp_grpo:TPGRPO",
               "TP-GRPO turning points from ODE completions (sample.credit=tp_grpo)", credit=True),
    MethodSpec("g2rpo", "flow_grpo.methods.g2rpo:G2RPO",
               "G2RPO multi-granularity credit (sample.credit=g2rpo)", credit=True, options=G2RPOOptions),
    MethodSpec("vgpo", "flow_grpo.methods.vgpo:VGPO",
               "VGPO value-anchored per-step credit (sample.credit=vgpo)", credit=True, options=VGPOOptions),
    MethodSpec("nft", "flow_grpo.methods.nft:NFT",
               "DiffusionNFT forward-process loss (sample.credit=nft, sample.step_mode=nft)", credit=True,
               options=NFTOptions, plan="nft"),
    MethodSpec("b2_diffurl", "flow_grpo.methods.b2_diffurl:B2DiffuRL",
               "B2-DiffuRL best / worst branch of each trunk (sample.credit=b2_diffurl, sample.step_mode=b2)",
               credit=True, options=B2DiffuRLOptions, plan="b2"),
    MethodSpec("branch_grpo", "flow_grpo.methods.branch_grpo:BranchGRPO",
               "BranchGRPO tree rollouts and depth-wise advantages (sample.credit=branch_grpo, sample.step_mode=tree)",
               credit=True, options=BranchGRPOOptions, plan="tree"),
    MethodSpec("adv_grpo", "flow_grpo.methods.adv_grpo:AdvGRPO",
               "Adv-GRPO: the reward model trained against the policy (sample.credit=adv_grpo)", credit=True,
               options=AdvGRPOOptions),
    MethodSpec("positive_only", "flow_grpo.methods.positive_only:PositiveOnly",
               "train only the samples with a positive advantage (methods.positive_only.enabled)",
               enabled=lambda c: c.methods.positive_only.enabled, options=PositiveOnlyOptions),
    # guardrails against reward hacking: reward shaping (on_rewards, in this order), then the loss
    MethodSpec("reward_ensemble", "flow_grpo.methods.reward_ensemble:RewardEnsemble",
               "reward-model ensemble: worst case or uncertainty-weighted (methods.reward_ensemble.members)",
               enabled=lambda c: bool(c.methods.reward_ensemble.members), options=RewardEnsembleOptions),
    MethodSpec("log_tamed", "flow_grpo.methods.log_tamed:LogTamed",
               "PaCo log-tamed multi-reward aggregation (methods.log_tamed.enabled)",
               enabled=lambda c: c.methods.log_tamed.enabled, options=LogTamedOptions),
    MethodSpec("par", "flow_grpo.methods.par:PAR",
               "PAR bounded, reference-centred reward (methods.par.enabled)",
               enabled=lambda c: c.methods.par.enabled, options=PAROptions),
    MethodSpec("grpo_guard", "flow_grpo.methods.grpo_guard:GRPOGuard",
               "GRPO-Guard per-step ratio normalisation (methods.grpo_guard.enabled)",
               enabled=lambda c: c.methods.grpo_guard.enabled, options=GRPOGuardOptions),
    MethodSpec("gardo", "flow_grpo.methods.gardo:GARDO",
               "GARDO gated KL to an adaptive reference (methods.gardo.enabled)",
               enabled=lambda c: c.methods.gardo.enabled, options=GARDOOptions),
)

#: the sampling plans of :mod:`flow_grpo.methods.plans` (``sample.step_mode``); methods add their own (``plan``)
GENERIC_PLANS = ("all", "fraction", "window", "single")

# the ``methods`` section of TrainConfig: one field per registry entry that declares options
FlowMethodsConfig = make_dataclass(
    "FlowMethodsConfig",
    [(s.name, s.options, field(default_factory=s.options, metadata=_h(s.help))) for s in REGISTRY if s.options],
    namespace={"__doc__": "Options of the methods registered in flow_grpo.methods (methods.<name>.<option>)."})
FlowMethodsConfig.__module__ = __name__


def credit_names() -> list[str]:
    return [s.name for s in REGISTRY if s.credit]


def plan_names() -> list[str]:
    return list(GENERIC_PLANS) + [s.plan for s in REGISTRY if s.plan]


def credit_of(cfg: Any) -> str:
    """The credit ``cfg`` runs: ``sample.credit``, except GDPO's per-reward normalisation (``reward.mode=per_reward``),
    which is the outcome credit computed on the reward components."""
    c = cfg.sample.credit
    return "per_reward" if c == "outcome" and cfg.reward.mode == "per_reward" else c


def _on(s: MethodSpec, cfg: Any) -> bool:
    return credit_of(cfg) == s.name if s.credit else bool(s.enabled(cfg))


def enabled_names(cfg: Any) -> list[str]:
    """Names of the methods ``cfg`` turns on, in hook order."""
    return [s.name for s in REGISTRY if _on(s, cfg)]


def _load(target: Any) -> type:
    if isinstance(target, type):
        return target
    mod, cls = target.split(":")
    return getattr(importlib.import_module(mod), cls)


def check_config(cfg: Any) -> None:
    """The credit and the sampling plan exist; every enabled method's ``check`` (before the model loads)."""
    if credit_of(cfg) not in credit_names():
        raise ValueError(f"sample.credit={cfg.sample.credit!r}: expected one of {' | '.join(credit_names())}")
    if cfg.sample.step_mode not in plan_names():
        raise ValueError(f"sample.step_mode={cfg.sample.step_mode!r}: expected one of {' | '.join(plan_names())}")
    for s in REGISTRY:
        if _on(s, cfg):
            _load(s.target).check(cfg)


def build_methods(cfg: Any, run: Any = None) -> list:
    """The enabled methods, constructed in registry (= hook) order."""
    check_config(cfg)
    return [_load(s.target)(cfg, run) for s in REGISTRY if _on(s, cfg)]


def credit_class(cfg: Any) -> type:
    """The class of the credit ``cfg`` runs (its declarations, e.g. ``has_step_rewards``; nothing is built)."""
    name = credit_of(cfg)
    if name not in credit_names():
        raise ValueError(f"sample.credit={cfg.sample.credit!r}: expected one of {' | '.join(credit_names())}")
    return _load(next(s.target for s in REGISTRY if s.name == name))


def credit_method(cfg: Any, run: Any = None, methods: Optional[list] = None):
    """The credit method of ``cfg`` (from ``methods`` when given, else a new one: sampler-only use)."""
    if methods is not None:
        return next(m for m in methods if m.name == credit_of(cfg))
    return credit_class(cfg)(cfg, run)
