"""vLLM rollouts through vLLM's public V1 API: a colocated ``LLM`` or a separate server process.

What was verified, and against what
-----------------------------------
Every vLLM name used here was read in the source of the **vllm 0.33.0** wheel (``pip download --no-deps vllm``,
unzipped, never installed).  **The engine itself never ran here** (CPU-only machine, no vLLM install): tests drive a
fake engine with exactly the methods and signatures listed below, a real HTTP round trip to :mod:`.vllm_server` on
127.0.0.1, and the pure halves (requests, weights, outputs).  Verified in 0.33.0:

* ``vllm.LLM(model=..., gpu_memory_utilization=, max_model_len=, mm_processor_kwargs=, enable_prefix_caching=,
  generation_config=, logprobs_mode=, weight_transfer_config=, seed=)`` (``EngineArgs`` fields; a dict
  ``weight_transfer_config`` is converted to ``WeightTransferConfig(backend=...)`` in ``EngineArgs.__post_init__``).
* ``LLM.generate(prompts, sampling_params, *, use_tqdm=...)`` -> ``list[RequestOutput]``; ``RequestOutput
  .prompt_token_ids`` (after placeholder expansion) and ``.outputs[0].token_ids / .logprobs`` (list of
  ``{token_id: Logprob}``; ``logprobs=0`` returns only the sampled token's entry).
* prompts are ``TokensPrompt`` dicts: ``prompt_token_ids``, ``multi_modal_data``, ``mm_processor_kwargs``
  (``vllm/inputs/llm.py``).  The multimodal processor tokenises first and then REPLACES each single
  ``<|image_pad|>`` / ``<|video_pad|>`` with the item's grid-sized run (``_apply_prompt_updates``), so the
  trainer's already-expanded ids are collapsed to one placeholder per item before sending.
* ``SamplingParams`` fields ``n, max_tokens, temperature, top_p, top_k`` (0 or -1 = off), ``min_p, seed,
  logprobs, repetition_penalty, presence_penalty, frequency_penalty, min_tokens, logit_bias`` (clamped to
  [-100, 100]).
* ``logprobs_mode="processed_logprobs"``: log-probs after temperature / top-k / top-p, i.e. of the distribution
  the token was actually sampled from (the default ``raw_logprobs`` ignores temperature).
* Qwen2.5-VL / Qwen3-VL video: their ``get_data_parser`` sets ``video_needs_metadata=True``; a video item without
  metadata raises ``ValueError("Video metadata is required ...")`` (so the old backend's bare frames are refused
  by 0.33; a processor given bare frames assumes 24 fps, ``second_per_grid_ts`` 2/24 -- tested).  A
  ``(frames, metadata)`` tuple is one item; ``Qwen2_5_VLMultiModalProcessor._get_hf_mm_inputs`` turns the dict
  (minus ``do_sample_frames``) into transformers' ``VideoMetadata`` and calls the HF processor with the merged
  ``mm_processor_kwargs`` (``call_hf_processor``, ``allow_var_kwargs=True``).  A test makes that same call on the
  tiny Qwen2.5-VL processor and gets exactly :func:`mmgrpo.video.build_video_inputs`' ids, pixels, grid and
  ``second_per_grid_ts`` (= 2 / sample_fps).  Qwen2-VL's parser drops the metadata (no time axis).
* Weight sync: ``LLM`` mixes in ``RLOfflineMixin`` (``vllm/entrypoints/rl/offline.py``):
  ``init_weight_transfer_engine(request)``, ``start_weight_update()``, ``update_weights(request)``,
  ``finish_weight_update(weight_version=None)``; the HTTP twins are ``POST /init_weight_transfer_engine``
  ``{"init_info"}``, ``/start_weight_update``, ``/update_weights`` ``{"update_info"}``, ``/finish_weight_update``
  ``{"weight_version"}`` (``vllm/entrypoints/rl/online/api_router.py``).  The trainer side is vLLM's own
  ``vllm.distributed.weight_transfer``: ``IPCTrainerWeightTransferEngine`` (colocated, CUDA IPC handles) and
  ``NCCLTrainerWeightTransferEngine`` (server, NCCL broadcast from trainer rank 0 to the server's workers at
  ranks 1..W), both ``trainer_init(init_info, *, client, source)`` then ``send_weights()``, with a
  ``WeightSource`` (``metadata`` as a ``cached_property`` of ``ParamMeta(name, dtype, shape)``, ``iter_full()``)
  and a client with the four-method ``VLLMWeightSyncClient`` protocol.  ``LLM.reset_prefix_cache()`` after each
  push (cached KV blocks were computed by the old weights).

Choices
-------
* One request per output row (``n=1``) so every row has its own ``seed`` (vLLM seeds per request); prefix caching
  makes the repeated prompt cheap.
* LoRA: the adapters are MERGED into the base weights for the push, out of place (``W + get_delta_weight``; the
  in-place ``merge_adapter`` / ``unmerge_adapter`` pair drifts the trained base weights by a rounding per step),
  and only the weights that can change are sent (base weights of LoRA-wrapped modules,
  plus trainable non-LoRA parameters), under Hugging Face checkpoint names (vLLM's ``hf_to_vllm_mapper`` maps
  them).  Passing ``LoRARequest``s instead would need adapters saved to disk every step; merging keeps the
  engine a plain model.  DoRA adapters are refused.
* Vision tokens get ``logit_bias=-100`` (the trainer's log-probs exclude them; -100 is vLLM's clamp, e^-100 ~ 0).
* Truncated importance sampling (``rollout.vllm_is_cap``, :mod:`mmgrpo.core.importance`): the trainer
  recomputes old log-probs and multiplies each token's policy loss by ``min(exp(old - engine), cap)``, as TRL
  does; the engine's log-probs never replace the trainer's.
* After each generate the engine's expanded prompt ids must equal the trainer's ``input_ids``: a different number
  of vision tokens (other resize / frame count) raises instead of training on mismatched prompts.
* T-GRPO's shuffled-frame rollouts have no raw frames here: ``rollout.backend=vllm`` refuses ``methods.t_grpo.enabled``.
"""
from __future__ import annotations

