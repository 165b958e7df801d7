"""``flow_grpo train`` configuration: nested dataclasses (YAML + ``key=value`` via :mod:`mmgrpo.utils.config`).

No heavy imports here: ``flow_grpo train --help`` must be instant.

Method presets (plain config): ``method=<name>`` applies ``flow_grpo/presets/<name>.yaml`` before the YAML and the
``key=value`` overrides: ``flow`` (Flow-GRPO), ``dance`` (DanceGRPO), ``fast`` (Flow-GRPO-Fast), ``mix`` / ``mix_flash``
(MixGRPO / -Flash), ``tp_grpo``, ``g2rpo``, ``vgpo``, ``nft`` (DiffusionNFT), ``branch_grpo``, ``adv_grpo``, ``b2``
(B²-DiffuRL); each file says what it sets and why. A method's own options are the section ``methods.<name>`` (declared
in :mod:`flow_grpo.methods`).

The advantage statistics of each preset follow its release: ``optim.adv_scale`` (group | batch std),
``optim.adv_std_ddof`` (0 = population std as numpy's ``np.std``, 1 = Bessel-corrected as ``torch.std``) and
``optim.adv_eps`` (added to the std). Where a preset knowingly differs from its release the preset table of
docs/methods.md says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

from mmgrpo.utils.config import check_choices

from .methods import FlowMethodsConfig

def _f(default, help: str, **kw):
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class SamplingConfig:
    """How trajectories are sampled (see :mod:`flow_grpo.sampler`)."""

    num_steps: int = _f(10, "denoising steps K of a rollout (the last step is never trained)")
    height: int = _f(512, "image height in pixels")
    width: int = _f(512, "image width in pixels")
    num_frames: int = _f(0, "video generators (model.kind=wan): frames per video, 1 + 4k (e.g. 5, 33, 81); 0 = the "
                         "adapter's default (Wan: 81, WanPipeline's); must stay 0 for image generators")
    shift: Optional[float] = _f(None, "flow-matching time shift s of the rollout and eval sigma schedules, "
                                "sigma' = s sigma / (1 + (s - 1) sigma), replacing the folder scheduler's (FLUX / "
                                "Qwen-Image: its resolution-dependent shift is turned off; Wan/UniPC: flow_shift); "
                                "None = the folder's (e.g. DanceGRPO / Pref-GRPO FLUX: 3)")
    guidance_scale: float = _f(4.5, "CFG scale (SD3) or embedded guidance (FLUX)")
    cfg: bool = _f(True, "SD3: classifier-free guidance in rollout AND training (one forward on [uncond; cond]); must be false for FLUX")
    sde_kind: Literal["flow", "dance", "cps"] = _f("cps", "SDE of the stochastic steps: flow (Flow-GRPO) | dance (DanceGRPO) | cps")
    noise_level: float = _f(0.8, "a for flow/cps, eta for dance")
    ode_solver: Literal["euler", "dpmpp2m"] = _f("euler", "deterministic steps after the last SDE step of a rollout (all steps of the eval "
                         "ODE): euler | dpmpp2m (DPM-Solver++ 2nd-order multistep, data prediction, as MixGRPO-Flash; "
                         "ODE steps before/between SDE steps stay Euler, so SDE-step log-probs do not change; the "
                         "ODE completions of tp_grpo/g2rpo stay Euler)")
    post_compress_ratio: float = _f(1.0, "ode_solver=dpmpp2m: the ODE part after the SDE window (K-L grid points, L = "
                                    "last SDE step, shared by all samples) is re-gridded to max(int((K-L)*ratio), 2) "
                                    "points: fewer NFEs (MixGRPO-Flash dpm_post_compress_ratio=0.4); 1 = no compression")
    cps_tempered: bool = _f(False, "cps: Flow-GRPO's tempered log-prob -mean((x-mu)^2) (drops 1/(2s^2)) instead of the exact one")
    # a registry name (flow_grpo.methods.plan_names()), checked when the trainer is built: new plans need no config edit
    step_mode: str = _f("window", "sampling plan, a flow_grpo.methods plan (plan_names()): all | fraction | window | single | "
                        "nft (no SDE step; DiffusionNFT's trained timesteps) | tree (BranchGRPO tree rollout, one tree "
                        "per group) | b2 (B2-DiffuRL: one trunk per group branching K - s steps before the end)")
    timestep_fraction: float = _f(0.6, "fraction mode: each sample trains int((K-1)*f) of the K-1 steps (rounded down, "
                                  "as DanceGRPO; 0 is an error), a random subset drawn from its plan seed")
    plan_per_sample: bool = _f(False, "draw the step plan (fraction subset, random window, single step) from a seed of "
                               "each sample instead of one seed per group (DanceGRPO draws a subset per sample; a "
                               "rollout chunk then runs a masked forward for every step any of its samples trains)")
    window_size: int = _f(3, "window mode: number of SDE (= trained) steps")
    window_range: list[int] = _f([0, 5], "window mode: the window lies in step indices [lo, hi); a negative bound "
                                 "counts from K (-2 = K-2, MixGRPO's limit); hi is capped at K-1")
    window_policy: Literal["fixed", "random", "sliding", "sliding_wrap"] = _f("random", "fixed (start=lo) | random (per group, seeded) | sliding (MixGRPO's progressive "
                            "schedule: the start moves by window_stride from lo; near hi the window shrinks to "
                            "[start, hi), is empty when start == hi, and the start rolls back to lo once it would pass "
                            "hi) | sliding_wrap (full-size windows only, start = lo + (moves*stride mod the number of "
                            "starts); not MixGRPO)")
    window_shift_every: int = _f(25, "sliding, sliding_wrap: sampling iterations (epochs) between window moves "
                                 "(MixGRPO iters_per_group; an epoch may hold several optimizer steps)")
    window_stride: int = _f(1, "sliding, sliding_wrap: steps the start moves per shift (MixGRPO prog_overlap_step)")
    single_steps: list[int] = _f([0, 1, 2, 3], "single mode: candidate SDE step indices (G2RPO eta_step_list), one per group")
    # a registry name (flow_grpo.methods.credit_names()), checked when the trainer is built: new credits need no
    # config edit
    credit: str = _f("outcome", "credit function, a flow_grpo.methods credit (credit_names()): outcome | tp_grpo (turning points "
                     "from ODE completions) | g2rpo (multi-granularity) | vgpo (value-anchored per-step credit from "
                     "ODE completions) | nft (DiffusionNFT: forward-process loss, needs step_mode=nft) | branch_grpo "
                     "(tree reward fusion, depth-wise advantages; step_mode=tree) | b2_diffurl (best/worst branch of "
                     "each trunk; step_mode=b2) | adv_grpo; a method's options are methods.<credit>.*")
    batch_size: int = _f(8, "rollout chunk size; training recomputes log-probs on the same chunks (exact ratio)")
    completion_batch_size: int = _f(32, "max batch of the batched ODE completions (tp_grpo / g2rpo)")
    eval_num_steps: int = _f(0, "denoising steps of the periodic eval (deterministic Euler ODE); 0 = num_steps")
    same_noise_per_group: bool = _f(False, "one x_T per group (DanceGRPO / MixGRPO --init_same_noise, G2RPO, TempFlow "
                                    "seed groups); seeded by the global group id, so identical on every process")
    shared_prefix: bool = _f(True, "tree / branch plans (branch_grpo, b2_diffurl): evaluate the trunk a chunk's samples "
                             "share once per step, not once per leaf (fewer NFEs; false = recompute it per leaf; the "
                             "smaller model batch can move log-probs by float rounding)")


@dataclass
class LoraConfig:
    enabled: bool = _f(True, "train a LoRA adapter (false = full fine-tune of the transformer)")
    rank: int = _f(32, "LoRA rank r")
    alpha: float = _f(64.0, "LoRA alpha")
    target_modules: list[str] = _f(
        ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"],
        "module names to adapt (missing names are skipped)")
    init: str = _f("gaussian", "peft init_lora_weights (gaussian | true | pissa ...)")


@dataclass
class ModelConfig:
    pipeline_dir: str = _f("", "diffusers pipeline folder (one of the pipeline classes of docs/generators.md, e.g. StableDiffusion3Pipeline, FluxPipeline, Flux2Pipeline, WanPipeline, QwenImagePipeline); empty + tiny=... builds a tiny one")
    kind: str = _f("auto", "auto (the pipeline class in model_index.json) | a kind of the adapter registry, flow_grpo.models.ADAPTERS: sd3, flux, wan, qwen_image, ... (docs/generators.md lists them; video kinds take sample.num_frames; flux_kontext, wan_i2v and qwen_image_edit take JSONL prompt lines with an 'image' path)")
    tiny: str = _f("", "build a tiny random pipeline instead, a kind of flow_grpo.models.TINY_BUILDERS: sd3, flux, wan, ... - for smoke tests")
    dtype: Literal["float32", "bfloat16", "float16"] = _f("float32", "transformer dtype: float32 | bfloat16 | float16 (log-probs, latents, advantages and "
                    "the loss are always fp32; LoRA adapters fp32; full fine-tune: optim.fp32_master_weights)")
    max_sequence_length: Optional[int] = _f(
        None, "T5 text tokens; none = the release's (FLUX.1 512, SD3 256; CLIP always 77)")
    lora: LoraConfig = field(default_factory=LoraConfig, metadata={"help": "LoRA adapter (the KL reference is the model with the adapter disabled)"})
    gradient_checkpointing: bool = _f(False, "activation checkpointing in the transformer")
    offload_text_encoders: bool = _f(False, "keep the frozen text encoders (and image encoder / text connectors) on "
                                     "the CPU, moved to the device only to encode prompts not yet cached (each "
                                     "distinct prompt is encoded once per run)")
    vae_slicing: bool = _f(False, "decode the rollout / eval media one sample at a time (the VAE's enable_slicing: "
                           "the decode peak divided by the chunk size; same frames)")
    vae_tiling: bool = _f(False, "decode in overlapping spatial tiles, blended (the VAE's enable_tiling, its default "
                          "tile sizes: lower decode peak for large frames; frames differ slightly from an untiled "
                          "decode where tiles overlap)")


@dataclass
class DataConfig:
    train_path: str = _f("", "prompts: .txt (one per line) or .jsonl ({'prompt': ..., **metadata}, GenEval style)")
    eval_path: str = _f("", "eval prompts (same formats as train_path); empty = data.eval_prompts; both empty = no eval")
    group_size: int = _f(8, "G: images per prompt (one group)")
    groups_per_epoch: int = _f(8, "prompt groups sampled per epoch (over all processes)")
    eval_num_prompts: int = _f(8, "number of eval prompts used (the first ones of the file/list; 0 = all)")
    prompts: list[str] = _f([], "inline prompts (used when train_path is empty)")
    eval_prompts: list[str] = _f([], "inline eval prompts (used when eval_path is empty)")


@dataclass
class RewardConfig:
    """Rewards go through ``flow_grpo.rewards.MultiReward`` (every component wrapped with retry/timeout handling)."""

    weights: dict[str, float] = _f({"brightness": 1.0}, "reward name -> weight; built with flow_grpo.rewards.build_reward(name, "
                                   "**kwargs[name]). A name 'package.module:factory' is imported and called (the plugin "
                                   "mechanism for your own rewards): that runs any code, e.g. {'os:system': 1} calls "
                                   "os.system. Only use config files and overrides you trust")
    kwargs: dict[str, dict] = _f({}, "per-reward constructor kwargs")
    mode: Literal["weighted_sum", "per_reward", "win_rate"] = _f("weighted_sum", "weighted_sum (group-normalise sum_k w_k r_k) | per_reward (GDPO: multi_reward_advantages "
                   "mode=normalize_then_sum, each reward z-scored in its group, then weighted sum) | win_rate (Pref-GRPO: "
                   "pairwise win rate inside each group, explicit group ids; outcome credit only)")
    pairwise_scorer: str = _f("", "win_rate: 'package.module:factory' returning a PairwiseScorer (e.g. a VLM judge; "
                              "imported and called: trusted configs only); empty = compare the weighted sum of the "
                              "pointwise rewards (ScoreComparator)")
    pairwise_symmetric: bool = _f(False, "win_rate: judge every pair in both orders (cancels a judge's position bias, 2x cost)")
    win_rate_weight: float = _f(1.0, "win_rate: weight of the pairwise win rate in the trained reward, "
                                "total = win_rate_weight * win_rate + pointwise_weight * sum_k w_k r_k")
    pointwise_weight: float = _f(0.0, "win_rate: weight of the pointwise rewards' weighted sum (reward.weights) added "
                                 "to the win rate before group normalisation (Pref-GRPO's --use_clip: win rate 0.4 + "
                                 "CLIP 0.6 with weights={clip_score: 1}); 0 = they are only logged")
    on_nonfinite: Literal["drop", "error"] = _f("drop", "non-finite reward: drop (the sample gets valid=False, leaves its "
                                                "group, counted and logged) | error (stop the run)")
    retries: int = _f(2, "extra attempts of a reward call that raised or timed out (per component, per call)")
    retry_backoff: float = _f(1.0, "seconds before retry k are retry_backoff * 2**k")
    timeout: float = _f(600.0, "seconds one reward call may take before it counts as failed (0 = no limit); a timed-out "
                        "call is abandoned in its daemon thread")
    on_failure: Literal["drop", "stop"] = _f("drop", "a reward call still failing after the retries: drop (its samples get valid=False, "
                         "counted and logged) | stop (the run stops with the error, on every process)")
    async_workers: int = _f(1, "reward threads: each rollout chunk is scored while the next chunk is sampled "
                            "(AsyncRewardRunner); 0 = score synchronously after sampling")


@dataclass
class OptimConfig:
    lr: float = _f(3e-4, "AdamW learning rate")
    weight_decay: float = _f(1e-4, "AdamW weight decay")
    betas: tuple[float, float] = _f((0.9, 0.999), "AdamW betas")
    eps: float = _f(1e-8, "AdamW eps")
    max_grad_norm: float = _f(1.0, "gradient clipping (<=0 disables)")
    fp32_master_weights: bool = _f(True, "bf16/fp16 trainable weights (full fine-tune with model.dtype=bfloat16) are "
                                   "updated through fp32 master copies in the optimizer (+4 bytes per weight; "
                                   "mmgrpo.utils.master_weights); false = AdamW directly on the bf16 weights, which "
                                   "rounds away updates below half a bf16 ulp. No effect on fp32 weights (LoRA "
                                   "adapters are fp32) nor under FSDP / DeepSpeed (their own mixed precision)")
    clip_low: float = _f(1e-4, "PPO clip epsilon on the per-step ratio (both sides: the flow loss has no clip-higher)")
    adv_clip_max: float = _f(5.0, "advantages are clamped to +-this")
    adv_scale: Literal["group", "batch", "none"] = _f("group", "advantage std: group | batch (Flow-GRPO global_std) | none")
    adv_std_ddof: Literal[0, 1] = _f(1, "advantage std: 1 = Bessel-corrected, divides by n-1 (torch.std: DanceGRPO, MixGRPO, "
                           "G2RPO) | 0 = population, divides by n (np.std: Flow-GRPO, TP-GRPO)")
    adv_eps: float = _f(1e-4, "added to the advantage std (Flow-GRPO, TP-GRPO: 1e-4; DanceGRPO, MixGRPO, G2RPO: 1e-8)")
    kl_coef: float = _f(0.0, "beta of the KL to the reference (the model with the LoRA adapter off; 0 = no KL)")
    kl_type: Literal["mean", "mean_exact", "velocity"] = _f("mean", "mean (Flow-GRPO: (mu-mu_ref)^2/(2 g^2), |dt| dropped) | mean_exact (true Gaussian KL) | velocity ((v-v_ref)^2)")
    updates_per_epoch: int = _f(1, "optimizer steps per epoch; each spans whole trajectories (all their trained steps)")
    inner_epochs: int = _f(1, "passes over the epoch's rollouts")
    drop_zero_adv: bool = _f(True, "skip trajectories whose advantages are 0 at every trained step")
    best_of_n: int = _f(0, "DanceGRPO best-of-n: train only the n/2 highest- and n/2 lowest-advantage samples of each "
                        "group (n even; 0 = every sample; flow_grpo.methods.best_of_n)")
    lr_schedule: Literal["constant", "linear", "cosine"] = _f("constant", "constant | linear | cosine (decay to 0 over all optimizer steps), after warmup")
    warmup_steps: int = _f(0, "linear LR warmup over this many optimizer steps")
    max_consecutive_skips: int = _f(5, "non-finite advantages/loss/gradients, or an epoch where no group kept two valid "
                                    "rewards, skip the optimizer step (counted, logged); after this many consecutive "
                                    "skips a checkpoint is written to <output_dir>/halted and the run stops (exit 3); "
                                    "a run none of whose steps was applied exports nothing and exits 4")


@dataclass
class EMAConfig:
    enabled: bool = _f(True, "keep an EMA of the trainable weights (used for eval and saved LoRA)")
    decay: float = _f(0.9, "EMA decay")
    update_every: int = _f(8, "optimizer steps between EMA updates")
    warmup: bool = _f(True, "decay of an update at optimizer step s = min(decay, (1 + s) / (10 + s)), as Flow-GRPO's "
                      "EMA and diffusers' EMAModel: without it a short run's EMA (what eval and the saved LoRA use) "
                      "stays near the initial weights")


@dataclass
class RunConfig:
    output_dir: str = _f("runs/flow_grpo", "run directory (logs, checkpoints, LoRA, grids); one run at a time: <output_dir>/.lock names "
                     "the run using it, a second run refuses (exit code 5)")
    seed: int = _f(42, "base seed; every noise/plan seed is a hash of (seed, epoch, global index)")
    num_epochs: int = _f(100, "epochs to train (an epoch = sample groups_per_epoch groups, then update)")
    save_every: int = _f(10, "epochs between checkpoints (0 = only at the end)")
    max_train_seconds: float = _f(0.0, "training-time budget: the epoch in which it runs out is the last one (final "
                                  "eval, checkpoint, LoRA export as usual); kept across resumes (0 = no limit; "
                                  "equal-budget method comparisons)")
    budget_clock: Literal["wall", "cpu"] = _f("wall", "clock of max_train_seconds: wall | cpu (this process's CPU seconds, robust on a "
                           "shared machine)")
    eval_every: int = _f(0, "epochs between evals (0 = only at the end; needs eval prompts): ODE sampling with fixed "
                         "per-prompt seeds, EMA weights if EMA is on, reward means per component, PNG grid")
    image_grid_every: int = _f(10, "epochs between PNG sample grids (0 = never)")
    resume_from: str = _f("auto", "auto | none | path to a checkpoint")
    keep_last: int = _f(3, "most recent checkpoints kept")
    keep_best: bool = _f(True, "also keep the checkpoint with the best eval reward (an eval that beats the best so "
                         "far writes a checkpoint if none is due)")
    mixed_precision: Literal["no", "bf16", "fp16"] = _f("no", "accelerate mixed precision: no | bf16 | fp16")
    tensorboard: bool = _f(True, "write tensorboard logs")
    progress_bar: bool = _f(True, "tqdm progress bar over epochs on the main process (stderr)")
    reward_curves: bool = _f(True, "at the end of training plot the train/eval reward curves to <output_dir>/reward_curves.png")
    device: Literal["auto", "cpu", "cuda"] = _f("auto", "auto (CUDA when available, else CPU) | cpu | cuda; the same "
                                                "setting as mmgrpo train's run.device and the eval scripts' device")
    memory_check: Literal["error", "warn", "off"] = _f("error", "before the model loads, compare the memory planner's per-process estimate (mmgrpo plan / flow_grpo plan; released widths, depth-truncated folders included) with the device's memory (GPU total, or the host's available memory on CPU): error = refuse with exit code 2 when it does not fit, warn = log and start, off")
    allow_no_reward_signal: bool = _f(False, "let a run without any reward signal (every advantage 0 at every step: all groups' rewards equal, e.g. no reward tells the images apart) take its zero-gradient optimizer steps and end with exit code 0, as TRL / the releases do; default false: those steps are skipped steps and such a run exits 4 (use it only to rehearse the pipeline with a model that cannot answer the task, e.g. the smoke mode's tiny models)")
    ddp_find_unused_parameters: bool = _f(False, "DDP: find_unused_parameters (needed if some trainable weights get no "
                                          "gradient in a forward, e.g. partial full fine-tunes)")
    sequence_parallel: int = _f(1, "processes per sequence-parallel group (Ulysses over the video tokens, "
                                "flow_grpo/seq_parallel.py): the processes of a group share its samples and its "
                                "rewards, data parallelism runs over the groups; must divide the number of processes; "
                                "1 = off")


@dataclass
class TrainConfig:
    method: Literal["", "flow", "dance", "fast", "mix", "mix_flash", "tp_grpo", "g2rpo", "vgpo", "nft", "branch_grpo",
                    "b2", "adv_grpo"] = _f("", "preset applied before YAML/overrides: flow | dance | fast | mix | "
                               "mix_flash | tp_grpo | g2rpo | vgpo | nft | branch_grpo | b2 | adv_grpo (empty = none)")
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "the diffusers pipeline and what is trained"})
    sample: SamplingConfig = field(default_factory=SamplingConfig, metadata={"help": "rollouts: SDE kind, step plan, step credit"})
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "train / eval prompts and the group layout"})
    reward: RewardConfig = field(default_factory=RewardConfig, metadata={"help": "reward components, aggregation mode and fault handling"})
    optim: OptimConfig = field(default_factory=OptimConfig, metadata={"help": "loss, AdamW, LR schedule, non-finite step skipping"})
    ema: EMAConfig = field(default_factory=EMAConfig, metadata={"help": "EMA of the trainable weights (eval, saved LoRA)"})
    run: RunConfig = field(default_factory=RunConfig, metadata={"help": "run directory, epochs, eval, checkpoints, logging, devices"})
    methods: FlowMethodsConfig = field(default_factory=FlowMethodsConfig, metadata={"help": "the options of the "
                                       "methods registered in flow_grpo.methods (methods.<name>.<option>)"})

    # method options that moved out of ``sample`` (the old key is an error naming the new one)
    __config_moved__ = {"sample.vgpo_": "methods.vgpo.", "sample.nft_": "methods.nft.",
                        "sample.tree_": "methods.branch_grpo.", "sample.b2_": "methods.b2_diffurl.",
                        "sample.granularities": "methods.g2rpo.granularities"}

    def __post_init__(self):
        check_choices(self)
        check_model_kinds(self.model)
        check_numbers(self)


def check_model_kinds(m: ModelConfig) -> None:
    """``model.kind`` / ``model.tiny`` name a registered generator: the registries (``flow_grpo.models.ADAPTERS``,
    ``flow_grpo.models.TINY_BUILDERS``) are the only lists of kinds, so a new model is registered once. They are
    imported (torch) only for a value other than the default."""
    import difflib

    def check(key: str, value: str, kinds: list[str]) -> None:
        if value not in kinds:
            close = difflib.get_close_matches(value, kinds, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"config key {key!r}: unknown generator {value!r}{hint}; the registered kinds: {kinds}")

    if m.kind != "auto":
        from .models import ADAPTERS

        check("model.kind", m.kind, ["auto", *ADAPTERS])
    if m.tiny:
        from .models import TINY_BUILDERS

        check("model.tiny", m.tiny, ["", *TINY_BUILDERS])


def check_numbers(c: "TrainConfig") -> None:
    """Values that would fail only after the model loaded (IndexError, a NaN optimizer) or silently train
    nothing: refused when the config is parsed (``flow_grpo train`` exits 2 before loading anything)."""
    import math

    def at_least(name: str, v: int, lo: int, why: str = "") -> None:
        if v < lo:
            raise ValueError(f"{name} must be >= {lo}{why}, got {v}")

    at_least("run.num_epochs", c.run.num_epochs, 1, " (a run of no epochs trains nothing)")
    at_least("data.groups_per_epoch", c.data.groups_per_epoch, 1)
    at_least("data.group_size", c.data.group_size, 2, " (advantages are group-relative)")
    at_least("sample.num_steps", c.sample.num_steps, 2, " (the last step is never trained)")
    at_least("sample.batch_size", c.sample.batch_size, 1)
    at_least("optim.updates_per_epoch", c.optim.updates_per_epoch, 1)
    at_least("optim.inner_epochs", c.optim.inner_epochs, 1)
    at_least("optim.max_consecutive_skips", c.optim.max_consecutive_skips, 1)
    at_least("ema.update_every", c.ema.update_every, 1)
    at_least("run.sequence_parallel", c.run.sequence_parallel, 1)
    for name, v in (("optim.warmup_steps", c.optim.warmup_steps), ("run.save_every", c.run.save_every),
                    ("run.eval_every", c.run.eval_every), ("run.image_grid_every", c.run.image_grid_every)):
        at_least(name, v, 0)
    for name, v in (("optim.lr", c.optim.lr), ("optim.weight_decay", c.optim.weight_decay),
                    ("optim.kl_coef", c.optim.kl_coef), ("run.max_train_seconds", c.run.max_train_seconds)):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {v}")
    if not math.isfinite(c.optim.eps) or c.optim.eps <= 0:
        raise ValueError(f"optim.eps must be a finite number > 0, got {c.optim.eps}")
    for name, v in (("optim.clip_low", c.optim.clip_low), ("optim.adv_clip_max", c.optim.adv_clip_max)):
        if not v > 0:  # inf = no clipping
            raise ValueError(f"{name} must be > 0, got {v}")
    if math.isnan(c.optim.max_grad_norm):
        raise ValueError("optim.max_grad_norm is NaN (<= 0 disables clipping)")
    if not all(math.isfinite(b) and 0 <= b < 1 for b in c.optim.betas):
        raise ValueError(f"optim.betas must be two numbers in [0, 1), got {list(c.optim.betas)}")


PRESETS_DIR = Path(__file__).parent / "presets"


def preset_names() -> list[str]:
    """The presets ``method=<name>`` can apply (``flow_grpo/presets/<name>.yaml``)."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def preset_values(method: str) -> dict[str, object]:
    """The dotted keys a preset sets and their values."""
    import yaml

    if method not in preset_names():
        raise ValueError(f"unknown method {method!r}; presets: {preset_names()}")
    raw = yaml.safe_load((PRESETS_DIR / f"{method}.yaml").read_text()) or {}

    def flat(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flat(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}", v

    return dict(flat(raw))


def preset_overrides(method: str) -> list[str]:
    if not method:
        return []
    import yaml

    return [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
            for k, v in preset_values(method).items()]


def load_train_config(yaml_path: Optional[str] = None, overrides: Optional[list[str]] = None) -> TrainConfig:
    """defaults < method preset < YAML < key=value. The method is read from the overrides or the YAML."""
    from mmgrpo.utils.config import load_config

    overrides = list(overrides or [])
    first = load_config(TrainConfig, yaml_path, overrides)
    if not first.method:
        return first
    return load_config(TrainConfig, yaml_path, preset_overrides(first.method) + overrides) if yaml_path is None \
        else _with_preset_under_yaml(first.method, yaml_path, overrides)


def _with_preset_under_yaml(method: str, yaml_path: str, overrides: list[str]) -> TrainConfig:
    """Preset below the YAML: apply preset, then YAML keys, then overrides (YAML keys flattened as overrides)."""
    import yaml

    from mmgrpo.utils.config import load_config

    with open(yaml_path) as f:
        raw = yaml.safe_load(f) or {}

    def flat(d, prefix=""):
        out = []
        for k, v in d.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict) and k not in ("weights", "kwargs"):
                out += flat(v, key + ".")
            else:
                out.append(f"{key}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}")
        return out

    return load_config(TrainConfig, None, preset_overrides(method) + flat(raw) + overrides)
