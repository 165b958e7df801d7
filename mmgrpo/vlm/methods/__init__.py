"""VLM methods as modules: one file per method (the math as pure functions, the hooks of
:class:`mmgrpo.engine.method.Method` that wire it to the batch) and this registry.

``REGISTRY`` lists every method in the order the recipe calls their hooks (the order is part of the behaviour:
SEED-GRPO scales the advantages before DAPO drops groups; TW-GRPO's token weights exist before the vLLM importance
weights multiply them; data selection runs before anything is sampled). Each entry names the method, where its class
lives (imported only when enabled: the registry itself does not import torch), the switch that enables it and its
options: a dataclass declared here, next to its entry, which becomes the config section ``methods.<name>`` (``mmgrpo
train --help`` lists every option without importing torch).

Adding a method: write ``mmgrpo/vlm/methods/<name>.py``, add its options and one ``MethodSpec`` here, and a test
(see CONTRIBUTING.md).
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field, make_dataclass
from typing import Any, Callable, Literal, Optional

from mmgrpo.vlm.methods.base import VLMMethod

__all__ = ["MethodSpec", "MethodsConfig", "REGISTRY", "VLMMethod", "build_methods", "check_config",
           "enabled_classes", "enabled_names"]


def _h(text: str) -> dict:
    return {"help": text}


# Options: one dataclass per method, the config section ``methods.<name>`` (``methods.ngrpo.enabled=true``).
@dataclass
class TempSampR1Options:
    enabled: bool = field(default=False, metadata=_h("TempSamp-R1: inject the ground truth as one group member"))
    mode: Literal["shape", "anchor", "none"] = field(
        default="shape", metadata=_h("shape = soft non-linear reward shaping; anchor = A_gt = lambda*max A_on"))
    tau: float = field(default=0.8, metadata=_h("shaping threshold"))
    alpha1: float = field(default=0.01, metadata=_h("shaping slope above tau"))
    alpha2: float = field(default=1.0, metadata=_h("shaping curvature below tau"))
    shape_reward: str = field(
        default="auto", metadata=_h("reward the shaping applies to: auto = the task's accuracy reward (tvg: iou; "
                                    "see reward.accuracy_key), shaped before the weighted sum as the TempSamp-R1 "
                                    "release does (total = w*f(iou) + the other terms); a reward name; or 'total' "
                                    "= shape the weighted total"))
    anchor_lambda: float = field(default=1.2, metadata=_h("anchoring factor lambda_off"))


@dataclass
class TGRPOOptions:
    enabled: bool = field(default=False, metadata=_h("T-GRPO: temporal bonus from a shuffled-frame group (videos)"))
    num_shuffled: int = field(default=0, metadata=_h("completions on shuffled frames per prompt (0 = G/2)"))
    alpha: float = field(default=0.3, metadata=_h("bonus added to correct ordered completions"))
    mu: float = field(default=1.0, metadata=_h("bonus if acc(ordered) >= mu * acc(shuffled); Video-R1 code: 0.8"))
    min_accuracy: float = field(default=0.1, metadata=_h("a completion counts as correct above this accuracy"))


@dataclass
class TWGRPOOptions:
    enabled: bool = field(default=False, metadata=_h("TW-GRPO token weights from intra-group divergence"))
    alpha: float = field(default=1.7, metadata=_h("max token weight (weights in [1, alpha])"))
    clamp: float = field(default=11.0, metadata=_h("clamp of log-prob differences"))


@dataclass
class SelectionOptions:
    enabled: bool = field(default=False, metadata=_h("select training samples by K base-model inferences first"))
    num_inferences: int = field(default=8, metadata=_h("K samples per prompt"))
    criterion: Literal["variance", "gaussian", "nonconstant"] = field(
        default="nonconstant",
        metadata=_h("variance: keep var >= min_variance; gaussian: weight exp(-(m-mu)^2/2s^2) on mean reward "
                    "(Time-R1); nonconstant: drop all-correct/all-wrong (equal rewards)"))
    key: str = field(default="auto", metadata=_h(
        "reward to select on: 'total' (weighted sum), a reward name, or auto = the task's accuracy reward (tvg: "
        "iou) for criterion=gaussian (Time-R1's difficulty is the base model's IoU) and 'total' otherwise"))
    min_variance: float = field(default=0.0, metadata=_h("variance threshold (criterion=variance)"))
    num_keep: int = field(default=0, metadata=_h("keep at most this many (0 = all that pass)"))
    gaussian_mu: float = field(default=0.3, metadata=_h("Gaussian centre on the mean reward"))
    gaussian_sigma: float = field(default=0.2, metadata=_h("Gaussian std"))
    greedy: bool = field(
        default=False, metadata=_h("score with argmax decoding instead of rollout sampling (Time-R1's difficulty is "
                                   "the IoU of one greedy answer: num_inferences=1 greedy=true)"))
    gaussian_keep_zero: bool = field(
        default=False, metadata=_h("criterion=gaussian: also draw samples whose mean reward is 0 (Time-R1 never "
                                   "does: only IoU > 0 items are candidates)"))
    refilter_every_epoch: bool = field(
        default=False, metadata=_h("Time-R1 multi-round: re-score every sample with the current policy and "
                                   "re-select at the start of each epoch"))


@dataclass
class NGRPOOptions:
    enabled: bool = field(default=False, metadata=_h(
        "NGRPO: group statistics include virtual maximum-reward samples (all-wrong groups keep a negative "
        "advantage) + asymmetric clipping; mmgrpo.vlm.methods.ngrpo"))
    max_reward: float = field(default=1.0, metadata=_h(
        "reward of the virtual samples: the largest (weighted) total the task can give (the release: 1.0)"))
    num_virtual: int = field(default=1, metadata=_h("virtual samples per group (the release: 1)"))
    clip_low: Optional[float] = field(default=0.16, metadata=_h(
        "PPO clip epsilon below 1 (binds for A < 0; the release: 0.16); none = algo.clip_low"))
    clip_high: Optional[float] = field(default=0.24, metadata=_h(
        "PPO clip epsilon above 1 (binds for A > 0; the release: 0.24); none = algo.clip_high"))

    def __post_init__(self):
        if self.num_virtual < 1:
            raise ValueError(f"methods.ngrpo.num_virtual must be >= 1, got {self.num_virtual}")


@dataclass
class SeedGRPOOptions:
    enabled: bool = field(default=False, metadata=_h(
        "SEED-GRPO: scale each group's advantages by f(alpha * semantic entropy of its answers / log G); answers "
        "are clustered by meaning (tvg/rec: overlap, mcq/gqa: letters); mmgrpo.vlm.methods.seed_grpo"))
    alpha: float = field(default=0.5, metadata=_h("sensitivity alpha (linear: all-different answers keep 1-alpha)"))
    fn: Literal["linear", "exp", "focal"] = field(default="linear", metadata=_h(
        "f(x): linear 1-x, exp e^-x, focal (1-x)^gamma"))
    gamma: float = field(default=2.0, metadata=_h("focal exponent"))
    estimator: Literal["count", "prob", "mc"] = field(default="count", metadata=_h(
        "p(cluster): count = share of answers; prob = share of the sampled sequences' probability mass; mc = "
        "the paper's Monte-Carlo form -1/K sum log p"))
    length_normalize: bool = field(default=False, metadata=_h("prob/mc: per-token (length-normalised) log-probs"))
    threshold: float = field(default=0.5, metadata=_h("tvg/rec: IoU at which two answers mean the same"))
    unparsed: Literal["shared", "own"] = field(default="shared", metadata=_h(
        "answers that do not parse: one shared 'no answer' cluster, or each its own"))


@dataclass
class DAPOOverlongOptions:
    enabled: bool = field(default=False, metadata=_h(
        "DAPO soft overlong punishment added to the reward: 0 up to max_len - cache_len tokens, then linear to "
        "-factor at max_len; mmgrpo.vlm.methods.dapo_overlong"))
    max_len: int = field(default=0, metadata=_h("L_max in tokens (0 = rollout.max_new_tokens)"))
    cache_len: int = field(default=0, metadata=_h("L_cache, the punishment interval (0 = max_len // 5, DAPO's "
                                                   "4096 of 20480)"))
    factor: float = field(default=1.0, metadata=_h("penalty scale (DAPO 1.0)"))


@dataclass
class EntropyOptions:
    enabled: bool = field(default=False, metadata=_h(
        "per-token entropy of the policy, chunked (entropy/* metrics; one extra no-grad forward per step); "
        "mmgrpo.vlm.methods.entropy_mask"))
    top_quantile: float = field(default=1.0, metadata=_h(
        "rho: train only the top-rho completion tokens by entropy ('Beyond the 80/20 rule': 0.2; TRL "
        "top_entropy_quantile); 1.0 = every token (logging only)"))


@dataclass
class EntropyBonusOptions:
    coef: float = field(default=0.0, metadata=_h(
        "entropy bonus: loss = policy loss - coef * entropy of the current policy over the loss tokens (with "
        "gradient, chunked, aggregated like the policy loss: algo.agg); 0 = off. Temporal-R1 / verl "
        "entropy_coeff: 1e-3; mmgrpo.vlm.methods.entropy_bonus"))

    def __post_init__(self):
        if not (math.isfinite(self.coef) and self.coef >= 0):
            raise ValueError(f"methods.entropy_bonus.coef must be a finite number >= 0, got {self.coef}")


@dataclass
class GDPOOptions:
    enabled: bool = field(default=False, metadata=_h(
        "GDPO: normalise every reward component (reward.weights + additive terms) within its group, sum with the "
        "weights, then standardise over the batch; mmgrpo.vlm.methods.gdpo"))
    renormalize: bool = field(default=True, metadata=_h("batch-standardise the summed advantages (GDPO, TRL)"))


@dataclass
class DifficultyAugOptions:
    enabled: bool = field(default=False, metadata=_h(
        "DeepVideo-R1 difficulty-aware augmentation: prompts easier than the recent mean get masked frames + "
        "noise, harder ones a reasoning hint; mmgrpo.vlm.methods.difficulty_aug"))
    window: int = field(default=8, metadata=_h("replay window W (steps) of the reference mean reward"))
    threshold: float = field(default=0.1, metadata=_h("|difficulty| below this: no augmentation"))
    scale: float = field(default=0.5, metadata=_h("difficulty at which the strength reaches 1"))
    max_mask_frac: float = field(default=0.5, metadata=_h("fraction of frames masked at strength 1"))
    max_noise: float = field(default=25.0, metadata=_h("pixel noise std (0-255 units) at strength 1"))
    max_hint_frac: float = field(default=0.5, metadata=_h(
        "share of a successful answer's reasoning given as the hint at strength 1"))
    success_threshold: float = field(default=0.5, metadata=_h(
        "an answer is 'successful' (a hint source) when its accuracy reward (reward.accuracy_key) reaches this"))
    fallback_hints: bool = field(default=True, metadata=_h(
        "no successful answer yet: hint from the ground truth (MCQ: wrong options; TVG: the half of the video)"))


@dataclass
class HybridCoTOptions:
    enabled: bool = field(default=False, metadata=_h(
        "TempSamp-R1 hybrid CoT schedule: per step a share of the prompts thinks, the rest answers directly; the "
        "format reward follows each prompt's mode; mmgrpo.vlm.methods.hybrid_cot"))
    stage1_steps: int = field(default=0, metadata=_h("steps of stage 1 (direct answers only)"))
    think_fraction: float = field(default=0.5, metadata=_h("stage 2: share of prompts asked to think"))
    ramp_steps: int = field(default=0, metadata=_h("steps over which the share rises linearly to think_fraction"))
    exact: bool = field(default=True, metadata=_h("exactly round(share x prompts) think per step (else each "
                                                  "prompt draws independently)"))


@dataclass
class RefSyncOptions:
    enabled: bool = field(default=False, metadata=_h(
        "TR-DPO / TRL sync_ref_model: every sync_steps updates the KL reference becomes mixup_alpha * policy + "
        "(1 - mixup_alpha) * reference (needs algo.kl_coef > 0, full fine-tuning); mmgrpo.vlm.methods.ref_sync"))
    sync_steps: int = field(default=512, metadata=_h("ref_model_sync_steps tau (TRL 512)"))
    mixup_alpha: float = field(default=0.6, metadata=_h("ref_model_mixup_alpha (TRL 0.6; 1 = hard copy)"))


@dataclass
class KimiLengthOptions:
    enabled: bool = field(default=False, metadata=_h(
        "Kimi k1.5 length penalty added to the reward: within a group 0.5 - (len - min) / (max - min) for a correct "
        "completion, min(0, that) for a wrong one; mmgrpo.vlm.methods.kimi_length"))
    coef: float = field(default=1.0, metadata=_h("weight of the penalty in the total reward"))
    threshold: float = field(default=1.0, metadata=_h(
        "a completion is correct when its accuracy reward (reward.accuracy_key) is at least this"))


# ----------------------------------------------------------------------------- issue #38: loss, ratio, KL variants
@dataclass
class CISPOOptions:
    enabled: bool = field(default=False, metadata=_h(
        "CISPO (MiniMax-M1): the policy loss is -sg(clip(rho, min_ratio, max_ratio)) * A * log pi (every token keeps "
        "a gradient; the clip bounds its weight); mmgrpo.vlm.methods.cispo"))
    max_ratio: float = field(default=5.0, metadata=_h("cap of the detached ratio weight (TRL passes epsilon_high "
                                                      "as this cap)"))
    min_ratio: Optional[float] = field(default=None, metadata=_h("lower bound of the weight (none = no bound)"))


@dataclass
class SAPOOptions:
    enabled: bool = field(default=False, metadata=_h(
        "SAPO (Qwen): soft gate (4/tau) sigmoid(tau (rho - 1)) instead of PPO's hard clip; mmgrpo.vlm.methods.sapo"))
    tau_pos: float = field(default=1.0, metadata=_h("gate temperature where A > 0 (the paper: 1.0)"))
    tau_neg: float = field(default=1.05, metadata=_h("gate temperature where A < 0 (the paper: 1.05)"))


@dataclass
class DCPOOptions:
    enabled: bool = field(default=False, metadata=_h(
        "DCPO: per-token clip bounds from the old token probability + smooth advantage standardisation with each "
        "prompt's reward history; mmgrpo.vlm.methods.dcpo"))
    dynamic_clip: bool = field(default=True, metadata=_h("the per-token bounds (off: algo.clip_low/high)"))
    eps_low: float = field(default=0.16, metadata=_h("epsilon of the lower bound (the paper: 0.16)"))
    eps_high: float = field(default=0.2, metadata=_h("epsilon of the upper bound (the paper: 0.2)"))
    max_ratio: float = field(default=10.0, metadata=_h("hard cap of the upper bound (the paper: 10)"))
    smooth_advantages: bool = field(default=True, metadata=_h(
        "the smooth advantage standardisation (off: GRPO's group advantages)"))


@dataclass
class DHPOOptions:
    enabled: bool = field(default=False, metadata=_h(
        "DHPO: the PPO surrogate on w * token ratio + (1 - w) * GSPO sequence ratio, each clipped in its own region "
        "(averaging variant); mmgrpo.vlm.methods.dhpo"))
    token_weight: float = field(default=0.5, metadata=_h("w (1 = GRPO, 0 = GSPO)"))
    seq_clip_low: float = field(default=3e-4, metadata=_h("sequence-ratio clip epsilon below 1 (GSPO's 3e-4)"))
    seq_clip_high: float = field(default=4e-4, metadata=_h("sequence-ratio clip epsilon above 1 (GSPO's 4e-4)"))


@dataclass
class BalancedAggOptions:
    enabled: bool = field(default=False, metadata=_h(
        "Balanced Aggregation: token means over positive- and negative-advantage responses apart, mixed with their "
        "sequence shares (replaces algo.agg for the policy term); mmgrpo.vlm.methods.balanced_agg"))


@dataclass
class BNPOOptions:
    enabled: bool = field(default=False, metadata=_h(
        "BNPO: advantages (s - p_g) / Beta(alpha, beta) density at the group's success rate p_g, (alpha, beta) "
        "fitted to the batch's success rates every step; mmgrpo.vlm.methods.bnpo"))
    min_reward: float = field(default=0.0, metadata=_h("smallest (weighted) total reward: mapped to 0"))
    max_reward: float = field(default=1.0, metadata=_h("largest (weighted) total reward: mapped to 1"))
    max_weight: float = field(default=1e6, metadata=_h("cap of 1 / density (the release: 1e6)"))


@dataclass
class KLScheduleOptions:
    enabled: bool = field(default=False, metadata=_h(
        "GRPO-D (OThink-MR1) scheduled KL: the KL weight follows a schedule instead of the constant algo.kl_coef "
        "(needs algo.kl_coef > 0 for the reference); mmgrpo.vlm.methods.kl_schedule"))
    start: float = field(default=0.0, metadata=_h("KL weight at step 0"))
    end: Optional[float] = field(default=None, metadata=_h("KL weight after the ramp (none = algo.kl_coef)"))
    steps: int = field(default=100, metadata=_h("steps of the ramp"))
    warmup: int = field(default=0, metadata=_h("steps held at start before the ramp"))
    shape: Literal["linear", "cosine", "constant"] = field(default="linear", metadata=_h("ramp shape"))


@dataclass
class RefResetOptions:
    enabled: bool = field(default=False, metadata=_h(
        "ProRL periodic reference reset: every `every` applied updates the KL reference becomes a copy of the "
        "policy and the optimizer state is cleared (full fine-tuning, algo.kl_coef > 0); "
        "mmgrpo.vlm.methods.ref_reset"))
    every: int = field(default=100, metadata=_h("applied optimizer updates between resets"))
    reset_optimizer: bool = field(default=True, metadata=_h("also clear the optimizer's moments (ProRL does)"))


# ----------------------------------------------------------------------------- issue #38: length and thinking
@dataclass
class GRPOLambdaOptions:
    enabled: bool = field(default=False, metadata=_h(
        "GRPO-lambda: the Kimi length penalty only in groups whose correctness ratio is high (the others keep the "
        "plain reward); mmgrpo.vlm.methods.grpo_lambda"))
    ratio_threshold: float = field(default=0.5, metadata=_h(
        "a group is penalised when its share of correct completions is at least this"))
    top_fraction: float = field(default=0.0, metadata=_h(
        "> 0: instead, penalise this fraction of the step's groups, those with the highest correctness ratios"))
    coef: float = field(default=1.0, metadata=_h("weight of the length penalty in the total reward"))
    threshold: float = field(default=1.0, metadata=_h(
        "a completion is correct when its accuracy reward (reward.accuracy_key) is at least this"))


@dataclass
class DRPOOptions:
    enabled: bool = field(default=False, metadata=_h(
        "DRPO: the positive advantages of correct completions are re-weighted by a length reward normalised "
        "within the group's correct subset (weights mean 1, always > 0); mmgrpo.vlm.methods.drpo"))
    temperature: float = field(default=1.0, metadata=_h(
        "tau of the weights softmax(-z / tau) over the correct subset (z: length z-score there); small = strong"))
    threshold: float = field(default=1.0, metadata=_h(
        "a completion is correct when its accuracy reward (reward.accuracy_key) is at least this"))


@dataclass
class TONOptions:
    enabled: bool = field(default=False, metadata=_h(
        "TON (think or not): a completion may skip its thought (an empty <think></think>, or a direct answer when "
        "direct_is_skip); format reward accepting both; think ratio, lengths and accuracy per mode logged; "
        "mmgrpo.vlm.methods.ton"))
    format_weight: float = field(default=0.0, metadata=_h(
        "weight of TON's format reward (<think>..</think><answer>..</answer>, the thought may be empty) added to "
        "the total (0 = logging only)"))
    direct_is_skip: bool = field(default=True, metadata=_h(
        "a completion without a think block counts as a skip (and passes the format) instead of malformed"))
    threshold: float = field(default=1.0, metadata=_h(
        "a completion is correct when its accuracy reward (reward.accuracy_key) is at least this"))
    group_by: str = field(default="", metadata=_h(
        "a key of the samples' meta (e.g. kind): also log think ratio, length and accuracy per value of it "
        "(ton/<value>/think_ratio ...); empty = off"))


@dataclass
class PassRateFilterOptions:
    enabled: bool = field(default=False, metadata=_h(
        "online difficulty filtering (DAPO / EasyR1 dynamic sampling on the pass rate): drop groups whose pass rate "
        "is outside [low, high] and refill the step; mmgrpo.vlm.methods.pass_rate_filter"))
    low: float = field(default=0.01, metadata=_h("lowest pass rate kept (0.01: drops all-wrong groups)"))
    high: float = field(default=0.99, metadata=_h("highest pass rate kept (0.99: drops all-right groups)"))
    correct_threshold: float = field(default=0.5, metadata=_h(
        "a completion passes when its accuracy reward (reward.accuracy_key; tvg: IoU) is at least this"))
    max_rounds: int = field(default=2, metadata=_h("extra sampling rounds per step to refill dropped groups"))


@dataclass
class PromptReplayOptions:
    enabled: bool = field(default=False, metadata=_h(
        "Prompt Replay: medium-difficulty prompts (pass rate in [low, high]) enter a buffer prioritised by "
        "|pass rate - 0.5| and replace a share of each step's prompts (fresh rollouts: on-policy); "
        "mmgrpo.vlm.methods.prompt_replay"))
    fraction: float = field(default=0.25, metadata=_h("share of each step's prompts taken from the buffer"))
    low: float = field(default=0.01, metadata=_h("lowest pass rate that enters the buffer"))
    high: float = field(default=0.99, metadata=_h("highest pass rate that enters the buffer"))
    correct_threshold: float = field(default=0.5, metadata=_h("a completion passes at accuracy >= this"))
    capacity: int = field(default=256, metadata=_h("prompts in the buffer (worst priority leaves first)"))
    cooldown: int = field(default=1, metadata=_h("steps a replayed prompt waits before it may be replayed again"))
    max_reuse: int = field(default=2, metadata=_h("replays of one prompt before it leaves the buffer"))


@dataclass
class SampleBufferOptions:
    enabled: bool = field(default=False, metadata=_h(
        "Skywork R1V2 selective sample buffer: groups with non-zero advantages are kept; each zero-advantage group "
        "of a step brings back one buffered group (drawn by mean |A|) with its stored advantages; "
        "mmgrpo.vlm.methods.sample_buffer"))
    capacity: int = field(default=64, metadata=_h("groups kept (the most recent)"))
    max_share: float = field(default=0.5, metadata=_h("at most this share of the step's groups is appended"))
    max_reuse: int = field(default=1, metadata=_h("replays of one buffered group before it leaves"))


@dataclass
class IoUCurriculumOptions:
    enabled: bool = field(default=False, metadata=_h(
        "MedLoc-R1-style IoU-threshold curriculum: the accuracy reward becomes 1[IoU >= theta_k] (or gated IoU), "
        "theta_k tightened when a sliding window of hit rates says the policy is ready; "
        "mmgrpo.vlm.methods.iou_curriculum"))
    thresholds: list[float] = field(default_factory=lambda: [0.3, 0.5, 0.7], metadata=_h(
        "increasing IoU thresholds, one per level"))
    mode: Literal["binary", "gated"] = field(default="binary", metadata=_h(
        "binary: 1[IoU >= theta]; gated: IoU * 1[IoU >= theta]"))
    window: int = field(default=5, metadata=_h("steps in the sliding window (and at least at each level)"))
    advance_at: float = field(default=0.6, metadata=_h("window mean hit rate needed to advance a level"))


@dataclass
class LUFFYOptions:
    enabled: bool = field(default=False, metadata=_h(
        "LUFFY: the ground truth joins each group as an expert trace (group advantages over the mixed group); its "
        "tokens are trained with policy shaping -A p/(p+gamma), no clipping; mmgrpo.vlm.methods.luffy"))
    gamma: float = field(default=0.1, metadata=_h("shaping constant gamma of f(p) = p/(p+gamma) (the paper: 0.1)"))


@dataclass
class CHORDOptions:
    enabled: bool = field(default=False, metadata=_h(
        "CHORD: loss = (1-mu) RL + mu SFT on the ground truth (expert rows out of the group advantages), token "
        "weights phi = p(1-p), mu annealed (warmup, cosine decay); mmgrpo.vlm.methods.chord"))
    mu_peak: float = field(default=0.5, metadata=_h("mu after the warmup"))
    mu_valley: float = field(default=0.02, metadata=_h("mu after the decay"))
    warmup_steps: int = field(default=0, metadata=_h("steps of the linear rise 0 -> mu_peak"))
    decay_steps: int = field(default=50, metadata=_h("steps of the cosine decay mu_peak -> mu_valley"))
    token_weight: Literal["phi", "none"] = field(default="phi", metadata=_h(
        "phi: CHORD-phi token weights p(1-p); none: plain SFT tokens (CHORD-mu)"))


@dataclass
class ReLIFTOptions:
    enabled: bool = field(default=False, metadata=_h(
        "ReLIFT: prompts whose groups all fail enter a buffer; every sft_batch of them, their ground truths join "
        "the next update as SFT rows, loss = (1-sft_coef) RL + sft_coef SFT; mmgrpo.vlm.methods.relift"))
    hard_threshold: float = field(default=0.0, metadata=_h("a group is among the hardest at pass rate <= this"))
    correct_threshold: float = field(default=0.5, metadata=_h("a completion passes at accuracy >= this"))
    sft_batch: int = field(default=2, metadata=_h("buffered prompts per SFT term"))
    sft_coef: float = field(default=0.5, metadata=_h("mu: weight of the SFT term in an update that has one"))
    capacity: int = field(default=64, metadata=_h("hardest prompts kept (oldest out)"))


@dataclass
class MGPOOptions:
    enabled: bool = field(default=False, metadata=_h(
        "MGPO multi-turn grounding: checks tools.call_format=mgpo (first turn: a box, cropped from the source; second "
        "turn: the answer) and logs mgpo/grounded, mgpo/acc_grounded; mmgrpo.vlm.methods.mgpo"))


@dataclass
class ParaGRPOOptions:
    enabled: bool = field(default=False, metadata=_h(
        "PARA-GRPO (ParaVT's release): format + tool rewards on the policy tokens, exploration anchoring, per-prompt "
        "nFrames gating; mmgrpo.vlm.methods.para_grpo"))
    format_weight: float = field(default=1.0, metadata=_h(
        "weight of ParaVT's format reward added to the total (release: paravt.reward.format_weight 1.0; 0 = off)"))
    anchor_weight: float = field(default=0.5, metadata=_h(
        "exploration anchoring weight inside the format reward (release: paravt.anchoring.weight 0.5)"))
    answer_suffix: bool = field(default=True, metadata=_h(
        "the format reward's answer-suffix weights (release: paravt.constrained.answer_suffix true)"))
    tool_reward: bool = field(default=True, metadata=_h(
        "add ParaVT's tool reward (0.1 parseable call, +0.5 with a right answer) to the total (release: always)"))
    frame_choices: list[int] = field(default_factory=lambda: [4, 8, 16, 32, 64], metadata=_h(
        "nFrames gating: each video prompt keeps K of its frames, K drawn once per sample from these (release: "
        "{4, 8, 16, 32, 64}); [] = use min_frames / max_frames"))
    format_coef: float = field(default=0.0, metadata=_h(
        "our earlier reading (not the release): weight of a structure-token term (group-normalised 0/1 "
        "well-formedness on structure tokens only); 0 = off"))
    structure_tokens: list[str] = field(default_factory=lambda: ["<tool_call>", "</tool_call>", "<answer>",
                                                                 "</answer>"],
                                        metadata=_h("the strings whose tokens carry the structure-token term"))
    min_frames: int = field(default=0, metadata=_h(
        "with frame_choices=[]: each video prompt's first view keeps an even number of frames drawn per step "
        "uniformly in [min_frames, max_frames] (0 = off; our earlier reading)"))
    max_frames: int = field(default=0, metadata=_h("upper end of the frame budget (0 = the clip's frames)"))


@dataclass
class TurnShapingOptions:
    enabled: bool = field(default=False, metadata=_h(
        "per-turn shaping of tool rollouts: a policy turn whose tool calls failed is penalised on its own tokens "
        "(an extra policy-gradient term); mmgrpo.vlm.methods.turn_shaping"))
    failure_penalty: float = field(default=0.1, metadata=_h("shaping value -penalty per failed call of the turn"))


@dataclass(frozen=True)
class MethodSpec:
    name: str
    target: str  # "module:Class"
    enabled: Callable[[Any], bool]  # TrainConfig -> on / off
    help: str = ""
    options: Optional[type] = None  # a dataclass: the config section methods.<name>


REGISTRY: tuple[MethodSpec, ...] = (
    MethodSpec("selection", "mmgrpo.vlm.methods.selection:DataSelection", lambda c: c.methods.selection.enabled,
               "Temporal-RLT / Time-R1 / DAPO offline data selection (methods.selection.enabled)",
               options=SelectionOptions),
    MethodSpec("tempsamp_r1", "mmgrpo.vlm.methods.tempsamp_r1:TempSampR1", lambda c: c.methods.tempsamp_r1.enabled,
               "TempSamp-R1 ground-truth injection + shaping / anchoring (methods.tempsamp_r1.enabled)",
               options=TempSampR1Options),
    MethodSpec("seed_grpo", "mmgrpo.vlm.methods.seed_grpo:SeedGRPO", lambda c: c.methods.seed_grpo.enabled,
               "SEED-GRPO semantic-entropy advantage scaling (methods.seed_grpo.enabled)", options=SeedGRPOOptions),
    MethodSpec("t_grpo", "mmgrpo.vlm.methods.t_grpo:TGRPO", lambda c: c.methods.t_grpo.enabled,
               "T-GRPO (Video-R1) temporal bonus from shuffled-frame rollouts (methods.t_grpo.enabled)",
               options=TGRPOOptions),
    MethodSpec("dapo_dynamic_sampling", "mmgrpo.vlm.methods.dapo:DynamicSampling", lambda c: c.algo.filter_zero_std,
               "DAPO dynamic sampling: drop zero-variance groups and refill (algo.filter_zero_std)"),
    MethodSpec("overlong_mask", "mmgrpo.vlm.methods.dapo:OverlongMask",
               lambda c: c.rollout.mask_truncated_completions,
               "DAPO overlong filtering: truncated completions leave the loss (rollout.mask_truncated_completions)"),
    MethodSpec("ngrpo", "mmgrpo.vlm.methods.ngrpo:NGRPO", lambda c: c.methods.ngrpo.enabled,
               "NGRPO virtual maximum-reward advantage calibration + asymmetric clipping (methods.ngrpo.enabled)",
               options=NGRPOOptions),
    MethodSpec("hybrid_cot", "mmgrpo.vlm.methods.hybrid_cot:HybridCoT", lambda c: c.methods.hybrid_cot.enabled,
               "TempSamp-R1 hybrid CoT think / no-think schedule (methods.hybrid_cot.enabled)",
               options=HybridCoTOptions),
    MethodSpec("dapo_overlong", "mmgrpo.vlm.methods.dapo_overlong:DAPOOverlong",
               lambda c: c.methods.dapo_overlong.enabled,
               "DAPO soft overlong punishment in the reward (methods.dapo_overlong.enabled)",
               options=DAPOOverlongOptions),
    MethodSpec("difficulty_aug", "mmgrpo.vlm.methods.difficulty_aug:DifficultyAug",
               lambda c: c.methods.difficulty_aug.enabled,
               "DeepVideo-R1 difficulty-aware augmentation (methods.difficulty_aug.enabled)",
               options=DifficultyAugOptions),
    MethodSpec("gdpo", "mmgrpo.vlm.methods.gdpo:GDPO", lambda c: c.methods.gdpo.enabled,
               "GDPO per-reward group normalisation (methods.gdpo.enabled)", options=GDPOOptions),
    MethodSpec("tw_grpo", "mmgrpo.vlm.methods.tw_grpo:TWGRPO", lambda c: c.methods.tw_grpo.enabled,
               "TW-GRPO token weights from intra-group divergence (methods.tw_grpo.enabled)",
               options=TWGRPOOptions),
    MethodSpec("entropy", "mmgrpo.vlm.methods.entropy_mask:TokenEntropy", lambda c: c.methods.entropy.enabled,
               "per-token entropy logging + high-entropy-token masking (methods.entropy.enabled)",
               options=EntropyOptions),
    MethodSpec("entropy_bonus", "mmgrpo.vlm.methods.entropy_bonus:EntropyBonus",
               lambda c: c.methods.entropy_bonus.coef > 0,
               "entropy bonus -coef * H in the policy loss, with gradient (methods.entropy_bonus.coef > 0)",
               options=EntropyBonusOptions),
    MethodSpec("vllm_is", "mmgrpo.vlm.methods.vllm_is:VLLMImportanceSampling",
               lambda c: c.rollout.backend == "vllm" and c.rollout.vllm_is_cap > 0,
               "truncated importance sampling against the vLLM engine (rollout.vllm_is_cap, backend=vllm)"),
    MethodSpec("reg_grpo", "mmgrpo.vlm.methods.reg_grpo:RegGRPO", lambda c: c.algo.loss_type == "reg",
               "Reg-GRPO (DeepVideo-R1) loss share per micro-batch (algo.loss_type=reg)"),
    MethodSpec("ref_sync", "mmgrpo.vlm.methods.ref_sync:RefSync", lambda c: c.methods.ref_sync.enabled,
               "TR-DPO reference-model sync (methods.ref_sync.enabled)", options=RefSyncOptions),
    MethodSpec("kimi_length", "mmgrpo.vlm.methods.kimi_length:KimiLength", lambda c: c.methods.kimi_length.enabled,
               "Kimi k1.5 length penalty in the reward (methods.kimi_length.enabled)", options=KimiLengthOptions),
    # issue #38: length and thinking control (rewards / advantages), then loss, ratio and KL variants
    MethodSpec("grpo_lambda", "mmgrpo.vlm.methods.grpo_lambda:GRPOLambda", lambda c: c.methods.grpo_lambda.enabled,
               "GRPO-lambda length penalty switched by the group's correctness ratio (methods.grpo_lambda.enabled)",
               options=GRPOLambdaOptions),
    MethodSpec("ton", "mmgrpo.vlm.methods.ton:TON", lambda c: c.methods.ton.enabled,
               "TON think-or-not: skip-thought option, format and per-mode logs (methods.ton.enabled)",
               options=TONOptions),
    MethodSpec("drpo", "mmgrpo.vlm.methods.drpo:DRPO", lambda c: c.methods.drpo.enabled,
               "DRPO length weights within the correct subset (methods.drpo.enabled)", options=DRPOOptions),
    MethodSpec("bnpo", "mmgrpo.vlm.methods.bnpo:BNPO", lambda c: c.methods.bnpo.enabled,
               "BNPO Beta-normalised advantages (methods.bnpo.enabled)", options=BNPOOptions),
    MethodSpec("dcpo", "mmgrpo.vlm.methods.dcpo:DCPO", lambda c: c.methods.dcpo.enabled,
               "DCPO dynamic clip + smooth advantage standardisation (methods.dcpo.enabled)", options=DCPOOptions),
    MethodSpec("cispo", "mmgrpo.vlm.methods.cispo:CISPO", lambda c: c.methods.cispo.enabled,
               "CISPO clipped-IS-weight REINFORCE loss (methods.cispo.enabled)", options=CISPOOptions),
    MethodSpec("sapo", "mmgrpo.vlm.methods.sapo:SAPO", lambda c: c.methods.sapo.enabled,
               "SAPO soft-gated loss (methods.sapo.enabled)", options=SAPOOptions),
    MethodSpec("dhpo", "mmgrpo.vlm.methods.dhpo:DHPO", lambda c: c.methods.dhpo.enabled,
               "DHPO token/sequence hybrid ratio (methods.dhpo.enabled)", options=DHPOOptions),
    MethodSpec("balanced_agg", "mmgrpo.vlm.methods.balanced_agg:BalancedAgg", lambda c: c.methods.balanced_agg.enabled,
               "Balanced Aggregation of the policy loss (methods.balanced_agg.enabled)", options=BalancedAggOptions),
    MethodSpec("kl_schedule", "mmgrpo.vlm.methods.kl_schedule:KLSchedule", lambda c: c.methods.kl_schedule.enabled,
               "GRPO-D scheduled KL weight (methods.kl_schedule.enabled)", options=KLScheduleOptions),
    MethodSpec("ref_reset", "mmgrpo.vlm.methods.ref_reset:RefReset", lambda c: c.methods.ref_reset.enabled,
               "ProRL periodic reference + optimizer reset (methods.ref_reset.enabled)", options=RefResetOptions),
    MethodSpec("mgpo", "mmgrpo.vlm.methods.mgpo:MGPO", lambda c: c.methods.mgpo.enabled,
               "MGPO multi-turn grounding with tool rollouts (methods.mgpo.enabled, tools.call_format=mgpo)",
               options=MGPOOptions),
    MethodSpec("para_grpo", "mmgrpo.vlm.methods.para_grpo:ParaGRPO", lambda c: c.methods.para_grpo.enabled,
               "PARA-GRPO as released (ParaVT): format + tool rewards, anchoring, nFrames gating (methods.para_grpo.enabled)",
               options=ParaGRPOOptions),
    MethodSpec("turn_shaping", "mmgrpo.vlm.methods.turn_shaping:TurnShaping",
               lambda c: c.methods.turn_shaping.enabled,
               "per-turn shaping of tool rollouts: failed calls penalise their turn's tokens "
               "(methods.turn_shaping.enabled)", options=TurnShapingOptions),
    MethodSpec("iou_curriculum", "mmgrpo.vlm.methods.iou_curriculum:IoUCurriculum",
               lambda c: c.methods.iou_curriculum.enabled,
               "MedLoc-R1-style IoU-threshold reward curriculum (methods.iou_curriculum.enabled)",
               options=IoUCurriculumOptions),
    MethodSpec("prompt_replay", "mmgrpo.vlm.methods.prompt_replay:PromptReplay",
               lambda c: c.methods.prompt_replay.enabled,
               "Prompt Replay of medium-difficulty prompts (methods.prompt_replay.enabled)",
               options=PromptReplayOptions),
    MethodSpec("pass_rate_filter", "mmgrpo.vlm.methods.pass_rate_filter:PassRateFilter",
               lambda c: c.methods.pass_rate_filter.enabled,
               "online difficulty filtering on a pass-rate window, with refill (methods.pass_rate_filter.enabled)",
               options=PassRateFilterOptions),
    MethodSpec("luffy", "mmgrpo.vlm.methods.luffy:LUFFY", lambda c: c.methods.luffy.enabled,
               "LUFFY off-policy expert traces in the group with policy shaping (methods.luffy.enabled)",
               options=LUFFYOptions),
    MethodSpec("chord", "mmgrpo.vlm.methods.chord:CHORD", lambda c: c.methods.chord.enabled,
               "CHORD annealed SFT auxiliary loss with token weights (methods.chord.enabled)", options=CHORDOptions),
    MethodSpec("relift", "mmgrpo.vlm.methods.relift:ReLIFT", lambda c: c.methods.relift.enabled,
               "ReLIFT SFT on the hardest prompts, interleaved with RL (methods.relift.enabled)", options=ReLIFTOptions),
    MethodSpec("sample_buffer", "mmgrpo.vlm.methods.sample_buffer:SampleBuffer",
               lambda c: c.methods.sample_buffer.enabled,
               "Skywork R1V2 selective sample buffer (methods.sample_buffer.enabled)", options=SampleBufferOptions),
)


# the ``methods`` section of TrainConfig: one field per registry entry that declares options
MethodsConfig = make_dataclass(
    "MethodsConfig", [(s.name, s.options, field(default_factory=s.options)) for s in REGISTRY if s.options],
    namespace={"__doc__": "Options of the methods registered in mmgrpo.vlm.methods (methods.<name>.<option>)."})
MethodsConfig.__module__ = __name__


def enabled_names(cfg: Any) -> list[str]:
    """Names of the methods ``cfg`` enables, in hook order."""
    return [s.name for s in REGISTRY if s.enabled(cfg)]


def _load(target: str) -> type[VLMMethod]:
    mod, cls = target.split(":")
    return getattr(importlib.import_module(mod), cls)


def check_config(cfg: Any) -> None:
    """Every registered method's ``check`` (enabled or not), in registry order."""
    for s in REGISTRY:
        _load(s.target).check(cfg)


def enabled_classes(cfg: Any) -> list[type[VLMMethod]]:
    """The classes of the enabled methods (class attributes such as ``needs_whole_groups``), in hook order."""
    return [_load(s.target) for s in REGISTRY if s.enabled(cfg)]


def build_methods(cfg: Any, run: Any) -> list[VLMMethod]:
    """The enabled methods, constructed in registry (= hook) order."""
    return [_load(s.target)(cfg, run) for s in REGISTRY if s.enabled(cfg)]