import contextlib
import math
import os
from functools import cached_property
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from .rollout import RolloutBackend, RolloutOutput, SamplingParams, rollout_from_token_lists
from .vllm_client import EngineOutput, VLLMServerClient, nccl_transfer_factory

VLLM_SOURCE_VERSION = "0.33.0"  # the vLLM release whose source every call here was checked against

# vLLM SamplingParams fields that would reshape the distribution, at their neutral values (explicit, so neither a
# server's defaults nor a model's generation_config -- vLLM's generation_config="auto" -- can switch them on)
VLLM_NEUTRAL_SAMPLING = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0,
                         "min_tokens": 0}
# per-request processor kwargs for videos: the frames are already sampled and resized by mmgrpo.video (as in
# build_video_inputs); the nested ``videos_kwargs`` reaches only the video processor, not images
VIDEO_MM_PROCESSOR_KWARGS = {"videos_kwargs": {"do_sample_frames": False, "do_resize": False}}
VISION_PAD_TOKENS = ("<|image_pad|>", "<|video_pad|>")
VISION_BIAS = -100.0  # vLLM clamps logit_bias to [-100, 100]


def check_vllm_version(installed: str) -> None:
    """Refuse a vLLM older than the release this module was checked against (its RL weight-transfer API and the
    Qwen-VL video-metadata path are recent)."""
    def key(v: str) -> tuple[int, int]:
        parts = (v.split("+")[0].split(".") + ["0", "0"])[:2]
        return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts)

    if key(installed) < key(VLLM_SOURCE_VERSION):
        raise ImportError(f"vLLM {installed} is older than {VLLM_SOURCE_VERSION}, the release whose public API "
                          "mmgrpo.vlm.models.vllm_backend uses (pip install 'mmgrpo[vllm]')")


