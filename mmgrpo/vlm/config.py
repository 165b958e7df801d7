"""Configuration of the VLM GRPO trainer (nested dataclasses; YAML + ``key=value`` via ``mmgrpo.utils.config``).

Every method is a config switch on the same loop (``mmgrpo.vlm.train.trainer``):

* plain GRPO / DAPO / Dr.GRPO: ``algo.*`` (advantage scale, clip, aggregation, KL, num_iterations, group filter);
* Reg-GRPO (DeepVideo-R1): ``algo.loss_type=reg``;
* every other method (``mmgrpo.vlm.methods.REGISTRY``): ``methods.<name>.enabled=true`` and its options
  ``methods.<name>.<option>``, e.g. ``methods.tempsamp_r1.mode=anchor`` (TempSamp-R1), ``methods.t_grpo`` (Video-R1),
  ``methods.tw_grpo``, ``methods.selection`` (Temporal-RLT / Time-R1 / DAPO data selection), ``methods.ngrpo``;
* answer parsing as a release does it (``mmgrpo.vlm.rewards.protocols``): ``reward.parse_mode=time_r1`` (Time-R1),
  ``tempsamp_r1`` (TempSamp-R1), ``video_r1`` (Video-R1 / T-GRPO), ``vlm_r1`` (VLM-R1 REC); default ``lenient``.

No torch import here: ``mmgrpo train --help`` stays fast.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from mmgrpo.vlm.methods import MethodsConfig
from mmgrpo.vlm.models.adapters import ADAPTERS, check_family
from mmgrpo.vlm.tools.config import ToolsConfig
from mmgrpo.utils.config import check_choices


def _h(text: str) -> dict:
    return {"help": text}


@dataclass
class LoraConfig:
    enabled: bool = field(default=False, metadata=_h("train LoRA adapters instead of full fine-tuning"))
    rank: int = field(default=16, metadata=_h("LoRA rank r"))
    alpha: int = field(default=32, metadata=_h("LoRA alpha (scale alpha/rank)"))
    dropout: float = field(default=0.0, metadata=_h("LoRA dropout; keep 0 so old and new log-probs agree"))
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        metadata=_h("LLM linear layers to adapt (vision tower excluded unless include_vision)"))
    include_vision: bool = field(default=False, metadata=_h("also adapt the vision tower"))


@dataclass
class ModelConfig:
    path: str = field(default="", metadata=_h("local model folder (from_pretrained), e.g. a Qwen2.5-VL-7B checkpoint"))
    family: str = field(default="auto", metadata=_h(
        f"model family: auto (config.json's model_type) | a family of the adapter registry "
        f"mmgrpo.vlm.models.adapters.ADAPTERS: {' | '.join(ADAPTERS)}"))
    dtype: Literal["float32", "bfloat16", "float16"] = field(default="bfloat16", metadata=_h(
        "weights dtype; with bfloat16 LoRA adapters stay fp32 (peft), full fine-tuning updates through fp32 masters "
        "(optim.fp32_master_weights), log-probs / advantages / loss are always fp32"))
    attn_implementation: str = field(default="sdpa", metadata=_h("sdpa | flash_attention_2 | eager"))
    freeze_vision: bool = field(default=True, metadata=_h("freeze the vision tower (ViT + merger)"))
    gradient_checkpointing: bool = field(default=False, metadata=_h("activation checkpointing in the LLM"))
    lora: LoraConfig = field(default_factory=LoraConfig)
    lora_path: str = field(default="", metadata=_h("start from an existing LoRA adapter folder"))


@dataclass
class DataConfig:
    train_file: str = field(default="", metadata=_h("canonical JSONL of samples (mmgrpo.vlm.data schema)"))
    media_root: str = field(default="", metadata=_h("prefix for relative video/image paths"))
    task: str = field(default="tvg", metadata=_h(
        "tvg | mcq | gqa | rec | numeric (prompt + reward family); an mcq run may also hold open-answer 'qa' samples "
        "(Video-R1's numerical / OCR / free-form / regression, scored by reward video_r1_accuracy)"))
    prompt_mode: Literal["think", "no_think", "hybrid"] = field(
        default="think", metadata=_h("mmgrpo.vlm.data prompt mode: <think> reasoning, direct answer, or hybrid"))
    answer_format: Literal["seconds", "json"] = field(default="seconds",
                                                      metadata=_h("TVG answer format asked for in the prompt"))
    prompt_template: str = field(default="mmgrpo", metadata=_h(
        "what the model is shown: mmgrpo = the project's own prompt (prompt_mode, answer_format, query_position "
        "apply), or a release's prompt reproduced exactly (system turn, media/text order, instruction, options, query "
        "case): time_r1_v1 | time_r1_eval | time_r1_v2 | videochat_r1_tg | videochat_r1_gqa | tempsamp_r1 | video_r1 | "
        "vlm_r1_rec | video_rts | tw_grpo_mixed (mmgrpo.vlm.data.templates; `mmgrpo check` prints the rendered "
        "prompt)"))
    query_position: Literal["after", "before"] = field(default="after", metadata=_h(
        "prompt_template=mmgrpo: where the task text goes in the user turn: after the video/image (default; Video-R1, "
        "VLM-R1 and TempSamp-R1 also put the media first, Time-R1's training prompt and VideoChat-R1 the text) or "
        "before it, so that with causal attention the visual tokens can attend to the query (mmgrpo.vlm.data.prompts."
        "build_messages); must match the order the model was fine-tuned with. Release templates fix their own order"))
    max_samples: int = field(default=0, metadata=_h("use only the first N samples (0 = all)"))
    shuffle: bool = field(default=True, metadata=_h("reshuffle prompts every epoch (seeded)"))
    on_missing_media: Literal["skip", "error"] = field(
        default="skip", metadata=_h("a sample whose video/image is missing, unreadable or over the size caps "
                                    "(max_image_pixels, max_video_frame_pixels): skip and count it, or raise (at load "
                                    "time one error lists every such sample with file:line)"))
    media_check: Literal["header", "exists"] = field(default="header", metadata=_h(
        "check every video/image when the data is loaded, before the model: header = open the header (image size and "
        "PNG checksums, video size / fps / duration without decoding a frame; ~0.1-4 ms per distinct file), exists "
        "= only that the files exist (very large datasets known to be good); see docs/reliability.md"))
    max_image_pixels: int = field(default=89_478_485, metadata=_h(
        "an image with more pixels is unusable media (default = Pillow's decompression-bomb limit, ~89.5 MP)"))
    max_video_frame_pixels: int = field(default=7680 * 4320, metadata=_h(
        "decode cap: a video whose header claims larger frames is unusable media, refused before any frame is "
        "decoded (default 8K UHD, 7680x4320)"))
    duration_tolerance: float = field(default=2.0, metadata=_h(
        "seconds: an annotated duration that differs from the video's by more than max(this, duration_tolerance_frac "
        "x the video's duration) is a duration mismatch"))
    duration_tolerance_frac: float = field(default=0.05, metadata=_h(
        "relative part of the duration tolerance (fraction of the video's duration)"))
    on_duration_mismatch: Literal["skip", "warn", "error"] = field(default="skip", metadata=_h(
        "a sample whose annotated duration disagrees with its video's: skip and count it (default: its spans are on "
        "another timeline and would teach wrong times), warn (keep it, count and list it) or raise before loading "
        "the model"))
    media_check_workers: int = field(default=8, metadata=_h("threads of the media check at load time"))
    video_fps: float = field(default=2.0, metadata=_h("frame sampling rate (frames per second)"))
    max_frames: int = field(default=768, metadata=_h("max sampled frames per video"))
    min_frames: int = field(default=4, metadata=_h("min sampled frames per video"))
    video_min_pixels: int = field(default=16 * 28 * 28, metadata=_h("per-frame min pixels"))
    video_max_pixels: int = field(default=768 * 28 * 28, metadata=_h("per-frame max pixels"))
    video_total_pixels: float = field(default=3584 * 28 * 28,
                                      metadata=_h("pixel budget of the whole video (caps frames x pixels)"))
    image_min_pixels: int = field(default=0, metadata=_h("image min pixels (0 = the processor's own setting)"))
    image_max_pixels: int = field(default=0, metadata=_h("image max pixels (0 = the processor's own setting)"))
    max_prompt_tokens: int = field(
        default=0, metadata=_h("a prompt longer than this many tokens, vision tokens included, is a bad sample "
                               "(0 = no limit)"))
    prefetch: int = field(default=2, metadata=_h(
        "decode + preprocess the next N steps' videos/images in a background thread while the current step trains "
        "(0 = inline, in the step).  Same tensors either way; a checkpoint records the batch being trained.  2 "
        "(double buffering) absorbs a batch that decodes slower than a step (longer videos, a busy CPU), which 1 "
        "turns into waiting; each extra step holds one more batch of prepared tensors in host memory"))
    decode_threads: int = field(default=1, metadata=_h(
        "video decoder threads per file (decord / PyAV; 0 = FFmpeg's automatic choice, one per core).  The frames "
        "are identical; 1 uses the least CPU time in total (17-28 % less than automatic on 2 cores), which is what "
        "counts when decoding runs in the background next to training (data.prefetch >= 1).  0 can shorten an "
        "inline decode (data.prefetch=0) of large videos on an idle many-core machine"))
    check_samples: int = field(default=2, metadata=_h(
        "before step 1, check the first N samples as `mmgrpo check` does (the ground truth written as the prompt asks "
        "gets every weighted reward's maximum, the pixel budget reaches the processor, a rebuilt prompt tokenises as "
        "the rollout's) and stop with the problems listed; 0 = off"))
    on_bad_sample: Literal["skip", "error"] = field(
        default="skip", metadata=_h("a sample the model cannot take (empty query, over max_prompt_tokens, an image "
                                    "the processor rejects): skip and count it, or raise naming it"))


@dataclass
class RolloutConfig:
    backend: Literal["hf", "vllm"] = field(default="hf", metadata=_h("hf = model.generate; vllm = GPU engine"))
    group_size: int = field(default=8, metadata=_h("G: completions per prompt (one group)"))
    max_new_tokens: int = field(default=256, metadata=_h("max completion tokens"))
    temperature: float = field(default=1.0, metadata=_h("sampling temperature (also in the log-probs)"))
    top_p: float = field(default=1.0, metadata=_h("nucleus sampling"))
    top_k: int = field(default=0, metadata=_h("top-k sampling (0 = off)"))
    generation_batch_size: int = field(default=32, metadata=_h("rows per generate() call"))
    shared_prefix: bool = field(default=True, metadata=_h(
        "hf backend: prefill each prompt (vision tower + prompt tokens) once and expand its KV cache to the G "
        "samples (same seeds -> same tokens as the repeated path, log-probs equal to ~1e-6); false = repeat "
        "every prompt G times through model.generate (G vision-tower passes and prefills)"))
    mask_truncated_completions: bool = field(
        default=False, metadata=_h("exclude completions that hit max_new_tokens from the loss (still counted)"))
    vllm_gpu_memory_utilization: float = field(default=0.3, metadata=_h("vLLM colocate memory fraction"))
    vllm_mode: Literal["colocate", "server"] = field(
        default="colocate", metadata=_h("vLLM placement: colocate = an engine inside each training process on its "
                                        "GPU (weights by CUDA IPC); server = a separate `python -m "
                                        "mmgrpo.vlm.models.vllm_server` on other GPUs (HTTP generate, NCCL weights)"))
    vllm_server_url: str = field(default="http://127.0.0.1:8000",
                                 metadata=_h("server mode: base URL of mmgrpo.vlm.models.vllm_server"))
    vllm_server_timeout: float = field(
        default=240.0, metadata=_h("server mode: seconds to wait for the server at start and per HTTP call"))
    vllm_group_port: int = field(default=51216, metadata=_h(
        "server mode: TCP port of the weight-sync NCCL rendezvous, hosted by training process 0"))
    vllm_group_host: str = field(default="", metadata=_h(
        "server mode: address of training process 0 as the server reaches it (empty = this machine's address on "
        "the route to the server)"))
    vllm_max_model_len: int = field(default=8192, metadata=_h("colocate: vLLM max prompt + completion tokens"))
    onpolicy_check: bool = field(default=True, metadata=_h(
        "step-0 on-policy check: at the first step, before any update, the trainer's log-probs of the sampled "
        "completions must equal the rollout backend's (ratio 1 up to rounding), else the run stops naming the "
        "likely cause (template / processor, generation config, dtype); mmgrpo.vlm.monitor.onpolicy"))
    onpolicy_tol: float = field(default=0.0, metadata=_h(
        "bound of the step-0 check on max |ratio-1|; 0 = by the compute precision (model.dtype, or the autocast "
        "dtype of run.mixed_precision): float32 max <= 1e-3, bfloat16 mean <= 2e-2, float16 mean <= 5e-3 "
        "(half-precision kernels leave rare large outliers: the max is only logged)"))
    vllm_is_cap: float = field(default=2.0, metadata=_h(
        "truncated importance sampling (TRL's vLLM correction): each token's policy loss is multiplied by "
        "min(exp(logp_trainer_old - logp_vllm), cap); 0 = off"))


@dataclass
class RewardConfig:
    weights: dict[str, float] = field(
        default_factory=lambda: {"iou": 1.0, "format": 0.5},
        metadata=_h("reward names and weights, total = sum w_k r_k: the built-in rewards "
                    "(mmgrpo.vlm.rewards.registry.REWARDS), 'judge' (a model-based judge of free-form answers, "
                    "mmgrpo.vlm.rewards.judge) or your own reward as an import path 'package.module:factory': "
                    "factory(**reward.kwargs[name]) returns reward(completions, samples) -> N floats "
                    "(docs/rewards.md). An import path IMPORTS AND RUNS THAT CODE (your explicit choice): only use "
                    "configs and overrides you trust"))
    kwargs: dict[str, dict] = field(
        default_factory=dict,
        metadata=_h("constructor arguments of the open rewards: reward.kwargs.judge (model, template, scale, "
                    "batch_size, ...) or reward.kwargs.'package.module:factory' (YAML mapping per reward)"))
    accuracy_key: str = field(
        default="auto", metadata=_h("reward used as 'accuracy' by T-GRPO; auto = the task's primary "
                                    "(tvg: iou, mcq/gqa: mcq, rec: box_iou)"))
    parse_mode: str = field(
        default="lenient",
        metadata=_h("how answers are read and measured: lenient (the project's tolerant parser) or a release's "
                    "rules so rewards match the paper: time_r1 | time_r1_eval | tempsamp_r1 (tvg), video_r1 | "
                    "video_r1_eval (mcq), vlm_r1 | vlm_r1_eval (rec), nextgqa (gqa); see "
                    "mmgrpo.vlm.rewards.protocols.PARSE_MODES"))
    options: dict[str, Any] = field(default_factory=dict,
                                    metadata=_h("extra build_reward_fn options, YAML values (e.g. {sigma: 0.2})"))
    on_nonfinite: Literal["drop", "error"] = field(
        default="drop", metadata=_h("a NaN/inf reward: drop the row from its group (counted, logged) or stop the "
                                    "run with an error naming the samples (a checkpoint is written first)"))
    retries: int = field(default=2, metadata=_h("retries of a reward call that raises or times out"))
    retry_backoff: float = field(default=1.0, metadata=_h("seconds before the first retry (doubles each retry)"))
    timeout: float = field(default=0.0, metadata=_h("seconds per reward call, e.g. a remote judge (0 = no limit)"))
    overlap_prompts: int = field(
        default=0, metadata=_h("> 0: generate the step's prompts in chunks of this many and compute each chunk's "
                               "rewards in a background thread while the next chunk generates (the same rewards; "
                               "hides a slow judge / remote reward behind generation; mmgrpo.vlm.train."
                               "reward_overlap); 0 = generate everything, then score"))
    on_failure: Literal["drop", "stop"] = field(
        default="drop", metadata=_h("a reward call still failing after the retries: drop its rows (counted, "
                                    "logged) or stop the run (a checkpoint is written first)"))


@dataclass
class AlgoConfig:
    adv_scale: Literal["group", "batch", "none"] = field(
        default="group", metadata=_h("advantage std scaling: group (GRPO), batch (Lite-PPO), none (Dr.GRPO)"))
    adv_eps: float = field(default=1e-4, metadata=_h("epsilon added to the std"))
    loss_type: Literal["clip", "reg"] = field(default="clip", metadata=_h("clip = PPO-clip GRPO; reg = Reg-GRPO"))
    clip_low: float = field(default=0.2, metadata=_h("PPO clip epsilon (low side)"))
    clip_high: Optional[float] = field(default=None, metadata=_h("clip-higher epsilon (DAPO 0.28); none = clip_low"))
    dual_clip: Optional[float] = field(default=None, metadata=_h("dual-clip cap c > 1 for A < 0 (EasyR1 3.0)"))
    ratio_level: Literal["token", "sequence"] = field(default="token", metadata=_h("sequence = GSPO ratio"))
    agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "local_token_mean"] = field(
        default="token_mean", metadata=_h(
            "loss aggregation (sets the length bias): token_mean = over the step's tokens (DAPO, TRL 'dapo'); "
            "seq_mean_token_mean (GRPO); seq_mean_token_sum_norm (Dr.GRPO); local_token_mean = over each "
            "micro-batch's tokens (TRL 'bnpo'; BNPO the paper is methods.bnpo)"))
    kl_coef: float = field(default=0.0, metadata=_h("beta of the KL to the frozen reference (0 = no reference)"))
    kl_estimator: Literal["k1", "k2", "k3"] = field(default="k3", metadata=_h("per-token KL estimator"))
    num_iterations: int = field(default=1, metadata=_h("optimizer updates per rollout batch (mu); >1 uses old log-probs"))
    filter_zero_std: bool = field(default=False,
                                  metadata=_h("DAPO dynamic sampling: drop groups whose rewards are all equal"))
    filter_max_rounds: int = field(default=3, metadata=_h("extra sampling rounds to refill filtered groups"))
    logprob_chunk_size: int = field(
        default=256, metadata=_h("tokens per chunk of the output head in token log-probs / TW-GRPO weights "
                                 "(mmgrpo.vlm.models.chunked): only (chunk x vocab) logits exist at a time, in forward "
                                 "and backward, with the same values and gradients; 0 = full (N x T x vocab) "
                                 "logits"))


@dataclass
class OptimConfig:
    lr: float = field(default=1e-6, metadata=_h("AdamW learning rate"))
    weight_decay: float = field(default=0.01, metadata=_h("AdamW weight decay"))
    betas: tuple[float, float] = field(default=(0.9, 0.999), metadata=_h("AdamW betas"))
    warmup_steps: int = field(default=0, metadata=_h("linear LR warmup steps"))
    lr_schedule: Literal["constant", "cosine", "linear"] = field(default="constant", metadata=_h("LR schedule"))
    max_grad_norm: float = field(default=1.0, metadata=_h("gradient clipping (0 = off)"))
    fp32_master_weights: bool = field(
        default=True, metadata=_h("bf16/fp16 trainable weights (full fine-tuning with model.dtype=bfloat16) are "
                                  "updated through fp32 master copies in the optimizer (+4 bytes per weight; "
                                  "mmgrpo.utils.master_weights); false = AdamW directly on the bf16 weights, which "
                                  "rounds away updates below half a bf16 ulp (at lr 1e-6 nearly all). No effect on "
                                  "fp32 weights (LoRA adapters stay fp32) nor under FSDP / DeepSpeed"))


@dataclass
class RunConfig:
    output_dir: str = field(
        default="runs/mmgrpo", metadata=_h("run directory (metrics, completions, checkpoints); one run at a time: "
                                           "<output_dir>/.lock names the run using it, a second run refuses (exit "
                                           "code 5)"))
    max_steps: int = field(default=100, metadata=_h("rollout steps"))
    max_train_seconds: float = field(
        default=0.0, metadata=_h("training-time budget: stop (save, export) after the step in which it runs out; "
                                 "kept across resumes (0 = no limit; equal-budget method comparisons)"))
    budget_clock: Literal["wall", "cpu"] = field(
        default="wall", metadata=_h("clock of max_train_seconds: wall, or cpu = this process's CPU seconds (robust "
                                    "on a shared machine)"))
    prompts_per_device: int = field(default=2, metadata=_h("prompts per process per step (rows = x G)"))
    micro_batch_size: int = field(default=16, metadata=_h("rows per forward/backward (whole groups, >= 1 group)"))
    prompts_per_step: int = field(
        default=0, metadata=_h("global prompts per step (0 = prompts_per_device x processes); when not a multiple "
                               "of the number of processes, a group's rows are split across processes (advantages "
                               "gathered; not with tempsamp_r1 / t_grpo / tw_grpo / filter_zero_std / length reward)"))
    grad_sync: Literal["auto", "manual", "accelerate"] = field(
        default="auto", metadata=_h("how gradients meet across processes: manual = trainer sums them (DDP-free; "
                                    "LoRA / replicated full FT); accelerate = accelerator.prepare (DDP, FSDP, "
                                    "DeepSpeed); auto = accelerate under FSDP / DeepSpeed, else manual"))
    logprob_impl: Literal["naive", "prefix_group"] = field(
        default="prefix_group",
        metadata=_h("prefix_group: each prompt (vision + text) encoded once per group (mmgrpo.vlm.models.prefix_group; "
                    "same numbers as naive), with a logged fallback to naive where it is not exact or not "
                    "supported (run.grad_sync=accelerate, unverified model families, reentrant checkpointing); "
                    "naive: the prompt repeated per row"))
    seed: int = field(default=0, metadata=_h("base seed (data order, per-sample generation seeds)"))
    log_every: int = field(default=1, metadata=_h("log metrics + sampled completions every N steps"))
    num_completions_to_log: int = field(default=8, metadata=_h("completions written to completions.jsonl per log"))
    save_every: int = field(default=50, metadata=_h("checkpoint every N steps (and at the end); 0 = end only"))
    keep_last: int = field(default=3, metadata=_h("most recent checkpoints to keep"))
    best_metric: str = field(
        default="", metadata=_h("also keep the checkpoint with the best value of this logged metric, e.g. "
                                "reward/total/mean ('' = off)"))
    best_mode: Literal["max", "min"] = field(default="max", metadata=_h("best_metric: higher or lower is better"))
    resume_from: str = field(default="auto", metadata=_h("auto | none | path to a checkpoint"))
    device: Literal["auto", "cpu", "cuda"] = field(default="auto", metadata=_h(
        "auto (CUDA when available, else CPU) | cpu | cuda; the same setting as flow_grpo train's run.device and "
        "the eval scripts' device"))
    mixed_precision: Literal["no", "bf16", "fp16"] = field(default="no", metadata=_h("accelerate autocast"))
    tensorboard: bool = field(default=True, metadata=_h("write tensorboard events"))
    progress_bar: bool = field(default=True, metadata=_h("tqdm progress bar over steps on the main process (stderr)"))
    max_consecutive_skips: int = field(
        default=5, metadata=_h("optimizer steps skipped in a row (NaN/inf advantages, loss or gradients, or no "
                               "valid group: all media missing / reward calls failed) before the run writes a "
                               "checkpoint and stops, exit code 3 (0 = never stop; a run whose every step was "
                               "skipped still ends with exit code 4 and no final checkpoint)"))
    memory_check: Literal["error", "warn", "off"] = field(default="error", metadata=_h(
        "before the model loads, compare the memory planner's per-process estimate (mmgrpo plan / flow_grpo plan; released widths, depth-truncated folders included) with the device's memory (GPU total, or the host's available memory on CPU): error = refuse with exit code 2 when it does not fit, warn = log and start, off"))
    allow_no_reward_signal: bool = field(default=False, metadata=_h(
        "let a run without any reward signal (every advantage 0 at every step: all groups' rewards equal, e.g. no completion parses) take its zero-gradient optimizer steps and end with exit code 0, as TRL / the releases do; default false: those steps are skipped steps and such a run exits 4 (use it only to rehearse the pipeline with a model that cannot answer the task, e.g. the smoke mode's tiny models)"))


@dataclass
class ValidationConfig:
    """Greedy evaluation on a fixed validation set during training (mmgrpo.vlm.monitor.validation)."""

    file: str = field(default="", metadata=_h(
        "validation JSONL (canonical format, same task as data.train_file); never the held-out test split "
        "('' = no validation)"))
    every: int = field(default=0, metadata=_h("evaluate every N optimizer steps and after the last one (0 = off)"))
    at_start: bool = field(default=True, metadata=_h("also evaluate the starting weights (step 0) of a fresh run"))
    max_samples: int = field(default=0, metadata=_h("first N validation samples (0 = all)"))
    batch_size: int = field(default=4, metadata=_h(
        "prompts per greedy generate() call (use eval/generate_vlm.py's decoding.batch_size for identical "
        "batches)"))
    max_new_tokens: int = field(default=0, metadata=_h("greedy completion budget (0 = rollout.max_new_tokens)"))
    metric: str = field(default="", metadata=_h(
        "headline metric of the curve ('' = task default: tvg mIoU, other tasks accuracy); logged as val/<metric>"))
    select_best: bool = field(default=False, metadata=_h(
        "choose the kept 'best' checkpoint on validation only: saves a checkpoint at every validation step and sets "
        "run.best_metric=val/<metric> (run.best_mode max); off = checkpoints as before"))

    def check(self, run: "RunConfig", task: str) -> None:
        """Parse-time checks; ``select_best`` points ``run.best_metric`` at the validation metric."""
        if self.every < 0 or self.max_samples < 0 or self.max_new_tokens < 0 or self.batch_size < 1:
            raise ValueError("validation.every, max_samples and max_new_tokens must be >= 0, batch_size >= 1")
        if (self.every > 0) != bool(self.file):
            raise ValueError("validation.file and validation.every > 0 go together (one without the other "
                             f"validates nothing): file={self.file!r}, every={self.every}")
        if self.select_best:
            if not self.file:
                raise ValueError("validation.select_best needs validation.file and validation.every")
            key = "val/" + (self.metric or ("mIoU" if task == "tvg" else "accuracy"))
            if run.best_metric and run.best_metric != key:
                raise ValueError(f"validation.select_best chooses the best checkpoint by {key}; run.best_metric="
                                 f"{run.best_metric!r} would choose it on another metric (leave it empty)")
            run.best_metric, run.best_mode = key, "max"


@dataclass
class FormatGuardConfig:
    """Format-collapse guard (mmgrpo.vlm.monitor.format_guard): per step, the share of well-formed completions and
    the share that ran to the token cap, averaged over a window of steps."""

    action: Literal["warn", "stop", "off"] = field(default="warn", metadata=_h(
        "when the window's share of well-formed completions falls below min_well_formed, or its share at "
        "rollout.max_new_tokens exceeds max_at_cap: warn (log, guard/format_alarm = 1), stop the run (checkpoint "
        "first, exit code 3), or off (the completions/* metrics are still logged)"))
    min_well_formed: float = field(default=0.8, metadata=_h(
        "lowest acceptable share of completions that are exactly the answer the prompt asks for "
        "(mmgrpo.vlm.rewards.format.well_formed; data.task / prompt_mode / answer_format)"))
    max_at_cap: float = field(default=0.25, metadata=_h("highest acceptable share of completions cut at "
                                                        "rollout.max_new_tokens (completions/clipped_ratio)"))
    window: int = field(default=5, metadata=_h("steps averaged before comparing (one step's share is noisy)"))

    def check(self) -> None:
        if not (0.0 <= self.min_well_formed <= 1.0 and 0.0 <= self.max_at_cap <= 1.0):
            raise ValueError("format_guard.min_well_formed and format_guard.max_at_cap are shares in [0, 1], got "
                             f"{self.min_well_formed} / {self.max_at_cap}")
        if self.window < 1:
            raise ValueError(f"format_guard.window must be >= 1, got {self.window}")


@dataclass
class TrainConfig:
    """mmgrpo VLM GRPO training run."""

    # sections that moved into ``methods`` (the old key is an error naming the new one)
    __config_moved__ = {"tempsamp": "methods.tempsamp_r1", "tgrpo": "methods.t_grpo", "twgrpo": "methods.tw_grpo",
                        "selection": "methods.selection"}
    # values that were renamed (the old value is an error naming the new one)
    __config_renamed_values__ = {"algo.agg": {"bnpo": (
        "'bnpo' was renamed 'local_token_mean' (TRL's loss_type='bnpo': a token mean over each micro-batch); BNPO the "
        "paper (Beta-normalised advantages) is methods.bnpo.enabled=true")}}

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    methods: MethodsConfig = field(default_factory=MethodsConfig)  # the registry's methods.<name> sections
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    format_guard: FormatGuardConfig = field(default_factory=FormatGuardConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)  # multi-turn tool rollouts (mmgrpo.vlm.tools)

    def __post_init__(self):
        check_choices(self)
        check_family(self.model.family)  # the registry is the only list of families
        G = self.rollout.group_size
        if G < 2:
            raise ValueError(f"rollout.group_size must be >= 2 (a group needs a baseline), got {G}")
        ts = self.methods.tempsamp_r1
        if ts.enabled and G < 3:
            raise ValueError("methods.tempsamp_r1 needs rollout.group_size >= 3 (G-1 on-policy + 1 ground truth)")
        if ts.enabled and ts.mode == "shape" and ts.alpha2 <= 0:
            raise ValueError(f"methods.tempsamp_r1.alpha2 must be > 0 (it divides by e^alpha2 - 1), got {ts.alpha2}")
        if self.algo.num_iterations < 1:
            raise ValueError("algo.num_iterations must be >= 1")
        if not self.rollout.onpolicy_tol >= 0:
            raise ValueError(f"rollout.onpolicy_tol must be >= 0 (0 = by model.dtype), got {self.rollout.onpolicy_tol}")
        if self.rollout.vllm_is_cap < 0:
            raise ValueError(f"rollout.vllm_is_cap must be >= 0 (0 = off), got {self.rollout.vllm_is_cap}")
        if self.rollout.backend == "vllm" and self.methods.t_grpo.enabled:
            raise ValueError("methods.t_grpo.enabled needs rollout.backend=hf: T-GRPO's shuffled-frame rollouts are "
                             "built from processed tensors that the vLLM engine cannot take")
        if self.algo.logprob_chunk_size < 0:
            raise ValueError(f"algo.logprob_chunk_size must be >= 0 (0 = full logits), got {self.algo.logprob_chunk_size}")
        if self.run.prompts_per_device < 1 or self.run.micro_batch_size < 1:
            raise ValueError("run.prompts_per_device and run.micro_batch_size must be >= 1")
        if self.reward.retries < 0 or self.reward.retry_backoff < 0 or self.reward.timeout < 0:
            raise ValueError("reward.retries, reward.retry_backoff and reward.timeout must be >= 0")
        if self.reward.overlap_prompts < 0:
            raise ValueError(f"reward.overlap_prompts must be >= 0 (0 = off), got {self.reward.overlap_prompts}")
        if self.run.max_consecutive_skips < 0:
            raise ValueError("run.max_consecutive_skips must be >= 0")
        from mmgrpo.vlm.data.templates import check_template  # a template/task/mode mismatch fails before loading

        check_template(self.data.prompt_template, "mcq" if self.data.task == "numeric" else self.data.task,
                       self.data.prompt_mode)
        if self.reward.parse_mode != "lenient":  # checked here so a typo fails before any model is loaded
            from mmgrpo.vlm.rewards.protocols import check_parse_mode

            task = self.data.task if self.data.task != "numeric" else "mcq"
            check_parse_mode(self.reward.parse_mode, task)
            if task == "tvg" and self.data.answer_format != "seconds":
                raise ValueError(f"reward.parse_mode={self.reward.parse_mode} reads 'start to end' in seconds only, "
                                 f"as the release does; data.answer_format={self.data.answer_format!r} asks the "
                                 "model for another format (use data.answer_format=seconds)")
        if self.algo.loss_type == "reg" and self.algo.ratio_level != "token":
            raise ValueError("algo.loss_type=reg uses sequence log-ratios already; leave ratio_level=token")
        self._check_numbers()
        self.validation.check(self.run, self.data.task)
        self.format_guard.check()
        if self.tools.enabled:
            self.tools.check()
            if self.methods.t_grpo.enabled or self.methods.tempsamp_r1.enabled:
                raise ValueError("tools.enabled: T-GRPO's shuffled rollouts and TempSamp-R1's injected ground truth "
                                 "are single-turn; disable them for multi-turn tool rollouts")
            # methods whose token statistics read completion_mask as the policy's tokens (a multi-turn row's
            # completion also holds its tool turns): not verified with tool rollouts yet
            m = self.methods
            unverified = [n for n, on in (("tw_grpo", m.tw_grpo.enabled), ("entropy", m.entropy.enabled),
                                          ("seed_grpo", m.seed_grpo.enabled), ("kimi_length", m.kimi_length.enabled),
                                          ("dapo_overlong", m.dapo_overlong.enabled)) if on]
            if unverified:
                raise ValueError(f"tools.enabled with methods {unverified}: their per-token statistics / lengths "
                                 "count a multi-turn row's tool-turn tokens as the policy's (completion_mask); not "
                                 "supported with tool rollouts yet")

    def _check_numbers(self) -> None:
        """Values that would only fail after the model loaded (or silently train nothing): checked at parse time."""
        import math

        o, r = self.optim, self.run
        if r.max_steps < 1:
            raise ValueError(f"run.max_steps must be >= 1 (a run of {r.max_steps} steps trains nothing)")
        if math.isnan(o.max_grad_norm):
            raise ValueError("optim.max_grad_norm is NaN (0 turns clipping off)")
        for name, v in (("optim.lr", o.lr), ("optim.weight_decay", o.weight_decay),
                        ("run.max_train_seconds", r.max_train_seconds)):
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v}")
        if not all(math.isfinite(b) and 0 <= b < 1 for b in o.betas):
            raise ValueError(f"optim.betas must be two numbers in [0, 1), got {list(o.betas)}")
        for name, v in (("optim.warmup_steps", o.warmup_steps), ("run.save_every", r.save_every),
                        ("run.prompts_per_step", r.prompts_per_step),
                        ("data.decode_threads", self.data.decode_threads),
                        ("data.check_samples", self.data.check_samples)):
            if v < 0:
                raise ValueError(f"{name} must be >= 0, got {v}")
        if r.log_every < 1:
            raise ValueError(f"run.log_every must be >= 1, got {r.log_every}")