class VisionTokenMismatch(RuntimeError):
    """The engine expanded a prompt to other token ids than the trainer's processor did."""


class BadEngineReply(RuntimeError):
    """The engine's (or server's) outputs cannot be trained on: a failed call, like an HTTP error."""


# ----------------------------------------------------------------------------------------------------------
# requests
# ----------------------------------------------------------------------------------------------------------
def collapse_vision_runs(input_ids: Sequence[int], pad_ids: Sequence[int]) -> list[int]:
    """Collapse each run of one vision pad id to a single placeholder (vLLM re-expands it per item)."""
    pads = set(int(p) for p in pad_ids)
    out: list[int] = []
    for t in (int(x) for x in input_ids):
        if t in pads and out and out[-1] == t:
            continue
        out.append(t)
    return out


def _prompt_ids(item: dict) -> list[int]:
    """The trainer's (unpadded) prompt ids of one prompt item (batch dim 1)."""
    ids = item["input_ids"].reshape(-1)
    if "attention_mask" in item:
        ids = ids[item["attention_mask"].reshape(-1).bool()]
    return [int(x) for x in ids]


def video_item(clip) -> tuple[np.ndarray, dict[str, Any]]:
    """``(frames, metadata)`` for ``multi_modal_data["video"]``: the clip's frames (T, H, W, 3) uint8 and the same
    ``VideoMetadata`` fields :meth:`VideoClip.video_metadata` gives the HF processor (so ``sampled_fps`` =
    ``clip.sample_fps`` and ``second_per_grid_ts`` = ``2 / sample_fps``), plus ``do_sample_frames=False``."""
    frames = clip.frames.numpy() if isinstance(clip.frames, torch.Tensor) else np.asarray(clip.frames)
    meta = {"total_num_frames": int(clip.clip_num_frames), "fps": float(clip.video_fps),
            "width": int(clip.width), "height": int(clip.height), "duration": float(clip.duration),
            "video_backend": clip.backend, "frames_indices": [int(i) for i in clip.frame_indices],
            "do_sample_frames": False}
    return np.ascontiguousarray(frames, dtype=np.uint8), meta


def sampling_kwargs(params: SamplingParams, seed: int | None, suppress_token_ids: Sequence[int] = ()) -> dict:
    """``vllm.SamplingParams`` kwargs for one row: n=1, logprobs=0 (sampled token only), neutral penalties."""
    kw = dict(n=1, max_tokens=params.max_new_tokens, logprobs=0,
              temperature=0.0 if params.greedy else params.temperature,
              top_p=params.top_p, top_k=params.top_k if params.top_k > 0 else 0, **VLLM_NEUTRAL_SAMPLING)
    if suppress_token_ids:
        kw["logit_bias"] = {int(t): VISION_BIAS for t in suppress_token_ids}
    if seed is not None:
        kw["seed"] = int(seed) % (2**31 - 1)
    return kw


def vllm_requests(prompts: Sequence[dict], raw_prompts: Sequence[dict] | None, num_generations: int,
                  params: SamplingParams, seeds: Sequence[int] | None, vision_pad_ids: Sequence[int] = (),
                  suppress_token_ids: Sequence[int] = ()) -> list[tuple[dict, dict]]:
    """(``TokensPrompt`` dict, ``SamplingParams`` kwargs) per output row, prompt-major like ``HFRolloutBackend``.

    ``prompts``: the trainer's prompt items (their ``input_ids`` are sent, vision runs collapsed);
    ``raw_prompts``: per prompt ``{"images": [PIL...], "clip": VideoClip}`` (the media the processor saw), or
    ``"clips": [VideoClip, ...]`` for several videos in token order (multi-turn tool rollouts).
    A prompt item with pixel tensors but no raw media, or a video without its clip (no fps), is refused.
    """
    G = int(num_generations)
    if raw_prompts is not None and len(raw_prompts) != len(prompts):
        raise ValueError(f"{len(raw_prompts)} raw prompts for {len(prompts)} prompt items")
    if seeds is not None and len(seeds) != len(prompts) * G:
        raise ValueError(f"need one seed per row: got {len(seeds)} seeds for {len(prompts) * G} rows")
    out = []
    for i, item in enumerate(prompts):
        rp = raw_prompts[i] if raw_prompts is not None else {}
        mm: dict[str, Any] = {}
        if rp.get("images"):
            mm["image"] = list(rp["images"])
        if rp.get("clips"):  # several videos in token order (a multi-turn prompt with tool-turn frames)
            vids = [video_item(c) for c in rp["clips"]]
            mm["video"] = vids[0] if len(vids) == 1 else vids
        elif rp.get("clip") is not None:
            mm["video"] = video_item(rp["clip"])
        elif rp.get("video") is not None:
            raise ValueError(f"prompt {i}: a video without its VideoClip has no fps / frame indices; vLLM would "
                             "get the wrong time axis (pass raw_prompts[i]['clip'])")
        if ("pixel_values_videos" in item and "video" not in mm) or ("pixel_values" in item and "image" not in mm):
            raise ValueError(f"prompt {i} has vision inputs but no raw images / clip for the vLLM processor "
                             "(T-GRPO shuffled rollouts are not supported with rollout.backend=vllm)")
        prompt: dict[str, Any] = {"prompt_token_ids": collapse_vision_runs(_prompt_ids(item), vision_pad_ids)}
        if mm:
            prompt["multi_modal_data"] = mm
        if "video" in mm:
            prompt["mm_processor_kwargs"] = {k: dict(v) for k, v in VIDEO_MM_PROCESSOR_KWARGS.items()}
        for g in range(G):
            out.append((prompt, sampling_kwargs(params, None if seeds is None else seeds[i * G + g],
                                                suppress_token_ids)))
    return out


# ----------------------------------------------------------------------------------------------------------
# outputs
# ----------------------------------------------------------------------------------------------------------
def request_output_to_engine_output(o) -> EngineOutput:
    """``vllm.RequestOutput`` -> :class:`EngineOutput` (``logprobs=0``: the sampled token's entry per position)."""
    c = o.outputs[0]
    toks = [int(t) for t in c.token_ids]
    lps = None
    if c.logprobs is not None:
        lps = [float(d[t].logprob) for d, t in zip(c.logprobs, toks)]
    return EngineOutput([int(t) for t in (o.prompt_token_ids or [])], toks, lps)


LOGPROB_SLACK = 1e-6  # log-probs above 0 by at most this are rounding (log_softmax is <= 0 in exact arithmetic)


def check_engine_outputs(outs: Sequence[EngineOutput], vocab_size: int, max_new_tokens: int) -> None:
    """Raise :class:`BadEngineReply` naming the row unless every output has at most ``max_new_tokens`` sampled ids,
    each in ``[0, vocab_size)``, and one finite log-prob <= 0 (``LOGPROB_SLACK``) per sampled id.  A reply from a
    broken or foreign server would otherwise index past the embedding, or feed NaN / impossible probabilities to
    the importance weights."""
    for r, o in enumerate(outs):
        n = len(o.token_ids)
        if n > max_new_tokens:
            raise BadEngineReply(f"row {r}: the vLLM engine returned {n} tokens for max_new_tokens={max_new_tokens}")
        bad = next((t for t in o.token_ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise BadEngineReply(f"row {r}: the vLLM engine returned token id {bad}, outside the vocabulary "
                                 f"[0, {vocab_size})")
        if o.logprobs is None or len(o.logprobs) != n:
            # zeros in their place would turn the IS weights into exp(old_logp): refuse instead
            got = "no" if o.logprobs is None else len(o.logprobs)
            raise BadEngineReply(f"row {r}: the vLLM engine returned {got} sampled-token log-probs for {n} tokens "
                                 "(requests ask for logprobs=0)")
        lp = next((x for x in o.logprobs if not (math.isfinite(x) and x <= LOGPROB_SLACK)), None)
        if lp is not None:
            raise BadEngineReply(f"row {r}: the vLLM engine returned log-prob {lp!r}; a log-probability is finite "
                                 "and <= 0")


def check_prompt_expansion(outs: Sequence[EngineOutput], expected: Sequence[list[int]]) -> None:
    """Raise :class:`VisionTokenMismatch` when the engine's expanded prompt differs from the trainer's ids."""
    for r, (o, want) in enumerate(zip(outs, expected)):
        if o.prompt_token_ids != want:
            raise VisionTokenMismatch(
                f"row {r}: the vLLM engine's prompt has {len(o.prompt_token_ids)} tokens, the trainer's "
                f"{len(want)}: its processor produced another number of vision tokens (resize / frame count / "
                f"processor kwargs differ) -- the completions would be scored on another prompt")


# ----------------------------------------------------------------------------------------------------------
# weights
# ----------------------------------------------------------------------------------------------------------
def _unwrap(model):
    return getattr(model, "module", model)


def _is_peft(model) -> bool:
    return hasattr(model, "merge_adapter") and hasattr(model, "unmerge_adapter")


def _hf_name(name: str, peft: bool) -> str:
    if peft and name.startswith("base_model.model."):
        name = name[len("base_model.model."):]
    return name.replace(".base_layer.", ".")


def sync_parameter_names(model) -> list[str]:
    """Trainer parameter names whose values can change in training (what a weight push sends).

    Full fine-tuning: every trainable parameter.  LoRA: the base weight/bias of each LoRA-wrapped module (its
    merged value changes) plus trainable non-LoRA parameters (``modules_to_save``); LoRA matrices never."""
    base = _unwrap(model)
    names = []
    for n, p in base.named_parameters():
        if "lora_" in n:
            continue
        if p.requires_grad or ".base_layer." in n:
            names.append(n)
    return names


def _merged_weight(layer, weight: torch.Tensor) -> torch.Tensor:
    """``W + sum_a delta_a`` for a peft LoRA layer, out of place (the trainer's weights are never touched:
    ``merge_adapter`` / ``unmerge_adapter`` would add and subtract the delta in place and drift the base weights by
    one rounding per step)."""
    if getattr(layer, "merged", False):
        return weight
    out = weight.float()
    for ad in layer.active_adapters:
        if ad not in getattr(layer, "lora_A", {}):
            continue
        if getattr(layer, "use_dora", {}).get(ad, False):
            raise NotImplementedError("vLLM weight push: DoRA adapters are not supported (plain LoRA only)")
        out = out + layer.get_delta_weight(ad).float()
    return out.to(weight.dtype)


def hf_named_weights(model, names: Sequence[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF checkpoint name, tensor) for each parameter to push, LoRA deltas merged in (out of place)."""
    base = _unwrap(model)
    peft = _is_peft(base)
    params = dict(base.named_parameters())
    modules = dict(base.named_modules()) if peft else {}
    for n in (sync_parameter_names(base) if names is None else names):
        t = params[n].detach()
        if peft and n.endswith(".base_layer.weight"):
            t = _merged_weight(modules[n[:-len(".base_layer.weight")]], t)
        yield _hf_name(n, peft), t


def make_weight_source(model):
    """A ``vllm.distributed.weight_transfer.WeightSource`` over :func:`hf_named_weights` (needs vLLM)."""
    from vllm.distributed.weight_transfer import ParamMeta, WeightSource

    names = sync_parameter_names(model)

    class MergedModelSource(WeightSource):
        @cached_property
        def metadata(self):
            return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in hf_named_weights(model, names)]

        def iter_full(self):
            yield from hf_named_weights(model, names)

    return MergedModelSource()


class LLMWeightSyncClient:
    """``VLLMWeightSyncClient`` over an in-process ``vllm.LLM`` (its public ``RLOfflineMixin`` methods)."""

    def __init__(self, llm):
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.llm.finish_weight_update(weight_version)


def _colocate_transfer(client, source):
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo, IPCTrainerWeightTransferEngine

    # every training process drives its own engine on its own GPU, so each is "rank 0" (the sender) of it
    return IPCTrainerWeightTransferEngine.trainer_init(IPCTrainerInitInfo(rank=0), client=client, source=source)


class WeightPusher:
    """Pushes the trainer's weights into the engine after each optimizer step.

    ``transfer_factory(client, source)`` returns an object with ``send_weights()`` (vLLM's trainer-side
    ``*TrainerWeightTransferEngine``); it is built on the first push (after the rollout engine is up).
    ``reset_prefix_cache`` drops KV blocks computed with the old weights.
    """

    def __init__(self, client, transfer_factory, reset_prefix_cache, source_factory=make_weight_source):
        self.client, self.transfer_factory, self.reset_prefix_cache = client, transfer_factory, reset_prefix_cache
        self.source_factory = source_factory
        self.transfer = None
        self.pushes = 0

    def push(self, model) -> None:
        if self.transfer is None:
            self.transfer = self.transfer_factory(self.client, self.source_factory(model))
        self.transfer.send_weights()
        self.reset_prefix_cache()
        self.pushes += 1


# ----------------------------------------------------------------------------------------------------------
# engines
# ----------------------------------------------------------------------------------------------------------
class LocalEngine:
    """Runs requests on an in-process ``vllm.LLM`` (colocated, and inside :mod:`.vllm_server`)."""

    def __init__(self, llm, sampling_params_cls=None):
        if sampling_params_cls is None:
            from vllm import SamplingParams as sampling_params_cls  # noqa: N813
        self.llm, self.sampling_params_cls = llm, sampling_params_cls

    def run(self, requests: Sequence[tuple[dict, dict]]) -> list[EngineOutput]:
        outs = self.llm.generate([p for p, _ in requests], [self.sampling_params_cls(**kw) for _, kw in requests],
                                 use_tqdm=False)
        return [request_output_to_engine_output(o) for o in outs]


def default_llm_kwargs(mm_processor_kwargs: dict | None, gpu_memory_utilization: float, max_model_len: int,
                       weight_backend: str, seed: int = 0) -> dict:
    """Engine arguments shared by colocate and server mode."""
    return dict(gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                mm_processor_kwargs=dict(mm_processor_kwargs or {}), enable_prefix_caching=True,
                # "vllm": the engine's own neutral defaults, never the checkpoint's generation_config.json
                generation_config="vllm",
                # log-probs of the distribution actually sampled (after temperature / top-k / top-p)
                logprobs_mode="processed_logprobs",
                weight_transfer_config={"backend": weight_backend}, seed=seed)


class VLLMRolloutBackend(RolloutBackend):
    """Rollouts from a vLLM engine; see the module docstring.  Build with :func:`colocate_backend` /
    :func:`server_backend` (or :func:`backend_from_config`); the constructor takes the parts so tests can fake
    the engine.

    The trainer recomputes old log-probs itself; the engine's (``RolloutOutput.logprobs``) feed the truncated
    importance-sampling correction (:mod:`mmgrpo.core.importance`) and the mismatch diagnostic.  Every reply is
    checked (:func:`check_engine_outputs`); a bad one raises :class:`BadEngineReply`, as a failed HTTP call raises.
    """

    def __init__(self, engine, tokenizer, pusher: WeightPusher | None = None,
                 suppress_token_ids: Sequence[int] = (), check_prompts: bool = True, barrier_after_push: bool = False,
                 vocab_size: int | None = None):
        self.engine, self.tokenizer, self.pusher = engine, tokenizer, pusher
        # sampled ids must index the policy's embedding (its rows; the tokenizer's length when not given)
        self.vocab_size = int(vocab_size) if vocab_size else len(tokenizer)
        self.barrier_after_push = barrier_after_push
        self.suppress_token_ids = list(suppress_token_ids)
        self.vision_pad_ids = [i for i in (tokenizer.convert_tokens_to_ids(t) for t in VISION_PAD_TOKENS)
                               if i is not None and i != tokenizer.unk_token_id]
        self.check_prompts = check_prompts

    def _eos(self) -> list[int]:
        eos = [self.tokenizer.convert_tokens_to_ids("<|im_end|>"), self.tokenizer.eos_token_id]
        return [e for e in dict.fromkeys(eos) if e is not None and e != self.tokenizer.unk_token_id]

    def generate(self, prompts, num_generations, params, seeds=None, raw_prompts=None) -> RolloutOutput:
        reqs = vllm_requests(prompts, raw_prompts, num_generations, params, seeds, self.vision_pad_ids,
                             self.suppress_token_ids)
        outs = self.engine.run(reqs)
        if len(outs) != len(reqs):
            raise BadEngineReply(f"vLLM returned {len(outs)} outputs for {len(reqs)} requests")
        if self.check_prompts:
            G = int(num_generations)
            check_prompt_expansion(outs, [_prompt_ids(p) for p in prompts for _ in range(G)])
        check_engine_outputs(outs, self.vocab_size, params.max_new_tokens)
        return rollout_from_token_lists([o.token_ids for o in outs], [o.logprobs for o in outs], self.tokenizer,
                                        self._eos(), len(prompts), num_generations, params.max_new_tokens)

    def sync_weights(self, model) -> None:
        if self.pusher is not None:
            self.pusher.push(model)
        if self.barrier_after_push and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()  # no process samples the next step before the shared server is updated


@contextlib.contextmanager
def engine_on_this_gpu():
    """Pin the engine to this training process's GPU while ``LLM(...)`` starts it.

    vLLM V1 runs the engine core in a child process that uses cuda:0 of the devices it sees; with several training
    processes on one node each engine must land on its own process's GPU, so ``CUDA_VISIBLE_DEVICES`` is narrowed
    to that device while the child is spawned (CUDA IPC handles are keyed by GPU UUID, so the renumbering does not
    matter to the weight push).  No-op for a single process or without CUDA.  Not exercised on a GPU here."""
    dist = torch.distributed
    multi = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if not (multi and torch.cuda.is_available()):
        yield
        return
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = old.split(",") if old else [str(i) for i in range(torch.cuda.device_count())]
    os.environ["CUDA_VISIBLE_DEVICES"] = ids[torch.cuda.current_device()]
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old


def colocate_backend(model_path: str, tokenizer, suppress_token_ids=(), mm_processor_kwargs: dict | None = None,
                     gpu_memory_utilization: float = 0.3, max_model_len: int = 8192, seed: int = 0,
                     llm_cls=None, sampling_params_cls=None, transfer_factory=None, vocab_size: int | None = None,
                     **engine_kwargs):
    """A ``vllm.LLM`` in this process (GPU share ``gpu_memory_utilization``), weights pushed by CUDA IPC."""
    if llm_cls is None:
        try:
            import vllm
            from vllm import LLM as llm_cls  # noqa: N813
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("rollout.backend=vllm needs `pip install mmgrpo[vllm]` and a GPU; use "
                              "rollout.backend=hf on CPU") from e
        check_vllm_version(vllm.__version__)
    kw = default_llm_kwargs(mm_processor_kwargs, gpu_memory_utilization, max_model_len, "ipc", seed)
    kw.update(engine_kwargs)
    with engine_on_this_gpu():
        llm = llm_cls(model=model_path, **kw)
    pusher = WeightPusher(LLMWeightSyncClient(llm), transfer_factory or _colocate_transfer,
                          lambda: llm.reset_prefix_cache())
    return VLLMRolloutBackend(LocalEngine(llm, sampling_params_cls), tokenizer, pusher, suppress_token_ids,
                              vocab_size=vocab_size)


def server_backend(url: str, tokenizer, suppress_token_ids=(), timeout: float = 240.0, group_port: int = 51216,
                   group_host: str = "", transfer_factory=None, wait_seconds: float = 0.0, pushes: bool = True,
                   vocab_size: int | None = None):
    """Generate on a separate :mod:`.vllm_server` process; weights by NCCL broadcast (trainer rank 0 -> server).

    Every training process generates through the server; only the one with ``pushes=True`` (process 0) sends
    weights, and all processes wait at a barrier after the push."""
    client = VLLMServerClient(url, timeout=timeout)
    if wait_seconds > 0:
        client.wait_until_healthy(wait_seconds)
    pusher = None
    if pushes:
        factory = transfer_factory or nccl_transfer_factory(client, group_port, group_host)
        pusher = WeightPusher(client, factory, client.reset_prefix_cache)
    return VLLMRolloutBackend(client, tokenizer, pusher, suppress_token_ids, barrier_after_push=True,
                              vocab_size=vocab_size)


def backend_from_config(cfg, policy) -> VLLMRolloutBackend:
    """The backend for ``rollout.backend=vllm`` (``rollout.vllm_mode`` colocate | server)."""
    r = cfg.rollout
    if cfg.methods.t_grpo.enabled:
        raise ValueError("methods.t_grpo.enabled with rollout.backend=vllm: T-GRPO's shuffled-frame rollouts are built "
                         "from processed tensors the vLLM engine cannot take; use rollout.backend=hf")
    emb = policy.model.get_input_embeddings() if hasattr(policy.model, "get_input_embeddings") else None
    vocab = int(emb.num_embeddings) if emb is not None else None
    if r.vllm_mode == "server":
        dist = torch.distributed
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        return server_backend(r.vllm_server_url, policy.tokenizer, policy.suppress_token_ids,
                              timeout=r.vllm_server_timeout, group_port=r.vllm_group_port,
                              group_host=r.vllm_group_host, wait_seconds=r.vllm_server_timeout, pushes=rank == 0,
                              vocab_size=vocab)
    mm_kw = {}
    d = cfg.data
    if d.image_min_pixels > 0 and d.image_max_pixels > 0:  # the same ``size`` TaskAdapter gives the processor
        mm_kw = {"size": {"shortest_edge": d.image_min_pixels, "longest_edge": d.image_max_pixels}}
    return colocate_backend(cfg.model.path, policy.tokenizer, policy.suppress_token_ids, mm_processor_kwargs=mm_kw,
                            gpu_memory_utilization=r.vllm_gpu_memory_utilization,
                            max_model_len=r.vllm_max_model_len, seed=cfg.run.seed, vocab_size=vocab)


__all__ = [
    "VLLM_SOURCE_VERSION", "check_vllm_version", "VLLM_NEUTRAL_SAMPLING", "VIDEO_MM_PROCESSOR_KWARGS", "VisionTokenMismatch",
    "BadEngineReply", "check_engine_outputs", "LOGPROB_SLACK",
    "collapse_vision_runs", "video_item", "sampling_kwargs", "vllm_requests",
    "request_output_to_engine_output", "check_prompt_expansion", "sync_parameter_names",
    "hf_named_weights", "make_weight_source", "LLMWeightSyncClient", "WeightPusher", "LocalEngine",
    "default_llm_kwargs", "engine_on_this_gpu", "VLLMRolloutBackend", "colocate_backend", "server_backend",
    "backend_from_config",
]
